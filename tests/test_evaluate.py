"""raysearch.evaluate: metrics on hand-computed arrays, custom evaluators, the tolerance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raysearch.data import DataSource
from raysearch.errors import ConfigError
from raysearch.evaluate import (
    BUILTIN_METRICS,
    PSNR_CAP_DB,
    Evaluator,
    EvaluatorError,
    FloatReference,
    MetricError,
    compute_metric,
    load_custom_evaluator,
)
from tests import evaluators_fixture
from tests.models import make_mlp_model, mlp_data

# Two samples, two outputs each: sample 0 = [3, 4 | 0], sample 1 = [1, 0 | 1]
FLOAT = {"a": np.array([[3.0, 4.0], [1.0, 0.0]]), "b": np.array([[0.0], [1.0]])}
QUANT = {"a": np.array([[3.0, 4.0], [0.0, 0.0]]), "b": np.array([[1.0], [1.0]])}


def test_l1_and_l2_by_hand():
    # sample 0: |diff| = [0, 0, 1]; sample 1: [1, 0, 0]
    assert compute_metric("L1", QUANT, FLOAT) == pytest.approx((1 / 3 + 1 / 3) / 2)
    assert compute_metric("L2", QUANT, FLOAT) == pytest.approx(math.sqrt(1 / 3))


def test_cos_by_hand():
    # sample 0: q=[3,4,1], f=[3,4,0] -> 25 / (sqrt(26) * 5); sample 1: q=[0,0,1], f=[1,0,1]
    expected = (25 / (math.sqrt(26) * 5) + 1 / math.sqrt(2)) / 2
    assert compute_metric("cos", QUANT, FLOAT) == pytest.approx(expected)
    zeros = {"a": np.zeros((1, 3))}
    assert compute_metric("cos", zeros, zeros) == 1.0
    assert compute_metric("cos", {"a": np.ones((1, 3))}, zeros) == 0.0


def test_psnr_by_hand_and_cap():
    # sample 0: peak 4, mse 1/3; sample 1: peak 1, mse 1/3
    expected = (10 * math.log10(16 * 3) + 10 * math.log10(3)) / 2
    assert compute_metric("PSNR", QUANT, FLOAT) == pytest.approx(expected)
    assert compute_metric("PSNR", FLOAT, FLOAT) == PSNR_CAP_DB


def test_ssim_by_hand():
    q = {"y": np.array([[1.0, 2.0, 3.0, 5.0]])}
    f = {"y": np.array([[1.0, 2.0, 3.0, 4.0]])}
    mq, mf = 11 / 4, 10 / 4
    vq = np.var([1, 2, 3, 5])
    vf = np.var([1, 2, 3, 4])
    cov = np.mean((np.array([1, 2, 3, 5]) - mq) * (np.array([1, 2, 3, 4]) - mf))
    c1, c2 = (0.01 * 3) ** 2, (0.03 * 3) ** 2
    expected = ((2 * mq * mf + c1) * (2 * cov + c2)) / ((mq**2 + mf**2 + c1) * (vq + vf + c2))
    assert compute_metric("SSIM", q, f) == pytest.approx(expected)
    assert compute_metric("SSIM", f, f) == pytest.approx(1.0)


def test_outputs_with_different_sample_counts_are_one_sample():
    f = {"a": np.array([[1.0, 1.0]]), "b": np.array([2.0, 2.0, 2.0])}
    q = {"a": np.array([[1.0, 1.0]]), "b": np.array([2.0, 2.0, 0.0])}
    assert compute_metric("L1", q, f) == pytest.approx(2 / 5)


def test_nan_outputs_and_shape_mismatch_raise_metric_errors():
    bad = {"a": QUANT["a"].copy(), "b": QUANT["b"]}
    bad["a"][1, 0] = np.nan
    with pytest.raises(MetricError, match=r"^quantized model output 'a' holds NaN in 1 of 2 "):
        compute_metric("L2", bad, FLOAT)
    with pytest.raises(MetricError, match=r"output 'b' has shape \(2, 2\), the float model's"):
        compute_metric("L2", {"a": QUANT["a"], "b": np.zeros((2, 2))}, FLOAT)
    with pytest.raises(MetricError, match=r"has no output 'b'"):
        compute_metric("L2", {"a": QUANT["a"]}, FLOAT)


# -- the tolerance and directions -----------------------------------------------------------


def test_builtin_directions():
    assert {m: Evaluator(m).higher_is_better for m in BUILTIN_METRICS} == BUILTIN_METRICS


def test_is_candidate_l2_lower_is_better():
    ev = Evaluator("L2", tolerance=0.01)
    assert ev.is_candidate(0.005) and ev.is_candidate(0.01)
    assert not ev.is_candidate(0.02)
    assert ev.better(0.001, 0.002) and not ev.better(0.002, 0.001)


def test_is_candidate_cos_higher_is_better():
    ev = Evaluator("cos", tolerance=0.999)
    assert ev.is_candidate(0.9995) and ev.is_candidate(0.999)
    assert not ev.is_candidate(0.99)
    assert ev.better(0.9999, 0.999) and not ev.better(0.99, 0.999)


def test_no_tolerance_or_no_score_is_never_a_candidate():
    assert not Evaluator("L2").is_candidate(0.0)
    assert not Evaluator("L2", tolerance=1.0).is_candidate(None)
    assert not Evaluator("L2", tolerance=1.0).is_candidate(float("nan"))
    assert Evaluator("L2").better(1.0, None) and not Evaluator("L2").better(None, 1.0)


CUSTOM = "tests.evaluators_fixture:mean_output"


@pytest.mark.parametrize(
    ("higher", "mode", "tolerance", "float_score", "score", "expected"),
    [
        # higher is better, absolute drop = float - quant
        (True, "absolute", 0.02, 0.90, 0.89, True),
        (True, "absolute", 0.02, 0.90, 0.87, False),
        (True, "absolute", 0.02, 0.90, 0.95, True),  # better than float
        # higher is better, relative drop = (float - quant) / |float|
        (True, "relative", 0.05, 0.80, 0.77, True),  # 3.75 %
        (True, "relative", 0.05, 0.80, 0.75, False),  # 6.25 %
        # lower is better (a loss), absolute drop = quant - float
        (False, "absolute", 0.1, 1.0, 1.05, True),
        (False, "absolute", 0.1, 1.0, 1.2, False),
        (False, "absolute", 0.1, 1.0, 0.5, True),
        # lower is better, relative drop = (quant - float) / |float|
        (False, "relative", 0.1, 2.0, 2.1, True),  # 5 %
        (False, "relative", 0.1, 2.0, 2.4, False),  # 20 %
        # negative float score: relative to |float|
        (True, "relative", 0.1, -2.0, -2.1, True),
        (True, "relative", 0.1, -2.0, -2.4, False),
    ],
)
def test_is_candidate_custom_metric(higher, mode, tolerance, float_score, score, expected):
    ev = Evaluator(CUSTOM, tolerance=tolerance, tolerance_mode=mode, higher_is_better=higher)
    assert ev.higher_is_better is higher
    assert ev.is_candidate(score, float_score) is expected
    assert ev.better(score + (1 if higher else -1), score)


def test_custom_metric_needs_the_float_score():
    with pytest.raises(ValueError, match="needs the float model's score"):
        Evaluator(CUSTOM, tolerance=0.1).is_candidate(0.5)


# -- custom evaluators ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return make_mlp_model(tmp_path_factory.mktemp("evaluate") / "mlp.onnx")


def test_custom_evaluator_as_import_path_and_as_callable(mlp):
    by_path = Evaluator(CUSTOM, tolerance=0.1)
    assert by_path.is_custom and by_path.name == CUSTOM
    calls = len(evaluators_fixture.CALLS)
    score = by_path.score(mlp, providers=["CPUExecutionProvider"])
    assert len(evaluators_fixture.CALLS) == calls + 1
    by_callable = Evaluator(evaluators_fixture.mean_output, tolerance=0.1)
    assert by_callable.score_model(mlp).metric == pytest.approx(score.metric)
    assert by_callable.score_float(mlp) == pytest.approx(score.metric)


def test_custom_evaluator_dict_results(mlp):
    ev = Evaluator("tests.evaluators_fixture:output_stats", metric_key="max")
    score = ev.score_model(mlp)
    assert set(score.extra) == {"mean"} and score.metric >= score.extra["mean"]
    with pytest.raises(MetricError, match=r"set metric_key to name the main metric"):
        Evaluator("tests.evaluators_fixture:output_stats").score_model(mlp)
    with pytest.raises(MetricError, match=r"not metric_key 'maxx' \(did you mean 'max'\?\)"):
        Evaluator("tests.evaluators_fixture:output_stats", metric_key="maxx").score_model(mlp)
    single = Evaluator(lambda path, providers: {"acc": 0.5})
    assert single.score_model(mlp).metric == 0.5
    named = Evaluator(lambda path, providers: {"metric": 0.7, "latency": 3})
    assert named.score_model(mlp).metric == 0.7 and named.score_model(mlp).extra == {"latency": 3}


def test_custom_evaluator_bad_returns(mlp):
    with pytest.raises(MetricError) as err:
        Evaluator("tests.evaluators_fixture:returns_text").score_model(mlp)
    assert str(err.value) == (
        "evaluator 'tests.evaluators_fixture:returns_text' returned str 'good', expected a "
        "number or a dict of numbers"
    )
    with pytest.raises(MetricError, match=r"returns_nan' returned NaN$"):
        Evaluator("tests.evaluators_fixture:returns_nan").score_model(mlp)
    with pytest.raises(EvaluatorError, match=r"on the float model: evaluator .* returned NaN"):
        Evaluator("tests.evaluators_fixture:returns_nan").score_float(mlp)


def test_custom_evaluator_loading_errors():
    with pytest.raises(ConfigError) as err:
        load_custom_evaluator("tests.no_such_module:fn")
    assert str(err.value).startswith("metric: cannot import module 'tests.no_such_module'")
    with pytest.raises(ConfigError) as err:
        load_custom_evaluator("tests.evaluators_fixture:mean_outptu")
    assert str(err.value) == (
        "metric: module 'tests.evaluators_fixture' has no function 'mean_outptu' "
        "(did you mean 'mean_output'?)"
    )
    with pytest.raises(ConfigError) as err:
        load_custom_evaluator("tests.evaluators_fixture:wrong_signature")
    assert str(err.value) == (
        "metric: 'tests.evaluators_fixture:wrong_signature' must accept (model_path, providers), "
        "or (onnx_path, **args) as Quark's search_evaluator does; it accepts (model_path)"
    )
    with pytest.raises(ConfigError, match=r"'tests.evaluators_fixture:not_callable' is not call"):
        load_custom_evaluator("tests.evaluators_fixture:not_callable")
    with pytest.raises(ConfigError, match=r"must accept \(model_path, providers\)"):
        Evaluator(lambda: 1.0)
    with pytest.raises(ConfigError, match=r"unknown metric 'l3'"):
        Evaluator("l3")
    with pytest.raises(ConfigError, match=r"higher_is_better: L2 is lower-is-better"):
        Evaluator("L2", higher_is_better=True)


# -- the float reference --------------------------------------------------------------------


def test_float_reference_compute_save_load_and_cache(mlp, tmp_path):
    data = DataSource.load(mlp_data(20), mlp, batch_size=8)
    ref = FloatReference.compute(mlp, data, threads=1)
    assert list(ref.outputs) == ["y"]
    assert ref.outputs["y"].shape == (20, 8)
    folder = ref.save(tmp_path / "ref")
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "output_0.npy"]
    loaded = FloatReference.load(folder)
    assert isinstance(loaded.outputs["y"], np.memmap)
    np.testing.assert_array_equal(loaded.outputs["y"], ref.outputs["y"])
    cached = FloatReference.cached(tmp_path / "cache", mlp, data)
    assert (tmp_path / "cache" / "reference" / cached.key / "meta.json").is_file()
    again = FloatReference.cached(tmp_path / "cache", mlp, data)
    assert isinstance(again.outputs["y"], np.memmap) and again.key == cached.key
    assert Evaluator("L2").score(outputs=ref.outputs, reference=again).metric == 0.0


@pytest.mark.parametrize(
    ("metric", "tolerance", "higher", "float_score"),
    [("cos", 0.99, True, None), ("L2", 0.05, False, None), (None, 0.02, True, 0.9)],
)
def test_sampler_objective_orders_trials_as_the_best_rule_does(
    metric, tolerance, higher, float_score
):
    """Higher (lower) objective <=> ``outputs.better``: candidates first, then the larger
    quantized share, then the metric; trials that are not candidates by their metric."""
    import itertools

    from raysearch.outputs import better
    from raysearch.trialrecord import TrialRecord

    evaluator = Evaluator(
        metric or (lambda path, providers: 0.0),
        tolerance=tolerance,
        tolerance_mode="absolute",
        higher_is_better=higher,
    )
    base = float_score if float_score is not None else (1.0 if higher else 0.0)
    step = 1 if higher else -1
    scores = [base + step * d for d in (0.0, -0.004, -0.01, -0.03, -0.2, 0.003)]
    records = []
    for score, share in itertools.product(scores, (1 / 3, 2 / 3, 1.0)):
        candidate = evaluator.is_candidate(score, float_score)
        objective = evaluator.sampler_objective(score, float_score, share, 3)
        records.append(
            TrialRecord(
                status="ok",
                metric=score,
                is_candidate=candidate,
                objective=objective,
                extra={"quantized_share": share},
            )
        )
    assert any(r.is_candidate for r in records) and not all(r.is_candidate for r in records)
    for a, b in itertools.permutations(records, 2):
        if a.metric == b.metric and (not a.is_candidate or a.extra == b.extra):
            continue  # equal for the best rule as for the objective
        by_objective = a.objective > b.objective if higher else a.objective < b.objective
        assert better(a, b, higher) == by_objective, (a, b)
    # Keeping every weighted node float is below every trial that quantizes something.
    worst = [evaluator.sampler_objective(score, float_score, 0.0, 3) for score in scores]
    if higher:
        assert max(worst) < min(r.objective for r in records)
    else:
        assert min(worst) > max(r.objective for r in records)


def test_a_tolerance_met_exactly_is_met_despite_floating_point_rounding():
    """1 - 0.998 is 0.0020000000000000018: 499 of 500 rows kept meets a tolerance of 0.002."""
    top1 = Evaluator(lambda path, providers: 0.0, tolerance=0.002, tolerance_mode="absolute",
                     higher_is_better=True)  # fmt: skip
    assert 1.0 - 0.998 > 0.002
    assert top1.is_candidate(499 / 500, 1.0)
    assert not top1.is_candidate(498 / 500, 1.0)
    relative = Evaluator(lambda path, providers: 0.0, tolerance=0.01, tolerance_mode="relative",
                         higher_is_better=False)  # fmt: skip
    assert relative.is_candidate(0.3 * 1.01, 0.3) and not relative.is_candidate(0.3031, 0.3)
    assert Evaluator("cos", tolerance=0.3).is_candidate(0.1 + 0.2)  # 0.30000000000000004
    assert Evaluator("L2", tolerance=0.3).is_candidate(0.1 + 0.2)
    assert not Evaluator("L2", tolerance=0.3).is_candidate(0.3000001)
