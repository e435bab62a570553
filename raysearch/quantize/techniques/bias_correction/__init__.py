"""Empirical bias correction (NNCF's fast bias correction) of a quantized QDQ model.

With ``include_bias_correction``, each layer with a bias (Conv, Gemm, MatMul + constant Add)
gets the mean per-channel shift ``y_quantized - y_float`` of its float input through the
quantized layer subtracted from its bias, written as the model stores it (int32 requantized,
an activation-like bias rescaled where it leaves its range, float in float).
``extra_options.BiasCorrectionSamples`` limits the samples (default: all).

Example:
    >>> BiasCorrection().effect_key({"include_bias_correction": True})
    'samples=all'
"""

from raysearch.quantize.techniques.bias_correction._layers import Layer, find_layers
from raysearch.quantize.techniques.bias_correction._technique import BiasCorrection

__all__ = ["BiasCorrection", "Layer", "find_layers"]
