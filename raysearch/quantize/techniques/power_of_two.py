"""Power-of-two scales: every scale of the quantized QDQ model becomes ``2**e`` (Quark's
``PowerOfTwoMethod``), so integer back ends can rescale with shifts.

``extra_options.PowerOfTwoMethod`` picks each exponent (per channel for per-channel weights):
``NonOverflow``, the smallest power of two whose symmetric range covers the tensor's; or
``MinMSE``, that or one or two lower, whichever has the least squared error (activations on
the first :data:`MSE_BATCHES` calibration batches). Zero points become symmetric; weights and
biases are requantized from their float values; a Relu is put back where an activation's range
started at 0. QDQ models only.

Example:
    >>> nonoverflow_exponent(np.float64(-1.0), np.float64(3.0), -128, 127, 0).item()
    -5.0
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
import onnx

from raysearch.errors import ConfigError
from raysearch.quantize._qdq_graph import (
    QTYPES,
    QdqGraph,
    bcast,
    constant_float_values,
    float_initializers,
    float_tensor_name,
    load_model,
    model_tensor_names,
    quantize,
    run_with_outputs,
    save_model,
)
from raysearch.quantize.technique import QuantizedModelTransform, register_technique
from raysearch.space.catalogue import OptionSpec

__all__ = ["PowerOfTwoScales", "METHODS", "MSE_BATCHES", "nonoverflow_exponent", "to_power_of_two"]

_logger = logging.getLogger(__name__)

METHODS = ("NonOverflow", "MinMSE")
#: Calibration batches whose activations MinMSE measures.
MSE_BATCHES = 4
#: MinMSE tries the NonOverflow exponent and this many lower ones.
_LOWER = 2
_BIAS_OPS = {"Conv": 2, "Gemm": 2, "ConvTranspose": 2}


def nonoverflow_exponent(
    rmin: np.ndarray, rmax: np.ndarray, qmin: int, qmax: int, zero_point: int,
    fallback: np.ndarray | float = 0.0,
) -> np.ndarray:  # fmt: skip
    """The smallest ``e`` whose symmetric range covers ``[rmin, rmax]``; ``fallback`` for zeros."""
    rmin = np.minimum(np.asarray(rmin, np.float64), 0.0)
    rmax = np.maximum(np.asarray(rmax, np.float64), 0.0)
    need = np.maximum(rmax / (qmax - zero_point), rmin / (qmin - zero_point))
    safe = np.where(need > 0, need, 1.0)
    e = np.ceil(np.log2(safe))
    # log2 of a float may land a hair off an integer: settle on the exact smallest power.
    e = np.where(np.exp2(e - 1) >= safe, e - 1, e)
    e = np.where(np.exp2(e) < safe, e + 1, e)
    e = np.where(need > 0, e, np.broadcast_to(np.asarray(fallback, np.float64), e.shape))
    return np.clip(e, -140.0, 120.0)


def _reduce(values: np.ndarray, axis: int | None, per_channel: bool) -> tuple[np.ndarray, ...]:
    """``(min, max)`` of ``values``, per slice along ``axis`` when ``per_channel``."""
    if not per_channel or values.ndim == 0:
        return np.min(values), np.max(values)
    axis = (axis if axis is not None else 1) % values.ndim
    others = tuple(i for i in range(values.ndim) if i != axis)
    return np.min(values, axis=others), np.max(values, axis=others)


def _sse(values: np.ndarray, exponent: np.ndarray, elem: int, axis: int | None) -> np.ndarray:
    """Squared error of quantizing ``values`` at scales ``2**exponent`` (per channel)."""
    qmin, qmax, zp = QTYPES[elem]
    # Dividing and multiplying by a power of two is exact: float32 loses nothing here.
    dtype = np.float64 if values.dtype == np.float64 else np.float32
    values = np.asarray(values, dtype)
    scale = bcast(np.exp2(exponent), axis, values.ndim).astype(dtype)
    error = np.asarray(np.clip(np.rint(values / scale), qmin - zp, qmax - zp) * scale)
    error -= values
    np.square(error, out=error)
    if np.size(exponent) == 1 or values.ndim == 0:
        return np.asarray(error.sum(dtype=np.float64)).reshape(np.shape(exponent))
    ax = (axis if axis is not None else 1) % values.ndim
    return error.sum(axis=tuple(i for i in range(values.ndim) if i != ax), dtype=np.float64)


def _pick(sse: list[np.ndarray], candidates: list[np.ndarray]) -> np.ndarray:
    """Per entry, the candidate exponent of least error (the first, highest, on ties)."""
    best = np.argmin(np.stack(sse), axis=0)
    return np.choose(best, candidates)


class _Activation:
    """The Q/DQ nodes sharing one activation scale initializer."""

    def __init__(self, graph: QdqGraph, q: onnx.NodeProto) -> None:
        self.scale, zero_point, self.axis, self.elem = graph.qparams(q)
        qmin, qmax, self.zp = QTYPES[self.elem]
        zero_point = zero_point.astype(np.float64)
        self.rmin = (qmin - zero_point) * self.scale
        self.rmax = (qmax - zero_point) * self.scale
        self.nodes: list[onnx.NodeProto] = []
        self.tensors: list[str] = []
        self.exponent = nonoverflow_exponent(
            self.rmin, self.rmax, qmin, qmax, self.zp, np.round(np.log2(self.scale))
        )

    def add(self, graph: QdqGraph, q: onnx.NodeProto) -> None:
        self.nodes.append(q)
        self.tensors.append(q.input[0])
        for dq in graph.consumers.get(q.output[0], []):
            if dq.op_type == "DequantizeLinear" and graph.has_qparams(dq):
                self.nodes.append(dq)

    def write(self, graph: QdqGraph) -> int:
        """Write the new scale and zero point; how many Relu nodes it inserted."""
        scale = np.exp2(self.exponent).reshape(np.shape(self.scale))
        for node in self.nodes:
            graph.set_array(node.input[1], scale)
            graph.set_zero_point(node, np.full(np.shape(self.scale), self.zp), self.elem)
        if not np.all(self.rmin == 0):
            return 0
        # A range starting at 0 clamped negatives: ONNX Runtime removes a Relu (or Clip) whose
        # output it quantizes so, and a symmetric zero point would let them through.
        relus = 0
        for q in (n for n in self.nodes if n.op_type == "QuantizeLinear"):
            source = q.input[0]
            clamped = f"{source}_pow2_relu"
            if graph.producer.get(clamped) is None:
                relu = onnx.helper.make_node("Relu", [source], [clamped], name=f"{q.name}_relu")
                graph.graph.node.insert(list(graph.graph.node).index(q), relu)
                graph.producer[clamped] = relu
                relus += 1
            q.input[0] = clamped
        return relus


def _activations(graph: QdqGraph) -> dict[str, _Activation]:
    groups: dict[str, _Activation] = {}
    for node in graph.graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] in graph.inits:
            continue
        if not graph.has_qparams(node):
            _logger.warning("power_of_two: %s has no constant int scale; left as is", node.name)
            continue
        if node.input[1] not in groups:
            groups[node.input[1]] = _Activation(graph, node)
        groups[node.input[1]].add(graph, node)
    return groups


def _measure_activations(
    graph: QdqGraph,
    groups: Mapping[str, _Activation],
    float_path: str,
    calibration: Any,
    technique: QuantizedModelTransform,
) -> None:
    """MinMSE for activations: each group's exponent by the error on calibration batches."""
    float_names = model_tensor_names(load_model(float_path))
    wanted: dict[str, list[str]] = {}
    for key, group in groups.items():
        names = [float_tensor_name(graph, t, float_names) for t in group.tensors]
        if None in names:
            _logger.debug("power_of_two: no float values for %s; NonOverflow kept", key)
            continue
        wanted[key] = names
    if not wanted:
        return
    candidates = {k: [groups[k].exponent - i for i in range(_LOWER + 1)] for k in wanted}
    sse = {k: [np.zeros(np.shape(groups[k].exponent)) for _ in range(_LOWER + 1)] for k in wanted}
    all_names = sorted({n for names in wanted.values() for n in names})
    feeds = calibration.batches(0, MSE_BATCHES)
    runs = run_with_outputs(
        float_path, all_names, feeds, providers=technique.providers, threads=technique.threads
    )
    for values in runs:
        for key, names in wanted.items():
            group = groups[key]
            for name in names:
                x = values[name]
                for i, e in enumerate(candidates[key]):
                    sse[key][i] += _sse(x, e, group.elem, group.axis)
    for key in wanted:
        groups[key].exponent = _pick(sse[key], candidates[key])


