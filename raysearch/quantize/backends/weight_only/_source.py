"""Weights a library wrote (``algorithm: source``): a node's ``MatMulNBits`` taken from
``weight_source`` (an ONNX model or an onnxruntime-genai folder, e.g. AutoRound's through the
builder).

A float MatMul is matched by name (the same, ``<name>_Q4``/``_Q8``, or ``.../MatMulNBits`` for
``.../MatMul``) and taken only where its weight shape, ``bits`` and ``block_size`` match the
choice. Zero points all at the midpoint are dropped for a symmetric choice; an asymmetric
choice without zero points gets midpoint ones. Anything else is refused in one line
(:func:`source_refusal`) before anything runs.

Example:
    >>> float_name("/model/layers.0/attn/qkv_proj/MatMulNBits")
    '/model/layers.0/attn/qkv_proj/MatMul'
    >>> float_name("/lm_head/MatMul_Q4")
    '/lm_head/MatMul'
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from raysearch.errors import suggest
from raysearch.modelfile import header_problem, load_header
from raysearch.modelfolder import find_model_file
from raysearch.quantize.backends.weight_only._nbits import (
    loaded_tensor,
    midpoint_zero_points,
    replace_matmuls,
)
from raysearch.quantize.backends.weight_only.options import NodeChoice

__all__ = [
    "SourceNode",
    "float_name",
    "source_model_file",
    "source_nodes",
    "source_refusal",
    "write_from_source",
]

#: How the zero points of a source node read: none, all the midpoint, other packed values,
#: or float (HQQ's).
NO_ZERO_POINTS, MIDPOINT, PACKED, FLOAT_ZERO_POINTS = "none", "midpoint", "packed", "float"


@dataclass(frozen=True)
class SourceNode:
    """One ``MatMulNBits`` node of a source model, as :func:`source_refusal` checks it."""

    name: str
    rows: int
    columns: int
    bits: int
    block_size: int
    #: :data:`NO_ZERO_POINTS`, :data:`MIDPOINT`, :data:`PACKED` or :data:`FLOAT_ZERO_POINTS`.
    zero_points: str
    #: Inputs beyond the zero points (``g_idx``, bias) that the float MatMul has no match for.
    extra_inputs: bool


def float_name(name: str) -> str:
    """The float MatMul's name that the source node ``name`` replaces (see the module)."""
    match = re.fullmatch(r"(.*)_Q\d+", name)
    if match:
        return match.group(1)
    if name.endswith("/MatMulNBits"):
        return name[: -len("NBits")]
    return name


def source_model_file(path: str | os.PathLike) -> Path:
    """The model file of ``weight_source`` (a path or a client folder's); ValueError otherwise."""
    given = Path(os.path.expanduser(os.fspath(path)))
    if not given.is_absolute():
        raise ValueError(
            f"weight_source '{path}' is relative: give an absolute path (the trials read it "
            f"from their own working folders)"
        )
    if given.is_dir():
        return find_model_file(given)
    if not given.is_file():
        raise ValueError(f"weight_source: file not found: {given}")
    problem = header_problem(given)
    if problem:
        raise ValueError(f"weight_source {given}: {problem}")
    return given


def _attribute(node: onnx.NodeProto, name: str) -> int | None:
    for attribute in node.attribute:
        if attribute.name == name:
            return int(helper.get_attribute_value(attribute))
    return None


def _zero_points(tensor: onnx.TensorProto | None, bits: int, folder: Path) -> str:
    if tensor is None:
        return NO_ZERO_POINTS
    if tensor.data_type != onnx.TensorProto.UINT8:
        return FLOAT_ZERO_POINTS
    values = numpy_helper.to_array(loaded_tensor(tensor, folder))
    midpoint = 1 << (bits - 1)
    packed = (midpoint << 4) | midpoint if bits == 4 else midpoint
    return MIDPOINT if bool(np.all(values == packed)) else PACKED


