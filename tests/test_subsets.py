"""Evaluation on growing subsets without Ray: the rungs a search plans, whether a partly
evaluated setting could still be a candidate, and a real trial evaluated rung by rung."""

from __future__ import annotations

import numpy as np
import pytest

from raysearch.data import DataSource
from raysearch.evaluate import Evaluator, FloatReference
from raysearch.evaluate.subsets import could_reach, plan_rungs
from raysearch.trial import FloatBaseline, TrialRunner, TrialSpec
from tests.models import make_mlp_model, mlp_data

FRACTIONS = (0.1, 0.33, 1.0)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    folder = tmp_path_factory.mktemp("subsets")
    path = make_mlp_model(folder / "mlp.onnx")
    calib = DataSource.load(mlp_data(64, seed=1), path, batch_size=16)
    evaluation = DataSource.load(mlp_data(400, seed=2), path, batch_size=16)
    return path, calib, evaluation, FloatReference.compute(path, evaluation)


def _plan(evaluator, evaluation, reference, min_rows=32, seed=0):
    return plan_rungs(
        FRACTIONS,
        evaluator=evaluator,
        evaluation=evaluation,
        reference=reference,
        seed=seed,
        min_rows=min_rows,
        reduction_factor=3.0,
    )


def test_a_search_splits_its_rows_in_a_seeded_order_or_says_why_not(mlp, tmp_path):
    path, _, evaluation, reference = mlp
    rungs, why = _plan(Evaluator("cos", 0.99), evaluation, reference)
    assert why is None and rungs.sizes == (40, 132, 400)
    assert sorted(rungs.order.tolist()) == list(range(400))  # every row, once
    assert [len(rungs.rows(k)) for k in range(3)] == [40, 92, 268]
    again, _ = _plan(Evaluator("cos", 0.99), evaluation, reference)
    other, _ = _plan(Evaluator("cos", 0.99), evaluation, reference, seed=1)
    assert (again.order == rungs.order).all() and not (other.order == rungs.order).all()
    # Too few rows in the first rung: off, and the reason names the key.
    off, why = _plan(Evaluator("cos", 0.99), evaluation, reference, min_rows=41)
    assert off is None and "early_stopping.min_rows (41)" in why and "40 of 400" in why
    # A static batch of 6: every rung is whole batches.
    static = _static_batch_model(tmp_path / "static.onnx", batch=6)
    data = DataSource.load({"x": np.ones((402, 4), np.float32)}, static)
    rungs, _ = _plan(Evaluator("L2", None), data, FloatReference.compute(static, data))
    assert rungs.sizes == (42, 132, 402)


