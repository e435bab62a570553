"""What NNCF 3.4's ``compress_weights`` writes wrongly into ``MatMulNBits``, put right: the bias
of a following ``Add`` passed again as the bias input (dropped), and 4-bit zero points one per
byte (packed two per byte, low nibble first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

__all__ = ["repair_matmul_nbits"]


def repair_matmul_nbits(model: onnx.ModelProto) -> dict[str, int]:
    """Repair ``model``'s ``MatMulNBits`` in place; the biases dropped and zero points packed."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    inits = {t.name: t for t in model.graph.initializer}
    counts = {"biases_dropped": 0, "zero_points_packed": 0}
    for node in model.graph.node:
        if node.op_type != "MatMulNBits" or node.domain != "com.microsoft":
            continue
        if _drop_repeated_bias(node, consumers.get(node.output[0], [])):
            counts["biases_dropped"] += 1
        if _pack_zero_points(node, inits):
            counts["zero_points_packed"] += 1
    return counts


def _drop_repeated_bias(node: onnx.NodeProto, consumers: list[onnx.NodeProto]) -> bool:
    """Drop the bias input (A, B, scales, zero_points, g_idx, bias) a following ``Add`` adds."""
    if len(node.input) < 6 or not node.input[5]:
        return False
    bias = node.input[5]
    if not any(c.op_type == "Add" and bias in c.input for c in consumers):
        return False
    keep = 4 if node.input[3] else 3
    del node.input[keep:]
    return True


def _pack_zero_points(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
    import numpy as np
    from onnx import TensorProto, numpy_helper

    if len(node.input) < 4 or not node.input[3] or node.input[3] not in inits:
        return False
    tensor = inits[node.input[3]]
    attrs = {a.name: a.i for a in node.attribute}
    if attrs.get("bits", 4) != 4 or tensor.data_type != TensorProto.UINT8:
        return False
    blocks = -(-attrs["K"] // attrs["block_size"])
    values = numpy_helper.to_array(tensor)
    if values.ndim != 2 or values.shape != (attrs["N"], blocks) or blocks == 1:
        return False  # packed already, or one block: one zero point per byte is the packing
    if blocks % 2:
        values = np.concatenate([values, np.zeros((values.shape[0], 1), np.uint8)], axis=1)
    packed = (values[:, 0::2] & 0x0F) | ((values[:, 1::2] & 0x0F) << 4)
    tensor.CopyFrom(numpy_helper.from_array(packed.astype(np.uint8), tensor.name))
    return True
