"""A toy search strategy registered from outside raysearch: probe, then refine around the best.

``search_algo: ProbeThenRefine`` runs two phases over a grid space. The first probes one
setting per ``calibrate_method``; the second starts once those finished, reads their records
from the strategy context, and proposes every other setting that shares the best probe's
method. It shows what a phase-based strategy needs from raysearch: the finished records of the
phases before it, and the spaces.
"""

from __future__ import annotations

from typing import Any

from raysearch.plugins import (
    EXHAUSTED,
    Phase,
    Proposal,
    SearchView,
    StrategyContext,
    expand_spaces,
    register_strategy,
)


class _ListPhase(Phase):
    """Proposes the settings of ``items`` ((space index, point) pairs) in order, each once."""

    def __init__(self, context: StrategyContext) -> None:
        self.spaces = list(context.spaces)
        self.items: list[tuple[int, dict[str, Any]]] = []

    def propose(self, trial_id: str, search: SearchView) -> Proposal | str | None:
        while self.items:
            index, point = self.items.pop(0)
            proposal = Proposal.of(self.spaces[index], index, point)
            if proposal.key not in search.known_keys:
                return proposal
        # Wait for the phase's running trials: the next phase reads their records.
        return None if search.live_keys else EXHAUSTED


def _grid(context: StrategyContext) -> list[tuple[int, dict[str, Any]]]:
    grid = expand_spaces(context.spaces, context.reject)
    return list(zip(grid.space_index, grid.points))


class ProbePhase(_ListPhase):
    def start(self, context: StrategyContext) -> None:
        seen: set[Any] = set()
        for index, point in _grid(context):
            method = point.get("calibrate_method")
            if method not in seen:
                seen.add(method)
                self.items.append((index, point))


class RefinePhase(_ListPhase):
    def start(self, context: StrategyContext) -> None:
        self.records_at_start = len(context.records)
        best = context.best()
        self.best_method = None if best is None else best.params.get("calibrate_method")
        self.items = [
            (index, point)
            for index, point in _grid(context)
            if point.get("calibrate_method") == self.best_method
        ]


@register_strategy("ProbeThenRefine", aliases=("probe_then_refine",))
def probe_then_refine(context: StrategyContext) -> list[Phase]:
    return [ProbePhase(context), RefinePhase(context)]
