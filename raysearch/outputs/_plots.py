"""``plots/``: the metric per trial (with the best-so-far and the candidate bound) and, from
:data:`MIN_IMPORTANCE_TRIALS` scored trials on (as ``report.html``), each parameter's
importance over them (:mod:`raysearch.outputs._importance`: Optuna's PED-ANOVA, which needs no
extra package; a trial stopped at a rung counts with its score over the rows it reached), the
trials behind it in its title.

Example:
    >>> write_plots(rows, out, config, float_metric=None, summary=summary)   # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysearch.fileio import replacing
from raysearch.layout import IMPORTANCE_PLOT, METRIC_PLOT, PLOTS
from raysearch.outputs._importance import (
    MIN_IMPORTANCE_TRIALS,
    param_importances,
    scored,
    stopped_count,
    trials_text,
)
from raysearch.ranking import finite, is_candidate
from raysearch.trialrecord import TrialRecord

if TYPE_CHECKING:
    from raysearch.config import SearchConfig

__all__ = ["write_plots"]

_logger = logging.getLogger("raysearch.outputs")


def _save_figure(fig: Any, path: Path) -> None:
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")


def _plot_metric(
    rows: list[TrialRecord],
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
        metric = finite(record.metric)
        if metric is None or record.status != "ok":
            continue
        stopped = record.stopped_at_rung is not None
        kind = (
            "stopped at a rung (metric over some rows)"
            if stopped
            else "candidate"
            if is_candidate(record)
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
        failed = sum(1 for r in rows if r.status != "ok")
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


def _plot_importance(
    importances: Mapping[str, float], path: Path, metric_name: str, trials: str
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
        ax.set_title(f"parameter importance for {metric_name}\n({trials})", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        _save_figure(fig, path)
    finally:
        plt.close(fig)


def write_plots(
    rows: list[TrialRecord],
    out: Path,
    config: SearchConfig,
    float_metric: float | None,
    summary: dict[str, Any],
) -> None:
    """Write ``plots/`` for ``rows`` (in start order); ``summary`` gets ``param_importance``,
    ``param_importance_trials`` (the trials behind it: complete, and stopped at a rung with
    their score over the rows they reached) and ``param_importance_stopped`` (how many of
    those were stopped), from :data:`MIN_IMPORTANCE_TRIALS` such trials on (below,
    ``param_importance`` is None: a ranking of a few trials is mostly noise). A plot that
    fails is logged, never raised: the summary must still be written."""
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
        n_scored = len(scored(rows))
        summary["param_importance_trials"] = n_scored
        summary["param_importance_stopped"] = stopped_count(rows)
        summary["param_importance"] = None
        if n_scored >= MIN_IMPORTANCE_TRIALS:
            importances = param_importances(rows, higher)
            summary["param_importance"] = importances or None
            if importances:
                path = out / PLOTS / IMPORTANCE_PLOT
                _plot_importance(importances, path, config.metric, trials_text(rows))
    except Exception:
        _logger.exception("writing plots/ failed")
