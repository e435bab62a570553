"""``objectives`` and ``select``: what the Pareto front of the candidates is over, and which
candidate ``best/`` holds.

``objectives`` lists any of ``metric`` (its own direction), ``latency_ms`` and
``model_size_mb`` (both minimised); ``metric`` must be one of them (the tolerance decides the
candidates by it). ``select`` picks ``best/`` among the candidates: ``metric`` (the ranking
of :func:`raysearch.ranking.better`, the default), ``latency`` (the fastest) or ``size`` (the
smallest).

The sampler (``search_algo``) optimises the metric alone: with several objectives one INFO
line of the config's reading notes (``raysearch.config.dialects``, shown by the command line)
says that selection and the front use every objective while sampling uses the metric.

Example:
    >>> parse_objectives({"objectives": ["metric", "model_size_mb"], "select": "size"})
    (('metric', 'model_size_mb'), 'size')
    >>> parse_objectives({})
    (('metric',), 'metric')
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from raysearch.config._dialects import LOGGER
from raysearch.errors import ConfigError, canonical_name, suggest
from raysearch.ranking import OBJECTIVES, SELECTS

__all__ = ["parse_objectives"]

_logger = logging.getLogger(LOGGER)


def parse_objectives(data: Mapping[str, Any]) -> tuple[tuple[str, ...], str]:
    """``(objectives, select)`` of ``data``, each checked; a mistake is one ConfigError
    naming the key."""
    measured = data.get("measure_latency", True) is not False
    objectives = _objectives(data.get("objectives", ["metric"]), measured)
    select = _select(data.get("select", "metric"), measured)
    if len(objectives) > 1:
        _logger.info(
            "objectives: sampling (search_algo) uses the metric; the Pareto front "
            "(pareto.parquet) and select use every objective (%s)",
            ", ".join(objectives),
        )
    return objectives, select


def _objectives(value: Any, measured: bool) -> tuple[str, ...]:
    names = ", ".join(OBJECTIVES)
    if not isinstance(value, list) or not value:
        raise ConfigError("objectives", f"expected a list of {names}, got {value!r}")
    seen: list[str] = []
    for i, item in enumerate(value):
        name = canonical_name(item, OBJECTIVES)
        if name is None:
            hint = suggest(item, OBJECTIVES) if isinstance(item, str) else ""
            raise ConfigError(f"objectives[{i}]", f"unknown objective {item!r}{hint} ({names})")
        if name in seen:
            raise ConfigError(f"objectives[{i}]", f"{name} is given twice")
        seen.append(name)
    if "metric" not in seen:
        raise ConfigError(
            "objectives", "must hold metric (the tolerance decides the candidates by it)"
        )
    if "latency_ms" in seen and not measured:
        raise ConfigError("objectives", "latency_ms needs measure_latency: true")
    return tuple(seen)


def _select(value: Any, measured: bool) -> str:
    name = canonical_name(value, SELECTS)
    if name is None:
        raise ConfigError("select", f"expected {', '.join(SELECTS)}, got {value!r}")
    if name == "latency" and not measured:
        raise ConfigError("select", "latency needs measure_latency: true")
    return name
