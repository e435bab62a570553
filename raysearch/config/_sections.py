"""The ``stop`` and ``resources`` sections of a config.

Example:
    >>> parse_stop({"iteration_limit": 20}).iteration_limit
    20
    >>> parse_resources({"cpu_per_trial": 2}).max_concurrent_trials is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from raysearch.config._values import check_keys, integer, number
from raysearch.errors import ConfigError

__all__ = ["StopConfig", "ResourcesConfig", "parse_stop", "parse_resources"]


@dataclass
class StopConfig:
    """Stop conditions (``-1`` or absent: off); ``find_best_candidate`` ends on a target."""

    find_n_candidates: int = -1
    find_best_candidate: float | None = None
    iteration_limit: int = -1
    time_limit: float = -1


@dataclass
class ResourcesConfig:
    """Per-trial resources; ``max_concurrent_trials`` defaults to what the cluster can run."""

    cpu_per_trial: float = 1.0
    gpu_per_trial: float = 0.0
    max_concurrent_trials: int | None = None


def _given(raw: Any, section: type, key: str, expected: str) -> bool:
    """Whether the section at ``key`` is given, checked against ``section``'s fields."""
    if raw is None:
        return False
    if not isinstance(raw, Mapping):
        raise ConfigError(key, f"expected {expected}, got {raw!r}")
    check_keys(raw, {f.name for f in fields(section)}, key)
    return True


def parse_stop(raw: Any) -> StopConfig:
    """The ``stop`` section (``None``: no stop condition)."""
    if not _given(raw, StopConfig, "stop", "a mapping of stop conditions"):
        return StopConfig()
    stop = StopConfig(
        find_n_candidates=integer(raw, "find_n_candidates", -1, low=1, prefix="stop."),
        find_best_candidate=number(raw, "find_best_candidate", None, prefix="stop."),
        iteration_limit=integer(raw, "iteration_limit", -1, low=1, prefix="stop."),
        time_limit=number(raw, "time_limit", -1, prefix="stop."),
    )
    if stop.find_best_candidate == -1:
        stop.find_best_candidate = None
    if stop.time_limit != -1 and stop.time_limit <= 0:
        raise ConfigError("stop.time_limit", f"expected seconds > 0 or -1, got {stop.time_limit!r}")
    return stop


def parse_resources(raw: Any) -> ResourcesConfig:
    """The ``resources`` section (``None``: one CPU per trial)."""
    if not _given(raw, ResourcesConfig, "resources", "a mapping"):
        return ResourcesConfig()
    cpu = number(raw, "cpu_per_trial", 1.0, prefix="resources.")
    gpu = number(raw, "gpu_per_trial", 0.0, prefix="resources.")
    if cpu <= 0:
        raise ConfigError("resources.cpu_per_trial", f"expected a number > 0, got {cpu!r}")
    if gpu < 0:
        raise ConfigError("resources.gpu_per_trial", f"expected a number >= 0, got {gpu!r}")
    if gpu > 1 and not float(gpu).is_integer():
        raise ConfigError(
            "resources.gpu_per_trial",
            f"a fraction must be at most 1 (a share of one GPU), got {gpu!r}",
        )
    concurrent = integer(raw, "max_concurrent_trials", None, low=1, prefix="resources.")
    if concurrent == -1:
        concurrent = None
    return ResourcesConfig(cpu, gpu, concurrent)
