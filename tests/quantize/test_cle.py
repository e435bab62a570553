"""Cross-layer equalization: the float function is kept on every pattern it rewrites, the
ranges balance, patterns it must not cross are left alone, every setting changes the result,
and per-tensor int8 quantization of a model with channels 1000x apart improves (directly with
ONNX Runtime's quantizer, and through a TrialRunner)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

from raysearch.data import ArrayDataReader, DataSource
from raysearch.evaluate import Evaluator
from raysearch.quantize.technique import get_technique
from raysearch.quantize.techniques.cle._cle import (
    CLEOptions,
    CrossLayerEqualization,
    channel_ranges,
    equalization_scales,
    equalize_model,
)
from raysearch.quantize.techniques.cle._graph import find_pairs
from raysearch.trial import TrialRunner, TrialSpec

# Channel spreads for planted models: 1000x between the smallest and the largest.
SPREAD = np.logspace(-1.5, 1.5, 16)


def _model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        # Every model here keeps its input's rank.
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * len(inputs[0][1]))
            for n in outputs
        ],
        [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _normal(rng, *shape, scale=1.0):
    return rng.normal(0, scale, shape)


def conv_pair(act="Relu", spread=None, groups=1, act_inputs=(), seed=0, **act_attrs):
    """Conv(4 -> 16, 3x3, bias) -> act -> Conv(16 -> 8, 3x3, group=groups): with ``spread``,
    head channel i is multiplied by spread[i] and tail input channel i divided by it (the
    same function with badly unequal channel ranges)."""
    rng = np.random.default_rng(seed)
    k1, c1 = _normal(rng, 16, 4, 3, 3, scale=0.5), _normal(rng, 16, scale=0.2)
    k2 = _normal(rng, 16 if groups == 16 else 8, 16 // groups, 3, 3, scale=0.3)
    if spread is not None:
        k1, c1 = k1 * spread[:, None, None, None], c1 * spread
        per_in = np.repeat((1 / spread).reshape(groups, -1), k2.shape[0] // groups, axis=0)
        k2 = k2 * per_in[:, :, None, None]
    nodes = [helper.make_node("Conv", ["x", "k1", "c1"], ["h"], pads=[1, 1, 1, 1], name="c1")]
    mid = "h"
    if act:
        nodes.append(helper.make_node(act, ["h", *act_inputs], ["a"], name="act", **act_attrs))
        mid = "a"
    nodes.append(
        helper.make_node("Conv", [mid, "k2"], ["y"], pads=[1, 1, 1, 1], group=groups, name="c2")
    )
    inits = {"k1": k1, "c1": c1, "k2": k2, "lo": 0.0, "hi": 6.0}
    inits = {k: v for k, v in inits.items() if k in {i for n in nodes for i in n.input}}
    return _model(nodes, [("x", ["N", 4, 8, 8])], ["y"], inits)


def conv_chain(seed=0):
    """conv-relu-conv-relu-conv, channels 3 -> 8 -> 8 -> 4, unequal ranges everywhere."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], {}, "x"
    shapes = [(8, 3), (8, 8), (4, 8)]
    for i, (out, inp) in enumerate(shapes):
        inits[f"k{i}"] = _normal(rng, out, inp, 3, 3) * rng.uniform(0.01, 3, (out, 1, 1, 1))
        inits[f"b{i}"] = _normal(rng, out, scale=2.0)  # large enough to count in a range
        nodes.append(
            helper.make_node("Conv", [prev, f"k{i}", f"b{i}"], [f"h{i}"], pads=[1, 1, 1, 1])
        )
        prev = f"h{i}"
        if i < len(shapes) - 1:
            nodes.append(helper.make_node("Relu", [prev], [f"a{i}"]))
            prev = f"a{i}"
    nodes[-1].output[0] = "y"
    return _model(nodes, [("x", ["N", 3, 8, 8])], ["y"], inits)


def dense_chain(seed=0):
    """Gemm(transB=1, bias) -> Relu -> MatMul + Add -> Relu -> Gemm(transB=0)."""
    rng = np.random.default_rng(seed)
    w1 = _normal(rng, 16, 6) * SPREAD[:, None]
    w2 = _normal(rng, 16, 12) / SPREAD[:, None]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], transB=1),
        helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node("MatMul", ["a1", "w2"], ["m2"]),
        helper.make_node("Add", ["b2", "m2"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["a2"]),
        helper.make_node("Gemm", ["a2", "w3", "b3"], ["y"]),
    ]
    inits = {"w1": w1, "b1": _normal(rng, 16) * SPREAD, "w2": w2, "b2": _normal(rng, 1, 12)}
    inits.update(w3=_normal(rng, 12, 5), b3=_normal(rng, 5))
    return _model(nodes, [("x", ["N", 6])], ["y"], inits)


