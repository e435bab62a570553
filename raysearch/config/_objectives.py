"""``objectives`` (the Pareto front's axes: ``metric`` first, ``latency_ms``, ``model_size_mb``,
and for a language model ``decode_latency_ms``, ``prefill_latency_ms``) and ``select`` (which
candidate ``best/`` holds).

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
from raysearch.metrics import LM_METRICS, METRICS, canonical_metric
from raysearch.ranking import DECODER_LATENCIES, OBJECTIVES, SELECTS
from raysearch.strategies import BUILTIN_STRATEGIES
from raysearch.strategies.samplers import SAMPLER_ALGOS

__all__ = [
    "parse_objectives",
    "check_objectives_algo",
    "parse_retime_latency",
    "parse_max_decode_latency",
    "parse_size_budget",
]

_logger = logging.getLogger(LOGGER)

_LM = ", ".join(LM_METRICS)
_DECODER_SELECTS = ("decode_latency", "prefill_latency")


def parse_objectives(data: Mapping[str, Any]) -> tuple[tuple[str, ...], str]:
    """``(objectives, select)`` of ``data``, each checked."""
    measured = data.get("measure_latency", True) is not False
    metric = data.get("metric")
    named = canonical_metric(metric) if isinstance(metric, str) else None
    lm = named is not None and METRICS[named].lm
    objectives = _objectives(data.get("objectives", ["metric"]), measured, lm)
    select = _select(data.get("select", "metric"), measured, lm)
    return objectives, select


def parse_retime_latency(data: Mapping[str, Any]) -> bool | None:
    """``retime_latency``: ``auto`` (None), ``true`` or ``false``.

    Example:
        >>> parse_retime_latency({"retime_latency": True})
        True
    """
    value = data.get("retime_latency", "auto")
    if isinstance(value, bool):
        if value and data.get("measure_latency", True) is False:
            raise ConfigError("retime_latency", "true needs measure_latency: true")
        return value
    if canonical_name(value, ("auto",)) is None:
        raise ConfigError("retime_latency", f"expected true, false or auto, got {value!r}")
    return None


def parse_max_decode_latency(data: Mapping[str, Any]) -> float | str | None:
    """``max_decode_latency``: ``float`` (a language model's default), ``builder``, ms, or null.

    Example:
        >>> parse_max_decode_latency({"metric": "kl"}), parse_max_decode_latency({"metric": "cos"})
        ('float', None)
    """
    metric = data.get("metric")
    named = canonical_metric(metric) if isinstance(metric, str) else None
    lm = named is not None and METRICS[named].lm
    if "max_decode_latency" not in data:
        return "float" if lm and data.get("measure_latency", True) is not False else None
    value = data["max_decode_latency"]
    if value is None:
        return None
    if not lm:
        raise ConfigError(
            "max_decode_latency", f"bounds a decode step, which only {_LM} time; metric is "
            f"{metric!r}"
        )  # fmt: skip
    if data.get("measure_latency", True) is False:
        raise ConfigError("max_decode_latency", "needs measure_latency: true")
    named_bound = canonical_name(value, ("float", "builder"))
    if named_bound is not None:
        return named_bound
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(
            "max_decode_latency",
            f"expected 'float' (the float model's decode step), 'builder' (the builder's int4's) "
            f"or milliseconds above 0, got {value!r}",
        )
    return float(value)


def check_objectives_algo(objectives: Sequence[str], algo: str) -> None:
    """Refuse a single-objective sampler with several ``objectives``; log what samples on what."""
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
    if algo in SAMPLER_ALGOS:
        several = ", ".join(n for n in SAMPLER_ALGOS if BUILTIN_STRATEGIES[n].multi_objective)
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


def _objectives(value: Any, measured: bool, lm: bool) -> tuple[str, ...]:
    names = ", ".join(n for n in OBJECTIVES if lm or n not in DECODER_LATENCIES)
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
    for name in ("latency_ms", *DECODER_LATENCIES):
        if name in seen and not measured:
            raise ConfigError("objectives", f"{name} needs measure_latency: true")
        if name in DECODER_LATENCIES and name in seen and not lm:
            raise ConfigError("objectives", f"{name} needs a language-model metric ({_LM})")
    return tuple(seen)


def _select(value: Any, measured: bool, lm: bool) -> str:
    name = canonical_name(value, SELECTS)
    if name is None:
        listed = ", ".join(n for n in SELECTS if lm or n not in _DECODER_SELECTS)
        raise ConfigError("select", f"expected {listed}, got {value!r}")
    if name != "metric" and name != "size" and not measured:
        raise ConfigError("select", f"{name} needs measure_latency: true")
    if name in _DECODER_SELECTS and not lm:
        raise ConfigError("select", f"{name} needs a language-model metric ({_LM})")
    return name


def parse_size_budget(data: Mapping[str, Any]) -> float | str | None:
    """``size_budget``: megabytes, ``builder`` (the builder's int4's size), or null (the default).

    Example:
        >>> parse_size_budget({"size_budget": 5}), parse_size_budget({"size_budget": "Builder"})
        (5.0, 'builder')
    """
    value = data.get("size_budget")
    if value is None:
        return None
    if isinstance(value, str) and value.lower() == "builder":
        return "builder"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(
            "size_budget",
            f"expected megabytes above 0 or 'builder' (the builder's int4 size), got {value!r}",
        )
    return float(value)
