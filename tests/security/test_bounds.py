"""Availability: no single request, and no pile of them, takes the daemon down (issue 16).

Mallory sends the worst request of each kind through the raw protocol (the CLI would
refuse some of them itself); afterwards the daemon is alive, its resident memory stayed
under RSS_CEILING the whole time, its database grew by less than a stated bound, and the
victim's job is still scheduled. A guard thread samples the daemon while mallory acts
and kills it past the ceiling, so that on a daemon without the bounds the test fails in
seconds instead of exhausting the machine.

Figures measured here (root daemon, 2 simulated GPUs; `pytest -s` prints each test's
peak): an idle daemon is 50-57 MiB resident; the largest accepted sweep (15 MiB of
commands, a 250 KiB environment) peaks at 115-135 MiB and adds 32 MiB of database (WAL
included); 36 MB of 120 KB commands listed in status pages peak at 128 MiB (+58 MiB of
database); a 10,000-job sweep of 1.5 KiB commands peaked at 168 MiB (+40 MiB). The
RSS_CEILING of 300 MiB leaves room above those and is far below what the unbounded
requests reached (the daemon was killed at the ceiling within seconds on the old code).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.client import Client
from gpusched.config.settings import DEFAULT_MAX_QUEUED, load_config
from gpusched.core.errors import ConflictError, GpuschedError
from gpusched.core.requests.sweep import ARG_OVERHEAD_BYTES, expand, measure
from tests.daemon_harness import RunningDaemon
from tests.users import User, as_user

RSS_CEILING = 300 * 2**20
MiB = 2**20


@dataclass
class Peak:
    rss: int = 0
    db_growth: int = 0
    killed: str | None = None


def _db_bytes(daemon: RunningDaemon) -> int:
    return sum(
        path.stat().st_size
        for path in daemon.root.glob("gpusched.db*")  # the database, its WAL and shm
        if path.is_file()
    )


@contextmanager
def guarded(daemon: RunningDaemon, db_growth: int) -> Iterator[Peak]:
    """Sample the daemon's RSS and its database's size while the block runs; past the
    ceiling or the growth bound, kill the daemon (the test then fails on the figures)."""
    assert daemon.process is not None
    process = psutil.Process(daemon.process.pid)
    start = _db_bytes(daemon)
    peak = Peak()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                peak.rss = max(peak.rss, process.memory_info().rss)
            except psutil.Error:
                return
            peak.db_growth = max(peak.db_growth, _db_bytes(daemon) - start)
            if peak.rss > RSS_CEILING or peak.db_growth > db_growth:
                peak.killed = f"rss {peak.rss // MiB} MiB, database +{peak.db_growth // MiB} MiB"
                os.kill(process.pid, signal.SIGKILL)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        done.set()
        thread.join()
    print(f"peak rss {peak.rss / MiB:.0f} MiB, database +{peak.db_growth / MiB:.2f} MiB")
    assert peak.killed is None, f"the daemon went past its bounds: {peak.killed}"
    assert peak.rss < RSS_CEILING
    assert peak.db_growth < db_growth


def _raw(socket_path: Path, op: str, timeout_s: float = 20.0, **args: Any) -> Any:
    """One request as sent by a hand-written client (no client-side checks)."""
    return Client(socket_path, timeout_s=timeout_s).request(op, **args)


def _submit_args(user: User, command: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "command": command,
        "cwd": user.home,
        "env": {"PATH": "/usr/bin:/bin"},
        "umask": 0o022,
        "mem": 2**30,
        "hold": True,  # nothing of mallory's runs: the queue and the database are the target
        **extra,
    }


def _attempt(user: User, fn: Callable[[], Any]) -> dict[str, Any]:
    """as_user, with the refusal (if any) as data: {"result"} or {"error", "message"}."""
    try:
        return {"result": as_user(user, fn)}
    except GpuschedError as exc:
        return {"error": type(exc).__name__, "message": exc.message}


def _submit_as(user: User, socket_path: Path, args: dict[str, Any]) -> list[dict[str, Any]]:
    return list(as_user(user, lambda: _raw(socket_path, "submit", timeout_s=60, **args)))


def _cli_output(socket_path: Path, *args: str) -> str:
    """The CLI's output, run in this process (as_user's child: the user's own view)."""
    from click.testing import CliRunner

    from gpusched.cli import cli

    result = CliRunner().invoke(cli, ["--socket", str(socket_path), *args])
    assert result.exit_code == 0, result.output
    return result.output


