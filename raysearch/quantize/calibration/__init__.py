"""Calibration shared between trials: activation statistics computed once per method and data,
cached on disk (``CalibrationCache``)."""

from __future__ import annotations

from raysearch.quantize.calibration._cache import CalibrationCache
from raysearch.quantize.calibration._request import (
    DEFAULT_OP_TYPES,
    HISTOGRAM_METHODS,
    CalibrationRequest,
    calibration_values,
    tensors_to_calibrate,
)
from raysearch.quantize.calibration._store import CacheStats

__all__ = [
    "CalibrationCache",
    "CalibrationRequest",
    "CacheStats",
    "DEFAULT_OP_TYPES",
    "HISTOGRAM_METHODS",
    "calibration_values",
    "tensors_to_calibrate",
]
