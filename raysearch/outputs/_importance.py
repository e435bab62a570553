"""Parameter importance (``summary.json``'s ``param_importance``, the plot and the report's
figure): Optuna's PED-ANOVA over the trials that scored. A trial stopped at a rung counts with
its score over the rows it reached: early stopping stops the settings that show what hurts.

Example:
    >>> rows = [TrialRecord(status="ok", metric=0.9, params={"a": 1}),
    ...         TrialRecord(status="ok", metric=0.1, stopped_at_rung=0, params={"a": 2}),
    ...         TrialRecord(status="failed", params={"a": 3})]
    >>> len(scored(rows)), stopped_count(rows)
    (2, 1)
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Sequence
from typing import Any

from raysearch.ranking import finite, is_probe
from raysearch.space.space import json_default
from raysearch.trialrecord import TrialRecord

__all__ = ["MIN_IMPORTANCE_TRIALS", "scored", "stopped_count", "param_importances", "trials_text"]

_logger = logging.getLogger("raysearch.outputs")

#: Importances are shown from this many scored trials on (PED-ANOVA's top tenth is a trial).
MIN_IMPORTANCE_TRIALS = 10
#: A number that took at most this many values is a choice, not a range (the Parzen estimator
#: of a range peaks on a value every top trial shares and dwarfs every categorical).
_FEW_VALUES = 10
#: The fewest trials PED-ANOVA's top quantile should hold (Optuna's evaluator advises 5).
TOP_TRIALS = 5


def scored(rows: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The trials with a metric, complete or stopped at a rung; not the sensitivity probes
    (they score best by what they leave float).

    Example:
        >>> len(scored([TrialRecord(status="ok", metric=0.1, stage="sensitivity")]))
        0
    """
    return [
        r for r in rows if r.status == "ok" and finite(r.metric) is not None and not is_probe(r)
    ]


def stopped_count(rows: Sequence[TrialRecord]) -> int:
    """How many of the :func:`scored` trials were stopped at a rung."""
    return sum(r.stopped_at_rung is not None for r in scored(rows))


def trials_text(rows: Sequence[TrialRecord]) -> str:
    """The trials behind the importances, in words.

    Example:
        >>> trials_text([TrialRecord(status="ok", metric=1.0)] * 3)
        '3 complete trials'
        >>> trials_text([TrialRecord(status="ok", metric=1.0, stopped_at_rung=r) for r in
        ...              (None, None, 0)])
        '3 trials: 2 complete, 1 stopped at a rung with its score over the rows it reached'
    """
    n, stopped = len(scored(rows)), stopped_count(rows)
    if not stopped:
        return f"{n} complete trials"
    its = "its score over the rows it" if stopped == 1 else "their scores over the rows they"
    return f"{n} trials: {n - stopped} complete, {stopped} stopped at a rung with {its} reached"


def _encodings(ok: Sequence[TrialRecord]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each parameter that takes more than one value: its Optuna distribution and how a value
    is written into it (a number of over :data:`_FEW_VALUES` values as a float range, anything
    else as its JSON text among the choices seen)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    names = dict.fromkeys(name for r in ok for name in r.params or {})
    distributions: dict[str, Any] = {}
    encode: dict[str, Any] = {}
    for name in names:
        values = [(r.params or {}).get(name) for r in ok if name in (r.params or {})]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if numeric and len({float(v) for v in values}) > _FEW_VALUES:
            distributions[name] = FloatDistribution(min(values), max(values))
            encode[name] = float
        else:
            labels = sorted({json.dumps(v, sort_keys=True, default=json_default) for v in values})
            if len(labels) < 2:
                continue  # a fixed setting explains nothing
            distributions[name] = CategoricalDistribution(labels)
            encode[name] = lambda v: json.dumps(v, sort_keys=True, default=json_default)
    return distributions, encode


def importance_study(rows: Sequence[TrialRecord], higher: bool) -> Any:
    """An in-memory Optuna study with one complete trial per :func:`scored` row (its metric
    the value), over the parameters that vary; None when none varies."""
    import optuna

    ok = scored(rows)
    distributions, encode = _encodings(ok)
    if not distributions:
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize" if higher else "minimize")
    for r in ok:
        params = {n: encode[n](v) for n, v in (r.params or {}).items() if n in encode}
        study.add_trial(
            optuna.trial.create_trial(
                params=params,
                distributions={n: distributions[n] for n in params},
                value=float(r.metric),
            )
        )
    return study


def target_quantile(n_trials: int) -> float:
    """PED-ANOVA's top quantile for ``n_trials``: its default tenth, widened to hold
    :data:`TOP_TRIALS` trials (at most half).

    Example:
        >>> target_quantile(100), target_quantile(24), target_quantile(10)
        (0.1, 0.20833333333333334, 0.5)
    """
    return min(0.5, max(0.1, TOP_TRIALS / max(1, n_trials)))


def param_importances(rows: Sequence[TrialRecord], higher: bool) -> dict[str, float]:
    """Optuna's PED-ANOVA importance of each parameter over the :func:`scored` trials,
    normalised to sum to 1, highest first (empty: no parameter varies)."""
    import optuna

    study = importance_study(rows, higher)
    if study is None:
        return {}
    evaluator = optuna.importance.PedAnovaImportanceEvaluator(
        target_quantile=target_quantile(len(study.trials))
    )
    importances: dict[str, float] = {}
    # Conditional parameters exist in some trials only: score each with the trials having it.
    for name in dict.fromkeys(n for t in study.trials for n in t.distributions):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                warnings.simplefilter("ignore", UserWarning)  # "few trials" notes
                value = optuna.importance.get_param_importances(
                    study, evaluator=evaluator, params=[name], normalize=False
                )
        except (ValueError, RuntimeError) as exc:
            _logger.debug("importance of %s: %s", name, exc)
            continue
        importances[name] = float(value.get(name, 0.0))
    total = sum(importances.values())
    if total > 0:
        importances = {k: v / total for k, v in importances.items()}
    return dict(sorted(importances.items(), key=lambda kv: (-kv[1], kv[0])))
