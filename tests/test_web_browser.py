"""The dashboard in a real browser (Debian's chromium, headless, through selenium) against a
real daemon on simulated GPUs and on the fake NVML driver.

What the pages show is checked against the CLI's `status --json` and `show --json`, the
page is checked to update itself without a reload, hostile job names to stay text, and the
browser console to log no error (a Content-Security-Policy violation would be one).
`test_screenshots` saves the pages; with GPUSCHED_SCREENSHOTS=DIR it also copies them
there (docs/screenshots/ is made this way: see docs/operations.md).
"""

from __future__ import annotations

import math
import os
import shutil
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from gpusched.core.clock import iso
from gpusched.core.units import format_size
from gpusched.store import Store, jobs
from tests.browser import chromium, console_errors, free_port, require_chromium
from tests.daemon_harness import RunningDaemon, eventually
from tests.fakenvml.fixtures import FakeNvml
from tests.fakenvml.state import FakeGpu, fake_uuid

G = 2**30
HOSTILE = "<img src=x onerror=alert(1)>"


@pytest.fixture(autouse=True)
def _browser_present() -> None:
    require_chromium()


def web_daemon(
    daemon_factory: Any, fake: FakeNvml | None = None, **config: Any
) -> tuple[RunningDaemon, str]:
    port = free_port()
    settings = {"web": f"127.0.0.1:{port}", "poll_interval": "0.5s", **config}
    if fake is None:
        daemon = daemon_factory(config=settings)
    else:
        daemon = daemon_factory(simulate=None, config=settings, env=fake.env())
    return daemon.start(), f"http://127.0.0.1:{port}"


def find(driver: Any, css: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, css))


def texts(driver: Any, css: str) -> list[str]:
    """The text of every element matching `css`, read in one go: the page redraws itself
    every poll, so elements found one call earlier may be gone."""
    found = driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.textContent)", css
    )
    return [str(text) for text in found]


# Each GPU row as the page shows it, read atomically (see `texts`).
GPU_ROWS_JS = """
return Array.from(document.querySelectorAll('.gpu'), row => ({
  index: Number(row.dataset.index),
  name: row.querySelector('.gpu-name').textContent,
  used: row.querySelector('.gpu-used').textContent,
  available: row.querySelector('.gpu-available').textContent,
  util: row.querySelector('.gpu-util').textContent,
  jobs: Array.from(row.querySelectorAll('.gpu-jobs a'), a => a.textContent),
  segments: Object.fromEntries(Array.from(row.querySelectorAll('.seg[data-segment]'),
    seg => [seg.dataset.segment, Number(seg.dataset.bytes)])),
}));
"""


def js_percent(value: float | None) -> str:
    """fmtPercent in dashboard.js: Math.round (halves up), then %."""
    return "-" if value is None else f"{math.floor(value + 0.5)}%"


def gpu_rows_match(driver: Any, daemon: RunningDaemon) -> bool:
    """Whether every GPU row on the page shows what `status --json` says now."""
    shown = driver.execute_script(GPU_ROWS_JS)
    expected = [
        {
            "index": gpu["index"],
            "name": gpu["name"],
            "used": f"{format_size(gpu['used'])}/{format_size(gpu['total'])}",
            "available": format_size(gpu["available"]),
            "util": js_percent(gpu["util"]),
            "jobs": [str(job) for job in gpu["jobs"]],
            "segments": {
                "jobs": gpu["used_by_jobs"],
                "others": gpu["used_by_others"],
                "reserved": gpu["reserved"],
                "free": gpu["total"]
                - gpu["used_by_jobs"]
                - gpu["used_by_others"]
                - gpu["reserved"],
            },
        }
        for gpu in daemon.status()["gpus"]
    ]
    return bool(shown == expected)


def test_gpu_rows_on_simulated_gpus(daemon_factory: Any) -> None:
    daemon, url = web_daemon(daemon_factory)
    job = daemon.submit("--mem", "10G", "--", "sleep", "60")
    daemon.wait_state(job, {"running"})
    eventually(lambda: sum(g["used"] for g in daemon.status()["gpus"]) == 10 * G)
    with chromium() as driver:
        driver.get(url + "/")
        eventually(
            lambda: gpu_rows_match(driver, daemon),
            20,
            describe=lambda: (driver.execute_script(GPU_ROWS_JS), daemon.status()["gpus"]),
        )
        assert console_errors(driver) == []


