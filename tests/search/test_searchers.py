"""SettingSearcher without a cluster: grid order and caps, samplers on a conditional space,
no repeated setting, journal records, no saved copy for Tune, missing sampler packages."""

from __future__ import annotations

import importlib.util

import pytest
from ray.tune.search import ConcurrencyLimiter, Searcher

from raysearch.errors import ConfigError
from raysearch.search.record.reported import pack_record
from raysearch.search.tune.searchers import SettingSearcher
from raysearch.space import SearchSpace, settings_key
from raysearch.strategies.samplers import (
    ALGO_REQUIREMENTS,
    SAMPLER_ALGOS,
    check_algo_available,
    make_sampler,
    quiet_optuna,
)
from raysearch.trialrecord import TrialRecord
from tests.search.conftest import CONDITIONAL_SPACE

SMALL = {"calibrate_method": ["MinMax", "Entropy"], "per_channel": [True, False]}


def available(algo: str) -> bool:
    return all(importlib.util.find_spec(m) for m in ALGO_REQUIREMENTS.get(algo, ()))


def objective(params: dict) -> float:
    """A deterministic stand-in score of a setting (the searcher only needs a number)."""
    score = 0.1 if params["calibrate_method"] == "MinMax" else 0.05
    score += 0.01 if params.get("per_channel") else 0.0
    score += (100 - params.get("extra_options.pct.CalibPercentile", 100)) / 100
    return score


def told(metric: float) -> dict:
    """A finished trial's result as Tune hands it, the sampler's objective its metric."""
    return {"metric": metric, "objective": metric}


def drive(searcher: SettingSearcher, n: int) -> list[dict]:
    """Suggest and complete one trial at a time until FINISHED or n trials."""
    configs = []
    for i in range(n):
        config = searcher.suggest(f"t{i}")
        if config == Searcher.FINISHED:
            break
        assert config is not None
        configs.append(config)
        searcher.on_trial_complete(f"t{i}", told(objective(config["params"])))
    return configs


def test_grid_runs_every_setting_of_every_space_once_in_order():
    a = SearchSpace.parse(SMALL, path="search_spaces[0]")
    b = SearchSpace.parse({"calibrate_method": ["MinMax", "Percentile"], "per_channel": [True]})
    searcher = SettingSearcher.strategy("Grid", [a, b], mode="min")
    configs = drive(searcher, 100)
    keys = [c["key"] for c in configs]
    assert len(keys) == len(set(keys)) == 5  # 4 + (MinMax, True already ran) + Percentile
    # Each space's settings in its order; the calibrations take turns across the spaces, so
    # Percentile (space 1) comes after the first MinMax and Entropy, not after every setting.
    assert [c["phase"] for c in configs] == [0, 0, 1, 0, 0]
    assert [c["number"] for c in configs] == [1, 2, 3, 4, 5]
    assert configs[2]["params"] == {"calibrate_method": "Percentile", "per_channel": True}
    assert searcher.finish_reason == "space_exhausted"


def test_a_grid_as_one_space_per_calibration_method_runs_in_the_one_spaces_order():
    # Issue 57: the same 12 settings as one space and as Quark's two spaces (a MinMax space,
    # a Percentile space). Taken space by space, the two-space form started every MinMax
    # setting first: the trials running at once waited on one calibration in turn.
    common = {"activation_type": ["QUInt8", "QInt8"], "per_channel": [True, False]}
    percentiles = {"CalibPercentile": [99.99, 99.999]}
    one = {
        "calibrate_method": ["MinMax", "Percentile"],
        "percentile": {"only_if": {"calibrate_method": "Percentile"}, "extra_options": percentiles},
        **common,
    }
    two = [
        {"calibrate_method": ["MinMax"], **common},
        {"calibrate_method": ["Percentile"], "extra_options": percentiles, **common},
    ]
    one_space = drive(SettingSearcher.strategy("Grid", [SearchSpace.parse(one)], mode="max"), 100)
    two_spaces = drive(
        SettingSearcher.strategy("Grid", [SearchSpace.parse(s) for s in two], mode="max"), 100
    )
    assert len(one_space) == 12
    assert [c["key"] for c in two_spaces] == [c["key"] for c in one_space]
    methods = [c["settings"]["calibrate_method"] for c in two_spaces]
    assert methods[:8] == ["MinMax", "Percentile"] * 4


