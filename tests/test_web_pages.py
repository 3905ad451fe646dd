"""What the dashboard's queue, GPU and job pages draw, in a real browser: cells that keep to
one line at 1400 and 700 px, memory in use beside the declared, other users' sweep and
interactive jobs named as the CLI names them, an end said once, a retry linked, and a
chart's "no samples" clear of its declared line.

The ended jobs are written to the database before the daemon starts (as
tests/test_web_charts.py does), each as another user's: the dashboard shows every job as
a stranger sees it, so their commands read "(hidden)".
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from gpusched.core.clock import iso
from gpusched.store import Store, jobs
from tests.browser import chromium, console_errors, require_chromium
from tests.daemon_harness import eventually
from tests.fakenvml.fixtures import FakeNvml
from tests.test_web_browser import find, texts, web_daemon

G = 2**30
SWEPT, FIRST, RETRY, CANCELLED = 31, 32, 60, 33
RETRY_HINT = f"ran out of GPU memory: retried as job {RETRY} with --mem 5G"
# A long hint and a long waiting reason: they take the room the other columns give up.
LONG_HINT = (
    "declared 6.0G and peaked at 2.0G: --mem 3G would have started sooner; GPU busy only"
    " 12% on average (3-20%): the GPU mostly waits; look for CPU work in each step"
)


@pytest.fixture(autouse=True)
def _browser_present() -> None:
    require_chromium()


def ended_row(job_id: int, start: datetime, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": job_id, "name": None, "user": "alice", "uid": 20001, "gid": 20001,
        "state": "done", "command": ["python", "train.py"], "cwd": "/home/alice", "env": {},
        "umask": 0o022, "mem": 4 * G, "gpus": 1, "gpu_indices": [0], "gpu_uuids": [],
        "priority": 0, "after": [], "submitted_at": iso(start - timedelta(seconds=5)),
        "started_at": iso(start), "ended_at": iso(start + timedelta(seconds=60)),
        "exit_code": 0, "reason": "exit", "reason_detail": None, "peak_mem": 2 * G,
        "hints": [LONG_HINT], "array_id": None, "array_index": None, "interactive": None,
        "retried_as": None, "retry_of": None,
    }  # fmt: skip
    return {**row, **fields}


def lab_ends(root: Path) -> None:
    """A swept job of alice's cancelled by her, and her interactive job that ran out of
    memory and was retried."""
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)
    root.mkdir(exist_ok=True)
    store = Store(f"sqlite:///{root / 'gpusched.db'}")
    rows = [
        ended_row(SWEPT, start, array_id=SWEPT, array_index=0),
        ended_row(
            CANCELLED, start, array_id=SWEPT, array_index=1, state="cancelled",
            reason="cancelled", reason_detail="cancelled by alice", exit_code=None,
        ),
        ended_row(
            FIRST, start, interactive=1, state="failed", reason="oom", exit_code=None,
            reason_detail=None, retried_as=RETRY, hints=[RETRY_HINT],
        ),
        ended_row(RETRY, start, interactive=1, retry_of=FIRST, mem=5 * G),
    ]  # fmt: skip
    with store.database.engine.begin() as conn:
        conn.execute(jobs.insert(), rows)
    store.close()


def lab(daemon_factory: Any, fake_nvml: FakeNvml, tmp_path: Path) -> tuple[str, int]:
    """The dashboard's URL of a daemon with those ends, and its job of 4G declared that
    holds 3G."""
    fake_nvml.set_gpus([24 * G])
    lab_ends(tmp_path / "d")
    daemon, url = web_daemon(daemon_factory, fake_nvml)
    job = daemon.submit("--mem", "4G", "--", *fake_nvml.gpujob_argv("--mem", "3G", "--hold", "120"))
    eventually(lambda: daemon.show(job).get("mem_used") == 3 * G, 30)
    return url, job


# Each ID and Job cell's lines: the distinct tops of its text's line boxes.
CELL_LINES_JS = """
const lines = (cell) => {
  const tops = new Set();
  const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  for (let node = walk.nextNode(); node; node = walk.nextNode()) {
    const range = document.createRange();
    range.selectNodeContents(node);
    for (const rect of range.getClientRects()) if (rect.width > 0) tops.add(Math.round(rect.top));
  }
  return tops.size;
};
const css = 'tbody tr[data-job] td:nth-child(1), tbody tr[data-job] td:nth-child(3)';
return Array.from(document.querySelectorAll(css),
  (cell) => [cell.closest('tr').dataset.job, cell.textContent, lines(cell)]);
