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

from raysearch.cpu import u8s8_saturates
from raysearch.errors import ConfigError
from raysearch.providers import device_label, session_options
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
    #: The tensor measured: on a CPU whose int8 kernels saturate, a Conv's output past its
    #: QuantizeLinear/DequantizeLinear pair (ONNX Runtime runs a Conv on integers only with its
    #: output quantized); else ``output`` (MatMul and Gemm have integer kernels with a float
    #: output, and where nothing saturates the Conv's integer result is the Q/DQ math, whose
    #: mean moves with the bias exactly, not in the output's rounding steps).
    measured: str = ""
    #: The output's QuantizeLinear when ``measured`` is past it: the float reference goes
    #: through the same rounding and clipping (a Relu ONNX Runtime folded into it included).
    output_q: onnx.NodeProto | None = None
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


def _requantized(graph: QdqGraph, layer: Layer, saturates: bool) -> None:
    """Set ``layer.measured`` (and ``output_q``) past a Conv's output QuantizeLinear and
    DequantizeLinear when that pair is its only consumer and the CPU's int8 kernels saturate,
    else to the output itself."""
    layer.measured, layer.output_q = layer.output, None
    if not saturates or graph.producer[layer.output].op_type != "Conv":
        return
    users = graph.consumers.get(layer.output, [])
    if len(users) != 1 or users[0].op_type != "QuantizeLinear" or not graph.has_qparams(users[0]):
        return
    after = graph.consumers.get(users[0].output[0], [])
    if after and after[0].op_type == "DequantizeLinear":
        layer.measured, layer.output_q = after[0].output[0], users[0]


def _through_output_q(graph: QdqGraph, layer: Layer, y_float: np.ndarray) -> np.ndarray:
    """The float layer's output as the quantized model's output Q/DQ pair passes it on."""
    if layer.output_q is None:
        return y_float
    scale, zero_point, axis, elem = graph.qparams(layer.output_q)
    qmin, qmax, _ = QTYPES[elem]
    q = quantize(y_float, scale, zero_point, qmin, qmax, axis)
    return dequantize(q, scale, zero_point, axis)


def _subgraph(graph: QdqGraph, layer: Layer) -> list[onnx.NodeProto] | None:
    """The nodes computing ``layer.measured`` from ``layer.source`` and initializers (None
    when it needs another tensor)."""
    needed, stack = set(), [layer.measured]
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


def _kernel_bias_scale(graph: QdqGraph, layer: Layer) -> np.ndarray | None:
    """The scale ONNX Runtime's fused integer kernels read an int32 bias with (input scale *
    weight scale) when the model's bias has another (ONNX Runtime's quantizer writes one for
    a Gemm with beta != 1: the fused kernels then add a wrong bias); None when they agree."""
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


def _layer_model(graph: QdqGraph, layer: Layer, example: np.ndarray) -> bytes:
    """A model of just the quantized layer: ``layer.source`` in, ``layer.measured`` out."""
    elem = onnx.helper.np_dtype_to_tensor_dtype(example.dtype)
    # The input's shape (batch left free) as in the whole model: ONNX Runtime's fusions of
    # the layer depend on it (MatMul with Add, for one).
    shape = ["batch", *example.shape[1:]] if example.ndim else []
    used = {i for n in layer.nodes for i in n.input}
    sub = onnx.helper.make_graph(
        layer.nodes,
        f"{layer.name}_quantized",
        [onnx.helper.make_tensor_value_info(layer.source, elem, shape)],
        [onnx.helper.make_tensor_value_info(layer.measured, elem, None)],
        [graph.inits[n] for n in sorted(used) if n in graph.inits],
    )
    model = onnx.helper.make_model(sub, opset_imports=list(graph.model.opset_import))
    model.ir_version = graph.model.ir_version
    return model.SerializeToString()


def corrected_bias_values(
    graph: QdqGraph, bias: str, delta: np.ndarray
) -> tuple[np.ndarray, onnx.NodeProto | None] | None:
    """``(bias - delta, its DequantizeLinear or None for a float bias)``; None when the bias
    is neither a constant nor a quantized constant, or ``delta`` has neither one value per
    channel nor one value for all."""
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
    kernel_scale = _kernel_bias_scale(graph, layer)
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
        saturates = device_label(self.providers) == "cpu" and u8s8_saturates()
        for layer in find_layers(graph):
            _requantized(graph, layer, saturates)
            layer.nodes = _subgraph(graph, layer) or []
            if layer.nodes and _match_float(layer, graph, float_model):
                layers.append(layer)
                if _kernel_bias_scale(graph, layer) is not None:
                    # Its bias rewritten first at the scale the fused kernels read (the same
                    # values), so that they compute what its Q/DQ nodes say.
                    _write_bias(graph, layer, np.zeros(1))
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
                    layer_model = _layer_model(graph, layer, x)
                    layer.session = self._layer_session(layer_model)
                (y,) = layer.session.run([layer.measured], {layer.source: x})
                layer.add(y, _through_output_q(graph, layer, values[layer.float_output]))
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
        # Optimized as the evaluator's sessions are: ONNX Runtime fuses the layer's Q/DQ into
        # integer kernels whose results depend on the CPU (u8s8 products saturate on x86-64
        # without VNNI, and the shift they add is what the model shows there), so the
        # correction is measured with the kernels the model runs on this machine.
        options = session_options(self.threads)
        return ort.InferenceSession(model, options, providers=list(self.providers))
