"""Batch mode: several models searched concurrently on one Ray cluster, two of them broken."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from raysearch.cli import main
from tests.browser import Browser, chromium_required, find_chromium
from tests.conftest import REPO
from tests.models import conv_data, make_conv_model, make_mlp_model, mlp_data

pytestmark = pytest.mark.slow

GOOD = [
    {"name": "mlp", "model": "mlp.onnx", "calibration_data": "mlp.npz", "keep_candidates": 1},
    {"name": "cnn", "model": "cnn.onnx", "calibration_data": "cnn.npz"},
]
BROKEN = [
    # Refused when the manifest is read: its search never starts.
    {"name": "broken", "model": "missing.onnx", "calibration_data": "mlp.npz"},
    # Its search starts and fails: the evaluator raises on the float model.
    {
        "name": "raising",
        "model": "mlp.onnx",
        "calibration_data": "mlp.npz",
        "metric": "tests.reliability.batch_evaluators:raises",
        "higher_is_better": True,
    },
]


def _manifest(tmp_path, models: list[dict], name: str = "batch.yaml"):
    make_mlp_model(tmp_path / "mlp.onnx")
    make_conv_model(tmp_path / "cnn.onnx")
    np.savez(tmp_path / "mlp.npz", **mlp_data(16))
    np.savez(tmp_path / "cnn.npz", **conv_data(8))
    manifest = {
        "output_dir": str(tmp_path / "out"),
        "defaults": {
            "search_algo": "Grid",
            "metric": "cos",
            "tolerance": 0.9,
            "search_space": {"per_channel": [True, False], "activation_type": ["QUInt8"]},
        },
        "models": models,
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(manifest))
    return path


def _rows(out) -> dict[str, dict]:
    return {r["name"]: r for r in pq.read_table(out / "batch_summary.parquet").to_pylist()}


def test_a_batch_with_failed_models_exits_1_after_writing_everything(
    tmp_path, capsys, monkeypatch, request
):
    # The searches are processes of their own: they import the test's evaluator from here.
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", pythonpath)
    path = _manifest(tmp_path, GOOD + BROKEN)
    assert main(["batch", str(path)]) == 1
    out = tmp_path / "out"
    rows = _rows(out)
    assert [rows[n]["status"] for n in ("mlp", "cnn", "broken", "raising")] == [
        "ok",
        "ok",
        "failed",
        "failed",
    ]
    assert "model: file not found" in rows["broken"]["error"]
    assert "the evaluator broke on purpose" in rows["raising"]["error"]
    # Every model's outputs were written: the good ones' searches whole, the failed search's log.
    for name in ("mlp", "cnn"):
        assert rows[name]["n_trials"] == 2 and rows[name]["stop_reason"] == "space_exhausted"
        assert rows[name]["best_metric"] > 0.9
        for output in ("summary.json", "results.parquet", "best/model.onnx"):
            assert (out / name / output).is_file(), (name, output)
    assert "the evaluator broke on purpose" in (out / "logs" / "raising.log").read_text()
    # A model's own keys reach its search: mlp keeps one candidate's model (its best is one).
    assert len(list((out / "mlp" / "candidates").glob("*.onnx"))) == 1
    md = (out / "batch_summary.md").read_text()
    assert "| broken | failed |" in md and "| raising | failed |" in md and "| mlp | ok |" in md
    # The float column: cos of the float model against itself, as the HTML report shows it.
    assert rows["mlp"]["float_metric"] == 1.0 and "| mlp | ok | 1 |" in md
    printed = capsys.readouterr()
    assert "Batch finished: 2 of 4 models searched successfully." in printed.out
    # The progress line's last word agrees with the summary: the refused entry counts.
    trials = sum(r["n_trials"] or 0 for r in rows.values())
    assert _last_progress(printed.err).startswith(
        f"[batch] models 2/4 done, 0 running, 2 failed | trials {trials} done"
    )
    _check_batch_report(out, ["mlp", "cnn", "broken", "raising"], linked=["mlp", "cnn"])

    # A batch of good models only exits 0; running it where the first one ran resumes it:
    # the finished searches are kept, not rerun, and the one not run before is searched.
    # This batch and the commands after it join the suite's Ray (ray_cluster) instead of
    # starting and stopping one each: starting its own was the first batch's to check.
    request.getfixturevalue("ray_cluster")
    before = (out / "mlp" / "summary.json").stat().st_mtime_ns
    again = {"name": "mlp_again", "model": "mlp.onnx", "calibration_data": "mlp.npz"}
    good = _manifest(tmp_path, [*GOOD, again], name="good.yaml")
    assert main(["batch", str(good)]) == 0
    assert (out / "mlp" / "summary.json").stat().st_mtime_ns == before
    rows = _rows(out)
    assert sorted(rows) == ["cnn", "mlp", "mlp_again"]
    assert all(r["status"] == "ok" for r in rows.values()), rows
    assert rows["mlp_again"]["n_trials"] == 2
    assert "| mlp_again | ok |" in (out / "batch_summary.md").read_text()
    # The kept searches count as done, with their trials.
    trials = sum(r["n_trials"] for r in rows.values())
    assert _last_progress(capsys.readouterr().err).startswith(
        f"[batch] models 3/3 done, 0 running, 0 failed | trials {trials} done"
    )
    # The kept searches keep their row and link, and their span from their journals.
    _check_batch_report(out, ["mlp", "cnn", "mlp_again"], linked=["mlp", "cnn", "mlp_again"])

    _check_overwrite_and_best_config(tmp_path, out, capsys)


def _check_overwrite_and_best_config(tmp_path: Path, out: Path, capsys) -> None:
    # --overwrite searches mlp again from nothing: its trials count from zero, never the
    # earlier search's 2 first and fewer after, and end where its summary does.
    one = _manifest(tmp_path, GOOD[:1], name="one.yaml")
    assert main(["batch", str(one), "--overwrite"]) == 0
    lines = _progress(capsys.readouterr().err)
    assert lines[0].startswith("[batch] models 0/1 done, 1 running, 0 failed | trials 0 done")
    counts = [int(re.search(r"\| trials (\d+) done", line)[1]) for line in lines]
    assert counts == sorted(counts) and counts[-1] == _rows(out)["mlp"]["n_trials"] == 2
    assert lines[-1].startswith("[batch] models 1/1 done, 0 running, 0 failed | trials 2 done")

    # A model's best/config.yaml runs again as written, the batch and its Ray gone: it names
    # no Ray address (the batch's searches joined its Ray through their environment). The Ray
    # the rerun started, if it started one, is stopped again; the session's Ray it may have
    # joined stays up for the tests after this one.
    from raysearch.search.runtime.cluster import stop_ray

    best_config = out / "mlp" / "best" / "config.yaml"
    assert "address" not in yaml.safe_load(best_config.read_text())
    rerun = tmp_path / "rerun"
    try:
        assert main(["run", str(best_config), "--output-dir", str(rerun)]) == 0
    finally:
        stop_ray()
    assert json.loads((rerun / "summary.json").read_text())["n_trials"] == 1


def _progress(err: str) -> list[str]:
    """The progress lines the batch printed on standard error."""
    return [line for line in err.splitlines() if line.startswith("[batch] models ")]


def _last_progress(err: str) -> str:
    return _progress(err)[-1]


def _check_batch_report(out: Path, names: list[str], linked: list[str]) -> None:
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


@pytest.mark.usefixtures("ray_cluster")
def test_a_batch_finds_what_each_search_finds_alone(tmp_path):
    """Each model's search in a batch (a process forked for it, joined to the batch's Ray, one
    trial at a time) gives the very results of the same search run alone with AutoSearch (in
    this process, two trials at a time): the same best setting and every setting's metric.
    The batch joins the suite's Ray (``ray_cluster``), as a batch joins a running cluster, and
    the searches alone run on it: four Ray starts fewer than a Ray of their own each. A batch
    that starts its Ray and stops it again is the other test's."""
    from raysearch import AutoSearch
    from tests.reliability.helpers import journal

    make_mlp_model(tmp_path / "mlp.onnx")
    make_conv_model(tmp_path / "cnn8.onnx", channels=8, size=16)
    make_conv_model(tmp_path / "cnn16.onnx", channels=16, size=12, seed=1)
    np.savez(tmp_path / "mlp.npz", **mlp_data(32))
    np.savez(tmp_path / "cnn16.npz", **conv_data(24, size=16))
    np.savez(tmp_path / "cnn12.npz", **conv_data(24, size=12, seed=5))
    defaults = {
        "search_space": "MATMUL_CONV_INT8_SEARCH",
        "search_algo": "Grid",
        "metric": "cos",
        "tolerance": 0.99,
        "early_stopping": False,
        "measure_latency": False,
    }
    models = [
        {"name": "mlp", "model": "mlp.onnx", "calibration_data": "mlp.npz"},
        {"name": "cnn8", "model": "cnn8.onnx", "calibration_data": "cnn16.npz"},
        {"name": "cnn16", "model": "cnn16.onnx", "calibration_data": "cnn12.npz"},
    ]
    out = tmp_path / "out"
    manifest = {"output_dir": str(out), "defaults": defaults, "models": models}
    (tmp_path / "batch.yaml").write_text(yaml.safe_dump(manifest))
    assert main(["batch", str(tmp_path / "batch.yaml")]) == 0

    def metrics(folder: Path) -> dict[str, float]:
        records = journal(folder)
        assert len(records) == 12 and all(r["status"] == "ok" for r in records), folder
        return {json.dumps(r["params"], sort_keys=True): r["metric"] for r in records}

    for entry in models:
        alone = {**defaults, **{k: v for k, v in entry.items() if k != "name"}}
        for key in ("model", "calibration_data"):
            alone[key] = str(tmp_path / alone[key])
        alone["output_dir"] = str(tmp_path / "alone" / entry["name"])
        result = AutoSearch(alone).run(progress=False)
        batch = json.loads((out / entry["name"] / "summary.json").read_text())
        # Every setting scored the same to the last bit, not only the best.
        scores = metrics(Path(alone["output_dir"]))
        assert metrics(out / entry["name"]) == scores, entry["name"]
        assert batch["best_metric"] == result.best_metric, entry["name"]
        # The same best setting, or one that ties with it exactly.
        best = json.dumps(batch["best_params"], sort_keys=True)
        assert scores[best] == result.best_metric, (entry["name"], best, result.best_params)
