"""Search on Ray Tune: searchers, the trainable, the stopper, callbacks, resume.

The names below are imported on first use: ``import raysearch.search.preflight`` (or any
light module of the package) does not import Ray Tune, so the ``raysearch`` command can start
checking the input and computing the float reference while it imports Ray Tune
(:func:`~raysearch.search.preflight.start_preflight`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raysearch.search.runner import AutoSearch, SearchResult, resume_search, run_search
    from raysearch.search.tune.progress import ProgressCallback
    from raysearch.search.tune.searchers import SettingSearcher, check_algo_available, make_sampler
    from raysearch.search.tune.stopper import STOP_REASONS, CandidateStopper

#: Each public name and the module that defines it.
_HOMES = {
    "AutoSearch": "runner",
    "SearchResult": "runner",
    "run_search": "runner",
    "resume_search": "runner",
    "CandidateStopper": "tune.stopper",
    "STOP_REASONS": "tune.stopper",
    "SettingSearcher": "tune.searchers",
    "ProgressCallback": "tune.progress",
    "make_sampler": "tune.searchers",
    "check_algo_available": "tune.searchers",
}

__all__ = [
    "AutoSearch",
    "SearchResult",
    "run_search",
    "resume_search",
    "CandidateStopper",
    "STOP_REASONS",
    "SettingSearcher",
    "ProgressCallback",
    "make_sampler",
    "check_algo_available",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
