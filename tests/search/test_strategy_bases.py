"""Every stage of every strategy proposes only settings that run, whatever the best bases so
far are: on ``A8W8_SEARCH`` with dynamic quantization ranking best (a dynamic setting has no
QDQ graph to promote tensors in or fine-tune), the real searcher driven by a scripted model;
a stage with nothing to propose is skipped with its reason; a phase that raises ends the
search with the trials that finished. Then Auto through every stage on a transformer encoder
whose best early settings are dynamic (slow, real Ray)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from raysearch.config._spaces import parse_spaces, predefined_spaces
from raysearch.search.tune.searchers import SettingSearcher
from raysearch.space import SearchSpace
from raysearch.strategies import EXHAUSTED, ModelFacts, Phase, Proposal, StrategyContext
from raysearch.strategies._setting_phase import setting_space
from raysearch.strategies.grid import GridPhase
from raysearch.trialrecord import TrialRecord
from tests.search.test_fallback import _drive

RANKED = 6
#: What the validity rules say of mixed precision on a dynamic setting.
DYNAMIC_DROPS = (
    "static_settings_in_dynamic_mode drops mixed_precision.top_k, "
    "mixed_precision.promote_to, mixed_precision.rank_by"
)


class DynamicBest:
    """Dynamic quantization 0.75, static 0.5, per-channel weights 0.125 more; each 16-bit (or
    float) promotion of the top k ranked tensors adds 0.0625 k; a candidate needs
    ``threshold``. Every value is exact in binary, so ties are exact."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def __call__(self, settings: dict[str, Any]) -> dict[str, Any]:
        metric = 0.75 if settings.get("quant_mode") == "dynamic" else 0.5
        metric += 0.125 if settings.get("per_channel") else 0.0
        k = min(int((settings.get("mixed_precision") or {}).get("top_k", 0)), RANKED)
        metric += 0.0625 * k
        extra = {"promoted": k, "ranked": RANKED, "quantized_share": 1.0}
        return {"metric": metric, "is_candidate": metric >= self.threshold, "extra": extra}


def _a8w8(**changes: Any) -> list[SearchSpace]:
    if not changes:
        return parse_spaces({"search_space": "A8W8_SEARCH"})
    raw = yaml.safe_load(predefined_spaces()["A8W8_SEARCH"].read_text())
    space = {**raw["search_space"], **changes}
    return [SearchSpace.parse(space)]


def _context(spaces: list[SearchSpace], max_trials: int = 60) -> StrategyContext:
    facts = ModelFacts(op_types=("MatMul",))
    return StrategyContext(spaces, mode="max", seed=0, model=facts, max_trials=max_trials)


def _stages(trials: list[TrialRecord]) -> list[str]:
    return list(dict.fromkeys(t.stage for t in trials))


def _first_best(trials: list[TrialRecord]) -> TrialRecord:
    """The best of ``trials``, the one started first among equals."""
    top = max(t.metric for t in trials)
    return min((t for t in trials if t.metric == top), key=lambda t: t.number)


def _all_run(trials: list[TrialRecord]) -> None:
    for trial in trials:  # each a point of a one-point space the catalogues accept
        setting_space(trial.settings)
    assert len({t.key for t in trials}) == len(trials)


def test_auto_promotes_from_the_best_static_setting_when_dynamic_ones_rank_best(caplog):
    caplog.set_level(logging.INFO, logger="raysearch")
    searcher = SettingSearcher.from_strategy("Auto", _context(_a8w8()))
    trials = _drive(searcher, DynamicBest(threshold=0.9375), slots=2)
    _all_run(trials)
    assert _stages(trials) == [
        "defaults",
        "calibration",
        "reachability",
        "techniques",
        "mixed_precision",
    ]
    early = [t for t in trials if t.stage in ("defaults", "calibration")]
    dynamic = _first_best(early)
    static = _first_best([t for t in early if t.settings.get("quant_mode") == "static"])
    assert dynamic.settings["quant_mode"] == "dynamic" and dynamic.metric == 0.875
    assert static.metric == 0.625

    # The 16-bit checks beside the techniques, and the bisection, build on the best static.
    def base(trial: TrialRecord) -> dict[str, Any]:
        return {k: v for k, v in trial.settings.items() if k != "mixed_precision"}

    for trial in trials:
        if trial.stage in ("reachability", "mixed_precision"):
            assert base(trial) == base(static)
    promoted = [
        t.settings["mixed_precision"]["top_k"]
        for t in trials
        if t.stage in ("reachability", "mixed_precision")
    ]
    assert 5 in promoted and 4 in promoted  # 5 is the smallest that holds, 4 misses
    before = [t for t in trials if t.stage not in ("reachability", "mixed_precision")]
    best_before = _first_best(before)
    assert (
        f"stage mixed_precision: trial {best_before.trial_id} (metric 0.875), the best, "
        f"cannot promote tensors ({DYNAMIC_DROPS}); trial {static.trial_id} is the best "
        "that can"
    ) in caplog.messages
    assert searcher.finish_reason == "space_exhausted"


