"""``report.html`` fits a 1,400 px window (issue 48 item 7): opened in headless Chromium
(Debian's ``chromium``; skipped without it, except in CI, where that fails), no element of the
page is wider than the window or reaches past its right edge, the slice plot and the trials
table included. The page is the report of the demo's own grid (``configs/quickstart.yaml``,
its 24 settings, the every-op ones stopped at the first rung), from records written here: no
search runs. The reports of real searches get the same check in
tests/test_report_browser.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from raysearch.config import load_config
from raysearch.outputs import build_report
from raysearch.quantize.registry import backend_reject
from raysearch.space import expand_spaces
from raysearch.trialrecord import TrialRecord
from tests.browser import Browser, chromium_required, find_chromium

QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"
WIDTH = 1400

#: Every element of the page wider than the window or past its right edge (plotly's
#: text-measuring svg, placed wholly left of the page, shows nothing and is left out).
OVERFLOW = """(function () {
  const width = document.documentElement.clientWidth;
  const out = [];
  for (const el of document.querySelectorAll('body *')) {
    const box = el.getBoundingClientRect();
    if (box.width === 0 || box.right <= 0) continue;
    if (box.width > width || box.right > width + 0.5) {
      out.push([el.tagName, el.id, String(el.className.baseVal ?? el.className),
                Math.round(box.left), Math.round(box.right)]);
    }
  }
  return {width: width, scroll: document.documentElement.scrollWidth, over: out.slice(0, 20)};
})()"""


@pytest.fixture(scope="module")
def browser():
    if find_chromium() is None:
        if chromium_required():
            pytest.fail("CI: Debian's chromium package is missing (.ci/run installs it)")
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    with Browser(width=WIDTH) as opened:
        yield opened


def no_overflow(browser: Browser, path: Path) -> None:
    """Open ``path``; assert nothing on the page is wider than the window."""
    browser.open(path)
    seen = browser.evaluate(OVERFLOW)
    assert seen["over"] == [] and seen["scroll"] <= seen["width"], seen


def _demo_records() -> tuple[list[TrialRecord], dict, object]:
    config = load_config(QUICKSTART, check_paths=False)
    grid = expand_spaces(config.search_spaces, backend_reject)
    records = []
    for number, point in enumerate(grid.points, 1):
        every_op = point["op_types_to_quantize"] is None
        metric = -0.99 - number / 10000 if every_op else 0.9995 + number / 100000
        records.append(
            TrialRecord(
                trial_id=f"{number:08x}",
                number=number,
                status="ok",
                metric=metric,
                is_candidate=not every_op,
                params=dict(point),
                settings=config.search_spaces[0].to_settings(point),
                model_size_bytes=894398 if every_op else 839889,
                latency_ms=None if every_op else 160.0 + number,
                device="cpu",
                node="192.0.2.2",
                duration_s=30.0 + number,
                eval_rows=None,
                eval_fraction=0.1 if every_op else 1.0,
                stopped_at_rung=0 if every_op else None,
                extra={"quantized_share": 1.0},
                started_at=1795786368.0 + 10 * number,
                ended_at=1795786398.0 + 10 * number,
            )
        )
    best = max((r for r in records if r.is_candidate), key=lambda r: r.metric)
    summary = {
        "stop_reason": "space_exhausted",
        "n_trials": len(records),
        "n_failed": 0,
        "n_candidates": sum(r.is_candidate for r in records),
        "best_trial_id": best.trial_id,
        "best_metric": best.metric,
        "metric": config.metric,
        "higher_is_better": True,
        "tolerance": config.tolerance,
        "float_metric": 1.0,
        "search_algo": "Grid",
        "objectives": ["metric"],
        "wall_time_s": 90.0,
    }
    return records, summary, config


def test_the_demos_report_fits_a_1400_px_window(browser, tmp_path):
    records, summary, config = _demo_records()
    assert len(records) == 24
    path = tmp_path / "report.html"
    path.write_text(build_report(records, summary, config=config))
    no_overflow(browser, path)
    charts = browser.evaluate(
        "Array.from(document.querySelectorAll('.chart')).map(c => c.dataset.chart)"
    )
    assert "slice" in charts and "pareto" not in charts
