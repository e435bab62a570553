"""Decisions a strategy makes from finished trials do not depend on the order in which
concurrent trials finished (the order of ``context.records``): of equal records, the one
started first (``number``) is chosen, whichever finished first. (Fallback's and Auto's
bisections: tests/search/test_fallback.py and test_staged_strategies.py.)"""

from __future__ import annotations

from typing import Any

from raysearch.strategies._auto import fully_quantized_candidate
from raysearch.strategies._weight_only import base_record, ranking
from raysearch.trialrecord import TrialRecord


def _row(number: int, stage: str, metric: float, settings: dict[str, Any]) -> TrialRecord:
    return TrialRecord(
        trial_id=f"t{number}",
        number=number,
        stage=stage,
        status="ok",
        metric=metric,
        model_size_bytes=1000,
        settings=settings,
    )


def test_the_weight_only_base_of_equal_settings_is_the_one_started_first():
    first = _row(1, "defaults", 0.5, {"bits": 4, "block_size": 128})
    second = _row(2, "blocks", 0.5, {"bits": 4, "block_size": 32})
    for records in ([first, second], [second, first]):
        assert base_record(records, higher_is_better=False).trial_id == "t1"


def test_the_weight_only_ranking_of_equally_sensitive_nodes_is_in_start_order():
    base = {"bits": 4, "block_size": 128}
    nodes = ["a", "b", "c"]
    probes = [
        _row(i + 1, "sensitivity", metric, {**base, "nodes_4bit": [node]})
        for i, (node, metric) in enumerate(zip(nodes, [0.2, 0.2, 0.1], strict=True))
    ]
    expected = [("a", 0.2), ("b", 0.2), ("c", 0.1)]
    for records in (probes, probes[::-1], [probes[1], probes[2], probes[0]]):
        assert ranking(records, base, higher_is_better=False) == expected


def test_auto_names_the_fully_quantized_candidate_started_first():
    # The candidate that skips Auto's later stages, named in the log.
    rows = [
        _row(n, "calibration", 0.99, {"per_channel": n == 1}).replace(is_candidate=True)
        for n in (1, 2)
    ]
    for records in (rows, rows[::-1]):
        assert fully_quantized_candidate(records).trial_id == "t1"


def test_a_resumed_search_gives_a_lost_trial_back_its_number():
    # Trial 3 was running when the search was killed (not journaled), trial 4 finished: the
    # resumed search runs trial 3's setting again as number 3, so that of two settings with
    # the same metric the one started first is still the best, as straight through.
    from raysearch.ranking import best_record
    from raysearch.search.tune.searchers import SettingSearcher
    from raysearch.space import SearchSpace

    def searcher() -> SettingSearcher:
        space = SearchSpace.parse({"per_channel": [True, False], "reduce_range": [False, True]})
        return SettingSearcher.strategy("Grid", [space], mode="max")

    straight = searcher()
    configs = [straight.suggest(f"a{i}") for i in range(4)]
    assert [c["number"] for c in configs] == [1, 2, 3, 4]
    metrics = [0.1, 0.2, 0.5, 0.5]  # 3 and 4 tie: 3, started first, is the best
    journal = [
        TrialRecord.from_dict({**c, "trial_id": f"a{i}", "status": "ok", "metric": metrics[i]})
        for i, c in enumerate(configs)
        if i != 2
    ]
    resumed = searcher()
    resumed.add_finished(journal)
    again = resumed.suggest("b0")
    assert (again["key"], again["number"]) == (configs[2]["key"], 3)
    rerun = TrialRecord.from_dict({**again, "trial_id": "b0", "status": "ok", "metric": 0.5})
    assert best_record([*journal, rerun], True).key == configs[2]["key"]
    assert resumed.suggest("b1") == "FINISHED"