def test_auto_runs_every_later_stage_on_the_settings_that_can_take_it(caplog):
    caplog.set_level(logging.INFO, logger="raysearch")
    searcher = SettingSearcher.from_strategy("Auto", _context(_a8w8()))
    trials = _drive(searcher, DynamicBest(threshold=2.0), slots=2)
    _all_run(trials)
    assert _stages(trials) == [
        "defaults",
        "calibration",
        "reachability",
        "techniques",
        "fine_tuning",
        "float_fallback",
    ]
    # Fine-tuning is on static settings only (a dynamic one has no QDQ graph to tune).
    tuned = [t for t in trials if t.stage == "fine_tuning"]
    assert len(tuned) == 2 and {t.settings["quant_mode"] for t in tuned} == {"static"}
    fallback = [t for t in trials if t.stage == "float_fallback"]
    assert fallback and {t.settings["quant_mode"] for t in fallback} == {"static"}
    assert searcher.finish_reason == "space_exhausted"


def test_a_space_of_dynamic_settings_only_skips_the_later_stages_with_why(caplog):
    caplog.set_level(logging.INFO, logger="raysearch")
    spaces = _a8w8(quant_mode=["dynamic"])
    searcher = SettingSearcher.from_strategy("Auto", _context(spaces))
    trials = _drive(searcher, DynamicBest(threshold=2.0), slots=2)
    _all_run(trials)
    assert _stages(trials) == ["defaults", "calibration", "techniques"]
    best, n = _first_best(trials), len(trials)
    assert "reachability checks skipped: no finished setting can promote tensors" in (
        caplog.messages
    )
    for stage, drops in (
        ("mixed_precision", DYNAMIC_DROPS),
        (
            "mixed_precision_weights",
            DYNAMIC_DROPS.replace("promote_to, ", "promote_to, mixed_precision.promote_weights, "),
        ),
        ("float_fallback", DYNAMIC_DROPS),
    ):
        assert (
            f"stage {stage} skipped: none of the {n} finished settings can promote tensors "
            f"(trial {best.trial_id}, the best, cannot: {drops})"
        ) in caplog.messages
    # No setting of the space fine-tunes: the rules strip include_fast_ft from each.
    assert "stage fine_tuning skipped: the spaces do not fine-tune" in caplog.messages


@pytest.mark.parametrize(
    ("algo", "changes"),
    [
        ("Auto", {}),
        # TPE searches no promotion here, so its best is dynamic; then Fallback's bisection.
        ("Fallback", {"mixed_precision": {"top_k": [0], "promote_to": ["int16"]}}),
    ],
)
@pytest.mark.parametrize("threshold", [0.9375, 2.0])
def test_a_strategy_proposes_only_settings_that_run_when_dynamic_ranks_best(
    algo, changes, threshold
):
    searcher = SettingSearcher.from_strategy(algo, _context(_a8w8(**changes), max_trials=40))
    trials = _drive(searcher, DynamicBest(threshold), slots=3)
    _all_run(trials)
    plain = [t for t in trials if not (t.settings.get("mixed_precision") or {}).get("top_k")]
    assert _first_best(plain).settings["quant_mode"] == "dynamic"
    assert searcher.finish_reason in ("space_exhausted", "iteration_limit")


NO_PROMOTION = {"mixed_precision": {"top_k": [0], "promote_to": ["int16"]}}