def test_gpu_rows_on_the_fake_nvml_driver(daemon_factory: Any, fake_nvml: FakeNvml) -> None:
    fake_nvml.set_gpus(
        [
            FakeGpu(uuid=fake_uuid(0), other_bytes=6 * G, util_percent=35),
            FakeGpu(uuid=fake_uuid(1), name="NVIDIA A100-SXM4-80GB", total_bytes=80 * G),
        ]
    )
    daemon, url = web_daemon(daemon_factory, fake_nvml)
    job = daemon.submit("--mem", "8G", "--", *fake_nvml.gpujob_argv("--mem", "8G", "--hold", "60"))
    daemon.wait_state(job, {"running"})
    eventually(lambda: any(g["used_by_jobs"] for g in daemon.status()["gpus"]), 20)
    with chromium() as driver:
        driver.get(url + "/")
        eventually(
            lambda: gpu_rows_match(driver, daemon),
            20,
            describe=lambda: (driver.execute_script(GPU_ROWS_JS), daemon.status()["gpus"]),
        )
        others = driver.execute_script(GPU_ROWS_JS)[0]["segments"]["others"]
        assert others >= 6 * G  # the other process's
        assert console_errors(driver) == []


def test_queue_shows_why_a_job_waits_and_updates_without_a_reload(daemon_factory: Any) -> None:
    daemon, url = web_daemon(daemon_factory)
    blocker = daemon.submit("--mem", "20G", "--gpus", "2", "--", "sleep", "60")
    daemon.wait_state(blocker, {"running"})
    waiting = daemon.submit("--mem", "20G", "--name", HOSTILE, "--", "sleep", "60")
    daemon.wait_reason(waiting, "needs 20.0G")
    with chromium() as driver:
        driver.get(url + "/queue")
        row = f'#waiting tr[data-job="{waiting}"]'

        def reason_shown() -> bool:
            by_id = {job["id"]: job for job in daemon.status()["jobs"]}
            return texts(driver, row + " .reason") == [by_id[waiting]["waiting_reason"]]

        eventually(reason_shown, 20)
        # The name is text on the page, not an element: no <img> was made of it.
        assert HOSTILE in texts(driver, row)[0]
        assert find(driver, "main img") == []
        driver.execute_script("window.gpuschedNoReload = 'still this page'")
        assert daemon.cli("cancel", str(blocker)).returncode == 0
        eventually(lambda: find(driver, f'#running tr[data-job="{waiting}"]'), 20)
        eventually(lambda: "cancelled" in " ".join(texts(driver, "#ended tr")))
        assert driver.execute_script("return window.gpuschedNoReload") == "still this page"
        assert console_errors(driver) == []


def chart_vertices(driver: Any, chart: str) -> int:
    """Points drawn in a chart: the vertices of its lines and its lone dots."""
    lines = find(driver, f"#{chart} polyline")
    dots = find(driver, f"#{chart} circle")
    return sum(len(line.get_attribute("points").split()) for line in lines) + len(dots)


def test_job_page_draws_the_jobs_samples(daemon_factory: Any, fake_nvml: FakeNvml) -> None:
    daemon, url = web_daemon(daemon_factory, fake_nvml)
    argv = fake_nvml.gpujob_argv(
        "--mem", "2G", "--grow", "5G", "--grow-after", "2", "--hold", "5", "--util-cycle", "20,90"
    )
    job = daemon.submit("--mem", "6G", "--name", HOSTILE, "--", *argv)
    daemon.wait_state(job, {"done"}, timeout=60)
    shown = daemon.show(job)
    with chromium() as driver:
        driver.get(f"{url}/job?id={job}")
        eventually(lambda: find(driver, '#job-facts dd[data-fact="exit"]'), 20)
        assert texts(driver, '#job-facts dd[data-fact="exit"]') == ["done exit 0"]
        assert HOSTILE in texts(driver, "#job-title")[0]
        assert find(driver, "main img") == []
        assert texts(driver, "#memory-chart .declared-label") == ["declared 6.0G"]
        timeline = shown["timeline"]
        assert timeline, "a job that ran 5 s has samples"
        rows = driver.execute_script(
            "return Array.from(document.querySelectorAll('#samples-table tbody tr'),"
            " row => Array.from(row.cells, cell => cell.textContent))"
        )
        assert rows == [
            [p["t"][:19].replace("T", " "), format_size(p["memory"]), js_percent(p["util"])]
            for p in timeline
        ]
        memory = sum(p["memory"] is not None for p in timeline)
        util = sum(p["util"] is not None for p in timeline)
        assert chart_vertices(driver, "memory-chart") == memory
        assert chart_vertices(driver, "util-chart") == util
        assert texts(driver, ".chart .empty") == []
        # A job that never ran has no samples, and its charts say so.
        held = daemon.submit("--mem", "1G", "--hold", "--", "true")
        driver.get(f"{url}/job?id={held}")
        eventually(lambda: texts(driver, ".chart .empty") == ["no samples"] * 2, 20)
        assert console_errors(driver) == []


