"""Reading and rewriting ONNX Runtime's QDQ models (``w_quantized`` read by
``DequantizeLinear``, Q/DQ pairs on activations, int32 biases): shared by the bias-correction
and power-of-two techniques.

Example:
    >>> q = quantize(np.array([0.5, -1.0, 3.0]), np.float32(0.5), np.int8(0), -128, 127)
    >>> q.tolist(), dequantize(q, np.float32(0.5), np.int8(0)).tolist()
    ([1, -2, 6], [0.5, -1.0, 3.0])
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from raysearch.modelfile import external_data_locations, has_external_data
from raysearch.modelgraph import constants_to_initializers
from raysearch.providers import make_session
from raysearch.quantize.tempdirs import make_workdir

_logger = logging.getLogger(__name__)

#: Integer element type -> (qmin, qmax, symmetric zero point).
QTYPES: dict[int, tuple[int, int, int]] = {
    TensorProto.INT8: (-128, 127, 0),
    TensorProto.UINT8: (0, 255, 128),
    TensorProto.INT16: (-32768, 32767, 0),
    TensorProto.UINT16: (0, 65535, 32768),
    TensorProto.INT32: (-(2**31), 2**31 - 1, 0),
}

_QUANTIZED_SUFFIX = "_quantized"
_OUTPUT_SUFFIX = "_QuantizeLinear_Input"


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """The model at ``path`` with its external data, ``Constant`` weights as initializers."""
    model = onnx.load(os.fspath(path))
    constants_to_initializers(model)
    return model


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> None:
    """Write ``model`` to ``path`` in place, keeping external data in the file it came from."""
    path = os.fspath(path)
    if has_external_data(path):
        locations = external_data_locations(path)
        onnx.save(
            model, path, save_as_external_data=True, all_tensors_to_one_file=True,
            location=locations[0] if locations else Path(path).name + ".data",
        )  # fmt: skip
    else:
        onnx.save(model, path)


def bcast(param: np.ndarray, axis: int | None, ndim: int) -> np.ndarray:
    """A scale or zero point shaped to broadcast against a rank-``ndim`` tensor along ``axis``."""
    param = np.asarray(param)
    if param.size == 1 or ndim == 0:
        return param.reshape(())
    shape = [1] * ndim
    shape[(axis if axis is not None else 1) % ndim] = param.size
    return param.reshape(shape)


def quantize(
    values: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray,
    qmin: int,
    qmax: int,
    axis: int | None = None,
) -> np.ndarray:
    """``QuantizeLinear``: round half to even, add the zero point, saturate (int64 result)."""
    values = np.asarray(values, np.float64)
    s = bcast(np.asarray(scale, np.float64), axis, values.ndim)
    z = bcast(np.asarray(zero_point, np.int64), axis, values.ndim)
    return np.clip(np.rint(values / s) + z, qmin, qmax).astype(np.int64)


def dequantize(
    q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, axis: int | None = None
) -> np.ndarray:
    """``DequantizeLinear`` in float64."""
    q = np.asarray(q, np.int64)
    s = bcast(np.asarray(scale, np.float64), axis, q.ndim)
    z = bcast(np.asarray(zero_point, np.int64), axis, q.ndim)
    return (q - z) * s


class QdqGraph:
    """An index over a QDQ model's main graph: initializers by name, producers and consumers."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.graph = model.graph
        self.inits: dict[str, TensorProto] = {t.name: t for t in self.graph.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in self.graph.node:
            for name in node.output:
                self.producer[name] = node
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)

    def array(self, name: str) -> np.ndarray:
        return numpy_helper.to_array(self.inits[name])

    def elem_type(self, name: str) -> int:
        return self.inits[name].data_type

    def set_array(self, name: str, values: np.ndarray) -> None:
        """Replace initializer ``name``'s values, keeping its name and element type."""
        old = self.inits[name]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(old.data_type)
        new = numpy_helper.from_array(np.asarray(values).astype(dtype), name)
        old.CopyFrom(new)

    def clone_input(self, node: onnx.NodeProto, index: int, suffix: str) -> str:
        """Give ``node`` its own copy of a shared initializer at input ``index``; its name."""
        name = node.input[index]
        if len(self.consumers.get(name, [])) <= 1:
            return name
        new_name = f"{name}_{suffix}"
        while new_name in self.inits:
            new_name += "_"
        tensor = TensorProto()
        tensor.CopyFrom(self.inits[name])
        tensor.name = new_name
        self.graph.initializer.append(tensor)
        self.inits[new_name] = self.graph.initializer[-1]
        node.input[index] = new_name
        self.consumers[name].remove(node)
        self.consumers[new_name] = [node]
        return new_name

    def qparams(self, node: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray, int | None, int]:
        """``(scale, zero_point, axis, element type)`` of a Q/DQ node (no zero point: uint8 0)."""
        scale = self.array(node.input[1])
        if len(node.input) > 2 and node.input[2]:
            zero_point, elem = self.array(node.input[2]), self.elem_type(node.input[2])
        else:
            zero_point, elem = np.zeros_like(scale, np.uint8), TensorProto.UINT8
        axis = next((a.i for a in node.attribute if a.name == "axis"), None)
        return scale, zero_point, axis, elem

    def has_qparams(self, node: onnx.NodeProto) -> bool:
        """Whether the Q/DQ node's scale and zero point are initializers of a known type."""
        if node.input[1] not in self.inits:
            return False
        if len(node.input) > 2 and node.input[2]:
            zp = node.input[2]
            return zp in self.inits and self.elem_type(zp) in QTYPES
        return True

    def constant_dq(self, name: str) -> onnx.NodeProto | None:
        """The DequantizeLinear producing ``name`` from a quantized initializer, else None."""
        node = self.producer.get(name)
        if (
            node is not None
            and node.op_type == "DequantizeLinear"
            and node.input[0] in self.inits
            and self.has_qparams(node)
        ):
            return node
        return None

    def activation_dq(self, name: str) -> onnx.NodeProto | None:
        """The DequantizeLinear producing ``name`` from a QuantizeLinear, else None."""
        node = self.producer.get(name)
        if node is None or node.op_type != "DequantizeLinear" or not self.has_qparams(node):
            return None
        q = self.producer.get(node.input[0])
        return node if q is not None and q.op_type == "QuantizeLinear" else None

    def set_zero_point(self, node: onnx.NodeProto, values: np.ndarray, elem: int) -> None:
        """Write a Q/DQ node's zero point (adding the initializer when it had none)."""
        if len(node.input) > 2 and node.input[2]:
            self.set_array(node.input[2], values)
            return
        name = f"{node.input[1]}_zero_point"
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
        tensor = numpy_helper.from_array(np.asarray(values).astype(dtype), name)
        self.graph.initializer.append(tensor)
        self.inits[name] = self.graph.initializer[-1]
        while len(node.input) < 3:
            node.input.append("")
        node.input[2] = name


