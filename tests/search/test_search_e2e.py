"""End to end on a real local Ray, real ONNX Runtime and a real small model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from raysearch.config import load_config
from raysearch.errors import ConfigError
from raysearch.evaluate import compute_metric
from raysearch.search import AutoSearch
from raysearch.strategies.samplers import ALGO_REQUIREMENTS, SAMPLER_ALGOS
from tests.conftest import TWO_AT_A_TIME
from tests.search.conftest import CONDITIONAL_SPACE

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

SIX = {"calibrate_method": ["MinMax", "Percentile", "Entropy"], "per_channel": [True, False]}
#: One trial at a time, for the searches that test something other than trials running side
#: by side: one trial actor (a Ray worker process, some 3 CPU-seconds to start) per search.
#: The searches that run two at a time (``TWO_AT_A_TIME``) are the grid of six, the custom
#: evaluator's (counted once, not once per actor), TPE's (the iteration limit caps the trials
#: started while two run), the time limit's (the trials running then are stopped) and the
#: timed-out trials' (an actor whose trial timed out is never reused).
ONE_AT_A_TIME = {"max_concurrent_trials": 1}


def rows(result) -> list[dict]:
    return result.results.to_pylist()


def test_grid_of_six_runs_exactly_six_trials_and_writes_every_output(make_config, mlp_files):
    result = AutoSearch(make_config(search_space=SIX, resources=TWO_AT_A_TIME)).run()
    summary = result.summary
    assert summary["stop_reason"] == "space_exhausted"
    assert summary["n_trials"] == 6 and result.results.num_rows == 6
    table = rows(result)
    assert len({r["trial_id"] for r in table}) == 6
    assert len({(r["params/calibrate_method"], r["params/per_channel"]) for r in table}) == 6
    assert all(r["status"] == "ok" and r["node"] for r in table)
    out = result.output_dir
    for name in (
        "summary.json",
        "results.parquet",
        "best/model.onnx",
        "best/config.yaml",
        "auto_search.log",
        "plots/metric_per_trial.png",
    ):
        assert (out / name).is_file(), name
    # Six complete trials: too few for parameter importances (from 10 on).
    assert not (out / "plots" / "param_importance.png").exists()
    assert list((out / "tensorboard").iterdir())
    assert not (out / "trials_tmp").exists()
    # The best candidates' models are kept (keep_candidates: 3 by default), the best trial's
    # among them; none of the others is.
    kept = {p.stem for p in (out / "candidates").glob("*.onnx")}
    candidates = {r["trial_id"] for r in table if r["is_candidate"]}
    assert kept <= candidates and len(kept) == min(3, len(candidates))
    assert kept == {
        r["trial_id"] for r in table if (r["model_file"] or "").startswith("candidates/")
    }
    assert not candidates or summary["best_trial_id"] in kept
    log = (out / "auto_search.log").read_text()
    assert "trial" in log
    # Latency decides nothing here: no model is timed again after the last trial, and the
    # summary says how the latencies it reports were timed.
    assert summary["latency_retimed"] is None and "timed again alone" not in log
    assert summary["latency_timing"] == "timed during the search, beside other trials"

    # best/model.onnx, evaluated here again, gives the reported best metric.
    data = dict(np.load(mlp_files["data"]))
    reference = ort.InferenceSession(str(mlp_files["model"])).run(None, data)
    quantized = ort.InferenceSession(str(out / "best" / "model.onnx")).run(None, data)
    metric = compute_metric("L2", {"y": quantized[0]}, {"y": reference[0]})
    assert metric == pytest.approx(summary["best_metric"], rel=1e-6, abs=1e-9)
    assert result.best_metric == summary["best_metric"]

    # best/config.yaml reproduces exactly that setting.
    best_config = load_config(out / "best" / "config.yaml")
    assert best_config.search_algo == "Grid"
    (space,) = best_config.search_spaces
    (point,) = space.expand().points
    best_row = next(r for r in table if r["trial_id"] == summary["best_trial_id"])
    assert point == {
        k[len("params/") :]: v
        for k, v in best_row.items()
        if k.startswith("params/") and v is not None
    }


def test_a_search_that_ends_its_process_draws_its_plots_beside_the_report(make_config, monkeypatch):
    """Where the process ends with its search (the ``raysearch`` command), plots/ is drawn by a
    process of its own while the driver writes the report: the driver draws no figure, and
    plots/ is written all the same, that process ended with the search."""
    from raysearch.outputs import _plots
    from raysearch.search.runtime import cluster

    def drawn_by_the_driver(fig, path):
        raise AssertionError(f"{path.name} drawn by the driver")

    monkeypatch.setattr(cluster, "_ends_with_process", True)
    monkeypatch.setattr(_plots, "_save_figure", drawn_by_the_driver)
    space = {"per_channel": [True, False]}
    result = AutoSearch(make_config(search_space=space, resources=ONE_AT_A_TIME)).run()
    out = result.output_dir
    assert result.summary["n_trials"] == 2
    assert (out / "plots" / "metric_per_trial.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "report.html").is_file()
    assert "writing plots/ failed" not in (out / "auto_search.log").read_text()


def test_keep_candidates_1_keeps_the_best_model_and_every_candidates_row(make_config):
    # L2 within 10: every setting is a candidate; only the best one's model stays a file.
    config = make_config(
        search_space=SIX, tolerance=10.0, keep_candidates=1, resources=ONE_AT_A_TIME
    )
    result = AutoSearch(config).run()
    out, table = result.output_dir, rows(result)
    assert len(table) == 6 and all(r["status"] == "ok" and r["is_candidate"] for r in table)
    assert result.summary["n_candidates"] == 6
    best = result.summary["best_trial_id"]
    assert [p.name for p in (out / "candidates").iterdir()] == [f"{best}.onnx"]
    assert not (out / "kept").exists() or not any((out / "kept").iterdir())
    # The table lists every candidate, its setting and metric; only the best has a model file.
    assert {r["trial_id"]: r["model_file"] for r in table} == {
        r["trial_id"]: f"candidates/{best}.onnx" if r["trial_id"] == best else None for r in table
    }
    assert len({(r["params/calibrate_method"], r["params/per_channel"]) for r in table}) == 6
    assert all(r["metric"] is not None for r in table)
    model = out / "candidates" / f"{best}.onnx"
    assert (out / "best" / "model.onnx").read_bytes() == model.read_bytes()
    assert [c["model_path"] for c in result.candidates if c["model_path"]] == [str(model)]
    assert len(result.candidates) == 6


def test_find_n_candidates_ends_the_search_early(make_config):
    config = make_config(
        search_space={**SIX, "activation_type": ["QUInt8", "QInt8"]},
        stop={"find_n_candidates": 2},
        resources={"max_concurrent_trials": 1},
    )
    result = AutoSearch(config).run()
    assert result.summary["stop_reason"] == "candidates_found"
    assert result.summary["n_candidates"] >= 2
    assert result.summary["n_trials"] < 12
    assert len(result.candidates) == result.summary["n_candidates"]
    assert all(Path(c["model_path"]).is_file() for c in result.candidates)


#: The trials of each sampler's search over the conditional space (its iteration limit).
SAMPLER_TRIALS = 4


@pytest.fixture(scope="module")
def sampler_search(mlp_files, tmp_path_factory):
    """``sampler_search(algo)``: the result of a search of ``algo`` over the conditional space,
    stopped by its iteration limit; run once per algorithm for the module (TPE's serves both
    the sampler test and the iteration-limit test)."""
    done: dict[str, object] = {}

    def run(algo: str):
        if algo not in done:
            config = {
                "model": str(mlp_files["model"]),
                "calibration_data": str(mlp_files["data"]),
                "search_space": CONDITIONAL_SPACE,
                "search_algo": algo,
                "metric": "L2",
                "tolerance": 0.05,
                "seed": 0,
                "output_dir": str(tmp_path_factory.mktemp(f"sampler-{algo}") / "out"),
                "stop": {"iteration_limit": SAMPLER_TRIALS},
            }
            config["resources"] = TWO_AT_A_TIME if algo == "TPE" else ONE_AT_A_TIME
            done[algo] = AutoSearch(config).run()
        return done[algo]

    return run


def test_iteration_limit_caps_the_trials_started(sampler_search):
    # Two trials at a time: the limit caps the trials started, not only those finished.
    result = sampler_search("TPE")
    assert result.summary["stop_reason"] == "iteration_limit"
    assert result.summary["n_trials"] == SAMPLER_TRIALS
    assert result.summary["trials_started"] == SAMPLER_TRIALS


def test_time_limit_ends_the_search(make_config):
    config = make_config(
        search_space=CONDITIONAL_SPACE,
        search_algo="Random",
        stop={"time_limit": 3},
        resources=TWO_AT_A_TIME,
    )
    result = AutoSearch(config).run()
    # The space is continuous (CalibPercentile), so only the limit ends it: not before 3 s,
    # with the trials running then stopped (they are not recorded; pytest-timeout guards a
    # search that does not end).
    assert result.summary["stop_reason"] == "time_limit"
    assert result.summary["wall_time_s"] >= 3
    assert result.summary["n_trials"] <= result.summary["trials_started"]
    assert len(result.results) == result.summary["n_trials"]


def test_a_setting_onnx_runtime_rejects_fails_alone(make_config):
    config = make_config(
        search_space=None,
        resources=ONE_AT_A_TIME,
        search_spaces=[
            {"activation_type": ["QUInt8", "QInt8"], "per_channel": [True, False]},
            # float8 QDQ around MatMul: ONNX Runtime's CPU session refuses the model.
            {
                "calibrate_method": ["Distribution"],
                "activation_type": ["QFLOAT8E4M3FN"],
                "weight_type": ["QFLOAT8E4M3FN"],
            },
        ],
    )
    config.pop("search_space")
    result = AutoSearch(config).run()
    table = rows(result)
    assert result.summary["n_trials"] == 5 and result.summary["n_failed"] == 1
    (failed,) = [r for r in table if r["status"] == "failed"]
    assert failed["params/activation_type"] == "QFLOAT8E4M3FN"
    assert failed["metric"] is None and "ONNXRuntimeError" in failed["error"]
    assert all(r["metric"] is not None for r in table if r["status"] == "ok")


def test_a_trial_that_raises_is_recorded_and_the_search_goes_on(make_config):
    # A timeout far below any trial's duration: every trial raises in its actor.
    config = make_config(
        search_space={"per_channel": [True, False]},
        trial_timeout_s=1e-4,
        tolerance=None,
        resources=TWO_AT_A_TIME,
    )
    result = AutoSearch(config).run()
    table = rows(result)
    assert result.summary["stop_reason"] == "space_exhausted"
    assert len(table) == 2 and all(r["status"] == "failed" for r in table)
    assert all("timed out" in r["error"] for r in table)
    assert result.best_metric is None and not (result.output_dir / "best" / "model.onnx").exists()


@pytest.mark.parametrize("algo", SAMPLER_ALGOS)
def test_each_sampler_runs_a_conditional_space(sampler_search, algo):
    import importlib.util

    if not all(importlib.util.find_spec(m) for m in ALGO_REQUIREMENTS.get(algo, ())):
        pytest.skip(f"{algo} needs {ALGO_REQUIREMENTS[algo]}")
    table = rows(sampler_search(algo))
    assert len(table) == SAMPLER_TRIALS and all(r["status"] == "ok" for r in table)
    for r in table:
        pct = r.get("params/extra_options.pct.CalibPercentile")
        sym = r.get("params/extra_options.sym.ActivationSymmetric")
        assert (pct is not None) == (r["params/calibrate_method"] == "Percentile")
        assert (sym is not None) == (r["params/activation_type"] == "QInt8")


def test_an_earlier_search_is_refused_and_overwrite_removes_only_ours(make_config):
    config = make_config(search_space={"per_channel": [True, False]}, resources=ONE_AT_A_TIME)
    first = AutoSearch(config).run()
    user_file = first.output_dir / "notes.txt"
    user_file.write_text("mine")
    with pytest.raises(ConfigError, match="raysearch resume"):
        AutoSearch(config).run()
    second = AutoSearch(config).run(overwrite=True)
    assert user_file.read_text() == "mine"
    assert second.summary["n_trials"] == 2
    assert len((second.output_dir / "journal.jsonl").read_text().splitlines()) == 2
    # Resuming a finished search runs nothing and returns its result.
    again = AutoSearch.resume(second.output_dir)
    assert again.summary == second.summary and again.results.num_rows == 2


def test_a_custom_evaluator_is_scored_against_the_float_model_once(make_config, tmp_path):
    from tests.reliability.helpers import PROBE, calls, plan_model

    # The probe evaluator appends one line per call to a side file (named in the model's
    # metadata), from whichever process calls it: the driver or any trial actor.
    log = tmp_path / "calls.jsonl"
    model = plan_model(tmp_path / "planned.onnx", log)
    config = make_config(
        model=str(model),
        search_space={"per_channel": [True, False]},
        metric=PROBE,
        tolerance=0.5,
        tolerance_mode="absolute",
        higher_is_better=True,
        resources=TWO_AT_A_TIME,
    )
    result = AutoSearch(config).run()
    summary = result.summary
    assert isinstance(summary["float_metric"], float)
    assert summary["direction"] == "maximize" and summary["n_trials"] == 2
    for row in rows(result):
        drop = summary["float_metric"] - row["metric"]
        assert row["is_candidate"] == (drop <= 0.5)
    # Counted: the float model once in the whole search (not once per actor or trial), and
    # each trial's quantized model once.
    made = calls(log)
    assert [c["sig"] for c in made].count("float") == 1
    quantized = sorted(c["trial"] for c in made if c["sig"] != "float")
    assert quantized == sorted(r["trial_id"] for r in rows(result))


def test_what_the_float_models_run_writes_to_stderr_goes_to_the_log(make_config, capfd):
    """A custom evaluator's float-model run on the driver writes ONNX Runtime's warnings to
    file descriptor 2: they reach auto_search.log, not the terminal."""
    config = make_config(
        search_space={"calibrate_method": ["MinMax"]},
        metric="tests.evaluators_fixture:noisy_mean_output",
        higher_is_better=True,
        tolerance=1.0,
        early_stopping=False,
    )
    result = AutoSearch(config).run(progress=False)
    assert result.summary["n_trials"] == 1
    assert "Removing initializer" not in capfd.readouterr().err
    log = (result.output_dir / "auto_search.log").read_text()
    assert "raysearch.stderr: [W:onnxruntime:, graph.cc:5777] Removing initializer" in log
