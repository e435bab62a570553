"""Reading one config value: known keys, numbers, integers.

Example:
    >>> number({"tolerance": 0.01}, "tolerance", None)
    0.01
    >>> integer({"seed": "1"}, "seed", None)
    Traceback (most recent call last):
    ...
    raysearch.errors.ConfigError: seed: expected an integer, got '1'
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from raysearch.errors import ConfigError, ErrorCollector, suggest

__all__ = ["check_keys", "number", "integer"]


def check_keys(data: Mapping[str, Any], known: Iterable[str], prefix: str) -> None:
    """Refuse every key of ``data`` not in ``known``, suggesting the closest one."""
    known = set(known)
    errors = ErrorCollector()
    for key in data:
        if key not in known:
            path = f"{prefix}.{key}" if prefix else str(key)
            errors.add(ConfigError(path, "unknown key" + suggest(str(key), known)))
    errors.raise_any()


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
    """``data[key]`` (else ``default``): an integer or None, at least ``low`` unless -1."""
    value = data.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{prefix}{key}", f"expected an integer, got {value!r}")
    if low is not None and value < low and value != -1:
        raise ConfigError(f"{prefix}{key}", f"expected an integer >= {low}, got {value!r}")
    return value
