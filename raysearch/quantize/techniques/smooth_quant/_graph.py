"""Graph edits of SmoothQuant (private): scaling constants per channel, folding ``X / s``
into the producers of ``X``, and the ``Mul`` inserted where nothing can be folded.

A channel axis is negative (counted from the end): ``-1`` for MatMul and Gemm inputs,
``-(rank - 1)`` (axis 1) for Conv inputs. A fold plan is a list of ``(node, input index,
factor)``: each multiplies a constant input of a node by ``factor`` (broadcast), and the
plan as a whole turns the producer chain's output ``X`` into ``X / s`` without touching any
other tensor. Every tensor of the chain except ``X`` must have a single consumer, so chains
never overlap and their edits commute with the weight scalings of the consumers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import onnx
from onnx import numpy_helper

from raysearch.modelfile import graph_nodes, node_attribute

_logger = logging.getLogger(__name__)

__all__ = ["Graph", "Edit", "shaped"]

#: One constant edit: multiply input ``index`` of ``node`` by ``factor``.
Edit = tuple[onnx.NodeProto, int, np.ndarray]

_FLOAT_TYPES = (np.float16, np.float32, np.float64)
#: Ops with ``f(x / s) = f(x) / s`` for s > 0, elementwise (any channel axis).
_HOMOGENEOUS = ("Relu", "LeakyRelu", "Identity")


def shaped(vector: np.ndarray, axis: int) -> np.ndarray:
    """``vector`` shaped to broadcast along the negative channel ``axis``."""
    return vector.reshape([vector.size] + [1] * (-axis - 1))


def _subgraph_names(node: onnx.NodeProto) -> Iterable[str]:
    """Every tensor name a node's subgraphs (If, Loop, Scan) read."""
    for attribute in node.attribute:
        for graph in [attribute.g, *attribute.graphs]:
            for inner in graph_nodes(graph):
                yield from inner.input


