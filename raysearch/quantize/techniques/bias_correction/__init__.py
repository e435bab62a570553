"""Empirical bias correction (NNCF's fast bias correction) of a quantized QDQ model.

Quantization shifts a layer's outputs on average (weights that round the same way, clipped
activations). With ``include_bias_correction``, each layer with a bias (a Conv or Gemm with
its bias input, a MatMul followed by an Add of a constant) gets that shift subtracted from its
bias: the layer's *float* input (from the float model, on the calibration data) goes through
the quantized layer (its input's QuantizeLinear/DequantizeLinear, weights and bias as
quantized; a one-layer model run with the optimizations the evaluator's sessions use, so on
the integer kernels of the machine that corrects it, which on x86-64 without VNNI saturate u8s8
products: ``raysearch.cpu``) and is compared with the float layer's output; the mean of
``y_quantized - y_float`` per output channel (over samples and spatial positions) is the
correction. Every layer is measured from
float inputs, so one pass over the data does (with running sums: memory stays one batch).

The corrected bias is written as the model stores it: an int32 bias is requantized with its
scale (values past int32 are clamped, with a warning); a constant quantized like an activation
(ONNX Runtime's MatMul-Add bias) is requantized, with a new scale and zero point when the
corrected values leave its range (a power of two when the old scale was one, so it keeps
``power_of_two``'s scales); a float bias is corrected in float. Layers without a bias are left
as they are (no bias is added). ``extra_options.BiasCorrectionSamples`` limits the calibration
samples used (default: all; rounded up to whole feeds).

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
