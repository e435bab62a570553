"""The ``Conservative`` strategy (alias ``conservative``, Intel Neural Compressor's
``quant_level`` 0): start from the first setting of the spaces (grid order) and quantize op
type by op type, MatMul, Gemm and Conv first, then the other op types ONNX Runtime quantizes
in model order; an op type is kept when its trial (``op_types_to_quantize`` = kept so far +
it) is a candidate. One trial at a time; resumed searches go on from the finished records.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from raysearch.ranking import is_candidate
from raysearch.space import expand_spaces
from raysearch.strategies._registry import (
    EXHAUSTED,
    Phase,
    Proposal,
    SearchView,
    StrategyContext,
    register_strategy,
)
from raysearch.strategies._setting_phase import RecordReader, setting_proposal

__all__ = ["op_order"]

_logger = logging.getLogger(__name__)

#: Op types Conservative quantizes first (the ones that carry the compute).
FIRST_OPS = ("MatMul", "Gemm", "Conv")


def op_order(op_types: Sequence[str], quantizable: frozenset[str] | None = None) -> list[str]:
    """The op types of a model Conservative tries, in order: MatMul, Gemm, Conv, then the
    others ONNX Runtime quantizes, in model order.

    Example:
        >>> op_order(["Relu", "Add", "Conv", "MatMul"], frozenset({"Add", "Conv", "MatMul"}))
        ['MatMul', 'Conv', 'Add']
    """
    from raysearch.quantize.calibration import DEFAULT_OP_TYPES

    quantizable = frozenset(DEFAULT_OP_TYPES) if quantizable is None else quantizable
    present = [op for op in dict.fromkeys(op_types) if op in quantizable]
    return [op for op in FIRST_OPS if op in present] + [op for op in present if op not in FIRST_OPS]


class ConservativePhase(RecordReader, Phase):
    """Op type by op type from the first setting of the spaces (see the module)."""

    def __init__(self, context: StrategyContext) -> None:
        grid = expand_spaces(context.spaces, context.reject)
        self.index = grid.space_index[0] if grid.points else 0
        self.base: dict[str, Any] | None = None
        if grid.points:
            space = context.spaces[self.index]
            self.base = space.to_settings(grid.points[0])
            self.base.pop("op_types_to_quantize", None)
        self.ops: list[str] = []
        self.accepted: list[str] = []
        self.position = 0
        self.candidates: dict[str, bool] = {}

    def start(self, context: StrategyContext) -> None:
        self.context = context
        self.ops = op_order(context.model.op_types)
        _logger.info("conservative: op types in order %s", ", ".join(self.ops) or "(none)")

    def propose(self, trial_id: str, search: SearchView) -> Proposal | str | None:
        for record in self._new_records():
            self.candidates[str(record.key)] = is_candidate(record)
        while self.base is not None and self.position < len(self.ops):
            op = self.ops[self.position]
            settings = {**self.base, "op_types_to_quantize": [*self.accepted, op]}
            proposal = setting_proposal(settings, self.index)
            if proposal.key in search.live_keys:
                return None
            if proposal.key not in search.done:
                return proposal
            self.position += 1
            if self.candidates.get(proposal.key, False):
                self.accepted.append(op)
                _logger.info("conservative: %s kept", op)
            else:
                _logger.info("conservative: %s stays float (out of tolerance)", op)
        return EXHAUSTED


@register_strategy("Conservative", aliases=("conservative",))
def conservative_strategy(context: StrategyContext) -> list[Phase]:
    """Conservative: quantize op type by op type, keeping those that hold the tolerance."""
    return [ConservativePhase(context)]
