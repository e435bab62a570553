"""What a finished ``raysearch batch`` wrote, checked the same way by the tests that run one
(``tests/test_batch.py``, ``tests/reliability/test_batch_faults.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.browser import Browser, chromium_required, find_chromium


def summary_rows(out: Path) -> dict[str, dict]:
    """``batch_summary.parquet``'s rows by model name."""
    return {r["name"]: r for r in pq.read_table(out / "batch_summary.parquet").to_pylist()}


def progress(err: str) -> list[str]:
    """The progress lines the batch printed on standard error."""
    return [line for line in err.splitlines() if line.startswith("[batch] models ")]


def last_progress(err: str) -> str:
    return progress(err)[-1]


def check_batch_report(out: Path, names: list[str], linked: list[str]) -> None:
    """batch_report.html: one row per model, in the manifest's order; each link relative and
    to a model's report.html that exists; the models' reports load the one plotly.min.js
    beside it (not inlined: a batch of 20 models stays under 10 MB); in Chromium when
    installed: no console error, no request but file:, the timeline drawn, the table sorts."""
    text = (out / "batch_report.html").read_text()
    body = text.split('<table id="trials"', 1)[1].split("</tbody>", 1)[0]
    rows = re.findall(r"<tr class=\"[^\"]+\"><td>(?:<a href=\"([^\"]+)\">)?([^<]+)<", body)
    assert [name for _, name in rows] == names
    links = {name: href for href, name in rows if href}
    assert sorted(links) == sorted(linked)
    for name, href in links.items():
        assert href == f"{name}/report.html" and (out / href).is_file()
        report = (out / href).read_text()
        assert '<script src="../plotly.min.js"></script>' in report
        assert len(report) < 1_000_000  # plotly.js (4.9 MB) not inlined
    assert (out / "plotly.min.js").stat().st_size > 1_000_000
    assert '<script src="plotly.min.js"></script>' in text and 'data-chart="timeline"' in text
    if find_chromium() is None:
        if chromium_required():
            pytest.fail("CI: Debian's chromium package is missing (.ci/run installs it)")
        return
    batch_page = out / "batch_report.html"
    with Browser() as browser:
        for page in (batch_page, out / links[linked[0]]):
            browser.events.clear()
            browser.open(page)
            remote = [u for u in browser.requests() if not u.startswith(("file://", "data:"))]
            assert remote == [] and browser.errors() == [], (page, remote, browser.errors())
            drawn = browser.evaluate("document.querySelectorAll('.chart svg.main-svg').length")
            assert drawn > 0, page
            if page != batch_page:
                continue
            # The batch's page as loaded (checked above): its count, then its table sorted.
            shown = browser.evaluate("document.getElementById('trials-count').textContent")
            assert shown == f"{len(names)} of {len(names)} models shown"
            browser.evaluate("document.getElementById('trials').tHead.rows[0].cells[0].click()")
            order = browser.evaluate(
                "Array.from(document.getElementById('trials').tBodies[0].rows)"
                ".map(r => r.cells[0].textContent)"
            )
            assert order == sorted(names)
