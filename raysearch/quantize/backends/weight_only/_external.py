"""A float model with external data quantized without holding its weights.

:func:`weights_on_demand` wraps ``MatMulNBitsQuantizer``'s node quantizer: the node's
external tensors are read into a scratch graph put innermost on ``graph_stack``, where the
quantizer reads them and writes its quantized tensors; those move to the float weight's graph
and the scratch graph goes (a separate graph: protobuf's arena keeps a cleared field's bytes).
What no pass rewrote is read in by :func:`load_remaining` before the model is written.

Example:
    >>> import onnx
    >>> g = onnx.helper.make_graph([], "g", [], [], [onnx.TensorProto(name="w")])
    >>> _initializer("w", [g])[1] is g
    True
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import onnx
from onnx.external_data_helper import (
    load_external_data_for_model,
    load_external_data_for_tensor,
    uses_external_data,
)

__all__ = ["weights_on_demand", "load_remaining"]


def _initializer(
    name: str, graph_stack: Sequence[onnx.GraphProto]
) -> tuple[onnx.TensorProto, onnx.GraphProto] | tuple[None, None]:
    """The initializer ``name`` as a node of the innermost graph sees it, and its graph."""
    for graph in reversed(graph_stack):
        for tensor in graph.initializer:
            if tensor.name == name:
                return tensor, graph
    return None, None


@contextmanager
def weights_on_demand(quantizer: Any, base_dir: str | os.PathLike) -> Iterator[None]:
    """While ``quantizer`` runs, read each node's external tensors from ``base_dir`` on demand."""
    node_quantizer, folder = quantizer.node_quantizer, os.fspath(base_dir)
    original = node_quantizer.quantize

    def quantize(node: onnx.NodeProto, graph_stack: list[onnx.GraphProto]) -> list:
        scratch, owner = onnx.GraphProto(), None
        for name in dict.fromkeys(n for n in node.input if n):
            tensor, graph = _initializer(name, graph_stack)
            if tensor is not None and uses_external_data(tensor):
                copy = scratch.initializer.add()
                copy.CopyFrom(tensor)
                load_external_data_for_tensor(copy, folder)
                copy.data_location = onnx.TensorProto.DEFAULT
                del copy.external_data[:]
                owner = graph
        if owner is None:
            return original(node, graph_stack)
        read = {t.name for t in scratch.initializer}
        out = original(node, [*graph_stack, scratch])
        owner.initializer.extend(t for t in scratch.initializer if t.name not in read)
        return out

    node_quantizer.quantize = quantize
    try:
        yield
    finally:
        del node_quantizer.quantize  # the class's method again


def load_remaining(model: onnx.ModelProto, base_dir: str | os.PathLike) -> None:
    """Read in every tensor of ``model`` still external in ``base_dir`` (what no pass rewrote)."""
    load_external_data_for_model(model, os.fspath(base_dir))
