"""report.html from records (no Ray): what it holds, what it leaves out below the minimum of
trials, that a failing report never fails the outputs, and ``raysearch report DIR``. The
report of real searches, opened in a browser, is tests/test_report_browser.py."""

from __future__ import annotations

import json
import logging
import re

import pytest
import yaml

from raysearch.cli import main
from raysearch.outputs import build_report, write_outputs, write_report
from raysearch.outputs._study import MIN_IMPORTANCE_TRIALS
from tests.test_outputs import config, record  # noqa: F401  (config is a fixture)

SUMMARY = {
    "stop_reason": "iteration_limit",
    "n_trials": 3,
    "n_failed": 1,
    "n_candidates": 1,
    "best_trial_id": "t2",
    "best_metric": 0.01,
    "metric": "L2",
    "higher_is_better": False,
    "tolerance": 0.05,
    "search_algo": "Grid",
    "wall_time_s": 2.5,
    "best_model_size_bytes": 1002,
    "float_model_size_bytes": 4000,
}


def _records(n_ok: int = 2) -> list[dict]:
    records = [
        record(
            i, 0.01 * (n_ok + 1 - i), candidate=i == 2, calibrate_method=m, per_channel=i % 2 == 0
        )
        for i, m in zip(range(1, n_ok + 1), ["MinMax", "Percentile"] * n_ok)
    ]
    records[0]["stage"] = "defaults"
    failed = record(n_ok + 1, None, status="failed", calibrate_method="Entropy")
    failed["error"] = "the trial's process (pid 4242) died: Segmentation fault"
    return records + [failed]


def _charts(text: str) -> list[str]:
    return re.findall(r'data-chart="([^"]+)"', text)


def test_the_report_holds_the_summary_the_charts_every_trial_and_the_failures():
    text = build_report(_records(), SUMMARY)
    # plotly.js inlined once, nothing to fetch.
    assert text.count("<script") == 2 + len(_charts(text))
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", text)
    assert _charts(text) == ["history", "parallel", "slice", "timeline", "pareto"]
    assert "It beats the default setting (trial t1, L2 = 0.02) by 0.01 in L2." in text
    assert "size 1002 against 4000 bytes (25.1% of the float model&#x27;s)" in text
    assert "It stopped because it started the trials stop.iteration_limit allows." in text
    body = text.split('<table id="trials">', 1)[1].split("</table>", 1)[0]
    assert body.count("<tr") == 1 + 3  # the header and one row per trial
    assert "Segmentation fault" in text.split('id="failures"', 1)[1]


def test_importances_only_from_the_minimum_of_complete_trials_with_their_count():
    below = build_report(_records(MIN_IMPORTANCE_TRIALS - 1), SUMMARY)
    assert "importances" not in _charts(below)
    at = build_report(_records(MIN_IMPORTANCE_TRIALS), SUMMARY)
    assert _charts(at)[1] == "importances"
    assert f"over the {MIN_IMPORTANCE_TRIALS} complete trials" in at


def test_no_candidate_says_by_how_much_the_best_missed(config, tmp_path):  # noqa: F811
    records = [record(1, 0.08, calibrate_method="MinMax"), record(2, 0.09)]
    summary = write_outputs(
        tmp_path / "out", records, config=config, stop_reason="space_exhausted", wall_time_s=1
    )
    assert summary["best_missed_by"] == pytest.approx(0.03)
    text = (tmp_path / "out" / "report.html").read_text()
    assert "No setting met the tolerance: the best missed it by 0.03." in text


def test_a_report_that_fails_is_logged_and_the_outputs_are_written(
    config,  # noqa: F811
    tmp_path,
    monkeypatch,
    caplog,
):
    import raysearch.outputs._report as report

    def broken(*args, **kwargs):
        raise RuntimeError("no figures today")

    monkeypatch.setattr(report, "study_figures", broken)
    with caplog.at_level(logging.WARNING, logger="raysearch.outputs"):
        write_outputs(
            tmp_path / "out", _records(), config=config, stop_reason="interrupted", wall_time_s=1
        )
    assert (tmp_path / "out" / "summary.json").is_file()
    assert not (tmp_path / "out" / "report.html").exists()
    assert "writing report.html failed: RuntimeError: no figures today" in caplog.text
    assert write_report(tmp_path / "out", _records(), SUMMARY) is None


def test_raysearch_report_of_a_folder_that_is_no_search_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no raysearch search here" in err[0]


def test_raysearch_report_of_a_running_search_reports_its_records(
    config,  # noqa: F811
    tmp_path,
    capsys,
):
    out = tmp_path / "out"
    out.mkdir()
    (out / "raysearch_config.yaml").write_text(yaml.safe_dump(config.raw))
    (out / ".raysearch.json").write_text(json.dumps({"status": "running"}))
    (out / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records()))
    assert main(["report", str(out)]) == 0
    assert "(3 trials, running)" in capsys.readouterr().out
    text = (out / "report.html").read_text()
    assert "this report holds the trials finished so far" in text


def test_the_sensitivity_rankings_are_charted_when_the_search_computed_them():
    rows = [
        {
            "rank": i + 1,
            "base": "k" * 20,
            "rank_by": "sqnr",
            "tensor": f"t{i}",
            "node": f"n{i}",
            "op_type": "MatMul",
            "group": "g",
            "sqnr_db": 10.0 + i,
        }
        for i in range(3)
    ]
    text = build_report(_records(), SUMMARY, sensitivity=rows)
    assert _charts(text)[-1] == "sensitivity-0"
    assert "The 3 most sensitive tensors of this ranking (lower: more sensitive)." in text
