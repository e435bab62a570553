"""The ``weight_only`` backend (ONNX Runtime's MatMulNBits): each setting changes the written
model as it says (block size, symmetry, bits per node, float nodes, embeddings, format,
accuracy level, algorithm), the refusals' one line, ONNX Runtime's own GPTQ writing RTN's
weights (raysearch's GPTQ: ``test_weight_only_gptq.py``), and the quantized decoder runs with an
empty past."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from raysearch.errors import ConfigError
from raysearch.quantize.backends.weight_only import WeightOnlyBackend, import_quantizer
from raysearch.quantize.registry import backend_reject, get_backend
from raysearch.space import SearchSpace
from tests.lm_models import decoder_lm_data, make_decoder_lm

HEAD = "/lm_head/MatMul"
GATE = "/layers.0/mlp/gate_proj/MatMul"


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return make_decoder_lm(tmp_path_factory.mktemp("wo") / "lm.onnx")


@pytest.fixture(scope="module")
def backend(lm):
    with WeightOnlyBackend(lm, None) as b:
        yield b


def _quantize(backend, settings, tmp_path, name="q.onnx"):
    out = tmp_path / name
    info = backend.quantize(settings, out)
    return onnx.load(out), info, out


def _nbits(model):
    return {n.name: n for n in model.graph.node if n.op_type == "MatMulNBits"}


def _attr(node, name):
    return next(
        (onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), None
    )


def _logits(path, feeds):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(["logits"], feeds)[0]


def test_registered_and_default_is_every_weight_matmul_at_4_bits_block_128(backend, tmp_path):
    assert get_backend("weight_only") is WeightOnlyBackend
    model, info, _ = _quantize(backend, {}, tmp_path)
    nodes = _nbits(model)
    assert len(nodes) == 15  # 2 x (q, k, v, o, gate, up, down) + lm_head
    assert {_attr(n, "bits") for n in nodes.values()} == {4}
    assert {_attr(n, "block_size") for n in nodes.values()} == {128}
    # symmetric by default: no zero-point input
    assert all(len(n.input) == 3 for n in nodes.values())
    # attention's activation x activation MatMuls stay (they have no weight)
    assert sum(n.op_type == "MatMul" for n in model.graph.node) == 4
    assert info.quantized_share == pytest.approx(15 / 19)
    assert info.calibration_s == 0.0


def test_block_size_and_symmetry_reach_the_model(backend, tmp_path):
    model, _, _ = _quantize(backend, {"block_size": 32, "symmetric": False}, tmp_path)
    nodes = _nbits(model)
    assert {_attr(n, "block_size") for n in nodes.values()} == {32}
    assert all(len(n.input) == 4 for n in nodes.values())  # zero points written
    head = nodes[HEAD + "_Q4"]
    scales = {t.name: t for t in model.graph.initializer}[head.input[2]]
    assert int(np.prod(scales.dims)) == 96 * (64 // 32)  # N x K/block


def test_node_bits_8_and_float_per_node(backend, lm, tmp_path):
    settings = {"nodes_8bit": [HEAD], "nodes_float": [GATE], "accuracy_level": 4}
    model, info, out = _quantize(backend, settings, tmp_path)
    nodes = _nbits(model)
    assert _attr(nodes[HEAD + "_Q8"], "bits") == 8
    assert GATE not in {n.name for n in model.graph.node if n.op_type == "MatMulNBits"}
    assert GATE in {n.name for n in model.graph.node if n.op_type == "MatMul"}
    assert {_attr(n, name="bits") for k, n in nodes.items() if k != HEAD + "_Q8"} == {4}
    assert {_attr(n, "accuracy_level") for n in nodes.values()} == {4}
    assert info.quantized_share == pytest.approx(14 / 19)
    feeds = decoder_lm_data(2, 8)
    assert np.isfinite(_logits(out, feeds)).all()


def test_bits_8_everywhere_is_closer_to_float_than_4(backend, lm, tmp_path):
    feeds = decoder_lm_data(4, 12)
    ref = _logits(lm, feeds)
    _, _, q4 = _quantize(backend, {}, tmp_path, "q4.onnx")
    model, _, q8 = _quantize(backend, {"bits": 8}, tmp_path, "q8.onnx")
    assert {_attr(n, "bits") for n in _nbits(model).values()} == {8}
    err4 = np.abs(_logits(q4, feeds) - ref).mean()
    err8 = np.abs(_logits(q8, feeds) - ref).mean()
    assert 0 < err8 < err4 / 4


def test_embeddings_quantized_only_when_asked(backend, tmp_path):
    model, _, _ = _quantize(backend, {}, tmp_path)
    assert sum(n.op_type == "Gather" for n in model.graph.node) >= 2
    model, _, out = _quantize(backend, {"quantize_embeddings": True}, tmp_path, "emb.onnx")
    gathers = [n for n in model.graph.node if n.op_type == "GatherBlockQuantized"]
    assert {n.name for n in gathers} == {"/embed/Gather_Q4", "/embed_positions/Gather_Q4"}
    assert np.isfinite(_logits(out, decoder_lm_data(2, 8))).all()


def test_qdq_format_writes_dequantize_linear(backend, tmp_path):
    model, _, out = _quantize(backend, {"quant_format": "QDQ"}, tmp_path)
    assert not _nbits(model)
    assert sum(n.op_type == "DequantizeLinear" for n in model.graph.node) == 15
    assert np.isfinite(_logits(out, decoder_lm_data(2, 8))).all()


@pytest.mark.parametrize("algorithm", ["hqq", "k_quant"])
def test_algorithms_write_other_weights_than_rtn(backend, tmp_path, algorithm):
    rtn, _, _ = _quantize(backend, {"block_size": 32, "symmetric": False}, tmp_path, "rtn.onnx")
    settings = {"algorithm": algorithm, "block_size": 32, "nodes_8bit": [HEAD]}
    if algorithm == "hqq":  # it writes no accuracy_level itself
        settings["accuracy_level"] = 1
    other, _, out = _quantize(backend, settings, tmp_path, f"{algorithm}.onnx")
    nodes = _nbits(other)
    # per-node bits reach k-quant's per-node config; HQQ's 8-bit nodes are RTN's (its own
    # 8-bit MatMulNBits does not run on CPU)
    assert len(nodes) == 15
    head = next(n for n in nodes.values() if n.name.startswith(HEAD))
    assert _attr(head, "bits") == 8
    if algorithm == "hqq":
        assert {_attr(n, "accuracy_level") for n in nodes.values()} == {1}
    weights = {t.name: numpy_helper.to_array(t) for t in rtn.graph.initializer}
    theirs = {t.name: numpy_helper.to_array(t) for t in other.graph.initializer}
    gate_rtn = weights[_nbits(rtn)[GATE + "_Q4"].input[1]]
    gate_other = theirs[next(n for n in nodes.values() if n.name.startswith(GATE)).input[1]]
    assert gate_rtn.shape == gate_other.shape and not np.array_equal(gate_rtn, gate_other)
    assert np.isfinite(_logits(out, decoder_lm_data(2, 8))).all()


def test_ort_gptq_still_writes_rtn_weights(lm):
    """Why ``algorithm: gptq`` is raysearch's own (``_gptq``): ONNX Runtime's GPTQ, called
    through its quantizer with calibration data, writes its RTN's weights."""
    mnq = import_quantizer()
    feeds = decoder_lm_data(4, 12)
    rows = [{k: v[i : i + 1] for k, v in feeds.items()} for i in range(4)]

    class Reader:
        def __init__(self):
            self.items = iter(rows)

        def get_next(self):
            return next(self.items, None)

        def __iter__(self):
            return iter(rows)

    def weights(config):
        quantizer = mnq.MatMulNBitsQuantizer(str(lm), block_size=32, algo_config=config)
        quantizer.process()
        model = getattr(quantizer.model, "model", quantizer.model)
        return {
            t.name: numpy_helper.to_array(t) for t in model.graph.initializer if "_Q4G32" in t.name
        }

    gptq = weights(mnq.GPTQWeightOnlyQuantConfig(calibration_data_reader=Reader()))
    rtn = weights(mnq.RTNWeightOnlyQuantConfig())
    assert len(rtn) == 15 and set(gptq) == set(rtn)
    assert all(np.array_equal(gptq[k], rtn[k]) for k in rtn)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"block_size": 48}, "block_size 48: MatMulNBits needs a power of two from 16 to 256"),
        ({"algorithm": "hqq", "symmetric": True}, "algorithm hqq has no symmetric form"),
        ({"algorithm": "k_quant", "symmetric": True}, "algorithm k_quant always writes zero"),
        ({"algorithm": "hqq", "bits": 8}, "algorithm hqq at 8 bits writes float"),
        (
            {"nodes_8bit": [HEAD], "nodes_float": [HEAD]},
            "node '/lm_head/MatMul' is in two of nodes_4bit, nodes_8bit, nodes_float",
        ),
        ({"quantize_embeddings": True, "bits": 8}, "quantize_embeddings needs bits 4"),
        ({"quantize_embeddings": True, "algorithm": "hqq"}, "quantize_embeddings needs algorithm"),
        ({"quant_format": "QDQ", "nodes_8bit": [HEAD]}, "quant_format QDQ writes 4-bit"),
        ({"quant_format": "QDQ", "algorithm": "hqq"}, "quant_format QDQ needs algorithm rtn"),
        ({"quant_format": "QDQ", "accuracy_level": 4}, "accuracy_level is a MatMulNBits"),
    ],
)
def test_refused_settings_one_line_before_anything_runs(backend, tmp_path, settings, expected):
    reason = backend_reject({"quantizer": "weight_only", **settings})
    assert reason is not None and reason.startswith(expected) and "\n" not in reason
    with pytest.raises(ValueError, match="^" + expected[:20]):
        backend.quantize(settings, tmp_path / "never.onnx")
    assert not (tmp_path / "never.onnx").exists()


