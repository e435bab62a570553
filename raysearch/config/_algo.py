"""The search algorithm's name: any registered strategy (:mod:`raysearch.strategies`), under its
name or an accepted spelling. The names live in the strategy registry only.

Example:
    >>> choose_algo("grid_search"), choose_algo("TPE")
    ('Grid', 'TPE')
"""

from __future__ import annotations

from typing import Any

from raysearch.strategies import BUILTIN_STRATEGIES, canonical_strategy

__all__ = ["SEARCH_ALGOS", "choose_algo"]

#: The built-in search algorithms (strategies registered later are accepted too).
SEARCH_ALGOS = tuple(BUILTIN_STRATEGIES)


def choose_algo(value: Any) -> str:
    """The canonical name of ``search_algo`` (an alias such as ``grid_search`` is logged)."""
    return canonical_strategy(value, "search_algo")
