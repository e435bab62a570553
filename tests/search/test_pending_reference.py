"""A fresh search starts its first trials while the driver still runs the float model over
the evaluation data (``raysearch/search/_pending_reference.py``): the model is checked on the
first batch before anything starts, the trials take the whole reference when they evaluate
(``raysearch/search/runtime/_reference_handoff.py``), and what they score is what a reference
computed up front gives. A float model that fails on a later batch is still the search's
one-line error, with exit status 2."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pyarrow.parquet as pq
import pytest
import yaml
from onnx import TensorProto, helper

from raysearch.config import SearchConfig
from raysearch.data import DataSource
from raysearch.errors import EvaluatorError
from raysearch.evaluate import Evaluator, FloatReference
from raysearch.search._pending_reference import NICENESS, _lower_priority
from raysearch.search.preflight import preflight
from raysearch.search.runtime._reference_handoff import WaitedReference, hand_over
from raysearch.trial import FloatBaseline, TrialRunner, TrialSpec
from tests.models import make_mlp_model, mlp_data
from tests.reliability.helpers import run_raysearch

SPACE = {"activation_type": ["QUInt8", "QInt8"], "per_channel": [True, False]}


def _config(folder: Path, model: Path, eval_rows: int, **extra: Any) -> dict[str, Any]:
    np.savez(folder / "calib.npz", **mlp_data(32, seed=1))
    np.savez(folder / "eval.npz", **mlp_data(eval_rows, seed=2))
    return {
        "model": str(model),
        "calibration_data": str(folder / "calib.npz"),
        "eval_data": str(folder / "eval.npz"),
        "batch_size": 16,
        "search_space": SPACE,
        "search_algo": "Grid",
        "metric": "L2",
        "measure_latency": False,
        "early_stopping": False,
        "output_dir": str(folder / "out"),
        **extra,
    }


def test_preflight_checks_the_first_batch_and_computes_the_rest_in_a_thread(tmp_path: Path):
    model = make_mlp_model(tmp_path / "mlp.onnx")
    config = SearchConfig.from_dict(_config(tmp_path, model, 64))
    prepared = preflight(config, defer_reference=True)
    assert prepared.reference is None and prepared.pending_reference is not None
    assert {v.shape[0] for v in prepared.probe.outputs.values()} == {16}  # the first batch
    later = prepared.pending_reference.future.result(timeout=60)
    whole = FloatReference.compute(model, prepared.evaluation)
    assert later.key == whole.key
    for name, value in whole.outputs.items():
        np.testing.assert_array_equal(later.outputs[name], value)
    # Without the flag, one batch of data, or data with NaN: the reference is there at once.
    assert preflight(config).reference is not None
    single = SearchConfig.from_dict(_config(tmp_path, model, 16))
    assert preflight(single, defer_reference=True).pending_reference is None
    data = mlp_data(64, seed=2)
    data["x"][40, 3] = np.nan
    np.savez(tmp_path / "eval.npz", **data)
    with pytest.raises(Exception, match="NaN or inf"):
        preflight(config, defer_reference=True)


def _runner(
    model: Path,
    calibration: DataSource,
    evaluation: DataSource,
    evaluator: Evaluator,
    baseline: FloatBaseline,
) -> TrialRunner:
    """A trial engine of its own (no Ray), with a calibration cache in memory of its own."""
    spec = TrialSpec(
        model, calibration, evaluation, evaluator, baseline=baseline, measure_latency=False
    )
    return TrialRunner(spec)


def test_a_trial_takes_a_pending_reference_once_and_scores_as_with_one_given(tmp_path: Path):
    model = make_mlp_model(tmp_path / "mlp.onnx")
    calibration = DataSource.load(mlp_data(32, seed=1), model, 16)
    evaluation = DataSource.load(mlp_data(64, seed=2), model, 16)
    reference = FloatReference.compute(model, evaluation)
    calls: list[int] = []

    def source() -> FloatReference:
        calls.append(1)
        return reference

    pending = _runner(
        model, calibration, evaluation, Evaluator("L2"), FloatBaseline(reference_source=source)
    )
    given = _runner(model, calibration, evaluation, Evaluator("L2"), FloatBaseline(reference))
    for settings in ({"per_channel": True}, {"per_channel": False}):
        a = pending.run(settings, tmp_path / "a.onnx")
        b = given.run(settings, tmp_path / "b.onnx")
        assert a.ok and b.ok and a.metric == b.metric
    assert calls == [1]


def test_the_handoff_gives_a_waiting_trial_the_saved_reference_or_the_runs_error(
    tmp_path: Path,
):
    model = make_mlp_model(tmp_path / "mlp.onnx")
    reference = FloatReference.compute(model, DataSource.load(mlp_data(32, seed=2), model, 16))
    folder = tmp_path / "cache" / "reference"  # made by the first hand-over
    waited = WaitedReference(str(folder))
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(waited()))
    waiter.start()  # a trial that evaluates before the driver's run ends waits for it
    time.sleep(0.2)
    assert waiter.is_alive() and not got
    future: Future[FloatReference] = Future()
    future.set_result(reference)
    hand_over(folder, future)
    waiter.join(timeout=10)
    (loaded,) = got
    assert loaded.key == reference.key and (folder / reference.key / "meta.json").is_file()
    for name, value in reference.outputs.items():
        np.testing.assert_array_equal(loaded.outputs[name], value)
    # A run that failed: every trial raises its one-line error.
    failed: Future[FloatReference] = Future()
    failed.set_exception(ValueError("the float model's output 'y' holds NaN or inf"))
    hand_over(folder, failed)
    with pytest.raises(EvaluatorError, match="holds NaN or inf"):
        waited()


def test_the_rest_of_the_reference_runs_at_a_lower_cpu_priority(tmp_path: Path):
    niceness: list[int] = []

    def run() -> None:
        _lower_priority()
        niceness.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert niceness == [min(19, os.getpriority(os.PRIO_PROCESS, 0) + NICENESS)]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < niceness[0]


def _reciprocal_model(path: Path) -> Path:
    """``y = 1 / MatMul(x, I)``: finite on rows without a zero, inf on a row of zeros."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [16, 16], np.eye(16).ravel().tolist())
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
            helper.make_node("Reciprocal", ["h"], ["y"], name="inv"),
        ],
        "reciprocal",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])],
        initializer=[weight],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx.save(proto, path)
    return path


