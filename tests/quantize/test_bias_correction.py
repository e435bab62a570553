"""bias_correction on models whose quantization plants a known mean shift: weights at
``(k + 0.49) * scale`` all round down by ``0.49 * scale``, so with positive inputs every output
channel shifts by about ``-0.49 * scale * sum(x)``. Real ONNX Runtime quantization and
sessions."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

import raysearch.quantize.techniques.bias_correction  # noqa: F401  (registers the technique)
from raysearch.cpu import u8s8_saturates
from raysearch.data import DataSource
from raysearch.evaluate import Evaluator
from raysearch.quantize._qdq_graph import QTYPES, QdqGraph, dequantize, load_model, quantize
from raysearch.quantize.techniques.bias_correction import BiasCorrection, Layer, find_layers
from raysearch.quantize.techniques.bias_correction._write import write_bias
from raysearch.trial import TrialRunner, TrialSpec
from tests.models import conv_data, make_conv_model

STEP = 0.01  # the weight scale ONNX Runtime picks: max |w| = 127 * STEP


def _planted_weights(rng: np.random.Generator, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """Weights just below a rounding boundary; one entry per channel (along ``axis``) at
    127 steps fixes the per-tensor and per-channel scales at STEP."""
    k = rng.integers(-100, 100, shape)
    w = (k + 0.49) * STEP
    index = [0] * len(shape)
    index[axis] = slice(None)
    w[tuple(index)] = 127 * STEP
    return w.astype(np.float32)


def _make(path, kind: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    n = helper.make_node
    if kind == "conv":
        w = _planted_weights(rng, (6, 3, 3, 3), 0)
        b = rng.normal(0, 0.1, 6).astype(np.float32)
        nodes = [n("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])]
        x_shape, y_shape = ["N", 3, 8, 8], ["N", 6, 8, 8]
    elif kind.startswith("gemm"):
        w = _planted_weights(rng, (8, 16), 0)  # transB: [out, in]
        b = rng.normal(0, 0.1, 8).astype(np.float32)
        # beta 2: ONNX Runtime writes beta 1 and a bias that dequantizes to b, not 2 b.
        beta = 2.0 if kind == "gemm_beta" else 1.0
        nodes = [n("Gemm", ["x", "w", "b"], ["y"], name="gemm", transB=1, beta=beta)]
        x_shape, y_shape = ["N", 16], ["N", 8]
    else:
        w = _planted_weights(rng, (16, 8), 1)
        b = rng.normal(0, 0.1, 8).astype(np.float32)
        nodes = [n("MatMul", ["x", "w"], ["h"], name="mm"), n("Add", ["h", "b"], ["y"], name="add")]
        x_shape, y_shape = ["N", 16], ["N", 8]
    graph = helper.make_graph(
        nodes,
        kind,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def _data(kind: str, count: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (count, 3, 8, 8) if kind == "conv" else (count, 16)
    return {"x": rng.uniform(0.5, 1.5, shape).astype(np.float32)}


def _quantize(float_path, out, calib, per_channel: bool, activation: QuantType, extra=None):
    quantize_static(
        str(float_path), str(out), calib.reader(), quant_format=QuantFormat.QDQ,
        per_channel=per_channel, weight_type=QuantType.QInt8, activation_type=activation,
        extra_options=extra,
    )  # fmt: skip
    return out


def _mean_error(quantized, float_path, data) -> tuple[np.ndarray, float, float]:
    """Mean of (quantized - float) per output channel and over the whole output, of the
    quantized model as it is deployed (its own optimized session: the integer kernels of this
    CPU, which an extra graph output would change), and the output's quantization step. The
    float output goes through the model output's QuantizeLinear/DequantizeLinear, whose
    rounding adds a per-channel offset of its own that no bias can remove."""
    model = onnx.load(str(quantized))
    yq = ort.InferenceSession(model.SerializeToString()).run(None, data)[0]
    yf = ort.InferenceSession(str(float_path)).run(None, data)[0]
    graph = QdqGraph(model)
    q = graph.producer[graph.producer["y"].input[0]]
    scale, zero_point, axis, elem = graph.qparams(q)
    qmin, qmax, _ = QTYPES[elem]
    yf = dequantize(quantize(yf, scale, zero_point, qmin, qmax, axis), scale, zero_point, axis)
    diff = np.moveaxis(yq.astype(np.float64) - yf, 1, -1)
    return diff.reshape(-1, diff.shape[-1]).mean(0), float(diff.mean()), float(scale.max())


def _initializers(path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def saturates(activation: QuantType) -> bool:
    """Whether ONNX Runtime's u8s8 integer kernels saturate on this CPU for these tests
    (8-bit activations, int8 weights)."""
    return activation in (QuantType.QUInt8, QuantType.QInt8) and u8s8_saturates()


def test_effect_key():
    bc = BiasCorrection()
    assert bc.effect_key({}) is None
    assert bc.effect_key({"include_bias_correction": False}) is None
    on = bc.effect_key({"include_bias_correction": True})
    few = bc.effect_key(
        {"include_bias_correction": True, "extra_options": {"BiasCorrectionSamples": 8}}
    )
    assert on == "samples=all" and few == "samples=8" and on != few
    assert bc.order == 30


@pytest.mark.parametrize(
    "kind, per_channel, activation, extra",
    [
        ("matmul", False, QuantType.QUInt8, None),  # the Add's constant: uint8, rescaled
        ("matmul", False, QuantType.QInt8, {"ActivationSymmetric": True}),
        ("matmul", True, QuantType.QInt16, None),
        ("conv", False, QuantType.QUInt8, None),  # int32 bias, scale [1]
        ("conv", True, QuantType.QInt8, None),  # int32 bias per channel
        ("conv", False, QuantType.QUInt8, {"QuantizeBias": False}),  # a float bias
        ("gemm", True, QuantType.QUInt8, None),
        ("gemm", False, QuantType.QUInt16, None),
        ("gemm_beta", False, QuantType.QUInt8, None),
    ],
)
def test_planted_mean_shift_is_removed(tmp_path, kind, per_channel, activation, extra):
    float_path = _make(tmp_path / f"{kind}.onnx", kind)
    float_bytes = float_path.read_bytes()
    calib = DataSource.load(_data(kind, 256, seed=1), float_path, batch_size=64)
    evaluation = _data(kind, 512, seed=2)
    quantized = _quantize(float_path, tmp_path / "q.onnx", calib, per_channel, activation, extra)
    before_inits = _initializers(quantized)
    before, before_total, step = _mean_error(quantized, float_path, evaluation)

    BiasCorrection().transform(
        str(quantized), str(float_path), {"include_bias_correction": True}, calib
    )
    after, after_total, _ = _mean_error(quantized, float_path, evaluation)
    print(
        f"{kind} {per_channel} {activation}: per-channel mean shift {np.abs(before).max():.4f}"
        f" -> {np.abs(after).max():.5f}; model output {before_total:.4f} -> {after_total:.5f}"
        f"; output step {step:.4f}"
    )
    if not saturates(activation):
        assert np.abs(before).min() > 0.03  # the planted shift is there, in every channel
    # Else u8s8 products saturate on this CPU (x86-64 without VNNI): the shift the model
    # shows is larger and differs by channel, and that is the shift to remove.
    assert np.abs(before).max() > 0.03
    # Every channel's output rounds on a grid (the layer's output is requantized): its mean
    # moves in steps, so half a step is left at most, beyond a tenth of the shift. Saturation's
    # error varies with the input: the mean measured on the calibration data removes most,
    # not all, of it on other data.
    share = 0.2 if saturates(activation) else 0.1
    assert np.abs(after).max() <= share * np.abs(before).max() + 0.5 * step
    assert abs(after_total) <= 0.1 * abs(before_total)
    assert float_path.read_bytes() == float_bytes  # the float model is untouched
    after_inits = _initializers(quantized)
    changed = {k for k in before_inits if not np.array_equal(before_inits[k], after_inits.get(k))}
    assert changed and all(k.startswith("b") for k in changed)  # only the bias (and its qparams)


def test_samples_setting_changes_the_correction(tmp_path):
    float_path = _make(tmp_path / "conv.onnx", "conv")
    calib = DataSource.load(_data("conv", 64, seed=1), float_path, batch_size=4)
    biases = []
    for samples in (None, 4):
        quantized = _quantize(float_path, tmp_path / "q.onnx", calib, False, QuantType.QUInt8)
        extra = {} if samples is None else {"BiasCorrectionSamples": samples}
        settings = {"include_bias_correction": True, "extra_options": extra}
        BiasCorrection().transform(str(quantized), str(float_path), settings, calib)
        biases.append(_initializers(quantized)["b_quantized"])
    assert not np.array_equal(biases[0], biases[1])


def test_layers_found_and_layer_without_bias_left(tmp_path):
    path = make_conv_model(tmp_path / "cnn.onnx")
    calib = DataSource.load(conv_data(16), path, batch_size=8)
    quantized = _quantize(path, tmp_path / "q.onnx", calib, False, QuantType.QUInt8)
    layers = find_layers(QdqGraph(load_model(quantized)))
    assert [(layer.name, layer.source) for layer in layers] == [
        ("conv1", "x"), ("conv2", "a1"), ("fc", "f")
    ]  # fmt: skip
    # A MatMul without an Add has no bias: not a layer.
    mm = _make(tmp_path / "mm.onnx", "matmul")
    model = onnx.load(str(mm))
    del model.graph.node[1]
    model.graph.output[0].name = "h"
    onnx.save(model, str(tmp_path / "nobias.onnx"))
    data = DataSource.load(_data("matmul", 16, 1), tmp_path / "nobias.onnx", batch_size=8)
    q = _quantize(tmp_path / "nobias.onnx", tmp_path / "q2.onnx", data, False, QuantType.QUInt8)
    assert find_layers(QdqGraph(load_model(q))) == []
    bytes_before = q.read_bytes()
    BiasCorrection().transform(str(q), str(tmp_path / "nobias.onnx"),
                               {"include_bias_correction": True}, data)  # fmt: skip
    assert q.read_bytes() == bytes_before


def test_int32_overflow_is_clamped_and_logged(tmp_path, caplog):
    float_path = _make(tmp_path / "conv.onnx", "conv")
    calib = DataSource.load(_data("conv", 16, seed=1), float_path, batch_size=8)
    quantized = _quantize(float_path, tmp_path / "q.onnx", calib, False, QuantType.QUInt8)
    graph = QdqGraph(load_model(quantized))
    (layer,) = find_layers(graph)
    assert isinstance(layer, Layer)
    delta = np.zeros(6)
    delta[2] = -1e9  # far past what int32 holds at this scale
    with caplog.at_level(logging.WARNING, logger="raysearch.quantize.techniques.bias_correction"):
        assert write_bias(graph, layer, delta)
    assert "clamped" in caplog.text
    q = graph.array("b_quantized")
    assert q.dtype == np.int32 and q[2] == np.iinfo(np.int32).max


def test_trial_runner_on_conv_model(tmp_path):
    path = make_conv_model(tmp_path / "cnn.onnx")
    calib = DataSource.load(conv_data(64, seed=2), path, batch_size=16)
    evaluation = DataSource.load(conv_data(48, seed=5), path, batch_size=16)
    runner = TrialRunner(
        TrialSpec(path, calib, evaluation, Evaluator("cos", 0.9), cache_dir=tmp_path)
    )
    with runner:
        off = runner.run({"calibrate_method": "MinMax"}, tmp_path / "off.onnx")
        on = runner.run(
            {"calibrate_method": "MinMax", "include_bias_correction": True}, tmp_path / "on.onnx"
        )
    assert off.status == "ok" and on.status == "ok", (off.error, on.error)
    print(f"conv model cos: off {off.metric:.6f} on {on.metric:.6f}")
    assert on.metric >= off.metric
    assert _initializers(tmp_path / "on.onnx")["c1_quantized"].tolist() != (
        _initializers(tmp_path / "off.onnx")["c1_quantized"].tolist()
    )


def test_after_power_of_two_scales_stay_powers_of_two(tmp_path):
    """The trial runs power_of_two (order 10) before bias_correction (30): the corrected
    biases keep power-of-two scales (the MatMul-Add constants are rescaled by a power)."""
    import raysearch.quantize.techniques.power_of_two  # noqa: F401

    path = _make(tmp_path / "mm.onnx", "matmul")
    calib = DataSource.load(_data("matmul", 128, seed=1), path, batch_size=32)
    evaluation = DataSource.load(_data("matmul", 64, seed=3), path, batch_size=32)
    runner = TrialRunner(
        TrialSpec(path, calib, evaluation, Evaluator("cos", 0.9), cache_dir=tmp_path)
    )
    base = {"calibrate_method": "MinMax", "extra_options": {"PowerOfTwoMethod": "NonOverflow"}}
    with runner:
        off = runner.run(base, tmp_path / "off.onnx")
        on = runner.run({**base, "include_bias_correction": True}, tmp_path / "on.onnx")
    assert off.status == "ok" and on.status == "ok", (off.error, on.error)
    inits = _initializers(tmp_path / "on.onnx")
    scales = [v.astype(np.float64) for k, v in inits.items() if k.endswith("_scale")]
    assert all(np.all(np.log2(s) == np.round(np.log2(s))) for s in scales)
    assert not np.array_equal(
        inits["b_quantized"], _initializers(tmp_path / "off.onnx")["b_quantized"]
    )
    print(f"power-of-two matmul cos: off {off.metric:.6f} on {on.metric:.6f}")
    assert on.metric >= off.metric