def _feed(model, n=8, seed=1):
    shape = [n, *(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:])]
    return {"x": np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)}


def _run(model, feed):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


def _equalized(model, **options):
    out = onnx.ModelProto()
    out.CopyFrom(model)
    report = equalize_model(out, CLEOptions(**options))
    return out, report


def _weights(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _assert_same_function(model, equalized):
    feed = _feed(model)
    before, after = _run(model, feed), _run(equalized, feed)
    assert np.abs(after - before).max() <= 1e-4 * np.abs(before).max()


@pytest.mark.parametrize(
    "build, pairs",
    [
        (lambda: conv_pair("Relu", SPREAD), 1),
        (lambda: conv_pair(None, SPREAD), 1),
        (lambda: conv_pair("LeakyRelu", SPREAD), 1),
        (lambda: conv_pair("MaxPool", SPREAD, kernel_shape=[2, 2], pads=[0, 0, 1, 1]), 1),
        (conv_chain, 2),
        (dense_chain, 2),
        (lambda: conv_pair("Relu", SPREAD, groups=16), 1),  # depthwise tail
        (lambda: conv_pair("Relu", SPREAD, groups=4), 1),  # grouped tail
    ],
)
def test_float_outputs_are_unchanged(build, pairs):
    model = build()
    equalized, report = _equalized(model, steps=3, weight_threshold=0.0)
    assert report["pairs"] == pairs
    _assert_same_function(model, equalized)
    assert _weights(equalized).keys() == _weights(model).keys()
    assert any(not np.allclose(_weights(equalized)[n], w) for n, w in _weights(model).items())


def test_ranges_become_the_geometric_mean():
    model = conv_pair("Relu", SPREAD)
    equalized, _ = _equalized(model, append_bias=False, weight_threshold=0.0)
    head, tail = find_pairs(model)[0]
    before, after = _weights(model), _weights(equalized)
    r1 = channel_ranges(head.out_rows(before["k1"]))
    r2 = channel_ranges(tail.in_rows(before["k2"]))
    np.testing.assert_allclose(channel_ranges(head.out_rows(after["k1"])), np.sqrt(r1 * r2), 1e-5)
    np.testing.assert_allclose(channel_ranges(tail.in_rows(after["k2"])), np.sqrt(r1 * r2), 1e-5)
    # The planted 1000x spread of the head's channel ranges is gone.
    assert r1.max() / r1.min() > 300
    equal = channel_ranges(head.out_rows(after["k1"]))
    assert equal.max() / equal.min() < 0.1 * r1.max() / r1.min()


def test_scales_math():
    head = np.array([[4.0, -2.0], [0.0, 0.0], [0.1, 0.0]])
    tail = np.array([[1.0], [3.0], [0.1]])
    np.testing.assert_allclose(equalization_scales(head, tail), [2.0, 1.0, 1.0])
    assert equalization_scales(head, tail, weight_threshold=0.5)[2] == 1.0
    np.testing.assert_allclose(
        equalization_scales(head, tail, balance_method="avg"), [3**0.5, 1, 1 / 2**0.5]
    )


@pytest.mark.parametrize(
    "act, inputs",
    [("Clip", ("lo", "hi")), ("Sigmoid", ())],
)
def test_non_homogeneous_ops_are_not_crossed(act, inputs):
    model = conv_pair(act, SPREAD, act_inputs=inputs)
    equalized, report = _equalized(model)
    assert report["pairs"] == 0
    assert all(np.array_equal(_weights(equalized)[n], w) for n, w in _weights(model).items())


def test_clip_without_max_is_crossed():
    model = conv_pair("Clip", SPREAD, act_inputs=("lo",))
    equalized, report = _equalized(model)
    assert report["pairs"] == 1
    _assert_same_function(model, equalized)


def test_shared_intermediate_or_weight_is_left_alone():
    model = conv_pair("Relu", SPREAD)
    model.graph.output.append(helper.make_tensor_value_info("a", TensorProto.FLOAT, None))
    assert find_pairs(model) == []
    model = conv_pair("Relu", SPREAD)  # the tail's weight read by another node too
    model.graph.node.append(helper.make_node("Identity", ["k2"], ["k2_copy"]))
    model.graph.output.append(helper.make_tensor_value_info("k2_copy", TensorProto.FLOAT, None))
    assert find_pairs(model) == []


def _differs(model, **options):
    base = _weights(_equalized(model)[0])
    other = _weights(_equalized(model, **options)[0])
    return any(not np.allclose(other[n], base[n], rtol=1e-6) for n in base)


def test_every_setting_changes_the_result():
    model = conv_chain()
    assert _differs(model, steps=2)
    assert _differs(model, append_bias=False)
    assert _differs(model, balance_method="avg")
    # Small weights: every channel's r1 + r2 is below Quark's 0.5, so the default leaves them.
    small = conv_pair("Relu", SPREAD)
    for tensor in small.graph.initializer:
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) * 0.01, tensor.name))
    untouched = _weights(_equalized(small)[0])
    assert all(np.array_equal(untouched[n], w) for n, w in _weights(small).items())
    assert _differs(small, use_threshold=False)
    assert _differs(small, weight_threshold=0.01)
    base = _weights(_equalized(model)[0])
    # The stop threshold acts between passes: huge, the second pass never runs.
    stopped = _weights(_equalized(model, steps=4, diff_threshold=1e9)[0])
    assert all(np.array_equal(stopped[n], base[n]) for n in base)
    assert any(
        not np.allclose(stopped[n], _weights(_equalized(model, steps=4)[0])[n]) for n in base
    )


