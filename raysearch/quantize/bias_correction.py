"""Empirical bias correction (NNCF's fast bias correction) of a quantized QDQ model.

Quantization shifts a layer's outputs on average (weights that round the same way, clipped
activations). With ``include_bias_correction``, each layer with a bias (a Conv or Gemm with
its bias input, a MatMul followed by an Add of a constant) gets that shift subtracted from its
bias: the layer's *float* input (from the float model, on the calibration data) goes through
the quantized layer (its input's QuantizeLinear/DequantizeLinear, weights and bias as
quantized; a one-layer model run without graph optimizations, so as ONNX defines QDQ) and is
compared with the float layer's output; the mean of ``y_quantized - y_float`` per output
channel (over samples and spatial positions) is the correction. Every layer is measured from
float inputs, so one pass over the data does (with running sums: memory stays one batch).

The corrected bias is written as the model stores it: an int32 bias is requantized with its
scale (values past int32 are clamped, with a warning); a constant quantized like an activation
(ONNX Runtime's MatMul-Add bias) is requantized, with a new scale and zero point when the
corrected values leave its range (a power of two when the old scale was one, so it keeps
``power_of_two``'s scales); a float bias is corrected in float. Layers without a bias are left
as they are (no bias is added). ``extra_options.BiasCorrectionSamples`` limits the calibration
samples used (default: all; rounded up to whole feeds).

Example:
    >>> BiasCorrection().effect_key({"include_bias_correction": True})
    'samples=all'
    >>> BiasCorrection().effect_key({}) is None
    True
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto

from raysearch.errors import ConfigError
from raysearch.providers import session_options
from raysearch.quantize._qdq_graph import (
    QTYPES,
    QdqGraph,
    dequantize,
    load_model,
    quantize,
    run_with_outputs,
    save_model,
)
from raysearch.quantize.technique import QuantizedModelTransform, register_technique
from raysearch.space.catalogue import OptionSpec

__all__ = ["BiasCorrection", "Layer", "find_layers", "corrected_bias_values"]

_logger = logging.getLogger(__name__)

_REMOVABLE = {"Relu", "Clip"}  # ONNX Runtime drops these when it quantizes their output


@dataclass
class Layer:
    """One layer to correct: its quantized node (the Add for MatMul-Add), the tensor the
    quantized layer starts from, its bias tensor, and its float counterpart's tensors."""

    name: str
    source: str
    output: str
    bias: str
    channel_axis: int
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
    """The Add of a constant after ``matmul`` (through its output's Q/DQ pair) and the
    constant's name."""
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


def _subgraph(graph: QdqGraph, layer: Layer) -> list[onnx.NodeProto] | None:
    """The nodes computing ``layer.output`` from ``layer.source`` and initializers (None when
    it needs another tensor)."""
    needed, stack = set(), [layer.output]
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


def _match_float(layer: Layer, graph: QdqGraph, float_model: onnx.ModelProto) -> bool:
    """Find the float node of ``layer`` (same name and type; else by output tensor, past a
    Relu/Clip ONNX Runtime removed) and set its input and output tensors."""
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


def _layer_model(graph: QdqGraph, layer: Layer, dtype: np.dtype) -> bytes:
    """A model of just the quantized layer: ``layer.source`` in, ``layer.output`` out."""
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    used = {i for n in layer.nodes for i in n.input}
    sub = onnx.helper.make_graph(
        layer.nodes,
        f"{layer.name}_quantized",
        [onnx.helper.make_tensor_value_info(layer.source, elem, None)],
        [onnx.helper.make_tensor_value_info(layer.output, elem, None)],
        [graph.inits[n] for n in sorted(used) if n in graph.inits],
    )
    model = onnx.helper.make_model(sub, opset_imports=list(graph.model.opset_import))
    model.ir_version = graph.model.ir_version
    return model.SerializeToString()


