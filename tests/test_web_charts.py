"""The dashboard's job charts and tables in a real browser (issue 29): a round time axis
with m:ss labels, a hole in the samples drawn as a gap, the peak beside the declared
size, a --notify hook's end, and hints still in view on a 700 px window."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from gpusched.core.clock import iso
from gpusched.store import Store, jobs, timeline_points
from tests.browser import chromium, console_errors, require_chromium
from tests.daemon_harness import eventually
from tests.test_web_browser import find, texts, web_daemon

G = 2**30
HINT = "declared 6.0G and peaked at 2.0G: --mem 3G would have started sooner"
LONG_COMMAND = ["python", "/home/alice/experiments/" + "very_long_directory_name_" * 8 + "train.py"]


@pytest.fixture(autouse=True)
def _browser_present() -> None:
    require_chromium()


def ended_job_with_a_gap(database_url: str, start: datetime) -> int:
    """A job that ran 4 minutes, sampled every 2 s except for 2 minutes in the middle
    (its daemon was restarting), with a hint and a failed --notify hook."""
    store = Store(database_url)
    row = {
        "name": None, "user": "alice", "uid": 20001, "gid": 20001, "state": "done",
        "command": LONG_COMMAND, "cwd": "/home/alice", "env": {}, "umask": 0o022,
        "mem": 6 * G, "gpus": 1, "gpu_indices": [0], "gpu_uuids": [], "priority": 0,
        "after": [], "submitted_at": iso(start - timedelta(seconds=5)),
        "started_at": iso(start), "ended_at": iso(start + timedelta(seconds=240)),
        "exit_code": 0, "reason": "exit", "peak_mem": 2 * G, "hints": [HINT],
        "notify": ["mail", "-s", "done", "me@lab.org"],
        "notify_result": {"kind": "exit", "exit_code": 127, "output": "sh: 1: mail: not found"},
    }  # fmt: skip
    with store.database.engine.begin() as conn:
        inserted = conn.execute(jobs.insert(), [row]).inserted_primary_key
        assert inserted is not None
        job_id = int(inserted[0])
        t0 = start.timestamp()
        seconds = [*range(0, 61, 2), *range(180, 241, 2)]
        conn.execute(
            timeline_points.insert(),
            [{"job_id": job_id, "t": t0 + s, "memory": 2 * G, "util": 50.0, "samples": 1}
             for s in seconds],
        )  # fmt: skip
    store.close()
    return job_id


def test_job_charts_tick_round_times_draw_gaps_and_the_tables_keep_their_facts(
    daemon_factory: Any, tmp_path: Path
) -> None:
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)
    (tmp_path / "d").mkdir()
    job_id = ended_job_with_a_gap(f"sqlite:///{tmp_path / 'd' / 'gpusched.db'}", start)
    daemon, url = web_daemon(daemon_factory, show_commands=True)
    with chromium(width=1200) as driver:
        driver.get(f"{url}/job?id={job_id}")
        eventually(lambda: find(driver, '#job-facts dd[data-fact="exit"]'), 20)
        # 4 minutes: a tick a minute, each at its minute (not "0s, 59s, 1m, 1m").
        for chart in ("memory-chart", "util-chart"):
            assert texts(driver, f"#{chart} .tick") == ["0:00", "1:00", "2:00", "3:00", "4:00"]
            # The two minutes without samples are a gap: two lines, not one across it.
            assert len(find(driver, f"#{chart} polyline.series")) == 2
        assert texts(driver, '#job-facts dd[data-fact="peak memory"]') == [
            "2.0G (declared 6.0G per GPU)"
        ]
        assert texts(driver, '#job-facts dd[data-fact="notify"]') == [
            "exited 127: sh: 1: mail: not found"
        ]
        # The queue page at 700 px: the ended job's hint stays inside the window.
        driver.set_window_size(700, 900)
        driver.get(f"{url}/queue")
        eventually(lambda: find(driver, f'#ended tr[data-job="{job_id}"]'), 20)
        row = texts(driver, f'#ended tr[data-job="{job_id}"]')[0]
        assert "2.0G of 6.0G per GPU" in row
        # The long command on one line: its directories go first, then the style sheet
        # cuts the rest; the whole command is the cell's tooltip.
        what = find(driver, f'#ended tr[data-job="{job_id}"] td:nth-child(3) span')[0]
        assert what.get_attribute("textContent") == "python .../" + LONG_COMMAND[1].split("/")[-1]
        assert what.get_attribute("title") == " ".join(LONG_COMMAND)
        assert driver.execute_script(
            "return arguments[0].scrollWidth > arguments[0].clientWidth", what
        )
        right, width = driver.execute_script(
            "const hint = document.querySelector('#ended ul.hints li');"
            " return [hint.getBoundingClientRect().right, document.documentElement.clientWidth];"
        )
        assert right <= width, (right, width)
        assert console_errors(driver) == []
    daemon.stop()


def test_gpu_cards_show_each_jobs_memory_and_whose_the_rest_is(
    daemon_factory: Any, fake_nvml: Any
) -> None:
    import subprocess

    fake_nvml.set_gpus([24 * G])
    daemon, url = web_daemon(daemon_factory, fake_nvml)
    outsider = subprocess.Popen(["sleep", "120"])
    try:
        fake_nvml.register_process(0, outsider.pid, 10 * G)
        job_id = daemon.submit(
            "--mem", "4G", "--", *fake_nvml.gpujob_argv("--mem", "3G", "--hold", "60")
        )  # fmt: skip
        with chromium() as driver:
            driver.get(url)

            def card() -> str:
                found = texts(driver, '.gpu[data-index="0"]')
                return (
                    found[0]
                    if found and "others:" in found[0] and "(3.0G/4.0G)" in found[0]
                    else ""
                )

            text = eventually(card, 30, describe=lambda: texts(driver, ".gpu"))
            assert f"{job_id} (3.0G/4.0G)" in text  # what it holds, of what it declared
            assert f"others: root:sleep/{outsider.pid} (10.0G)" in text
            assert console_errors(driver) == []
    finally:
        outsider.kill()
        outsider.wait()
        daemon.stop()
        daemon.kill_jobs()
