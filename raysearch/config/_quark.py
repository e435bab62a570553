"""AMD Quark's AutoSearch (v1) and AutoSearchPro configs read as raysearch's: top-level names
mapped, dropped when raysearch does them anyway, or refused with why; spaces by ``_quark_space``.

Example:
    >>> from raysearch.errors import ErrorCollector
    >>> t = Translation({"search_space": {"activation_type": ["QuantType.QInt8"]}},
    ...                 ErrorCollector())
    >>> translate_quark(t)
    >>> t.data, t.notes
    ({'search_space': {'activation_type': ['QInt8']}}, ['QuantType.QInt8 -> QInt8'])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from raysearch.config._dialects import Translation
from raysearch.config._quark_space import quark_space
from raysearch.errors import ConfigError

__all__ = ["translate_quark", "RENAMED"]

#: Quark's top-level names -> raysearch's key paths.
RENAMED = {
    "search_metric": "metric",
    "search_metric_tolerance": "tolerance",
    "search_stop_condition": "stop",
    "n_trials": "stop.iteration_limit",
    "n_jobs": "resources.max_concurrent_trials",
    "model_input": "model",
    "calib_data_reader": "calibration_data",
    "eval_data_reader": "eval_data",
}
#: Quark's switches of a strategy -> the strategy.
_STRATEGY_SWITCHES = {"two_stage_search": "TwoStage", "advanced_fastft_search": "FinetuneSearch"}
_SCRATCH = (
    "decided by raysearch, not by the config: quantization scratch goes to the system's "
    "temporary folder (TMPDIR), caches and outputs under output_dir"
)


def translate_quark(t: Translation) -> None:
    """Read the Quark names of ``t.data`` as raysearch's (see the module)."""
    _top_level(t)
    _strategy_switches(t)
    for key in [k for k in t.data if isinstance(k, str) and k.startswith("search_space_")]:
        t.refuse(key, "Quark's named spaces: give several spaces as search_spaces: [...]")
    if isinstance(t.data.get("search_space"), dict):
        t.data["search_space"] = quark_space(t, t.data["search_space"], "search_space")
    spaces = t.data.get("search_spaces")
    if isinstance(spaces, list):
        for i, space in enumerate(spaces):
            if isinstance(space, dict):
                spaces[i] = quark_space(t, space, f"search_spaces[{i}]")


def _top_level(t: Translation) -> None:
    data = t.data
    for quark, ours in RENAMED.items():
        if quark in data:
            t.move(quark, ours)
    _evaluator(t)
    for key in ("search_cache_dir", "temp_dir"):
        if key in data:
            if data[key] is None:
                t.drop(key, "None: the default folders")
            else:
                t.drop(key, f"{data[key]}: {_SCRATCH}")
    if "base_framework" in data:
        if str(data["base_framework"]).lower() == "onnx":
            t.drop("base_framework", "onnx: raysearch searches ONNX models")
        else:
            t.refuse(
                "base_framework", f"raysearch searches ONNX models, not {data['base_framework']!r}"
            )
    if "direction" in data:
        _direction(t, data.pop("direction"), "direction")
    _switch(
        t,
        "plot_results",
        "true: raysearch writes plots/ (PNG) for every search",
        "raysearch writes plots/ for every search; remove it",
    )
    _switch(t, "load_study_if_exists", None, None)
    _devices(t)


def _devices(t: Translation) -> None:
    """``search_devices``: trials run on CPUs unless ``resources.gpu_per_trial`` says GPUs."""
    if "search_devices" not in t.data:
        return
    if str(t.data["search_devices"]).strip().lower() == "cpu":
        t.drop("search_devices", "cpu: trials run on CPUs (resources.gpu_per_trial: 0)")
    else:
        t.refuse(
            "search_devices",
            "raysearch gives trials GPUs by resources.gpu_per_trial (Ray assigns each "
            "trial its device); remove it",
        )


def _evaluator(t: Translation) -> None:
    """``search_evaluator``: None is the built-in metric, else the metric."""
    if "search_evaluator" not in t.data:
        return
    evaluator = t.data["search_evaluator"]
    if evaluator is None:
        t.drop("search_evaluator", "None: the built-in metric (metric)")
    elif isinstance(evaluator, str) or callable(evaluator):
        t.move("search_evaluator", "metric")
    else:
        t.refuse(
            "search_evaluator",
            f"a {type(evaluator).__name__} object: give a function, or name one as "
            "'module:function'",
        )


