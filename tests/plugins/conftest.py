"""The toy plugins are registered for the tests of this folder only: the registries are put
back afterwards, so the rest of the suite sees raysearch's own backends and strategies."""

from __future__ import annotations

import contextlib
import importlib
import sys

import pytest

from raysearch import usercode
from raysearch.errors import ConfigError
from raysearch.quantize import registry, technique
from raysearch.space import catalogue
from raysearch.strategies import _registry as strategy
from tests.search.conftest import make_config, mlp_files  # noqa: F401  (the search fixtures)

TOYS = ("tests.plugins.toy_backend", "tests.plugins.toy_strategy", "tests.plugins.toy_technique")
_REGISTRIES = (
    (registry, "_REGISTRY"),
    (technique, "_REGISTRY"),
    (catalogue, "_CATALOGUES"),
    (catalogue, "_SHARED"),
    (strategy, "_REGISTRY"),
    (strategy, "_ALIASES"),
    (usercode, "_MODULES"),
)


@pytest.fixture(autouse=True, scope="module")
def toy_plugins():
    """Import (and so register) the toy plugins for one test module, then unregister them."""
    # The built-in ones register on first use: load them first, so putting the registries
    # back does not drop them.
    for backend in registry.BUILTIN_BACKENDS:
        registry.get_backend(backend)
    for name in strategy.BUILTIN_STRATEGIES:
        with contextlib.suppress(ConfigError):  # a sampler whose package is not installed
            strategy.get_strategy(name)
    saved = [(module, name, dict(getattr(module, name))) for module, name in _REGISTRIES]
    for toy in TOYS:
        if importlib.util.find_spec(toy) is not None:
            sys.modules.pop(toy, None)
            importlib.import_module(toy)
    yield
    for module, name, value in saved:
        setattr(module, name, value)