class Graph:
    """The top-level graph of ``model`` with its constants, producers, uses and shapes."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        graph = model.graph
        inputs = {i.name for i in graph.input}
        # An initializer that is also a graph input can be overridden: not a constant.
        self._tensors = {t.name: t for t in graph.initializer if t.name not in inputs}
        self.arrays: dict[str, np.ndarray] = {}
        self.producer = {o: n for n in graph.node for o in n.output if o}
        self.uses: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
        for node in graph.node:
            for index, name in enumerate(node.input):
                if name:
                    self.uses.setdefault(name, []).append((node, index))
        #: Names something other than a top-level node input reads (graph outputs, subgraphs).
        self.hidden = {o.name for o in graph.output}
        for node in graph.node:
            self.hidden.update(_subgraph_names(node))
        #: Known static shapes (None per unknown dim); see :meth:`dim`.
        self.shapes: dict[str, list[int | None]] = {}
        #: ``(tensor, axis, size)`` a fold plan assumed for a tensor of unknown shape.
        self.assumed: list[tuple[str, int, int]] = []
        self._count = 0
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception as exc:  # a model shape inference cannot read still gets probed shapes
            _logger.warning(
                "smooth quant: ONNX shape inference failed (%s: %s); the shapes the model"
                " declares are used",
                type(exc).__name__,
                exc,
            )
            inferred = model
        for info in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
            tensor_type = info.type.tensor_type
            if tensor_type.HasField("shape"):
                self.shapes[info.name] = [
                    d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim
                ]

    def const(self, name: str) -> np.ndarray | None:
        """The value of constant ``name`` (as edited so far), None when it is not one."""
        if name in self.arrays:
            return self.arrays[name]
        tensor = self._tensors.get(name)
        if tensor is None:
            return None
        return numpy_helper.to_array(tensor)

    def scale(self, node: onnx.NodeProto, index: int, factor: np.ndarray) -> None:
        """Multiply constant input ``index`` of ``node`` by ``factor`` (copied when shared)."""
        name = node.input[index]
        value = self.const(name)
        assert value is not None, name
        if len(self.uses.get(name, [])) > 1 or name in self.hidden:
            self._count += 1
            private = f"{name}_sq{self._count}"
            while private in self.producer or private in self._tensors or private in self.uses:
                self._count += 1
                private = f"{name}_sq{self._count}"
            self.uses[name].remove((node, index))
            self.uses[private] = [(node, index)]
            node.input[index] = private
            name = private
        product = value.astype(np.float64) * factor
        self.arrays[name] = product.astype(value.dtype)

    def apply(self, edits: list[Edit]) -> None:
        for node, index, factor in edits:
            self.scale(node, index, factor)

    def rank(self, name: str) -> int | None:
        value = self.const(name)
        if value is not None:
            return value.ndim
        shape = self.shapes.get(name)
        return None if shape is None else len(shape)

    def dim(self, name: str, axis: int) -> int | None:
        shape = self.shapes.get(name)
        if shape is None or len(shape) < -axis:
            return None
        return shape[axis]

    def exclusive(self, name: str) -> bool:
        """Whether ``name`` has exactly one consumer, a top-level node input."""
        return len(self.uses.get(name, [])) == 1 and name not in self.hidden

    def fold(self, name: str, axis: int, inv: np.ndarray) -> list[Edit] | None:
        """Edits that turn ``name`` into ``name * inv`` along ``axis`` (None: no fold)."""
        node = self.producer.get(name)
        if node is None or name in self.hidden:
            return None
        return self._fold_node(node, name, axis, inv)

    def _chain(self, name: str, axis: int, inv: np.ndarray) -> list[Edit] | None:
        """A fold through ``name``, an inner tensor with one consumer and full channels."""
        if not self.exclusive(name) or self.const(name) is not None:
            return None
        size = self.dim(name, axis)
        if size is None:
            if self.rank(name) is not None and self.rank(name) < -axis:  # type: ignore[operator]
                return None
            self.assumed.append((name, axis, inv.size))
        elif size != inv.size:
            return None
        return self.fold(name, axis, inv)

    def _fits(self, const: np.ndarray, axis: int, size: int, out: str) -> bool:
        """Whether ``const * shaped(v, axis)`` keeps the shape of ``out`` (a float)."""
        if const.dtype.type not in _FLOAT_TYPES:
            return False
        if const.ndim >= -axis:
            return const.shape[axis] in (1, size)
        rank = self.rank(out)
        return rank is not None and rank >= -axis

    def _fold_node(
        self, node: onnx.NodeProto, out: str, axis: int, inv: np.ndarray
    ) -> list[Edit] | None:
        op = node.op_type
        if op in _HOMOGENEOUS:
            return self._chain(node.input[0], axis, inv)
        if op == "MatMul" and axis == -1 and self.const(node.input[1]) is None:
            if self.rank(node.input[1]) == 1:
                return None  # a vector B has no output axis to scale
            return self._chain(node.input[1], axis, inv)  # A @ (B / s) = (A @ B) / s
        fold = {
            "LayerNormalization": self._fold_layernorm,
            "MatMul": self._fold_linear,
            "Gemm": self._fold_linear,
            "Conv": self._fold_conv,
            "Mul": self._fold_mul,
            "Div": self._fold_div,
            "Add": self._fold_add,
            "Sub": self._fold_add,
        }.get(op)
        return None if fold is None else fold(node, out, axis, inv)

    def _fold_layernorm(
        self, node: onnx.NodeProto, out: str, axis: int, inv: np.ndarray
    ) -> list[Edit] | None:
        norm_axis = int(node_attribute(node, "axis", -1))
        if norm_axis >= 0:
            rank = self.rank(out)
            if rank is None:
                return None
            norm_axis -= rank
        if norm_axis > axis or any(node.output[1:]):
            return None  # the channel is not normalized, or mean / inv-std are outputs too
        edits: list[Edit] = []
        for index in (1, 2):
            if index < len(node.input) and node.input[index]:
                if self.const(node.input[index]) is None:
                    return None
                edits.append((node, index, shaped(inv, axis)))
        return edits

    def _fold_linear(
        self, node: onnx.NodeProto, out: str, axis: int, inv: np.ndarray
    ) -> list[Edit] | None:
        """MatMul / Gemm with a constant weight: its output columns (and Gemm's bias)."""
        weight = self.const(node.input[1])
        if axis != -1 or weight is None or weight.ndim < 2 or weight.dtype.type not in _FLOAT_TYPES:
            return None
        if self.const(node.input[0]) is not None:
            return None
        if node.op_type == "MatMul":
            return [(node, 1, inv)]
        edits = [(node, 1, inv[:, None] if int(node_attribute(node, "transB", 0)) else inv)]
        if len(node.input) > 2 and node.input[2]:
            bias = self.const(node.input[2])
            if bias is None or not self._fits(bias, axis, inv.size, out):
                return None
            edits.append((node, 2, inv))
        return edits

    def _fold_conv(
        self, node: onnx.NodeProto, out: str, axis: int, inv: np.ndarray
    ) -> list[Edit] | None:
        """Conv with a constant weight: its output channels and bias."""
        weight = self.const(node.input[1])
        if weight is None or axis != -(weight.ndim - 1) or weight.dtype.type not in _FLOAT_TYPES:
            return None
        edits = [(node, 1, inv.reshape([inv.size] + [1] * (weight.ndim - 1)))]
        if len(node.input) > 2 and node.input[2]:
            if self.const(node.input[2]) is None:
                return None
            edits.append((node, 2, inv))
        return edits

    def _fold_mul(
        self, node: onnx.NodeProto, out: str, axis: int, inv: np.ndarray
    ) -> list[Edit] | None:
        a, b = node.input[0], node.input[1]
        if a == b:
            return None
        for const_at, other in ((1, a), (0, b)):
            value = self.const(node.input[const_at])
            if value is not None:
                if self.const(other) is not None or not self._fits(value, axis, inv.size, out):
                    return None
                return [(node, const_at, shaped(inv, axis))]
        for operand in (a, b):  # scaling either factor scales the product
            mark = len(self.assumed)
            edits = self._chain(operand, axis, inv)
            if edits is not None:
                return edits
            del self.assumed[mark:]
        return None

    def _fold_div(
        self, node: onnx.NodeProto, out: str, axis: int, inv: np.ndarray
    ) -> list[Edit] | None:
        value = self.const(node.input[1])
        if value is None or self.const(node.input[0]) is not None:
            return None
        if not self._fits(value, axis, inv.size, out):
            return None
        return [(node, 1, shaped(1 / inv, axis))]  # A / (C s) = (A / C) / s

    def _fold_add(
        self, node: onnx.NodeProto, out: str, axis: int, inv: np.ndarray
    ) -> list[Edit] | None:
        """Add / Sub: every operand scaled (constants directly, the others by folding)."""
        if node.input[0] == node.input[1]:
            return None
        edits: list[Edit] = []
        for index, operand in enumerate(node.input[:2]):
            value = self.const(operand)
            if value is not None:
                if not self._fits(value, axis, inv.size, out):
                    return None
                edits.append((node, index, shaped(inv, axis)))
            else:
                inner = self._chain(operand, axis, inv)
                if inner is None:
                    return None
                edits += inner
        return edits

    def insert_mul(
        self, name: str, consumers: list[onnx.NodeProto], factor: np.ndarray, dtype: np.dtype
    ) -> str:
        """Feed ``consumers`` a new ``Mul(name, factor)``; the new tensor's name."""
        self._count += 1
        out = f"{name}_smooth_quant{self._count}"
        const = f"{name}_smooth_quant_scale{self._count}"
        self.arrays[const] = factor.astype(dtype)
        self._tensors[const] = numpy_helper.from_array(self.arrays[const], const)
        nodes = self.model.graph.node
        mul = onnx.helper.make_node(
            "Mul", [name, const], [out], name=f"{name}_smooth_quant_mul{self._count}"
        )
        first = min(i for i, n in enumerate(nodes) if any(n is c for c in consumers))
        for consumer in consumers:
            for index, value in enumerate(consumer.input):
                if value == name:
                    consumer.input[index] = out
        nodes.insert(first, mul)
        return out

    def write(self) -> onnx.ModelProto:
        """The model with every edited constant stored and unused initializers dropped."""
        graph = self.model.graph
        used = {i for n in graph.node for i in n.input} | self.hidden
        used |= {i.name for i in graph.input}
        kept = []
        for tensor in graph.initializer:
            if tensor.name in used:
                if tensor.name in self.arrays:
                    tensor = numpy_helper.from_array(self.arrays[tensor.name], tensor.name)
                kept.append(tensor)
        names = {t.name for t in kept}
        for name, value in self.arrays.items():
            if name not in names and name in used:
                kept.append(numpy_helper.from_array(value, name))
        del graph.initializer[:]
        graph.initializer.extend(kept)
        return self.model