def test_catalogue_checks_values_in_a_space():
    with pytest.raises(ConfigError, match="bits"):
        SearchSpace.parse({"quantizer": "weight_only", "bits": [4, 3]})
    with pytest.raises(ConfigError, match="calibrate_method"):
        SearchSpace.parse({"quantizer": "weight_only", "calibrate_method": ["MinMax"]})
    space = SearchSpace.parse({"quantizer": "weight_only", "block_size": [32, 64]})
    assert len(space.expand()) == 2


def test_node_settings_give_each_node_its_own_choice(backend, lm, tmp_path):
    """``node_settings`` reach the written model node by node: the head at 8 bits, the gate
    at block 32 asymmetric by k-quant, every other node at the top level's RTN block 64
    symmetric; ``accuracy_level`` on all of them."""
    settings = {
        "block_size": 64,
        "accuracy_level": 4,
        "node_settings": {
            HEAD: {"bits": 8},
            GATE: {"algorithm": "k_quant", "block_size": 32},
        },
    }
    backend.quantize(settings, tmp_path / "q.onnx")
    model = onnx.load(tmp_path / "q.onnx")
    nodes = _nbits(model)
    by_source = {n.name.rsplit("_Q", 1)[0]: n for n in nodes.values()}
    assert _attr(by_source[HEAD], "bits") == 8 and _attr(by_source[HEAD], "block_size") == 64
    assert _attr(by_source[GATE], "block_size") == 32
    assert len(by_source[GATE].input) == 4  # k-quant's zero points
    others = [n for k, n in by_source.items() if k not in (HEAD, GATE)]
    assert {(_attr(n, "bits"), _attr(n, "block_size")) for n in others} == {(4, 64)}
    assert all(len(n.input) == 3 for n in others)  # symmetric: no zero points
    assert {_attr(n, "accuracy_level") for n in nodes.values()} == {4}