def _switch(t: Translation, key: str, on: str | None, off_refused: str | None) -> None:
    """A true/false key: ``load_study_if_exists``, ``plot_results`` (false refused)."""
    if key not in t.data:
        return
    value = t.data[key]
    if not isinstance(value, bool):
        t.refuse(key, f"expected true or false, got {value!r}")
    elif key == "load_study_if_exists":
        t.move(key, "resume_if_exists")
    elif value:
        t.drop(key, str(on))
    else:
        t.refuse(key, str(off_refused))


def _direction(t: Translation, value: Any, source: str) -> None:
    """``direction``: a custom metric's ``higher_is_better``; a built-in's must agree."""
    from raysearch.metrics import BUILTIN_METRICS, canonical_metric

    if value not in ("minimize", "maximize"):
        t.errors.add(ConfigError(source, f"expected minimize or maximize, got {value!r}"))
        return
    higher = value == "maximize"
    metric = t.data.get("metric", "L2")
    builtin = canonical_metric(metric) if isinstance(metric, str) else None
    if builtin is None:
        t.data.setdefault("higher_is_better", higher)
        t.notes.append(f"{source}: {value} -> higher_is_better: {higher}")
    elif BUILTIN_METRICS[builtin] == higher:
        t.notes.append(f"{source}: {value}: what {builtin} is by definition")
    else:
        way = "higher" if BUILTIN_METRICS[builtin] else "lower"
        t.errors.add(
            ConfigError(
                source,
                f"{value} contradicts the metric: {builtin} is {way}-is-better by definition "
                "(raysearch ranks it so); remove it",
            )
        )


def _strategy_switches(t: Translation) -> None:
    on = [k for k in _STRATEGY_SWITCHES if t.data.get(k) is True]
    for key in _STRATEGY_SWITCHES:
        value = t.data.get(key)
        if key in t.data and not isinstance(value, bool):
            t.refuse(key, f"expected true or false, got {value!r}")
        elif value is False:
            t.drop(key, "false: the search_algo given (or the default)")
    if len(on) > 1:
        for key in on:
            t.refuse(
                key, "two_stage_search and advanced_fastft_search are two strategies: keep one"
            )
        return
    params = t.data.pop("advanced_fastft_params", None)
    if params is not None:
        _fastft_params(t, params, "advanced_fastft_search" in on)
    if not on:
        return
    key, strategy = on[0], _STRATEGY_SWITCHES[on[0]]
    written = t.data.pop("search_algo", None)
    if written is not None and str(written).lower() not in ("tpe", "grid", "grid_search"):
        t.refuse(
            key,
            f"selects search_algo {strategy}, and search_algo {written!r} is given too: keep one",
        )
        return
    t.data.pop(key)
    t.data["search_algo"] = strategy
    t.notes.append(
        f"{key}: true -> search_algo: {strategy}"
        + (
            f" (its stages search by grid, else TPE: search_algo {written!r} is theirs)"
            if written
            else ""
        )
    )


def _fastft_params(t: Translation, params: Any, used: bool) -> None:
    where = "advanced_fastft_params"
    if not used:
        t.errors.add(ConfigError(where, "applies with advanced_fastft_search: true only"))
        return
    if not isinstance(params, Mapping):
        t.errors.add(ConfigError(where, f"expected a mapping, got {params!r}"))
        return
    for key, value in params.items():
        if key == "sampler_algo":
            if str(value).lower() != "tpe":
                t.errors.add(
                    ConfigError(
                        f"{where}.{key}",
                        f"FinetuneSearch is one TPE study; {value!r} is not offered",
                    )
                )
            else:
                t.notes.append(f"{where}.sampler_algo: TPE: what FinetuneSearch runs")
        elif key == "direction":
            _direction(t, value, f"{where}.direction")
        elif key == "n_trials":
            t.move(key, "stop.iteration_limit", value=value, source=f"{where}.n_trials")
        else:
            t.errors.add(
                ConfigError(f"{where}.{key}", "unknown key (sampler_algo, direction, n_trials)")
            )
