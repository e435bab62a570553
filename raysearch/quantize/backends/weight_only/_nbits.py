"""A float MatMul replaced by a ``MatMulNBits`` whose tensors raysearch wrote itself (weights
taken from a source model, or rounded by GPTQ): named and attributed as ONNX Runtime's RTN
writes them, so every later step (``accuracy_level``, the size, the report) reads them alike.

Example:
    >>> import numpy as np
    >>> midpoint_zero_points("w_zero_points", columns=2, rows=96, bits=4, block_size=32).dims
    [2, 2]
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

__all__ = [
    "loaded_tensor",
    "midpoint_zero_points",
    "replace_matmul",
    "replace_matmuls",
    "remove_unread",
]

_Choice = TypeVar("_Choice")


def loaded_tensor(tensor: onnx.TensorProto, folder: str | os.PathLike) -> onnx.TensorProto:
    """A copy of ``tensor`` with its data read in (from ``folder`` when external)."""
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    if uses_external_data(copy):
        load_external_data_for_tensor(copy, os.fspath(folder))
        copy.data_location = onnx.TensorProto.DEFAULT
        del copy.external_data[:]
    return copy


def midpoint_zero_points(
    name: str, columns: int, rows: int, bits: int, block_size: int
) -> onnx.TensorProto:
    """Midpoint zero points packed as ``MatMulNBits`` reads them (``8 // bits`` to a byte)."""
    blocks = -(-rows // block_size)
    midpoint = 1 << (bits - 1)
    byte = (midpoint << 4) | midpoint if bits == 4 else midpoint
    per_column = -(-blocks * bits // 8)
    return numpy_helper.from_array(np.full((columns, per_column), byte, np.uint8), name)


def replace_matmul(
    graph: onnx.GraphProto,
    index: int,
    weight: onnx.TensorProto,
    tensors: Sequence[onnx.TensorProto],
    bits: int,
    block_size: int,
) -> None:
    """The MatMul at ``graph.node[index]`` (weight ``weight``) as ``MatMulNBits`` reading
    ``tensors`` (packed weights, scales and, when asymmetric, zero points; added to the
    graph), named ``<name>_Q<bits>`` as ONNX Runtime names it."""
    node = graph.node[index]
    replaced = helper.make_node(
        "MatMulNBits",
        [node.input[0], *(t.name for t in tensors)],
        list(node.output),
        name=f"{node.name}_Q{bits}",
        domain="com.microsoft",
        K=int(weight.dims[0]),
        N=int(weight.dims[1]),
        bits=bits,
        block_size=block_size,
    )
    graph.node[index].CopyFrom(replaced)
    graph.initializer.extend(tensors)


def replace_matmuls(
    graph: onnx.GraphProto,
    chosen: Mapping[str, _Choice],
    tensors_of: Callable[[onnx.NodeProto, _Choice, onnx.TensorProto], Sequence[onnx.TensorProto]],
    bits_and_block: Callable[[_Choice], tuple[int, int]],
) -> None:
    """Each MatMul of ``chosen`` (by node name) as ``MatMulNBits`` reading the tensors
    ``tensors_of(node, choice, weight)`` writes, at ``bits_and_block(choice)``; the float
    weights no node reads any more dropped."""
    inits = {t.name: t for t in graph.initializer}
    replaced: set[str] = set()
    for index, node in enumerate(list(graph.node)):
        if node.name not in chosen:
            continue
        choice, weight = chosen[node.name], inits[node.input[1]]
        tensors = tensors_of(node, choice, weight)
        replace_matmul(graph, index, weight, tensors, *bits_and_block(choice))
        replaced.add(weight.name)
    remove_unread(graph, replaced)


def remove_unread(graph: onnx.GraphProto, names: set[str]) -> None:
    """Drop the initializers of ``names`` that no node reads any more (replaced weights)."""
    read = {name for n in graph.node for name in n.input}
    for tensor in [t for t in graph.initializer if t.name in names - read]:
        graph.initializer.remove(tensor)
