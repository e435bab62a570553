"""A toy quantizer backend registered from outside raysearch: weight-only fake quantization.

``quantizer: toy`` rounds every float weight that feeds a MatMul or Gemm to ``bits``-bit
symmetric per-tensor levels and keeps it in float (what a weight-only int quantizer's model
computes). It has a catalogue of its own (``bits``, ``rounding``), which the search space
validates a ``quantizer: toy`` point against, and none of ONNX Runtime's keys. Nothing under
``raysearch/`` knows it: importing this module registers it, and the search ships the module's
name to its actors.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from raysearch.plugins import (
    QUANTIZER,
    Catalogue,
    OptionSpec,
    QuantizeInfo,
    QuantizerBackend,
    register_backend,
)

TOY_CATALOGUE = Catalogue(
    "toy",
    {
        "quantizer": QUANTIZER,
        "bits": OptionSpec("int", "weight bits", low=2, high=16),
        "rounding": OptionSpec("enum", "how values snap to levels", ("nearest", "floor")),
    },
)


def fake_quantize(weight: np.ndarray, bits: int, rounding: str) -> np.ndarray:
    """``weight`` snapped to ``2**(bits-1) - 1`` symmetric levels per sign, in float."""
    levels = 2 ** (bits - 1) - 1
    scale = float(np.abs(weight).max()) / levels or 1.0
    snap = np.floor if rounding == "floor" else np.rint
    return (snap(weight / scale).clip(-levels, levels) * scale).astype(weight.dtype)


@register_backend("toy")
class ToyBackend(QuantizerBackend):
    catalogue = TOY_CATALOGUE

    @classmethod
    def validate(cls, settings: Mapping[str, Any], model: Any) -> None:
        """Every toy setting is checked by its catalogue; nothing depends on the model."""

    def quantize(self, settings: Mapping[str, Any], out_path: str | os.PathLike) -> QuantizeInfo:
        start = time.perf_counter()
        model = onnx.load(self.model_path)
        weights = {
            name
            for node in model.graph.node
            if node.op_type in ("MatMul", "Gemm")
            for name in node.input[1:2]
        }
        bits, rounding = int(settings.get("bits", 8)), settings.get("rounding", "nearest")
        rounded_names = set()
        for i, tensor in enumerate(model.graph.initializer):
            if tensor.name in weights:
                rounded_names.add(tensor.name)
                array = fake_quantize(numpy_helper.to_array(tensor), bits, rounding)
                model.graph.initializer[i].CopyFrom(numpy_helper.from_array(array, tensor.name))
        onnx.save(model, os.fspath(out_path))
        # The graph keeps float weights, so raysearch cannot count what was quantized: say it.
        weighted = [n for n in model.graph.node if n.op_type in ("MatMul", "Gemm", "Conv")]
        rounded = sum(n.op_type != "Conv" and n.input[1] in rounded_names for n in weighted)
        share = rounded / len(weighted) if weighted else None
        return QuantizeInfo(0.0, time.perf_counter() - start, False, quantized_share=share)
