"""The NNCF weight-compression backend (``quantizer: nncf_weight_only``): OpenVINO NNCF's
``nncf.compress_weights`` on ONNX models (4-bit ``MatMulNBits``, 8-bit ``DequantizeLinear``),
with what NNCF 3.4 writes wrongly for ONNX Runtime repaired; its catalogue and refusals are in
:mod:`raysearch.quantize.backends.nncf_weight_only.options`. NNCF is imported only when a
backend is built."""

from __future__ import annotations

from raysearch.quantize.backends.nncf_weight_only._backend import NncfWeightOnlyBackend

__all__ = ["NncfWeightOnlyBackend"]
