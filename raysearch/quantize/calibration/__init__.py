"""Calibration shared between trials: activation statistics computed once per method and data,
cached on disk (``CalibrationCache``)."""

from __future__ import annotations

from raysearch.quantize.calibration._cache import CalibrationCache
from raysearch.quantize.calibration._request import (
    DEFAULT_OP_TYPES,
    CalibrationRequest,
    calibration_values,
    tensors_to_calibrate,
)

__all__ = [
    "CalibrationCache",
    "CalibrationRequest",
    "DEFAULT_OP_TYPES",
    "calibration_values",
    "tensors_to_calibrate",
]
