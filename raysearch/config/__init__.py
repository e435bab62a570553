"""The config stage: a search's config read, checked and resolved (``SearchConfig``)."""

from __future__ import annotations

from raysearch.config._config import (
    BUILTIN_METRICS,
    SEARCH_ALGOS,
    ConfigError,
    EarlyStoppingConfig,
    ResourcesConfig,
    SearchConfig,
    StopConfig,
    apply_overrides,
    load_config,
    load_predefined_space,
    predefined_spaces,
    read_yaml,
)
from raysearch.config._objects import written_config
from raysearch.config._spaces import NARROWED_LOGGER, runnable_predefined_space

__all__ = [
    "ConfigError",
    "SearchConfig",
    "StopConfig",
    "ResourcesConfig",
    "EarlyStoppingConfig",
    "SEARCH_ALGOS",
    "BUILTIN_METRICS",
    "load_config",
    "predefined_spaces",
    "load_predefined_space",
    "runnable_predefined_space",
    "NARROWED_LOGGER",
    "apply_overrides",
    "read_yaml",
    "written_config",
]
