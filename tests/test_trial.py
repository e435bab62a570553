"""TrialRunner end to end on real models (no Ray), and the execution providers."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from raysearch.data import DataSource
from raysearch.evaluate import Evaluator, FloatReference
from raysearch.evaluate.subsets import EvalRungs
from raysearch.providers import (
    cuda_available,
    execution_providers,
    local_device_index,
    make_session,
    session_options,
    session_providers,
)
from raysearch.trial import FloatBaseline, TrialDevice, TrialRunner, TrialSpec
from raysearch.trialrecord import TrialRecord
from tests.models import (
    encoder_data,
    make_conv_model,
    make_elementwise_model,
    make_encoder_model,
    make_mlp_model,
    make_nan_model,
    mlp_data,
    nan_model_data,
)
from tests.quantize.recording import GPU_PROVIDERS, normalized, record_sessions


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trial")
    path = make_mlp_model(folder / "mlp.onnx")
    calib = DataSource.load(mlp_data(64, seed=1), path, batch_size=16, label="calibration data")
    evaluation = DataSource.load(mlp_data(48, seed=2), path, batch_size=16)
    return path, calib, evaluation


def test_builtin_metric_trial(mlp, tmp_path):
    path, calib, evaluation = mlp
    runner = TrialRunner(
        TrialSpec(path, calib, evaluation, Evaluator("cos", 0.99), cache_dir=tmp_path)
    )
    with runner:
        first = runner.run({"calibrate_method": "MinMax"}, tmp_path / "t0.onnx")
        second = runner.run(
            {"calibrate_method": "MinMax", "per_channel": True}, tmp_path / "t1.onnx"
        )
    assert first.status == "ok" and first.error is None, first.error
    assert 0.99 < first.metric <= 1.0 and first.is_candidate
    assert not first.calib_cache_hit and second.calib_cache_hit
    assert first.model_size_bytes == (tmp_path / "t0.onnx").stat().st_size
    assert first.latency_ms is not None and first.latency_ms > 0
    assert first.device == "cpu" and first.duration_s >= first.evaluation_s > 0
    record = first.to_dict()
    assert json.loads(json.dumps(record))["status"] == "ok"
    assert set(record) >= {"metric", "is_candidate", "duration_s", "calib_cache_hit", "extra"}
    # The float reference was computed once and cached on disk for other processes.
    assert len(list((tmp_path / "reference").iterdir())) == 1


def test_strict_tolerance_is_not_a_candidate_and_l2_direction(mlp, tmp_path):
    path, calib, evaluation = mlp
    reference = FloatReference.compute(path, evaluation)
    strict = TrialRunner(
        TrialSpec(
            path,
            calib,
            evaluation,
            Evaluator("L2", 1e-9),
            baseline=FloatBaseline(reference=reference),
        )
    )
    loose = TrialRunner(
        TrialSpec(
            path,
            calib,
            evaluation,
            Evaluator("L2", 1.0),
            baseline=FloatBaseline(reference=reference),
        )
    )
    settings = {"calibrate_method": "MinMax", "activation_type": "QUInt8"}
    a = strict.run(settings, tmp_path / "a.onnx")
    b = loose.run(settings, tmp_path / "b.onnx")
    assert a.metric == pytest.approx(b.metric) and a.metric > 0
    assert not a.is_candidate and b.is_candidate


def test_nan_outputs_give_a_failed_trial_not_a_crash(tmp_path):
    path = make_nan_model(tmp_path / "nan.onnx")
    data = DataSource.load(nan_model_data(32), path, batch_size=8)
    runner = TrialRunner(TrialSpec(path, data, data, Evaluator("L2", 0.1)))
    assert np.isfinite(runner.float_reference.outputs["y"]).all()
    result = runner.run({"op_types_to_quantize": ["MatMul"]}, tmp_path / "q.onnx")
    assert result.status == "failed" and result.metric is None and not result.is_candidate
    assert result.error.startswith("quantized model output 'y' holds NaN in 32 of 32 samples")
    assert result.model_path is None and not (tmp_path / "q.onnx").exists()
    assert result.quantization_s > 0


def test_refused_settings_and_quantizer_errors_fail_with_one_line(mlp, tmp_path):
    path, calib, evaluation = mlp
    runner = TrialRunner(TrialSpec(path, calib, evaluation, Evaluator("L2", 0.1)))
    rejected = runner.run(
        {"quant_format": "QOperator", "activation_type": "QInt16"}, tmp_path / "a.onnx"
    )
    assert rejected.status == "failed"
    assert rejected.error == (
        "rejected: QOperator format supports 8-bit types only; QInt16 needs quant_format QDQ"
    )
    unknown = runner.run({"quantizer": "nope"}, tmp_path / "b.onnx")
    assert unknown.status == "failed" and unknown.error.startswith("quantizer: unknown quantizer")
    bad_value = runner.run({"activation_type": "QInt3"}, tmp_path / "c.onnx")
    assert bad_value.status == "failed"
    assert bad_value.error == (
        "activation_type: unknown value 'QInt3' (did you mean 'QInt8'?); expected one of QInt8, "
        "QUInt8, QFLOAT8E4M3FN, QInt16, QUInt16, QInt4, QUInt4"
    )


def test_custom_evaluator_trial_scores_the_float_model_once(mlp, tmp_path):
    from tests import evaluators_fixture

    path, calib, _ = mlp
    ev = Evaluator(
        "tests.evaluators_fixture:mean_output",
        tolerance=0.5,
        tolerance_mode="relative",
        higher_is_better=False,
    )
    runner = TrialRunner(TrialSpec(path, calib, None, ev, device=TrialDevice(threads=2)))
    before = len(evaluators_fixture.CALLS)
    results = [
        runner.run({"activation_type": a}, tmp_path / f"{a}.onnx") for a in ("QInt8", "QUInt8")
    ]
    assert [r.status for r in results] == ["ok", "ok"], [r.error for r in results]
    calls = evaluators_fixture.CALLS[before:]
    assert calls.count(str(path)) == 1 and len(calls) == 3
    drop = ev.drop(results[0].metric, runner.float_score)
    assert results[0].is_candidate == (drop <= 0.5)
    assert results[0].latency_ms is not None  # measured on the calibration data


def test_encoder_with_two_inputs_and_conv_qoperator(tmp_path):
    enc = make_encoder_model(tmp_path / "enc.onnx")
    data = DataSource.load(encoder_data(24), enc, batch_size=8)
    runner = TrialRunner(TrialSpec(enc, data, data, Evaluator("SSIM", 0.9)))
    result = runner.run(
        {"op_types_to_quantize": ["MatMul"], "calibrate_method": "Percentile"},
        tmp_path / "e.onnx",
    )
    assert result.status == "ok" and result.metric > 0.9, result.error
    cnn = make_conv_model(tmp_path / "cnn.onnx")
    rng = np.random.default_rng(0)
    images = {"x": rng.random((16, 3, 16, 16), dtype=np.float32)}
    data = DataSource.load(images, cnn, batch_size=8)
    runner = TrialRunner(TrialSpec(cnn, data, data, Evaluator("PSNR", 20.0)))
    result = runner.run(
        {"quant_format": "QOperator", "activation_type": "QUInt8", "per_channel": True},
        tmp_path / "c.onnx",
    )
    assert result.status == "ok" and result.metric > 20.0, result.error
    # QOperator replaced both Convs and the Gemm by integer ops: every weighted node quantized.
    assert result.extra["quantized_share"] == 1.0


def test_trial_records_the_share_of_weighted_nodes_left_quantized(mlp, tmp_path):
    path, calib, evaluation = mlp
    runner = TrialRunner(TrialSpec(path, calib, evaluation, Evaluator("cos", 0.9)))
    whole = runner.run({"calibrate_method": "MinMax"}, tmp_path / "whole.onnx")
    half = runner.run(
        {"calibrate_method": "MinMax", "nodes_to_exclude": ["fc2"]}, tmp_path / "half.onnx"
    )
    assert whole.extra["quantized_share"] == 1.0
    assert half.extra["quantized_share"] == 0.5


def test_a_setting_that_quantizes_nothing_is_never_a_candidate(mlp, tmp_path):
    """Every MatMul left float is the float model with extra nodes: within any tolerance and no
    faster, so no candidate at any rung (ASHA reads ``could_be_candidate``) nor when whole."""
    path, calib, evaluation = mlp
    rungs = EvalRungs((1 / 3, 1.0), (16, 48), np.random.default_rng(0).permutation(48))
    spec = TrialSpec(path, calib, evaluation, Evaluator("cos", 0.5), cache_dir=tmp_path)
    with TrialRunner(replace(spec, rungs=rungs)) as runner:
        only_add = runner.start({"op_types_to_quantize": ["Add"]}, tmp_path / "add.onnx")
        first = only_add.step()
        assert first.status == "ok" and first.rung == 0, first.error
        assert not first.is_candidate and not first.could_be_candidate
        assert first.extra["quantizes_nothing"] == 1.0 and "within_tolerance" not in first.extra
        whole = only_add.finish()
        excluded = runner.run({"nodes_to_exclude": ["fc1", "fc2"]}, tmp_path / "none.onnx")
        quantized = runner.run({"calibrate_method": "MinMax"}, tmp_path / "int8.onnx")
    for result in (whole, excluded):
        assert result.status == "ok" and result.eval_fraction == 1.0, result.error
        # Its metric meets the loose tolerance (the extra says so); the setting still is not
        # an answer.
        assert runner.evaluator.is_candidate(result.metric)
        assert result.extra["within_tolerance"] == 1.0
        assert not result.is_candidate and not result.could_be_candidate
        assert result.extra["quantized_share"] == 0.0 and result.extra["quantizes_nothing"] == 1.0
        assert result.objective < quantized.objective
    assert quantized.is_candidate and quantized.extra["quantized_share"] == 1.0
    assert "quantizes_nothing" not in quantized.extra and "within_tolerance" not in quantized.extra


def test_a_model_without_weighted_nodes_keeps_the_tolerance_rule(tmp_path):
    """No MatMul/Gemm/Conv to quantize: nothing to leave float, the tolerance alone decides."""
    path = make_elementwise_model(tmp_path / "elementwise.onnx")
    data = DataSource.load(nan_model_data(32), path, batch_size=8)
    with TrialRunner(TrialSpec(path, data, data, Evaluator("L2", 1.0))) as runner:
        result = runner.run({"calibrate_method": "MinMax"}, tmp_path / "q.onnx")
    assert result.status == "ok" and result.is_candidate, result.error
    assert "quantized_share" not in result.extra and "quantizes_nothing" not in result.extra


def test_trial_record_to_dict_replaces_non_finite_numbers():
    record = TrialRecord(status="failed", metric=float("nan"), latency_ms=float("inf")).to_dict()
    assert record["metric"] is None and record["latency_ms"] is None


# -- providers ------------------------------------------------------------------------------


def test_cpu_by_default_and_without_cuda_nothing_printed(capfd, mlp):
    assert execution_providers(None) == (["CPUExecutionProvider"], [{}], "cpu")
    available = cuda_available()
    providers, options, device = execution_providers(gpu_id=0, gpu_mem_limit=1 << 30)
    if available:
        assert providers[0] == "CUDAExecutionProvider" and device.startswith("cuda:")
        assert options[0]["gpu_mem_limit"] == 1 << 30
    else:
        assert device == "cpu" and providers == ["CPUExecutionProvider"]
        session = make_session(mlp[0], threads=1, gpu_id=0)
        assert session.get_providers() == ["CPUExecutionProvider"]
        captured = capfd.readouterr()
        assert "CUDA" not in captured.err and "CUDA" not in captured.out


def test_session_threads_and_device_index(monkeypatch):
    assert session_options(3).intra_op_num_threads == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert local_device_index(5) == 1 and local_device_index("2") == 0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert local_device_index(3) == 3


def test_every_session_of_a_trial_runs_on_the_trial_providers(mlp, tmp_path):
    """Calibration (MinMax and histogram passes), the float reference and evaluation: every
    session gets the trial's providers, CUDA options included. The driver's CPU float
    reference is computed again on the trial's device."""
    path, calib, evaluation = mlp
    cpu_reference = FloatReference.compute(path, evaluation)
    with record_sessions() as sessions:
        runner = TrialRunner(
            TrialSpec(
                path,
                calib,
                evaluation,
                Evaluator("cos", 0.9),
                cache_dir=tmp_path / "cache",
                device=TrialDevice(providers=GPU_PROVIDERS),
                baseline=FloatBaseline(reference=cpu_reference),
            )
        )
        with runner:
            results = [
                runner.run({"calibrate_method": m}, tmp_path / f"{m}.onnx")
                for m in ("MinMax", "Percentile")
            ]
    assert [r.status for r in results] == ["ok", "ok"], [r.error for r in results]
    assert [r.device for r in results] == ["cuda:0", "cuda:0"]
    assert runner.float_reference.device == "cuda:0"
    # The float reference, then per trial: calibration and evaluation (latency included).
    assert len(sessions) == 5
    assert all(s == normalized(GPU_PROVIDERS) for s in sessions), sessions


