"""``algorithm: gptq`` of the ``weight_only`` backend, raysearch's own GPTQ: ONNX Runtime's
carries no rounding error (kept here as the reason it is not used); raysearch's does, writes
RTN's bytes when the inputs are uncorrelated, brings each node's output and the whole model
nearer float than RTN at the same bits, block and symmetry, and writes ``MatMulNBits`` as RTN
does (attributes, ``accuracy_level``), in a genai folder its client decodes."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from raysearch.data import DataSource
from raysearch.metrics import mean_metric, metric_per_sample
from raysearch.quantize.backends.weight_only import WeightOnlyBackend, import_quantizer
from raysearch.quantize.backends.weight_only._gptq import gptq_codes, inverse_factor, pack
from raysearch.quantize.registry import backend_reject
from tests.clients import BYTEGPT, BYTELLAMA
from tests.lm_models import decoder_lm_data, make_decoder_lm

HEAD = "/lm_head/MatMul"
GATE = "/layers.0/mlp/gate_proj/MatMul"
QUERY = "/layers.0/attn/q_proj/MatMul"
DOWN = "/layers.1/mlp/down_proj/MatMul"


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return make_decoder_lm(tmp_path_factory.mktemp("gptq") / "lm.onnx")


@pytest.fixture(scope="module")
def calibration(lm):
    return DataSource.load(decoder_lm_data(8, 12), lm, batch_size=4)


@pytest.fixture(scope="module")
def backend(lm, calibration):
    """One backend for every test of the module: the Hessians are measured once."""
    with WeightOnlyBackend(lm, calibration) as b:
        yield b


def _session(model):
    """A one-thread CPU session of ``model`` (a path or a serialized model)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _nbits(model):
    return {n.name.rsplit("_Q", 1)[0]: n for n in model.graph.node if n.op_type == "MatMulNBits"}


def _attributes(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _tensors(model, node):
    inits = {t.name: t for t in model.graph.initializer}
    return [numpy_helper.to_array(inits[name]) for name in node.input[1:] if name]


@pytest.mark.parametrize("scheme", ["sym", "asym"])
def test_ort_gptq_ignores_the_hessian_raysearchs_carries_the_error(scheme):
    """With a full-rank Hessian of strongly correlated inputs, ONNX Runtime's ``gptq`` returns
    exactly what it returns with the identity Hessian (it reads its inverse-Hessian factor
    below the diagonal, all zeros: RTN's weights), so raysearch writes its own: its codes
    differ from RTN's and the layer's output error ``||XW - XQ||`` on the rows the Hessian
    was measured on is lower."""
    import_quantizer()
    from onnxruntime.quantization.neural_compressor.weight_only import gptq

    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((512, 64)) @ rng.standard_normal((64, 64))
    hessian = inputs.T @ inputs
    assert np.linalg.matrix_rank(hessian) == 64
    weight = rng.standard_normal((64, 48)).astype(np.float32)
    arguments = {"num_bits": 4, "group_size": 32, "scheme": scheme}
    with_data = gptq(weight.copy(), hessian.copy(), **arguments)
    np.testing.assert_array_equal(with_data, gptq(weight.copy(), np.eye(64), **arguments))

    symmetric = scheme == "sym"
    choice = {"bits": 4, "block_size": 32, "symmetric": symmetric}
    ours = gptq_codes(weight, inverse_factor(hessian), **choice)
    rtn = gptq_codes(weight, inverse_factor(np.eye(64)), **choice)
    assert not np.array_equal(ours.codes, rtn.codes)
    error = {name: np.linalg.norm(inputs @ weight - inputs @ codes.dequantized())
             for name, codes in (("gptq", ours), ("rtn", rtn))}  # fmt: skip
    assert error["gptq"] < 0.8 * error["rtn"], error


@pytest.mark.parametrize(("bits", "symmetric"), [(4, True), (4, False), (8, True), (8, False)])
def test_uncorrelated_inputs_give_rtns_bytes(lm, backend, tmp_path, bits, symmetric):
    """With the identity Hessian nothing is carried: raysearch's GPTQ packs, for every weight
    MatMul, the bytes, scales and zero points ONNX Runtime's RTN writes at the same bits, block
    and symmetry (the encoding ``MatMulNBits`` reads, its symmetric midpoint included)."""
    settings = {"bits": bits, "block_size": 32, "symmetric": symmetric}
    backend.quantize(settings, tmp_path / "rtn.onnx")
    rtn = onnx.load(tmp_path / "rtn.onnx")
    weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(lm).graph.initializer}
    float_nodes = {n.name: n for n in onnx.load(lm).graph.node}
    written = _nbits(rtn)
    assert len(written) == 15
    for name, node in written.items():
        weight = weights[float_nodes[name].input[1]]
        codes = gptq_codes(weight, inverse_factor(np.eye(len(weight))), **settings)
        packed, zero_points = pack(codes)
        expected = _tensors(rtn, node)
        assert len(expected) == (2 if symmetric else 3)
        np.testing.assert_array_equal(packed, expected[0], err_msg=name)
        np.testing.assert_array_equal(codes.scales, expected[1], err_msg=name)
        if not symmetric:
            np.testing.assert_array_equal(zero_points, expected[2], err_msg=name)


