"""What the dashboard's pages draw, in a real browser: a chart's "no samples" clear of
its declared line.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser import chromium, console_errors, require_chromium
from tests.daemon_harness import eventually
from tests.test_web_browser import texts, web_daemon


@pytest.fixture(autouse=True)
def _browser_present() -> None:
    require_chromium()


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
