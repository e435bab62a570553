"""Mixed precision: the few most sensitive tensors promoted to a higher precision."""

from __future__ import annotations

from raysearch.quantize.techniques.mixed_precision._mixed_precision import KEY, PER_RANK, precisions

__all__ = ["precisions", "PER_RANK", "KEY"]
