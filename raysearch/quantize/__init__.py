"""Quantization: backends and techniques in registries, the shared calibration cache, the
settings catalogue. This package's face is the backends' registry; the catalogue and the
registry import nothing heavy, ONNX Runtime's quantizer only when a backend is first used.

Example:
    >>> from raysearch.quantize import get_backend, available_backends
    >>> available_backends()
    ['nncf', 'nncf_weight_only', 'ort', 'weight_only']
    >>> get_backend("ort").reject({"activation_type": "QInt8", "weight_type": "QUInt8"})
    'activation_type QInt8 with weight_type QUInt8 is not supported by ONNX Runtime'
"""

from __future__ import annotations

from raysearch.quantize.registry import (
    QuantizeInfo,
    QuantizerBackend,
    available_backends,
    get_backend,
    register_backend,
)

__all__ = [
    "QuantizeInfo",
    "QuantizerBackend",
    "available_backends",
    "get_backend",
    "register_backend",
]