@pytest.mark.parametrize(("settings", "message"), [
    ({"node_settings": {HEAD: {"bits": 5}}}, "node_settings '/lm_head/MatMul': bits: expected"),
    ({"node_settings": {HEAD: {"algorithm": "hqq", "bits": 8}}}, "hqq at 8 bits"),
    ({"node_settings": {HEAD: {"bits": 8}}, "nodes_float": [HEAD]}, "and in a node list"),
    ({"node_settings": {HEAD: {"blocks": 8}}}, "blocks is not one of"),
])  # fmt: skip
def test_node_settings_refused_in_one_line(settings, message):
    assert message in WeightOnlyBackend.reject(settings)


def test_validate_names_a_node_of_node_settings_that_is_no_weight_matmul(lm):
    with pytest.raises(ConfigError, match="node_settings: .*'/lm_head/MatMull'"):
        WeightOnlyBackend.validate({"node_settings": {"/lm_head/MatMull": {"bits": 8}}}, lm)


def test_validate_names_a_node_that_is_no_weight_matmul(lm):
    WeightOnlyBackend.validate({"nodes_8bit": [HEAD]}, lm)
    with pytest.raises(ConfigError, match="nodes_float: .*'/lm_head/MatMull'.*'/lm_head/MatMul'"):
        WeightOnlyBackend.validate({"nodes_float": ["/lm_head/MatMull"]}, lm)


