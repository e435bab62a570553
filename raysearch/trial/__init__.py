"""One trial without Ray: quantize, evaluate, decide (``TrialRunner``, ``TrialSpec``)."""

from __future__ import annotations

from raysearch.trial._runner import FloatBaseline, TrialDevice, TrialRunner, TrialSpec
from raysearch.trial._staged import StagedTrial, TrialEngine, decide_complete

__all__ = [
    "TrialSpec",
    "TrialDevice",
    "FloatBaseline",
    "TrialRunner",
    "TrialEngine",
    "StagedTrial",
    "decide_complete",
]
