"""Cross-layer equalization (``include_cle``)."""

from __future__ import annotations

from raysearch.quantize.techniques.cle._cle import CrossLayerEqualization

__all__ = ["CrossLayerEqualization"]
