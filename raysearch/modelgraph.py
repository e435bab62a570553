"""What an ONNX model's graph holds, beyond its files (:mod:`raysearch.modelfile`): how many
weighted nodes (MatMul/Gemm/Conv) it has, the share of them a quantized model runs quantized
(what the best rule and the samplers read) and whether that share means it quantizes nothing,
and weights held by ``Constant`` nodes turned into initializers (where the quantizer and the
techniques look for weights).

Example:
    >>> WEIGHTED_OP_TYPES
    ('MatMul', 'Gemm', 'Conv', 'ConvTranspose')
"""

from __future__ import annotations

import os
from collections.abc import Collection

import onnx

from raysearch.modelfile import graph_nodes, load_header

__all__ = [
    "WEIGHTED_OP_TYPES",
    "weighted_nodes",
    "quantized_share",
    "quantizes_nothing",
    "constants_to_initializers",
    "weight_matmuls",
    "embedding_gathers",
]


#: Op types whose quantization decides a model's speed (the ones with weights or a product).
WEIGHTED_OP_TYPES = ("MatMul", "Gemm", "Conv", "ConvTranspose")
# What quantized forms of them ONNX Runtime's QOperator and dynamic quantizers leave behind.
_INTEGER_OP_TYPES = frozenset(
    {
        "QLinearMatMul",
        "QLinearConv",
        "QGemm",
        "MatMulInteger",
        "ConvInteger",
        "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul",
        "QLinearConvTranspose",
    }
)


def weighted_nodes(model: str | os.PathLike | onnx.ModelProto) -> int:
    """How many MatMul/Gemm/Conv/ConvTranspose nodes ``model`` has (subgraphs included)."""
    return sum(n.op_type in WEIGHTED_OP_TYPES for n in graph_nodes(_proto(model).graph))


def _proto(source: str | os.PathLike | onnx.ModelProto) -> onnx.ModelProto:
    return source if isinstance(source, onnx.ModelProto) else load_header(source)


def quantized_share(
    model: str | os.PathLike | onnx.ModelProto,
    float_model: str | os.PathLike | onnx.ModelProto | int,
) -> float | None:
    """The share of ``float_model``'s MatMul/Gemm/Conv/ConvTranspose nodes (or of that many)
    that run quantized in ``model``; None when there are none.

    Example:
        >>> from onnx import TensorProto, helper
        >>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
        >>> y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
        >>> def model(*nodes):
        ...     return helper.make_model(helper.make_graph(list(nodes), "g", [x], [y]))
        >>> fp = model(helper.make_node("MatMul", ["x", "x"], ["y"]))
        >>> dq = helper.make_node("DequantizeLinear", ["q", "s"], ["xd"])
        >>> quantized_share(model(dq, helper.make_node("MatMul", ["xd", "xd"], ["y"])), fp)
        1.0
    """
    total = float_model if isinstance(float_model, int) else weighted_nodes(float_model)
    if not total:
        return None
    nodes = list(graph_nodes(_proto(model).graph))
    dequantized = {o for n in nodes if n.op_type == "DequantizeLinear" for o in n.output}
    quantized = sum(
        n.op_type in _INTEGER_OP_TYPES
        # Both operands (data and weight; not the bias) dequantized: an excluded node may
        # still read its producer's QDQ output, but its weight stays float.
        or (n.op_type in WEIGHTED_OP_TYPES and all(i in dequantized for i in n.input[:2]))
        for n in nodes
    )
    return min(1.0, quantized / total)


def quantizes_nothing(share: float | None, weighted: int) -> bool:
    """Whether a model with :func:`quantized_share` ``share`` keeps all ``weighted`` nodes float
    (never a candidate).

    Example:
        >>> quantizes_nothing(0.0, 2), quantizes_nothing(0.5, 2), quantizes_nothing(None, 0)
        (True, False, False)
    """
    return weighted > 0 and share is not None and share == 0


def constants_to_initializers(model: onnx.ModelProto, keep_inputs_of: Collection[str] = ()) -> int:
    """Turn the main graph's tensor ``Constant`` nodes into initializers in place; how many. One
    read by an op type in ``keep_inputs_of`` stays (NNCF reads a ``Cast``'s input type).
    """
    kept, moved = [], 0
    read = {name for n in model.graph.node if n.op_type in keep_inputs_of for name in n.input}
    for node in model.graph.node:
        value = next((a for a in node.attribute if a.name == "value"), None)
        constant = node.op_type == "Constant" and node.domain in ("", "ai.onnx")
        if constant and value is not None and node.output[0] not in read:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(value.t)
            tensor.name = node.output[0]
            model.graph.initializer.append(tensor)
            moved += 1
        else:
            kept.append(node)
    if moved:
        del model.graph.node[:]
        model.graph.node.extend(kept)
    return moved


def weight_matmuls(model: onnx.ModelProto) -> list[str]:
    """Names of the MatMul nodes with a 2-D float initializer weight, in graph order."""
    inits = {t.name: t for t in model.graph.initializer}
    out = []
    for node in model.graph.node:
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" else None
        if weight is not None and len(weight.dims) == 2 and weight.data_type in (1, 10, 16):
            out.append(node.name)
    return out


def embedding_gathers(model: onnx.ModelProto) -> list[str]:
    """Names of the Gather nodes that read rows of a 2-D float initializer (embeddings)."""
    inits = {t.name: t for t in model.graph.initializer}
    return [
        n.name
        for n in model.graph.node
        if n.op_type == "Gather"
        and n.input[0] in inits
        and len(inits[n.input[0]].dims) == 2
        and inits[n.input[0]].data_type in (1, 10, 16)
    ]