def test_a_trial_given_a_gpu_uses_its_providers_everywhere(mlp, tmp_path):
    """What a Ray actor builds: the GPU it was given and its memory share decide every
    session's providers (the CPU's where CUDA does not load)."""
    path, calib, evaluation = mlp
    expected = session_providers(0, 1 << 30)
    with record_sessions() as sessions:
        runner = TrialRunner(
            TrialSpec(
                path,
                calib,
                evaluation,
                Evaluator("cos", 0.9),
                device=TrialDevice(gpu_id=0, gpu_mem_limit=1 << 30),
            )
        )
        result = runner.run({"calibrate_method": "Entropy"}, tmp_path / "e.onnx")
    assert result.status == "ok", result.error
    assert runner.session_providers == expected and runner.cache.providers == expected
    assert sessions and all(s == normalized(expected) for s in sessions), sessions
    if cuda_available():
        assert expected[0][1]["gpu_mem_limit"] == 1 << 30 and result.device == "cuda:0"


def test_a_custom_float_score_from_the_cpu_is_scored_again_on_the_trial_device(mlp):
    from tests import evaluators_fixture

    path, calib, _ = mlp
    ev = Evaluator("tests.evaluators_fixture:mean_output", tolerance=0.5)
    cpu_score = ev.score_float(path)  # what the driver computes
    before = len(evaluators_fixture.CALLS)
    on_cpu = TrialRunner(TrialSpec(path, calib, None, ev, baseline=FloatBaseline(score=cpu_score)))
    assert on_cpu.float_score == cpu_score and len(evaluators_fixture.CALLS) == before
    with record_sessions() as sessions:
        on_gpu = TrialRunner(
            TrialSpec(
                path,
                calib,
                None,
                ev,
                device=TrialDevice(providers=GPU_PROVIDERS),
                baseline=FloatBaseline(score=cpu_score),
            )
        )
        # CUDA's float MatMul runs in TF32 on Ampere and later: the H200 gave -0.166296 where
        # the CPU gave -0.166314, so the two agree to about 1e-4, not to float32 rounding.
        assert on_gpu.float_score == pytest.approx(cpu_score, rel=1e-3)
    assert evaluators_fixture.CALLS[before:] == [str(path)]
    # Custom evaluators get the providers' names.
    assert on_gpu.providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert sessions == [normalized(on_gpu.providers)]
