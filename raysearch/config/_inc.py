"""Intel Neural Compressor's tuning settings (``quant_level``, ``TuningCriterion``,
``AccuracyCriterion``, ``objective``) read as raysearch's; its other settings are refused.

Example:
    >>> from raysearch.errors import ErrorCollector
    >>> t = Translation({"tuning_criterion": {"timeout": 60, "max_trials": 100}},
    ...                 ErrorCollector())
    >>> translate_inc(t)
    >>> t.data
    {'stop': {'time_limit': 60, 'iteration_limit': 100}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from raysearch.config._dialects import Translation
from raysearch.errors import ConfigError
from raysearch.strategies import canonical_strategy

__all__ = ["translate_inc", "REFUSED", "OBJECTIVE_SELECT"]

#: Neural Compressor's ``objective`` as raysearch's ``select``.
OBJECTIVE_SELECT = {"performance": "latency", "modelsize": "size", "accuracy": "metric"}
_OBJECTIVE = (
    "expected performance (select: latency), modelsize (select: size) or accuracy "
    "(select: metric); footprint (memory) is not measured"
)
_NO_CRITERION = (
    "0 stops at the first setting that meets the accuracy criterion, and none is given: give "
    "accuracy_criterion.tolerable_loss (or tolerance), or a timeout in seconds"
)
_SPACE = "write it in the search space (search_space)"
#: Neural Compressor's other settings, refused by name with why.
REFUSED: dict[str, str] = {
    "strategy_kwargs": "raysearch's strategies take no arguments (confidence_batches, "
    "hawq_v2_loss)",
    "approach": f"static or dynamic quantization is quant_mode: {_SPACE}",
    "op_type_dict": f"per-op-type settings: {_SPACE}",
    "op_name_dict": f"per-node settings: {_SPACE} (nodes_to_exclude, TensorQuantOverrides)",
    "recipes": f"smooth_quant and the other recipes are raysearch's techniques: {_SPACE}",
    "calibration_sampling_size": "the calibration samples are calibration_data's rows",
    "excluded_precisions": f"data types: {_SPACE}",
    "reduce_range": f"reduce_range: {_SPACE}",
    "quant_format": f"quant_format: {_SPACE}",
    "backend": "raysearch's backends are quantizer: ort or nncf in the search space",
    "device": "trials get GPUs by resources.gpu_per_trial",
    "domain": "raysearch does not choose settings by model domain",
    "tuning": "Neural Compressor 1.x's tuning section: write 2.x's keys (quant_level, "
    "tuning_criterion, accuracy_criterion) at the top level",
}


def translate_inc(t: Translation) -> None:
    """Read the Neural Compressor names of ``t.data`` as raysearch's (see the module)."""
    accuracy = t.data.pop("accuracy_criterion", None)
    if accuracy is not None:
        _accuracy_criterion(t, accuracy)
    criterion = t.data.pop("tuning_criterion", None)
    if criterion is not None:
        _tuning_criterion(t, criterion)
    if "strategy" in t.data:
        _strategy(t, t.data.pop("strategy"), "strategy")
    if "quant_level" in t.data:
        _quant_level(t, t.data.pop("quant_level"))
    if "objective" in t.data:
        _objective(t, t.data.pop("objective"), "objective")
    for key, why in REFUSED.items():
        if key in t.data:
            t.refuse(key, why)


def _strategy(t: Translation, value: Any, source: str) -> None:
    try:
        name = canonical_strategy(value, source)
    except ConfigError as exc:
        t.errors.add(exc)
        return
    t.move(source, "search_algo", value=name, source=source)


def _objective(t: Translation, value: Any, source: str) -> None:
    """``objective``: which candidate ``best/`` holds, raysearch's ``select``."""
    select = OBJECTIVE_SELECT.get(value) if isinstance(value, str) else None
    if select is None:
        t.errors.add(ConfigError(source, f"{_OBJECTIVE}, got {value!r}"))
        return
    t.move(source, "select", value=select, source=f"{source}: {value}")


