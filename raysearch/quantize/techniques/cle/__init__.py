"""Cross-layer equalization (``include_cle``).

The names below are defined in ``raysearch.quantize.techniques.cle._cle``."""

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
