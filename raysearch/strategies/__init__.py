"""Search strategies: the phases a search runs, the registry of strategies, and every built-in one
(grid, samplers, fallback, conservative), each a module plus a registry line.

The names below are defined in ``raysearch.strategies._registry``."""

from __future__ import annotations

from raysearch.strategies._allocation import BUILDER_SETTINGS, anchor_name
from raysearch.strategies._registry import (
    BUILTIN_STRATEGIES,
    EXHAUSTED,
    ModelFacts,
    Phase,
    Proposal,
    SearchView,
    StrategyContext,
    canonical_strategy,
    check_strategy_available,
    check_strategy_spaces,
    get_strategy,
    register_strategy,
    strategy_names,
)

__all__ = [
    "EXHAUSTED",
    "Proposal",
    "Phase",
    "SearchView",
    "ModelFacts",
    "StrategyContext",
    "BUILTIN_STRATEGIES",
    "register_strategy",
    "get_strategy",
    "strategy_names",
    "canonical_strategy",
    "check_strategy_available",
    "check_strategy_spaces",
    "anchor_name",
    "BUILDER_SETTINGS",
]
