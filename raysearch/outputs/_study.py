"""The report's charts: an Optuna study made in memory from a search's records, and Optuna's
own plotly figures of it (``optuna.visualization``).

Each record is one Optuna trial in start order: complete, pruned (stopped at a rung) or
failed; a value Optuna's distributions cannot hold is its JSON text; the intermediate
values are the metric at each rung (``rung_metrics``).
"""

from __future__ import annotations

import datetime
import json
import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raysearch.outputs._importance import MIN_IMPORTANCE_TRIALS
from raysearch.outputs._study_values import objective_values, study_directions, timed_alone
from raysearch.ranking import finite, is_candidate
from raysearch.space.space import json_default
from raysearch.trialrecord import TrialRecord

__all__ = ["Figure", "study_figures", "warm_up", "export_study", "MIN_IMPORTANCE_TRIALS"]

_logger = logging.getLogger("raysearch.outputs")


@dataclass(frozen=True)
class Figure:
    """One chart of the report: its element id, title, caption and plotly figure."""

    key: str
    title: str
    caption: str
    figure: Any


def _value(value: Any) -> Any:
    """A setting's value as Optuna's distributions hold it (a list or mapping as JSON text)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, sort_keys=True, default=json_default)


def _distributions(rows: Sequence[TrialRecord]) -> dict[str, Any]:
    """One distribution per parameter over every record (:func:`distribution`)."""
    seen: dict[str, list[Any]] = {}
    for r in rows:
        for name, value in (r.params or {}).items():
            seen.setdefault(name, []).append(_value(value))
    return {name: distribution(values) for name, values in seen.items()}


def distribution(values: Sequence[Any]) -> Any:
    """The distribution of a parameter that took ``values``: a range for numbers that take
    more than one value, else the categorical choices seen, in first-seen order."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(numbers) == len(values) and len(set(numbers)) > 1:
        if all(isinstance(v, int) for v in numbers):
            return IntDistribution(min(numbers), max(numbers))
        return FloatDistribution(float(min(numbers)), float(max(numbers)))
    return CategoricalDistribution(list(dict.fromkeys(values)))


def _intermediate(record: TrialRecord) -> dict[int, float]:
    """The metric at each rung the journal kept (``rung_metrics``)."""
    metrics = record.rung_metrics or []
    return {rung: float(m) for rung, m in enumerate(metrics) if finite(m) is not None}


def _when(seconds: Any) -> datetime.datetime | None:
    seconds = finite(seconds)
    return None if seconds is None else datetime.datetime.fromtimestamp(seconds)


def study_trial(
    record: TrialRecord,
    distributions: Mapping[str, Any],
    higher: bool,
    objectives: Sequence[str] = ("metric",),
) -> Any:
    """The Optuna trial of ``record``: with several ``objectives`` its value of each, and a
    non-candidate infeasible, so the study's ``best_trials`` are the candidates' Pareto front."""
    import optuna
    from optuna.trial import TrialState

    metric = finite(record.metric)
    ok = record.status == "ok" and metric is not None
    stopped = record.stopped_at_rung is not None
    state = TrialState.FAIL
    if ok:
        state = TrialState.PRUNED if stopped else TrialState.COMPLETE
    params = {k: _value(v) for k, v in (record.params or {}).items()}
    several = len(objectives) > 1
    values = None
    if state == TrialState.COMPLETE:
        values = objective_values(record, objectives) if several else [metric]
    trial = optuna.trial.create_trial(
        state=state,
        values=values,
        constraints={"candidate": 0.0 if is_candidate(record) else 1.0} if several else None,
        params=params,
        distributions={k: distributions[k] for k in params},
        user_attrs={
            "trial_id": record.trial_id,
            "is_candidate": is_candidate(record),
            "stage": record.stage,
            "model_size_bytes": record.model_size_bytes,
            "latency_ms": finite(record.latency_ms),
            "error": record.error,
        },
        intermediate_values=_intermediate(record),
    )
    # The trial's own times (the timeline); create_trial stamps "now".
    start, end = _when(record.started_at), _when(record.ended_at)
    if start is not None and end is not None:
        trial.datetime_start, trial.datetime_complete = start, end
    return trial


