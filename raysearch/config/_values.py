"""Reading one config value: known keys, numbers, integers, and AMD Quark's key names.

Example:
    >>> number({"tolerance": 0.01}, "tolerance", None)
    0.01
    >>> integer({"seed": "1"}, "seed", None)
    Traceback (most recent call last):
    ...
    raysearch.errors.ConfigError: seed: expected an integer, got '1'
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from typing import Any

from raysearch.errors import ConfigError, ErrorCollector, suggest

__all__ = ["check_keys", "number", "integer", "map_quark_names"]

# The logger of the public module: what users filter on did not move.
_logger = logging.getLogger("raysearch.config._config")

#: Quark AutoSearch names -> raysearch key paths.
_QUARK_KEYS = {
    "search_metric": "metric",
    "search_metric_tolerance": "tolerance",
    "search_stop_condition": "stop",
    "n_trials": "stop.iteration_limit",
    "n_jobs": "resources.max_concurrent_trials",
}


def check_keys(data: Mapping[str, Any], known: Iterable[str], prefix: str) -> None:
    """Refuse every key of ``data`` not in ``known`` (one line each), suggesting the closest
    one."""
    known = set(known)
    errors = ErrorCollector()
    for key in data:
        if key not in known:
            path = f"{prefix}.{key}" if prefix else str(key)
            errors.add(ConfigError(path, "unknown key" + suggest(str(key), known)))
    errors.raise_any()


def map_quark_names(data: dict[str, Any]) -> dict[str, Any]:
    """Accept the names an AMD Quark AutoSearch config uses, logging each mapping."""
    for quark, ours in _QUARK_KEYS.items():
        if quark not in data:
            continue
        value = data.pop(quark)
        head, _, tail = ours.partition(".")
        target = data if not tail else data.setdefault(head, {})
        key = tail or head
        if not isinstance(target, dict):
            raise ConfigError(head, f"expected a mapping, got {target!r}")
        if key in target:
            raise ConfigError(quark, f"given together with '{ours}': keep one of them")
        target[key] = value
        _logger.info("config: Quark key '%s' read as '%s'", quark, ours)
    return data


def number(data: Mapping[str, Any], key: str, default: float | None, *, prefix: str = "") -> Any:
    """``data[key]`` (else ``default``) checked to be a finite number (not a bool) or None."""
    value = data.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{prefix}{key}", f"expected a number, got {value!r}")
    return value


def integer(
    data: Mapping[str, Any],
    key: str,
    default: int | None,
    *,
    low: int | None = None,
    prefix: str = "",
) -> Any:
    """``data[key]`` (else ``default``) checked to be an integer (not a bool) or None, at least
    ``low`` unless it is -1 (the "disabled" of stop conditions)."""
    value = data.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{prefix}{key}", f"expected an integer, got {value!r}")
    if low is not None and value < low and value != -1:
        raise ConfigError(f"{prefix}{key}", f"expected an integer >= {low}, got {value!r}")
    return value
