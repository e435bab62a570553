"""SmoothQuant: the float function is kept (folded or with a Mul), the scales follow the
formula from running maxima, per-tensor int8 error drops on outlier channels, and a trial
with ``include_sq`` beats one without."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

import raysearch.quantize.techniques.smooth_quant._smooth_quant  # noqa: F401  (registers the technique)
from raysearch.data import DataSource
from raysearch.errors import ConfigError
from raysearch.evaluate import Evaluator
from raysearch.quantize.techniques.smooth_quant import (
    SmoothQuant,
    smooth_model,
    smooth_options,
    smoothing_scales,
)
from raysearch.trial import TrialRunner, TrialSpec
from tests.models import (
    conv_data,
    encoder_data,
    make_conv_model,
    make_encoder_model,
    make_outlier_model,
    outlier_data,
)

ON = {"include_sq": True}


def _save(nodes, inputs, outputs, inits, path, imports=()):
    graph = helper.make_graph(
        nodes,
        "sq",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()],
    )
    opsets = [helper.make_opsetid("", 17), *imports]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


def _ln_matmul(path, outlier=1.0, dim=16, out=8, seed=0, row=1.0):
    """x -> LayerNormalization (gamma[0] x outlier) -> MatMul (row 0 x row) -> Add bias -> y."""
    rng = np.random.default_rng(seed)
    gamma = rng.uniform(0.5, 1.5, dim)
    gamma[0] *= outlier
    inits = {
        "g": gamma,
        "b": rng.normal(0, 0.1, dim),
        "w": rng.normal(0, 1 / np.sqrt(dim), (dim, out)),
        "bias": rng.normal(0, 0.1, out),
    }
    inits["w"][0] *= row
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1, name="ln"),
        helper.make_node("MatMul", ["ln", "w"], ["h"], name="fc"),
        helper.make_node("Add", ["h", "bias"], ["y"], name="fc_bias"),
    ]
    return _save(nodes, [("x", ["N", dim])], [("y", ["N", out])], inits, path)


def _qkv(path, dim=16, seed=1):
    """x -> LayerNormalization -> q, k, v MatMuls (one shared input) -> q + k + v."""
    rng = np.random.default_rng(seed)
    inits = {"g": rng.uniform(0.5, 2, dim), "b": rng.normal(0, 0.1, dim)}
    inits["g"][3] = 20.0
    for name in ("wq", "wk", "wv"):
        inits[name] = rng.normal(0, 0.3, (dim, dim))
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1, name="ln"),
        *[helper.make_node("MatMul", ["ln", f"w{p}"], [p], name=f"{p}_proj") for p in "qkv"],
        helper.make_node("Add", ["q", "k"], ["qk"], name="add_qk"),
        helper.make_node("Add", ["qk", "v"], ["y"], name="add_v"),
    ]
    return _save(nodes, [("x", ["N", 4, dim])], [("y", ["N", 4, dim])], inits, path)


def _decomposed_ln(path, dim=16, seed=2):
    """LayerNorm from ReduceMean/Sub/Pow/Add/Sqrt/Div, then Mul gamma, Add beta -> Gemm."""
    rng = np.random.default_rng(seed)
    gamma = rng.uniform(0.5, 1.5, dim)
    gamma[5] = 30.0
    inits = {
        "g": gamma,
        "b": rng.normal(0, 0.1, dim),
        "two": np.array(2.0),
        "eps": np.array(1e-5),
        "w": rng.normal(0, 0.3, (8, dim)),
        "c": rng.normal(0, 0.1, 8),
    }
    n = helper.make_node
    nodes = [
        n("ReduceMean", ["x"], ["mean"], axes=[-1], name="mean"),
        n("Sub", ["x", "mean"], ["d"], name="center"),
        n("Pow", ["d", "two"], ["d2"], name="square"),
        n("ReduceMean", ["d2"], ["var"], axes=[-1], name="var"),
        n("Add", ["var", "eps"], ["var_eps"], name="var_eps"),
        n("Sqrt", ["var_eps"], ["std"], name="std"),
        n("Div", ["d", "std"], ["normed"], name="normalize"),
        n("Mul", ["normed", "g"], ["scaled"], name="gamma"),
        n("Add", ["scaled", "b"], ["ln"], name="beta"),
        n("Gemm", ["ln", "w", "c"], ["y"], transB=1, name="fc"),
    ]
    return _save(nodes, [("x", ["N", dim])], [("y", ["N", 8])], inits, path)


def _unknown_shape_chain(path, dim=16, seed=4):
    """``MatMul(tanh(x) * (gelu(x) * gamma) + beta, W)``: a decomposed-LayerNorm-like tail
    whose ``gelu(x) * gamma`` shape inference cannot see (a com.microsoft op before it)."""
    rng = np.random.default_rng(seed)
    gamma = rng.uniform(0.5, 1.5, dim)
    gamma[2] = 40.0
    inits = {"g": gamma, "b": rng.normal(0, 0.1, dim), "w": rng.normal(0, 0.3, (dim, 8))}
    n = helper.make_node
    nodes = [
        n("Tanh", ["x"], ["t"], name="tanh"),
        n("Gelu", ["x"], ["u"], name="gelu", domain="com.microsoft"),
        n("Mul", ["u", "g"], ["ug"], name="gamma"),
        n("Mul", ["t", "ug"], ["scaled"], name="product"),
        n("Add", ["scaled", "b"], ["h"], name="beta"),
        n("MatMul", ["h", "w"], ["y"], name="fc"),
    ]
    imports = [helper.make_opsetid("com.microsoft", 1)]
    return _save(nodes, [("x", ["N", dim])], [("y", ["N", 8])], inits, path, imports)


def _shared_input(path, dim=8, seed=3):
    """x -> Tanh -> t; t feeds a MatMul and an Add (so 1/s cannot be folded)."""
    rng = np.random.default_rng(seed)
    inits = {"w": rng.normal(0, 0.5, (dim, 4)), "c": rng.normal(0, 1, dim)}
    nodes = [
        helper.make_node("Tanh", ["x"], ["t"], name="tanh"),
        helper.make_node("MatMul", ["t", "w"], ["y"], name="fc"),
        helper.make_node("Add", ["t", "c"], ["z"], name="side"),
    ]
    return _save(nodes, [("x", ["N", dim])], [("y", ["N", 4]), ("z", ["N", dim])], inits, path)


def _data(n, dim, seed=0, shape=None, outlier=None):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (n, *(shape or ()), dim)).astype(np.float32)
    if outlier is not None:
        x[..., 0] *= outlier
    return {"x": x}


def _run(model, feed):
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def _smooth(path, data, settings=None, batch_size=8):
    calib = DataSource.load(data, path, batch_size=batch_size)
    model = onnx.load(str(path))
    options = smooth_options({**ON, **(settings or {})})
    counts = smooth_model(model, calib, options)
    onnx.checker.check_model(model)
    return model, counts


def _assert_same_function(path, model, data):
    for before, after in zip(_run(path, data), _run(model, data)):
        scale = max(float(np.abs(before).max()), 1e-12)
        assert float(np.abs(before - after).max()) / scale <= 1e-4


def _init(model, name):
    return numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == name))


def _weight_of(model, node_name):
    node = next(n for n in model.graph.node if n.name == node_name)
    return _init(model, node.input[1])


def test_scales_follow_the_formula_with_guards():
    s = smoothing_scales(np.array([4.0, 0.0, 9.0, 1e12]), np.array([1.0, 2.0, 0.0, 1e-12]), 0.5)
    assert s.tolist() == [2.0, 1.0, 1.0, 1e5]
    assert smoothing_scales(np.array([8.0]), np.array([2.0]), 1.0).tolist() == [8.0]
    assert smoothing_scales(np.array([8.0]), np.array([2.0]), 0.0).tolist() == [0.5]


def test_layernorm_matmul_folds_into_gamma_and_beta(tmp_path):
    path = _ln_matmul(tmp_path / "ln.onnx", outlier=50.0)
    data = _data(40, 16, outlier=3.0)
    model, counts = _smooth(path, data)
    assert counts == {"smoothed": 1, "folded": 1, "inserted": 0, "consumers": 1}
    assert [n.op_type for n in model.graph.node] == ["LayerNormalization", "MatMul", "Add"]
    _assert_same_function(path, model, data)
    # s from running maxima over the batches equals s from all the data at once.
    original = onnx.load(path)
    w, g, b = (_init(original, k) for k in ("w", "g", "b"))
    mean = data["x"].mean(-1, keepdims=True)
    ln = (data["x"] - mean) / np.sqrt(data["x"].var(-1, keepdims=True) + 1e-5) * g + b
    s = smoothing_scales(np.abs(ln).max(0), np.abs(w).max(1), 0.5)
    np.testing.assert_allclose(_weight_of(model, "fc"), s[:, None] * w, rtol=1e-5)
    ln_node = model.graph.node[0]
    np.testing.assert_allclose(_init(model, ln_node.input[1]), g / s, rtol=1e-5)
    np.testing.assert_allclose(_init(model, ln_node.input[2]), b / s, rtol=1e-5, atol=1e-7)
    assert s[0] > 3 * np.median(s)  # the outlier channel moved into the weight


def test_shared_qkv_input_gets_one_scale(tmp_path):
    path = _qkv(tmp_path / "qkv.onnx")
    data = _data(24, 16, shape=(4,), seed=4)
    model, counts = _smooth(path, data)
    assert counts == {"smoothed": 1, "folded": 1, "inserted": 0, "consumers": 3}
    _assert_same_function(path, model, data)
    original = onnx.load(path)
    ratios = [_weight_of(model, f"{p}_proj") / _init(original, f"w{p}") for p in "qkv"]
    for ratio in ratios:  # each row scaled by the same s_j, shared by q, k and v
        np.testing.assert_allclose(ratio, ratios[0], rtol=1e-5)
        np.testing.assert_allclose(ratio, ratio[:, :1].repeat(16, 1), rtol=1e-5)
    m_w = np.max([np.abs(_init(original, f"w{p}")).max(1) for p in "qkv"], axis=0)
    g, b = _init(original, "g"), _init(original, "b")
    x = data["x"]
    ln = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b
    s = smoothing_scales(np.abs(ln).reshape(-1, 16).max(0), m_w, 0.5)
    np.testing.assert_allclose(ratios[0][:, 0], s, rtol=1e-4)


def test_decomposed_layernorm_folds_into_its_mul_and_add(tmp_path):
    path = _decomposed_ln(tmp_path / "dln.onnx")
    data = _data(32, 16, seed=5)
    model, counts = _smooth(path, data)
    assert counts["folded"] == 1 and counts["inserted"] == 0
    assert len(model.graph.node) == 10
    _assert_same_function(path, model, data)
    gamma = _init(model, next(n for n in model.graph.node if n.name == "gamma").input[1])
    assert gamma[5] < 30.0 / 2  # the outlier gamma shrank


def test_fold_through_tensors_of_unknown_shape_probes_them(tmp_path, caplog):
    path = _unknown_shape_chain(tmp_path / "unknown.onnx")
    data = _data(32, 16, seed=7)
    with caplog.at_level(
        logging.DEBUG, logger="raysearch.quantize.techniques.smooth_quant._smooth_quant"
    ):
        model, counts = _smooth(path, data)
    assert "probing the shapes of ['scaled', 'ug']" in caplog.text
    assert counts["folded"] == 1 and counts["inserted"] == 0
    gamma = _init(model, next(n for n in model.graph.node if n.name == "gamma").input[1])
    assert gamma[2] < 40.0 / 2
    _assert_same_function(path, model, data)


def test_a_mul_is_inserted_where_nothing_can_fold(tmp_path):
    path = _shared_input(tmp_path / "shared.onnx")
    data = _data(32, 8, seed=6)
    model, counts = _smooth(path, data)
    assert counts == {"smoothed": 1, "folded": 0, "inserted": 1, "consumers": 1}
    assert [n.op_type for n in model.graph.node] == ["Tanh", "Mul", "MatMul", "Add"]
    _assert_same_function(path, model, data)


def test_folding_off_always_inserts_a_mul(tmp_path):
    path = _ln_matmul(tmp_path / "ln.onnx", outlier=50.0)
    data = _data(40, 16)
    model, counts = _smooth(path, data, {"extra_options": {"SmoothQuantFolding": False}})
    assert counts == {"smoothed": 1, "folded": 0, "inserted": 1, "consumers": 1}
    np.testing.assert_array_equal(_init(model, "g"), _init(onnx.load(path), "g"))
    assert "Mul" in [n.op_type for n in model.graph.node]
    _assert_same_function(path, model, data)


def test_encoder_and_outlier_chain_keep_their_function(tmp_path):
    encoder = make_encoder_model(tmp_path / "enc.onnx")
    data = encoder_data(24)
    model, counts = _smooth(encoder, data)
    assert counts["smoothed"] == 4 and counts["consumers"] == 6 and counts["inserted"] == 0
    _assert_same_function(encoder, model, data)
    chain = make_outlier_model(tmp_path / "chain.onnx")
    data = outlier_data(32)
    model, counts = _smooth(chain, data)
    assert counts["smoothed"] == 8 and counts["inserted"] == 1  # the graph input gets a Mul
    _assert_same_function(chain, model, data)


def test_conv_and_gemm_on_a_cnn_keep_their_function(tmp_path):
    path = make_conv_model(tmp_path / "cnn.onnx")
    data = conv_data(16)
    model, counts = _smooth(path, data, {"extra_options": {"SmoothQuantOpTypes": ["Conv", "Gemm"]}})
    # conv2 folds into conv1 through Relu; conv1 (graph input) and fc (after Flatten) get Muls.
    assert counts == {"smoothed": 3, "folded": 1, "inserted": 2, "consumers": 3}
    _assert_same_function(path, model, data)


def test_op_types_and_per_type_alphas_choose_what_is_smoothed(tmp_path):
    rng = np.random.default_rng(7)
    inits = {"w1": rng.normal(0, 1, (8, 8)), "w2": rng.normal(0, 1, (4, 8))}
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm"),
        helper.make_node("Gemm", ["h", "w2"], ["y"], transB=1, name="gemm"),
    ]
    path = _save(nodes, [("x", ["N", 8])], [("y", ["N", 4])], inits, tmp_path / "mix.onnx")
    data = _data(16, 8, seed=8, outlier=10.0)
    only_gemm, counts = _smooth(path, data, {"extra_options": {"SmoothQuantOpTypes": ["Gemm"]}})
    # Only the Gemm is smoothed (its 1/s folds into the MatMul's columns): no Mul for x.
    assert counts == {"smoothed": 1, "folded": 1, "inserted": 0, "consumers": 1}
    assert [n.op_type for n in only_gemm.graph.node] == ["MatMul", "Gemm"]
    _assert_same_function(path, only_gemm, data)
    base, counts = _smooth(path, data)
    assert counts == {"smoothed": 2, "folded": 1, "inserted": 1, "consumers": 2}
    other, _ = _smooth(path, data, {"extra_options": {"SmoothQuantAlphas": {"Gemm": 0.9}}})
    # The MatMul keeps SmoothAlpha's scales (the Mul on x); the Gemm's take alpha 0.9.
    mul_base, mul_other = (_init(m, m.graph.node[0].input[1]) for m in (base, other))
    np.testing.assert_allclose(mul_base, mul_other, rtol=1e-6)
    assert not np.allclose(_weight_of(base, "gemm"), _weight_of(other, "gemm"))
    _assert_same_function(path, other, data)


def _int8_error(path, data):
    q = str(path) + ".q.onnx"
    calib = DataSource.load(data, path, batch_size=16)
    quantize_static(
        str(path),
        q,
        calib.reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=False,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
    )
    reference = _run(path, data)[0]
    quantized = _run(q, data)[0]
    return float(np.linalg.norm(quantized - reference) / np.linalg.norm(reference))


def test_per_tensor_int8_error_drops_on_an_outlier_channel(tmp_path):
    # The outlier channel's weight row is small, as with LLM outliers: it does not dominate y.
    path = _ln_matmul(tmp_path / "ln.onnx", outlier=100.0, dim=32, out=16, row=0.01)
    data = _data(64, 32, seed=9)
    model, _ = _smooth(path, data, {"extra_options": {"SmoothAlpha": 0.5}})
    smoothed = tmp_path / "ln_sq.onnx"
    onnx.save(model, str(smoothed))
    before, after = _int8_error(path, data), _int8_error(smoothed, data)
    print(f"int8 relative error: without {before:.4f}, with SmoothQuant {after:.4f}")
    assert after * 5 <= before


def test_effect_key_and_settings():
    technique = SmoothQuant()
    assert technique.effect_key({}) is None
    assert technique.effect_key({"include_sq": False, "extra_options": {"SmoothAlpha": 1}}) is None
    keys = {
        technique.effect_key({**ON, "extra_options": extra})
        for extra in ({}, {"SmoothAlpha": 0.5}, {"SmoothQuantOpTypes": ["Gemm", "MatMul"]})
    }
    assert len(keys) == 1  # defaults filled in
    assert technique.effect_key({**ON, "extra_options": {"SmoothAlpha": 0.7}}) not in keys
    per_type = {**ON, "extra_options": {"SmoothQuantAlphas": {"Gemm": 0.6}}}
    assert technique.effect_key(per_type) not in keys
    folding = {**ON, "extra_options": {"SmoothQuantFolding": False}}
    assert technique.effect_key(folding) not in keys
    assert technique.effect_key({**ON, "extra_options": {"SmoothQuantOpTypes": []}}) is None
    with pytest.raises(ConfigError):
        smooth_options({**ON, "extra_options": {"SmoothAlpha": 1.5}})
    with pytest.raises(ConfigError):
        smooth_options({**ON, "extra_options": {"SmoothQuantOpTypes": ["Relu"]}})
    specs = SmoothQuant.containers["extra_options"]
    assert all(spec.requires == "include_sq" for spec in specs.values())


def test_trial_with_smooth_quant_beats_the_trial_without(tmp_path):
    path = make_outlier_model(tmp_path / "chain.onnx")
    calib = DataSource.load(outlier_data(64, seed=6), path, batch_size=16)
    evaluation = DataSource.load(outlier_data(48, seed=7), path, batch_size=16)
    runner = TrialRunner(
        TrialSpec(
            path,
            calib,
            evaluation,
            Evaluator("cos", 0.9),
            cache_dir=tmp_path,
            measure_latency=False,
        )
    )
    with runner:
        plain = runner.run({"calibrate_method": "MinMax"}, tmp_path / "plain.onnx")
        smooth = runner.run(
            {"calibrate_method": "MinMax", **ON, "extra_options": {"SmoothAlpha": 0.5}},
            tmp_path / "sq.onnx",
        )
    assert plain.status == "ok" and smooth.status == "ok", (plain.error, smooth.error)
    print(f"cos: without {plain.metric:.5f}, with SmoothQuant {smooth.metric:.5f}")
    assert smooth.metric > plain.metric
    assert 1 - smooth.metric < (1 - plain.metric) / 2
