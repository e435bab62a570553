"""Register the toy techniques of ``toy_technique`` for one test and forget them afterwards, so
that no other test sees their settings in a catalogue or their module shipped to actors."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from types import ModuleType

from raysearch import usercode
from raysearch.quantize import technique
from raysearch.space import catalogue

MODULE = "tests.plugins.toy_technique"


@contextlib.contextmanager
def registered_toy_techniques() -> Iterator[ModuleType]:
    """The imported toy module, its techniques registered until the block ends."""
    saved = (
        dict(technique._REGISTRY),
        dict(catalogue._SHARED),
        dict(usercode._MODULES),
    )
    if MODULE in sys.modules:
        module = importlib.reload(sys.modules[MODULE])  # registers again
    else:
        module = importlib.import_module(MODULE)
    try:
        yield module
    finally:
        for live, old in zip((technique._REGISTRY, catalogue._SHARED, usercode._MODULES), saved):
            live.clear()
            live.update(old)  # type: ignore[attr-defined]