def test_grid_config_holds_canonical_params_and_settings():
    space = SearchSpace.parse(
        {"calibrate_method": ["MinMax"], "extra_options": {"CalibPercentile": [99.9]}}
    )
    config = SettingSearcher.strategy("Grid", [space], mode="min").suggest("t0")
    assert config["params"] == {"calibrate_method": "MinMax"}  # percentile stripped by a rule
    assert config["settings"] == space.to_settings(config["point"])
    assert config["key"] == settings_key(config["settings"])


def test_iteration_limit_caps_starts_and_tunes_limiter_caps_the_queue():
    """The cap on trials suggested but unfinished is Tune's ``ConcurrencyLimiter``, as
    ``make_tuner`` puts it around the searcher; the searcher caps the trials started."""
    space = SearchSpace.parse(SMALL)
    searcher = SettingSearcher.strategy("Grid", [space], mode="min", max_trials=3)
    limited = ConcurrencyLimiter(searcher, max_concurrent=2)
    assert limited.suggest("a") and limited.suggest("b")
    assert limited.suggest("c") is None  # two suggested, none finished
    limited.on_trial_complete("a", told(1.0))
    assert limited.suggest("c")["number"] == 3
    limited.on_trial_complete("b", told(1.0))
    assert limited.suggest("d") == Searcher.FINISHED
    assert searcher.finish_reason == "iteration_limit" and searcher.n_started == 3


def test_a_tie_goes_to_the_trial_started_first_whatever_the_trial_ids():
    """Tune's trial ids are random hex: the strategy's best record must break a tie by start
    order, as the outputs' best_record does, or a phase refines around another trial than
    the one best/ holds (the two-phase plugin test failed so under load)."""
    searcher = SettingSearcher.strategy("Grid", [SearchSpace.parse(SMALL)], mode="min")
    first = searcher.suggest("ffff0001")
    second = searcher.suggest("00000002")
    searcher.on_trial_complete("00000002", told(0.5))
    searcher.on_trial_complete("ffff0001", told(0.5))
    assert [r.number for r in searcher.context.records] == [2, 1]
    best = searcher.context.best()
    assert best.trial_id == "ffff0001" and best.key == first["key"] != second["key"]


def test_journaled_trials_are_counted_and_never_suggested_again():
    space = SearchSpace.parse(SMALL)
    first = SettingSearcher.strategy("Grid", [space], mode="min")
    done = drive(first, 2)
    records = [
        TrialRecord(trial_id=f"old{i}", key=c["key"], phase=0, status="ok", metric=0.1)
        for i, c in enumerate(done)
    ]
    searcher = SettingSearcher.strategy("Grid", [space], mode="min", max_trials=3)
    assert searcher.add_finished(records) == 2
    assert searcher.add_finished(records) == 0  # the same ids again: nothing new
    rest = drive(searcher, 10)
    assert len(rest) == 1  # the limit of 3 counts the two journaled trials
    assert rest[0]["key"] not in {c["key"] for c in done}


@pytest.mark.parametrize("algo", SAMPLER_ALGOS)
def test_samplers_never_sample_an_inactive_group(algo):
    if not available(algo):
        pytest.skip(f"{algo} needs {ALGO_REQUIREMENTS[algo]}")
    space = SearchSpace.parse(CONDITIONAL_SPACE)
    with quiet_optuna():
        searcher = SettingSearcher.strategy(algo, [space], mode="min", seed=3, max_trials=12)
        configs = drive(searcher, 50)
    assert len(configs) == 12 and searcher.finish_reason == "iteration_limit"
    assert len({c["key"] for c in configs}) == 12
    for config in configs:
        point = config["point"]
        pct = "extra_options.pct.CalibPercentile"
        sym = "extra_options.sym.ActivationSymmetric"
        assert (pct in point) == (point["calibrate_method"] == "Percentile")
        assert (sym in point) == (point["activation_type"] == "QInt8")
        assert config["settings"] == space.to_settings(point)


def test_seed_gives_the_same_sequence_twice():
    space = SearchSpace.parse(CONDITIONAL_SPACE)
    runs = []
    for _ in range(2):
        with quiet_optuna():
            searcher = SettingSearcher.strategy("TPE", [space], mode="min", seed=7, max_trials=8)
            runs.append([c["key"] for c in drive(searcher, 20)])
    assert runs[0] == runs[1]


def test_a_sampler_on_a_finite_space_ends_when_every_setting_was_seen():
    space = SearchSpace.parse(SMALL)
    with quiet_optuna():
        searcher = SettingSearcher.strategy("Random", [space], mode="min", seed=0)
        configs = drive(searcher, 50)
    assert len(configs) == 4 and len({c["key"] for c in configs}) == 4
    assert searcher.finish_reason == "space_exhausted"


