"""Small real models saved with external data (as every model over 2 GB is), for the tests of
models that travel with their data files.

The weights go to one external file with a name of the test's choosing (not the
``<model>.data`` that raysearch uses), so a test sees whether a copy or a move keeps the
``location`` inside the ``.onnx`` and the data file's name in step. Small tensors stay inline:
ONNX Runtime cannot read shape tensors from external data.

Example:
    >>> path = make_external_mlp(tmp_path / "ext.onnx", location="weights.bin")  # doctest: +SKIP
    >>> external_locations(path)                                               # doctest: +SKIP
    ['weights.bin']
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import convert_model_to_external_data, uses_external_data

from tests.models import IR_VERSION, OPSET

__all__ = [
    "make_external_mlp",
    "external_mlp_data",
    "external_locations",
    "check_whole",
    "IN_FEATURES",
]

IN_FEATURES = 32


def make_external_mlp(
    path: str | Path, location: str = "weights.bin", hidden: int = 64, seed: int = 0
) -> Path:
    """``y = MatMul(Relu(MatMul(x, W1) + b1), W2)``; ``W1`` [32, hidden] and ``W2`` [hidden, 16]
    in the external file ``location`` (beside ``path``), ``b1`` inline. Input ``x`` float32
    ``[N, 32]``, output ``y`` float32 ``[N, 16]``."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 1 / np.sqrt(IN_FEATURES), (IN_FEATURES, hidden)).astype(np.float32)
    b1 = rng.normal(0, 0.1, hidden).astype(np.float32)
    w2 = rng.normal(0, 1 / np.sqrt(hidden), (hidden, 16)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="fc1_bias"),
        helper.make_node("Relu", ["hb"], ["a"], name="relu"),
        helper.make_node("MatMul", ["a", "w2"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "external_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", IN_FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    # Only tensors of 1 KiB and more go out: the weights; b1 (64 floats) stays inline.
    convert_model_to_external_data(
        model, all_tensors_to_one_file=True, location=location, size_threshold=1024
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path


def external_mlp_data(n: int, seed: int = 1) -> dict[str, np.ndarray]:
    """``{"x": float32 [n, 32]}`` from a standard normal distribution."""
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(0, 1, (n, IN_FEATURES)).astype(np.float32)}


def external_locations(path: str | Path) -> list[str]:
    """The external-data files the model at ``path`` names (in order of first use)."""
    model = onnx.load(str(path), load_external_data=False)
    found: list[str] = []
    for tensor in model.graph.initializer:
        if uses_external_data(tensor):
            location = next(e.value for e in tensor.external_data if e.key == "location")
            if location not in found:
                found.append(location)
    return found


def check_whole(path: Path) -> None:
    """``path`` has its external data beside it, named after it, and ONNX Runtime loads it."""
    assert external_locations(path) == [f"{path.name}.data"], path
    assert (path.parent / f"{path.name}.data").stat().st_size > 0
    ort.InferenceSession(str(path))
