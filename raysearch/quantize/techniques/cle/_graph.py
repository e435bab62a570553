"""Graph side of cross-layer equalization: which layer pairs qualify, and their channel views.

A pair is a head layer, the ops between (each positively homogeneous per channel, so scaling
a channel by ``s > 0`` before them scales it by ``s`` after) and a tail layer that contracts
the head's output channels. Both layers are of one family: ``Conv`` -> ``Conv`` (channel axis
1), or ``Gemm``/``MatMul`` -> ``Gemm``/``MatMul`` (feature axis last); a mixed pair would
contract another axis. Every tensor from the head to the tail has exactly one consumer and is
no graph output, and every weight and bias is an initializer used by that node only, so
rescaling it changes nothing else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from raysearch.modelfile import node_attribute

__all__ = ["Layer", "find_pairs"]

#: Ops between head and tail that commute with a positive per-channel scale.
_HOMOGENEOUS = {"Relu", "LeakyRelu", "MaxPool", "AveragePool", "Identity"}
_CLIP_OPEN = 3.0e38  # Clip's attribute defaults (opset < 11) are +-FLT_MAX: "no bound"


@dataclass
class Layer:
    """One linear layer (``conv``, ``gemm``, ``matmul``); a MatMul's ``bias`` is its Add's."""

    node: onnx.NodeProto
    kind: str
    weight: str
    bias: str | None = None
    trans_b: bool = False
    groups: int = 1
    #: The tensor the layer's output leaves through (after the bias Add of a MatMul).
    output: str = ""

    @property
    def family(self) -> str:
        return "conv" if self.kind == "conv" else "dense"

    def out_rows(self, w: np.ndarray) -> np.ndarray:
        """``w`` as ``[output channel, weights of that channel]``."""
        if self.kind == "conv":
            return w.reshape(w.shape[0], -1)
        return w if self.trans_b else w.T

    def scale_out(self, w: np.ndarray, factor: np.ndarray) -> np.ndarray:
        """``w`` with output channel ``i`` multiplied by ``factor[i]``."""
        if self.kind == "conv":
            return w * factor.reshape((-1,) + (1,) * (w.ndim - 1))
        return w * (factor[:, None] if self.trans_b else factor[None, :])

    def in_rows(self, w: np.ndarray) -> np.ndarray:
        """``w`` as ``[input channel, weights reading that channel]``."""
        if self.kind == "conv":
            g, cpg = self.groups, w.shape[1]
            per_group = w.reshape(g, w.shape[0] // g, cpg, -1)  # [g, out/g, in/g, k]
            return per_group.transpose(0, 2, 1, 3).reshape(g * cpg, -1)
        return w.T if self.trans_b else w

    def scale_in(self, w: np.ndarray, factor: np.ndarray) -> np.ndarray:
        """``w`` with the weights reading input channel ``c`` multiplied by ``factor[c]``."""
        if self.kind == "conv":
            g, cpg = self.groups, w.shape[1]
            # Output o of group k reads input channels k*cpg ... k*cpg + cpg - 1.
            per_out = np.repeat(factor.reshape(g, cpg), w.shape[0] // g, axis=0)
            return w * per_out.reshape(per_out.shape + (1,) * (w.ndim - 2))
        return w * (factor[None, :] if self.trans_b else factor[:, None])

    def out_channels(self, w: np.ndarray) -> int:
        return self.out_rows(w).shape[0]

    def in_channels(self, w: np.ndarray) -> int:
        return self.in_rows(w).shape[0]


def channel_last(bias: np.ndarray, channels: int) -> np.ndarray | None:
    """``bias`` with its last axis spelled out to ``channels``, or None."""
    if bias.ndim == 0:
        return np.full(channels, bias, bias.dtype)
    if bias.shape[-1] == channels:
        return bias
    if bias.shape[-1] == 1:
        return np.broadcast_to(bias, bias.shape[:-1] + (channels,)).copy()
    return None


class _Graph:
    def __init__(self, graph: onnx.GraphProto) -> None:
        self.inits = {t.name: t for t in graph.initializer}
        self.outputs = {o.name for o in graph.output}
        inputs = {i.name for i in graph.input}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        uses: Counter[str] = Counter()
        for node in graph.node:
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append(node)
                    uses[name] += 1
            for attribute in node.attribute:  # a subgraph may read an initializer too
                for sub in [attribute.g, *attribute.graphs]:
                    for inner in sub.node:
                        uses.update(n for n in inner.input if n)
        # An initializer that is also a graph input can be overridden at run time.
        self.private = {n for n in self.inits if uses[n] == 1 and n not in inputs}

    def const(self, name: str) -> np.ndarray | None:
        tensor = self.inits.get(name)
        return None if tensor is None else numpy_helper.to_array(tensor)

    def only_consumer(self, tensor: str) -> onnx.NodeProto | None:
        users = self.consumers.get(tensor, [])
        if len(users) != 1 or tensor in self.outputs:
            return None
        return users[0]

    def float_weight(self, name: str, ndim: int | None = None) -> bool:
        array = self.const(name) if name in self.private else None
        return (
            array is not None
            and np.issubdtype(array.dtype, np.floating)
            and (ndim is None or array.ndim == ndim)
        )

    def layer(self, node: onnx.NodeProto) -> Layer | None:
        """``node`` as a layer whose weights may be rescaled, else None."""
        if len(node.input) < 2 or len(node.output) != 1:
            return None
        weight = node.input[1]
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if bias is not None and not self.float_weight(bias):
            return None
        if node.op_type == "Conv":
            groups = int(node_attribute(node, "group", 1))
            if not self.float_weight(weight) or self.const(weight).ndim < 3:
                return None
            return Layer(node, "conv", weight, bias, groups=groups, output=node.output[0])
        if node.op_type == "Gemm":
            if node_attribute(node, "transA", 0) or not self.float_weight(weight, 2):
                return None
            trans_b = bool(node_attribute(node, "transB", 0))
            return Layer(node, "gemm", weight, bias, trans_b=trans_b, output=node.output[0])
        if node.op_type == "MatMul" and self.float_weight(weight, 2):
            return Layer(node, "matmul", weight, output=node.output[0])
        return None

    def bias_add(self, layer: Layer) -> None:
        """Take the Add of a constant right after a MatMul as its bias."""
        add = self.only_consumer(layer.output)
        if add is None or add.op_type != "Add":
            return
        other = [n for n in add.input if n != layer.output]
        if len(other) != 1 or not self.float_weight(other[0]):
            return
        channels = self.const(layer.weight).shape[1]
        if channel_last(self.const(other[0]), channels) is None:
            return
        layer.bias, layer.output = other[0], add.output[0]

    def homogeneous(self, node: onnx.NodeProto) -> bool:
        """Whether ``node`` commutes with a positive per-channel scale of its input."""
        if node.op_type in _HOMOGENEOUS:
            return sum(1 for o in node.output if o) == 1
        if node.op_type != "Clip":
            return False
        # Clip commutes with a scale only as Relu (min 0) or identity, with no max.
        if any(a.name in ("min", "max") for a in node.attribute):  # opset < 11
            low, high = node_attribute(node, "min"), node_attribute(node, "max")
        else:
            bounds = [node.input[i] if len(node.input) > i else "" for i in (1, 2)]
            if any(b and b not in self.inits for b in bounds):
                return False
            low, high = (float(self.const(b).reshape(-1)[0]) if b else None for b in bounds)
        no_max = high is None or high >= _CLIP_OPEN
        return no_max and (low is None or low == 0.0 or low <= -_CLIP_OPEN)


def find_pairs(model: onnx.ModelProto) -> list[tuple[Layer, Layer]]:
    """The (head, tail) layer pairs that may be equalized, in graph order."""
    graph = _Graph(model.graph)
    by_node: dict[int, Layer] = {}
    for node in model.graph.node:
        layer = graph.layer(node)
        if layer is not None:
            if layer.kind == "matmul":
                graph.bias_add(layer)
            by_node[id(node)] = layer
    pairs = []
    for head in by_node.values():
        tensor = head.output
        while True:
            nxt = graph.only_consumer(tensor)
            if nxt is None:
                break
            tail = by_node.get(id(nxt))
            if tail is not None:
                if nxt.input[0] == tensor and _fits(head, tail, graph):
                    pairs.append((head, tail))
                break
            if not graph.homogeneous(nxt) or nxt.input[0] != tensor:
                break
            tensor = nxt.output[0]
    return pairs


def _fits(head: Layer, tail: Layer, graph: _Graph) -> bool:
    if head.family != tail.family or head.node is tail.node:
        return False
    w1, w2 = graph.const(head.weight), graph.const(tail.weight)
    if tail.kind == "conv" and (w2.shape[0] % tail.groups or not tail.groups):
        return False
    channels = head.out_channels(w1)
    if head.bias is not None and channel_last(graph.const(head.bias), channels) is None:
        return False
    return channels == tail.in_channels(w2)


def weights_of(model: onnx.ModelProto, pairs: list[tuple[Layer, Layer]]) -> dict[str, np.ndarray]:
    """The float64 arrays of every initializer the pairs rescale, by name."""
    names = {n for pair in pairs for layer in pair for n in (layer.weight, layer.bias) if n}
    inits: Mapping[str, onnx.TensorProto] = {t.name: t for t in model.graph.initializer}
    return {n: numpy_helper.to_array(inits[n]).astype(np.float64) for n in names}