def _static_batch_model(path, batch: int):
    """``y = x * 2`` with a static batch: input ``x`` float32 ``[batch, 4]``."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"], name="double")],
        "static_batch",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_custom_evaluator_is_split_only_when_it_takes_a_fraction(mlp):
    _, _, evaluation, _ = mlp
    whole, why = _plan(Evaluator(lambda path, providers: 1.0, 0.1), evaluation, None)
    assert whole is None and "fraction" in why
    split, _ = _plan(Evaluator(lambda path, providers, fraction=1.0: 1.0, 0.1), evaluation, None)
    assert split.sizes is None and split.fractions == FRACTIONS and split.fraction(1) == 0.33


def test_could_reach_bounds_the_rows_not_seen():
    meets = lambda m: m <= 0.05  # noqa: E731 - L2 within 0.05
    rng = np.random.default_rng(0)
    # Far: even every row not seen at 0 could not bring the mean within the tolerance.
    assert not could_reach(np.full(40, 0.6), 400, best=0.0, higher_is_better=False, meets=meets)
    # Possible at best, but 0.08 +- 0.002 is 15 standard errors from 0.05.
    near = rng.normal(0.08, 0.01, 40)
    assert not could_reach(near, 400, best=0.0, higher_is_better=False, meets=meets)
    # Within noise of the tolerance: it could.
    noisy = rng.normal(0.055, 0.02, 40)
    assert could_reach(noisy, 400, best=0.0, higher_is_better=False, meets=meets)


def _steps(trial):
    results = []
    while not trial.done:
        results.append(dict(trial.step().to_dict()))
    return results


def test_a_trial_quantizes_once_and_its_last_rung_is_the_whole_evaluation(mlp, tmp_path):
    path, calib, evaluation, reference = mlp
    evaluator = Evaluator("L2", 0.05)
    rungs, _ = _plan(evaluator, evaluation, reference)
    runner = TrialRunner(
        TrialSpec(
            path,
            calib,
            evaluation,
            evaluator,
            cache_dir=tmp_path,
            baseline=FloatBaseline(reference=reference),
            rungs=rungs,
        )
    )
    settings = {"calibrate_method": "MinMax", "activation_type": "QUInt8"}
    with runner:
        whole = runner.run(settings, tmp_path / "whole.onnx")
        trial = runner.start(settings, tmp_path / "staged.onnx")
        assert trial.quantized and not trial.done and trial.result.metric is None
        written = (tmp_path / "staged.onnx").stat().st_mtime_ns
        results = _steps(trial)
    assert (tmp_path / "staged.onnx").stat().st_mtime_ns == written  # quantized once
    assert [r["rung"] for r in results] == [0, 1, 2] and {r["rungs"] for r in results} == {3}
    assert [r["eval_rows"] for r in results] == [40, 132, 400]
    assert [r["eval_fraction"] for r in results] == [0.1, 0.33, 1.0]
    # Only the whole evaluation decides; its metric is the one of the trial evaluated whole.
    assert not any(r["is_candidate"] for r in results[:2])
    assert all(r["could_be_candidate"] for r in results[:2])  # 0.018 is well within 0.05
    assert results[-1]["metric"] == whole.metric and results[-1]["is_candidate"]
    assert results[-1]["objective"] == whole.objective and whole.eval_rows == 400
    # A partial metric is the one of the rows seen, against the float model on those rows.
    seen = rungs.order[:40]
    error = _outputs(tmp_path / "staged.onnx", evaluation, seen) - reference.outputs["y"][seen]
    expected = np.sqrt(np.mean(error.astype(np.float64) ** 2, axis=1)).mean()
    assert results[0]["metric"] == pytest.approx(expected, rel=1e-9)


def _outputs(model, evaluation, rows):
    from raysearch.providers import make_session

    session = make_session(model, 1)
    return session.run(None, {"x": evaluation.arrays["x"][rows]})[0]


def test_a_setting_far_from_the_tolerance_is_not_protected(mlp, tmp_path):
    path, calib, evaluation, reference = mlp
    evaluator = Evaluator("cos", 0.99999999)
    rungs, _ = _plan(evaluator, evaluation, reference)
    runner = TrialRunner(
        TrialSpec(
            path,
            calib,
            evaluation,
            evaluator,
            baseline=FloatBaseline(reference=reference),
            rungs=rungs,
        )
    )
    settings = {"calibrate_method": "MinMax", "activation_type": "QUInt8", "reduce_range": True}
    with runner:
        results = _steps(runner.start(settings, tmp_path / "far.onnx"))
    assert results[0]["metric"] < 0.9999 and not results[0]["could_be_candidate"]
    assert not results[-1]["is_candidate"]


def test_a_custom_evaluator_with_a_fraction_is_called_per_rung(mlp, tmp_path):
    path, calib, evaluation, _ = mlp
    calls: list[tuple[str, float | None]] = []

    def agreement(model_path: str, providers: list, fraction: float | None = None) -> float:
        calls.append(("float" if model_path == str(path) else "quant", fraction))
        return 0.9 if fraction is None else 0.9 - 0.1 * fraction

    evaluator = Evaluator(agreement, tolerance=0.01)
    rungs, _ = _plan(evaluator, evaluation, None)
    runner = TrialRunner(TrialSpec(path, calib, evaluation, evaluator, rungs=rungs))
    with runner:
        results = _steps(runner.start({"calibrate_method": "MinMax"}, tmp_path / "c.onnx"))
    quant = [f for who, f in calls if who == "quant"]
    assert quant == [0.1, 0.33, None]  # the last rung is the evaluator's whole evaluation
    assert {f for who, f in calls if who == "float"} == {None, 0.1, 0.33}
    assert [r["eval_fraction"] for r in results] == [0.1, 0.33, 1.0]
    assert all(r["eval_rows"] is None for r in results)  # the evaluator's rows are its own
    # Scored against the float model on the same fraction: no drop, so within the tolerance.
    assert results[0]["could_be_candidate"] and results[-1]["is_candidate"]


def test_a_failure_in_a_later_rung_fails_the_trial_with_one_line(mlp, tmp_path):
    path, calib, evaluation, _ = mlp

    def flaky(model_path: str, providers: list, fraction: float | None = None) -> float:
        if fraction == 0.33 and model_path != str(path):
            raise RuntimeError("the labels file went away\nsecond line")
        return 0.9

    evaluator = Evaluator(flaky, tolerance=0.01)
    rungs, _ = _plan(evaluator, evaluation, None)
    runner = TrialRunner(TrialSpec(path, calib, evaluation, evaluator, rungs=rungs))
    with runner:
        trial = runner.start({"calibrate_method": "MinMax"}, tmp_path / "f.onnx")
        first = dict(trial.step().to_dict())
        result = trial.step()
    assert first["status"] == "ok" and first["rung"] == 0
    assert trial.done and result.status == "failed" and result.metric is None
    assert result.error == "RuntimeError: the labels file went away"
    assert not (tmp_path / "f.onnx").exists()  # no half-useful model left behind
