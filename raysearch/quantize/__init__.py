"""Quantization: backends and techniques in registries, the shared calibration cache, the
settings catalogue.

``raysearch.quantize.backends.ort.options`` (the catalogue) and the registry import nothing
heavy, so the config and space stages stay fast; ONNX Runtime's quantizer is imported when a
backend or the cache is first used.

Example:
    >>> from raysearch.quantize import get_backend, available_backends
    >>> available_backends()
    ['nncf', 'nncf_weight_only', 'ort', 'weight_only']
    >>> get_backend("ort").reject({"activation_type": "QInt8", "weight_type": "QUInt8"})
    'activation_type QInt8 with weight_type QUInt8 is not supported by ONNX Runtime'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raysearch.quantize.registry import (
    DEFAULT_BACKEND,
    QuantizeInfo,
    QuantizerBackend,
    available_backends,
    get_backend,
    register_backend,
)

if TYPE_CHECKING:
    from raysearch.quantize.backends.ort import OrtBackend, reject_reason
    from raysearch.quantize.calibration import CalibrationCache, CalibrationRequest
    from raysearch.quantize.technique import (
        FloatModelTransform,
        QuantizedModelTransform,
        Technique,
        TensorOverrideProducer,
        TensorOverrides,
        register_technique,
    )

__all__ = [
    "DEFAULT_BACKEND",
    "QuantizeInfo",
    "QuantizerBackend",
    "available_backends",
    "get_backend",
    "register_backend",
    "CalibrationCache",
    "CalibrationRequest",
    "OrtBackend",
    "reject_reason",
    "Technique",
    "FloatModelTransform",
    "TensorOverrideProducer",
    "QuantizedModelTransform",
    "TensorOverrides",
    "register_technique",
]

_LAZY = {
    "CalibrationCache": "raysearch.quantize.calibration._cache",
    "CalibrationRequest": "raysearch.quantize.calibration._cache",
    "OrtBackend": "raysearch.quantize.backends.ort._backend",
    "reject_reason": "raysearch.quantize.backends.ort._backend",
    # The rest of __all__ (after reject_reason) is the technique module's.
    **dict.fromkeys(__all__[__all__.index("reject_reason") + 1 :], "raysearch.quantize.technique"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'raysearch.quantize' has no attribute {name!r}")
