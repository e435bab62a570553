"""The finished-trial records an output is written from: their order, the best one.

Example:
    >>> rows = [TrialRecord(trial_id="b", number=2, status="ok", metric=0.1),
    ...         TrialRecord(trial_id="a", number=1, status="ok", metric=0.3)]
    >>> [r.trial_id for r in order(rows)], best_record(rows, higher_is_better=True).trial_id
    (['a', 'b'], 'a')
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

from raysearch.trialrecord import TrialRecord

__all__ = [
    "OBJECTIVES",
    "DECODER_LATENCIES",
    "SELECTS",
    "LATENCIES",
    "objective_values",
    "dominates",
    "objective_value",
    "pareto_front",
    "finite",
    "order",
    "unquantized",
    "PROBE_STAGE",
    "is_probe",
    "is_candidate",
    "better",
    "deciding_rule",
    "best_record",
    "best_records",
    "stopped_at_rung",
]


#: What a search's Pareto front can be over (config ``objectives``).
OBJECTIVES = ("metric", "latency_ms", "model_size_mb", "decode_latency_ms", "prefill_latency_ms")
#: The latencies only a language-model metric's trials measure.
DECODER_LATENCIES = ("decode_latency_ms", "prefill_latency_ms")
#: What picks ``best/`` among the candidates (config ``select``); the key each one minimises.
SELECTS = ("metric", "latency", "size", "decode_latency", "prefill_latency")
#: The latencies a summary sets against the float model's: (its ``best_``/``float_`` key, the
#: words, the unit, its field of how they were timed alone after the search).
LATENCIES = (
    ("latency_ms", "latency", "ms per batch", "latency_retimed"),
    ("decode_latency_ms", "decode step", "ms per token", "decode_latency_retimed"),
    ("prefill_latency_ms", "prefill", "ms per prompt", "prefill_latency_retimed"),
)
_SELECT_KEY = {
    "latency": "latency_ms",
    "size": "model_size_bytes",
    "decode_latency": "decode_latency_ms",
    "prefill_latency": "prefill_latency_ms",
}


def finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def order(records: Sequence[TrialRecord]) -> list[TrialRecord]:
    """Records in the order their trials started (``number``), ties by trial id."""

    def key(record: TrialRecord) -> tuple[int, str]:
        number = record.number
        return (number if isinstance(number, int) else 1 << 62, str(record.trial_id))

    return sorted(records, key=key)


def _extra(record: TrialRecord, name: str) -> float | None:
    return finite(record.extra.get(name))


def promoted(record: TrialRecord) -> float:
    """How many tensors the record's setting kept at higher precision (mixed precision)."""
    return _extra(record, "promoted") or 0.0


def unquantized(record: TrialRecord) -> bool:
    """Whether the record's setting keeps every MatMul/Gemm/Conv node float
    (``extra.quantizes_nothing``, :func:`raysearch.modelgraph.quantizes_nothing`).

    Example:
        >>> unquantized(TrialRecord(extra={"quantizes_nothing": 1.0})), unquantized(TrialRecord())
        (True, False)
    """
    return bool(_extra(record, "quantizes_nothing"))


#: The stage of a sensitivity probe: one weight MatMul at the low precision, the rest float.
PROBE_STAGE = "sensitivity"


def is_probe(record: TrialRecord) -> bool:
    """Whether the record is a sensitivity probe (stage :data:`PROBE_STAGE`): never a
    candidate nor the best.

    Example:
        >>> is_probe(TrialRecord(stage="sensitivity")), is_probe(TrialRecord(stage="blocks"))
        (True, False)
    """
    return record.stage == PROBE_STAGE


def is_candidate(record: TrialRecord) -> bool:
    """Whether the record is a candidate: a complete trial within the tolerance that
    quantizes something and is no probe (the trial and the recorder decide it).

    Example:
        >>> is_candidate(TrialRecord(status="ok", is_candidate=True))
        True
        >>> is_candidate(TrialRecord(status="failed", is_candidate=True))
        False
    """
    return record.ok and record.is_candidate


