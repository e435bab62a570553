"""The staged strategies (``Auto``, ``TwoStage``, ``FinetuneSearch``) and Neural Compressor's
names: the real searcher driven by a scripted model (each setting's outcome by rule), the
stages' order, their skipping rules, and resumes in every stage; then a real search whose
``results.parquet`` holds the stages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raysearch.config import ConfigError
from raysearch.search.tune.searchers import SettingSearcher
from raysearch.space import SearchSpace
from raysearch.space.tree import FloatRange, IntRange
from raysearch.strategies import ModelFacts, StrategyContext, canonical_strategy
from raysearch.strategies._fallback import ALL
from raysearch.strategies._finetune_search import ranged
from raysearch.strategies._roles import TECHNIQUE, role_deltas
from raysearch.strategies._two_stage import stage_two_space
from tests.search.test_fallback import _drive

RANKED = 6

SPACE: dict[str, Any] = {
    "per_channel": [True, False],
    "calibrate_method": ["MinMax", "Percentile"],
    "include_cle": [False, True],
    "include_sq": [False, True],
    "sq": {"only_if": {"include_sq": True}, "extra_options": {"SmoothAlpha": [0.5, 0.8]}},
    "include_bias_correction": [False, True],
    "include_fast_ft": [False, True],
    "ft": {
        "only_if": {"include_fast_ft": True},
        "extra_options": {"OptimAlgorithm": ["adaquant"], "NumIterations": [100]},
    },
    "mixed_precision": {"top_k": [0, 4], "promote_to": ["int16", "float"]},
}


def _context(space: dict[str, Any] = SPACE, **overrides: Any) -> StrategyContext:
    facts = ModelFacts(op_types=("MatMul",))
    return StrategyContext([SearchSpace.parse(space)], mode="max", seed=0, model=facts, **overrides)


class Model:
    """A scripted model: per-channel and Percentile help, CLE helps, SmoothQuant 0.8 helps,
    bias correction hurts; 16-bit promotions of the top k ranked tensors add 0.004 k (the best
    base, 0.945, reaches 0.969 at most), ``weights`` k more with their nodes' weights at 16
    bits; fine-tuning adds ``finetune``; a candidate needs ``threshold``. Float promotions
    quantize less."""

    def __init__(self, threshold: float, finetune: float = 0.0, weights: float = 0.0) -> None:
        self.threshold = threshold
        self.finetune = finetune
        self.weights = weights

    def __call__(self, settings: dict[str, Any]) -> dict[str, Any]:
        metric = 0.90
        metric += 0.02 if settings.get("per_channel") else 0.0
        metric += 0.01 if settings.get("calibrate_method") == "Percentile" else 0.0
        metric += 0.01 if settings.get("include_cle") else 0.0
        alpha = (settings.get("extra_options") or {}).get("SmoothAlpha")
        metric += {0.8: 0.005, 0.5: -0.01}.get(alpha, 0.0)
        metric -= 0.005 if settings.get("include_bias_correction") else 0.0
        metric += self.finetune if settings.get("include_fast_ft") else 0.0
        options = settings.get("mixed_precision") or {}
        k = min(int(options.get("top_k", 0)), RANKED)
        share = 1.0
        if k:
            metric += 0.004 * k
            if options.get("promote_weights") and options.get("promote_to") != "float":
                metric += self.weights * k
            if options.get("promote_to") == "float":
                share = 1.0 - k / (RANKED + 2)
        metric = min(metric, 0.9999)
        extra = {"promoted": k, "ranked": RANKED, "quantized_share": share}
        return {"metric": metric, "is_candidate": metric >= self.threshold, "extra": extra}


#: Auto's stages, in their order.
STAGE_ORDER = [
    "defaults",
    "calibration",
    "reachability",
    "techniques",
    "combined",
    "mixed_precision",
    "mixed_precision_weights",
    "fine_tuning",
    "fine_tuned_mixed_precision",
    "float_fallback",
]


def _stages(trials: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(t.stage for t in trials))


def test_auto_runs_its_stages_in_order_and_stops_before_fine_tuning_when_int16_reaches():
    searcher = SettingSearcher.from_strategy("Auto", _context(max_trials=60))
    trials = _drive(searcher, Model(threshold=0.96), slots=2)
    assert _stages(trials) == [
        "defaults",
        "calibration",
        "reachability",
        "techniques",
        "combined",
        "mixed_precision",
    ]
    assert len({t.key for t in trials}) == len(trials)
    # Beside the techniques, first: every ranked tensor at int16 on the best calibration
    # setting (0.93), with and without the nodes' weights; neither reaches 0.96 there.
    checks = [t for t in trials if t.stage == "reachability"]
    assert [t.settings["mixed_precision"].get("promote_weights", False) for t in checks] == [
        False,
        True,
    ]
    assert all(t.settings["mixed_precision"]["top_k"] == ALL for t in checks)
    assert all(t.settings["per_channel"] and not t.is_candidate for t in checks)
    # Stage 2 switches no technique on; stage 3 switches exactly one on, on the two best.
    calibration = [t.settings for t in trials if t.stage == "calibration"]
    assert not any(s["include_cle"] or s["mixed_precision"]["top_k"] for s in calibration)
    techniques = [t.settings for t in trials if t.stage == "techniques"]
    # CLE, bias correction, SmoothQuant at 0.5 and 0.8 (mixed precision is stage 4's).
    deltas = [
        d for d in role_deltas(searcher.context.spaces[0], TECHNIQUE) if "mixed_precision" not in d
    ]
    assert len(deltas) == 4 and len(techniques) == 2 * 4
    # Combined: CLE and SmoothQuant 0.8 each beat their base; bias correction did not.
    (combined, *_) = [t.settings for t in trials if t.stage == "combined"]
    assert combined["include_cle"] and combined["extra_options"]["SmoothAlpha"] == 0.8
    assert not combined["include_bias_correction"]
    # Mixed precision: int16 only, the smallest k that holds, from the best so far.
    mixed = [t.settings["mixed_precision"] for t in trials if t.stage == "mixed_precision"]
    assert mixed[0]["top_k"] == ALL and {m["promote_to"] for m in mixed} == {"int16"}
    assert searcher.phases[4].found == 4  # 0.945 + 0.004 k: k = 4 reaches 0.96
    assert not any(t.settings.get("include_fast_ft") for t in trials)


def test_auto_fine_tunes_only_when_int16_does_not_reach_and_says_why(caplog):
    caplog.set_level("INFO")
    searcher = SettingSearcher.from_strategy("Auto", _context(max_trials=80))
    trials = _drive(searcher, Model(threshold=0.99, finetune=0.03), slots=2)
    stages = _stages(trials)
    assert stages[-4:] == [
        "mixed_precision",
        "mixed_precision_weights",
        "fine_tuning",
        "fine_tuned_mixed_precision",
    ]
    tuned = [t for t in trials if t.stage == "fine_tuning"]
    assert tuned and all(t.settings["include_fast_ft"] for t in tuned)
    assert len(tuned) <= 2  # the top two, one fine-tuning setting each
    assert any(t.is_candidate for t in tuned)
    # The fewest int16 promotions that hold with fine-tuning: 0.945 + 0.03 + 0.004 k >= 0.99.
    assert searcher.phases[7].found == 4
    again = [t for t in trials if t.stage == "fine_tuned_mixed_precision"]
    assert all(t.settings["include_fast_ft"] for t in again)
    assert "float_fallback" not in stages  # a candidate exists: no last resort
    assert "with every ranked activation tensor at 16 bits the metric" in caplog.text
    assert "the 8-bit weights lose the rest" in caplog.text
    assert "tensor and its node's weight at 16 bits the metric is 0.969" in caplog.text


def test_auto_gives_the_promoted_nodes_16_bit_weights_before_fine_tuning():
    # 0.945 + 0.004 k misses 0.99 (k <= 6); with the weights 0.945 + 0.008 k reaches it at k 6.
    searcher = SettingSearcher.from_strategy("Auto", _context(max_trials=80))
    trials = _drive(searcher, Model(threshold=0.99, finetune=0.03, weights=0.004), slots=2)
    assert _stages(trials)[-2:] == ["mixed_precision", "mixed_precision_weights"]
    weights = [t.settings["mixed_precision"] for t in trials]
    weights = [m for t, m in zip(trials, weights) if t.stage == "mixed_precision_weights"]
    assert weights[0]["top_k"] == ALL
    assert all(m["promote_weights"] is True and m["promote_to"] == "int16" for m in weights)
    assert searcher.phases[5].found == 6
    assert not any(t.settings.get("include_fast_ft") for t in trials)


def test_a_model_only_16_bit_weights_hold_has_its_candidate_beside_the_techniques():
    # magika's pattern: on the best calibration setting (0.93) every ranked tensor at int16
    # misses 0.97 (0.954) and with the nodes' weights reaches it (0.978): that check runs
    # first in the techniques stage, so the first candidate comes before any technique result.
    searcher = SettingSearcher.from_strategy("Auto", _context(max_trials=80))
    trials = _drive(searcher, Model(threshold=0.97, weights=0.004), slots=2)
    first = next(i for i, t in enumerate(trials) if t.is_candidate)
    assert trials[first].stage == "reachability"
    assert trials[first].settings["mixed_precision"]["promote_weights"] is True
    assert all(t.stage in ("defaults", "calibration", "reachability") for t in trials[:first])
    # The weights stage still bisects (that candidate promotes weights: it does not skip it),
    # from the best setting that promotes nothing (CLE and SmoothQuant 0.8 together, 0.945):
    # 0.945 + 0.008 k reaches 0.97 at k = 4. Int16 activations alone (0.969) do not.
    assert searcher.phases[4].found is None and searcher.phases[5].found == 4
    weights = [t for t in trials if t.stage == "mixed_precision_weights"]
    assert weights and all(t.settings["include_cle"] for t in weights)
    assert "fine_tuning" not in _stages(trials)


def test_the_mixed_precision_stage_bisects_from_a_reachability_check_it_does_not_rerun():
    # No technique helps here, so the stage's base is the checks' base: their all-promoted
    # trials are the bisection's first, not run again (every key is distinct).
    def no_technique(settings: dict[str, Any]) -> dict[str, Any]:
        plain = {**settings, "include_cle": False, "include_sq": False, "extra_options": {}}
        return Model(threshold=0.95)(plain)

    searcher = SettingSearcher.from_strategy("Auto", _context(max_trials=80))
    trials = _drive(searcher, no_technique, slots=2)
    assert len({t.key for t in trials}) == len(trials)
    mixed = [t.settings["mixed_precision"] for t in trials if t.stage == "mixed_precision"]
    assert mixed and all(m["top_k"] < ALL for m in mixed)
    assert searcher.phases[4].found == 5  # 0.93 + 0.004 k reaches 0.95 at k = 5


def test_auto_on_a_space_of_calibration_settings_only_uses_the_whole_iteration_limit():
    # No technique, mixed precision or fine-tuning: no later stage takes three fifths of it.
    space = {
        "calibrate_method": ["MinMax", "Percentile"],
        "percentile": {
            "only_if": {"calibrate_method": "Percentile"},
            "extra_options": {"CalibPercentile": [99.9, 99.99, 99.999]},
        },
        "per_channel": [False, True],
        "activation_type": ["QUInt8", "QInt8"],
        "extra_options": {"ActivationSymmetric": [False, True], "WeightSymmetric": [True, False]},
    }
    searcher = SettingSearcher.from_strategy("Auto", _context(space, max_trials=30))
    trials = _drive(searcher, Model(threshold=2.0), slots=2)
    assert len(trials) == 30 and len({t.key for t in trials}) == 30
    assert _stages(trials) == ["defaults", "calibration"]


def test_a_space_that_holds_promote_weights_false_has_no_weights_stage():
    space = {**SPACE, "mixed_precision": {**SPACE["mixed_precision"], "promote_weights": [False]}}
    searcher = SettingSearcher.from_strategy("Auto", _context(space, max_trials=80))
    trials = _drive(searcher, Model(threshold=0.99, finetune=0.03, weights=0.004), slots=2)
    assert "mixed_precision_weights" not in _stages(trials)
    assert "fine_tuning" in _stages(trials)


def test_auto_falls_back_to_float_only_when_nothing_else_is_a_candidate():
    def unreachable(settings: dict[str, Any]) -> dict[str, Any]:
        out = Model(threshold=2.0)(settings)
        options = settings.get("mixed_precision") or {}
        if options.get("promote_to") == "float" and options.get("top_k", 0) >= 3:
            out["is_candidate"] = True
        return out

    searcher = SettingSearcher.from_strategy("Auto", _context(max_trials=80))
    trials = _drive(searcher, unreachable, slots=2)
    assert _stages(trials)[-1] == "float_fallback"
    assert searcher.phases[-1].found == 3


def test_auto_skips_every_later_stage_once_a_default_is_a_fully_quantized_candidate():
    searcher = SettingSearcher.from_strategy("Auto", _context(max_trials=60))
    trials = _drive(searcher, Model(threshold=0.5), slots=2)
    assert "mixed_precision" not in _stages(trials) and "fine_tuning" not in _stages(trials)


def _straight_and_resumed(algo: str, model: Any, cut: int, context: Any = None):
    def fresh() -> SettingSearcher:
        return SettingSearcher.from_strategy(
            algo, context() if context else _context(max_trials=80)
        )

    straight = _drive(fresh(), model, 1)
    before = [t.replace(status="ok") for t in straight[:cut]]
    resumed = fresh()
    resumed.add_finished(before)
    rest = _drive(resumed, model, 1)
    return straight, before, rest


@pytest.mark.parametrize("stage", STAGE_ORDER[1 : STAGE_ORDER.index("fine_tuning") + 1])
def test_auto_resumed_in_each_stage_runs_exactly_the_remaining_settings(stage):
    model = Model(threshold=0.99, finetune=0.03)
    straight = _drive(SettingSearcher.from_strategy("Auto", _context(max_trials=80)), model, 1)
    cut = next(i for i, t in enumerate(straight) if t.stage == stage) + 1
    _, before, rest = _straight_and_resumed("Auto", model, cut)
    assert before[-1].stage == stage and rest  # cut inside the stage; the rest follows
    assert [t.key for t in before + rest] == [t.key for t in straight]


def _unreachable(settings: dict[str, Any]) -> dict[str, Any]:
    """Nothing but 3 or more tensors kept float is a candidate: the 16-bit stages end at
    their first trial, the float fallback bisects (two ks at once) down to 3."""
    out = Model(threshold=2.0)(settings)
    options = settings.get("mixed_precision") or {}
    if options.get("promote_to") == "float" and options.get("top_k", 0) >= 3:
        out["is_candidate"] = True
    return out


def _keys_by_stage(trials: list[dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for trial in trials:
        out.setdefault(trial.stage, []).append(trial.key)
    return {stage: sorted(keys) for stage, keys in out.items()}


def test_auto_runs_the_same_settings_whatever_order_its_trials_finish_in():
    # Two trials at once, the oldest or the newest finishing first: each stage runs the same
    # settings (its bisections in rounds, built from every result before them).
    def run(newest_first: bool) -> list[dict[str, Any]]:
        searcher = SettingSearcher.from_strategy("Auto", _context(max_trials=80, concurrent=2))
        return _drive(searcher, _unreachable, 2, newest_first=newest_first)

    oldest, newest = run(False), run(True)
    assert _stages(oldest)[-1] == "float_fallback"
    assert _keys_by_stage(oldest) == _keys_by_stage(newest)


def test_auto_resumed_at_any_point_of_a_concurrent_search_runs_the_same_settings():
    # Cut after each finished trial (the ones still running lost, as in a resume from the
    # journal alone), the rest run by a fresh searcher whose trials finish in the other
    # order: the same settings as straight through.
    def fresh() -> SettingSearcher:
        return SettingSearcher.from_strategy("Auto", _context(max_trials=80, concurrent=2))

    straight = _drive(fresh(), _unreachable, 2)
    for cut in range(1, len(straight)):
        before = [t.replace(status="ok") for t in straight[:cut]]
        resumed = fresh()
        resumed.add_finished(before)
        rest = _drive(resumed, _unreachable, 2, newest_first=True)
        assert sorted(t.key for t in before + rest) == sorted(t.key for t in straight), cut


@pytest.mark.parametrize("cut", [1, 3, 9])
def test_an_auto_search_cut_with_trials_running_resumes_from_its_journal(cut):
    """Stopped with trials in flight (lost, as when the driver is killed): a fresh searcher
    told the finished records only runs the same settings as straight through."""
    model = Model(threshold=0.99, finetune=0.03)
    straight = [t.key for t in _drive(SettingSearcher.from_strategy("Auto", _context()), model, 2)]
    searcher = SettingSearcher.from_strategy("Auto", _context())
    running: list[tuple[str, dict[str, Any]]] = []
    first = _drive(searcher, model, 2, stop_after=cut, running=running)
    assert running  # stopped with trials in flight
    resumed = SettingSearcher.from_strategy("Auto", _context())
    resumed.add_finished([t.replace(status="ok") for t in first])
    rest = _drive(resumed, model, 2)
    assert sorted(t.key for t in first + rest) == sorted(straight)


def test_two_stage_searches_calibration_then_fine_tuning_on_its_best():
    searcher = SettingSearcher.from_strategy("TwoStage", _context(max_trials=40))
    trials = _drive(searcher, Model(threshold=2.0, finetune=0.01), slots=2)
    assert _stages(trials) == ["calibration", "fine_tuning"]
    first = [t for t in trials if t.stage == "calibration"]
    assert not any(t.settings.get("include_fast_ft") for t in first)
    best = max(first, key=lambda t: t.metric)
    for t in trials[len(first) :]:
        assert t.settings["include_fast_ft"]
        held = ("include_fast_ft", "extra_options")
        assert {k: v for k, v in t.settings.items() if k not in held} == {
            k: v for k, v in best.settings.items() if k not in held
        }


def test_two_stage_resumed_in_stage_two_runs_exactly_the_remaining_settings():
    model = Model(threshold=2.0, finetune=0.01)
    ctx = lambda: _context(max_trials=40)  # noqa: E731
    straight = _drive(SettingSearcher.from_strategy("TwoStage", ctx()), model, 1)
    cut = next(i for i, t in enumerate(straight) if t.stage == "fine_tuning") + 1
    if cut == len(straight):  # a one-setting stage 2: cut inside stage 1 instead
        cut -= 2
    _, before, rest = _straight_and_resumed("TwoStage", model, cut, ctx)
    assert [t.key for t in before + rest] == [t.key for t in straight]


def test_stage_two_space_holds_the_best_and_switches_fine_tuning_on():
    space = SearchSpace.parse(SPACE)
    sub = stage_two_space(space, {"per_channel": False, "calibrate_method": "Percentile"})
    points = sub.expand().points
    assert points and all(p["include_fast_ft"] and not p["per_channel"] for p in points)


def test_finetune_search_reads_two_values_as_ranges_and_shares_one_sampler():
    space = {
        "include_fast_ft": [True],
        "extra_options": {
            "OptimAlgorithm": ["adaquant"],
            "NumIterations": [100, 2000],
            "LearningRate": [1e-3, 1e-6],
            "BatchSize": [1, 4],
        },
    }
    domains = {p.leaf: p.domain for p in ranged(SearchSpace.parse(space)).params}
    assert domains["NumIterations"] == IntRange(100, 2000, log=True)
    assert domains["LearningRate"] == FloatRange(1e-6, 1e-3, log=True)
    assert domains["BatchSize"] == IntRange(1, 4)

    def outcome(settings: dict[str, Any]) -> dict[str, Any]:
        lr = settings["extra_options"]["LearningRate"]
        return {"metric": -abs(lr - 1e-4), "is_candidate": False, "extra": {}}

    searcher = SettingSearcher.from_strategy("FinetuneSearch", _context(space, max_trials=12))
    trials = _drive(searcher, outcome, slots=4)
    assert len(trials) == 12 and {t.stage for t in trials} == {"fine_tuning"}
    # One study proposed every concurrent trial: 12 distinct settings, none a repeat of
    # another process's start-up trial (Quark's per-process studies repeat their seeds').
    assert len({t.key for t in trials}) == 12
    (phase,) = searcher.phases
    assert len(phase.optuna._ot_study.trials) >= 12


def test_finetune_search_without_a_range_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="NumIterations, LearningRate"):
        SettingSearcher.from_strategy("FinetuneSearch", _context({"per_channel": [True, False]}))


def test_finetune_search_without_a_range_is_refused_when_the_config_is_read():
    from raysearch.config import SearchConfig

    raw = {
        "model": "m.onnx",
        "calibration_data": "c.npz",
        "search_space": {"per_channel": [True, False]},
        "search_algo": "advanced_fastft_search",
    }
    with pytest.raises(ConfigError) as info:
        SearchConfig.from_dict(raw, check_paths=False)
    assert str(info.value) == (
        "search_algo: FinetuneSearch searches fine-tuning's NumIterations, LearningRate, "
        "BatchSize or DataSize as ranges: give at least one as two values ([100, 200]) or a "
        "range"
    )


@pytest.mark.parametrize(
    ("name", "strategy"),
    [
        ("exhaustive", "Grid"),
        ("random", "Random"),
        ("tpe", "TPE"),
        ("bayesian", "GPS"),
        ("basic", "Auto"),
        ("auto", "Auto"),
        ("mse", "Fallback"),
        ("mse_v2", "Fallback"),
        ("conservative", "Conservative"),
        ("two_stage_search", "TwoStage"),
        ("advanced_fastft_search", "FinetuneSearch"),
    ],
)
def test_neural_compressors_and_quarks_names_read_as_raysearch_strategies(name, strategy):
    assert canonical_strategy(name) == strategy


def test_hawq_v2_is_refused_with_why():
    with pytest.raises(ConfigError, match="training loss") as info:
        canonical_strategy("hawq_v2")
    assert "\n" not in str(info.value)


def test_a_predefined_space_defaults_to_auto_and_a_written_one_to_tpe(tmp_path: Path):
    from raysearch.config import SearchConfig

    base = {"model": "m.onnx", "calibration_data": "c.npz", "metric": "cos", "tolerance": 0.99}
    preset = SearchConfig.from_dict(
        {**base, "search_space": "MATMUL_CONV_INT8_SEARCH"}, check_paths=False
    )
    written = SearchConfig.from_dict(
        {**base, "search_space": {"per_channel": [True]}}, check_paths=False
    )
    assert (preset.search_algo, written.search_algo) == ("Auto", "TPE")


# -- real searches (a local Ray, real models) -----------------------------------------------------
E2E_SPACE: dict[str, Any] = {
    "per_channel": [True, False],
    "calibrate_method": ["MinMax", "Percentile"],
    "include_cle": [False, True],
    "include_bias_correction": [False, True],
    "include_fast_ft": [False, True],
    "extra_options": {
        "CalibPercentile": [99.9],
        # One fine-tuning setting: the fine-tuning stage tunes each of its two bases once
        # (the costliest trials here; the stage's choice of bases is what the tests read).
        "ft": {
            "only_if": {"include_fast_ft": True},
            "OptimAlgorithm": ["adaquant"],
            "NumIterLR": [[20, 0.001]],
            "DataSize": [8],
        },
    },
    # 16-bit weights reach the tolerance on this model: held off, fine-tuning runs too.
    "mixed_precision": {
        "top_k": [0, 2],
        "promote_to": ["int16", "float"],
        "promote_weights": [False],
    },
}


def _e2e_config(folder: Path, **overrides: Any) -> dict[str, Any]:
    from tests.search.test_techniques_e2e import _config

    # Out of reach of int8 with int16 promotions on this model: every stage runs.
    return _config(
        folder,
        **{"search_space": E2E_SPACE, "search_algo": "Auto", "tolerance": 0.9999999, **overrides},
    )


def _stages_in_table(folder: Path) -> list[str]:
    import pyarrow.parquet as pq

    rows = sorted(pq.read_table(folder / "results.parquet").to_pylist(), key=lambda r: r["number"])
    return [r["stage"] for r in rows]


@pytest.fixture(scope="module")
def straight_auto(ray_cluster, tmp_path_factory):
    """One Auto search of :data:`E2E_SPACE` run straight through: its table's stages are
    checked, and a killed and resumed search of the same config must run its settings."""
    from raysearch.search import AutoSearch

    return AutoSearch(_e2e_config(tmp_path_factory.mktemp("straight"))).run()


@pytest.mark.slow
def test_an_auto_search_records_its_stages_in_order_in_results_parquet(straight_auto):
    result = straight_auto
    stages = _stages_in_table(result.output_dir)
    assert {r.status for r in result.records} == {"ok"}, [r.error for r in result.records]
    ranks = [STAGE_ORDER.index(s) for s in stages]
    # Stages start in order; a stage's trials may still finish while the next one's start.
    assert [STAGE_ORDER.index(s) for s in dict.fromkeys(stages)] == sorted(set(ranks))
    assert {"defaults", "calibration", "techniques", "mixed_precision", "fine_tuning"} <= set(
        stages
    )
    assert len({r.key for r in result.records}) == len(stages)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_stop_conditions_end_a_two_stage_search_inside_stage_two(tmp_path):
    from raysearch.search import AutoSearch

    space = {**E2E_SPACE, "mixed_precision": {"top_k": [0]}, "include_cle": [False]}
    space["include_bias_correction"] = [False]
    space["extra_options"] = {
        **E2E_SPACE["extra_options"],
        "ft": {**E2E_SPACE["extra_options"]["ft"], "NumIterLR": [[10, 0.001], [20, 0.001]]},
    }
    # Stage 1: 4 calibration settings; stage 2 has 2 fine-tuning settings. Every trial is a
    # candidate: the 5th candidate ends the search in stage 2.
    config = _e2e_config(
        tmp_path,
        search_space=space,
        search_algo="two_stage_search",
        tolerance=0.5,
        stop={"find_n_candidates": 5},
        resources={"max_concurrent_trials": 1},
    )
    result = AutoSearch(config).run()
    stages = _stages_in_table(result.output_dir)
    assert result.summary["stop_reason"] == "candidates_found"
    assert stages[:4] == ["calibration"] * 4 and stages[4:] == ["fine_tuning"]


@pytest.mark.slow
def test_a_killed_auto_search_resumes_in_its_stage_with_nothing_rerun(straight_auto, tmp_path):
    import signal

    from raysearch.search import AutoSearch
    from tests.reliability.helpers import (
        journal,
        kill_group,
        start_raysearch,
        stop_leftovers,
        wait_until,
        write_config,
    )

    expected = [r.key for r in sorted(straight_auto.records, key=lambda r: r.number)]
    work = tmp_path / "killed"
    config = write_config(work / "config.yaml", _e2e_config(work))
    proc = start_raysearch(["run", str(config)], work)
    try:
        # Killed inside the techniques stage or later (past defaults and calibration).
        wait_until(proc, lambda: len(journal(work / "out")) >= 7, timeout=300)
        kill_group(proc, signal.SIGKILL)
        proc.wait(timeout=120)
    finally:
        stop_leftovers(proc)
    before = journal(work / "out")
    assert 7 <= len(before) < len(expected)
    result = AutoSearch.resume(work / "out")
    after = journal(work / "out")
    assert len(after) == len({r["key"] for r in after})  # nothing ran twice
    assert sorted(r["key"] for r in after) == sorted(expected)
    assert result.summary["n_trials"] == len(expected)