def test_import_leaves_the_root_logger_alone():
    code = (
        "import logging; from raysearch.quantize.backends.weight_only import import_quantizer;"
        "import_quantizer(); r = logging.getLogger(); print(len(r.handlers), r.level)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", str(logging.WARNING)]


def test_k_quant_with_one_block_per_column_fails_in_one_line(backend, tmp_path):
    """ONNX Runtime's 4-bit k-quant fails on a weight whose rows fit one block (a reshape
    error deep inside it): the trial fails with a line that says so, before it runs."""
    with pytest.raises(
        ValueError,
        match=r"^ONNX Runtime's 4-bit k_quant fails where a weight's rows are not an "
        r"even number of blocks \(node .*: \d+ rows, 1 of block_size 64\)",
    ):
        backend.quantize({"algorithm": "k_quant", "block_size": 64}, tmp_path / "k.onnx")


def _one_matmul(rows: int, cols: int) -> onnx.ModelProto:
    weight = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, rows])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, cols])],
        [onnx.numpy_helper.from_array(weight, "w")],
    )
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)],
                                  ir_version=10)  # fmt: skip


@pytest.mark.parametrize(("rows", "bits", "fails"), [
    (96, 4, True), (160, 4, True), (32, 4, True), (64, 4, False), (128, 4, False),
    (96, 8, False), (32, 8, False),
])  # fmt: skip
def test_k_quant_fails_at_4_bits_on_an_odd_number_of_blocks_as_the_rule_says(rows, bits, fails):
    """What the refusal rule says is what ONNX Runtime's k-quant does (block 32): at 4 bits it
    fails on a weight of 1, 3 or 5 blocks a column (a fused q/k/v or a k projection of such a
    width), never on an even number; at 8 bits it fails on none."""
    from raysearch.quantize.backends.weight_only._backend import (
        NodeChoice,
        _k_quant_refusal,
        import_quantizer,
    )

    mnq = import_quantizer()
    per_node = {"mm": {"bits": bits, "group_size": 32, "scheme": "asym"}}
    quantizer = mnq.MatMulNBitsQuantizer(
        _one_matmul(rows, 40), block_size=32, is_symmetric=False,
        algo_config=mnq.KQuantWeightOnlyQuantConfig(customized_weight_config=per_node),
    )  # fmt: skip
    try:
        quantizer.process()
        failed = False
    except ValueError as exc:
        assert "cannot reshape" in str(exc)
        failed = True
    assert failed is fails
    choice = NodeChoice("k_quant", bits, 32, False)
    assert (_k_quant_refusal(choice, rows, "mm") is not None) is fails


def test_k_quant_that_would_fail_on_the_model_is_refused_before_anything_runs(lm, backend):
    """The search and `raysearch validate` leave out, with the trial's own line, a 4-bit
    k-quant block that gives a weight it quantizes one block a column; a smaller block, or
    that node kept float, is kept (the weights' shapes come from the model's header)."""
    from raysearch.quantize.registry import backend_reject
    from raysearch.strategies import ModelFacts

    weights = ModelFacts.of(lm).weights
    rows = {name: shape[0] for name, shape in weights.items()}
    small = min(rows, key=rows.get)
    settings = {"quantizer": "weight_only", "algorithm": "k_quant", "block_size": rows[small]}
    assert backend_reject(settings) is None  # without the model, nothing to refuse
    reason = backend_reject(settings, weights)
    assert reason == (
        f"ONNX Runtime's 4-bit k_quant fails where a weight's rows are not an even number of "
        f"blocks (node {small}: {rows[small]} rows, 1 of block_size {rows[small]}): use "
        f"another block_size"
    )
    kept_float = dict(settings, nodes_float=[n for n, r in rows.items() if r <= rows[small]])
    assert backend_reject(kept_float, weights) is None
    assert backend_reject(dict(settings, block_size=16), weights) is None
    assert backend_reject(dict(settings, algorithm="rtn"), weights) is None


