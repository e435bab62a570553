"""A trial's record as Ray Tune carries it: JSON text, not a nested dict.

Tune keeps, for every trial of an experiment until it ends, its last result and an analysis of
each number in it (max, min, mean, last, the means of the last 5 and 10: ``metric_analysis``,
nested dicts flattened first), and caches the trial's state as JSON for its experiment
checkpoint. Reported as a dict, each of a record's 20-30 numbers (timings, sizes, rung scores,
``extra``) would get that analysis, which nothing of raysearch reads, and the driver would hold
it for every trial of the search (``benchmarks/README.md``, section 14, "What grew with
trials"). As one string the record is none of Tune's numbers; the driver's readers
(recorder, progress line, stopper, searcher) decode it with :func:`reported_record`.

Example:
    >>> result = {"metric": 0.9, "trial": pack_record(TrialRecord(status="ok", metric=0.9))}
    >>> reported_record(result).metric
    0.9
    >>> reported_record({"trial": {"status": "ok"}}).status  # a record passed as a mapping
    'ok'
    >>> reported_record({"metric": None}) is None
    True
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from raysearch.space.space import json_default
from raysearch.trialrecord import TrialRecord

__all__ = ["pack_record", "reported_record", "RECORD_KEY"]

#: The key of a Tune result that holds the trial's record.
RECORD_KEY = "trial"


def pack_record(record: TrialRecord) -> str:
    """``record`` as the JSON text a trainable reports."""
    return json.dumps(record.to_dict(), default=json_default)


def reported_record(result: Mapping[str, Any] | None) -> TrialRecord | None:
    """The trial's record in a Tune result: decoded from its JSON text, or read from the
    mapping itself (a record passed directly); None when there is none."""
    value = (result or {}).get(RECORD_KEY)
    if isinstance(value, str):
        value = json.loads(value)
    return TrialRecord.from_dict(value) if isinstance(value, (Mapping, TrialRecord)) else None
