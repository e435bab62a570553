"""Quantization techniques, one module or subpackage each, found by name through
``raysearch.quantize.technique``'s registry."""
