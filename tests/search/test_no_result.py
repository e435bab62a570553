"""A search that ends without a result says why (issue 48, item 3): a custom evaluator whose
score of the float model eats most of ``time_limit`` is warned about, the search ends with
``stop_note`` "no trial finished within the time limit" (``summary.json``, the terminal and
exit status 1), ``raysearch show`` describes it and lists only the outputs that exist, and
the progress line's clock is the one ``time_limit`` counts."""

from __future__ import annotations

import io
import json
import re
import time

import pytest
import yaml

from raysearch.cli import main
from raysearch.config._config import StopConfig
from raysearch.search._execute import _float_share_warning, _stop_note
from raysearch.search.tune.progress import ProgressCallback
from tests.drivers import run_cli_here

#: Scores the float model in about 4 s and every quantized model in 60 s: no trial can finish
#: within a 6 s time limit. The float model's path is written into the module
#: (``.format(float=...)``): an environment variable set in the test's process would not reach
#: the workers of the suite's shared Ray.
SLOW_EVALUATOR = """
import os
import time

FLOAT = {float!r}


def score(model_path, providers):
    time.sleep(4 if os.path.samefile(model_path, FLOAT) else 60)
    return 0.5
"""


class _Config:
    stop = StopConfig(time_limit=180)


def test_the_progress_clock_counts_from_the_search_start_as_time_limit_does():
    out = io.StringIO()
    progress = ProgressCallback(out, metric="L2", started_at=time.monotonic() - 125)
    assert progress.line().endswith(" | 02:05")
    resumed = ProgressCallback(
        out, metric="L2", elapsed_before_s=60, started_at=time.monotonic() - 125
    )
    assert resumed.line().endswith(" | 03:05")


def test_a_float_score_that_takes_a_quarter_of_the_time_limit_is_said():
    assert _float_share_warning(_Config(), 98.0) == (
        "the custom evaluator's score of the float model took 98.0 s, 54% of "
        "stop.time_limit (180 s): every trial scores its model as long, so few trials, or "
        "none, can finish in time; raise stop.time_limit or let the evaluator score fewer rows"
    )
    assert _float_share_warning(_Config(), 44.0) is None
    assert _float_share_warning(_Config(), None) is None


def test_the_stop_note_says_no_trial_finished_within_the_time_limit():
    assert _stop_note("time_limit", [], _Config(), 98.0) == (
        "no trial finished within the time limit (180 s; the custom evaluator's score of "
        "the float model took 98.0 s of it)"
    )
    assert _stop_note("time_limit", [], _Config(), None) == (
        "no trial finished within the time limit (180 s)"
    )
    assert _stop_note("time_limit", [{"trial_id": "a"}], _Config(), 98.0) is None
    assert _stop_note("space_exhausted", [], _Config(), 98.0) is None


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_a_time_limit_spent_before_the_first_trial_is_said(
    make_config, mlp_files, tmp_path, capsys
):
    folder = tmp_path / "config"
    folder.mkdir()
    (folder / "rs_slow_float.py").write_text(SLOW_EVALUATOR.format(float=str(mlp_files["model"])))
    config = make_config(
        search_space={"calibrate_method": ["MinMax"], "per_channel": [True, False]},
        metric="rs_slow_float:score",
        tolerance=0.1,
        early_stopping=False,
        measure_latency=False,
        stop={"time_limit": 6},
    )
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    done = run_cli_here(["run", str(path)], folder, capsys)
    assert done.returncode == 1, done.stderr
    err = done.stderr.splitlines()
    took = r"took \d+\.\d s"
    share = [line for line in err if line.startswith("WARNING raysearch.search: the custom")]
    assert len(share) == 1 and re.fullmatch(
        rf"WARNING raysearch\.search: the custom evaluator's score of the float model {took}, "
        r"\d+% of stop\.time_limit \(6 s\): every trial scores its model as long, so few "
        r"trials, or none, can finish in time; raise stop\.time_limit or let the evaluator "
        r"score fewer rows",
        share[0],
    ), err
    note = (
        rf"no trial finished within the time limit \(6 s; the custom evaluator's score of "
        rf"the float model {took} of it\)"
    )
    assert re.fullmatch(rf"raysearch: error: No result: {note}\.", err[-1]), err
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "time_limit" and summary["n_trials"] == 0
    assert re.fullmatch(note, summary["stop_note"])
    assert summary["float_score_s"] >= 4 and summary["best_metric"] is None
    assert not (out / "best").exists()
    # The progress line's clock reads the search's time, as the stopper does (before, it
    # started after the float model's scoring and Ray's start): its last reading counts the
    # float model's scoring, which a clock started after it would lack (it would read the
    # search's time less that scoring at most), and no more than the search's time.
    clocks = re.findall(r"\| (\d\d):(\d\d)$", done.stderr, re.M)
    assert clocks, err
    shown = int(clocks[-1][0]) * 60 + int(clocks[-1][1])
    wall, scoring = summary["wall_time_s"], summary["float_score_s"]
    assert wall - scoring < shown <= wall + 1, (shown, wall, scoring)

    # `show` says what happened (no "see ... for the errors": there were none), and lists
    # best/ only where it exists.
    assert main(["show", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    no_result = [line for line in lines if line.startswith("No result: ")]
    assert len(no_result) == 1 and re.fullmatch(rf"No result: {note}\.", no_result[0]), lines
    assert not any("for the errors" in line for line in lines)
    outputs = [line for line in lines if line.startswith("Outputs: ")]
    assert outputs == [
        f"Outputs: {out} (summary.json, results.parquet, report.html, plots/, tensorboard/)"
    ]


@pytest.mark.slow
def test_from_python_the_warnings_reach_the_progress_stream(
    ray_cluster, make_config, mlp_files, tmp_path, monkeypatch
):
    """`run()` from a program that set up no logging: the warnings are in auto_search.log,
    and on the progress stream (before, it printed nothing and returned best_metric None)."""
    import logging

    from raysearch.search import AutoSearch

    folder = tmp_path / "config"
    folder.mkdir()
    (folder / "rs_slow_float_py.py").write_text(
        SLOW_EVALUATOR.format(float=str(mlp_files["model"]))
    )
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # a program without logging
    config = make_config(
        search_space={"calibrate_method": ["MinMax"], "per_channel": [True, False]},
        metric="rs_slow_float_py:score",
        tolerance=0.1,
        early_stopping=False,
        measure_latency=False,
        stop={"time_limit": 6},
    )
    from raysearch.config import SearchConfig

    stream = io.StringIO()
    result = AutoSearch(SearchConfig.from_dict(config, base_dir=folder)).run(progress=stream)
    assert result.best_metric is None and result.stop_reason == "time_limit"
    said = [line for line in stream.getvalue().splitlines() if line.startswith("raysearch: ")]
    assert len(said) == 2, stream.getvalue()
    assert said[0].startswith("raysearch: the custom evaluator's score of the float model took ")
    assert re.fullmatch(
        r"raysearch: no trial finished within the time limit \(6 s; the custom evaluator's "
        r"score of the float model took \d+\.\d s of it\)",
        said[1],
    )
    assert result.summary["stop_note"] == said[1][len("raysearch: ") :]