def better(
    record: TrialRecord,
    than: TrialRecord | None,
    higher_is_better: bool,
    select: str = "metric",
) -> bool:
    """Whether ``record`` (a complete trial) beats ``than``.

    A setting that quantizes something beats one that quantizes nothing, then a candidate
    beats a non-candidate. Among candidates the faster model wins (the tolerance says what is
    good enough): with ``select`` other than ``metric`` the lower figure it names, then the
    larger ``extra.quantized_share``, then fewer ``extra.promoted`` tensors, then the better
    metric. Otherwise the better metric, fewer promoted on a tie. A trial whose model was
    lost, a reused result, a probe or one stopped at a rung beats none.

    Example:
        >>> a = TrialRecord(status="ok", metric=0.99, is_candidate=True,
        ...                 extra={"promoted": 2, "quantized_share": 0.5})
        >>> b = TrialRecord(status="ok", metric=0.98, is_candidate=True,
        ...                 extra={"promoted": 0, "quantized_share": 1.0})
        >>> better(b, a, True), better(a, b, True)
        (True, False)
        >>> c = TrialRecord(status="ok", metric=0.9, extra={"promoted": 0})
        >>> d = TrialRecord(status="ok", metric=0.9, extra={"promoted": 3})
        >>> better(c, d, True), better(d, c, True)
        (True, False)
        >>> better(b.replace(model_lost="its node was lost"), None, True)
        False
        >>> better(c.replace(stopped_at_rung=0), None, True)
        False
        >>> better(c.replace(stage="sensitivity"), None, True)
        False
        >>> float_like = TrialRecord(status="ok", metric=1.0, extra={"quantizes_nothing": 1.0})
        >>> far = TrialRecord(status="ok", metric=0.9, extra={"quantized_share": 1.0})
        >>> better(far, float_like, True), better(float_like, far, True)
        (True, False)
        >>> better(float_like, None, True)   # the only kind there is
        True
        >>> better(a.replace(model_size_bytes=10), b.replace(model_size_bytes=20), True, "size")
        True
    """
    metric = finite(record.metric)
    if not record.ok or metric is None or record.model_lost:
        return False
    if record.reused_from or is_probe(record) or record.stopped_at_rung is not None:
        return False
    if than is None or finite(than.metric) is None:
        return True
    return next(
        (v for v, _ in _rules(record, than, higher_is_better, select) if v is not None), False
    )


def _rules(
    record: TrialRecord, than: TrialRecord, higher: bool, select: str
) -> Iterator[tuple[bool | None, str]]:
    """The rules of :func:`better` in turn: whether each ranks ``record`` above ``than`` (None:
    a tie) and its words."""

    def lower(mine: float | None, theirs: float | None) -> bool | None:
        return None if mine == theirs else theirs is None or (mine is not None and mine < theirs)

    nothing = unquantized(record)
    yield (
        None if nothing == unquantized(than) else not nothing,
        "a setting that quantizes something ranks above one that quantizes nothing",
    )
    candidate = is_candidate(record)
    yield (
        None if candidate == is_candidate(than) else candidate,
        "a candidate (within the tolerance) ranks above a trial that is not one",
    )
    fewer = lower(promoted(record), promoted(than))
    if candidate:
        if select != "metric":
            key = _SELECT_KEY[select]
            mine, theirs = finite(getattr(record, key)), finite(getattr(than, key))
            yield (
                lower(mine, theirs),
                f"select: {select}: among candidates the lower {key} ranks first",
            )
        share, other = _extra(record, "quantized_share"), _extra(than, "quantized_share")
        yield (
            None if share is None or other is None or share == other else share > other,
            "among candidates the larger share of MatMul/Gemm/Conv nodes quantized ranks first",
        )
        yield fewer, "among candidates fewer tensors promoted to a higher precision rank first"
    sign = -1.0 if higher else 1.0  # the metric to minimise
    mine, theirs = finite(record.metric), finite(than.metric)
    yield (
        lower(None if mine is None else sign * mine, None if theirs is None else sign * theirs),
        "the better metric ranks first",
    )
    yield fewer, "fewer tensors promoted to a higher precision rank first"


