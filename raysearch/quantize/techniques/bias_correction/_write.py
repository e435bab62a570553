"""Writing a corrected bias as the model stores it: an int32 bias requantized with its scale
(at the scale ONNX Runtime's fused kernels read it), a constant quantized like an activation
requantized (with a covering scale and zero point when needed), a float bias in float."""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import TensorProto

from raysearch.quantize._qdq_graph import QTYPES, QdqGraph, dequantize, quantize
from raysearch.quantize.techniques.bias_correction._layers import Layer

__all__ = ["kernel_bias_scale", "corrected_bias_values", "write_bias"]

_logger = logging.getLogger("raysearch.quantize.techniques.bias_correction")


def kernel_bias_scale(graph: QdqGraph, layer: Layer) -> np.ndarray | None:
    """The scale fused integer kernels read an int32 bias with (input * weight scale) where the
    model's bias has another (a Gemm with beta != 1), else None.
    """
    dq = graph.constant_dq(layer.bias)
    if dq is None or graph.elem_type(dq.input[0]) != TensorProto.INT32:
        return None
    node = graph.producer[layer.output]
    scales = []
    for name in node.input[:2]:
        source = graph.producer.get(name)
        if source is None or source.op_type != "DequantizeLinear" or not graph.has_qparams(source):
            return None
        scales.append(graph.qparams(source)[0].astype(np.float64).reshape(-1))
    expected = scales[0] * scales[1]
    scale = graph.qparams(dq)[0].astype(np.float64).reshape(-1)
    if expected.size not in (1, scale.size) or np.allclose(scale, expected, rtol=1e-4):
        return None
    return np.broadcast_to(expected, scale.shape).astype(np.float32)


def corrected_bias_values(
    graph: QdqGraph, bias: str, delta: np.ndarray
) -> tuple[np.ndarray, onnx.NodeProto | None] | None:
    """``(bias - delta, its DequantizeLinear or None)``; None when it cannot be corrected."""
    dq = graph.constant_dq(bias)
    if dq is not None:
        scale, zero_point, axis, _ = graph.qparams(dq)
        current = dequantize(graph.array(dq.input[0]), scale, zero_point, axis)
    elif bias in graph.inits:
        current = graph.array(bias).astype(np.float64)
    else:
        return None
    if delta.size not in (1, current.size):
        return None
    return current - np.broadcast_to(delta.reshape(-1), (current.size,)).reshape(current.shape), dq


def _covering(
    values: np.ndarray, scale: float, zero_point: int, qmin: int, qmax: int, symmetric: int
) -> tuple[float, int]:
    """A per-tensor scale and zero point covering ``values`` (ONNX Runtime's rule; a power of
    two when ``scale`` was one).
    """
    low, high = min(0.0, float(values.min())), max(0.0, float(values.max()))
    if zero_point == symmetric:
        new = max(high / (qmax - symmetric), -low / (symmetric - qmin))
    else:
        new = (high - low) / (qmax - qmin)
    new = new or scale
    exponent = np.log2(scale)
    if exponent == np.round(exponent):
        new = float(2.0 ** np.ceil(np.log2(new)))
    if zero_point != symmetric:
        zero_point = int(np.clip(np.rint(qmin - low / new), qmin, qmax))
    return new, zero_point


def write_bias(graph: QdqGraph, layer: Layer, delta: np.ndarray) -> bool:
    """Write ``bias - delta`` into the layer's bias as the model stores it."""
    found = corrected_bias_values(graph, layer.bias, delta)
    if found is None:
        _logger.debug("bias_correction: bias of %s cannot be corrected", layer.name)
        return False
    values, dq = found
    if dq is None:  # a float bias
        ids = {id(n) for n in layer.nodes}
        owner = next(n for n in graph.consumers[layer.bias] if id(n) in ids)
        index = list(owner.input).index(layer.bias)
        graph.set_array(graph.clone_input(owner, index, "bc"), values)
        return True
    if len(graph.consumers.get(dq.output[0], [])) > 1:
        _logger.debug("bias_correction: bias of %s is shared; left as is", layer.name)
        return False
    scale, zero_point, axis, elem = graph.qparams(dq)
    qmin, qmax, symmetric = QTYPES[graph.elem_type(dq.input[0])]
    graph.clone_input(dq, 0, "bc")
    kernel_scale = kernel_bias_scale(graph, layer)
    if kernel_scale is not None:
        # Written at the scale the fused kernels read: the unfused and fused models agree.
        graph.clone_input(dq, 1, "bc")
        graph.set_array(dq.input[1], kernel_scale.reshape(scale.shape))
        scale = kernel_scale.reshape(scale.shape)
    q = quantize(values, scale, zero_point, qmin, qmax, axis)
    unclamped = quantize(values, scale, zero_point, -(2**62), 2**62, axis)
    clamped = int(np.count_nonzero(q != unclamped))
    if clamped and elem != TensorProto.INT32 and scale.size == 1:
        # A constant quantized like an activation: a scale and zero point that hold it.
        old = (float(scale.reshape(-1)[0]), int(zero_point.reshape(-1)[0]))
        new_scale, new_zp = _covering(values, *old, qmin, qmax, symmetric)
        for index in (1, 2):
            graph.clone_input(dq, index, "bc")
        graph.set_array(dq.input[1], np.full(scale.shape, new_scale))
        graph.set_zero_point(dq, np.full(np.shape(zero_point), new_zp), elem)
        q = quantize(values, np.float32(new_scale), np.int64(new_zp), qmin, qmax, axis)
    elif clamped:
        _logger.warning(
            "bias_correction: corrected bias of %s clamped to its type's range (%d values)",
            layer.name, clamped,
        )  # fmt: skip
    graph.set_array(dq.input[0], q)
    return True