def test_effect_key():
    cle = CrossLayerEqualization()
    assert cle.effect_key({}) is None
    assert cle.effect_key({"include_cle": False, "extra_options": {"CLESteps": 3}}) is None
    on = cle.effect_key({"include_cle": True})
    assert on is not None
    steps = [{"include_cle": True, "extra_options": {"CLESteps": s}} for s in (1, 2, 3)]
    assert cle.effect_key(steps[0]) == on
    assert len({cle.effect_key(s) for s in steps}) == 3
    assert cle.effect_key({"include_cle": True, "extra_options": {"CLEBalanceMethod": "avg"}}) != on
    # Thresholds that cannot act do not split the key.
    idle = {"CLETotalLayerDiffThreshold": 1.0, "CLEWeightThreshold": 9.0}
    off = {"include_cle": True, "extra_options": {"CLEScaleUseThreshold": False}}
    assert cle.effect_key(off) == cle.effect_key(
        {**off, "extra_options": {**off["extra_options"], **idle}}
    )
    assert (
        cle.effect_key({"include_cle": True, "extra_options": {"CLETotalLayerDiffThreshold": 1.0}})
        == on
    )
    assert get_technique("cle") is CrossLayerEqualization
    specs = CrossLayerEqualization.containers["extra_options"]
    assert all(spec.requires == "include_cle" for spec in specs.values())


def _int8_mse(path, tmp_path, calib, evaluation):
    out = tmp_path / f"{path.stem}.q.onnx"
    quantize_static(
        str(path),
        str(out),
        ArrayDataReader(DataSource.load(calib, str(path), batch_size=16)),
        quant_format=QuantFormat.QDQ,
        per_channel=False,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
    )
    reference = _run(onnx.load(str(path)), evaluation)
    return float(np.mean((_run(onnx.load(str(out)), evaluation) - reference) ** 2))


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cle")
    model = conv_pair("Relu", SPREAD)
    path = folder / "planted.onnx"
    onnx.save(model, str(path))
    return path, _feed(model, 32, seed=3), _feed(model, 32, seed=4)


def test_per_tensor_int8_error_drops(planted, tmp_path):
    path, calib, evaluation = planted
    cle_path = tmp_path / "planted_cle.onnx"
    CrossLayerEqualization().transform(str(path), str(cle_path), {"include_cle": True}, None)
    _assert_same_function(onnx.load(str(path)), onnx.load(str(cle_path)))
    before = _int8_mse(path, tmp_path, calib, evaluation)
    after = _int8_mse(cle_path, tmp_path, calib, evaluation)
    print(f"per-tensor int8 MSE: {before:.4g} -> {after:.4g} ({before / after:.1f}x lower)")
    assert after * 5 <= before


def test_trial_with_cle_is_ok_and_better(planted, tmp_path):
    path, calib, evaluation = planted
    runner = TrialRunner(
        TrialSpec(
            path,
            DataSource.load(calib, path, batch_size=16),
            DataSource.load(evaluation, path, batch_size=16),
            Evaluator("cos", 0.9),
            cache_dir=tmp_path,
            measure_latency=False,
        )
    )
    base = {"calibrate_method": "MinMax", "per_channel": False}
    with runner:
        without = runner.run(base, tmp_path / "without.onnx")
        with_cle = runner.run(
            {**base, "include_cle": True, "extra_options": {"CLESteps": 2}},
            tmp_path / "with.onnx",
        )
    assert without.status == "ok" and with_cle.status == "ok", with_cle.error
    print(f"trial cos: without CLE {without.metric:.5f}, with CLE {with_cle.metric:.5f}")
    assert with_cle.metric > without.metric
    assert 1 - with_cle.metric < 0.5 * (1 - without.metric)
