"""A trial's record as Ray Tune carries it: JSON text, so that none of its numbers enters the
analysis Tune keeps of every number of every result until the experiment ends.

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
