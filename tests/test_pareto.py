"""The Pareto front (ranking.dominates / pareto_front) against a brute-force filter on random
records, and selection of best/ by select (ranking.best_record)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from raysearch.ranking import best_record, dominates, objective_values, pareto_front
from raysearch.trialrecord import TrialRecord

OBJECTIVES = ["metric", "latency_ms", "model_size_mb"]


def _records(rng: random.Random, n: int) -> list[TrialRecord]:
    rows = []
    for i in range(n):
        status = "ok" if rng.random() > 0.1 else "failed"
        nothing = rng.random() < 0.1  # quantizes nothing: never a candidate (decide_complete)
        rows.append(
            TrialRecord(
                trial_id=f"t{i}",
                number=i,
                status=status,
                is_candidate=status == "ok" and not nothing and rng.random() > 0.3,
                # few distinct values: ties and equal rows happen
                metric=rng.choice([0.1, 0.2, 0.3, 0.4]) if status == "ok" else None,
                latency_ms=rng.choice([1.0, 2.0, 3.0, None]),
                model_size_bytes=rng.choice([1_000_000, 2_000_000, 3_000_000]),
                extra=(
                    {"quantized_share": 0.0, "quantizes_nothing": 1.0}
                    if nothing
                    else {"quantized_share": 1.0}
                ),
            )
        )
    return rows


def _brute(rows: list[TrialRecord], objectives: list[str], higher: bool) -> list[str]:
    sign = -1.0 if higher else 1.0

    def value(r: TrialRecord, name: str) -> float:
        if name == "metric":
            return sign * r.metric
        if name == "model_size_mb":
            return r.model_size_bytes / 1e6
        return math.inf if getattr(r, name) is None else getattr(r, name)

    pool = [r for r in rows if r.status == "ok" and r.is_candidate]
    front = []
    for c in pool:
        beaten = False
        for d in pool:
            no_worse = all(value(d, o) <= value(c, o) for o in objectives)
            if no_worse and any(value(d, o) < value(c, o) for o in objectives):
                beaten = True
        if not beaten:
            front.append(c.trial_id)
    return front


@pytest.mark.parametrize("seed", range(20))
def test_pareto_front_equals_a_brute_force_filter(seed):
    rng = random.Random(seed)
    rows = _records(rng, rng.randint(0, 40))
    for k in (2, 3):
        for objectives in itertools.combinations(OBJECTIVES, k):
            for higher in (True, False):
                got = [r.trial_id for r in pareto_front(rows, objectives, higher)]
                assert got == _brute(rows, list(objectives), higher)


def test_dominates_is_strict_and_never_mutual():
    rng = random.Random(0)
    for _ in range(500):
        a = tuple(rng.choice([0.0, 1.0, 2.0, math.inf]) for _ in range(3))
        b = tuple(rng.choice([0.0, 1.0, 2.0, math.inf]) for _ in range(3))
        assert not (dominates(a, b) and dominates(b, a))
        assert not dominates(a, a)
    values = objective_values(TrialRecord(metric=0.5), ["metric", "latency_ms"], False)
    assert values == (0.5, math.inf)


def _candidate(tid: str, metric: float, latency: float | None, size: int) -> TrialRecord:
    return TrialRecord(
        trial_id=tid,
        number=int(tid[1:]),
        status="ok",
        is_candidate=True,
        metric=metric,
        latency_ms=latency,
        model_size_bytes=size,
        extra={"quantized_share": 1.0},
    )


def test_select_picks_the_fastest_or_smallest_candidate_ties_by_the_metric():
    rows = [
        _candidate("t0", 0.10, 5.0, 300),
        _candidate("t1", 0.30, 1.0, 200),
        _candidate("t2", 0.20, 2.0, 100),
        _candidate("t3", 0.05, 1.0, 100),
        _candidate("t4", 0.01, 0.5, 50).replace(is_candidate=False),  # not a candidate
        _candidate("t5", 0.01, 0.1, 10).replace(status="failed"),
    ]
    pick = {s: best_record(rows, False, s).trial_id for s in ("metric", "latency", "size")}
    assert pick == {"metric": "t3", "latency": "t3", "size": "t3"}
    rows[3] = rows[3].replace(metric=0.5)  # now t1 ties t3 on latency, wins on the metric
    pick = {s: best_record(rows, False, s).trial_id for s in ("metric", "latency", "size")}
    assert pick == {"metric": "t0", "latency": "t1", "size": "t2"}
    # A candidate whose latency was not measured loses to one whose was.
    rows = [_candidate("t0", 0.1, None, 100), _candidate("t1", 0.2, 9.0, 100)]
    assert best_record(rows, False, "latency").trial_id == "t1"
    # Without a candidate the metric decides, as with select: metric.
    rows = [r.replace(is_candidate=False) for r in rows]
    assert best_record(rows, False, "latency").trial_id == "t0"
