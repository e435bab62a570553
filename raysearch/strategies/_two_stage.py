"""The ``TwoStage`` strategy (Quark's ``two_stage_search``), with each stage's trials
concurrent and the ``stop:`` conditions in force:

1. ``calibration``: each space with fine-tuning off: the grid when it fits half of
   ``stop.iteration_limit`` (the whole grid without one), else TPE.
2. ``fine_tuning``: the space around stage 1's best, every setting but fine-tuning's held at
   the best's values and fine-tuning on: its grid, or TPE.

Example:
    >>> from raysearch.space import SearchSpace
    >>> space = SearchSpace.parse({"per_channel": [True, False], "include_fast_ft": [False, True],
    ...     "ft": {"only_if": {"include_fast_ft": True},
    ...            "extra_options": {"NumIterations": [100, 200]}}})
    >>> stage_two_space(space, {"per_channel": False}).expand().points[0]["per_channel"]
    False
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from raysearch.ranking import best_record
from raysearch.space import SearchSpace
from raysearch.strategies._registry import Phase, StrategyContext, register_strategy
from raysearch.strategies._roles import (
    FINETUNE,
    complete_point,
    finetuning_on,
    narrow,
    off_values,
    roles,
)
from raysearch.strategies._stages import DeferredPhase, calibration_phases, sub_phase
from raysearch.trialrecord import TrialRecord

__all__ = ["stage_two_space"]

_logger = logging.getLogger(__name__)

#: Stage 1's trials when there is no iteration limit and its space has ranges.
STAGE_ONE_TRIALS = 24


def stage_two_space(space: SearchSpace, best_params: Mapping[str, Any]) -> SearchSpace:
    """``space`` with every setting but fine-tuning's held at ``best_params`` (those the best
    does not set at their first value) and fine-tuning switched on."""
    names = roles(space)
    held = complete_point(space, {n: v for n, v in best_params.items() if names.get(n) != FINETUNE})
    fixed = {n: v for n, v in held.items() if names.get(n) != FINETUNE}
    return narrow(space, {**fixed, **finetuning_on(space)})


class FinetuneStage(DeferredPhase):
    """Stage 2: the fine-tuning space around stage 1's best (see the module)."""

    stage = "fine_tuning"

    def make(self, context: StrategyContext) -> Phase | None:
        earlier = [r for r in context.records if r.stage == "calibration"]
        best = best_record(earlier, context.mode == "max")
        if best is None:
            _logger.info("two_stage: stage 1 finished no trial; stage 2 skipped")
            return None
        index = int(best.phase or 0)
        space = context.spaces[min(index, len(context.spaces) - 1)]
        why = _untunable(space, best, context)
        if finetuning_on(space) and why is not None:
            # Fine-tuning needs a QDQ graph: the best setting it applies to.
            tunable = [r for r in earlier if _untunable(_space_of(r, context), r, context) is None]
            chosen = best_record(tunable, context.mode == "max")
            if chosen is None:
                _logger.info(
                    "two_stage: stage 2 skipped: none of the %d settings of stage 1 can be "
                    "fine-tuned (trial %s, the best, cannot: %s)",
                    len(earlier),
                    best.trial_id,
                    why,
                )
                return None
            _logger.info(
                "two_stage: trial %s (metric %s), the best of stage 1, cannot be fine-tuned "
                "(%s); trial %s is the best that can",
                best.trial_id,
                best.metric,
                why,
                chosen.trial_id,
            )
            best = chosen
            index = int(best.phase or 0)
            space = _space_of(best, context)
        if not finetuning_on(space):
            _logger.info(
                "two_stage: the space of stage 1's best (trial %s) has no fine-tuning "
                "(include_fast_ft: [true]); the search ends after stage 1",
                best.trial_id,
            )
            return None
        left = None
        if context.max_trials:
            left = max(0, context.max_trials - len(context.records))
            if left == 0:
                return None
        sub = stage_two_space(space, best.params or {})
        _logger.info(
            "two_stage: stage 2 fine-tunes around trial %s (metric %s)",
            best.trial_id,
            best.metric,
        )
        return sub_phase(context, sub, index, left, self.stage)


def _space_of(record: TrialRecord, context: StrategyContext) -> SearchSpace:
    return context.spaces[min(int(record.phase or 0), len(context.spaces) - 1)]


def _untunable(space: SearchSpace, record: TrialRecord, context: StrategyContext) -> str | None:
    """Why the stage-two space around ``record`` holds no fine-tuned setting (the validity
    rules strip the fine-tuning switch from it), None when it holds one (or has ranges)."""
    from raysearch.space.rules import RULES

    switches = finetuning_on(space)
    sub = stage_two_space(space, record.params or {})
    if not switches or sub.has_ranges:
        return None
    if any(all(p.get(n) is True for n in switches) for p in sub.expand(context.reject).points):
        return None
    point = {**complete_point(space, record.params or {}), **switches}
    said = []
    for rule in RULES:
        dropped = [k for k in rule(point) if k in switches]
        if dropped:
            said.append(f"{rule.__name__} drops {', '.join(dropped)}")
    return "; ".join(said) or "the backend refuses it"


@register_strategy("TwoStage", aliases=("two_stage", "two_stage_search", "twostage"))
def two_stage_strategy(context: StrategyContext) -> list[Phase]:
    """TwoStage: calibration settings, then fine-tuning on the best of them."""
    if context.max_trials:
        budget = max(1, context.max_trials // 2)
    else:
        spaces = [narrow(s, off_values(s, (FINETUNE,))) for s in context.spaces]
        finite = not any(s.has_ranges for s in spaces)
        budget = sum(len(s.expand(context.reject)) for s in spaces) if finite else 0
        budget = budget or STAGE_ONE_TRIALS
    stage_one = calibration_phases(context, budget, roles_off=(FINETUNE,))
    _logger.info(
        "two_stage: stage 1 over the calibration settings (%d trials at most), then "
        "fine-tuning on its best",
        budget,
    )
    return [*stage_one, FinetuneStage(len(context.spaces))]