"""


def test_id_and_job_cells_keep_to_one_line_at_1400_and_700_px(
    daemon_factory: Any, fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    url, job = lab(daemon_factory, fake_nvml, tmp_path)
    with chromium() as driver:
        for width in (1400, 700):
            driver.set_window_size(width, 900)
            driver.get(url + "/queue")
            eventually(lambda: find(driver, f'#running tr[data-job="{job}"]'), 20)
            eventually(lambda: find(driver, f'#ended tr[data-job="{SWEPT}"]'), 20)
            cells = driver.execute_script(CELL_LINES_JS)
            assert len(cells) == 2 * 5, cells  # ID and Job of the running job and 4 ends
            assert [cell for cell in cells if cell[2] != 1] == [], width
            # Nothing is pushed past the window's right edge either.
            overflow = driver.execute_script(
                "return [document.documentElement.scrollWidth,"
                " document.documentElement.clientWidth]"
            )
            assert overflow[0] <= overflow[1], (width, overflow)
        assert console_errors(driver) == []


def test_the_queue_shows_a_running_jobs_memory_in_use_beside_the_declared(
    daemon_factory: Any, fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    url, job = lab(daemon_factory, fake_nvml, tmp_path)
    with chromium(width=1400) as driver:
        driver.get(url + "/queue")
        cell = f'#running tr[data-job="{job}"] td:nth-child(5)'  # Memory
        eventually(
            lambda: texts(driver, cell) == ["3.0G/4.0G"], 20, describe=lambda: texts(driver, cell)
        )
        assert console_errors(driver) == []


def test_the_gpu_page_shows_each_jobs_memory_in_use_beside_the_declared(
    daemon_factory: Any, fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    url, job = lab(daemon_factory, fake_nvml, tmp_path)
    with chromium(width=1400) as driver:
        driver.get(url + "/")
        eventually(
            lambda: texts(driver, ".gpu-jobs") == [f"{job} (3.0G/4.0G)  "],
            20,
            describe=lambda: texts(driver, ".gpu-jobs"),
        )
        assert console_errors(driver) == []


def ended_cell(driver: Any, job_id: int, column: str) -> str:
    """A cell of the queue's "Recently ended" row of `job_id`, by its column's heading."""
    where = {"ID": 1, "Job": 3, "How": 5, "Hints": 7}[column]
    return texts(driver, f'#ended tr[data-job="{job_id}"] td:nth-child({where})')[0]


def ended_queue(driver: Any, url: str) -> None:
    driver.get(url + "/queue")
    eventually(lambda: find(driver, f'#ended tr[data-job="{RETRY}"]'), 20)


def test_other_users_sweep_and_interactive_jobs_are_named_as_the_cli_names_them(
    daemon_factory: Any, fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    url, _ = lab(daemon_factory, fake_nvml, tmp_path)
    with chromium(width=1400) as driver:
        ended_queue(driver, url)
        # The CLI's job_words: "a<array>[<index>]", "(interactive)", then the command.
        assert ended_cell(driver, SWEPT, "Job") == "a31[0] (hidden)"
        assert ended_cell(driver, CANCELLED, "Job") == "a31[1] (hidden)"
        assert ended_cell(driver, FIRST, "Job") == "(interactive) (hidden)"
        assert console_errors(driver) == []


def test_an_end_is_said_once(daemon_factory: Any, fake_nvml: FakeNvml, tmp_path: Path) -> None:
    url, _ = lab(daemon_factory, fake_nvml, tmp_path)
    with chromium(width=1400) as driver:
        ended_queue(driver, url)
        assert ended_cell(driver, CANCELLED, "How") == "cancelled by alice"
        assert ended_cell(driver, FIRST, "How") == "failed (oom)"
        assert ended_cell(driver, SWEPT, "How") == "done exit 0"
        driver.get(f"{url}/job?id={CANCELLED}")
        eventually(lambda: find(driver, '#job-facts dd[data-fact="exit"]'), 20)
        assert texts(driver, '#job-facts dd[data-fact="exit"]') == ["cancelled by alice"]
        assert console_errors(driver) == []


def test_a_retry_is_a_link_to_its_job(
    daemon_factory: Any, fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    url, _ = lab(daemon_factory, fake_nvml, tmp_path)
    with chromium(width=1400) as driver:
        ended_queue(driver, url)
        links = driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]),"
            " a => [a.textContent, a.getAttribute('href')])",
            f'#ended tr[data-job="{FIRST}"] td:nth-child(7) a',
        )
        assert links == [[str(RETRY), f"/job?id={RETRY}"]]
        assert ended_cell(driver, FIRST, "Hints") == RETRY_HINT  # the words unchanged
        # The job pages link the first attempt and its retry both ways.
        driver.get(f"{url}/job?id={FIRST}")
        eventually(lambda: find(driver, "#job-hints li"), 20)
        hint_links = [a.get_attribute("href") for a in find(driver, "#job-hints li a")]
        assert hint_links == [f"{url}/job?id={RETRY}"]
        for page, fact, other in ((FIRST, "retried as", RETRY), (RETRY, "retry of", FIRST)):
            driver.get(f"{url}/job?id={page}")
            css = f'#job-facts dd[data-fact="{fact}"] a'
            link = eventually(partial(find, driver, css), 20)[0]
            assert (link.text, link.get_attribute("href")) == (str(other), f"{url}/job?id={other}")
        assert console_errors(driver) == []


# The boxes of a chart's "no samples" and of its declared line and label, on the page.
CHART_BOXES_JS = """
const box = (css) => { const r = document.querySelector(css).getBoundingClientRect();
  return [r.left, r.top, r.right, r.bottom]; };
return [box('#memory-chart .empty'), box('#memory-chart line.declared'),
  box('#memory-chart .declared-label')];
"""


def overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.mark.parametrize("mem", ["1G", "3G"])
def test_no_samples_is_drawn_clear_of_the_declared_line(daemon_factory: Any, mem: str) -> None:
    daemon, url = web_daemon(daemon_factory)
    held = daemon.submit("--mem", mem, "--hold", "--", "true")
    with chromium(width=1200) as driver:
        driver.get(f"{url}/job?id={held}")
        eventually(lambda: texts(driver, ".chart .empty") == ["no samples"] * 2, 20)
        message, line, label = driver.execute_script(CHART_BOXES_JS)
        assert not overlap(message, line), (message, line)
        assert not overlap(message, label), (message, label)
        assert console_errors(driver) == []
