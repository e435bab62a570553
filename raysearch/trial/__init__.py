"""One trial without Ray: quantize, evaluate, decide (``TrialRunner``, ``TrialSpec``)."""

from __future__ import annotations

from raysearch.trial._runner import (
    FloatBaseline,
    StagedTrial,
    TrialDevice,
    TrialEngine,
    TrialRunner,
    TrialSpec,
    decide_complete,
    one_line,
)

__all__ = [
    "TrialSpec",
    "TrialDevice",
    "FloatBaseline",
    "TrialRunner",
    "TrialEngine",
    "StagedTrial",
    "decide_complete",
    "one_line",
]
