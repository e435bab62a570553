"""The bias correction technique (see the package): measure every layer's mean shift in one
pass over the calibration data, then write the corrected biases."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import onnxruntime as ort

from raysearch.cpu import u8s8_saturates
from raysearch.errors import ConfigError
from raysearch.providers import device_label, session_options
from raysearch.quantize._qdq_graph import QdqGraph, load_model, run_with_outputs, save_model
from raysearch.quantize.technique import QuantizedModelTransform, register_technique
from raysearch.quantize.techniques.bias_correction._layers import (
    find_layers,
    layer_model,
    match_float,
    requantized,
    subgraph,
    through_output_q,
)
from raysearch.quantize.techniques.bias_correction._write import kernel_bias_scale, write_bias
from raysearch.space.catalogue import OptionSpec

__all__ = ["BiasCorrection"]

_logger = logging.getLogger("raysearch.quantize.techniques.bias_correction")


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
            requantized(graph, layer, saturates)
            layer.nodes = subgraph(graph, layer) or []
            if layer.nodes and match_float(layer, graph, float_model):
                layers.append(layer)
                if kernel_bias_scale(graph, layer) is not None:
                    # Its bias rewritten first at the scale the fused kernels read (the same
                    # values), so that they compute what its Q/DQ nodes say.
                    write_bias(graph, layer, np.zeros(1))
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
                    layer.session = self._layer_session(layer_model(graph, layer, x))
                (y,) = layer.session.run([layer.measured], {layer.source: x})
                layer.add(y, through_output_q(graph, layer, values[layer.float_output]))
        corrected = 0
        for layer in layers:
            layer.session = None
            if layer.count and write_bias(graph, layer, layer.total / layer.count / layer.gain):
                corrected += 1
                _logger.debug("bias_correction: %s mean shift %s", layer.name,
                              np.round(layer.total / layer.count, 6))  # fmt: skip
        _logger.info("bias_correction: corrected %d of %d layers", corrected, len(layers))
        save_model(model, quantized_path)

    def _layer_session(self, model: bytes) -> ort.InferenceSession:
        # Optimized as the evaluator's sessions are, so that the correction is measured on
        # the integer kernels (saturating or not) the model runs on this machine.
        options = session_options(self.threads)
        return ort.InferenceSession(model, options, providers=list(self.providers))