def test_two_stage_fine_tunes_around_the_best_setting_that_can_be_fine_tuned(caplog):
    caplog.set_level(logging.INFO, logger="raysearch")
    searcher = SettingSearcher.from_strategy(
        "TwoStage", _context(_a8w8(**NO_PROMOTION), max_trials=40)
    )
    trials = _drive(searcher, DynamicBest(threshold=2.0), slots=3)
    _all_run(trials)
    stage_one = [t for t in trials if t.stage == "calibration"]
    best = _first_best(stage_one)
    static = _first_best([t for t in stage_one if t.settings["quant_mode"] == "static"])
    assert best.settings["quant_mode"] == "dynamic"
    tuned = [t for t in trials if t.stage == "fine_tuning"]
    assert tuned and all(t.settings["include_fast_ft"] for t in tuned)
    assert {t.settings["quant_mode"] for t in tuned} == {"static"}
    assert (
        f"two_stage: trial {best.trial_id} (metric 0.875), the best of stage 1, cannot be "
        "fine-tuned (static_settings_in_dynamic_mode drops include_fast_ft); trial "
        f"{static.trial_id} is the best that can"
    ) in caplog.messages


def test_two_stage_on_dynamic_settings_only_skips_stage_two_with_why(caplog):
    caplog.set_level(logging.INFO, logger="raysearch")
    spaces = _a8w8(quant_mode=["dynamic"])
    searcher = SettingSearcher.from_strategy("TwoStage", _context(spaces, max_trials=40))
    trials = _drive(searcher, DynamicBest(threshold=2.0), slots=3)
    assert _stages(trials) == ["calibration"]
    best = _first_best(trials)
    assert (
        f"two_stage: stage 2 skipped: none of the {len(trials)} settings of stage 1 can be "
        f"fine-tuned (trial {best.trial_id}, the best, cannot: "
        "static_settings_in_dynamic_mode drops include_fast_ft)"
    ) in caplog.messages


class _Broken(Phase):
    """A phase with a bug: it raises on its first proposal."""

    def propose(self, trial_id: str, search: Any) -> Any:
        raise KeyError("no such base")


def test_a_phase_that_raises_ends_the_search_with_the_trials_that_finished(caplog):
    caplog.set_level(logging.INFO, logger="raysearch")
    space = SearchSpace.parse({"per_channel": [True, False]})
    context = _context([space])
    searcher = SettingSearcher([GridPhase([space], None), _Broken()], mode="max", context=context)
    trials = _drive(searcher, DynamicBest(threshold=2.0), slots=1)
    assert [t.settings for t in trials] == [{"per_channel": True}, {"per_channel": False}]
    assert searcher.finish_reason == "strategy_failed"
    assert (
        "search phase 1 failed: KeyError: 'no such base'; the search ends with the trials "
        "that finished"
    ) in caplog.messages
    assert searcher.suggest("later") == "FINISHED"
    assert EXHAUSTED  # the phases' end marker is unchanged


class _NeedsModule(Phase):
    """A phase that imports a module missing here when it starts (a plugin's submodule)."""

    def start(self, context: StrategyContext) -> None:
        import tests.search.no_such_plugin_submodule  # noqa: F401

    def propose(self, trial_id: str, search: Any) -> Any:
        return EXHAUSTED


def test_a_module_a_phase_cannot_import_before_any_trial_refuses_the_session(caplog):
    caplog.set_level(logging.INFO, logger="raysearch")
    space = SearchSpace.parse({"per_channel": [True, False]})
    # Resumed with every setting of the grid known: the phase needing the module starts first.
    resumed = SettingSearcher(
        [GridPhase([space], None), _NeedsModule()], mode="max", context=_context([space])
    )
    resumed.add_finished(
        [
            TrialRecord(trial_id=f"t{i}", key=key, phase=0, metric=1.0, status="ok")
            for i, key in enumerate(Proposal.of(space, 0, p).key for p in space.expand().points)
        ]
    )
    assert resumed.suggest("first") == "FINISHED"
    assert resumed.finish_reason == "missing_module"
    assert resumed.missing_module.name == "tests.search.no_such_plugin_submodule"
    assert not any("failed" in message for message in caplog.messages)
    # After a trial of this session started, the same import is the strategy's failure.
    running = SettingSearcher(
        [GridPhase([space], None), _NeedsModule()], mode="max", context=_context([space])
    )
    trials = _drive(running, DynamicBest(threshold=2.0), slots=1)
    assert len(trials) == 2 and running.finish_reason == "strategy_failed"
    assert running.missing_module is None