def deciding_rule(
    record: TrialRecord,
    than: TrialRecord,
    higher_is_better: bool,
    select: str = "metric",
) -> str:
    """In words, the rule of :func:`better` that ranks ``record`` above ``than``.

    Example:
        >>> a = TrialRecord(status="ok", metric=0.9, is_candidate=True)
        >>> deciding_rule(a, a.replace(), True)
        'every rule of the ranking ties (candidates first, then the larger share of MatMul/Gemm/Conv nodes quantized, then fewer tensors promoted, then the better metric), so the trial that started first is kept'
        >>> deciding_rule(a.replace(extra={"quantized_share": 1.0}),
        ...               a.replace(extra={"quantized_share": 0.5}), True)
        'among candidates the larger share of MatMul/Gemm/Conv nodes quantized ranks first'
    """  # noqa: E501
    words = (w for v, w in _rules(record, than, higher_is_better, select) if v is not None)
    return next(
        words,
        "every rule of the ranking ties (candidates first, then the larger share of "
        "MatMul/Gemm/Conv nodes quantized, then fewer tensors promoted, then the better "
        "metric), so the trial that started first is kept",
    )


def best_record(
    records: Sequence[TrialRecord], higher_is_better: bool, select: str = "metric"
) -> TrialRecord | None:
    """The best complete trial by :func:`better` (the earliest one on a tie), or None."""
    best = None
    for record in order(records):
        if better(record, best, higher_is_better, select):
            best = record
    return best


def best_records(
    records: Sequence[TrialRecord], n: int, higher_is_better: bool, select: str = "metric"
) -> list[TrialRecord]:
    """The ``n`` best complete trials, best first (fewer when fewer are complete).

    Example:
        >>> rows = [TrialRecord(trial_id=t, number=i, status="ok", metric=m)
        ...         for i, (t, m) in enumerate([("a", 0.1), ("b", 0.3), ("c", 0.2)])]
        >>> [r.trial_id for r in best_records(rows, 2, higher_is_better=True)]
        ['b', 'c']
    """
    rest, top = list(records), []
    while len(top) < n:
        best = best_record(rest, higher_is_better, select)
        if best is None:
            break
        top.append(best)
        rest = [r for r in rest if r is not best]
    return top


def objective_values(
    record: TrialRecord, objectives: Sequence[str], higher_is_better: bool
) -> tuple[float, ...]:
    """The record's value of each of ``objectives``, to minimise; a missing one is ``inf``.

    Example:
        >>> objective_values(TrialRecord(metric=0.9, model_size_bytes=2_000_000),
        ...                  ["metric", "latency_ms", "model_size_mb"], True)
        (-0.9, inf, 2.0)
    """
    values = []
    for name in objectives:
        value = objective_value(record, name)
        if name == "metric" and value is not None and higher_is_better:
            value = -value
        values.append(math.inf if value is None else value)
    return tuple(values)


def objective_value(record: TrialRecord, name: str) -> float | None:
    """The record's value of objective ``name`` as measured; None when it has none.

    Example:
        >>> objective_value(TrialRecord(model_size_bytes=2_000_000), "model_size_mb")
        2.0
    """
    if name == "model_size_mb":
        size = finite(record.model_size_bytes)
        return None if size is None else size / 1e6
    return finite(getattr(record, name))


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether values ``a`` dominate ``b`` (to minimise): no worse on any, better on one.

    Example:
        >>> dominates((1, 2), (1, 3)), dominates((1, 3), (1, 2)), dominates((1, 2), (1, 2))
        (True, False, False)
        >>> dominates((0, 5), (1, 2)), dominates((1, 2), (0, 5))
        (False, False)
    """
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def pareto_front(
    records: Sequence[TrialRecord], objectives: Sequence[str], higher_is_better: bool
) -> list[TrialRecord]:
    """The candidates no other candidate dominates on ``objectives``, in start order.

    Example:
        >>> rows = [TrialRecord(trial_id=t, number=i, status="ok", is_candidate=True,
        ...                     metric=m, model_size_bytes=s)
        ...         for i, (t, m, s) in enumerate([("a", .9, 4), ("b", .8, 2), ("c", .7, 3)])]
        >>> [r.trial_id for r in pareto_front(rows, ["metric", "model_size_mb"], True)]
        ['a', 'b']
    """
    candidates = [r for r in order(records) if is_candidate(r)]
    values = [objective_values(r, objectives, higher_is_better) for r in candidates]
    return [
        record
        for record, mine in zip(candidates, values)
        if not any(dominates(other, mine) for other in values)
    ]


def stopped_at_rung(record: TrialRecord) -> int | None:
    """The rung ASHA stopped an ok trial at; None when it ran every rung.

    Example:
        >>> stopped_at_rung(TrialRecord(status="ok", rung=0, rungs=3))
        0
    """
    return record.rung if record.ok and record.rung < record.rungs - 1 else None