def test_several_spaces_split_the_iteration_limit_in_order():
    a = SearchSpace.parse(CONDITIONAL_SPACE, path="a")
    b = SearchSpace.parse({"calibrate_method": ["Entropy"], "per_channel": [True, False]}, path="b")
    with quiet_optuna():
        searcher = SettingSearcher.strategy("TPE", [a, b], mode="min", seed=0, max_trials=5)
        configs = drive(searcher, 20)
    assert [c["phase"] for c in configs] == [0, 0, 0, 1, 1]


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_make_tuner_keeps_at_most_max_outstanding_trials_suggested(tmp_path):
    """The Tuner ``make_tuner`` builds caps the trials suggested but unfinished at
    ``max_outstanding`` (Tune's ``ConcurrencyLimiter``): with 1, and room for two trials of
    half a CPU on the session's one CPU, the searcher is never asked for a trial while another
    runs."""
    from raysearch.config import SearchConfig
    from raysearch.search.tune._tuner import make_tuner

    def one_report(config: dict) -> None:  # local: pickled by value for the trial actor
        """Long enough that Tune would suggest the next trial meanwhile, were nothing to stop it."""
        import time

        from ray import tune

        time.sleep(0.5)
        tune.report({"metric": 1.0})

    class Watched(SettingSearcher):
        most_live = 0

        def suggest(self, trial_id: str):
            config = super().suggest(trial_id)
            self.most_live = max(self.most_live, len(self.live_keys))
            return config

    raw = {"model": "m.onnx", "calibration_data": "c.npz", "search_space": SMALL, "metric": "L2"}
    config = SearchConfig.from_dict({**raw, "output_dir": str(tmp_path)}, check_paths=False)
    searcher = Watched.strategy("Grid", [SearchSpace.parse({"per_channel": [True, False]})])
    from ray import tune

    half_cpu = tune.with_resources(one_report, {"cpu": 0.5})
    tuner = make_tuner(
        half_cpu, searcher, config, str(tmp_path), key="no-session", max_outstanding=1
    )
    assert not tuner.fit().errors
    assert searcher.finish_reason == "space_exhausted" and searcher.most_live == 1


def test_tune_saves_no_copy_of_the_searcher(tmp_path):
    """The journal is what a resume reads: Tune's periodic save of its searcher writes
    nothing, so no pickled searcher is left to read back."""
    space = SearchSpace.parse(CONDITIONAL_SPACE)
    with quiet_optuna():
        searcher = SettingSearcher.strategy("TPE", [space], mode="min", seed=1, max_trials=6)
        drive(searcher, 3)
        searcher.save_to_dir(str(tmp_path), session_str="now")
    assert list(tmp_path.iterdir()) == []


def test_sampler_factory_and_missing_packages(monkeypatch):
    assert type(make_sampler("NSGAII", seed=0)).__name__ == "NSGAIISampler"
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "cmaes" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"search_algo: CmaEs needs the package\(s\) cmaes"):
        check_algo_available("CmaEs")
    check_algo_available("TPE")


def test_samplers_optimise_the_objective_and_journaled_trials_tell_it():
    """A sampler is told a trial's ``objective`` (quantized candidates first), not its
    metric, a journaled record's too."""
    space = SearchSpace.parse(SMALL)
    with quiet_optuna():
        searcher = SettingSearcher.strategy("TPE", [space], mode="max", seed=0, max_trials=4)
        searcher.add_finished(
            [TrialRecord(trial_id="old", key="k-old", status="ok", metric=0.5, objective=0.25)]
        )
        assert searcher.objectives["k-old"] == 0.25
        config = searcher.suggest("t0")
        searcher.on_trial_complete("t0", {"metric": 1.0, "objective": 7.5})
    study = searcher.phases[0].optuna._ot_study
    assert [t.value for t in study.trials if t.value is not None] == [7.5]
    assert searcher.done[config["key"]] == 1.0
    assert searcher.objectives[config["key"]] == 7.5
    assert searcher.context.records[-1].objective == 7.5