def test_a_model_with_external_data_is_written_with_its_data(tmp_path):
    """A model over 2 GB keeps its weights in external data: the quantized one is written the
    same way (one data file beside it, named after it) and runs from there."""
    from onnx.external_data_helper import convert_model_to_external_data

    source = make_decoder_lm(tmp_path / "plain.onnx")
    model = onnx.load(source)
    convert_model_to_external_data(model, location="weights.bin", size_threshold=0)
    onnx.save(model, tmp_path / "ext.onnx")
    with WeightOnlyBackend(tmp_path / "ext.onnx", None) as backend:
        backend.quantize({"nodes_8bit": [HEAD]}, tmp_path / "out" / "q.onnx")
    assert (tmp_path / "out" / "q.onnx.data").is_file()
    header = onnx.load(tmp_path / "out" / "q.onnx", load_external_data=False)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in header.graph.initializer)
    feeds = decoder_lm_data(2, 8)
    np.testing.assert_allclose(
        _logits(tmp_path / "out" / "q.onnx", feeds),
        _logits(
            _quantize(WeightOnlyBackend(source, None), {"nodes_8bit": [HEAD]}, tmp_path)[2], feeds
        ),
        rtol=1e-5,
        atol=1e-5,
    )


# -- algorithm: source (weights a library wrote, taken node by node) -----------------------


def _ort_written(lm, out, config_of, exclude=()):
    """``lm`` quantized by ONNX Runtime's own ``MatMulNBitsQuantizer`` (not raysearch's
    backend) with the algorithm config ``config_of(mnq)``, ``exclude`` kept float."""
    mnq = import_quantizer()
    quantizer = mnq.MatMulNBitsQuantizer(
        onnx.load(lm), block_size=32, is_symmetric=False, nodes_to_exclude=list(exclude),
        algo_config=config_of(mnq),
    )  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        quantizer.process()
    model = quantizer.model.model if hasattr(quantizer.model, "model") else quantizer.model
    onnx.save(model, out)
    return out


