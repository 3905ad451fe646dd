"""End to end: what jobs use, the hints it earns them, OOM endings and retries, overruns.

The real daemon runs on the fake NVML driver; each test job (tests/fakenvml/gpujob.py)
holds the memory and shows the SM utilization the test tells it to, so every figure the
daemon records is one the test chose. Polls are fast (0.3 s) and `hint_min_runtime` is 4 s,
so jobs of 5 seconds are long enough to judge and one of 1 second is not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.daemon_harness import RunningDaemon, eventually
from tests.fakenvml.fixtures import FakeNvml

GiB = 2**30


def start(daemon_factory: Any, fake: FakeNvml, **config: Any) -> RunningDaemon:
    settings = {"poll_interval": "0.3s", "hint_min_runtime": "4s", **config}
    return daemon_factory(simulate=None, config=settings, env=fake.env()).start()


def gpu_job(daemon: RunningDaemon, fake: FakeNvml, mem: str, *args: str) -> int:
    return daemon.submit("--mem", mem, "--", *fake.gpujob_argv(*args))


def wait_all(
    daemon: RunningDaemon, ids: list[int], timeout: float = 40
) -> dict[int, dict[str, Any]]:
    jobs = daemon.client().wait(ids, timeout=timeout)
    states = [(j.id, str(j.state), j.waiting_reason, j.reason_detail) for j in jobs]
    assert all(j.state not in ("queued", "running") for j in jobs), states
    return {j.id: daemon.show(j.id) for j in jobs}


def test_usage_is_measured_shown_and_earns_the_right_hints(
    daemon_factory: Any, fake_nvml: FakeNvml
) -> None:
    # A card for each of the six jobs: each one's figures are its own (judged poll by
    # poll, a job sharing a card with a busy one is partly taking turns, and its hints
    # then blame neither its data nor contention).
    fake_nvml.set_gpus([24 * GiB] * 6)
    daemon = start(daemon_factory, fake_nvml)
    # A well-sized, busy job: figures recorded, no hint.
    steady = gpu_job(daemon, fake_nvml, "8G", "--mem", "7.5G", "--util", "85", "--hold", "7")
    # While it runs, `show` has the figures so far.
    live = eventually(lambda: (j := daemon.client().job(steady).to_json())["mean_util"] and j)
    assert live["state"] == "running"
    assert (live["mean_util"], live["peak_mem"]) == (85, int(7.5 * GiB))
    # Declared 20G, uses 6G: the "declare less" hint, and nothing about utilization.
    roomy = gpu_job(daemon, fake_nvml, "20G", "--mem", "6G", "--util", "90", "--hold", "5")
    # Busy in bursts (waiting for data): the DataLoader hint.
    bursty = gpu_job(
        daemon, fake_nvml, "8G", "--mem", "7G", "--util-cycle", "0,95,10,90,5", "--hold", "6"
    )
    # Steadily idle: the low-utilization hint; 3.5G of 4G is not oversized.
    idle = gpu_job(daemon, fake_nvml, "4G", "--mem", "3.5G", "--util", "10", "--hold", "5")
    # Oversized and idle too, but too short to judge: no hint.
    short = gpu_job(daemon, fake_nvml, "20G", "--mem", "2G", "--util", "5", "--hold", "1")
    # Grows past its declared 4G (overrun: warn, the default): recorded, told, not stopped.
    grower = gpu_job(
        daemon,
        fake_nvml,
        "4G",
        *("--mem", "3G", "--grow", "6G", "--grow-after", "1", "--util", "80", "--hold", "4"),
    )

    jobs = wait_all(daemon, [steady, roomy, bursty, idle, short, grower])
    assert {j["state"] for j in jobs.values()} == {"done"}

    assert jobs[steady]["peak_mem"] == int(7.5 * GiB)
    assert (jobs[steady]["mean_util"], jobs[steady]["util_min"], jobs[steady]["util_max"]) == (
        85,
        85,
        85,
    )
    assert jobs[steady]["util_stddev"] == 0
    assert jobs[steady]["hints"] == []

    assert jobs[roomy]["peak_mem"] == 6 * GiB
    assert jobs[roomy]["hints"] == [
        "declared 20G, peak 6G: --mem 7G would let others share the card"
    ]

    [hint] = jobs[bursty]["hints"]
    assert hint.startswith("GPU busy ")
    assert "swinging 0-95%" in hint
    assert "num_workers" in hint
    assert jobs[bursty]["util_min"] == 0
    assert jobs[bursty]["util_max"] == 95
    assert 10 < jobs[bursty]["mean_util"] < 80

    assert jobs[idle]["hints"] == [
        "GPU busy only 10% on average (10-10%): the GPU mostly waits; look for CPU work in each"
        " step (data loading, preprocessing, logging) or try a larger batch"
    ]

    assert jobs[short]["peak_mem"] == 2 * GiB  # it was measured...
    assert jobs[short]["hints"] == []  # ...but not judged

    assert jobs[grower]["overrun_at"] is not None
    assert jobs[grower]["peak_mem"] == 6 * GiB
    assert jobs[grower]["hints"] == [
        "peak 6G went above the declared 4G: the job put the other jobs on its GPU at risk of"
        " running out of memory; declare --mem 7G; in PyTorch,"
        " torch.cuda.set_per_process_memory_fraction(0.29) at its start keeps it within --mem"
        " 7G on a 24G card (an error in it, not in its neighbours)"
    ]
    assert f"gpusched: job {grower} uses 6.0G on GPU" in daemon.log(grower)
    assert all(jobs[j]["overrun_at"] is None for j in (steady, roomy, bursty, idle, short))

    shown = daemon.cli("show", str(roomy)).stdout
    assert "peak mem:  6.0G (declared 20.0G per GPU)" in shown
    assert "gpu util:  90% on average, 90%-90% (sd 0)" in shown
    assert "hint:      declared 20G, peak 6G" in shown
    listing = daemon.cli("history").stdout.splitlines()
    assert "UTIL" in listing[0]
    [row] = [line for line in listing if line.startswith(f"{steady} ")]
    assert " 7.5G" in row
    assert " 85%" in row


# What PyTorch prints when an allocation fails (abridged from torch 2.3).
TORCH_OOM = """Traceback (most recent call last):
  File "train.py", line 42, in <module>
    loss = model(batch).sum()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total \
