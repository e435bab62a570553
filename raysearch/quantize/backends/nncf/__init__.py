"""The OpenVINO NNCF backend (``quantizer: nncf``): ``nncf.quantize`` on ONNX models, its settings
catalogue and refusals; NNCF is imported only when a trial runs it."""

from __future__ import annotations

from raysearch.quantize.backends.nncf._backend import NncfBackend
from raysearch.quantize.nncf_runtime import import_nncf, nncf_dataset, nncf_session, prepare_model

__all__ = [
    "NncfBackend",
    "prepare_model",
    "nncf_dataset",
    "import_nncf",
    "nncf_session",
]
