"""The ``Fallback`` and ``Conservative`` strategies: the bisection and the phases in pure Python
(a fake trial runner drives the real searcher), and real searches on the outlier model (one
tensor, h4, loses the accuracy when quantized per tensor)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raysearch.search.tune.searchers import SettingSearcher
from raysearch.space import SearchSpace
from raysearch.strategies import ModelFacts, StrategyContext, canonical_strategy
from raysearch.strategies._conservative import op_order
from raysearch.strategies._fallback import ALL, DONE, Bisection, search_budget
from raysearch.strategies._setting_phase import setting_proposal, setting_space
from raysearch.trialrecord import TrialRecord
from tests.conftest import TWO_AT_A_TIME
from tests.models import make_outlier_model, outlier_data

OUTLIER_SPACE = {"op_types_to_quantize": [["MatMul"]], "per_channel": [False]}
RANKED = 9  # tensors the outlier model's SQNR ranking holds


# -- the bisection, alone -------------------------------------------------------------------------
def _bisect(
    n: int, smallest: int | None, slots: int, parallel: int = 2, *, newest_first: bool = False
) -> tuple[int | None, list[int]]:
    """Run :class:`Bisection` against "k is a candidate iff k >= smallest" with ``slots``
    trials at once, finishing the oldest running trial first (``newest_first``: the one
    started last); the found k and the ks tried.
    Rounds hold at most ``slots`` ks, as :class:`FallbackPhase` caps them by the trials that
    run at once."""
    b = Bisection(min(parallel, slots))
    running: list[int] = []
    tried: list[int] = []
    while True:
        while len(running) < slots:
            step = b.next(set(running))
            if step is None or step == DONE:
                break
            running.append(step)
            tried.append(step)
        if not running:
            assert b.next(set()) == DONE
            return b.found, tried
        k = running.pop(-1 if newest_first else 0)
        ok = smallest is not None and min(k, n) >= smallest
        b.record(k, ok, ranked=n if k == ALL else None)


@pytest.mark.parametrize("n", [1, 2, 5, 9, 16, 100, 1000])
def test_the_bisection_finds_the_smallest_k_within_log2_n_plus_2_trials(n):
    for smallest in range(1, n + 1):
        found, tried = _bisect(n, smallest, slots=1)
        assert found == smallest
        assert len(tried) <= math.ceil(math.log2(n)) + 2, (smallest, tried)
        assert len(tried) == len(set(tried))


@pytest.mark.parametrize("slots", [2, 3, 4])
@pytest.mark.parametrize("parallel", [1, 2, 3])
def test_concurrent_proposals_split_the_interval_and_still_find_the_smallest_k(slots, parallel):
    for n in (9, 37):
        for smallest in range(1, n + 1):
            found, tried = _bisect(n, smallest, slots, parallel)
            assert found == smallest and len(tried) == len(set(tried))
            assert tried[0] == ALL  # the first trial tells n, alone
    # With 3 at once over (0, 9): 4, then the widest gaps' middles.
    b = Bisection(parallel=3)
    b.record(ALL, True, ranked=9)
    assert [b.next(set()), b.next({4}), b.next({4, 6}), b.next({2, 4, 6})] == [4, 6, 2, None]
    b.record(4, True)  # 6 is outside the bounds now, but the next round waits for it
    assert b.next({2, 6}) is None
    b.record(6, True)
    b.record(2, False)
    assert b.next(set()) == 3 and b.next({3}) is None  # (2, 4): one k left


def test_two_at_once_on_nine_ranked_tensors_stays_within_the_bound():
    for smallest in range(1, 10):
        found, tried = _bisect(9, smallest, slots=4)
        assert found == smallest and len(tried) <= math.ceil(math.log2(9)) + 2


def test_the_bisection_is_deterministic_and_stops_when_nothing_reaches_the_tolerance():
    assert _bisect(9, 3, 2) == _bisect(9, 3, 2)
    found, tried = _bisect(9, None, 3)
    assert found is None and tried == [ALL]
    b = Bisection()
    assert b.next({ALL}) is None  # waits for the first trial
    b.record(ALL, True)  # no ``ranked``: all promoted is the answer
    assert b.next(set()) == DONE and b.found == ALL


@pytest.mark.parametrize("slots", [2, 3])
def test_the_ks_tried_do_not_depend_on_the_order_concurrent_trials_finish_in(slots):
    # The oldest or the newest running trial finishing first: the same ks, the same answer
    # (a round starts once the one before finished, whichever of its ks finished first).
    for n in (6, 9, 37):
        for smallest in [None, *range(1, n + 1)]:
            found, oldest = _bisect(n, smallest, slots)
            again, newest = _bisect(n, smallest, slots, newest_first=True)
            assert found == again == smallest
            assert sorted(oldest) == sorted(newest), (n, smallest, oldest, newest)


def test_a_bisection_rebuilt_half_way_through_a_round_tries_the_same_ks():
    # A resumed search replays the records into a fresh bisection: with one k of a round
    # finished and the other lost, it runs the lost one, not a new round from half of one.
    b = Bisection()
    b.record(ALL, True, ranked=9)
    assert [b.next(set()), b.next({4})] == [4, 6]
    rebuilt = Bisection()
    rebuilt.record(ALL, True, ranked=9)
    rebuilt.record(4, False)
    assert rebuilt.next(set()) == 6 and rebuilt.next({6}) is None
    # Results known before the first round (an earlier phase's trials) are its start.
    given = Bisection()
    given.record(ALL, True, ranked=9)
    given.record(6, True, given=True)
    assert [given.next(set()), given.next({3})] == [3, 1]


def test_results_arriving_in_any_order_give_the_same_answer():
    b = Bisection()
    for k, ok in [(2, False), (6, True), (3, True)]:
        b.record(k, ok)
    assert b.next(set()) == ALL  # n unknown yet
    b.record(ALL, True, ranked=9)
    assert b.bounds() == (2, 3) and b.found == 3


# -- small helpers --------------------------------------------------------------------------------
def test_a_setting_outside_the_users_space_is_one_validated_point():
    settings = {
        "op_types_to_quantize": ["MatMul"],
        "extra_options": {"ActivationSymmetric": True},
        "mixed_precision": {"top_k": 3, "promote_to": "float", "rank_by": "sqnr", "rank_2": "int8"},
    }
    proposal = setting_proposal(settings, 5)
    assert proposal.settings == settings and proposal.phase == 5
    assert setting_space(settings).grid_size() == 1
    with pytest.raises(Exception, match="rank_2"):
        setting_space({"mixed_precision": {"rank_2": "int4"}})


def test_names_budget_and_op_order():
    assert canonical_strategy("mse_v2") == "Fallback"
    assert canonical_strategy("conservative") == "Conservative"
    assert [search_budget(m) for m in (None, 0, 1, 3, 10)] == [8, 8, 1, 1, 5]
    assert op_order(["Relu", "Add", "MatMul", "Conv", "Gemm"]) == [
        "MatMul",
        "Gemm",
        "Conv",
        "Relu",
        "Add",
    ]


# -- the phases, driven by a fake trial runner ----------------------------------------------------
def _outlier_outcome(settings: dict[str, Any]) -> dict[str, Any]:
    """What the outlier model reports, roughly: only promoting h4 (rank 1) holds cos 0.995."""
    options = settings.get("mixed_precision") or {}
    k = min(int(options.get("top_k", 0)), RANKED)
    ranks = [r for r in range(1, k + 1) if options.get(f"rank_{r}") != "int8"]
    metric = 0.9986 if 1 in ranks else 0.25
    candidate = metric >= 0.995
    return {
        "metric": metric,
        "is_candidate": candidate,
        "extra": {"promoted": len(ranks), "ranked": RANKED},
    }


def _drive(
    searcher: SettingSearcher,
    outcome: Any,
    slots: int,
    *,
    stop_after: int | None = None,
    running: list[tuple[str, dict[str, Any]]] | None = None,
    newest_first: bool = False,
) -> list[TrialRecord]:
    """Run ``searcher`` like Tune: up to ``slots`` trials at once, the oldest finishing first
    (``newest_first``: the one started last; ``running``: trials started before, still
    running; left there at ``stop_after``).
    Returns the record of each finished trial (its config and result)."""
    running = [] if running is None else running
    finished: list[TrialRecord] = []
    # Trial ids never repeat, also across a save and restore (running trials keep theirs).
    number = max([len(searcher.context.records) + 100, *(int(t[1:]) for t, _ in running)])
    while True:
        while len(running) < slots:
            number += 1
            config = searcher.suggest(f"t{number}")
            if not isinstance(config, dict):
                break
            running.append((f"t{number}", config))
        if not running or (stop_after is not None and len(finished) >= stop_after):
            return finished
        trial_id, config = running.pop(-1 if newest_first else 0)
        result = outcome(config["settings"])
        # A trial's record says it ended ok (what a candidate needs, ranking.is_candidate).
        trial = {"status": "ok", **result}
        objective = {"objective": result["metric"]}  # the sampler is told the metric itself
        searcher.on_trial_complete(trial_id, {**result, **objective, "trial": trial})
        finished.append(
            TrialRecord.from_dict({"trial_id": trial_id, **config, **result, **objective})
        )


def _context(space: dict[str, Any], **overrides: Any) -> StrategyContext:
    facts = ModelFacts(op_types=tuple(overrides.pop("op_types", ("MatMul",))))
    return StrategyContext([SearchSpace.parse(space)], mode="max", seed=0, model=facts, **overrides)


def _fallback_trials(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t for t in trials if t.phase == 1]


@pytest.mark.parametrize("slots", [1, 2, 3])
def test_fallback_phases_find_k_1_on_the_outlier_outcomes(slots):
    searcher = SettingSearcher.from_strategy("Fallback", _context(OUTLIER_SPACE))
    trials = _drive(searcher, _outlier_outcome, slots)
    assert trials[0].phase == 0 and "mixed_precision" not in trials[0].settings
    fallback = _fallback_trials(trials)
    assert fallback[0].settings["mixed_precision"]["top_k"] == ALL
    assert len(fallback) <= math.ceil(math.log2(RANKED)) + 2
    phase = searcher.phases[1]
    assert phase.found == 1
    assert {t.phase for t in trials} <= {0, 1}  # k = 1: no revert pass
    assert len({t.key for t in trials}) == len(trials)


def _two_needed(settings: dict[str, Any]) -> dict[str, Any]:
    """Ranks 1 and 3 must be promoted; rank 2 and 4 may go back to int8."""
    options = settings.get("mixed_precision") or {}
    k = min(int(options.get("top_k", 0)), RANKED)
    ranks = {r for r in range(1, k + 1) if options.get(f"rank_{r}") != "int8"}
    ok = {1, 3} <= ranks
    metric = 0.999 - 0.0001 * len(ranks) if ok else 0.5
    return {
        "metric": metric,
        "is_candidate": ok,
        "extra": {"promoted": len(ranks), "ranked": RANKED},
    }


def test_the_revert_pass_demotes_each_rank_then_combines_those_that_held():
    searcher = SettingSearcher.from_strategy("Fallback", _context(OUTLIER_SPACE))
    trials = _drive(searcher, _two_needed, 2)
    assert searcher.phases[1].found == 3
    revert = [t.settings["mixed_precision"] for t in trials if t.phase == 2]
    demoted = [sorted(k for k in m if k[5:].isdigit()) for m in revert]
    assert demoted == [["rank_1"], ["rank_2"], ["rank_3"]]  # only rank 2 held: no combination
    assert searcher.phases[2].chosen == frozenset({2})


def test_the_revert_pass_combines_two_demotions_that_held():
    def outcome(settings: dict[str, Any]) -> dict[str, Any]:
        options = settings.get("mixed_precision") or {}
        k = min(int(options.get("top_k", 0)), RANKED)
        ranks = {r for r in range(1, k + 1) if options.get(f"rank_{r}") != "int8"}
        ok = k >= 4 and 1 in ranks
        return {"metric": 0.999 if ok else 0.5, "is_candidate": ok, "extra": {"ranked": RANKED}}

    searcher = SettingSearcher.from_strategy("Fallback", _context(OUTLIER_SPACE))
    trials = _drive(searcher, outcome, 3)
    assert searcher.phases[1].found == 4
    last = trials[-1].settings["mixed_precision"]
    assert trials[-1].phase == 2
    assert {k for k in last if k[5:].isdigit()} == {"rank_2", "rank_3", "rank_4"}
    assert searcher.phases[2].chosen == frozenset({2, 3, 4})


@pytest.mark.parametrize("cut", [1, 2, 3, 5])
def test_a_resumed_fallback_search_runs_exactly_the_remaining_settings(cut):
    def fresh() -> SettingSearcher:
        return SettingSearcher.from_strategy("Fallback", _context(OUTLIER_SPACE))

    straight = _drive(fresh(), _two_needed, 1)
    assert len(straight) > cut
    # A new searcher (a resume without Tune's state) told the first ``cut`` records.
    before = [t.replace(status="ok") for t in straight[:cut]]
    resumed = fresh()
    resumed.add_finished(before)
    rest = _drive(resumed, _two_needed, 1)
    assert [t.key for t in before + rest] == [t.key for t in straight]


@pytest.mark.parametrize("cut", [2, 4, 6])
def test_a_fallback_search_cut_with_trials_running_resumes_from_its_journal(cut):
    """Stopped with trials in flight (lost, as when the driver is killed): a fresh searcher
    told the finished records only runs the same settings, and decides the same."""

    def fresh() -> SettingSearcher:
        return SettingSearcher.from_strategy("Fallback", _context(OUTLIER_SPACE))

    straight = [t.key for t in _drive(fresh(), _two_needed, 2)]
    running: list[tuple[str, dict[str, Any]]] = []
    before = _drive(fresh(), _two_needed, 2, stop_after=cut, running=running)
    assert running  # stopped with trials in flight
    resumed = fresh()
    resumed.add_finished([t.replace(status="ok") for t in before])
    rest = _drive(resumed, _two_needed, 2)
    assert sorted(t.key for t in before + rest) == sorted(straight)
    assert resumed.phases[1].found == 3 and resumed.phases[2].chosen == frozenset({2})


def test_conservative_keeps_the_op_types_that_hold_the_tolerance():
    space = {"per_channel": [False, True], "calibrate_method": ["MinMax"]}
    context = _context(space, op_types=("Conv", "Relu", "Add", "MatMul", "Mul"))

    def outcome(settings: dict[str, Any]) -> dict[str, Any]:
        ok = "Add" not in settings["op_types_to_quantize"]
        return {"metric": 0.999 if ok else 0.5, "is_candidate": ok, "extra": {}}

    searcher = SettingSearcher.from_strategy("Conservative", context)
    trials = _drive(searcher, outcome, 2)
    ops = [t.settings["op_types_to_quantize"] for t in trials]
    assert ops == [
        ["MatMul"],
        ["MatMul", "Conv"],
        ["MatMul", "Conv", "Relu"],
        ["MatMul", "Conv", "Relu", "Add"],
        ["MatMul", "Conv", "Relu", "Mul"],
    ]
    assert all(t.settings["per_channel"] is False for t in trials)  # the first grid point
    assert searcher.phases[0].accepted == ["MatMul", "Conv", "Relu", "Mul"]
    assert searcher.suggest("again") == "FINISHED"


# -- real searches --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def outlier_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("outlier")
    model = make_outlier_model(folder / "outlier.onnx")
    data = folder / "calib.npz"
    np.savez(data, **outlier_data(64))
    return {"model": model, "data": data}


def _outlier_config(make_config, outlier_files, **overrides: Any) -> dict[str, Any]:
    return make_config(
        model=str(outlier_files["model"]),
        calibration_data=str(outlier_files["data"]),
        search_space=OUTLIER_SPACE,
        metric="cos",
        tolerance=0.995,
        measure_latency=False,
        resources=TWO_AT_A_TIME,
        **overrides,
    )


def _journal(out: Path) -> list[TrialRecord]:
    from raysearch.search.record.journal import Journal

    return Journal(out / "journal.jsonl").load()


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_fallback_finds_the_outlier_tensor_on_the_real_model(make_config, outlier_files):
    from raysearch.search import AutoSearch

    result = AutoSearch(_outlier_config(make_config, outlier_files, search_algo="Fallback")).run()
    records = _journal(result.output_dir)
    assert all(r.status == "ok" for r in records)
    assert len({r.key for r in records}) == len(records)
    (base,) = [r for r in records if r.phase == 0]
    assert not base.is_candidate and base.metric < 0.5
    # Alone at first: the searcher opened the start barrier; the actor was not held until
    # the barrier's timeout for a second one that Tune never starts.
    assert base.actor_wait_timed_out is False
    fallback = [r for r in records if r.phase == 1]
    first = min(fallback, key=lambda r: r.number)
    assert first.settings["mixed_precision"]["top_k"] == ALL
    n = int(first.extra["ranked"])
    assert n == RANKED
    assert len(fallback) <= math.ceil(math.log2(n)) + 2
    smallest = min(
        (r for r in fallback if r.is_candidate),
        key=lambda r: r.settings["mixed_precision"]["top_k"],
    )
    assert smallest.settings["mixed_precision"] == {
        "top_k": 1,
        "promote_to": "float",
        "rank_by": "sqnr",
    }
    assert smallest.extra["promoted"] == 1 and smallest.metric > 0.995
    assert not [r for r in records if r.phase == 2]  # k = 1: no revert pass


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_conservative_leaves_the_outlier_matmuls_in_float(make_config, outlier_files):
    from raysearch.search import AutoSearch

    config = _outlier_config(make_config, outlier_files, search_algo="Conservative")
    result = AutoSearch(config).run()
    records = _journal(result.output_dir)
    assert [r.settings["op_types_to_quantize"] for r in records] == [["MatMul"]]
    assert not records[0].is_candidate
    # One trial at a time: the searcher opened the start barrier, and the one actor did not
    # wait out its timeout for a second one that Tune never starts.
    assert records[0].actor_wait_timed_out is False


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_conservative_on_the_mlp_keeps_what_holds_the_tolerance(make_config):
    from raysearch.search import AutoSearch

    config = make_config(
        search_algo="Conservative", metric="cos", tolerance=0.999, measure_latency=False
    )
    records = _journal(AutoSearch(config).run().output_dir)
    accepted: list[str] = []
    for record in sorted(records, key=lambda r: r.number):
        ops = record.settings["op_types_to_quantize"]
        assert ops[:-1] == accepted
        if record.is_candidate:
            accepted = ops
    assert records and records[0].settings["op_types_to_quantize"] == ["MatMul"]
