"""Quantizer backends, one subpackage each, found by name through
``raysearch.quantize.registry``."""
