"""The ``Grid`` strategy: every valid setting of the spaces, each once: start points first, then
the grid in declaration order, interleaved by calibration key across the spaces.

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

from raysearch.space import SearchSpace, expand_spaces, get_catalogue
from raysearch.space.points import first_agreeing
from raysearch.space.space import Reject
from raysearch.strategies._registry import (
    EXHAUSTED,
    Phase,
    Proposal,
    SearchView,
    StrategyContext,
    register_strategy,
)

__all__ = ["GridPhase"]

_logger = logging.getLogger("raysearch.search.tune.searchers")


class GridPhase(Phase):
    """Every valid setting of the spaces, in order, each once.

    Not Optuna's ``BruteForceSampler``, which enumerates the raw define-by-run space:
    :func:`expand_spaces` yields exactly the distinct valid settings, in declaration order.
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
        first = [items[i] for i in order[: len(starts)]]
        rest = _interleaved_by_calibration([items[i] for i in order[len(starts) :]], spaces)
        self.items: list[tuple[int, dict[str, Any]]] = first + rest
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
            if search.knows(proposal.key):
                continue  # finished in an earlier session (resume) or queued already
            return proposal
        return EXHAUSTED


def _calibration_key(space: SearchSpace, point: dict[str, Any]) -> str:
    """What calibration a grid setting needs: its backend and the settings its catalogue says
    change what calibration collects."""
    from raysearch.quantize.calibration import calibration_values
    from raysearch.quantize.registry import DEFAULT_BACKEND

    settings = space.to_settings(point)
    backend = settings.get("quantizer") or DEFAULT_BACKEND
    catalogue = get_catalogue(backend)
    # A backend without a catalogue: one calibration per backend, as far as the order knows.
    values = calibration_values(settings, catalogue) if catalogue is not None else {}
    return f"{backend}:{sorted(values.items(), key=str)}"


def _interleaved_by_calibration(
    items: list[tuple[int, dict[str, Any]]], spaces: Sequence[SearchSpace]
) -> list[tuple[int, dict[str, Any]]]:
    """The grid round-robin over calibration keys across every space, so that the first
    concurrent trials calibrate different keys at once and the cache serves each key's later
    settings (across spaces: Quark's one space per calibration method runs as one space).

    Example:
        >>> space = SearchSpace.parse({"calibrate_method": ["MinMax", "Percentile"],
        ...                            "per_channel": [True, False]})
        >>> phase = GridPhase([space], reject=None)
        >>> [(p["calibrate_method"], p["per_channel"]) for _, p in phase.items]
        [('MinMax', True), ('Percentile', True), ('MinMax', False), ('Percentile', False)]
        >>> two = [SearchSpace.parse({"calibrate_method": [m], "per_channel": [True, False]})
        ...        for m in ("MinMax", "Percentile")]
        >>> [(i, p["calibrate_method"]) for i, p in GridPhase(two, reject=None).items]
        [(0, 'MinMax'), (1, 'Percentile'), (0, 'MinMax'), (1, 'Percentile')]
    """
    groups: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for index, point in items:  # keys in the order they first appear, the spaces' order
        groups.setdefault(_calibration_key(spaces[index], point), []).append((index, point))
    out: list[tuple[int, dict[str, Any]]] = []
    for turn in range(max((len(g) for g in groups.values()), default=0)):
        out.extend(g[turn] for g in groups.values() if turn < len(g))
    return out


@register_strategy("Grid")
def grid_strategy(context: StrategyContext) -> list[Phase]:
    """Grid: one phase over every valid setting of every space, in order."""
    return [GridPhase(context.spaces, context.reject)]
