"""``plots/``: the metric per trial (with the best-so-far and the candidate bound) and, from
:data:`MIN_IMPORTANCE_TRIALS` scored trials on, each parameter's importance over them
(:mod:`raysearch.outputs._importance`), the trials behind it in its title.

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
from raysearch.outputs import _plot_render
from raysearch.outputs._importance import (
    MIN_IMPORTANCE_TRIALS,
    param_importances,
    scored,
    stopped_count,
    trials_text,
)
from raysearch.outputs._study import tolerance_bound
from raysearch.ranking import finite, is_candidate
from raysearch.trialrecord import TrialRecord

if TYPE_CHECKING:
    from raysearch.config import SearchConfig

__all__ = ["write_plots", "plot_job", "write_pngs"]

_logger = logging.getLogger("raysearch.outputs")


def _save_figure(fig: Any, path: Path) -> None:
    _write_png(path, _plot_render.png(fig))


def _write_png(path: Path, data: bytes) -> None:
    """``data`` written to ``path``, moved into place whole."""
    with replacing(path) as tmp:
        tmp.write_bytes(data)


def _metric_spec(
    rows: list[TrialRecord],
    metric_name: str,
    tolerance: float | None,
    higher: bool,
    float_metric: float | None,
    tolerance_mode: str = "absolute",
) -> dict[str, Any]:
    """The metric per trial as :func:`~raysearch.outputs._plot_render.figure` draws it: each
    kind of trial in its own colour, the best so far, the candidate bound and the float
    model's metric."""
    kinds: dict[str, tuple[str, list[int], list[float]]] = {
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
    failed = sum(1 for r in rows if r.status != "ok")
    return {
        "kind": "metric",
        "points": [(label, color, xs, ys) for label, (color, xs, ys) in kinds.items()],
        "best_x": best_x,
        "best_y": best_y,
        "bound": tolerance_bound(
            {
                "tolerance": tolerance,
                "tolerance_mode": tolerance_mode,
                "float_metric": float_metric,
                "higher_is_better": higher,
            }
        ),
        "float_metric": float_metric,
        "ylabel": f"{metric_name} ({'higher' if higher else 'lower'} is better)",
        "title": f"{metric_name} per trial ({len(rows)} trials, {failed} failed)",
    }


def _write_figure(spec: Mapping[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = _plot_render.figure(spec)
    try:
        _save_figure(fig, path)
    finally:
        plt.close(fig)


def _importance_spec(
    importances: Mapping[str, float], metric_name: str, trials: str
) -> dict[str, Any]:
    names = list(importances)[::-1]  # a horizontal bar chart lists bottom-up
    return {
        "kind": "importance",
        "names": names,
        "values": [importances[n] for n in names],
        "title": f"parameter importance for {metric_name}\n({trials})",
    }


def plot_job(
    rows: list[TrialRecord],
    config: SearchConfig,
    float_metric: float | None,
    summary: dict[str, Any],
) -> dict[str, dict[str, Any]]:
    """What ``plots/`` draws for ``rows`` (in start order): each file's figure as plain data
    (:func:`~raysearch.outputs._plot_render.figure`'s spec), by its name. ``summary`` gets
    ``param_importance`` (from :data:`MIN_IMPORTANCE_TRIALS` scored trials on, else None),
    ``param_importance_trials`` and ``param_importance_stopped``."""
    higher = config.metric_higher_is_better
    specs = {
        METRIC_PLOT: _metric_spec(
            rows, config.metric, config.tolerance, higher, float_metric, config.tolerance_mode
        )
    }
    n_scored = len(scored(rows))
    summary["param_importance_trials"] = n_scored
    summary["param_importance_stopped"] = stopped_count(rows)
    summary["param_importance"] = None
    if n_scored >= MIN_IMPORTANCE_TRIALS:
        importances = param_importances(rows, higher)
        summary["param_importance"] = importances or None
        if importances:
            specs[IMPORTANCE_PLOT] = _importance_spec(importances, config.metric, trials_text(rows))
    return specs


def write_pngs(out: Path, pngs: Mapping[str, bytes]) -> None:
    """Write each PNG of ``pngs`` (by file name) into ``out``'s ``plots/``, moved into place
    whole."""
    for name, data in pngs.items():
        _write_png(out / PLOTS / name, data)


def write_plots(
    rows: list[TrialRecord],
    out: Path,
    config: SearchConfig,
    float_metric: float | None,
    summary: dict[str, Any],
) -> None:
    """Write ``plots/`` for ``rows`` (in start order), drawn here; ``summary`` gets the
    importance fields :func:`plot_job` says. A plot that fails is logged, never raised: the
    summary must still be written."""
    try:
        for name, spec in plot_job(rows, config, float_metric, summary).items():
            _write_figure(spec, out / PLOTS / name)
    except Exception:
        _logger.exception("writing plots/ failed")