def _quant_level(t: Translation, level: Any) -> None:
    """0: Conservative; 1: the strategy given (default basic, raysearch's Auto); auto: Auto."""
    chosen = "search_algo" in t.data
    if level == 1:
        if chosen:
            t.notes.append("quant_level: 1: the strategy given")
        else:
            t.move("quant_level", "search_algo", value="Auto", source="quant_level: 1 (basic)")
        return
    if level == 0:
        strategy, written, clash = "Conservative", "0", "0 is the conservative strategy"
    elif level == "auto":
        strategy, written, clash = "Auto", "auto", "auto chooses its own strategy"
    else:
        t.errors.add(ConfigError("quant_level", f"expected 0, 1 or auto, got {level!r}"))
        return
    if chosen:
        also = ", or quant_level: 1" if strategy == "Auto" else ""
        t.errors.add(
            ConfigError(
                "quant_level", f"{clash}; a strategy (search_algo) is given too: keep one{also}"
            )
        )
        return
    t.move("quant_level", "search_algo", value=strategy, source=f"quant_level: {written}")


def _tuning_criterion(t: Translation, criterion: Any) -> None:
    where = "tuning_criterion"
    if not isinstance(criterion, Mapping):
        t.errors.add(ConfigError(where, f"expected a mapping, got {criterion!r}"))
        return
    for key, value in criterion.items():
        at = f"{where}.{key}"
        if key == "strategy":
            t.data["strategy"] = value
            _strategy(t, t.data.pop("strategy"), at)
        elif key == "max_trials":
            t.move(key, "stop.iteration_limit", value=value, source=at)
        elif key == "timeout" and value == 0 and "tolerance" not in t.data:
            t.errors.add(ConfigError(at, _NO_CRITERION))
        elif key == "timeout" and value == 0:
            # Neural Compressor: 0 stops at the first configuration that meets the criterion.
            t.move(key, "stop.find_n_candidates", value=1, source=f"{at}: 0")
        elif key == "timeout":
            t.move(key, "stop.time_limit", value=value, source=at)
        elif key == "objective":
            _objective(t, value, at)
        elif key == "strategy_kwargs" and value is None:
            t.notes.append(f"{at}: None: nothing set")
        elif key in REFUSED:
            t.errors.add(ConfigError(at, REFUSED[key]))
        else:
            t.errors.add(ConfigError(at, "unknown key (strategy, timeout, max_trials)"))


def _accuracy_criterion(t: Translation, accuracy: Any) -> None:
    """``criterion`` and ``tolerable_loss`` (2.x) or 1.x's ``relative:``/``absolute:`` loss."""
    where = "accuracy_criterion"
    if not isinstance(accuracy, Mapping):
        t.errors.add(ConfigError(where, f"expected a mapping, got {accuracy!r}"))
        return
    accuracy = dict(accuracy)
    mode = accuracy.pop("criterion", None)
    for written in ("relative", "absolute"):
        if written in accuracy:
            if mode is not None or "tolerable_loss" in accuracy:
                t.errors.add(ConfigError(f"{where}.{written}", "given with criterion: keep one"))
                return
            mode, accuracy["tolerable_loss"] = written, accuracy.pop(written)
    if mode is not None:
        t.move("criterion", "tolerance_mode", value=mode, source=f"{where}.criterion")
    if "tolerable_loss" in accuracy:
        loss = accuracy.pop("tolerable_loss")
        t.move("tolerable_loss", "tolerance", value=loss, source=f"{where}.tolerable_loss")
    if "higher_is_better" in accuracy:
        hib = accuracy.pop("higher_is_better")
        t.move("hib", "higher_is_better", value=hib, source=f"{where}.higher_is_better")
    for key in accuracy:
        t.errors.add(
            ConfigError(
                f"{where}.{key}", "unknown key (criterion, tolerable_loss, higher_is_better)"
            )
        )
