"""``report.html`` of real searches, opened in headless Chromium (Debian's ``chromium``, which
``.ci/run`` installs; nothing is downloaded): a search with failed trials, and a search
interrupted and resumed against the same search run straight through. The page loads with no
console error and no network request, every chart and the trials table render, sorting the
table works, a screenshot is not blank, and the resumed search's report is the straight one's
apart from times. Skipped without Chromium, except in CI (``CI`` set), where that fails."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raysearch.search import AutoSearch
from tests.browser import Browser, chromium_required, find_chromium
from tests.models import make_mlp_model, mlp_data
from tests.reliability.helpers import journal, probe_config
from tests.test_report_layout import OVERFLOW

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

MAX_BYTES = 6 * 1024 * 1024
#: Twelve settings that quantize fine and two whose evaluation raises (a Grid runs them in
#: turn with the first space's calibrations).
FAULT_SPACES = [
    {
        "calibrate_method": ["MinMax", "Percentile", "Entropy"],
        "per_channel": [True, False],
        "reduce_range": [False, True],
    },
    {"nodes_to_exclude": [["fc1"]], "activation_type": ["QUInt8", "QInt8"]},
]
FAULTS = {"fc1/uint8": "raise", "fc1/int8": "raise"}
#: Evaluation on growing subsets (rungs of 40, 132 and 400 rows), one trial at a time so that
#: ASHA decides the same in both runs.
ROWS = 400
#: Columns of the trials table that hold a time or a trial id (they differ between runs).
TIMES = ("trial", "duration (s)")


@pytest.fixture(scope="module")
def browser():
    if find_chromium() is None:
        if chromium_required():
            pytest.fail("CI: Debian's chromium package is missing (.ci/run installs it)")
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    with Browser() as opened:
        yield opened


def _page(browser: Browser, path: Path) -> dict[str, Any]:
    """Open ``path``; what the page did and shows."""
    assert path.stat().st_size <= MAX_BYTES, path.stat().st_size
    browser.events.clear()
    browser.open(path)
    fits = browser.evaluate(OVERFLOW)  # nothing wider than the 1,400 px window
    assert fits["over"] == [] and fits["scroll"] <= fits["width"], fits
    charts = browser.evaluate(
        """Array.from(document.querySelectorAll('.chart')).map(function (c) {
             const gd = c.querySelector('.js-plotly-plot');
             return {key: c.dataset.chart,
                     caption: c.querySelector('.caption').textContent,
                     traces: gd && gd.data ? gd.data.length : 0,
                     points: gd && gd.data ? gd.data.reduce(function (n, t) {
                       return n + ((t.x || t.dimensions || t.y || []).length); }, 0) : 0,
                     drawn: gd ? gd.querySelectorAll('svg.main-svg').length : 0,
                     data: gd && gd.data ? JSON.stringify(gd.data) : null};
           })"""
    )
    table = browser.evaluate(
        """(function () {
             const t = document.getElementById('trials');
             return {head: Array.from(t.tHead.rows[0].cells).map(c => c.textContent),
                     rows: Array.from(t.tBodies[0].rows).map(
                       r => Array.from(r.cells).map(c => c.textContent))};
           })()"""
    )
    words = browser.evaluate(
        "Array.from(document.querySelectorAll('h2#summary ~ p')).map(p => p.textContent)"
    )
    best = browser.evaluate("document.getElementById('best-vs-default').textContent")
    return {"charts": charts, "table": table, "words": words, "best": best}


def _offline_and_clean(browser: Browser) -> None:
    remote = [u for u in browser.requests() if not u.startswith(("file://", "data:"))]
    assert remote == [], remote
    assert browser.errors() == []


def _column(browser: Browser, index: int) -> list[float | None]:
    values = browser.evaluate(
        f"Array.from(document.getElementById('trials').tBodies[0].rows).map("
        f"r => r.cells[{index}].getAttribute('data-v'))"
    )
    return [float(v) if v else None for v in values]


def _sorts(browser: Browser, head: list[str], name: str) -> None:
    """A click on ``name``'s header sorts by it, ascending (empty cells last); another click,
    descending."""
    index = head.index(name)
    click = f"document.getElementById('trials').tHead.rows[0].cells[{index}].click()"
    browser.evaluate(click)
    up = _column(browser, index)
    present = [v for v in up if v is not None]
    assert present == sorted(present) and len(set(present)) > 1, up
    assert up[: len(present)] == present  # the empty ones last
    browser.evaluate(click)
    down = [v for v in _column(browser, index) if v is not None]
    assert down == sorted(present, reverse=True)


def _not_blank(browser: Browser, path: Path) -> None:
    from PIL import Image, ImageStat

    image = Image.open(io.BytesIO(browser.screenshot(path))).convert("RGB")
    assert image.size == (browser.width, browser.height)
    spread = ImageStat.Stat(image.convert("L")).stddev[0]
    colours = len(image.getcolors(maxcolors=1 << 20) or [])
    assert spread > 20 and colours > 50, (spread, colours)


def _check_rendered(page: dict[str, Any], expected: list[str], n_trials: int) -> None:
    assert [c["key"] for c in page["charts"]] == expected
    for chart in page["charts"]:
        assert chart["traces"] > 0 and chart["points"] > 0 and chart["drawn"] > 0, chart
    assert len(page["table"]["rows"]) == n_trials


# -- a search with failed trials ---------------------------------------------------------------
@pytest.fixture(scope="module")
def failing(ray_cluster, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("report_failures")
    config = probe_config(folder, search_space=None, search_spaces=FAULT_SPACES, faults=FAULTS)
    config.pop("search_space")
    return AutoSearch(config).run().output_dir


def test_the_report_of_a_search_with_failures_renders_offline(browser, failing, tmp_path):
    summary = json.loads((failing / "summary.json").read_text())
    assert summary["n_trials"] == 14 and summary["n_failed"] == len(FAULTS)
    page = _page(browser, failing / "report.html")
    _offline_and_clean(browser)
    # One objective (the metric): no Pareto front.
    charts = ["history", "importances", "parallel", "slice", "timeline"]
    _check_rendered(page, charts, summary["n_trials"])
    complete = summary["n_trials"] - len(FAULTS)
    assert f"over the {complete} complete trials" in page["charts"][1]["caption"]
    _sorts(browser, page["table"]["head"], "metric")
    shown = browser.evaluate(
        """(function () {
             const box = document.getElementById('trials-filter');
             box.value = 'failed';
             box.dispatchEvent(new Event('input'));
             return Array.from(document.getElementById('trials').tBodies[0].rows)
               .filter(r => !r.hidden).length;
           })()"""
    )
    assert shown == len(FAULTS)  # the filter keeps the rows that hold the words typed
    failures = browser.evaluate("document.getElementById('failures').tBodies[0].rows.length")
    assert failures == len(FAULTS)  # one group per error
    _not_blank(browser, tmp_path / "failures.png")
    assert browser.errors() == []


# -- a search interrupted and resumed, against the same search run straight ----------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("report_rungs")
    np.savez(folder / "calib.npz", **mlp_data(64))
    np.savez(folder / "eval.npz", **mlp_data(ROWS, seed=5))
    return {"model": make_mlp_model(folder / "mlp.onnx"), "folder": folder}


def _rung_config(files: dict[str, Path], out: Path) -> dict[str, Any]:
    return {
        "model": str(files["model"]),
        "calibration_data": str(files["folder"] / "calib.npz"),
        "eval_data": str(files["folder"] / "eval.npz"),
        "search_space": {
            "calibrate_method": ["MinMax", "Percentile"],
            "per_channel": [True, False],
            "reduce_range": [False, True],
        },
        "search_algo": "Grid",
        "metric": "L2",
        "tolerance": 0.0165,
        "seed": 0,
        "measure_latency": False,
        "resources": {"max_concurrent_trials": 1},
        "output_dir": str(out),
    }


def _interrupt_after(out: Path, records: int) -> threading.Thread:
    """SIGUSR1 to this process (Ray Tune's graceful stop, as Ctrl-C) once ``records`` trials
    are journaled."""

    def watch() -> None:
        deadline = time.monotonic() + 120
        while len(journal(out)) < records and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGUSR1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def straight_and_resumed(files, tmp_path_factory) -> tuple[Path, Path]:
    straight = tmp_path_factory.mktemp("straight") / "out"
    AutoSearch(_rung_config(files, straight)).run()
    resumed = tmp_path_factory.mktemp("resumed") / "out"
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        watcher = _interrupt_after(resumed, 3)
        first = AutoSearch(_rung_config(files, resumed)).run()
        watcher.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert first.summary["stop_reason"] == "interrupted"
    AutoSearch.resume(resumed)
    return straight, resumed


def _without_times(page: dict[str, Any], out: Path) -> dict[str, Any]:
    """The page with what differs between runs set aside: the times (the timeline, the
    durations, the wall time and sessions), and the trial ids (Ray Tune's, per run) as each
    trial's number."""
    ids = {r["trial_id"]: f"#{r['number']}" for r in journal(out)}
    pattern = re.compile("|".join(map(re.escape, ids)))

    def plain(text: str) -> str:
        return pattern.sub(lambda m: ids[m.group(0)], text)

    head = page["table"]["head"]
    keep = [i for i, name in enumerate(head) if name not in TIMES]
    words = [re.sub(r" in [\d.]+ s( over \d+ sessions)?\.$", ".", plain(w)) for w in page["words"]]
    return {
        "charts": [(c["key"], plain(c["data"])) for c in page["charts"] if c["key"] != "timeline"],
        "table": sorted([row[i] for i in keep] for row in page["table"]["rows"]),
        "words": words,
        "best": plain(page["best"]),
    }


def test_a_resumed_search_reports_what_the_search_run_straight_reports(
    browser, straight_and_resumed, tmp_path
):
    straight, resumed = straight_and_resumed
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["sessions"] == 2 and summary["early_stopping"]["n_stopped"] > 0
    pages = {}
    for name, out in (("straight", straight), ("resumed", resumed)):
        pages[name] = _page(browser, out / "report.html")
        _offline_and_clean(browser)
        charts = ["history", "parallel", "slice", "timeline", "intermediate"]
        _check_rendered(pages[name], charts, summary["n_trials"])
    _sorts(browser, pages["resumed"]["table"]["head"], "rows evaluated (share)")
    _not_blank(browser, tmp_path / "resumed.png")
    assert _without_times(pages["resumed"], resumed) == _without_times(pages["straight"], straight)
