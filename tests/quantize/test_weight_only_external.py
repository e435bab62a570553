"""The ``weight_only`` backend on a float model with external data (every model over 2 GB):
the weights are read one node at a time, never the whole model, and every setting writes the
same model as from the same model in one file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import convert_model_to_external_data

from raysearch.quantize.backends.weight_only import WeightOnlyBackend
from tests.lm_models import Dims, make_decoder_lm
from tests.models import IR_VERSION, OPSET

HEAD = "/lm_head/MatMul"
GATE = "/layers.0/mlp/gate_proj/MatMul"
REPO = Path(__file__).resolve().parents[2]


def _external_copy(source: Path, target: Path) -> Path:
    model = onnx.load(source)
    convert_model_to_external_data(model, location="weights.bin", size_threshold=1024)
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, target)
    return target


def _contents(path: Path) -> tuple[list, dict[str, np.ndarray]]:
    model = onnx.load(path)
    nodes = [
        (n.op_type, list(n.input), list(n.output), [a.SerializeToString() for a in n.attribute])
        for n in model.graph.node
    ]
    return nodes, {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _assert_same_model(a: Path, b: Path) -> None:
    nodes_a, weights_a = _contents(a)
    nodes_b, weights_b = _contents(b)
    assert nodes_a == nodes_b
    assert weights_a.keys() == weights_b.keys()
    for name, value in weights_a.items():
        np.testing.assert_array_equal(value, weights_b[name], err_msg=name)


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wo_ext")
    plain = make_decoder_lm(folder / "plain" / "lm.onnx")
    return plain, _external_copy(plain, folder / "ext" / "lm.onnx")


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"block_size": 32, "symmetric": False, "nodes_8bit": [HEAD], "nodes_float": [GATE]},
        {"quantize_embeddings": True, "block_size": 16},
        {"quant_format": "QDQ"},
        {"algorithm": "hqq", "block_size": 32, "nodes_8bit": [HEAD]},
        {"algorithm": "k_quant", "block_size": 32},
    ],
    ids=["default", "mixed", "embeddings", "qdq", "hqq", "k_quant"],
)
def test_every_setting_writes_the_model_it_writes_from_one_file(decoders, tmp_path, settings):
    if settings.get("algorithm") == "hqq":
        pytest.importorskip("torch")
    plain, external = decoders
    with WeightOnlyBackend(plain, None) as backend:
        backend.quantize(settings, tmp_path / "a" / "q.onnx")
    with WeightOnlyBackend(external, None) as backend:
        backend.quantize(settings, tmp_path / "b" / "q.onnx")
    assert (tmp_path / "b" / "q.onnx.data").is_file()
    _assert_same_model(tmp_path / "a" / "q.onnx", tmp_path / "b" / "q.onnx")


def test_a_weight_two_nodes_share_stays_whole_for_the_one_kept_float(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.1, (64, 64)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="first"),
            helper.make_node("MatMul", ["h", "w"], ["y"], name="second"),
        ],
        "shared",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.save(model, tmp_path / "plain.onnx")
    external = _external_copy(tmp_path / "plain.onnx", tmp_path / "ext" / "m.onnx")
    settings = {"block_size": 16, "nodes_float": ["second"]}
    for source, out in ((tmp_path / "plain.onnx", "a"), (external, "b")):
        with WeightOnlyBackend(source, None) as backend:
            backend.quantize(settings, tmp_path / out / "q.onnx")
    _assert_same_model(tmp_path / "a" / "q.onnx", tmp_path / "b" / "q.onnx")
    _, weights = _contents(tmp_path / "b" / "q.onnx")
    np.testing.assert_array_equal(weights["w"], w)


_MEASURE = """
import json, sys
from raysearch.quantize.backends.weight_only import WeightOnlyBackend, import_quantizer

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

import_quantizer()  # ONNX Runtime's quantizer and what it imports: not the model
before = status("VmRSS")
backend = WeightOnlyBackend(sys.argv[1], None)
backend.quantize({"block_size": 32}, sys.argv[2])
print(json.dumps({"before": before, "peak": status("VmHWM")}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_a_model_with_external_data_is_quantized_one_weight_at_a_time(tmp_path):
    """The process that builds the backend for a 190 MB model with external data and quantizes
    it grows by far less than the model: it held the model whole for the backend's life and
    copied it for each quantization (2.3x the model's bytes) before, 0.43x now."""
    dims = Dims(vocab=1024, hidden=1024, heads=8, kv_heads=2, ff=4096)
    model = make_decoder_lm(tmp_path / "m" / "lm.onnx", 3, dims=dims, external_data="w.bin")
    weights = (tmp_path / "m" / "w.bin").stat().st_size
    assert weights == dims.weight_bytes(3)
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(model), str(tmp_path / "q" / "q.onnx")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        check=True,
    )
    measured = json.loads(done.stdout.splitlines()[-1])
    grew = measured["peak"] - measured["before"]
    # The quantized model (block 32: about a sixth of the float bytes), the float embeddings
    # it keeps, the float weight being quantized and what the allocator keeps of those before.
    assert grew < 0.75 * weights, (grew, weights)
    assert (tmp_path / "q" / "q.onnx.data").stat().st_size < 0.25 * weights