def lab_history(database_url: str, now: datetime) -> None:
    """Other people's jobs of the last hours, written before the daemon starts (as the
    benchmarks fill a history), so the usage page has several users to order."""
    store = Store(database_url)
    rows = []
    for i, (user, mem_g, hours_ago, hours) in enumerate(
        (
            ("alice", 40, 5.0, 3.5),
            ("alice", 20, 1.0, 0.8),
            ("bob", 24, 2.0, 1.5),
            ("chen", 8, 0.7, 0.5),
        )
    ):
        end = now - timedelta(hours=hours_ago)
        rows.append(
            {
                "name": f"{user}-run{i}",
                "user": user,
                "uid": 20001 + i,
                "gid": 20001 + i,
                "state": "done",
                "command": ["python", "train.py"],
                "cwd": f"/home/{user}",
                "env": {},
                "umask": 0o022,
                "mem": mem_g * G,
                "gpus": 1,
                "gpu_indices": [i % 3],
                "gpu_uuids": [fake_uuid(i % 3)],
                "priority": 0,
                "after": [],
                "submitted_at": iso(end - timedelta(hours=hours + 0.2)),
                "started_at": iso(end - timedelta(hours=hours)),
                "ended_at": iso(end),
                "exit_code": 0,
                "reason": "exit",
                "peak_mem": (mem_g - 2) * G,
                "hints": [],
            }
        )
    with store.database.engine.begin() as conn:
        conn.execute(jobs.insert(), rows)
    store.close()


def test_screenshots(daemon_factory: Any, fake_nvml: FakeNvml, tmp_path: Path) -> None:
    """The four pages with a queue and a finished job's curves, as docs/screenshots has them."""
    fake_nvml.set_gpus(
        [
            FakeGpu(uuid=fake_uuid(0), name="NVIDIA RTX A6000", total_bytes=48 * G),
            FakeGpu(uuid=fake_uuid(1), name="NVIDIA RTX A6000", total_bytes=48 * G),
            FakeGpu(uuid=fake_uuid(2), name="NVIDIA RTX A6000", total_bytes=48 * G),
        ]
    )
    lab_history(f"sqlite:///{tmp_path / 'd' / 'gpusched.db'}", datetime.now(timezone.utc))
    # Hints for a job of seconds (by default only jobs of two minutes or more get them).
    daemon, url = web_daemon(daemon_factory, fake_nvml, hint_min_runtime=0)
    fake_nvml.set_gpu(2, other_bytes=9 * G, util_percent=40)  # someone's notebook, outside gpusched

    def gpujob(mem: str, *more: str) -> list[str]:
        return ["--mem", mem, "--name", more[0], "--", *fake_nvml.gpujob_argv(*more[1:])]

    finished = daemon.submit(
        *gpujob("12G", "resnet50-bs256", "--lag", "1", "--mem", "6G", "--grow", "10G",
                "--grow-after", "4", "--hold", "14", "--util-cycle", "85,92,15,88,90,10",
                "--util-period", "1.5")
    )  # fmt: skip
    daemon.wait_state(finished, {"done"}, timeout=90)
    daemon.submit(*gpujob("30G", "llama-7b-lora", "--mem", "26G", "--hold", "600", "--util", "97"))
    daemon.submit(*gpujob("20G", "vit-base", "--mem", "14G", "--hold", "600", "--util", "64"))
    daemon.submit(*gpujob("24G", "whisper-ft", "--mem", "18G", "--hold", "600", "--util", "80"))
    big = daemon.submit(*gpujob("40G", "sd-xl", "--mem", "38G", "--hold", "60"))
    daemon.submit("--mem", "4G", "--hold", "--name", "eval-later", "--", "python", "eval.py")
    daemon.wait_reason(big, "needs 40.0G")
    eventually(lambda: sum(len(g["jobs"]) for g in daemon.status()["gpus"]) == 3, 30)
    # Every running job has allocated (what they declared beyond shows as reserved).
    eventually(lambda: sum(g["used_by_jobs"] for g in daemon.status()["gpus"]) == 58 * G, 30)
    saved = []
    with chromium() as driver:
        for name, path, ready, height in (
            ("server", "/", ".gpu", 640),
            ("queue", "/queue", f'#waiting tr[data-job="{big}"] .reason', 860),
            ("job", f"/job?id={finished}", '#job-facts dd[data-fact="exit"]', 1000),
            ("usage", "/usage", "#usage tr[data-user]", 480),
        ):
            driver.set_window_size(1200, height)
            driver.get(url + path)
            eventually(partial(find, driver, ready), 20)
            out = tmp_path / f"{name}.png"
            assert driver.save_screenshot(str(out))
            saved.append(out)
        assert console_errors(driver) == []
    copy_to = os.environ.get("GPUSCHED_SCREENSHOTS")
    if copy_to:
        Path(copy_to).mkdir(parents=True, exist_ok=True)
        for out in saved:
            shutil.copy(out, Path(copy_to) / out.name)
