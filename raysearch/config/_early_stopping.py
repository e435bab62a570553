"""The ``early_stopping`` key: absent or ``true`` (the defaults), ``false`` (every row), or
``rungs`` (growing fractions, the last 1.0), ``reduction_factor`` and ``min_rows``.

Example:
    >>> parse_early_stopping(None).rungs
    (0.1, 0.33, 1.0)
    >>> parse_early_stopping({"rungs": [0.25, 1.0], "reduction_factor": 2}).reduction_factor
    2.0
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raysearch.config._values import check_keys, integer
from raysearch.errors import ConfigError
from raysearch.ranking import finite

__all__ = ["EarlyStoppingConfig", "parse_early_stopping"]

_KEY = "early_stopping"


@dataclass(frozen=True)
class EarlyStoppingConfig:
    """Evaluation on growing subsets; the defaults are ASHA's usual (3x rows, keep a third)."""

    enabled: bool = True
    rungs: tuple[float, ...] = (0.1, 0.33, 1.0)
    reduction_factor: float = 3.0
    min_rows: int = 32


def _rungs(value: Any) -> tuple[float, ...]:
    where = f"{_KEY}.rungs"
    ok = isinstance(value, list) and len(value) >= 2
    ok = ok and all(finite(v) is not None for v in value)
    ok = ok and all(0 < v <= 1 for v in value) and value[-1] == 1
    ok = ok and all(a < b for a, b in zip(value, value[1:]))
    if not ok:
        raise ConfigError(
            where, f"expected increasing fractions in (0, 1] ending with 1.0, got {value!r}"
        )
    return tuple(float(v) for v in value)


def parse_early_stopping(raw: Any) -> EarlyStoppingConfig:
    """The ``early_stopping`` key (``None``: on, with the defaults)."""
    if raw is None or raw is True:
        return EarlyStoppingConfig()
    if raw is False:
        return EarlyStoppingConfig(enabled=False)
    if not isinstance(raw, Mapping):
        raise ConfigError(
            _KEY,
            f"expected true, false or a mapping (rungs, reduction_factor, min_rows), got {raw!r}",
        )
    default = EarlyStoppingConfig()
    check_keys(raw, ("rungs", "reduction_factor", "min_rows"), _KEY)
    rungs = _rungs(raw["rungs"]) if "rungs" in raw else default.rungs
    factor = raw.get("reduction_factor", default.reduction_factor)
    if finite(factor) is None or factor <= 1:
        raise ConfigError(f"{_KEY}.reduction_factor", f"expected a number > 1, got {factor!r}")
    min_rows = integer(raw, "min_rows", default.min_rows, low=1, prefix=f"{_KEY}.")
    if min_rows == -1:
        raise ConfigError(f"{_KEY}.min_rows", "expected an integer >= 1, got -1")
    return EarlyStoppingConfig(True, rungs, float(factor), int(min_rows))