@pytest.mark.parametrize("algo", ["NSGAII", "TPE", "Random", "QMC", "GPS"])
def test_several_objectives_make_a_multi_objective_study_told_each_value(algo):
    """With objectives [metric, latency_ms, model_size_mb] the sampler's study has three
    directions (the metric's, then both minimised) and is told each trial's objective,
    latency and size in MB, from the record Tune hands a searcher (JSON text), a flattened one
    and a journaled record; a trial missing one is told as failed."""
    if not available(algo):
        pytest.skip(f"{algo} needs {ALGO_REQUIREMENTS[algo]}")
    from optuna.study import StudyDirection
    from optuna.trial import TrialState

    from raysearch.strategies import StrategyContext

    names = ("metric", "latency_ms", "model_size_mb")
    context = StrategyContext(
        [SearchSpace.parse(SMALL)], mode="max", seed=0, max_trials=4, objectives=names
    )
    with quiet_optuna():
        searcher = SettingSearcher.from_strategy(algo, context)
        journaled = TrialRecord(trial_id="old", key="k-old", status="ok", metric=0.5, objective=0.5)
        searcher.add_finished([journaled.replace(latency_ms=4.0, model_size_bytes=2_000_000)])
        first, second = searcher.suggest("t0"), searcher.suggest("t1")
        # As Tune hands it (the record as JSON text), and one without a size (failed).
        record = pack_record(TrialRecord(latency_ms=2.0, model_size_bytes=3_000_000))
        searcher.on_trial_complete("t0", {"metric": 0.9, "objective": 1.5, "trial": record})
        no_size = {
            "metric": 0.9,
            "objective": 1.5,
            "trial": pack_record(TrialRecord(latency_ms=2.0)),
        }
        searcher.on_trial_complete("t1", no_size)  # no size: told as failed
    study = searcher.phases[0].optuna._ot_study
    assert study.directions == [
        StudyDirection.MAXIMIZE,
        StudyDirection.MINIMIZE,
        StudyDirection.MINIMIZE,
    ]
    finished = [t for t in study.trials if t.state != TrialState.RUNNING]
    assert [t.values for t in finished] == [[1.5, 2.0, 3.0], None]
    assert [t.state for t in finished] == [TrialState.COMPLETE, TrialState.FAIL]
    assert searcher.values == {
        "k-old": (0.5, 4.0, 2.0),
        first["key"]: (1.5, 2.0, 3.0),
        second["key"]: None,
    }


def test_one_objective_tells_the_sampler_no_values():
    space = SearchSpace.parse(SMALL)
    with quiet_optuna():
        searcher = SettingSearcher.strategy("NSGAII", [space], mode="min", seed=0, max_trials=2)
        searcher.suggest("t0")
        searcher.on_trial_complete(
            "t0", {**told(0.2), "trial": pack_record(TrialRecord(latency_ms=2.0))}
        )
    assert searcher.values == {}
    assert searcher.phases[0].optuna._ot_study.trials[0].values == [0.2]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tpe_stuck_on_known_settings_is_handed_unseen_ones_and_uses_its_budget(seed):
    # AUTO_INT8_SEARCH: many of TPE's proposals are one setting after the validity rules, or
    # refused, so TPE soon proposes only settings that ran; it used to end the phase after
    # 12-18 of its 30 trials, with 90 valid settings never tried.
    import zlib

    from raysearch.config._spaces import parse_spaces
    from raysearch.quantize.registry import backend_reject

    spaces = parse_spaces({"search_space": "AUTO_INT8_SEARCH"})
    with quiet_optuna():
        searcher = SettingSearcher.strategy(
            "TPE", spaces, mode="max", seed=seed, max_trials=30, reject=backend_reject
        )
        keys = []
        for i in range(100):
            config = searcher.suggest(f"t{i}")
            if config == Searcher.FINISHED:
                break
            keys.append(config["key"])
            score = (zlib.crc32(config["key"].encode()) % 1000) / 1000
            searcher.on_trial_complete(f"t{i}", told(score))
    assert len(keys) == len(set(keys)) == 30
    assert searcher.finish_reason == "iteration_limit"


@pytest.mark.parametrize(
    ("budget", "startup", "population"), [(None, 10, 50), (8, 3, 2), (30, 3, 7), (100, 10, 25)]
)
def test_make_sampler_fits_the_start_up_trials_and_population_to_the_budget(
    budget, startup, population
):
    tpe = make_sampler("TPE", seed=0, budget=budget)
    assert tpe._n_startup_trials == startup
    assert tpe._multivariate is True and tpe._group is False
    assert tpe._constant_liar is False  # one trial at a time: nothing runs while it is asked
    assert make_sampler("NSGAII", seed=0, budget=budget)._population_size == population
    assert make_sampler("CmaEs", seed=0, budget=budget)._n_startup_trials == 1  # Optuna's
    if available("GPS"):
        assert make_sampler("GPS", seed=0, budget=budget)._n_startup_trials == startup