def build_study(
    rows: Sequence[TrialRecord],
    higher_is_better: bool,
    *,
    storage: Any = None,
    study_name: str | None = None,
    objectives: Sequence[str] = ("metric",),
) -> Any:
    """An Optuna study holding one trial per record (in the order given), in memory or as
    ``study_name`` in ``storage``; one direction per objective."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        storage=storage,
        study_name=study_name,
        directions=study_directions(higher_is_better, objectives),
    )
    distributions = _distributions(rows)
    study.add_trials([study_trial(r, distributions, higher_is_better, objectives) for r in rows])
    return study


def export_study(
    records: Sequence[TrialRecord],
    summary: Mapping[str, Any],
    storage_url: str,
    study_name: str,
    *,
    overwrite: bool = False,
) -> Any:
    """Write the search as the Optuna study ``study_name`` in the storage at ``storage_url``
    (any URL Optuna opens), the study the report charts, for ``optuna-dashboard``; return it.

    Raises:
        InputError: Optuna cannot open ``storage_url``; a study of that name is there already
            (``overwrite``: that study is deleted first, never another).
    """
    import optuna

    from raysearch.errors import InputError
    from raysearch.ranking import order

    storage, names = open_storage(storage_url)
    if study_name in names:
        if not overwrite:
            raise InputError(
                f"{storage_url}: a study named '{study_name}' is there already "
                "(--study-name gives another name, --overwrite replaces it)"
            )
        optuna.delete_study(study_name=study_name, storage=storage)
    higher = bool(summary.get("higher_is_better"))
    objectives = summary.get("objectives") or ("metric",)
    if len(objectives) > 1:  # ranked as pareto.parquet ranks them
        records = timed_alone(records, summary)
    study = build_study(
        order(records), higher, storage=storage, study_name=study_name, objectives=objectives
    )
    describe_study(study, summary)
    return study


def open_storage(storage_url: str) -> tuple[Any, set[str]]:
    """Optuna's storage at ``storage_url`` and the names of the studies it holds.

    Raises:
        InputError: Optuna cannot open it.
    """
    import optuna

    from raysearch.errors import InputError

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        storage = optuna.storages.get_storage(storage_url)
        names = set(optuna.study.get_all_study_names(storage))
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"{storage_url}: Optuna cannot open this storage ({reason})") from exc
    return storage, names


def describe_study(study: Any, summary: Mapping[str, Any]) -> None:
    """The study's objective names and the summary's metric, direction, tolerance, float
    metric and stop reason as its user attributes."""
    metric = str(summary.get("metric") or "metric").rsplit(":", 1)[-1]
    objectives = list(summary.get("objectives") or ["metric"])
    if len(objectives) != len(study.directions):  # a study written before its objectives
        objectives = ["metric"]
    names = [metric if name == "metric" else name for name in objectives]
    _quiet(lambda: study.set_metric_names(names))
    for key in ("metric", "higher_is_better", "tolerance", "tolerance_mode", "float_metric"):
        if summary.get(key) is not None:
            study.set_user_attr(key, summary[key])
    study.set_user_attr("stop_reason", summary.get("stop_reason"))


def default_study_name(folder: Any, key: str) -> str:
    """The study a search is written as unless named: its folder's name and the first 8
    characters of its ``search_id`` (none when the id is the folder's path).

    Example:
        >>> default_study_name("/runs/magika", "3f2a9c01d4e5"), default_study_name("/x/a", "/x/a")
        ('magika-3f2a9c01', 'a')
    """
    from pathlib import Path

    name = Path(folder).resolve().name
    return name + (f"-{key[:8]}" if key != str(folder) else "")


def _pareto_axes(objectives: Sequence[str] = ()) -> list[str]:
    """The record keys set against the metric on the Pareto figure: the ``objectives``
    first, then the model's size and latency.

    Example:
        >>> _pareto_axes(["metric", "model_size_mb", "decode_latency_ms"])
        ['model_size_bytes', 'decode_latency_ms', 'latency_ms']
        >>> _pareto_axes()
        ['model_size_bytes', 'latency_ms']
    """
    named = ["model_size_bytes" if o == "model_size_mb" else o for o in objectives]
    return list(
        dict.fromkeys(k for k in [*named, "model_size_bytes", "latency_ms"] if k != "metric")
    )


def _pareto_study(
    rows: Sequence[TrialRecord], higher: bool, objectives: Sequence[str] = ()
) -> tuple[Any, list[str]]:
    """The complete trials as a study of the metric against up to two figures of
    :func:`_pareto_axes` whose values differ; None when only the metric varies."""
    import optuna

    complete = [
        r
        for r in rows
        if r.status == "ok" and r.stopped_at_rung is None and finite(r.metric) is not None
    ]
    names = ["metric"]
    axes = _pareto_axes(objectives)
    if any(finite(r.decode_latency_ms) is not None for r in complete):
        # a language model: the decode step is what its users wait on, not a batch
        axes = list(dict.fromkeys(a if a != "latency_ms" else "decode_latency_ms" for a in axes))
    for key in axes:
        values = [finite(getattr(r, key)) for r in complete]
        if all(v is not None for v in values) and len(set(values)) > 1 and len(names) < 3:
            names.append(key)
    if len(names) < 2 or len(complete) < 2:
        return None, names
    directions = ["maximize" if higher else "minimize"] + ["minimize"] * (len(names) - 1)
    study = optuna.create_study(directions=directions)
    for r in complete:
        study.add_trial(
            optuna.trial.create_trial(
                values=[float(getattr(r, n)) for n in names],
                user_attrs={"trial_id": r.trial_id},
            )
        )
    return study, names


def _mark_history(fig: Any, study: Any, summary: Mapping[str, Any], bound: float | None) -> None:
    """The candidates (stars) and the tolerance's bound (a line) on Optuna's history figure."""
    import plotly.graph_objects as go

    candidates = [t for t in study.trials if t.user_attrs.get("is_candidate")]
    if candidates:
        fig.add_trace(
            go.Scatter(
                x=[t.number for t in candidates],
                y=[t.value for t in candidates],
                mode="markers",
                name="candidate",
                marker={"symbol": "star", "size": 12, "color": "#2ca02c"},
            )
        )
    if bound is not None:
        fig.add_hline(
            y=bound,
            line_dash="dash",
            line_color="#d62728",
            annotation_text=f"tolerance bound {bound:.6g}",
        )


def tolerance_bound(summary: Mapping[str, Any]) -> float | None:
    """Where the candidates begin: the tolerance of a built-in metric, the float model's score
    less the allowed drop for a custom one."""
    tolerance = finite(summary.get("tolerance"))
    if tolerance is None:
        return None
    mode = summary.get("tolerance_mode")
    float_metric = finite(summary.get("float_metric"))
    if mode is None or float_metric is None:
        return tolerance
    drop = tolerance if mode == "absolute" else tolerance * abs(float_metric)
    return float_metric - drop if summary.get("higher_is_better") else float_metric + drop


def _quiet(make: Callable[[], Any]) -> Any:
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", UserWarning)  # "few trials" notes
        return make()


def _importances(
    rows: Sequence[TrialRecord],
    higher: bool,
    metric: str,
    known: Mapping[str, float] | None = None,
) -> Figure | None:
    """The importances ``summary.json`` holds (else computed here) as a bar chart, from
    :data:`MIN_IMPORTANCE_TRIALS` scored trials on."""
    import plotly.graph_objects as go

    from raysearch.outputs._importance import param_importances, scored, trials_text

    if len(scored(rows)) < MIN_IMPORTANCE_TRIALS:
        return None
    importances = dict(known) if known else param_importances(rows, higher)
    if not importances:
        return None
    names = list(importances)[::-1]
    fig = go.Figure(
        go.Bar(
            x=[importances[n] for n in names],
            y=names,
            orientation="h",
            text=[f"{importances[n]:.2f}" for n in names],
            textposition="outside",
        )
    )
    fig.update_layout(
        title=f"Parameter importances ({trials_text(rows)})",
        xaxis_title="importance (PED-ANOVA, normalized)",
    )
    return Figure(
        "importances",
        "Parameter importances",
        f"Optuna's PED-ANOVA importance of each parameter for {metric}, over the "
        f"{trials_text(rows)} (shown from {MIN_IMPORTANCE_TRIALS} such trials on; a parameter "
        "is judged over the trials that have it).",
        fig,
    )


def study_figures(rows: Sequence[TrialRecord], summary: Mapping[str, Any]) -> list[Figure]:
    """The report's Optuna figures for ``rows`` (in start order) that the records can fill; a
    figure that fails is logged and left out."""
    from optuna import visualization as vis
    from optuna.trial import TrialState

    higher = bool(summary.get("higher_is_better"))
    metric = str(summary.get("metric") or "metric").rsplit(":", 1)[-1]
    study = build_study(rows, higher)
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    has_params = any(t.params for t in complete)
    staged = any(t.intermediate_values for t in study.trials)
    specs: list[tuple[str, str, str, Callable[[], Any], bool]] = [
        (
            "history",
            "Optimization history",
            f"{metric} of each complete trial in start order, the best so far, the candidates "
            "(stars) and the tolerance's bound (dashed).",
            lambda: vis.plot_optimization_history(study, target_name=metric),
            bool(complete),
        ),
        (
            "parallel",
            "Parallel coordinates",
            "Each complete trial's settings and metric, one line per trial.",
            lambda: vis.plot_parallel_coordinate(study, target_name=metric),
            has_params,
        ),
        (
            "slice",
            "Slice",
            f"{metric} against each parameter's values.",
            lambda: vis.plot_slice(study, target_name=metric),
            has_params,
        ),
        (
            "timeline",
            "Timeline",
            "When each trial ran (complete, stopped at a rung, failed).",
            lambda: vis.plot_timeline(study),
            bool(study.trials),
        ),
        (
            "intermediate",
            "Intermediate values (early-stopping rungs)",
            f"{metric} at each rung of the evaluation on growing subsets (step: the rung, "
            "0-based); a trial that could still become a candidate was not ranked before its "
            "last rung.",
            lambda: vis.plot_intermediate_values(study),
            staged,
        ),
    ]
    figures: list[Figure] = []
    for key, title, caption, make, wanted in specs:
        if not wanted:
            continue
        try:
            fig = _quiet(make)
            if key == "history":
                _mark_history(fig, study, summary, tolerance_bound(summary))
            figures.append(Figure(key, title, caption, fig))
        except Exception as exc:  # one figure never costs the others
            _logger.warning("report: the %s figure failed: %s", key, exc)
    for build in (
        lambda: _importances(rows, higher, metric, summary.get("param_importance")),
        lambda: _pareto(rows, higher, metric, summary.get("objectives") or ()),
    ):
        try:
            figure = build()
        except Exception as exc:
            _logger.warning("report: a figure failed: %s", exc)
            continue
        if figure is not None:
            figures.insert(1 if figure.key == "importances" else len(figures), figure)
    return figures


def warm_up() -> None:
    """Build the report's figures once for two made-up trials, figures discarded: the first
    figures a process builds load plotly's validators and Optuna's plotting modules (about
    as much work again as the figures themselves), which the report's figures built after
    the last trial then find loaded."""
    rows = [
        TrialRecord(trial_id=str(i), number=i, status="ok", metric=0.5 + i, params={"p": p},
                    settings={"p": p}, started_at=float(i), ended_at=i + 1.0)  # fmt: skip
        for i, p in enumerate(("a", "b"))
    ]
    study_figures(rows, {"higher_is_better": True, "metric": "metric"})


def _pareto(
    rows: Sequence[TrialRecord], higher: bool, metric: str, objectives: Sequence[str] = ()
) -> Figure | None:
    from optuna.visualization import plot_pareto_front

    study, names = _pareto_study(rows, higher, objectives)
    if study is None:
        return None
    labels = {
        "metric": metric,
        "model_size_bytes": "size (bytes)",
        "latency_ms": "latency (ms)",
        "decode_latency_ms": "decode latency (ms)",
        "prefill_latency_ms": "prefill latency (ms)",
    }
    target_names = [labels[n] for n in names[:3]]
    fig = _quiet(lambda: plot_pareto_front(study, target_names=target_names))
    anchors = _mark_anchors(fig, study, rows, names)
    return Figure(
        "pareto",
        "Pareto front",
        f"The complete trials' {', '.join(target_names)}: the trials no other beats on every "
        "one of them form the front."
        + (f" Marked: what one-shot tools write ({'; '.join(anchors)})." if anchors else ""),
        fig,
    )


def _mark_anchors(
    fig: Any, study: Any, rows: Sequence[TrialRecord], names: Sequence[str]
) -> list[str]:
    """The trials whose setting is a one-shot tool's (:func:`raysearch.strategies.anchor_name`)
    as a named trace on the Pareto figure; returns the names marked."""
    import plotly.graph_objects as go

    from raysearch.strategies import anchor_name

    by_id = {r.trial_id: r for r in rows}
    points, labels = [], []
    for trial in study.trials:
        row = by_id.get(trial.user_attrs.get("trial_id"))
        name = None if row is None else anchor_name(row.settings or {})
        if name and name not in labels:
            points.append(trial.values)
            labels.append(name)
    if not points:
        return []
    axes = list(zip(*points))  # Optuna's figure: x, y (and z) are the values in order
    marker = {"symbol": "diamond", "size": 11, "color": "black"}
    common = {"mode": "markers+text", "text": labels, "marker": marker, "name": "one-shot tools"}
    if len(names) > 2:
        trace: Any = go.Scatter3d(x=axes[0], y=axes[1], z=axes[2], **common)
    else:
        trace = go.Scatter(x=axes[0], y=axes[1], textposition="top center", **common)
    fig.add_trace(trace)
    return labels
