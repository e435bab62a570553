"""The ``FinetuneSearch`` strategy (Quark's ``advanced_fastft_search``): fine-tuning's
``NumIterations``, ``LearningRate``, ``BatchSize`` and ``DataSize`` searched as ranges by one
TPE sampler in the driver, which every concurrent trial learns from. As in Quark, a parameter
given as two values is the range between them (log scale where the ends differ by 10x).

Example:
    >>> from raysearch.space import SearchSpace
    >>> space = SearchSpace.parse({"include_fast_ft": [True], "extra_options": {
    ...     "NumIterations": [100, 200], "LearningRate": [1e-3, 1e-7]}})
    >>> [type(p.domain).__name__ for p in ranged(space).params]
    ['Categorical', 'IntRange', 'FloatRange']
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from raysearch.errors import ConfigError
from raysearch.space import Categorical, SearchSpace
from raysearch.space.tree import FloatRange, IntRange
from raysearch.strategies._registry import Phase, StrategyContext, register_strategy
from raysearch.strategies._roles import finetuning_on, redomain
from raysearch.strategies.samplers import sampler_strategy

__all__ = ["ranged", "check_spaces"]

_logger = logging.getLogger(__name__)

#: Fine-tuning parameters searched as ranges, and whether they are whole numbers.
RANGED = {"NumIterations": True, "BatchSize": True, "DataSize": True, "LearningRate": False}


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def ranged(space: SearchSpace) -> SearchSpace:
    """``space`` with each fine-tuning parameter of :data:`RANGED` given as two values read as
    the range between them, and ``include_fast_ft`` held on where the space offers it."""
    domains: dict[str, object] = {n: Categorical((True,)) for n in finetuning_on(space)}
    for param in space.params:
        domain = param.domain
        if param.leaf not in RANGED or not isinstance(domain, Categorical):
            continue
        values = domain.choices
        if len(values) != 2 or not all(_is_number(v) for v in values) or values[0] == values[1]:
            continue
        low, high = sorted(values)
        if RANGED[param.leaf]:
            log = low > 0 and high / low >= 10
            domains[param.name] = IntRange(int(low), int(high), log=log)
        else:
            domains[param.name] = FloatRange(float(low), float(high), log=low > 0)
    return redomain(space, domains)


def _searched(space: SearchSpace) -> list[str]:
    return [
        p.name
        for p in space.params
        if p.leaf in RANGED and isinstance(p.domain, (IntRange, FloatRange))
    ]


def check_spaces(spaces: Sequence[SearchSpace]) -> list[str]:
    """The fine-tuning parameters the spaces give as ranges (:func:`ranged`); ConfigError
    (``search_algo``) when none does."""
    searched = sorted({name for space in spaces for name in _searched(ranged(space))})
    if not searched:
        raise ConfigError(
            "search_algo",
            "FinetuneSearch searches fine-tuning's NumIterations, LearningRate, BatchSize or "
            "DataSize as ranges: give at least one as two values ([100, 200]) or a range",
        )
    return searched


@register_strategy(
    "FinetuneSearch", aliases=("finetune_search", "advanced_fastft_search", "fastft_search")
)
def finetune_search_strategy(context: StrategyContext) -> list[Phase]:
    """FinetuneSearch: TPE over fine-tuning's parameters as ranges (see the module)."""
    spaces = [ranged(space) for space in context.spaces]
    searched = check_spaces(context.spaces)
    _logger.info("finetune_search: one TPE sampler over %s", ", ".join(searched))
    phases = sampler_strategy("TPE", dataclasses.replace(context, spaces=spaces))
    for phase in phases:
        phase.stage = "fine_tuning"  # type: ignore[attr-defined]
    return phases
