"""The ``nncf_weight_only`` backend (NNCF's ``compress_weights``, real NNCF and ONNX Runtime):
each setting changes the written model as it says (mode -> bits and ops, group_size -> block,
ratio -> share of 4-bit weights, backup mode, embeddings, float nodes, the data-aware
algorithms), the written model computes what it should (the bias once, int4_asym's zero
points as NNCF meant them), the refusals' one line, and a search of the tiny decoder."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from raysearch.errors import ConfigError
from raysearch.quantize.registry import backend_reject, get_backend
from raysearch.space import SearchSpace
from tests.lm_models import decoder_lm_data, make_decoder_lm
from tests.quantize.test_weight_only_backend import _attr, _nbits, _quantize

pytest.importorskip("nncf")

from raysearch.data import DataSource  # noqa: E402
from raysearch.quantize.backends.nncf_weight_only import NncfWeightOnlyBackend  # noqa: E402

HEAD = "/lm_head/MatMul"
EMBED = "/embed/Gather"
#: Each block's weights at 4 bits, lm_head (the last MatMul) not among them by default.
BLOCK_MATMULS = 14


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return make_decoder_lm(tmp_path_factory.mktemp("nwo") / "lm.onnx")


@pytest.fixture(scope="module")
def feeds():
    return decoder_lm_data(8, 12)


@pytest.fixture(scope="module")
def backend(lm, feeds):
    with NncfWeightOnlyBackend(lm, DataSource.load(feeds, lm)) as b:
        yield b


def _dequantized(model):
    """The names of the initializers a DequantizeLinear reads, with its data type."""
    inits = {t.name: t for t in model.graph.initializer}
    return {
        n.input[0]: inits[n.input[0]].data_type
        for n in model.graph.node
        if n.op_type == "DequantizeLinear"
    }


def _run(path, feeds, outputs=("logits",)):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(list(outputs), feeds)


def _rows(lm):
    model = onnx.load(lm)
    inits = {t.name: t for t in model.graph.initializer}
    return {
        n.name: int(np.prod(inits[n.input[1]].dims))
        for n in model.graph.node
        if n.op_type == "MatMul" and n.input[1] in inits
    }


def test_registered_and_nncf_default_is_8_bit_asymmetric_per_channel(backend, tmp_path):
    assert get_backend("nncf_weight_only") is NncfWeightOnlyBackend
    model, info, _ = _quantize(backend, {}, tmp_path)
    assert not _nbits(model)
    kinds = set(_dequantized(model).values())
    assert kinds == {TensorProto.UINT8}  # int8_asym: every weight and both embeddings
    assert len(_dequantized(model)) == 15 + 2
    assert info.quantized_share == pytest.approx(15 / 19)
    model, _, _ = _quantize(backend, {"mode": "int8_sym"}, tmp_path)
    assert set(_dequantized(model).values()) == {TensorProto.INT8}
    assert all(len(n.input) == 2 for n in model.graph.node if n.op_type == "DequantizeLinear")


@pytest.mark.parametrize("mode", ["int4_sym", "int4_asym"])
def test_a_4_bit_mode_writes_matmul_nbits_with_an_8_bit_backup(backend, tmp_path, feeds, mode):
    model, _, path = _quantize(backend, {"mode": mode, "group_size": 32}, tmp_path)
    nodes = _nbits(model)
    assert len(nodes) == BLOCK_MATMULS and not any(HEAD in n for n in nodes)
    assert {_attr(n, "bits") for n in nodes.values()} == {4}
    # symmetric: no zero point; asymmetric: a packed zero-point input
    with_zero_point = {len(n.input) >= 4 and bool(n.input[3]) for n in nodes.values()}
    assert with_zero_point == {mode == "int4_asym"}
    # lm_head and the two embeddings stay at NNCF's backup precision, int8 asymmetric
    assert list(_dequantized(model).values()) == [TensorProto.UINT8] * 3
    (logits,) = _run(path, feeds)
    assert np.isfinite(logits).all()


def test_group_size_is_the_matmul_nbits_block(backend, tmp_path):
    for group in (16, 64):
        model, _, _ = _quantize(backend, {"mode": "int4_sym", "group_size": group}, tmp_path)
        assert {_attr(n, "block_size") for n in _nbits(model).values()} == {group}


def test_ratio_is_the_share_of_the_ratio_defining_weights_at_4_bits(backend, lm, tmp_path):
    sizes = {k: v for k, v in _rows(lm).items() if k != HEAD}
    total = sum(sizes.values())
    model, _, _ = _quantize(backend, {"mode": "int4_sym", "group_size": 32, "ratio": 0.5}, tmp_path)
    four = [name.removesuffix("_compressed_matmul") for name in _nbits(model)]
    assert 0 < len(four) < BLOCK_MATMULS
    share = sum(sizes[n] for n in four) / total
    assert abs(share - 0.5) <= max(sizes.values()) / total
    # the rest of them at the backup precision: 8 bits in DequantizeLinear
    assert len(_dequantized(model)) == BLOCK_MATMULS - len(four) + 3


def test_backup_mode_none_keeps_the_other_weights_float(backend, tmp_path):
    settings = {"mode": "int4_sym", "group_size": 32, "backup_mode": "none"}
    model, _, _ = _quantize(backend, settings, tmp_path)
    assert len(_nbits(model)) == BLOCK_MATMULS and not _dequantized(model)
    settings["backup_mode"] = "int8_sym"
    model, _, _ = _quantize(backend, settings, tmp_path)
    assert set(_dequantized(model).values()) == {TensorProto.INT8}


def test_all_layers_puts_lm_head_at_4_bits_and_embeddings_stay_float_when_asked(
    backend, tmp_path, feeds
):
    settings = {"mode": "int4_sym", "group_size": 32, "all_layers": True}
    assert backend_reject({"quantizer": "nncf_weight_only", **settings}) == (
        "all_layers needs quantize_embeddings: false: NNCF 3.4 writes a 4-bit embedding Gather "
        "as a MatMulNBits reading the int64 token ids, which ONNX Runtime refuses"
    )
    model, _, path = _quantize(backend, {**settings, "quantize_embeddings": False}, tmp_path)
    assert len(_nbits(model)) == BLOCK_MATMULS + 1 and f"{HEAD}_compressed_matmul" in _nbits(model)
    gathers = [n for n in model.graph.node if n.op_type == "Gather" and "embed" in n.name]
    inits = {t.name for t in model.graph.initializer}
    assert len(gathers) == 2 and all(g.input[0] in inits for g in gathers)  # float tables
    assert np.isfinite(_run(path, feeds)[0]).all()


def test_nodes_float_and_quantize_embeddings_false_keep_nodes_float(backend, tmp_path):
    gate = "/layers.0/mlp/gate_proj/MatMul"
    settings = {"mode": "int4_sym", "group_size": 32, "nodes_float": [gate]}
    model, _, _ = _quantize(backend, {**settings, "quantize_embeddings": False}, tmp_path)
    assert len(_nbits(model)) == BLOCK_MATMULS - 1 and f"{gate}_compressed_matmul" not in _nbits(
        model
    )
    assert any(n.name == gate and n.op_type == "MatMul" for n in model.graph.node)
    assert len(_dequantized(model)) == 1  # lm_head only: no embedding table dequantized


def test_sensitivity_metric_of_activations_reads_the_data_and_picks_other_layers(backend, tmp_path):
    base = {"mode": "int4_sym", "group_size": 32, "ratio": 0.5}
    chosen, data_s = {}, {}
    for metric in ("weight_quantization_error", "hessian_input_activation"):
        model, info, _ = _quantize(backend, {**base, "sensitivity_metric": metric}, tmp_path)
        chosen[metric], data_s[metric] = set(_nbits(model)), info.calibration_s
    assert chosen["weight_quantization_error"] != chosen["hessian_input_activation"]
    assert data_s["weight_quantization_error"] == 0.0 < data_s["hessian_input_activation"]


def _initializers(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_awq_and_scale_estimation_change_the_weights_written(backend, tmp_path):
    base = {"mode": "int4_sym", "group_size": 32}
    plain, _, _ = _quantize(backend, base, tmp_path, "plain.onnx")
    before = _initializers(plain)

    def changed(model):
        after = _initializers(model)
        assert set(after) == set(before)
        return {k for k in before if not np.array_equal(before[k], after[k])}

    awq, info, _ = _quantize(backend, {**base, "awq": True}, tmp_path, "awq.onnx")
    assert info.calibration_s > 0
    # AWQ's pattern in SwiGLU: up_proj -> Mul -> down_proj; its scale moves from down's
    # weights into up's, every other layer as without it
    assert changed(awq) == {
        f"/layers.{i}/mlp.{w}" for i in (0, 1) for w in ("up.weight_scale", "down.weight_quantized")
    } | {f"/layers.{i}/mlp.down.weight_scale" for i in (0, 1)}
    estimated, _, _ = _quantize(backend, {**base, "scale_estimation": True}, tmp_path, "se.onnx")
    assert any(k.endswith("_scale") for k in changed(estimated))


def _biased_model(path, k=64, n=48, seed=0):
    """x -> MatMul(W1) + b1 = h -> MatMul(W2) + b2 = y, opset 17 (as PyTorch exports a
    Linear), biases far larger than the weights; ``h`` is an output too."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 1 / np.sqrt(k), (k, n)).astype(np.float32)
    w2 = rng.normal(0, 1 / np.sqrt(n), (n, k)).astype(np.float32)
    b1 = rng.uniform(2, 4, n).astype(np.float32)
    b2 = rng.uniform(2, 4, k).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="fc1/MatMul"),
        helper.make_node("Add", ["b1", "m1"], ["h"], name="fc1/Add"),
        helper.make_node("MatMul", ["h", "w2"], ["m2"], name="fc2/MatMul"),
        helper.make_node("Add", ["b2", "m2"], ["y"], name="fc2/Add"),
    ]
    inits = [numpy_helper.from_array(a, name) for a, name in ((w1, "w1"), (b1, "b1"))]
    inits += [numpy_helper.from_array(a, name) for a, name in ((w2, "w2"), (b2, "b2"))]
    graph = helper.make_graph(
        nodes,
        "biased",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", k])],
        [
            helper.make_tensor_value_info("h", TensorProto.FLOAT, ["batch", n]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", k]),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return w1, b1


@pytest.mark.parametrize("mode", ["int4_sym", "int4_asym"])
def test_the_model_written_computes_the_bias_once_and_the_weights_nncf_meant(tmp_path, mode):
    """NNCF 3.4 folds a MatMul's bias into MatMulNBits and keeps the Add (the bias twice), and
    writes int4_asym's zero points one per byte (ONNX Runtime refuses them): the backend's
    repair. Fed the identity, the first layer gives its dequantized weight plus the bias:
    less the bias, each weight is within a quantization step of the float one."""
    w1, b1 = _biased_model(tmp_path / "biased.onnx")
    k, group = w1.shape[0], 16
    settings = {"mode": mode, "group_size": group, "all_layers": True}
    settings["quantize_embeddings"] = False
    with NncfWeightOnlyBackend(tmp_path / "biased.onnx", None) as backend:
        info = backend.quantize(settings, tmp_path / "q.onnx")
    model = onnx.load(tmp_path / "q.onnx")
    assert len(_nbits(model)) == 2
    assert info.extra["biases_dropped"] == 2
    assert info.extra["zero_points_packed"] == (2 if mode == "int4_asym" else 0)
    h, _ = _run(tmp_path / "q.onnx", {"x": np.eye(k, dtype=np.float32)}, ("h", "y"))
    blocks = w1.reshape(k // group, group, -1)
    if mode == "int4_sym":
        step = np.abs(blocks).max(axis=1) / 7
    else:
        step = (blocks.max(axis=1) - blocks.min(axis=1)) / 15
    error = np.abs((h - b1) - w1).reshape(k // group, group, -1).max(axis=1)
    assert (error <= step * 1.001 + 1e-6).all()
    assert np.abs((h - b1) - w1).max() < 0.1 * b1.min()  # not the bias again


def test_a_value_info_that_contradicts_its_initializer_is_dropped_for_nncf(tmp_path):
    """onnxruntime-genai's builder declares its constant ``[1]`` a scalar in the value infos
    (bytellama's ``genai/model.onnx``); NNCF's shape inference refuses such a model ("differ in
    rank: (1) vs (0)"), so every setting failed on a builder's folder. The declaration is
    dropped (the initializer's own shape stands), and the model is compressed as without it."""
    _biased_model(tmp_path / "biased.onnx")
    model = onnx.load(tmp_path / "biased.onnx")
    model.graph.value_info.append(helper.make_tensor_value_info("b1", TensorProto.FLOAT, []))
    onnx.save(model, str(tmp_path / "declared.onnx"))
    settings = {"mode": "int4_sym", "group_size": 16}
    outputs = {}
    for name in ("biased", "declared"):
        with NncfWeightOnlyBackend(tmp_path / f"{name}.onnx", None) as backend:
            backend.quantize(settings, tmp_path / f"q_{name}.onnx")
        feeds = {"x": np.eye(64, dtype=np.float32)}
        outputs[name] = _run(tmp_path / f"q_{name}.onnx", feeds, ("y",))[0]
    np.testing.assert_array_equal(outputs["declared"], outputs["biased"])
    assert onnx.load(tmp_path / "declared.onnx").graph.value_info[0].name == "b1"  # left alone


def test_a_model_with_external_data_is_written_with_its_data_and_computes_the_same(
    backend, lm, tmp_path, feeds
):
    """NNCF reads the weights from the float model's folder; the written model keeps its own
    ``.data`` file beside it, runs after it is moved, and gives the logits of the same
    setting on the same model in one file (the data-aware AWQ too)."""
    import shutil

    external = tmp_path / "ext" / "lm.onnx"
    external.parent.mkdir()
    onnx.save_model(onnx.load(lm), str(external), save_as_external_data=True)  # weights >= 1 KB
    assert len(list(external.parent.iterdir())) == 2
    settings = {"mode": "int4_asym", "group_size": 32, "awq": True}
    _, _, single = _quantize(backend, settings, tmp_path, "single.onnx")
    with NncfWeightOnlyBackend(external, DataSource.load(feeds, external)) as ext_backend:
        ext_backend.quantize(settings, tmp_path / "out" / "q.onnx")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["q.onnx", "q.onnx.data"]
    shutil.move(tmp_path / "out", tmp_path / "moved")
    (moved,) = _run(tmp_path / "moved" / "q.onnx", feeds)
    (expected,) = _run(single, feeds)
    np.testing.assert_allclose(moved, expected, rtol=1e-5, atol=1e-5)


def test_refusals_are_one_line_before_anything_runs(lm):
    def refused(**settings):
        return backend_reject({"quantizer": "nncf_weight_only", **settings})

    assert refused(gptq=True) == (
        "gptq is refused: NNCF 3.4's compress_weights runs it on OpenVINO and PyTorch models "
        "only, not on ONNX"
    )
    assert refused(mode="int4_sym", lora_correction=True).startswith("lora_correction is refused")
    assert refused(ratio=0.8, group_size=32) == (
        "mode int8_asym compresses every weight per output channel at 8 bits: group_size, "
        "ratio apply to the 4-bit modes only (NNCF refuses them)"
    )
    assert refused(mode="int4_sym", group_size=48) == (
        "group_size 48: MatMulNBits needs a power of two from 16 to 256"
    )
    assert refused(mode="int4_sym", sensitivity_metric="hessian_input_activation") == (
        "sensitivity_metric chooses the layers ratio keeps at 4 bits: with ratio 1 (every one "
        "at 4 bits) it changes nothing; set ratio below 1"
    )
    assert refused(mode="int4_asym", group_size=32, ratio=0.9) is None
    # On the model: the tiny decoder's 64-row weights and NNCF's default group of 128.
    model = onnx.load(lm)
    inits = {t.name: t for t in model.graph.initializer}
    weights = {
        n.name: tuple(inits[n.input[1]].dims)
        for n in model.graph.node
        if n.op_type == "MatMul" and n.input[1] in inits
    }
    settings = {"quantizer": "nncf_weight_only", "mode": "int4_sym"}
    assert backend_reject(settings, weights) == (
        "group_size 128 does not divide the 64 rows of node /layers.0/attn/q_proj/MatMul: NNCF "
        "refuses it (set a smaller group_size, or group_size_fallback_mode ignore or adjust)"
    )
    assert backend_reject({**settings, "group_size_fallback_mode": "ignore"}, weights) is None
    with pytest.raises(ConfigError) as info:
        NncfWeightOnlyBackend.validate({"nodes_float": ["/lm_head/MatMull"]}, lm)
    assert str(info.value) == (
        "nodes_float: not a weight MatMul or embedding Gather of the model: "
        "'/lm_head/MatMull' (did you mean '/lm_head/MatMul'?)"
    )


def test_a_grid_drops_the_4_bit_keys_of_an_8_bit_mode():
    space = SearchSpace.parse(
        {
            "quantizer": ["nncf_weight_only"],
            "mode": ["int8_asym", "int4_sym"],
            "group_size": [16, 32],
            "ratio": [0.8, 1.0],
            "sensitivity_metric": ["hessian_input_activation"],
        }
    )
    settings = [space.to_settings(p) for p in space.expand().points]
    eight = [s for s in settings if s["mode"] == "int8_asym"]
    assert eight == [{"quantizer": "nncf_weight_only", "mode": "int8_asym"}]
    four = [s for s in settings if s["mode"] == "int4_sym"]
    assert len(four) == 4
    assert all(("sensitivity_metric" in s) == (s["ratio"] < 1) for s in four)
    assert all(backend_reject(s) is None for s in settings)


@pytest.mark.slow
def test_a_kl_search_of_the_tiny_decoder_with_nncf_weight_only(ray_cluster, lm, tmp_path):
    import pyarrow.parquet as pq

    from raysearch import AutoSearch, SearchConfig

    ids = np.random.default_rng(6).zipf(1.5, (8, 12)).clip(1, 95).astype(np.int64)
    np.savez(tmp_path / "text.npz", input_ids=ids)
    config = SearchConfig.from_dict(
        {
            "model": str(lm),
            "calibration_data": str(tmp_path / "text.npz"),
            "batch_size": 4,
            "search_space": {
                "quantizer": ["nncf_weight_only"],
                "mode": ["int4_sym", "int4_asym"],
                "group_size": [16, 32],
            },
            "search_algo": "Grid",
            "metric": "kl",
            "tolerance": 0.5,
            "max_decode_latency": None,  # candidates by KL alone: the tiny decoder's speeds tie
            "output_dir": str(tmp_path / "out"),
        }
    )
    result = AutoSearch(config).run()
    rows = pq.read_table(tmp_path / "out" / "results.parquet").to_pylist()
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows), rows
    kls = [r["metric"] for r in rows]
    assert all(0 < kl < 0.5 for kl in kls) and len(set(kls)) == 4
    best = onnx.load(tmp_path / "out" / "best" / "model.onnx")
    blocks = {_attr(n, "block_size") for n in _nbits(best).values()}
    assert len(_nbits(best)) == BLOCK_MATMULS
    group = next(v for k, v in result.best_params.items() if k.endswith("group_size"))
    assert blocks == {int(group)}
    best_row = min(rows, key=lambda r: r["metric"])
    assert result.best_metric == pytest.approx(best_row["metric"])