@pytest.mark.slow
def test_a_cold_search_starts_before_the_reference_and_scores_as_one_computed_first(
    tmp_path: Path,
):
    model = make_mlp_model(tmp_path / "mlp.onnx")
    config = _config(tmp_path, model, 160)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    done = run_raysearch(["run", str(tmp_path / "config.yaml")], tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "out"
    log = (out / "auto_search.log").read_text()
    assert "float model checked on the first evaluation batch" in log
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_trials"] == 4 and summary["float_latency_ms"] > 0
    assert list((out / "cache" / "reference").glob("*/meta.json"))  # for a resume
    # Each trial scored as a trial given the reference up front scores.
    prepared = preflight(SearchConfig.from_dict(config))
    runner = _runner(
        model,
        prepared.calibration,
        prepared.evaluation,
        prepared.evaluator,
        FloatBaseline(reference=prepared.reference),
    )
    for row in pq.read_table(out / "results.parquet").to_pylist():
        settings = {k.removeprefix("params/"): v for k, v in row.items() if k.startswith("params/")}
        direct = runner.run(settings, tmp_path / "direct.onnx")
        assert row["status"] == "ok" and math.isclose(row["metric"], direct.metric, rel_tol=1e-9)


@pytest.mark.slow
def test_a_float_model_failing_on_a_later_batch_is_the_searchs_one_line_error(tmp_path: Path):
    model = _reciprocal_model(tmp_path / "inv.onnx")
    space = {"per_channel": [True, False], "activation_type": ["QUInt8", "QInt8"]}
    space["extra_options"] = {"ActivationSymmetric": [False, True]}
    config = _config(tmp_path, model, 64, search_space=space)
    data = mlp_data(64, seed=2)
    data["x"][50] = 0.0  # the fourth batch: 1/0 in the float model's outputs
    np.savez(tmp_path / "eval.npz", **data)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    done = run_raysearch(["run", str(tmp_path / "config.yaml")], tmp_path, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    error = "the float model's output 'y' holds NaN or inf on the evaluation data"
    # The command's one error line ends it (the trials it failed are logged above it) ...
    assert done.stderr.strip().splitlines()[-1] == f"raysearch: error: {error}"
    # ... and the search ended when the float model failed, not after all 8 settings.
    journal = tmp_path / "out" / "journal.jsonl"
    assert not journal.exists() or len(journal.read_text().splitlines()) < 8