@functools.lru_cache(maxsize=8)
def _read(path: str, _mtime_ns: int, _size: int) -> dict[str, SourceNode]:
    """The ``MatMulNBits`` nodes at ``path`` by float name (cached by the file's time and size)."""
    model = load_header(path)
    folder = Path(path).parent
    inits = {t.name: t for t in model.graph.initializer}
    out: dict[str, SourceNode] = {}
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        bits = _attribute(node, "bits") or 4
        zp_name = node.input[3] if len(node.input) > 3 else ""
        out[float_name(node.name)] = SourceNode(
            name=node.name,
            rows=_attribute(node, "K") or 0,
            columns=_attribute(node, "N") or 0,
            bits=bits,
            block_size=_attribute(node, "block_size") or 0,
            zero_points=_zero_points(inits.get(zp_name) if zp_name else None, bits, folder),
            extra_inputs=any(node.input[4:]),
        )
    return out


def source_nodes(path: str | os.PathLike) -> dict[str, SourceNode]:
    """The ``MatMulNBits`` of ``weight_source`` by float name; ValueError when there are none."""
    model = source_model_file(path)
    stat = model.stat()
    nodes = _read(os.fspath(model), stat.st_mtime_ns, stat.st_size)
    if not nodes:
        raise ValueError(f"weight_source {model} has no MatMulNBits node")
    return nodes


def source_refusal(
    choice: NodeChoice, node: str, shape: Sequence[int], nodes: Mapping[str, SourceNode]
) -> str | None:
    """Why the float MatMul ``node`` (weight ``shape``) cannot take its source node at
    ``choice`` (one line), or None."""
    source = nodes.get(node)
    if source is None:
        return f"weight_source has no MatMulNBits for node {node}{suggest(node, nodes)}"
    rows, columns = int(shape[0]), int(shape[1])
    facts = (source.rows, source.columns, source.bits, source.block_size)
    wanted = (rows, columns, choice.bits, choice.block_size)
    if facts != wanted:
        return (
            f"weight_source's node {source.name} is K={source.rows} N={source.columns} "
            f"{source.bits} bits block {source.block_size}; node {node} at algorithm source "
            f"wants K={rows} N={columns} {choice.bits} bits block {choice.block_size}"
        )
    if source.extra_inputs:
        return f"weight_source's node {source.name} has a g_idx or bias input: not a MatMul's"
    if choice.symmetric and source.zero_points in (PACKED, FLOAT_ZERO_POINTS):
        return (
            f"weight_source's node {source.name} has zero points other than the midpoint: "
            f"node {node} at algorithm source needs symmetric false"
        )
    return None


def write_from_source(
    model: onnx.ModelProto, chosen: Mapping[str, NodeChoice], source: str | os.PathLike
) -> None:
    """Replace each MatMul of ``chosen`` by ``source``'s ``MatMulNBits`` (``<name>_Q<bits>``);
    ValueError for a node the source cannot give.
    """
    if not chosen:
        return
    path = source_model_file(source)
    facts = source_nodes(path)
    header = load_header(path)
    folder = path.parent
    source_inits = {t.name: t for t in header.graph.initializer}
    by_name = {n.name: n for n in header.graph.node}

    def tensors_of(
        node: onnx.NodeProto, choice: NodeChoice, weight: onnx.TensorProto
    ) -> list[onnx.TensorProto]:
        reason = source_refusal(choice, node.name, weight.dims, facts)
        if reason:
            raise ValueError(reason)
        original = by_name[facts[node.name].name]
        packed = loaded_tensor(source_inits[original.input[1]], folder)
        scales = loaded_tensor(source_inits[original.input[2]], folder)
        if scales.data_type != weight.data_type:
            raise ValueError(
                f"weight_source's node {original.name} has scales of ONNX type "
                f"{scales.data_type}, the float weight of {node.name} type {weight.data_type}"
            )
        packed.name = f"{weight.name}_Q{choice.bits}"
        scales.name = f"{weight.name}_scales"
        tensors = [packed, scales]
        if not choice.symmetric:
            zp_name = original.input[3] if len(original.input) > 3 else ""
            if zp_name:
                zero_points = loaded_tensor(source_inits[zp_name], folder)
                zero_points.name = f"{weight.name}_zero_points"
            else:
                rows, columns = int(weight.dims[0]), int(weight.dims[1])
                zero_points = midpoint_zero_points(
                    f"{weight.name}_zero_points", columns, rows, choice.bits, choice.block_size
                )
            tensors.append(zero_points)
        return tensors

    replace_matmuls(model.graph, chosen, tensors_of, lambda c: (c.bits, c.block_size))
