"""Empirical bias correction (NNCF's fast bias correction) of a quantized QDQ model.

Quantization shifts a layer's outputs on average. With ``include_bias_correction``, each layer
with a bias (Conv, Gemm, a MatMul followed by an Add of a constant) gets that shift subtracted
from its bias: the layer's *float* input goes through the quantized layer (a one-layer model
on this machine's integer kernels) and the mean of ``y_quantized - y_float`` per output
channel is the correction; one pass over the data, with running sums.

The corrected bias is written as the model stores it: an int32 bias requantized (clamped,
with a warning), a bias quantized like an activation requantized with a new scale where it
leaves its range (a power of two where the old one was), a float bias in float. Layers
without a bias are left as they are. ``extra_options.BiasCorrectionSamples`` limits the
calibration samples used (default: all).

Example:
    >>> BiasCorrection().effect_key({"include_bias_correction": True})
    'samples=all'
    >>> BiasCorrection().effect_key({}) is None
    True
"""

from raysearch.quantize.techniques.bias_correction._layers import Layer, find_layers
from raysearch.quantize.techniques.bias_correction._technique import BiasCorrection
from raysearch.quantize.techniques.bias_correction._write import corrected_bias_values

__all__ = ["BiasCorrection", "Layer", "find_layers", "corrected_bias_values"]