@pytest.fixture(scope="module")
def sources(lm, tmp_path_factory):
    """Two sources of ``lm``'s weights: ONNX Runtime's k-quant at block 32 (a rounding other
    than RTN's, with zero points; ``lm_head`` left float), and a genai-like folder as the
    builder writes a library's checkpoint: RTN block 32 symmetric with midpoint zero points,
    nodes named ``.../MatMulNBits``, weights in external data."""
    folder = tmp_path_factory.mktemp("sources")
    names = list(WeightOnlyBackend(lm, None).choices({}))
    per_node = {n: {"bits": 4, "group_size": 32, "scheme": "asym"} for n in names if n != HEAD}
    kquant = _ort_written(
        lm, folder / "kquant.onnx",
        lambda mnq: mnq.KQuantWeightOnlyQuantConfig(customized_weight_config=per_node),
        exclude=[HEAD],
    )  # fmt: skip
    rtn = onnx.load(_ort_written(
        lm, folder / "rtn.onnx",
        lambda mnq: mnq.DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=True),
    ))  # fmt: skip
    for node in rtn.graph.node:
        if node.op_type == "MatMulNBits":
            node.name = node.name[: -len("MatMul_Q4")] + "MatMulNBits"
            n, k = _attr(node, "N"), _attr(node, "K")
            zero_points = np.full(n * (k // 32) // 2, 0x88, np.uint8)
            rtn.graph.initializer.append(numpy_helper.from_array(zero_points, node.name + ".zp"))
            node.input.append(node.name + ".zp")
    genai = folder / "genai"
    genai.mkdir()
    onnx.save(rtn, genai / "model.onnx", save_as_external_data=True, location="model.onnx.data")
    (genai / "genai_config.json").write_text('{"model": {"decoder": {"filename": "model.onnx"}}}')
    return kquant, genai


def _initializers(model, node):
    inits = {t.name: t for t in model.graph.initializer}
    return [numpy_helper.to_array(inits[name]) for name in node.input[1:] if name]


def test_a_node_at_source_takes_the_sources_weights_not_rtns(backend, lm, sources, tmp_path):
    """The gate at ``algorithm: source`` carries the k-quant source's packed weights, scales
    and zero points as they are (not what RTN writes at the same bits, block and symmetry);
    every other node is the top level's RTN; the model runs."""
    kquant, _ = sources
    settings = {"block_size": 32, "accuracy_level": 4, "weight_source": str(kquant),
                "node_settings": {GATE: {"algorithm": "source", "symmetric": False}}}  # fmt: skip
    model, _, path = _quantize(backend, settings, tmp_path)
    written = {n.name: n for n in model.graph.node if n.op_type == "MatMulNBits"}
    source = onnx.load(kquant)
    expected = _initializers(source, _nbits(source)[GATE + "_Q4"])
    taken = _initializers(model, written[GATE + "_Q4"])
    assert len(taken) == 3 and all(np.array_equal(a, b) for a, b in zip(taken, expected))
    rtn, _, _ = _quantize(
        backend, {"block_size": 32, "symmetric": False}, tmp_path, name="rtn.onnx"
    )
    assert not np.array_equal(_initializers(rtn, _nbits(rtn)[GATE + "_Q4"])[0], taken[0])
    assert {_attr(n, "accuracy_level") for n in written.values()} == {4}
    assert all(len(n.input) == 3 for name, n in written.items() if name != GATE + "_Q4")
    assert np.isfinite(_logits(path, decoder_lm_data(2, 8))).all()


def test_a_builder_folder_as_source_symmetric_drops_midpoint_zero_points(
    backend, sources, tmp_path
):
    """A genai folder whose nodes the builder named ``.../MatMulNBits`` is matched to the float
    MatMuls; its zero points, all at the midpoint, are dropped for a symmetric choice and
    written back for an asymmetric one: the same logits as the source model, in the bytes
    each choice counts."""
    _, genai = sources
    uniform = {"algorithm": "source", "block_size": 32, "weight_source": str(genai)}
    sym, _, sym_path = _quantize(backend, uniform, tmp_path, "sym.onnx")
    asym, _, asym_path = _quantize(backend, {**uniform, "symmetric": False}, tmp_path, "asym.onnx")
    assert {len(n.input) for n in _nbits(sym).values()} == {3}
    assert {len(n.input) for n in _nbits(asym).values()} == {4}
    assert all(np.all(_initializers(asym, n)[2] == 0x88) for n in _nbits(asym).values())
    feeds = decoder_lm_data(2, 8)
    source = _logits(genai / "model.onnx", feeds)
    np.testing.assert_array_equal(_logits(sym_path, feeds), source)
    np.testing.assert_array_equal(_logits(asym_path, feeds), source)


@pytest.mark.parametrize(("settings", "message"), [
    ({"block_size": 64}, "wants K=64 N=128 4 bits block 64"),
    ({"bits": 8}, "wants K=64 N=128 8 bits block 32"),
    ({}, "has zero points other than the midpoint: node /layers.0/mlp/gate_proj/MatMul at "
         "algorithm source needs symmetric false"),
    ({"node": HEAD, "symmetric": False}, "weight_source has no MatMulNBits for node /lm_head"),
    ({"weight_source": "kquant.onnx"}, "weight_source 'kquant.onnx' is relative"),
    ({"weight_source": None}, "algorithm source takes its weights from weight_source"),
])  # fmt: skip
def test_a_source_node_that_does_not_match_is_refused_in_one_line(
    lm, backend, sources, tmp_path, settings, message
):
    """Names, shapes, bits, block and zero points are checked before anything runs (the
    search leaves the setting out with this line) and again by the trial, which writes
    nothing."""
    from raysearch.strategies import ModelFacts

    settings = dict(settings)
    node = settings.pop("node", GATE)
    own = {"algorithm": "source", "block_size": 32, **settings}
    source = own.pop("weight_source", str(sources[0]))
    full = {"quantizer": "weight_only", "node_settings": {node: own}}
    if source:
        full["weight_source"] = source
    reason = backend_reject(full, ModelFacts.of(lm).weights)
    assert reason is not None and message in reason and "\n" not in reason
    with pytest.raises(ValueError, match=re.escape(reason)):
        backend.quantize(full, tmp_path / "never.onnx")
    assert not (tmp_path / "never.onnx").exists()


def test_validate_refuses_a_weight_source_it_cannot_use(lm, sources, tmp_path):
    kquant, genai = sources
    WeightOnlyBackend.validate({"weight_source": str(genai)}, lm)
    with pytest.raises(ConfigError, match="weight_source: file not found"):
        WeightOnlyBackend.validate({"weight_source": str(tmp_path / "none.onnx")}, lm)
    other = _ort_written(
        make_decoder_lm(tmp_path / "one.onnx", layers=1), tmp_path / "other.onnx",
        lambda mnq: mnq.DefaultWeightOnlyQuantConfig(block_size=32),
    )  # fmt: skip
    model = onnx.load(other)
    for node in model.graph.node:
        node.name = "renamed_" + node.name
    onnx.save(model, other)
    with pytest.raises(ConfigError, match="has no MatMulNBits named as a weight MatMul"):
        WeightOnlyBackend.validate({"weight_source": str(other)}, lm)
