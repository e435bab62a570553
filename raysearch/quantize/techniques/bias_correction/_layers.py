"""The layers bias correction measures: each Conv/Gemm with a bias and MatMul-Add of a QDQ
model, its float counterpart, the tensor its measurement ends at, and a model of the layer
alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from raysearch.quantize._qdq_graph import QTYPES, QdqGraph, dequantize, quantize

__all__ = [
    "Layer",
    "find_layers",
    "requantized",
    "through_output_q",
    "subgraph",
    "match_float",
    "layer_model",
]

_REMOVABLE = {"Relu", "Clip"}  # ONNX Runtime drops these when it quantizes their output


@dataclass
class Layer:
    """One layer to correct: its quantized node, its input, its bias, and the float tensors."""

    name: str
    source: str
    output: str
    bias: str
    channel_axis: int
    #: The tensor measured: on a CPU whose int8 kernels saturate, a Conv's output past its
    #: Q/DQ pair (ONNX Runtime runs a Conv on integers only with its output quantized); else
    #: ``output``, whose mean moves with the bias exactly.
    measured: str = ""
    #: The output's QuantizeLinear when ``measured`` is past it: the float reference goes
    #: through the same rounding and clipping (a Relu ONNX Runtime folded into it included).
    output_q: onnx.NodeProto | None = None
    #: What the output gains per unit of bias (Gemm's ``beta``).
    gain: float = 1.0
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    float_input: str = ""
    float_output: str = ""
    total: np.ndarray | None = None
    count: int = 0
    session: Any = None

    def add(self, y_quantized: np.ndarray, y_float: np.ndarray) -> None:
        diff = np.moveaxis(np.asarray(y_quantized, np.float64) - y_float, self.channel_axis, -1)
        diff = diff.reshape(-1, diff.shape[-1])
        self.total = diff.sum(0) if self.total is None else self.total + diff.sum(0)
        self.count += diff.shape[0]


def _source(graph: QdqGraph, name: str) -> str:
    """The tensor a layer's input is quantized from (back through Q/DQ conversions)."""
    while True:
        dq = graph.activation_dq(name)
        if dq is None:
            return name
        name = graph.producer[dq.input[0]].input[0]


def _bias_add(graph: QdqGraph, matmul: onnx.NodeProto) -> tuple[onnx.NodeProto, str] | None:
    """The constant Add after ``matmul`` (past its Q/DQ pair) and the constant's name."""
    name = matmul.output[0]
    for _ in range(3):
        users = graph.consumers.get(name, [])
        if len(users) != 1:
            return None
        node = users[0]
        if node.op_type == "Add":
            other = node.input[1] if node.input[0] == name else node.input[0]
            constant = other in graph.inits or graph.constant_dq(other) is not None
            return (node, other) if constant else None
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            return None
        name = node.output[0]
    return None


def find_layers(graph: QdqGraph) -> list[Layer]:
    """The Conv/Gemm with a bias and MatMul-Add layers of a quantized model."""
    layers = []
    for node in graph.graph.node:
        if node.op_type in ("Conv", "Gemm") and len(node.input) > 2 and node.input[2]:
            axis = 1 if node.op_type == "Conv" else -1
            beta = next((a.f for a in node.attribute if a.name == "beta"), 1.0)
            if beta == 0:
                continue
            layers.append(Layer(node.name, _source(graph, node.input[0]), node.output[0],
                                node.input[2], axis, gain=beta))  # fmt: skip
        elif node.op_type == "MatMul":
            found = _bias_add(graph, node)
            if found is not None:
                add, bias = found
                layers.append(Layer(add.name, _source(graph, node.input[0]), add.output[0],
                                    bias, -1))  # fmt: skip
    return layers


def requantized(graph: QdqGraph, layer: Layer, saturates: bool) -> None:
    """Set ``layer.measured`` past a Conv's output Q/DQ where the CPU's int8 kernels saturate."""
    layer.measured, layer.output_q = layer.output, None
    if not saturates or graph.producer[layer.output].op_type != "Conv":
        return
    users = graph.consumers.get(layer.output, [])
    if len(users) != 1 or users[0].op_type != "QuantizeLinear" or not graph.has_qparams(users[0]):
        return
    after = graph.consumers.get(users[0].output[0], [])
    if after and after[0].op_type == "DequantizeLinear":
        layer.measured, layer.output_q = after[0].output[0], users[0]


def through_output_q(graph: QdqGraph, layer: Layer, y_float: np.ndarray) -> np.ndarray:
    """The float layer's output as the quantized model's output Q/DQ pair passes it on."""
    if layer.output_q is None:
        return y_float
    scale, zero_point, axis, elem = graph.qparams(layer.output_q)
    qmin, qmax, _ = QTYPES[elem]
    q = quantize(y_float, scale, zero_point, qmin, qmax, axis)
    return dequantize(q, scale, zero_point, axis)


def subgraph(graph: QdqGraph, layer: Layer) -> list[onnx.NodeProto] | None:
    """The nodes computing ``layer.measured`` from ``layer.source`` (None: needs more)."""
    needed, stack = set(), [layer.measured]
    while stack:
        name = stack.pop()
        if name == layer.source or name in graph.inits or not name:
            continue
        node = graph.producer.get(name)
        if node is None:
            return None
        if id(node) not in needed:
            needed.add(id(node))
            stack.extend(node.input)
    return [n for n in graph.graph.node if id(n) in needed]


def match_float(layer: Layer, graph: QdqGraph, float_model: onnx.ModelProto) -> bool:
    """Find ``layer``'s float node (by name, else by output, past a removed Relu/Clip)."""
    by_output = {o: n for n in float_model.graph.node for o in n.output}
    quantized = graph.producer[layer.output]
    node = next(
        (n for n in float_model.graph.node
         if layer.name and n.name == layer.name and n.op_type == quantized.op_type),
        None,
    )  # fmt: skip
    if node is None:
        node = by_output.get(layer.output)
        if node is not None and node.op_type in _REMOVABLE:
            node = by_output.get(node.input[0])
        if node is None or node.op_type != quantized.op_type:
            return False
    first = node
    if node.op_type == "Add":  # MatMul-Add: the layer's input is the MatMul's
        first = next((by_output[i] for i in node.input if i in by_output
                      and by_output[i].op_type == "MatMul"), None)  # fmt: skip
        if first is None:
            return False
    layer.float_input, layer.float_output = first.input[0], node.output[0]
    return True


def layer_model(graph: QdqGraph, layer: Layer, example: np.ndarray) -> bytes:
    """A model of just the quantized layer: ``layer.source`` in, ``layer.measured`` out."""
    elem = onnx.helper.np_dtype_to_tensor_dtype(example.dtype)
    # The input's shape (batch left free) as in the whole model: ONNX Runtime's fusions of
    # the layer depend on it (MatMul with Add, for one).
    shape = ["batch", *example.shape[1:]] if example.ndim else []
    used = {i for n in layer.nodes for i in n.input}
    sub = onnx.helper.make_graph(
        layer.nodes,
        f"{layer.name}_quantized",
        [onnx.helper.make_tensor_value_info(layer.source, elem, shape)],
        [onnx.helper.make_tensor_value_info(layer.measured, elem, None)],
        [graph.inits[n] for n in sorted(used) if n in graph.inits],
    )
    model = onnx.helper.make_model(sub, opset_imports=list(graph.model.opset_import))
    model.ir_version = graph.model.ir_version
    return model.SerializeToString()
