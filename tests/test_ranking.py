"""raysearch.ranking: a setting that quantizes nothing is never a candidate, nor the best while a
setting that quantizes something completed."""

from __future__ import annotations

from raysearch.ranking import best_record, better, is_candidate, unquantized
from raysearch.trialrecord import TrialRecord


def trial(
    i: int, metric: float | None, candidate: bool, share: float | None, **extra
) -> TrialRecord:
    if share is not None:
        extra["quantized_share"] = share
    if share == 0:  # as a trial records it (decide_complete): within the tolerance or not
        extra.update(quantizes_nothing=1.0, within_tolerance=float(candidate))
        candidate = False
    return TrialRecord(
        trial_id=f"t{i}",
        number=i,
        status="ok" if metric is not None else "failed",
        metric=metric,
        is_candidate=candidate,
        extra=extra,
    )


def test_a_setting_that_quantizes_nothing_is_no_candidate():
    flagged = trial(1, 1.0, True, 0.0)
    assert unquantized(flagged) and not is_candidate(flagged)
    # A model without MatMul/Gemm/Conv has no share.
    no_weighted = trial(3, 0.99, True, None)
    assert not unquantized(no_weighted) and is_candidate(no_weighted)
    assert not is_candidate(no_weighted.replace(status="failed"))


def test_best_never_picks_a_setting_that_quantizes_nothing_while_another_completed():
    # magika on a GPU: the float model with extra nodes met the tolerance, a fully quantized
    # setting scored 0.996 and did not; neither is a candidate.
    float_like = trial(1, 1.0, True, 0.0)  # within the tolerance, but it quantizes nothing
    quantized = trial(2, 0.996, False, 1.0)
    half = trial(3, 0.99, False, 0.5)
    assert best_record([float_like, quantized, half], higher_is_better=True) is quantized
    assert better(half, float_like, True) and not better(float_like, half, True)
    # Lower-is-better metrics alike.
    l2 = [trial(4, 0.0, False, 0.0), trial(5, 0.3, False, 1.0)]
    assert best_record(l2, higher_is_better=False).trial_id == "t5"
    # A failed or partly evaluated quantized trial does not count: the only kind there is wins.
    failed = trial(6, None, False, 1.0)
    stopped = trial(7, 0.999, False, 1.0).replace(stopped_at_rung=0)
    lost = trial(8, 0.999, False, 1.0).replace(model_lost="its node was lost")
    assert best_record([float_like, failed, stopped, lost], True) is float_like
    # A candidate that quantizes something still wins on its own rule.
    candidate = trial(9, 0.9991, True, 0.75)
    assert best_record([float_like, quantized, candidate], higher_is_better=True) is candidate
