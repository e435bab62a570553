"""power_of_two on real ONNX Runtime QDQ models: every scale an exact power of two, zero points
symmetric, weights and biases requantized from the float model, the model still close to
float; NonOverflow's exponents by hand; MinMSE against NonOverflow."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

import raysearch.quantize.techniques.power_of_two  # noqa: F401  (registers the technique)
from raysearch.data import DataSource
from raysearch.errors import ConfigError
from raysearch.evaluate import Evaluator
from raysearch.quantize._qdq_graph import QTYPES, dequantize
from raysearch.quantize.techniques.power_of_two import PowerOfTwoScales, nonoverflow_exponent
from raysearch.trial import TrialRunner, TrialSpec
from tests.models import conv_data, make_conv_model, make_mlp_model, mlp_data

MODELS = {"mlp": (make_mlp_model, mlp_data), "conv": (make_conv_model, conv_data)}


def _settings(method: str) -> dict:
    return {"extra_options": {"PowerOfTwoMethod": method}}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pow2")
    out = {}
    for name, (make, data) in MODELS.items():
        path = make(folder / f"{name}.onnx")
        out[name] = (path, DataSource.load(data(64), path, batch_size=16), data(48, seed=7))
    return folder, out


def _quantize(folder, name, path, calib, per_channel, activation, weight=QuantType.QInt8):
    out = folder / f"{name}_{per_channel}_{activation.name}_{weight.name}.onnx"
    if not out.exists():
        quantize_static(
            str(path), str(out), calib.reader(), quant_format=QuantFormat.QDQ,
            per_channel=per_channel, weight_type=weight, activation_type=activation,
        )  # fmt: skip
    return out


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _run(path, data) -> np.ndarray:
    return ort.InferenceSession(str(path)).run(None, data)[0]


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _weight_mse(model: onnx.ModelProto, float_inits: dict[str, np.ndarray]) -> float:
    """Squared error of every dequantized weight against its float values."""
    inits, total = _inits(model), 0.0
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in inits:
            original = float_inits[node.input[0].removesuffix("_quantized")]
            axis = next((a.i for a in node.attribute if a.name == "axis"), None)
            deq = dequantize(inits[node.input[0]], inits[node.input[1]], inits[node.input[2]], axis)
            if inits[node.input[0]].dtype != np.int32:  # biases follow from the others
                total += float(np.sum((deq - original) ** 2))
    return total


def test_effect_key_and_order():
    p2 = PowerOfTwoScales()
    assert p2.effect_key({}) is None and p2.effect_key({"extra_options": {}}) is None
    keys = {p2.effect_key(_settings(m)) for m in ("NonOverflow", "MinMSE")}
    assert keys == {"NonOverflow", "MinMSE"}
    assert p2.order == 10


def _covers(scale: float, rmin: float, rmax: float, qmin: int, qmax: int, zp: int) -> bool:
    return (qmin - zp) * scale <= rmin and (qmax - zp) * scale >= rmax


def test_nonoverflow_exponent_is_the_smallest_covering_power():
    rng = np.random.default_rng(0)
    for qmin, qmax, zp in QTYPES.values():
        for _ in range(200):
            rmin, rmax = -rng.exponential(3), rng.exponential(3)
            e = nonoverflow_exponent(rmin, rmax, qmin, qmax, zp).item()
            assert e == int(e)
            bounds = (rmin, rmax, qmin, qmax, zp)
            assert _covers(2.0**e, *bounds) and not _covers(2.0 ** (e - 1), *bounds)
    # Exact powers of two on the boundary: 127 * 2**-3 covers rmax = 127 / 8 exactly.
    assert nonoverflow_exponent(0.0, 127 / 8, -128, 127, 0).item() == -3
    # An all-zero range keeps the fallback exponent.
    assert nonoverflow_exponent(0.0, 0.0, -128, 127, 0, fallback=-7.0).item() == -7


@pytest.mark.parametrize("name", ["mlp", "conv"])
@pytest.mark.parametrize(
    "per_channel, activation, weight",
    [
        (False, QuantType.QUInt8, QuantType.QInt8),
        (True, QuantType.QInt8, QuantType.QInt8),
        (True, QuantType.QUInt16, QuantType.QInt8),
        (False, QuantType.QUInt8, QuantType.QUInt8),
        (True, QuantType.QInt16, QuantType.QInt16),
    ],
)
@pytest.mark.parametrize("method", ["NonOverflow", "MinMSE"])
def test_every_scale_is_a_power_of_two(
    models, tmp_path, name, per_channel, activation, weight, method
):
    folder, table = models
    path, calib, evaluation = table[name]
    quantized = _quantize(folder, name, path, calib, per_channel, activation, weight)
    out = tmp_path / "p2.onnx"
    shutil.copy(quantized, out)
    PowerOfTwoScales().transform(str(out), str(path), _settings(method), calib)

    model = onnx.load(str(out))
    inits = _inits(model)
    float_inits = _inits(onnx.load(str(path)))
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert qdq
    for node in qdq:
        scale = inits[node.input[1]].astype(np.float64)
        assert np.all(np.log2(scale) == np.round(np.log2(scale))), node.name
        zero_point = inits[node.input[2]]
        symmetric = {np.int8: 0, np.uint8: 128, np.int16: 0, np.uint16: 32768, np.int32: 0}
        assert np.all(zero_point == symmetric[zero_point.dtype.type]), node.name
        if node.input[0] in inits and zero_point.dtype != np.int32:
            # Weights requantized from the float weights, not from their rounded values.
            original = float_inits[node.input[0].removesuffix("_quantized")].astype(np.float64)
            axis = next((a.i for a in node.attribute if a.name == "axis"), None)
            shaped = scale if scale.size == 1 else scale.reshape(
                [-1 if i == axis else 1 for i in range(original.ndim)])  # fmt: skip
            info = np.iinfo(zero_point.dtype)
            expected = np.clip(np.rint(original / shaped) + zero_point.reshape(shaped.shape),
                               info.min, info.max)  # fmt: skip
            np.testing.assert_array_equal(inits[node.input[0]], expected)
    for node in model.graph.node:  # int32 biases: scale = input scale * weight scale
        if node.op_type in ("Conv", "Gemm") and len(node.input) > 2:
            bias_dq = next(n for n in qdq if n.output[0] == node.input[2])
            input_dq = next(n for n in qdq if n.output[0] == node.input[0])
            weight_dq = next(n for n in qdq if n.output[0] == node.input[1])
            product = inits[input_dq.input[1]] * inits[weight_dq.input[1]]
            np.testing.assert_array_equal(inits[bias_dq.input[1]].ravel(), product.ravel())

    cos_before = _cos(_run(quantized, evaluation), _run(path, evaluation))
    cos_after = _cos(_run(out, evaluation), _run(path, evaluation))
    print(f"{name} {per_channel} {activation.name} {weight.name} {method}: cos {cos_before:.6f} -> "
          f"{cos_after:.6f}")  # fmt: skip
    assert cos_after > 0.9


@pytest.mark.parametrize("name", ["mlp", "conv"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_minmse_weight_error_is_at_most_nonoverflow(models, tmp_path, name, per_channel):
    folder, table = models
    path, calib, _ = table[name]
    quantized = _quantize(folder, name, path, calib, per_channel, QuantType.QUInt8)
    float_inits = _inits(onnx.load(str(path)))
    errors, files = {}, {}
    for method in ("NonOverflow", "MinMSE"):
        files[method] = tmp_path / f"{method}.onnx"
        shutil.copy(quantized, files[method])
        PowerOfTwoScales().transform(str(files[method]), str(path), _settings(method), calib)
        errors[method] = _weight_mse(onnx.load(str(files[method])), float_inits)
    print(f"{name} per_channel={per_channel} weight SSE {errors}")
    assert errors["MinMSE"] <= errors["NonOverflow"]
    assert files["MinMSE"].read_bytes() != files["NonOverflow"].read_bytes()


def test_fused_relu_keeps_its_clamp(models, tmp_path):
    """ONNX Runtime drops a Relu whose output range starts at 0; with the symmetric zero point
    the transform puts one back in front of that QuantizeLinear."""
    folder, table = models
    path, calib, _ = table["conv"]
    quantized = _quantize(folder, "conv", path, calib, False, QuantType.QUInt8)
    out = tmp_path / "p2.onnx"
    shutil.copy(quantized, out)
    assert not [n for n in onnx.load(str(quantized)).graph.node if n.op_type == "Relu"]
    PowerOfTwoScales().transform(str(out), str(path), _settings("NonOverflow"), calib)
    model = onnx.load(str(out))
    relus = [n for n in model.graph.node if n.op_type == "Relu"]
    assert {r.input[0] for r in relus} >= {"a1", "a2"}
    onnx.checker.check_model(model)


def test_qoperator_model_is_refused(models, tmp_path):
    _, table = models
    path, calib, _ = table["mlp"]
    out = tmp_path / "qop.onnx"
    quantize_static(str(path), str(out), calib.reader(), quant_format=QuantFormat.QOperator)
    with pytest.raises(ConfigError, match="QDQ"):
        PowerOfTwoScales().transform(str(out), str(path), _settings("MinMSE"), calib)


@pytest.mark.parametrize("name", ["mlp", "conv"])
def test_trial_runner_minmse(models, tmp_path, name):
    _, table = models
    path, calib, _ = table[name]
    evaluation = DataSource.load(MODELS[name][1](32, seed=9), path, batch_size=16)
    runner = TrialRunner(
        TrialSpec(path, calib, evaluation, Evaluator("cos", 0.9), cache_dir=tmp_path)
    )
    with runner:
        result = runner.run(
            {"calibrate_method": "MinMax", **_settings("MinMSE")}, tmp_path / "t.onnx"
        )
    assert result.status == "ok", result.error
    assert result.metric > 0.9
    inits = _inits(onnx.load(str(tmp_path / "t.onnx")))
    scales = [v for k, v in inits.items() if k.endswith("_scale")]
    assert scales and all(np.all(np.log2(s) == np.round(np.log2(s))) for s in scales)
    print(f"{name} trial MinMSE cos {result.metric:.6f}")
