"""The ``Grid`` strategy: every valid setting of the spaces, in order, each once.

Example:
    >>> from raysearch.space import SearchSpace
    >>> phase = GridPhase([SearchSpace.parse({"per_channel": [True, False]})], reject=None)
    >>> len(phase)
    2
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from raysearch.space import SearchSpace, expand_spaces
from raysearch.space.points import first_agreeing
from raysearch.space.space import Reject
from raysearch.strategy import (
    EXHAUSTED,
    Phase,
    Proposal,
    SearchView,
    StrategyContext,
    register_strategy,
)

__all__ = ["GridPhase", "grid_strategy"]

_logger = logging.getLogger("raysearch.search.searchers")


class GridPhase(Phase):
    """Every valid setting of the spaces, in order, each once.

    Not Optuna's ``BruteForceSampler``: it enumerates the raw define-by-run space, so it would
    propose settings that the validity rules make copies of one already run (and settings the
    backend refuses) and then need telling each was a duplicate, in its own order rather than
    the declaration order a grid documents; :func:`expand_spaces` yields exactly the distinct
    valid settings, counted per rule, which is also what ``raysearch validate`` prints.
    """

    def __init__(self, spaces: Sequence[SearchSpace], reject: Reject | None) -> None:
        grid = expand_spaces(spaces, reject)
        items = list(zip(grid.space_index, grid.points))
        # Each space's points_to_evaluate first (its first agreeing setting), then the grid.
        starts = [(i, p) for i, s in enumerate(spaces) for p in s.points_to_evaluate]
        # (" space" is no parameter name: names are dotted keys without spaces.)
        order = first_agreeing(
            [{" space": i, **p} for i, p in items], [{" space": i, **p} for i, p in starts]
        )
        self.items: list[tuple[int, dict[str, Any]]] = [items[i] for i in order]
        if grid.dropped.get("duplicate"):
            _logger.info("grid: %d repeated settings dropped", grid.dropped["duplicate"])
        self.spaces = list(spaces)
        self.position = 0

    def __len__(self) -> int:
        return len(self.items)

    def propose(self, trial_id: str, search: SearchView) -> Proposal | str | None:
        while self.position < len(self.items):
            index, point = self.items[self.position]
            self.position += 1
            proposal = Proposal.of(self.spaces[index], index, point)
            if proposal.key in search.known_keys:
                continue  # finished in an earlier session (resume) or queued already
            return proposal
        return EXHAUSTED


@register_strategy("Grid")
def grid_strategy(context: StrategyContext) -> list[Phase]:
    """Grid: one phase over every valid setting of every space, in order."""
    return [GridPhase(context.spaces, context.reject)]
