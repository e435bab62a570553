"""The ``ort`` backend: refusal rules, settings validation with suggestions, option mapping."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from raysearch.cpu import u8s8_saturates
from raysearch.data import DataSource
from raysearch.errors import ConfigError
from raysearch.quantize.backends.ort import (
    REJECT_RULES,
    OrtBackend,
    reject_distribution_few_bins,
    reject_entropy_quantized_bins_over_bins,
    reject_float8_mixed,
    reject_float8_without_distribution,
    reject_int8_activation_uint8_weight,
    reject_qoperator_4bit,
    reject_qoperator_16bit,
    reject_qoperator_float8,
    reject_reason,
    split_extra_options,
)
from tests.models import make_encoder_model, make_mlp_model, mlp_data


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return make_mlp_model(tmp_path_factory.mktemp("ort") / "mlp.onnx")


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return make_encoder_model(tmp_path_factory.mktemp("ort") / "encoder.onnx")


# -- refusal rules --------------------------------------------------------------------------


def test_each_reject_rule():
    assert reject_qoperator_16bit({"quant_format": "QOperator", "activation_type": "QInt16"}) == (
        "QOperator format supports 8-bit types only; QInt16 needs quant_format QDQ"
    )
    assert reject_qoperator_16bit({"activation_type": "QInt16"}) is None  # QDQ is the default
    assert reject_qoperator_4bit({"quant_format": "QOperator", "weight_type": "QInt4"})
    assert reject_qoperator_4bit({"quant_format": "QDQ", "weight_type": "QInt4"}) is None
    both_f8 = {"activation_type": "QFLOAT8E4M3FN", "weight_type": "QFLOAT8E4M3FN"}
    assert reject_qoperator_float8({**both_f8, "quant_format": "QOperator"})
    assert reject_int8_activation_uint8_weight({"weight_type": "QUInt8"}) == (
        "activation_type QInt8 with weight_type QUInt8 is not supported by ONNX Runtime"
    )
    assert (
        reject_int8_activation_uint8_weight({"activation_type": "QUInt8", "weight_type": "QUInt8"})
        is None
    )
    assert reject_float8_mixed({"weight_type": "QFLOAT8E4M3FN"})
    assert reject_float8_mixed(both_f8) is None
    assert reject_float8_without_distribution(both_f8) == (
        "QFLOAT8E4M3FN needs calibrate_method Distribution, got MinMax"
    )
    assert (
        reject_float8_without_distribution({**both_f8, "calibrate_method": "Distribution"}) is None
    )
    assert (
        reject_entropy_quantized_bins_over_bins(
            {"calibrate_method": "Entropy", "extra_options": {"num_quantized_bins": 256}}
        )
        == "Entropy needs num_quantized_bins <= num_bins, got 256 > 128"
    )
    assert reject_entropy_quantized_bins_over_bins({"calibrate_method": "Entropy"}) is None
    assert (
        reject_distribution_few_bins(
            {"calibrate_method": "Distribution", "extra_options": {"num_bins": 128}}
        )
        == "Distribution needs num_bins >= 512, got 128"
    )
    assert reject_distribution_few_bins({"calibrate_method": "Distribution"}) is None
    assert all(rule({}) is None for rule in REJECT_RULES)  # the defaults are valid


def test_rules_accept_flat_points_from_the_space():
    point = {"calibrate_method": "Entropy", "extra_options.num_quantized_bins": 512}
    assert reject_entropy_quantized_bins_over_bins(point)
    assert reject_reason({"quant_format": "QOperator", "weight_type": "QUInt16"})


def test_rejected_settings_fail_fast_in_the_backend(mlp, tmp_path):
    data = DataSource.load(mlp_data(8), mlp)
    with OrtBackend(mlp, data) as backend, pytest.raises(ValueError, match="QOperator format"):
        backend.quantize(
            {"quant_format": "QOperator", "weight_type": "QUInt4"}, tmp_path / "q.onnx"
        )
    assert OrtBackend.reject({"weight_type": "QUInt8"})


# -- validation against the model -----------------------------------------------------------


def test_unknown_op_type_names_the_closest(encoder):
    with pytest.raises(ConfigError) as err:
        OrtBackend.validate({"op_types_to_quantize": ["MatMull", "Softmax"]}, encoder)
    assert (
        str(err.value) == "op_types_to_quantize: unknown op type 'MatMull' (did you mean 'MatMul'?)"
    )
    with pytest.raises(ConfigError) as err:
        OrtBackend.validate({"op_types_to_quantize": ["Matmul", "LayerNorm"]}, encoder)
    assert str(err.value) == (
        "op_types_to_quantize: unknown op types 'Matmul' (did you mean 'MatMul'?), "
        "'LayerNorm' (did you mean 'LayerNormalization'?)"
    )


def test_valid_op_types_absent_from_the_model_are_allowed_unless_none_is_present(mlp):
    OrtBackend.validate({"op_types_to_quantize": ["MatMul", "Gemm", "Conv"]}, mlp)
    with pytest.raises(ConfigError, match=r"none of Gemm, Conv occurs in the model"):
        OrtBackend.validate({"op_types_to_quantize": ["Gemm", "Conv"]}, mlp)


def test_unknown_node_names_name_the_closest(mlp):
    OrtBackend.validate({"nodes_to_exclude": ["fc1"], "nodes_to_quantize": ["fc2"]}, mlp)
    with pytest.raises(ConfigError) as err:
        OrtBackend.validate({"nodes_to_exclude": ["fc_2"]}, mlp)
    assert str(err.value) == (
        "nodes_to_exclude: unknown node 'fc_2' (did you mean 'fc2'?); the model has no node of "
        "that name"
    )
    with pytest.raises(ConfigError, match=r"^nodes_to_quantize: unknown nodes 'relu1' \(did"):
        OrtBackend.validate(
            {"nodes_to_quantize": ["relu1", "nothing_like_it"]}, onnx.load(str(mlp))
        )


def test_unknown_values_are_refused_with_a_suggestion(mlp):
    with pytest.raises(
        ConfigError, match=r"activation_type: unknown value 'QUint8' \(did you mean"
    ):
        OrtBackend.validate({"activation_type": "QUint8"}, mlp)
    with pytest.raises(ConfigError, match=r"calibrate_method: unknown value 'minmax'"):
        OrtBackend.validate({"calibrate_method": "minmax"}, mlp)


# -- option mapping -------------------------------------------------------------------------


def test_extra_options_split_between_calibrator_and_quantizer():
    calibration, quantizer = split_extra_options(
        {
            "CalibPercentile": 99.9,
            "num_bins": 1024,
            "num_quantized_bins": 256,
            "scenario": "p3",
            "CalibTensorRangeSymmetric": True,
            "CalibMovingAverage": True,
            "CalibMovingAverageConstant": 0.1,
            "ActivationSymmetric": True,
            "WeightSymmetric": False,
            "MinimumRealRange": 0.001,
        }
    )
    assert calibration == {
        "percentile": 99.9,
        "num_bins": 1024,
        "num_quantized_bins": 256,
        "scenario": "p3",
        "symmetric": True,
        "moving_average": True,
        "averaging_constant": 0.1,
    }
    assert quantizer == {
        "ActivationSymmetric": True,
        "WeightSymmetric": False,
        "MinimumRealRange": 0.001,
    }


def test_qoperator_format_and_excluded_nodes(mlp, tmp_path):
    data = DataSource.load(mlp_data(16), mlp)
    with OrtBackend(mlp, data) as backend:
        backend.quantize(
            {"quant_format": "QOperator", "activation_type": "QUInt8"}, tmp_path / "qo.onnx"
        )
        backend.quantize(
            {"op_types_to_quantize": ["MatMul"], "nodes_to_exclude": ["fc2"]}, tmp_path / "ex.onnx"
        )
        workdir = backend._workdir
    ops = {n.op_type for n in onnx.load(str(tmp_path / "qo.onnx")).graph.node}
    assert "QLinearMatMul" in ops
    model = onnx.load(str(tmp_path / "ex.onnx"))
    fc2 = next(n for n in model.graph.node if n.name == "fc2")
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    assert all(producers.get(i) != "DequantizeLinear" for i in fc2.input)
    fc1 = next(n for n in model.graph.node if n.name == "fc1")
    assert any(producers.get(i) == "DequantizeLinear" for i in fc1.input)
    assert not os.path.exists(workdir)  # close() removed the temporary copy


def test_constant_node_weights_are_quantized_per_channel_on_an_opset_12_model(tmp_path):
    """Weights held by Constant nodes (as PaddlePaddle exports them) become initializers, so
    they get per-channel int8 scales like any weight; an opset-12 model is raised to 13 for
    per-channel QDQ (quantize_static would write a DequantizeLinear with an axis ONNX Runtime
    refuses below 13)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((8, 4)) * np.array([1, 2, 4, 8])).astype(np.float32)
    nodes = [
        helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(weight, "w")),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    model.ir_version = 8
    path = tmp_path / "const.onnx"
    onnx.save(model, path)
    data = DataSource.load({"x": rng.standard_normal((16, 8)).astype(np.float32)}, path)
    backend = OrtBackend(path, data)
    try:
        settings = {"per_channel": True, "op_types_to_quantize": ["MatMul"]}
        backend.quantize(settings, tmp_path / "q.onnx")
    finally:
        backend.close()
    quantized = onnx.load(tmp_path / "q.onnx")
    assert max(o.version for o in quantized.opset_import if o.domain in ("", "ai.onnx")) >= 13
    inits = {i.name: numpy_helper.to_array(i) for i in quantized.graph.initializer}
    (scale,) = [v for k, v in inits.items() if k.startswith("w") and k.endswith("_scale")]
    assert scale.shape == (4,)  # one scale per output channel of the weight
    x = rng.standard_normal((4, 8)).astype(np.float32)
    # The Q/DQ nodes as ONNX defines them compute the product on every CPU; ONNX Runtime's
    # fused integer kernels do too where u8s8 products do not saturate (x86-64 without VNNI
    # adds them in int16: raysearch.cpu).
    levels = [ort.GraphOptimizationLevel.ORT_DISABLE_ALL]
    if not u8s8_saturates():
        levels.append(ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    for level in levels:
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        session = ort.InferenceSession(
            str(tmp_path / "q.onnx"), options, providers=["CPUExecutionProvider"]
        )
        y = session.run(None, {"x": x})[0]
        np.testing.assert_allclose(y, x @ weight, rtol=0.1, atol=0.5, err_msg=str(level))