def float_initializers(float_path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The float model's initializers by name."""
    model = load_model(float_path)
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def constant_float_values(
    graph: QdqGraph, dq: onnx.NodeProto, float_inits: Mapping[str, np.ndarray]
) -> np.ndarray:
    """The float values a constant DequantizeLinear stands for (float model's, else dequantized)."""
    qname = dq.input[0]
    if qname.endswith(_QUANTIZED_SUFFIX):
        original = float_inits.get(qname[: -len(_QUANTIZED_SUFFIX)])
        if original is not None and original.shape == tuple(graph.inits[qname].dims):
            return np.asarray(original, np.float64)
    _logger.debug("no float initializer for %s; using its dequantized values", qname)
    scale, zero_point, axis, _ = graph.qparams(dq)
    return dequantize(graph.array(qname), scale, zero_point, axis)


def float_tensor_name(graph: QdqGraph, name: str, float_names: set[str]) -> str | None:
    """The float model's tensor that quantized-model tensor ``name`` carries, or None."""
    seen = set()
    while name not in seen:
        seen.add(name)
        if name in float_names:
            return name
        if name.endswith(_OUTPUT_SUFFIX) and name[: -len(_OUTPUT_SUFFIX)] in float_names:
            return name[: -len(_OUTPUT_SUFFIX)]
        node = graph.producer.get(name)
        if node is None or node.op_type != "DequantizeLinear":
            return None
        q = graph.producer.get(node.input[0])
        if q is None or q.op_type != "QuantizeLinear":
            return None
        name = q.input[0]
    return None


def model_tensor_names(model: onnx.ModelProto) -> set[str]:
    """Every tensor a model's main graph computes or takes in."""
    names = {i.name for i in model.graph.input}
    for node in model.graph.node:
        names.update(n for n in node.output if n)
    return names


def run_with_outputs(
    float_path: str | os.PathLike,
    names: Sequence[str],
    feeds: Iterator[dict[str, np.ndarray]],
    *,
    providers: Sequence[Any] | None,
    threads: int,
) -> Iterator[dict[str, np.ndarray]]:
    """Run the float model on ``feeds`` with ``names`` as extra outputs, one batch at a time."""
    model = load_model(float_path)
    inputs = {i.name for i in model.graph.input}
    present = {o.name for o in model.graph.output}
    wanted = [n for n in dict.fromkeys(names) if n not in inputs]  # graph inputs: the feed's
    for name in wanted:
        if name not in present:
            model.graph.output.append(onnx.ValueInfoProto(name=name))
    workdir = None
    try:
        if model.ByteSize() < (1 << 31) - (64 << 20):
            source: str | bytes = model.SerializeToString()
        else:
            workdir = make_workdir("raysearch-qdq")
            source = str(workdir / "float.onnx")
            onnx.save(model, source, save_as_external_data=True, location="float.onnx.data")
        del model
        session = make_session(source, threads, providers=providers)
        for feed in feeds:
            values = dict(zip(wanted, session.run(wanted, feed) if wanted else [], strict=True))
            yield {name: values[name] if name in values else feed[name] for name in names}
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