def corrected_bias_values(
    graph: QdqGraph, bias: str, delta: np.ndarray
) -> tuple[np.ndarray, onnx.NodeProto | None] | None:
    """``(bias - delta, its DequantizeLinear or None for a float bias)``; None when the bias
    is neither a constant nor a quantized constant, or has not one value per channel."""
    dq = graph.constant_dq(bias)
    if dq is not None:
        scale, zero_point, axis, _ = graph.qparams(dq)
        current = dequantize(graph.array(dq.input[0]), scale, zero_point, axis)
    elif bias in graph.inits:
        current = graph.array(bias).astype(np.float64)
    else:
        return None
    if current.size != delta.size:
        return None
    return current - delta.reshape(current.shape), dq


def _covering(
    values: np.ndarray, scale: float, zero_point: int, qmin: int, qmax: int, symmetric: int
) -> tuple[float, int]:
    """A per-tensor scale and zero point covering ``values`` (ONNX Runtime's rule: symmetric
    when the zero point was, else the range with 0 in it); a power of two when ``scale`` was
    one (so bias correction after power-of-two scales keeps them)."""
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


def _write_bias(graph: QdqGraph, layer: Layer, delta: np.ndarray) -> bool:
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


@register_technique("bias_correction")
class BiasCorrection(QuantizedModelTransform):
    """Subtracts each layer's mean quantization error from its bias (module docstring)."""

    needs_qdq: ClassVar[bool] = True

    order: ClassVar[int] = 30
    settings = {
        "include_bias_correction": OptionSpec(
            "bool", "correct each Conv/Gemm/MatMul-Add bias by its mean quantization error"
        )
    }
    containers = {
        "extra_options": {
            "BiasCorrectionSamples": OptionSpec(
                "int",
                "calibration samples bias correction measures (default all)",
                low=1,
                requires="include_bias_correction",
            )
        }
    }

    def effect_key(self, settings: Mapping[str, Any]) -> str | None:
        if not settings.get("include_bias_correction"):
            return None
        samples = (settings.get("extra_options") or {}).get("BiasCorrectionSamples")
        return f"samples={'all' if samples is None else int(samples)}"

    def transform(
        self, quantized_path: str, float_path: str, settings: Mapping[str, Any], calibration: Any
    ) -> None:
        model = load_model(quantized_path)
        if any(n.op_type.startswith("QLinear") for n in model.graph.node):
            raise ConfigError("include_bias_correction", "bias correction needs quant_format QDQ")
        graph = QdqGraph(model)
        float_model = load_model(float_path)
        layers = []
        for layer in find_layers(graph):
            layer.nodes = _subgraph(graph, layer) or []
            if layer.nodes and _match_float(layer, graph, float_model):
                layers.append(layer)
            else:
                _logger.debug("bias_correction: %s has no float counterpart; skipped", layer.name)
        del float_model
        if not layers:
            _logger.info("bias_correction: no layer with a bias to correct")
            return
        samples = (settings.get("extra_options") or {}).get("BiasCorrectionSamples")
        batches = None
        if samples is not None:
            batches = math.ceil(int(samples) / calibration.samples_per_batch)
        names = [n for layer in layers for n in (layer.float_input, layer.float_output)]
        feeds = calibration.batches(0, batches)
        for values in run_with_outputs(
            float_path, names, feeds, providers=self.providers, threads=self.threads
        ):
            for layer in layers:
                x = values[layer.float_input]
                if layer.session is None:
                    layer.session = self._layer_session(_layer_model(graph, layer, x.dtype))
                (y,) = layer.session.run([layer.output], {layer.source: x})
                layer.add(y, values[layer.float_output])
        corrected = 0
        for layer in layers:
            layer.session = None
            if layer.count and _write_bias(graph, layer, layer.total / layer.count / layer.gain):
                corrected += 1
                _logger.debug("bias_correction: %s mean shift %s", layer.name,
                              np.round(layer.total / layer.count, 6))  # fmt: skip
        _logger.info("bias_correction: corrected %d of %d layers", corrected, len(layers))
        save_model(model, quantized_path)

    def _layer_session(self, model: bytes) -> ort.InferenceSession:
        # Unoptimized: the QDQ semantics as ONNX defines them. A layer alone (its output not
        # quantized) gets fused kernels that assume bias scale = input scale * weight scale,
        # which ONNX Runtime does not write for a Gemm with beta != 1.
        options = session_options(self.threads)
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        return ort.InferenceSession(model, options, providers=list(self.providers))