capacity of 23.65 GiB of which 1.12 GiB is free. Of the allocated memory 20.1 GiB is allocated \
by PyTorch."""

# First run: run out of memory; any later run: succeed. Prints what frameworks are told.
FIRST_RUN_OOMS = f"""
import os, pathlib, sys
print("XLA", os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
      "TF", os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH"), flush=True)
marker = pathlib.Path(sys.argv[1])
if not marker.exists():
    marker.write_text("ran")
    print({TORCH_OOM!r}, file=sys.stderr)
    sys.exit(1)
print("trained")
"""


def test_oom_in_the_log_is_retried_with_more_memory_in_its_place(
    daemon_factory: Any, fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    daemon = start(daemon_factory, fake_nvml)
    marker = tmp_path / "ran-once"
    first = daemon.submit(
        "--mem", "4G", "--retry-oom", "2", "--", sys.executable, "-c", FIRST_RUN_OOMS, str(marker)
    )
    # `wait` follows the job to its retry and exits with the retry's code.
    waited = daemon.cli("wait", str(first), "--timeout", "40")
    assert waited.returncode == 0, waited.stderr
    assert "ran out of GPU memory; waiting for its retry" in waited.stderr

    ended = daemon.show(first)
    assert (ended["state"], ended["reason"], ended["exit_code"]) == ("failed", "oom", 1)
    assert "torch.OutOfMemoryError: CUDA out of memory" in ended["reason_detail"]
    retry_id = ended["retried_as"]
    assert ended["hints"] == [f"ran out of GPU memory: retried as job {retry_id} with --mem 6G"]
    retry = daemon.show(retry_id)
    assert retry["state"] == "done"
    assert retry["mem"] == 6 * GiB  # 1.5 x 4G
    assert retry["retry_of"] == first
    assert retry["retry_oom"] == 1
    assert retry["submitted_at"] == ended["submitted_at"]
    assert retry["command"] == ended["command"]
    # Frameworks that grab the whole card are told the job's share (4G, then 6G, of 24G).
    assert "XLA 0.16 TF true" in daemon.log(first)
    assert "XLA 0.25 TF true\ntrained" in daemon.log(retry_id)
    # Requeued, the retry runs again with the memory it learnt and the --retry-oom the
    # user first gave (2), not what its retry left (1).
    again = daemon.show(int(daemon.cli("requeue", str(retry_id)).stdout))
    assert (again["mem"], again["retry_oom"]) == (6 * GiB, 2)

    # A value the user set is theirs; a whole-GPU job is told nothing.
    own = daemon.submit(
        "--mem", "4G", "--", sys.executable, "-c", FIRST_RUN_OOMS, str(marker),
        env={**daemon.env, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"},
    )  # fmt: skip
    whole = daemon.submit("--", sys.executable, "-c", FIRST_RUN_OOMS, str(marker))
    jobs = wait_all(daemon, [own, whole])
    assert [jobs[own]["state"], jobs[whole]["state"]] == ["done", "done"]
    assert "XLA 0.9 TF true" in daemon.log(own)
    assert "XLA None TF None" in daemon.log(whole)


def test_death_at_the_cards_limit_is_oom_and_other_failures_are_not(
    daemon_factory: Any, fake_nvml: FakeNvml
) -> None:
    daemon = start(daemon_factory, fake_nvml)
    # Holds 20G of GPU 0; something outside gpusched fills the rest; the job dies silently.
    full = gpu_job(
        daemon,
        fake_nvml,
        "20G",
        *("--mem", "20G", "--util", "90", "--hold", "3", "--exit-code", "1"),
    )
    daemon.wait_state(full, {"running"})
    fake_nvml.set_gpu(0, other_bytes=int(3.6 * GiB))  # 24G - 256M reserved - 20G - 3.6G: full
    # Fails the same way with plenty of room: an ordinary failure.
    plain = gpu_job(
        daemon,
        fake_nvml,
        "2G",
        *("--mem", "1.5G", "--util", "90", "--hold", "2", "--exit-code", "3"),
    )
    # Says "CUDA out of memory" but then ends well: not an OOM either.
    survivor = daemon.submit("--mem", "1G", "--", sys.executable, "-c", f"print({TORCH_OOM!r})")
    jobs = wait_all(daemon, [full, plain, survivor])

    assert (jobs[full]["state"], jobs[full]["reason"]) == ("failed", "oom")
    assert "GPU 0 was full" in jobs[full]["reason_detail"]
    assert jobs[full]["hints"] == [
        # 24G less the fake driver's 256M reserve (NVML v2) less the 512M headroom: 23.25G
        "ran out of GPU memory with --mem 20G: resubmit with --mem 23808M (--retry-oom N does that"
        " by itself), or lower the batch size, or use mixed precision or gradient checkpointing;"
        " in PyTorch, torch.cuda.set_per_process_memory_fraction(0.96) at its start keeps it"
        " within --mem 23808M on a 24G card (an error in it, not in its neighbours)"
    ]
    assert jobs[full]["retried_as"] is None
    assert (jobs[plain]["state"], jobs[plain]["reason"], jobs[plain]["exit_code"]) == (
        "failed",
        "exit",
        3,
    )
    assert jobs[plain]["hints"] == []
    assert (jobs[survivor]["state"], jobs[survivor]["reason"]) == ("done", "exit")


def test_overrun_kill_stops_the_job_over_its_memory_and_only_it(
    daemon_factory: Any, fake_nvml: FakeNvml
) -> None:
    fake_nvml.set_gpus([24 * GiB])
    daemon = start(daemon_factory, fake_nvml, overrun="kill", overrun_margin="10%")
    greedy = gpu_job(
        daemon, fake_nvml, "4G", "--mem", "3G", "--grow", "8G", "--grow-after", "1", "--hold", "30"
    )
    # 4.2G of a declared 4G is within the 10% margin: it runs to the end.
    within = gpu_job(daemon, fake_nvml, "4G", "--mem", "4.2G", "--hold", "6")
    jobs = wait_all(daemon, [greedy, within])

    assert (jobs[greedy]["state"], jobs[greedy]["reason"]) == ("failed", "overrun")
    assert jobs[greedy]["reason_detail"].startswith(f"job {greedy} uses 8.0G on GPU 0")
    assert jobs[greedy]["overrun_at"] is not None
    assert "stopping it (overrun: kill)" in daemon.log(greedy)
    assert jobs[greedy]["hints"][0].startswith("peak 8G went above the declared 4G")
    assert (jobs[within]["state"], jobs[within]["reason"]) == ("done", "exit")
    assert jobs[within]["overrun_at"] is None
    # The neighbour was running all along, and outlived the job that was stopped.
    assert jobs[within]["started_at"] < jobs[greedy]["ended_at"] < jobs[within]["ended_at"]


def test_memory_from_history_estimate_and_submit_auto(daemon_factory: Any) -> None:
    daemon = daemon_factory(simulate="2x24G", config={"poll_interval": "0.3s"}).start()
    command = ["sh", "-c", "sleep 1.5; exit $CODE"]

    def run(mem: str, code: str) -> int:
        return daemon.submit("--mem", mem, "--", *command, env={**daemon.env, "CODE": code})

    runs = [run("6G", "0"), run("5G", "0"), run("20G", "1")]  # simulated jobs use what they declare
    jobs = wait_all(daemon, runs)
    assert [jobs[j]["peak_mem"] for j in runs] == [6 * GiB, 5 * GiB, 20 * GiB]

    result = daemon.cli("estimate", "--json", "--history", "--", *command)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    # The failed run's 20G does not count: the peak is 6G, plus 10%, rounded up to 7G.
    assert sorted(run["id"] for run in info["jobs"]) == runs[:2]
    assert (info["peak_mem"], info["suggested_mem"]) == (6 * GiB, 7 * GiB)
    assert "suggested: --mem 7G" in daemon.cli("estimate", "--history", "--", *command).stdout

    auto = daemon.cli("submit", "--json", "--mem", "auto", "--", *command)
    assert auto.returncode == 0, auto.stderr
    assert json.loads(auto.stdout)["mem"] == 7 * GiB
    assert "--mem auto: 7G" in auto.stderr

    refused = daemon.cli("submit", "--mem", "auto", "--", "sleep", "9")
    assert refused.returncode == 1
    assert "--mem auto: no earlier run of this exact command" in refused.stderr
    assert refused.stdout == ""


def test_mem_auto_near_a_whole_card_suggests_what_a_card_gives(daemon_factory: Any) -> None:
    """A peak of 23G on 24G cards: peak + 10 % is more than any card gives, yet the peak
    fits, so the suggestion is the most a card gives, not a size submit refuses."""
    daemon = daemon_factory(simulate="2x24G", config={"poll_interval": "0.3s"}).start()
    command = ["sh", "-c", "sleep 1.5"]
    wait_all(daemon, [daemon.submit("--mem", "23G", "--", *command)])
    info = json.loads(daemon.cli("estimate", "--json", "--history", "--", *command).stdout)
    assert info["peak_mem"] == 23 * GiB
    assert 23 * GiB <= info["suggested_mem"] < 24 * GiB
    text = daemon.cli("estimate", "--history", "--", *command).stdout
    assert "(the most a GPU here gives: peak + 10% would not fit)" in text
    auto = daemon.cli("submit", "--json", "--mem", "auto", "--", *command)
    assert auto.returncode == 0, auto.stderr
    assert json.loads(auto.stdout)["mem"] == info["suggested_mem"]