def _weight(graph: QdqGraph, dq: onnx.NodeProto, values: np.ndarray, method: str) -> np.ndarray:
    """Requantize one constant with power-of-two scales; its exponents."""
    scale, _, axis, elem = graph.qparams(dq)
    qmin, qmax, zp = QTYPES[elem]
    per_channel = np.size(scale) > 1
    low, high = _reduce(values, axis, per_channel)
    exponent = nonoverflow_exponent(low, high, qmin, qmax, zp, np.round(np.log2(scale)))
    if method == "MinMSE":
        candidates = [exponent - i for i in range(_LOWER + 1)]
        exponent = _pick([_sse(values, e, elem, axis) for e in candidates], candidates)
    _write_constant(graph, dq, values, np.exp2(exponent).reshape(np.shape(scale)), elem)
    return exponent


def _write_constant(
    graph: QdqGraph, dq: onnx.NodeProto, values: np.ndarray, scale: np.ndarray, elem: int
) -> int:
    """Write ``values`` quantized at ``scale`` into ``dq``'s own initializers; the saturated."""
    qmin, qmax, zp = QTYPES[elem]
    axis = next((a.i for a in dq.attribute if a.name == "axis"), None)
    if np.size(scale) > 1 and axis is None:
        axis = 0
        dq.attribute.append(onnx.helper.make_attribute("axis", 0))
    for index in (0, 1, 2) if len(dq.input) > 2 and dq.input[2] else (0, 1):
        graph.clone_input(dq, index, "pow2")
    exact = np.rint(values / bcast(scale, axis, values.ndim)) + zp
    q = quantize(values, scale, np.full(np.shape(scale), zp), qmin, qmax, axis)
    graph.set_array(dq.input[0], q)
    graph.set_array(dq.input[1], scale)
    graph.set_zero_point(dq, np.full(np.shape(scale), zp), elem)
    return int(np.count_nonzero(exact != q))