def test_make_sampler_turns_the_constant_liar_on_for_concurrent_trials():
    assert make_sampler("TPE", seed=0, concurrent=1)._constant_liar is False
    assert make_sampler("TPE", seed=0, budget=30, concurrent=4)._constant_liar is True


def test_sampler_strategy_builds_each_phase_for_its_budget_and_the_concurrency():
    import dataclasses

    from raysearch.strategies._registry import StrategyContext
    from raysearch.strategies.samplers import sampler_strategy

    spaces = [SearchSpace.parse(SMALL, path="a"), SearchSpace.parse(CONDITIONAL_SPACE, path="b")]
    context = StrategyContext(spaces, mode="min", seed=0, max_trials=60)
    with quiet_optuna():
        phases = sampler_strategy("TPE", context)
        samplers = [phase.optuna._ot_study.sampler for phase in phases]
        assert [p.budget for p in phases] == [30, 30]
        assert [s._n_startup_trials for s in samplers] == [3, 3]
        assert not any(s._constant_liar for s in samplers)  # one trial at a time
        phases = sampler_strategy("TPE", dataclasses.replace(context, concurrent=4))
    assert all(phase.optuna._ot_study.sampler._constant_liar for phase in phases)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_concurrent_tpe_proposals_after_the_start_up_do_not_repeat_running_settings(seed):
    """Four trials suggested at once after the start-up trials: with the constant liar the
    sampler sees the running ones (RUNNING in the study) and proposes four distinct settings
    at the first ask each; without it, it keeps proposing running settings, which the phase
    answers as failed trials."""
    import optuna

    from raysearch.strategies.samplers import OptunaPhase

    space = SearchSpace.parse({**SMALL, "activation_type": ["QUInt8", "QInt8"]})

    def score(params: dict) -> float:
        return objective(params) + (0.02 if params["activation_type"] == "QInt8" else 0.0)

    def four_at_once(concurrent: int) -> tuple[list[str], optuna.Study]:
        with quiet_optuna():
            phase = OptunaPhase(space, 0, "TPE", seed, "min", None, 30, concurrent=concurrent)
            searcher = SettingSearcher([phase], mode="min", max_trials=30)
            assert phase.optuna._ot_study.sampler._n_startup_trials == 3
            for i in range(3):  # the start-up trials, one after another
                config = searcher.suggest(f"a{i}")
                searcher.on_trial_complete(f"a{i}", told(score(config["params"])))
            configs = [searcher.suggest(f"b{i}") for i in range(4)]
        return [c["key"] for c in configs], phase.optuna._ot_study

    keys, study = four_at_once(concurrent=4)
    states = [t.state for t in study.trials]
    assert len(set(keys)) == 4
    assert states.count(optuna.trial.TrialState.RUNNING) == 4
    assert optuna.trial.TrialState.FAIL not in states  # no proposal repeated a running one
    keys, study = four_at_once(concurrent=1)
    assert len(set(keys)) == 4  # the phase still runs each setting once ...
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert failed  # ... after answering the sampler's repeats of running settings


@pytest.mark.parametrize("cut", [5, 12, 20])
def test_a_tpe_search_resumed_from_its_journal_runs_the_same_remaining_settings(cut):
    """A fresh searcher told the journal's first ``cut`` trials re-proposes them (catching
    up) and then goes on exactly as the uninterrupted search: a re-proposed setting ends a run
    of repeats as the new proposal did, so an unseen setting is queued at the same moment."""
    import zlib

    from raysearch.config._spaces import parse_spaces
    from raysearch.quantize.registry import backend_reject

    def fresh() -> SettingSearcher:
        spaces = parse_spaces({"search_space": "AUTO_INT8_SEARCH"})
        return SettingSearcher.strategy(
            "TPE", spaces, mode="max", seed=1, max_trials=30, reject=backend_reject
        )

    def run(searcher: SettingSearcher, start: int = 0) -> list[TrialRecord]:
        records = []
        for i in range(start, 100):
            config = searcher.suggest(f"t{i}")
            if config == Searcher.FINISHED:
                break
            metric = (zlib.crc32(config["key"].encode()) % 1000) / 1000
            searcher.on_trial_complete(f"t{i}", told(metric))
            records.append(TrialRecord.from_dict({"trial_id": f"t{i}", **told(metric), **config}))
        return records

    with quiet_optuna():
        straight = run(fresh())
        resumed = fresh()
        resumed.add_finished(straight[:cut])
        rest = run(resumed, start=cut)
    assert [r.key for r in straight[:cut] + rest] == [r.key for r in straight]
