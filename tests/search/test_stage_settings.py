"""Building a stage's settings: a setting the catalogues refuse is left out with one INFO line
naming it and why; any other error (a stage's bug) is not swallowed but ends the search."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import raysearch  # noqa: F401  (the built-in catalogues)
from raysearch.strategies._stages import BuiltPhase


class _Stage(BuiltPhase):
    stage = "test"

    def __init__(self, settings: list[Any]) -> None:
        super().__init__(1)
        self.settings = settings

    def build(self, context: Any) -> list[Any]:
        return self.settings


def test_a_refused_setting_is_left_out_with_one_line(caplog):
    stage = _Stage([])
    with caplog.at_level(logging.INFO, logger="raysearch"):
        proposals = stage.proposals([{"per_channel": True}, {"calibrate_method": "Nope"}])
    assert [p.settings for p in proposals] == [{"per_channel": True}]
    assert [r.getMessage() for r in caplog.records] == [
        "test: {'calibrate_method': 'Nope'} left out (fallback.calibrate_method: expected one of"
        " MinMax, Entropy, Percentile, Distribution, got 'Nope')"
    ]


def test_a_stage_that_builds_a_broken_setting_fails_with_its_error(caplog):
    stage = _Stage([])
    with pytest.raises(AttributeError, match="'int' object has no attribute 'split'"):
        stage.proposals([{"per_channel": True}, {1: 2}])  # a key that is no key path: a bug
