"""One finished (or, between rungs, partly evaluated) trial: :class:`TrialRecord`, frozen.

The trial engine makes it, the trainable and the recorder complete it with
:meth:`TrialRecord.replace`; it is serialized only at the edges (a Tune result's JSON text,
the journal, ``results.parquet``) and :meth:`TrialRecord.from_dict` reads each back.

Example:
    >>> record = TrialRecord(trial_id="a1", status="ok", metric=0.5, extra={"promoted": 1.0})
    >>> record.metric, record.reused_from
    (0.5, None)
    >>> TrialRecord.from_dict(record.to_dict()) == record
    True
    >>> "model_lost" in record.to_dict(), "metric" in record.to_dict()
    (False, True)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TrialRecord"]


@dataclass(frozen=True, eq=False)
class TrialRecord:
    """A trial's record: its setting, outcome, timings, sizes, node, errors and ``extra``.

    ``status`` is ``"ok"`` or ``"failed"`` (then ``error`` says why, in one line).
    ``is_candidate`` is the trial's own decision (``StagedTrial``); the one meaning of
    "candidate" is :func:`raysearch.ranking.is_candidate`.
    """

    # -- the setting (the trial's config, added by the recorder) --------------------------
    trial_id: str | None = None
    number: int | None = None
    phase: int | None = None
    stage: str | None = None
    key: str | None = None
    point: Mapping[str, Any] | None = None
    params: Mapping[str, Any] | None = None
    settings: Mapping[str, Any] | None = None
    # -- the outcome ------------------------------------------------------------------------
    status: str = "failed"
    metric: float | None = None
    #: What the search's sampler optimises (:meth:`Evaluator.sampler_objective`).
    objective: float | None = None
    is_candidate: bool = False
    could_be_candidate: bool = False
    error: str | None = None
    # -- timings (seconds; ``started_at``/``ended_at`` wall clock) -------------------------
    duration_s: float | None = None
    calibration_s: float | None = None
    quantization_s: float | None = None
    evaluation_s: float | None = None
    calib_cache_hit: bool | None = None
    started_at: float | None = None
    ended_at: float | None = None
    #: The search's wall time when the recorder wrote the record.
    elapsed_s: float | None = None
    # -- the model's figures ----------------------------------------------------------------
    model_size_bytes: int | None = None
    latency_ms: float | None = None
    decode_latency_ms: float | None = None
    prefill_latency_ms: float | None = None
    # -- evaluation on growing subsets ------------------------------------------------------
    eval_rows: int | None = None
    eval_fraction: float | None = None
    rung: int = 0
    rungs: int = 1
    rung_error: float | None = None
    #: The rung ASHA stopped the trial at (None: evaluated on every row).
    stopped_at_rung: int | None = None
    #: ASHA's score, the time and the metric at each rung.
    rung_scores: list[float] | None = None
    rung_ended_at: list[float] | None = None
    rung_metrics: list[float | None] | None = None
    # -- where it ran -----------------------------------------------------------------------
    device: str | None = None
    node: str | None = None
    node_id: str | None = None
    gpu_id: str | None = None
    worker_pid: int | None = None
    #: How many trials the actor had run, this one included; its setup and its wait at the
    #: start barrier (its first trial only).
    actor_trials: int | None = None
    actor_setup_s: float | None = None
    actor_wait_s: float | None = None
    actor_wait_timed_out: bool | None = None
    # -- the model and what went wrong ------------------------------------------------------
    #: Where the trial wrote its model; the recorder replaces it by ``model_file`` (relative
    #: to the output folder; None: not kept).
    model_path: str | None = None
    model_file: str | None = None
    model_lost: str | None = None
    retries: int | None = None
    retried_after: str | None = None
    #: A result no trial of this search ran: the earlier search and trial that measured it.
    reused_from: str | None = None
    #: The trial's disk filled up: the search stops without journaling it.
    disk_full: bool | None = None
    #: Rows of the sensitivity rankings computed for the trial (``sensitivity.parquet``).
    sensitivity: list[dict[str, Any]] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    # -- serialization ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The record as plain JSON-ready values (NaN and infinities as None), without the
        fields a trial only sometimes has when they are None."""
        values = ((name, getattr(self, name)) for name in _ORDER)
        return {n: _finite(v) for n, v in values if v is not None or n not in _OPTIONAL}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialRecord:
        """The record of ``data`` (a journal line, a Tune result's record, :meth:`to_dict`).

        Raises:
            ValueError: ``data`` holds a key that is no field of a record.
        """
        if isinstance(data, TrialRecord):
            return data
        unknown = sorted(set(data) - _FIELDS)
        if unknown:
            raise ValueError(f"not fields of a trial record: {', '.join(map(str, unknown))}")
        return cls(**{k: v for k, v in data.items() if v is not None or k in _NULLABLE})

    @property
    def ok(self) -> bool:
        """Whether the trial ended ``ok`` (its metric measured)."""
        return self.status == "ok"

    def replace(self, **changes: Any) -> TrialRecord:
        """A copy with ``changes`` (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    def __eq__(self, other: object) -> bool:
        """Equal fields, NaN equal to None (as the journal reads it back)."""
        if not isinstance(other, TrialRecord):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    #: Kept by identity (the recorder's best, the records a strategy read).
    __hash__ = object.__hash__


_ORDER = tuple(f.name for f in dataclasses.fields(TrialRecord))
_FIELDS = frozenset(_ORDER)
#: Fields with a default that is not None: a None read back keeps the default.
_NULLABLE = frozenset(f.name for f in dataclasses.fields(TrialRecord) if f.default is None)
#: Fields only some trials have: left out of :meth:`TrialRecord.to_dict` while None.
_OPTIONAL = frozenset(
    {
        "started_at",
        "ended_at",
        "elapsed_s",
        "rung_scores",
        "rung_ended_at",
        "rung_metrics",
        "gpu_id",
        "worker_pid",
        "actor_trials",
        "actor_setup_s",
        "actor_wait_s",
        "actor_wait_timed_out",
        "model_path",
        "model_lost",
        "reused_from",
        "disk_full",
        "sensitivity",
    }
)


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None, in lists and mappings too."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
