"""SmoothQuant (``include_sq``)."""

from __future__ import annotations

from raysearch.quantize.techniques.smooth_quant._smooth_quant import (
    SmoothQuant,
    smooth_model,
    smooth_options,
    smoothing_scales,
)

__all__ = ["SmoothQuant", "smooth_options", "smoothing_scales", "smooth_model"]