def _node_output(path, node_output, feeds):
    model = onnx.load(path)
    model.graph.output.append(onnx.ValueInfoProto(name=node_output))
    return _session(model.SerializeToString()).run([node_output], feeds)[0]


@pytest.mark.parametrize("symmetric", [True, False])
def test_each_layers_output_is_nearer_float_than_rtns(
    lm, backend, calibration, tmp_path, symmetric
):
    """Each node quantized alone (every other float), on the calibration rows' real
    activations: GPTQ's ``MatMulNBits`` output is nearer the float MatMul's than RTN's at the
    same bits, block and symmetry (ONNX Runtime computes both)."""
    nodes = list(backend.choices({}))
    outputs = {n.name: n.output[0] for n in onnx.load(lm).graph.node}
    feeds = list(calibration.batches())
    for name in (QUERY, GATE, DOWN, HEAD):
        reference = np.concatenate([_node_output(lm, outputs[name], f) for f in feeds])
        error = {}
        for algorithm in ("rtn", "gptq"):
            out = tmp_path / f"{algorithm}.onnx"
            others = [n for n in nodes if n != name]
            backend.quantize({"algorithm": algorithm, "block_size": 32, "symmetric": symmetric,
                              "nodes_float": others}, out)  # fmt: skip
            assert set(_nbits(onnx.load(out))) == {name}
            got = np.concatenate([_node_output(out, outputs[name], f) for f in feeds])
            error[algorithm] = float(np.linalg.norm(got - reference))
        assert error["gptq"] < error["rtn"], (name, error)


def test_written_as_rtn_writes_with_accuracy_level_as_set(backend, tmp_path):
    """Every node's ``MatMulNBits`` has RTN's attributes (K, N, bits, block_size) and inputs
    at the same setting, ``accuracy_level`` as set, per-node choices included; the model
    runs."""
    settings = {"block_size": 64, "symmetric": False, "accuracy_level": 4,
                "node_settings": {HEAD: {"bits": 8, "symmetric": True}}}  # fmt: skip
    backend.quantize({**settings, "algorithm": "rtn"}, tmp_path / "rtn.onnx")
    backend.quantize({**settings, "algorithm": "gptq"}, tmp_path / "gptq.onnx")
    rtn, gptq = (_nbits(onnx.load(tmp_path / f"{a}.onnx")) for a in ("rtn", "gptq"))
    assert set(gptq) == set(rtn) and len(gptq) == 15
    for name, node in gptq.items():
        assert node.name == rtn[name].name
        assert _attributes(node) == _attributes(rtn[name]), name
        assert _attributes(node)["accuracy_level"] == 4
        assert len(node.input) == (3 if name == HEAD else 4)
    assert _attributes(gptq[HEAD])["bits"] == 8
    logits = _session(tmp_path / "gptq.onnx").run(["logits"], decoder_lm_data(2, 8))[0]
    assert np.isfinite(logits).all()


def test_hessians_are_measured_once_per_backend(lm, calibration, tmp_path):
    """The first GPTQ setting of a backend measures its nodes' Hessians (the trial's
    calibration time); the next, at another block, reuses them: no calibration time, and the
    same weights as a fresh backend writes at that block."""
    with WeightOnlyBackend(lm, calibration) as fresh:
        first = fresh.quantize({"algorithm": "gptq", "block_size": 32}, tmp_path / "a.onnx")
        again = fresh.quantize({"algorithm": "gptq", "block_size": 64}, tmp_path / "b.onnx")
    with WeightOnlyBackend(lm, calibration) as other:
        alone = other.quantize({"algorithm": "gptq", "block_size": 64}, tmp_path / "c.onnx")
    assert first.calibration_s > 0 and alone.calibration_s > 0 and again.calibration_s == 0
    reused, measured = (onnx.load(tmp_path / f"{n}.onnx") for n in "bc")
    for name, node in _nbits(reused).items():
        for a, b in zip(_tensors(reused, node), _tensors(measured, _nbits(measured)[name])):
            np.testing.assert_array_equal(a, b)


