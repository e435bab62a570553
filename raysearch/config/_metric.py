"""The metric keys of a config: ``metric``, ``tolerance``, ``tolerance_mode``,
``higher_is_better`` and ``metric_key``, checked together (a tolerance no trial or every
trial meets is refused).

Example:
    >>> parse_metric_settings({"metric": "COSINE", "tolerance": 0.99})
    MetricSettings(metric='cos', metric_key=None, tolerance=0.99, tolerance_mode='absolute', higher_is_better=None)
    >>> parse_metric_settings({"metric": "cos", "tolerance": 1.5})
    Traceback (most recent call last):
    ...
    raysearch.errors.ConfigError: tolerance: 1.5 can never be met: a trial is a candidate when cos >= tolerance, and cos lies in [-1, 1]
"""  # noqa: E501

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from raysearch.config._dialects import LOGGER
from raysearch.config._values import number
from raysearch.errors import ConfigError, canonical_name, suggest
from raysearch.metrics import BUILTIN_METRICS, LISTED, METRICS, canonical_metric
from raysearch.usercode import qualified_name

__all__ = [
    "MetricSettings",
    "TOLERANCE_MODES",
    "parse_metric",
    "parse_metric_settings",
    "check_tolerance",
    "check_evaluator",
]

# The logger of the public module, the name users filter on.
_logger = logging.getLogger("raysearch.config._config")

#: The values of ``tolerance_mode``.
TOLERANCE_MODES = ("absolute", "relative")

#: The lowest tolerance of these metrics that does not look like a drop (a built-in metric's
#: tolerance bounds the metric itself): below it, one warning line.
_DROP_LIKE_BELOW = {"cos": 0.5, "SSIM": 0.5, "PSNR": 10.0}


@dataclass(frozen=True)
class MetricSettings:
    """The checked metric keys of a config (``metric``: a built-in name or ``module:qualname``),
    named as :class:`~raysearch.config.SearchConfig`'s fields."""

    metric: str
    metric_key: str | None
    tolerance: float | None
    tolerance_mode: str
    higher_is_better: bool | None
    #: The evaluator given as ``metric`` from Python (None: named, or a built-in metric).
    metric_function: Callable[..., Any] | None = field(default=None, repr=False)


def parse_metric(value: Any) -> str:
    """The canonical built-in name, the import path, or a function's ``module:qualname``."""
    if callable(value) and not isinstance(value, str):
        return qualified_name(value)
    if not isinstance(value, str) or not value:
        raise ConfigError(
            "metric",
            f"expected {LISTED}, 'package.module:function' or (from Python) a function, "
            f"got {value!r}",
        )
    builtin = canonical_metric(value)
    if builtin is not None:
        return builtin
    if ":" not in value:
        raise ConfigError(
            "metric",
            f"unknown metric {value!r}; expected {LISTED} or "
            "'package.module:function'" + suggest(value, BUILTIN_METRICS),
        )
    return value


def parse_metric_settings(
    data: Mapping[str, Any], search_dirs: Sequence[str | os.PathLike] = ()
) -> MetricSettings:
    """Check the metric keys of ``data`` and a custom metric's evaluator."""
    written_metric = data.get("metric", "L2")
    metric = parse_metric(written_metric)
    function = written_metric if callable(written_metric) else None
    custom = metric not in BUILTIN_METRICS
    tolerance = number(data, "tolerance", None)
    written = data.get("tolerance_mode", "absolute")
    mode = canonical_name(written, TOLERANCE_MODES)
    if mode is None:
        raise ConfigError("tolerance_mode", f"expected absolute or relative, got {written!r}")
    hib = data.get("higher_is_better")
    if hib is not None and not isinstance(hib, bool):
        raise ConfigError("higher_is_better", f"expected true or false, got {hib!r}")
    if not custom:
        _check_builtin(metric, data, hib)
        if tolerance is not None:
            check_tolerance(metric, tolerance)
    metric_key = data.get("metric_key")
    if metric_key is not None and not isinstance(metric_key, str):
        raise ConfigError("metric_key", f"expected a string, got {metric_key!r}")
    if custom:
        check_evaluator(function or metric, "metric", search_dirs)
    return MetricSettings(metric, metric_key, tolerance, mode, hib, function)


def _range_text(name: str) -> str:
    """The range of built-in metric ``name``: ``[-1, 1]``, ``[0, inf)``, ``(-inf, 100] dB``."""
    m = METRICS[name]
    low, high = sorted((m.best, m.worst))
    left = "(-inf" if math.isinf(low) else f"[{low:g}"
    right = "inf)" if math.isinf(high) else f"{high:g}]"
    return f"{left}, {right}" + (" dB" if name == "PSNR" else "")


def check_tolerance(metric: str, tolerance: float) -> None:
    """Refuse a built-in metric's ``tolerance`` past its best or at its worst; warn at its best
    or for one that looks like a drop.
    """
    m = METRICS[metric]
    relation = ">=" if m.higher_is_better else "<="
    rule = f"a trial is a candidate when {metric} {relation} tolerance, and {metric} lies in "
    rule += _range_text(metric)
    beyond_best = tolerance > m.best if m.higher_is_better else tolerance < m.best
    if beyond_best:
        raise ConfigError("tolerance", f"{tolerance:g} can never be met: {rule}")
    at_worst = tolerance <= m.worst if m.higher_is_better else tolerance >= m.worst
    if at_worst:
        raise ConfigError("tolerance", f"{tolerance:g} is met by every trial: {rule}")
    if tolerance == m.best:
        _logger.warning(
            "tolerance: %g is %s's best value: only a trial whose outputs equal the float "
            "model's can be a candidate",
            tolerance,
            metric,
        )
    elif tolerance < _DROP_LIKE_BELOW.get(metric, -math.inf):
        _logger.warning(
            "tolerance: %g with %s makes every trial with %s >= %g a candidate: the tolerance "
            "bounds %s itself, not its drop against the float model",
            tolerance,
            metric,
            metric,
            tolerance,
            metric,
        )


def _check_builtin(metric: str, data: Mapping[str, Any], hib: bool | None) -> None:
    """Keys that mean nothing for a built-in metric are refused, not ignored."""
    if "tolerance_mode" in data:
        raise ConfigError(
            "tolerance_mode",
            f"applies to custom metrics only; for {metric} the tolerance bounds the metric itself",
        )
    if hib is not None and hib != BUILTIN_METRICS[metric]:
        raise ConfigError(
            "higher_is_better",
            f"{metric} is {'higher' if BUILTIN_METRICS[metric] else 'lower'}-is-better "
            "by definition; remove this key",
        )


def check_evaluator(
    spec: str | Callable[..., Any], path: str, search_dirs: Sequence[str | os.PathLike] = ()
) -> Any:
    """The function ``spec`` names or is, checked to take ``(model_path, providers)``."""
    from raysearch.evaluate import load_custom_evaluator, takes_providers

    function = load_custom_evaluator(spec, key=path, search_dirs=search_dirs)
    if not takes_providers(function):
        logging.getLogger(LOGGER).info(
            "%s: the function takes the model's path alone (Quark's "
            "search_evaluator(onnx_path, **args)); it runs on the trial's device without "
            "being told its providers",
            path,
        )
    return function
