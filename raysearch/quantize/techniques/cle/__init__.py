"""Cross-layer equalization (``include_cle``)."""

from __future__ import annotations

from raysearch.quantize.techniques.cle._cle import (
    CLEOptions,
    CrossLayerEqualization,
    equalization_scales,
    equalize_model,
)

__all__ = [
    "CrossLayerEqualization",
    "CLEOptions",
    "equalization_scales",
    "equalize_model",
]
