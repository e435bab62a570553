""":class:`Evaluator` scores a quantized model and decides whether it is a candidate: a
built-in metric's tolerance bounds the metric; a custom one's bounds the drop from the float
score, ``absolute`` or ``relative``, measured in the worse direction.
"""

from __future__ import annotations

import inspect
import math
import os
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from raysearch.errors import ConfigError, EvaluatorError, canonical_name, suggest
from raysearch.evaluate._reference import FloatReference
from raysearch.metrics import (
    BUILTIN_METRICS,
    LISTED,
    METRICS,
    MetricError,
    canonical_metric,
    compute_metric,
    lm_scores,
)
from raysearch.modelgraph import quantizes_nothing
from raysearch.usercode import qualified_name

__all__ = ["Score", "Evaluator"]


@dataclass(frozen=True)
class _PickledFunction:
    """A function given from Python, as :func:`pickle_for_trials` pickled it."""

    data: bytes


@dataclass(frozen=True)
class _NamedFunction:
    """A custom evaluator named by import path (``module:function``), as it is pickled."""

    spec: str


@dataclass
class Score:
    """A model's main metric and any extra numbers the evaluator returned."""

    metric: float
    extra: dict[str, float] = field(default_factory=dict)


class Evaluator:
    """Scores a quantized model and decides whether it is a candidate; ``metric``: a built-in
    name, a callable or ``"package.module:function"``.

    Example:
        >>> ev = Evaluator("L2", tolerance=0.01)
        >>> ev.is_candidate(0.005), ev.better(0.004, 0.005)
        (True, True)
    """

    def __init__(
        self,
        metric: str | Callable[..., Any] = "L2",
        tolerance: float | None = None,
        tolerance_mode: str = "absolute",
        higher_is_better: bool | None = None,
        metric_key: str | None = None,
        search_dirs: Sequence[str | os.PathLike] = (),
    ) -> None:
        mode = canonical_name(tolerance_mode, ("absolute", "relative"))
        if mode is None:
            raise ConfigError(
                "tolerance_mode", f"expected absolute or relative, got {tolerance_mode!r}"
            )
        self.tolerance = None if tolerance is None else float(tolerance)
        self.tolerance_mode = mode
        self.metric_key = metric_key
        if isinstance(metric, str):
            metric = canonical_metric(metric) or metric
        if isinstance(metric, str) and metric in BUILTIN_METRICS:
            if higher_is_better is not None and higher_is_better != BUILTIN_METRICS[metric]:
                raise ConfigError(
                    "higher_is_better",
                    f"{metric} is {'higher' if BUILTIN_METRICS[metric] else 'lower'}-is-better by "
                    "definition",
                )
            self.name = metric
            self.function: Callable[..., Any] | None = None
            self.takes_providers = True
            self.higher_is_better = BUILTIN_METRICS[metric]
        else:
            if isinstance(metric, str) and ":" not in metric:
                raise ConfigError(
                    "metric",
                    f"unknown metric {metric!r}; expected {LISTED} or "
                    "'package.module:function'" + suggest(metric, BUILTIN_METRICS),
                )
            from raysearch.evaluate._custom import load_custom_evaluator, takes_providers

            self.function = load_custom_evaluator(metric, search_dirs=search_dirs)
            #: False for Quark's ``fn(onnx_path, **args)``: called with the path alone.
            self.takes_providers = takes_providers(self.function)
            self.name = metric if isinstance(metric, str) else qualified_name(metric)
            self.higher_is_better = True if higher_is_better is None else bool(higher_is_better)
        #: A function given from Python (not by import path): pickled by value for the trials.
        self.given_function = self.function is not None and not isinstance(metric, str)
        #: Where a function named by import path was looked for: a trial worker looks there too.
        self.search_dirs = tuple(os.fspath(folder) for folder in search_dirs)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if state.get("given_function"):
            from raysearch.evaluate._custom import pickle_for_trials

            state["function"] = _PickledFunction(pickle_for_trials(self.function))
        elif self.function is not None:
            # By its name: imported where it lives (pickle's import knows no search folder).
            state["function"] = _NamedFunction(self.name)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        function = state.get("function")
        if isinstance(function, _PickledFunction):
            state["function"] = pickle.loads(function.data)  # noqa: S301 - pickled by us
        elif isinstance(function, _NamedFunction):
            from raysearch.evaluate._custom import load_custom_evaluator
            from raysearch.usercode import where_code_lives

            folders = where_code_lives(state["search_dirs"])
            state["function"] = load_custom_evaluator(function.spec, search_dirs=folders)
        self.__dict__.update(state)

    @classmethod
    def from_config(cls, config: Any) -> Evaluator:
        """Build from a :class:`raysearch.config.SearchConfig`'s metric settings."""
        return cls(
            getattr(config, "metric_function", None) or config.metric,
            config.tolerance,
            getattr(config, "tolerance_mode", "absolute"),
            getattr(config, "higher_is_better", None),
            getattr(config, "metric_key", None),
            getattr(config, "code_dirs", ()),
        )

    @property
    def is_custom(self) -> bool:
        return self.function is not None

    @property
    def accepts_fraction(self) -> bool:
        """Whether the custom evaluator takes ``fraction`` (early stopping's first
        ``f`` of rows).
        """
        if self.function is None:
            return False
        try:
            parameter = inspect.signature(self.function).parameters.get("fraction")
        except (TypeError, ValueError):
            return False
        return parameter is not None and parameter.kind not in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
            inspect.Parameter.POSITIONAL_ONLY,
        )

    @property
    def is_lm(self) -> bool:
        """A language-model metric, whose trials also time a decode step and a prefill."""
        metric = METRICS.get(self.name) if self.function is None else None
        return metric is not None and metric.lm

    @property
    def needs_reference(self) -> bool:
        """Built-in metrics compare against the float model's outputs."""
        return not self.is_custom

    def score(
        self,
        model_path: str | os.PathLike | None = None,
        *,
        outputs: Mapping[str, np.ndarray] | None = None,
        reference: FloatReference | Mapping[str, np.ndarray] | None = None,
        providers: Sequence[Any] | None = None,
        inputs: Mapping[str, np.ndarray] | None = None,
    ) -> Score:
        """Score one model: built-ins from ``outputs`` against ``reference`` (language-model ones
        with the others and intervals as extras); a custom evaluator by calling it.
        """
        if self.function is None:
            if outputs is None or reference is None:
                raise ValueError(f"{self.name} needs the quantized outputs and the float reference")
            ref = reference.outputs if isinstance(reference, FloatReference) else reference
            if METRICS[self.name].lm:
                if METRICS[self.name].needs_input_ids and not (inputs and "input_ids" in inputs):
                    raise MetricError(f"{self.name} reads the next tokens from 'input_ids'")
                extra = lm_scores(outputs, ref, inputs)
                return Score(extra[self.name], extra)
            return Score(compute_metric(self.name, outputs, ref))
        if model_path is None:
            raise ValueError("a custom evaluator needs the model path")
        return self.score_model(model_path, providers)

    def score_model(
        self,
        model_path: str | os.PathLike,
        providers: Sequence[Any] | None = None,
        *,
        fraction: float | None = None,
    ) -> Score:
        """Call the custom evaluator on ``model_path`` (on the first ``fraction`` of its rows)."""
        if self.function is None:
            raise ValueError(f"{self.name} is a built-in metric; use score(outputs=...)")
        providers = list(providers) if providers else ["CPUExecutionProvider"]
        # Quark's search_evaluator(onnx_path, **args) is told the path alone.
        args = (providers,) if self.takes_providers else ()
        if fraction is None:
            value = self.function(os.fspath(model_path), *args)
        else:
            value = self.function(os.fspath(model_path), *args, fraction=fraction)
        return self._read(value)

    def score_float(
        self, model_path: str | os.PathLike, providers: Sequence[Any] | None = None
    ) -> float:
        """The custom evaluator's score of the float model (EvaluatorError when unusable)."""
        try:
            return self.score_model(model_path, providers).metric
        except MetricError as exc:
            raise EvaluatorError(f"evaluator '{self.name}' on the float model: {exc}") from None
        except Exception as exc:
            raise EvaluatorError(
                f"evaluator '{self.name}' failed on the float model: {type(exc).__name__}: {exc}"
            ) from exc

    def _read(self, value: Any) -> Score:
        where = f"evaluator '{self.name}'"
        if isinstance(value, Mapping):
            if not value:
                raise MetricError(f"{where} returned an empty dict")
            if self.metric_key is not None:
                if self.metric_key not in value:
                    raise MetricError(
                        f"{where} returned keys {', '.join(map(str, value))} but not metric_key "
                        f"'{self.metric_key}'" + suggest(self.metric_key, map(str, value))
                    )
                main_key = self.metric_key
            elif "metric" in value:
                main_key = "metric"
            elif len(value) == 1:
                main_key = next(iter(value))
            else:
                raise MetricError(
                    f"{where} returned keys {', '.join(map(str, value))}; set metric_key to name "
                    "the main metric (or return it under 'metric')"
                )
            main = _number(value[main_key], f"{where} key '{main_key}'")
            extra = {}
            for k, v in value.items():
                if k == main_key:
                    continue
                if isinstance(v, (int, float, np.number)) and not isinstance(v, bool):
                    extra[str(k)] = float(v)
            return Score(main, extra)
        return Score(_number(value, where))

    def drop(self, score: float, float_score: float) -> float:
        """How much worse ``score`` is than ``float_score``, per ``tolerance_mode``."""
        diff = (float_score - score) if self.higher_is_better else (score - float_score)
        if self.tolerance_mode == "absolute":
            return diff
        if float_score == 0:
            return 0.0 if diff <= 0 else math.inf
        return diff / abs(float_score)

    def is_candidate(self, score: float | None, float_score: float | None = None) -> bool:
        """Whether ``score`` is within the tolerance (ValueError: custom, without
        ``float_score``).
        """
        if self.tolerance is None or score is None or not math.isfinite(score):
            return False
        # A bound met exactly is met, whatever binary floating point rounds it to.
        slack = _BOUND_SLACK * max(1.0, abs(self.tolerance))
        if not self.is_custom:
            if self.higher_is_better:
                return score >= self.tolerance - slack
            return score <= self.tolerance + slack
        if float_score is None:
            raise ValueError(f"{self.name}: a custom metric needs the float model's score")
        return self.drop(score, float_score) <= self.tolerance + slack

    def threshold(self, float_score: float | None = None) -> float | None:
        """The metric value where candidates begin (None without a tolerance).

        Example:
            >>> Evaluator(lambda p, providers: 0.0, 0.1, "relative").threshold(0.8)
            0.72
        """
        if self.tolerance is None:
            return None
        if not self.is_custom:
            return self.tolerance
        if float_score is None:
            raise ValueError(f"{self.name}: a custom metric needs the float model's score")
        allowed = self.tolerance
        if self.tolerance_mode == "relative":
            allowed *= abs(float_score)
        return float_score - allowed if self.higher_is_better else float_score + allowed

    def missed_by(self, score: float | None, float_score: float | None = None) -> float | None:
        """How far ``score`` falls short of the :meth:`threshold` (0: it meets it; None: unknown).

        Example:
            >>> round(Evaluator("cos", tolerance=0.999).missed_by(0.996), 6)
            0.003
        """
        threshold = self.threshold(float_score)
        if threshold is None or score is None or not math.isfinite(score):
            return None
        if self.is_candidate(score, float_score):
            return 0.0  # within the rounding slack is within the tolerance
        return float(threshold - score if self.higher_is_better else score - threshold)

    def sampler_objective(
        self,
        score: float | None,
        float_score: float | None,
        quantized_share: float | None,
        weighted_nodes: int,
    ) -> float | None:
        """The value a sampler optimises for this trial, in the metric's direction: a candidate's
        metric moved past every non-candidate's by ``scale * quantized_share`` (one more quantized
        node outweighs any metric difference), a non-candidate's metric, and ``scale`` worse for a
        trial that quantizes nothing.

        Example:
            >>> ev = Evaluator("cos", tolerance=0.99)
            >>> ev.sampler_objective(0.995, None, 0.5, 2) > ev.sampler_objective(1.0, None, 0.25, 2)
            True
        """
        if score is None or not math.isfinite(score):
            return None
        reference = abs(float_score) if float_score is not None else 0.0
        scale = (weighted_nodes + 1) * (1.0 + reference + abs(self.tolerance or 0.0))
        if quantizes_nothing(quantized_share, weighted_nodes):
            bonus = -scale
        elif self.is_candidate(score, float_score):
            bonus = scale * (1.0 if quantized_share is None else quantized_share)
        else:
            return float(score)
        return float(score + bonus if self.higher_is_better else score - bonus)

    def better(self, a: float | None, b: float | None) -> bool:
        """Whether score ``a`` is strictly better than ``b`` (a missing score is worst)."""
        if a is None or (isinstance(a, float) and math.isnan(a)):
            return False
        if b is None or (isinstance(b, float) and math.isnan(b)):
            return True
        return a > b if self.higher_is_better else a < b

    def __repr__(self) -> str:
        return (
            f"Evaluator({self.name!r}, tolerance={self.tolerance}, mode={self.tolerance_mode}, "
            f"higher_is_better={self.higher_is_better})"
        )


#: How far past the tolerance a score may be from rounding alone (relative to the tolerance).
_BOUND_SLACK = 1e-9


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        if isinstance(value, np.ndarray) and value.size == 1:
            value = value.item()
        else:
            shown = repr(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise MetricError(
                f"{where} returned {type(value).__name__} {shown}, expected a number or a dict "
                "of numbers"
            )
    result = float(value)
    if math.isnan(result):
        raise MetricError(f"{where} returned NaN")
    return result
