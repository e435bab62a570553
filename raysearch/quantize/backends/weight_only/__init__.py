"""The weight-only backend (``quantizer: weight_only``): ONNX Runtime's ``MatMulNBits``
(blocked 4/8-bit weights, float activations) for language models; its catalogue and refusals
are in :mod:`raysearch.quantize.backends.weight_only.options`.

The names below are defined in ``raysearch.quantize.backends.weight_only._backend``."""

from __future__ import annotations

from raysearch.quantize.backends.weight_only._backend import (
    WeightOnlyBackend,
    embedding_gathers,
    import_quantizer,
    weight_matmuls,
)

__all__ = ["WeightOnlyBackend", "weight_matmuls", "embedding_gathers", "import_quantizer"]
