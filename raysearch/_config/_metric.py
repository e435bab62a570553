"""The metric keys of a config: ``metric``, ``tolerance``, ``tolerance_mode``,
``higher_is_better`` and ``metric_key``, checked together.

Built-in metric names, aliases and directions come from :mod:`raysearch.metrics` (the one
table). A custom evaluator is checked by the evaluate stage's own loader, imported only when a
config names one, so that loading a config with a built-in metric imports no later stage.

Example:
    >>> parse_metric_settings({"metric": "cosine", "tolerance": 0.99})
    MetricSettings(metric='cos', metric_key=None, tolerance=0.99, tolerance_mode='absolute', higher_is_better=None)
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raysearch._config._values import number
from raysearch.errors import ConfigError, suggest
from raysearch.metrics import BUILTIN_METRICS, LISTED, canonical_metric

__all__ = ["MetricSettings", "parse_metric", "parse_metric_settings", "check_evaluator"]


@dataclass(frozen=True)
class MetricSettings:
    """The checked metric keys of a config."""

    metric: str
    metric_key: str | None
    tolerance: float | None
    tolerance_mode: str
    higher_is_better: bool | None


def parse_metric(value: Any) -> str:
    """The canonical built-in name of ``value``, or ``value`` itself for an import path."""
    if not isinstance(value, str) or not value:
        raise ConfigError(
            "metric",
            f"expected {LISTED} or 'package.module:function', got {value!r}",
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


def parse_metric_settings(data: Mapping[str, Any]) -> MetricSettings:
    """Check the metric keys of ``data`` (a whole config) and, for a custom metric, that its
    evaluator imports and takes ``(model_path, providers)``."""
    metric = parse_metric(data.get("metric", "L2"))
    custom = metric not in BUILTIN_METRICS
    tolerance = number(data, "tolerance", None)
    mode = data.get("tolerance_mode", "absolute")
    if mode not in ("absolute", "relative"):
        raise ConfigError("tolerance_mode", f"expected absolute or relative, got {mode!r}")
    hib = data.get("higher_is_better")
    if hib is not None and not isinstance(hib, bool):
        raise ConfigError("higher_is_better", f"expected true or false, got {hib!r}")
    if not custom:
        _check_builtin(metric, data, hib)
    metric_key = data.get("metric_key")
    if metric_key is not None and not isinstance(metric_key, str):
        raise ConfigError("metric_key", f"expected a string, got {metric_key!r}")
    if custom:
        check_evaluator(metric, "metric")
    return MetricSettings(metric, metric_key, tolerance, mode, hib)


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


def check_evaluator(spec: str, path: str) -> Any:
    """Import ``package.module:function`` exactly as written and check it can be called with
    ``(model_path, providers)``; returns the function.

    Raises:
        ConfigError: (at ``path``) as :func:`raysearch.evaluate.load_custom_evaluator`.
    """
    # The evaluate stage's loader is the one place raysearch imports code by name; imported
    # here, when a config names a custom evaluator, rather than with the config stage.
    from raysearch.evaluate import load_custom_evaluator

    return load_custom_evaluator(spec, key=path)
