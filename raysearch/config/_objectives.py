"""``objectives`` and ``select``: what the Pareto front of the candidates is over, and which
candidate ``best/`` holds.

``objectives`` lists any of ``metric`` (its own direction), ``latency_ms`` and
``model_size_mb`` (both minimised); ``metric`` must be one of them (the tolerance decides the
candidates by it). ``select`` picks ``best/`` among the candidates: ``metric`` (the ranking
of :func:`raysearch.ranking.better`, the default), ``latency`` (the fastest) or ``size`` (the
smallest).

With several objectives, the Optuna samplers that take several (``StrategyInfo
.multi_objective``: NSGA-II, TPE, GP, random, QMC) sample on every one; CMA-ES takes one and is
refused; the other strategies (Grid, Auto, Fallback, ...) order their trials by the metric.
One INFO line of the config's reading notes (``raysearch.config.dialects``, shown by the
command line) says which (:func:`check_objectives_algo`).

Example:
    >>> parse_objectives({"objectives": ["metric", "model_size_mb"], "select": "size"})
    (('metric', 'model_size_mb'), 'size')
    >>> parse_objectives({})
    (('metric',), 'metric')
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from raysearch.config._dialects import LOGGER
from raysearch.errors import ConfigError, canonical_name, suggest
from raysearch.ranking import OBJECTIVES, SELECTS
from raysearch.strategies import BUILTIN_STRATEGIES

__all__ = ["parse_objectives", "check_objectives_algo"]

#: The Optuna samplers: those that are not ``multi_objective`` take one objective only.
SAMPLER_NAMES = tuple(
    name
    for name, info in BUILTIN_STRATEGIES.items()
    if info.module == "raysearch.strategies.samplers"
)

_logger = logging.getLogger(LOGGER)


def parse_objectives(data: Mapping[str, Any]) -> tuple[tuple[str, ...], str]:
    """``(objectives, select)`` of ``data``, each checked; a mistake is one ConfigError
    naming the key."""
    measured = data.get("measure_latency", True) is not False
    objectives = _objectives(data.get("objectives", ["metric"]), measured)
    select = _select(data.get("select", "metric"), measured)
    return objectives, select


def check_objectives_algo(objectives: Sequence[str], algo: str) -> None:
    """Refuse a sampler that optimises one objective when ``objectives`` holds several, and
    log in one line what samples on what.

    Example:
        >>> try:
        ...     check_objectives_algo(("metric", "latency_ms"), "CmaEs")
        ... except ConfigError as error:
        ...     print(str(error).split("; ")[0])
        search_algo: CmaEs optimises one objective, and objectives lists 2
    """
    if len(objectives) < 2:
        return
    info = BUILTIN_STRATEGIES.get(algo)
    listed = ", ".join(objectives)
    if info is not None and info.multi_objective:
        _logger.info(
            "objectives: %s samples on every objective (%s); the Pareto front "
            "(pareto.parquet) and select use them too",
            algo,
            listed,
        )
        return
    if algo in SAMPLER_NAMES:
        several = ", ".join(n for n in SAMPLER_NAMES if BUILTIN_STRATEGIES[n].multi_objective)
        raise ConfigError(
            "search_algo",
            f"{algo} optimises one objective, and objectives lists {len(objectives)}; "
            f"use one of {several}, or objectives: [metric]",
        )
    _logger.info(
        "objectives: %s orders its trials by the metric; the Pareto front (pareto.parquet) "
        "and select use every objective (%s)",
        algo,
        listed,
    )


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
