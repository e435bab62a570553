"""Calibration shared between trials: activation statistics computed once per method and data,
cached on disk (``CalibrationCache``)."""

from __future__ import annotations

from raysearch.quantize.calibration._cache import (
    DEFAULT_OP_TYPES,
    HISTOGRAM_METHODS,
    CacheStats,
    CalibrationCache,
    CalibrationRequest,
    calibration_values,
    tensors_to_calibrate,
)

__all__ = [
    "CalibrationCache",
    "CalibrationRequest",
    "CacheStats",
    "DEFAULT_OP_TYPES",
    "HISTOGRAM_METHODS",
    "calibration_values",
    "tensors_to_calibrate",
]
