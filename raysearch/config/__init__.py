"""The config stage: a search's config read, checked and resolved (``SearchConfig``)."""

from __future__ import annotations

from raysearch.config._config import SearchConfig, load_config
from raysearch.config._files import apply_overrides, read_yaml
from raysearch.config._objects import written_config
from raysearch.config._sections import StopConfig
from raysearch.config._spaces import NARROWED_LOGGER, predefined_spaces, runnable_predefined_space
from raysearch.errors import ConfigError
from raysearch.metrics import BUILTIN_METRICS

__all__ = [
    "ConfigError",
    "SearchConfig",
    "StopConfig",
    "BUILTIN_METRICS",
    "load_config",
    "predefined_spaces",
    "runnable_predefined_space",
    "NARROWED_LOGGER",
    "apply_overrides",
    "read_yaml",
    "written_config",
]
