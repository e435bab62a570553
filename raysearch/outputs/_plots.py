"""``plots/``: the metric per trial (with the best-so-far and the candidate bound) and, from
:data:`MIN_IMPORTANCE_TRIALS` complete trials on (as ``report.html``), each parameter's
importance over them (Optuna's PED-ANOVA, which needs no extra package), the number of trials
in its title. A trial stopped at a rung has a metric over some rows only: it is no complete
trial.

Example:
    >>> write_plots(rows, out, config, float_metric=None, summary=summary)   # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysearch.fileio import replacing
from raysearch.layout import IMPORTANCE_PLOT, METRIC_PLOT, PLOTS
from raysearch.outputs._study import MIN_IMPORTANCE_TRIALS
from raysearch.ranking import finite
from raysearch.space.space import json_default

if TYPE_CHECKING:
    from raysearch.config import SearchConfig

__all__ = ["write_plots"]

_logger = logging.getLogger("raysearch.outputs")


def _save_figure(fig: Any, path: Path) -> None:
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")


def _plot_metric(
    rows: list[Mapping[str, Any]],
    path: Path,
    metric_name: str,
    tolerance: float | None,
    higher: bool,
    float_metric: float | None,
    tolerance_mode: str = "absolute",
) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    #: Each kind of trial in its own colour, so that the legend shows each colour it uses.
    kinds = {
        "candidate": ("tab:green", [], []),
        "not a candidate": ("tab:blue", [], []),
        "stopped at a rung (metric over some rows)": ("tab:gray", [], []),
    }
    best_x, best_y = [], []
    best = None
    for step, record in enumerate(rows, 1):
        metric = finite(record.get("metric"))
        if metric is None or record.get("status") != "ok":
            continue
        stopped = record.get("stopped_at_rung") is not None
        kind = (
            "stopped at a rung (metric over some rows)"
            if stopped
            else "candidate"
            if record.get("is_candidate")
            else "not a candidate"
        )
        kinds[kind][1].append(step)
        kinds[kind][2].append(metric)
        if stopped:  # its metric is over some of the rows: never the best
            continue
        if best is None or (metric > best if higher else metric < best):
            best = metric
        best_x.append(step)
        best_y.append(best)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    try:
        for label, (color, xs, ys) in kinds.items():
            if xs:
                ax.scatter(xs, ys, color=color, s=18, label=label)
        if best_x:
            ax.step(best_x, best_y, where="post", color="tab:orange", label="best so far")
        line = _threshold(tolerance, tolerance_mode, float_metric, higher)
        if line is not None:
            ax.axhline(line, color="tab:red", linestyle="--", label=f"candidate bound {line:.6g}")
        if float_metric is not None:
            ax.axhline(float_metric, color="black", linestyle=":", label="float model")
        failed = sum(1 for r in rows if r.get("status") != "ok")
        ax.set_xlabel("trial (in start order)")
        ax.set_ylabel(f"{metric_name} ({'higher' if higher else 'lower'} is better)")
        ax.set_title(f"{metric_name} per trial ({len(rows)} trials, {failed} failed)")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
        _save_figure(fig, path)
    finally:
        plt.close(fig)


def _threshold(
    tolerance: float | None, mode: str, float_metric: float | None, higher: bool
) -> float | None:
    """The metric value where candidates begin: the tolerance itself for built-in metrics, the
    float score less the allowed drop for custom ones."""
    if tolerance is None:
        return None
    if float_metric is None:
        return tolerance
    drop = tolerance if mode == "absolute" else tolerance * abs(float_metric)
    return float_metric - drop if higher else float_metric + drop


def _importances(rows: list[Mapping[str, Any]], higher: bool) -> dict[str, float]:
    """Optuna's PED-ANOVA importance of each parameter over the complete trials."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    ok = _complete(rows)
    names: list[str] = []
    for r in ok:
        for name in r.get("params") or {}:
            if name not in names:
                names.append(name)
    distributions: dict[str, Any] = {}
    encode: dict[str, Any] = {}
    for name in names:
        values = [(r.get("params") or {}).get(name) for r in ok if name in (r.get("params") or {})]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if numeric and len({float(v) for v in values}) > 1:
            distributions[name] = FloatDistribution(min(values), max(values))
            encode[name] = float
        else:
            labels = sorted({json.dumps(v, sort_keys=True, default=json_default) for v in values})
            if len(labels) < 2:
                continue  # a fixed setting explains nothing
            distributions[name] = CategoricalDistribution(labels)
            encode[name] = lambda v: json.dumps(v, sort_keys=True, default=json_default)
    if not distributions:
        return {}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize" if higher else "minimize")
    for r in ok:
        params = {n: encode[n](v) for n, v in (r.get("params") or {}).items() if n in encode}
        study.add_trial(
            optuna.trial.create_trial(
                params=params,
                distributions={n: distributions[n] for n in params},
                value=float(r["metric"]),
            )
        )
    evaluator = optuna.importance.PedAnovaImportanceEvaluator()
    importances: dict[str, float] = {}
    # Conditional parameters exist in some trials only: score each with the trials having it.
    for name in distributions:
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
    return dict(sorted(importances.items(), key=lambda kv: kv[1], reverse=True))


def _complete(rows: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The trials evaluated on every row with a metric (none stopped at a rung)."""
    return [
        r
        for r in rows
        if r.get("status") == "ok"
        and finite(r.get("metric")) is not None
        and r.get("stopped_at_rung") is None
    ]


def _plot_importance(
    importances: Mapping[str, float], path: Path, metric_name: str, n_trials: int
) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    names = list(importances)[::-1]
    values = [importances[n] for n in names]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(names) + 1.5))
    try:
        ax.barh(names, values, color="tab:blue")
        ax.set_xlabel("importance (PED-ANOVA, normalized)")
        ax.set_title(f"parameter importance for {metric_name} ({n_trials} complete trials)")
        ax.grid(axis="x", alpha=0.3)
        _save_figure(fig, path)
    finally:
        plt.close(fig)


def write_plots(
    rows: list[Mapping[str, Any]],
    out: Path,
    config: SearchConfig,
    float_metric: float | None,
    summary: dict[str, Any],
) -> None:
    """Write ``plots/`` for ``rows`` (in start order); ``summary`` gets ``param_importance``
    and ``param_importance_trials`` (the complete trials behind it) from
    :data:`MIN_IMPORTANCE_TRIALS` complete trials on (below, ``param_importance`` is None: a
    ranking of a few trials is mostly noise). A plot that fails is logged, never raised: the
    summary must still be written."""
    higher = config.metric_higher_is_better
    try:
        _plot_metric(
            rows,
            out / PLOTS / METRIC_PLOT,
            config.metric,
            config.tolerance,
            higher,
            float_metric,
            config.tolerance_mode,
        )
        n_complete = len(_complete(rows))
        summary["param_importance_trials"] = n_complete
        summary["param_importance"] = None
        if n_complete >= MIN_IMPORTANCE_TRIALS:
            importances = _importances(rows, higher)
            summary["param_importance"] = importances or None
            if importances:
                path = out / PLOTS / IMPORTANCE_PLOT
                _plot_importance(importances, path, config.metric, n_complete)
    except Exception:
        _logger.exception("writing plots/ failed")
