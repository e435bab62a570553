"""Search on Ray Tune. ``AutoSearch`` and ``SearchResult`` are imported on first use, so that
a light module of the package (:mod:`~raysearch.search.preflight`) imports no Ray Tune."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raysearch.search.runner import AutoSearch, SearchResult

__all__ = ["AutoSearch", "SearchResult"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.runner"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