def test_refusals_and_no_calibration_data_in_one_line(lm, tmp_path):
    """What cannot work is refused in one line before anything runs (only RTN writes QDQ or
    embeddings); without calibration data the trial fails with a line that says why and
    writes nothing."""
    assert backend_reject({"quantizer": "weight_only", "algorithm": "gptq"}) is None
    assert backend_reject({"quantizer": "weight_only", "algorithm": "gptq", "symmetric": False,
                           "bits": 8}) is None  # fmt: skip
    assert backend_reject(
        {"quantizer": "weight_only", "algorithm": "gptq", "quant_format": "QDQ"}
    ).startswith("quant_format QDQ needs algorithm rtn")
    assert backend_reject(
        {"quantizer": "weight_only", "algorithm": "gptq", "quantize_embeddings": True}
    ).startswith("quantize_embeddings needs algorithm rtn")
    with WeightOnlyBackend(lm, None) as plain:
        with pytest.raises(ValueError, match="^algorithm gptq reads the calibration data"):
            plain.quantize({"algorithm": "gptq"}, tmp_path / "never.onnx")
    assert not (tmp_path / "never.onnx").exists()


def _kl(path, reference, data):
    from raysearch.evaluate import run_model

    logits = run_model(_session(path), data)[0]["logits"]
    values = metric_per_sample("kl", {"logits": logits}, {"logits": reference})
    return mean_metric("kl", values)


needs_bytegpt = pytest.mark.skipif(not BYTEGPT.is_dir(), reason="no shared bytegpt model")
needs_bytellama = pytest.mark.skipif(
    not (BYTELLAMA / "genai").is_dir(), reason="no shared bytellama model"
)


@pytest.mark.slow
@needs_bytegpt
def test_bytegpt_whole_model_kl_below_rtns(tmp_path):
    """bytegpt, its Hessians from 16 calibration windows, KL on 16 held-out windows: GPTQ's
    model is nearer float than RTN's at the same bits, block and symmetry (the builder's
    block 32 symmetric)."""
    model = BYTEGPT / "model.onnx"
    calib = np.load(BYTEGPT / "calib.npz")["input_ids"][:16]
    held_out = DataSource.load(
        {"input_ids": np.load(BYTEGPT / "eval.npz")["input_ids"][:16]}, model, batch_size=8
    )
    from raysearch.evaluate import run_model

    reference = run_model(_session(model), held_out)[0]["logits"]
    data = DataSource.load({"input_ids": calib}, model, batch_size=8)
    with WeightOnlyBackend(model, data) as quantizer:
        kl = {}
        for algorithm in ("rtn", "gptq"):
            out = tmp_path / f"{algorithm}.onnx"
            quantizer.quantize({"algorithm": algorithm, "block_size": 32, "symmetric": True}, out)
            kl[algorithm] = _kl(out, reference, held_out)
    assert kl["gptq"] < 0.5 * kl["rtn"], kl


@pytest.mark.slow
@needs_bytellama
def test_a_genai_folder_at_gptq_loads_and_decodes_in_its_client(tmp_path):
    """bytellama's genai folder (``GroupQueryAttention``, fused q/k/v, weights in external
    data read node by node), every weight MatMul at GPTQ block 32 symmetric with
    ``accuracy_level`` 4 as the builder writes: nearer float than RTN's on held-out windows,
    and the folder with its client's files loads and decodes in onnxruntime-genai."""
    from raysearch.modelfolder import model_folder
    from tests.clients import generate

    model = BYTELLAMA / "genai" / "model.onnx"
    calib = np.load(BYTEGPT / "calib.npz")["input_ids"][:8, :64]
    held_out = DataSource.load(
        {"input_ids": np.load(BYTEGPT / "eval.npz")["input_ids"][:8, :64]}, model, batch_size=8
    )
    from raysearch.evaluate import run_model

    reference = run_model(_session(model), held_out)[0]["logits"]
    settings = {"block_size": 32, "symmetric": True, "accuracy_level": 4}
    kl = {}
    with WeightOnlyBackend(model, DataSource.load({"input_ids": calib}, model)) as quantizer:
        for algorithm in ("rtn", "gptq"):
            out = tmp_path / algorithm / "model.onnx"
            quantizer.quantize({**settings, "algorithm": algorithm}, out)
            kl[algorithm] = _kl(out, reference, held_out)
    written = onnx.load(str(out), load_external_data=False)
    nodes = [n for n in written.graph.node if n.op_type == "MatMulNBits"]
    assert len(nodes) == 16 and not any(n.op_type == "MatMul" for n in written.graph.node
                                        if n.name.endswith("proj/MatMul"))  # fmt: skip
    assert {_attributes(n)["accuracy_level"] for n in nodes} == {4}
    assert kl["gptq"] < kl["rtn"], kl
    model_folder(model).copy_into(out.parent)
    assert generate("genai", out.parent, 20) == 20