def _victim_job(daemon: RunningDaemon, victim: User) -> int:
    sock = daemon.socket_path
    job = as_user(victim, lambda: Client(sock).submit(["sleep", "600"], mem="1G").to_json())
    daemon.wait_state(job["id"], {"running"})
    return int(job["id"])


def _still_serving(daemon: RunningDaemon, victim: User, victim_job: int) -> None:
    """The daemon is alive, the victim's job untouched, and a new job of theirs starts."""
    assert daemon.process is not None and daemon.process.poll() is None, daemon.stderr()
    assert daemon.show(victim_job)["state"] == "running"
    sock = daemon.socket_path
    job = as_user(victim, lambda: Client(sock).submit(["true"], mem="1G").to_json())
    assert daemon.wait_state(job["id"], {"done", "failed"})["state"] == "done"
    assert "Traceback" not in daemon.stderr()


def test_a_sweep_that_would_build_a_terabyte_is_refused_before_it_is_built(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """Under the 10,000-job cap, by size: a 300 KB command of placeholders times 1 KiB
    values is ~1 TB of arguments. Refused from the request's figures, naming the key."""
    mallory, victim = people
    daemon = root_daemon()
    before = _victim_job(daemon, victim)
    sock = daemon.socket_path
    command = ["echo", "{a}" * 100_000]
    sweep = [["a", ["v" * 1024] * 100], ["b", [str(i) for i in range(100)]]]
    command[1] += "{b}"
    with guarded(daemon, db_growth=1 * MiB):
        refused = _attempt(
            mallory, lambda: _raw(sock, "submit", **_submit_args(mallory, command, sweep=sweep))
        )
    assert refused.get("error") == "UsageError", refused
    assert "max_submit_bytes" in refused["message"]
    assert "\n" not in refused["message"]
    one = _submit_args(mallory, ["echo", "x" * 2**20])  # one job, 1 MiB: rows add up
    refused = _attempt(mallory, lambda: _raw(sock, "submit", **one))
    assert refused.get("error") == "UsageError", refused
    assert "max_job_bytes" in refused["message"]
    _still_serving(daemon, victim, before)


def test_the_largest_sweep_the_defaults_accept_stays_within_bounds(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """Near every default size limit at once: 1,000 jobs of 15 KB commands, 15 MiB in
    all (max_submit_bytes is 16M), with a 250 KiB environment (max_env_bytes 256K).
    Accepted; memory and database stay within the figures stated above. (10,000 jobs of
    1.5 KiB, at max_array_jobs too, peaked at 168 MiB and +40 MiB but take 25 s here.)"""
    mallory, victim = people
    daemon = root_daemon()
    before = _victim_job(daemon, victim)
    sock = daemon.socket_path
    env = {f"V{i}": "e" * 1000 for i in range(250)}
    sweep = [["i", [str(i) for i in range(1000)]]]
    args = _submit_args(mallory, ["echo", "{i}", "p" * 15_000], sweep=sweep, env=env)
    with guarded(daemon, db_growth=64 * MiB):
        jobs = as_user(mallory, lambda: len(_raw(sock, "submit", timeout_s=120, **args)))
    assert jobs == 1000
    _still_serving(daemon, victim, before)


def test_placeholders_planted_in_sweep_values_are_not_expanded_again(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """The chain that made 3.6 MiB of request into 112 GiB: a's values hold {b} many times,
    replaced again when b was filled in. Substitution is one pass: the {b}s stay text."""
    mallory, victim = people
    daemon = root_daemon()
    before = _victim_job(daemon, victim)
    sock = daemon.socket_path
    planted = "{b}" * 20_000  # 60 KB, expanded again: 160 MB per job
    sweep = [["a", [planted]], ["b", ["x" * 8192, "y" * 8192]]]
    args = _submit_args(mallory, ["echo", "{a}{b}"], sweep=sweep)
    with guarded(daemon, db_growth=8 * MiB):
        jobs = as_user(mallory, lambda: _raw(sock, "submit", **args))
    assert len(jobs) == 2
    own = as_user(mallory, lambda: Client(sock).job(jobs[0]["id"]).to_json())
    assert own["command"] == ["echo", planted + "x" * 8192]
    _still_serving(daemon, victim, before)


def test_a_sweep_times_a_large_environment_stores_the_environment_once(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """1,000 jobs x a 200 KiB environment was 200 MB of database (1.43 GiB for the
    issue's 0.22 MiB request). Now the environment is one row; over max_env_bytes, refused."""
    mallory, victim = people
    daemon = root_daemon()
    before = _victim_job(daemon, victim)
    sock = daemon.socket_path
    env = {f"V{i}": "e" * 1000 for i in range(200)}  # ~200 KiB, under max_env_bytes
    sweep = [["i", [str(i) for i in range(1000)]]]
    args = _submit_args(mallory, ["echo", "{i}"], sweep=sweep, env=env)
    with guarded(daemon, db_growth=16 * MiB):
        jobs = as_user(mallory, lambda: _raw(sock, "submit", timeout_s=60, **args))
    assert len(jobs) == 1000
    big = {f"V{i}": "e" * 1000 for i in range(400)}  # ~400 KiB: over the default 256K
    refused = _attempt(
        mallory, lambda: _raw(sock, "submit", **_submit_args(mallory, ["true"], env=big))
    )
    assert refused.get("error") == "UsageError", refused
    assert "max_env_bytes" in refused["message"]
    _still_serving(daemon, victim, before)


def test_wait_with_100k_duplicate_ids_is_refused_and_10k_cost_one_lookup(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """One `wait` with 100,000 copies of an id cost 230 s of daemon CPU. Over MAX_IDS it
    is refused at once; at the cap, duplicates are answered once. (A client timeout of
    20 s marks a daemon busy for minutes; it is no speed test.)"""
    mallory, victim = people
    daemon = root_daemon()
    before = _victim_job(daemon, victim)
    sock = daemon.socket_path
    with guarded(daemon, db_growth=1 * MiB):
        refused = _attempt(mallory, lambda: _raw(sock, "wait", ids=[before] * 100_000, timeout=0))
        at_cap = as_user(mallory, lambda: _raw(sock, "wait", ids=[before] * 10_000, timeout=0))
        after = _attempt(
            mallory,
            lambda: _raw(sock, "submit", **_submit_args(mallory, ["true"], after=[1] * 100_000)),
        )
    assert refused.get("error") == "UsageError", refused
    assert "at most 10000 job ids" in refused["message"]
    assert [job["id"] for job in at_cap] == [before]
    assert after.get("error") == "UsageError", after
    assert "'after'" in after["message"]
    _still_serving(daemon, victim, before)


def test_parallel_submits_cannot_pass_max_queued(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """max_queued 5; 40 submits of one job at once: exactly 5 get in (16 and 19 did)."""
    mallory, victim = people
    daemon = root_daemon(limits={"default": {"max_queued": 5}})
    before = _victim_job(daemon, victim)
    sock = daemon.socket_path
    args = _submit_args(mallory, ["true"])

    def race() -> list[str]:
        start = threading.Barrier(40)
        outcomes: list[str] = []

        def one() -> None:
            start.wait()
            try:
                _raw(sock, "submit", **args)
                outcomes.append("queued")
            except ConflictError as exc:
                outcomes.append("refused" if "max_queued 5" in exc.message else exc.message)

        threads = [threading.Thread(target=one) for _ in range(40)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return outcomes

    with guarded(daemon, db_growth=1 * MiB):
        outcomes = as_user(mallory, race)
    assert sorted(outcomes) == ["queued"] * 5 + ["refused"] * 35
    held = [j for j in daemon.status()["jobs"] if j["user"] == mallory.name]
    assert len(held) == 5
    _still_serving(daemon, victim, before)


def test_max_queued_has_a_default(tmp_path: Path) -> None:
    """Without any `limits:`, a user's waiting jobs are bounded: 10,000 by default, kept
    when `default` sets other limits only; `max_queued: null` alone lifts it."""
    assert load_config(None).limits_for("mallory").max_queued == DEFAULT_MAX_QUEUED == 10_000
    path = tmp_path / "config.yaml"
    path.write_text("limits: {default: {max_running: 2}, users: {bob: {max_running: 3}}}")
    assert load_config(path).limits_for("mallory").max_queued == 10_000
    assert load_config(path).limits_for("bob").max_queued == 10_000
    path.write_text("limits: {default: {max_queued: null}, users: {bob: {max_queued: 7}}}")
    assert load_config(path).limits_for("mallory").max_queued is None
    assert load_config(path).limits_for("bob").max_queued == 7


def test_status_of_a_long_queue_is_paged_and_works_for_everyone(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """Mallory's held jobs made `status` too large for anyone's reply. With a page of 50
    (status_page_jobs), 1,000 held jobs: every reply is one page, the victim's
    `status --json` is still complete and their screen lists 200 and counts the rest."""
    mallory, victim = people
    daemon = root_daemon(status_page_jobs=50)
    before = _victim_job(daemon, victim)
    sock = daemon.socket_path
    sweep = [["i", [str(i) for i in range(1000)]]]
    args = _submit_args(mallory, ["echo", "{i}"], sweep=sweep)
    with guarded(daemon, db_growth=16 * MiB):
        as_user(mallory, lambda: _raw(sock, "submit", timeout_s=60, **args))
        page = as_user(victim, lambda: _raw(sock, "status"))
        assert len(page["jobs"]) == 50 and page["next"] is not None
        assert page["counts"] == {"held": 1000, "queued": 0, "running": 1}
        complete = as_user(victim, lambda: Client(sock).status_reply())
    assert len(complete["jobs"]) == 1001
    assert len({j["id"] for j in complete["jobs"]}) == 1001
    screen = as_user(victim, lambda: _cli_output(sock, "status"))
    assert "waiting (1000)" in screen
    assert "... and 800 more waiting" in screen
    assert f"{before}" in screen
    _still_serving(daemon, victim, before)


def test_replies_over_jobs_with_long_commands_are_bounded_while_built(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """300 jobs of 120 KB commands (36 MB, under every submit bound): a status page ends
    early instead of holding them all, the client still gets every job, and a `wait` on
    all of them is refused before its reply is built (at max_queued x max_job_bytes it
    would be 1.25 GiB)."""
    mallory, victim = people
    daemon = root_daemon(show_commands=True)  # everyone's commands in everyone's replies
    before = _victim_job(daemon, victim)
    sock = daemon.socket_path
    ids: list[int] = []
    with guarded(daemon, db_growth=96 * MiB):
        for part in range(3):
            sweep = [["i", [f"{part}-{i}" for i in range(100)]]]
            args = _submit_args(mallory, ["echo", "{i}", "c" * 120_000], sweep=sweep)
            ids += [job["id"] for job in _submit_as(mallory, sock, args)]
        page = as_user(victim, lambda: _raw(sock, "status"))
        assert 0 < len(page["jobs"]) < 301 and page["next"] is not None
        complete = as_user(victim, lambda: Client(sock).status_reply())
        assert len(complete["jobs"]) == 301
        refused = _attempt(mallory, lambda: _raw(sock, "wait", ids=ids, timeout=0))
    assert refused.get("error") == "UsageError", refused
    assert "more than one reply holds" in refused["message"]
    # Cancelling them all did what it was asked: the reply says so for every job, those
    # past the reply's budget in short (`cut`, their long strings left out).
    answer = _attempt(mallory, lambda: _raw(sock, "cancel", mine=True, waiting_only=True))
    assert "result" in answer, answer
    cancelled = answer["result"]
    assert sorted(j["id"] for j in cancelled) == sorted(ids)
    assert {j["state"] for j in cancelled} == {"cancelled"}
    cut = [j for j in cancelled if j.get("cut")]
    assert cut and all(j["command"] == [] for j in cut)
    assert all(len(j["command"]) == 3 for j in cancelled if not j.get("cut"))
    _still_serving(daemon, victim, before)


def test_a_sweeps_submit_reply_is_bounded_and_lists_every_job(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """2,200 jobs with a 16 KiB --notify each: their JSON is 35 MB, past the reply's
    32 MiB budget (the daemon built all of it and the client read all of it). Every job is
    in the reply, those past the budget in short."""
    mallory, victim = people
    daemon = root_daemon()
    before = _victim_job(daemon, victim)
    sock = daemon.socket_path
    sweep = [["i", [str(i) for i in range(2200)]]]
    args = _submit_args(mallory, ["echo", "{i}"], sweep=sweep, notify=["echo", "n" * 16_000])
    with guarded(daemon, db_growth=96 * MiB):
        jobs = _submit_as(mallory, sock, args)
    assert len(jobs) == 2200 and len({j["id"] for j in jobs}) == 2200
    cut = [j for j in jobs if j.get("cut")]
    assert cut and all(j["notify"] is None for j in cut)
    assert all(j["notify"] == ["echo", "n" * 16_000] for j in jobs if not j.get("cut"))
    as_user(mallory, lambda: _raw(sock, "cancel", mine=True, waiting_only=True, timeout_s=60))
    _still_serving(daemon, victim, before)


def test_cancel_all_of_a_long_queue_is_one_transaction(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """`cancel --all` of thousands of waiting jobs ran at 3 jobs/s: 1,000 took five
    minutes. It is one transaction now: every job ends at the same instant."""
    mallory, victim = people
    daemon = root_daemon()
    before = _victim_job(daemon, victim)
    sock = daemon.socket_path
    sweep = [["i", [str(i) for i in range(1000)]]]
    args = _submit_args(mallory, ["echo", "{i}"], sweep=sweep)
    jobs = as_user(mallory, lambda: _raw(sock, "submit", timeout_s=60, **args))
    with guarded(daemon, db_growth=16 * MiB):
        cancelled = as_user(mallory, lambda: _raw(sock, "cancel", mine=True, waiting_only=True))
    assert len(cancelled) == 1000
    assert {j["state"] for j in cancelled} == {"cancelled"}
    assert len({j["ended_at"] for j in cancelled}) == 1  # one transaction, one instant
    last = daemon.show(jobs[-1]["id"])
    assert (last["state"], last["reason"]) == ("cancelled", "cancelled")
    _still_serving(daemon, victim, before)


_TEXT = st.text(alphabet="ab{}é\udcff", min_size=0, max_size=6)


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(st.sampled_from(["a", "b", "ab", "c_1"]), min_size=1, max_size=3, unique=True),
    data=st.data(),
)
def test_measure_is_exactly_what_expand_builds(keys: list[str], data: st.DataObject) -> None:
    """The bounds are checked on measure(): it must be the size of the expansion, exactly
    (values may hold other keys' placeholders: they stay text)."""
    sweep = [(k, data.draw(st.lists(_TEXT, min_size=1, max_size=3))) for k in keys]
    filled = data.draw(st.lists(st.sampled_from(["{" + k + "}" for k in keys]), max_size=4))
    command = [data.draw(_TEXT) + "".join(filled), "".join("{" + k + "}" for k in keys)]
    size = measure(command, sweep)
    built = expand(command, sweep)

    def weight(text: str) -> int:
        return len(text.encode("utf-8", "surrogatepass"))

    per_job = [sum(weight(a) + ARG_OVERHEAD_BYTES for a in argv) for argv, _ in built]
    assert size.jobs == len(built)
    assert size.command_bytes == sum(per_job)
    assert size.largest_command == max(per_job)
    assert size.label_bytes == sum(weight(label) for _, label in built)
    assert size.longest_label == max(len(label) for _, label in built)