def to_power_of_two(
    graph: QdqGraph,
    method: str,
    float_inits: Mapping[str, np.ndarray],
    measure: Callable[[Mapping[str, _Activation]], None] | None = None,
) -> dict[str, int]:
    """Rewrite every scale of ``graph`` to a power of two; counts of what changed."""
    groups = _activations(graph)
    if method == "MinMSE" and measure is not None:
        measure(groups)
    relus = sum(group.write(graph) for group in groups.values())
    grouped = {id(n) for group in groups.values() for n in group.nodes}
    loose = [
        n.name for n in graph.graph.node
        if n.op_type == "DequantizeLinear"
        and id(n) not in grouped
        and n.input[0] not in graph.inits
    ]  # fmt: skip
    if loose:
        # Integers that come from outside (a quantized graph input): their scale is part of
        # what they mean, so it stays.
        _logger.warning("power_of_two: scales of %s left as is (not a Q/DQ pair)", loose)
    constants = [
        n for n in list(graph.graph.node)
        if n.op_type == "DequantizeLinear" and n.input[0] in graph.inits
    ]  # fmt: skip
    biases, weights, skipped = [], 0, 0
    for dq in constants:
        if not graph.has_qparams(dq):
            skipped += 1
            continue
        if _bias_sources(graph, dq) is not None:
            biases.append(dq)
            continue
        _weight(graph, dq, constant_float_values(graph, dq, float_inits), method)
        weights += 1
    saturated = 0
    for dq in biases:
        values = constant_float_values(graph, dq, float_inits)
        s_in, s_w = _bias_sources(graph, dq)
        scale = (s_in.reshape(()) * s_w).astype(np.float32)
        old_scale = graph.array(dq.input[1])
        if scale.size == 1:
            scale = np.full(np.shape(old_scale), scale.reshape(()), np.float32)
        saturated += _write_constant(graph, dq, values, scale.ravel() if scale.size > 1 else scale,
                                     graph.elem_type(dq.input[0]))  # fmt: skip
    if saturated:
        _logger.warning("power_of_two: %d bias values saturated int32", saturated)
    if skipped:
        _logger.warning("power_of_two: %d constants of unsupported types left as is", skipped)
    return {"activations": len(groups), "weights": weights, "biases": len(biases), "relus": relus}


def _bias_sources(graph: QdqGraph, dq: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray] | None:
    """``(input scale, weight scale)`` of an int32 Conv/Gemm bias, else None."""
    if graph.elem_type(dq.input[0]) != onnx.TensorProto.INT32:
        return None
    for node in graph.consumers.get(dq.output[0], []):
        if _BIAS_OPS.get(node.op_type) == list(node.input).index(dq.output[0]):
            act = graph.activation_dq(node.input[0])
            weight = graph.constant_dq(node.input[1])
            if act is not None and weight is not None and graph.array(act.input[1]).size == 1:
                return graph.array(act.input[1]), graph.array(weight.input[1])
    return None


@register_technique("power_of_two")
class PowerOfTwoScales(QuantizedModelTransform):
    """Every scale a power of two, zero points symmetric (see the module docstring)."""

    needs_qdq: ClassVar[bool] = True

    order: ClassVar[int] = 10
    containers = {
        "extra_options": {
            "PowerOfTwoMethod": OptionSpec(
                "enum",
                "power-of-two scales: NonOverflow (smallest covering the range) or MinMSE "
                "(least quantization error among it and the two lower powers)",
                choices=METHODS,
            )
        }
    }

    def effect_key(self, settings: Mapping[str, Any]) -> str | None:
        method = (settings.get("extra_options") or {}).get("PowerOfTwoMethod")
        return None if method is None else str(method)

    def transform(
        self, quantized_path: str, float_path: str, settings: Mapping[str, Any], calibration: Any
    ) -> None:
        method = self.effect_key(settings)
        if method not in METHODS:
            raise ConfigError("PowerOfTwoMethod", f"unknown PowerOfTwoMethod {method!r}")
        model = load_model(quantized_path)
        if any(n.op_type.startswith("QLinear") for n in model.graph.node):
            raise ConfigError("PowerOfTwoMethod", "power-of-two scales need quant_format QDQ")
        graph = QdqGraph(model)

        def measure(groups: Mapping[str, _Activation]) -> None:
            _measure_activations(graph, groups, float_path, calibration, self)

        counts = to_power_of_two(graph, method, float_initializers(float_path), measure)
        _logger.debug("power_of_two %s: %s", method, counts)
        save_model(model, quantized_path)