def test_setting_refusal_names_the_rule_and_the_keys():
    from raysearch.strategies._setting_phase import setting_refusal

    settings = {"quant_mode": "dynamic", "per_channel": True, "mixed_precision": {"top_k": 4}}
    assert setting_refusal(settings, None) == (
        "static_settings_in_dynamic_mode drops mixed_precision.top_k"
    )
    assert setting_refusal({"quant_mode": "static", "mixed_precision": {"top_k": 4}}, None) is None


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_auto_on_a8w8_runs_every_stage_on_an_encoder_where_dynamic_ranks_best(tmp_path, caplog):
    import pyarrow.parquet as pq

    from raysearch.search import AutoSearch
    from tests.models import deep_encoder_data, make_deep_encoder_model

    caplog.set_level(logging.INFO, logger="raysearch")
    # Two blocks and one batch at each of the data's three scales: dynamic quantization still
    # ranks best and each stage still runs, while each fine-tuning trial tunes fewer layers.
    model = make_deep_encoder_model(tmp_path / "encoder.onnx", layers=2)
    np.savez(tmp_path / "data.npz", **deep_encoder_data(24))
    config = {
        "model": str(model),
        "calibration_data": str(tmp_path / "data.npz"),
        "batch_size": 8,
        "search_space": "A8W8_SEARCH",
        "metric": "cos",
        # Out of reach of every setting: each later stage runs.
        "tolerance": 0.9999999,
        "seed": 0,
        "measure_latency": False,
        # One trial actor: one start, and one import of PyTorch for the fine-tuning stage.
        "resources": {"max_concurrent_trials": 1},
        "output_dir": str(tmp_path / "out"),
    }
    result = AutoSearch(config).run()
    out = Path(result.output_dir)
    assert (out / "summary.json").is_file() and (out / "best").is_dir()
    rows = sorted(pq.read_table(out / "results.parquet").to_pylist(), key=lambda r: r["number"])
    assert result.summary["stop_reason"] == "space_exhausted"
    early = [r for r in rows if r["stage"] in ("defaults", "calibration") and r["metric"]]
    assert max(early, key=lambda r: r["metric"])["params/quant_mode"] == "dynamic"
    stages = list(dict.fromkeys(r["stage"] for r in rows))
    assert stages[:4] == ["defaults", "calibration", "reachability", "techniques"]
    assert {"fine_tuning", "float_fallback"} <= set(stages), stages
    assert len({r.key for r in result.records}) == len(rows)
    said = "\n".join(caplog.messages)
    assert "the best, cannot promote tensors (static_settings_in_dynamic_mode drops" in said


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_a_strategy_that_raises_mid_search_writes_its_outputs_and_keeps_the_best(tmp_path, capsys):
    from raysearch.search import AutoSearch
    from raysearch.strategies import _registry, register_strategy
    from tests.search.test_techniques_e2e import _config

    @register_strategy("GridThenBroken")
    def grid_then_broken(context: StrategyContext) -> list[Phase]:
        return [GridPhase(context.spaces, context.reject), _Broken()]

    config = _config(
        tmp_path, search_space={"per_channel": [True, False]}, search_algo="GridThenBroken"
    )
    try:
        result = AutoSearch(config).run()
    finally:
        _registry._REGISTRY.pop("GridThenBroken")
    out = Path(result.output_dir)
    assert result.summary["stop_reason"] == "strategy_failed"
    assert result.summary["n_trials"] == 2
    assert (out / "summary.json").is_file() and (out / "results.parquet").is_file()
    assert result.best_params is not None and (out / "best").is_dir()
    from raysearch.cli import EXIT_INTERNAL, _ended

    capsys.readouterr()  # the search's progress line
    assert _ended(result) == EXIT_INTERNAL
    assert capsys.readouterr().err == (
        "raysearch: internal error: a stage of the search strategy failed (its traceback is in "
        f"{out / 'auto_search.log'}); the outputs hold the trials that finished\n"
    )
