"""The ``nncf`` backend's settings as ``nncf.quantize`` arguments (its calibration data as an
``nncf.Dataset``: :func:`raysearch.quantize.nncf_runtime.nncf_dataset`).

Only the settings a point gives are passed. ``nodes_to_exclude`` (what a tensor-override
technique keeps float) joins ``ignored_scope.names``; ONNX Runtime's ``extra_options`` cannot
be expressed and raise.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from types import ModuleType
from typing import Any

__all__ = ["NNCF_DEFAULT_SUBSET", "quantize_arguments"]

_logger = logging.getLogger("raysearch.quantize.backends.nncf._backend")

#: ``nncf.quantize``'s default ``subset_size``.
NNCF_DEFAULT_SUBSET = 300
_capped: set[tuple[int, int]] = set()


def quantize_arguments(
    nncf: ModuleType, settings: Mapping[str, Any], items: int, external_data_dir: str | None = None
) -> dict[str, Any]:
    """Keyword arguments of ``nncf.quantize`` for ``settings`` (``subset_size`` <= ``items``)."""
    extra = settings.get("extra_options") or {}
    if extra:  # the techniques' keys are removed before; what is left would be dropped
        raise ValueError(f"quantizer nncf cannot apply extra_options {', '.join(sorted(extra))}")
    arguments: dict[str, Any] = {}
    if settings.get("preset"):
        arguments["preset"] = nncf.QuantizationPreset(settings["preset"])
    if settings.get("model_type") == "transformer":
        arguments["model_type"] = nncf.ModelType.TRANSFORMER
    if settings.get("target_device"):
        arguments["target_device"] = nncf.TargetDevice[settings["target_device"]]
    if settings.get("fast_bias_correction") is not None:
        arguments["fast_bias_correction"] = bool(settings["fast_bias_correction"])
    arguments["subset_size"] = _subset_size(settings.get("subset_size"), items)
    scope = _ignored_scope(nncf, settings)
    if scope is not None:
        arguments["ignored_scope"] = scope
    arguments["advanced_parameters"] = _advanced(settings, external_data_dir)
    return arguments


def _subset_size(requested: int | None, items: int) -> int:
    size = int(requested or NNCF_DEFAULT_SUBSET)
    if size > items and requested and (size, items) not in _capped:
        _capped.add((size, items))
        _logger.info("subset_size %d: the calibration data has %d samples, all used", size, items)
    return max(1, min(size, items))


def _ignored_scope(nncf: ModuleType, settings: Mapping[str, Any]) -> Any:
    scope = dict(settings.get("ignored_scope") or {})
    names = list(scope.get("names") or [])
    names += [n for n in settings.get("nodes_to_exclude") or [] if n not in names]
    types, patterns = list(scope.get("types") or []), list(scope.get("patterns") or [])
    if not (names or types or patterns):
        return None
    return nncf.IgnoredScope(names=names, patterns=patterns, types=types)


def _advanced(settings: Mapping[str, Any], external_data_dir: str | None) -> Any:
    from nncf.common.quantization.quantizer_propagation.structs import QuantizerPropagationRule
    from nncf.onnx.quantization.backend_parameters import BackendParameters
    from nncf.quantization.advanced_parameters import (
        AdvancedBiasCorrectionParameters,
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
        OverflowFix,
        QuantizationParameters,
    )

    advanced = AdvancedQuantizationParameters()
    if settings.get("disable_bias_correction") is not None:
        advanced.disable_bias_correction = bool(settings["disable_bias_correction"])
    if settings.get("bias_correction_threshold") is not None:
        threshold = float(settings["bias_correction_threshold"])
        advanced.bias_correction_params = AdvancedBiasCorrectionParameters(threshold=threshold)
    alphas = settings.get("smooth_quant_alphas") or {}
    if alphas:
        defaults = AdvancedSmoothQuantParameters()
        advanced.smooth_quant_alphas = AdvancedSmoothQuantParameters(
            convolution=float(alphas.get("convolution", defaults.convolution)),
            matmul=float(alphas.get("matmul", defaults.matmul)),
        )
    for key, field in (
        ("activations_range_estimator", "activations_range_estimator_params"),
        ("weights_range_estimator", "weights_range_estimator_params"),
    ):
        if settings.get(key):
            setattr(advanced, field, _estimator(settings[key]))
    if settings.get("weights_per_channel") is not None:
        per_channel = bool(settings["weights_per_channel"])
        advanced.weights_quantization_params = QuantizationParameters(per_channel=per_channel)
    if settings.get("overflow_fix"):
        advanced.overflow_fix = OverflowFix(settings["overflow_fix"])
    if settings.get("quantizer_propagation_rule"):
        rule = str(settings["quantizer_propagation_rule"]).upper()
        advanced.quantizer_propagation_rule = QuantizerPropagationRule[rule]
    if external_data_dir:
        advanced.backend_params[BackendParameters.EXTERNAL_DATA_DIR] = external_data_dir
    return advanced


def _estimator(name: str) -> Any:
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    # The set's members are shared class attributes: each trial gets its own copy.
    return copy.deepcopy(getattr(RangeEstimatorParametersSet, str(name).upper()))
