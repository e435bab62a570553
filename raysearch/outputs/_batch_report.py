"""``batch_report.html``: the models of a batch on one page in the batch's folder: a
sortable, filterable row per model linking to its ``report.html``, and the batch's timeline
(plotly.js loaded from :data:`~raysearch.outputs._report.PLOTLY_JS` beside the page).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from raysearch.layout import REPORT, SUMMARY
from raysearch.metrics import METRICS
from raysearch.outputs._report import PLOTLY_JS, _cell, _esc, _figure_html, write_page
from raysearch.outputs._report_page import page_head
from raysearch.outputs._study import Figure
from raysearch.outputs._values import human_bytes, setting_text, show
from raysearch.ranking import finite

__all__ = ["write_batch_report", "build_batch_report", "float_model_metric"]


BATCH_REPORT = "batch_report.html"

#: The models table's columns after the model's name: (header, key of the row, numeric).
_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("status", "status", False),
    ("float metric", "float_metric", True),
    ("best metric", "best_metric", True),
    ("drop", "drop", True),
    ("latency (ms)", "latency", False),
    ("latency vs float", "latency_ratio", True),
    ("size", "size", False),
    ("size vs float", "size_ratio", True),
    ("candidates", "n_candidates", True),
    ("trials", "n_trials", True),
    ("failures", "n_failed", True),
    ("wall time (s)", "wall_time_s", True),
    ("stop reason", "stop_reason", False),
    ("best setting / error", "detail", False),
)


def _ratio(mine: Any, theirs: Any) -> float | None:
    mine, theirs = finite(mine), finite(theirs)
    if mine is None or theirs is None or theirs <= 0:
        return None
    return mine / theirs


def float_model_metric(summary: Mapping[str, Any]) -> float | None:
    """The float model's metric of a search (its ``summary.json``): its custom evaluator's
    score, or a built-in metric's best (its value against itself); None for perplexity.

    Example:
        >>> float_model_metric({"metric": "cos", "float_metric": None})
        1.0
        >>> float_model_metric({"metric": "perplexity"}), float_model_metric({"metric": "L2"})
        (None, 0.0)
    """
    value = finite(summary.get("float_metric"))
    builtin = METRICS.get(str(summary.get("metric")))
    if value is None and builtin is not None and not builtin.needs_input_ids:
        value = float(builtin.best)
    return value


def _float_metric(row: Mapping[str, Any], summary: Mapping[str, Any]) -> float | None:
    """The float model's metric: the batch row's, else its search's (a row without it)."""
    value = finite(row.get("float_metric"))
    return float_model_metric(summary) if value is None and summary else value


def _model(row: Mapping[str, Any], summary: Mapping[str, Any]) -> dict[str, Any]:
    """The table's values for one model: its batch row and its search's summary."""
    model = dict(row)
    float_metric, best = _float_metric(row, summary), finite(row.get("best_metric"))
    model["float_metric"] = float_metric
    drop = None
    if float_metric is not None and best is not None:
        drop = float_metric - best if summary.get("higher_is_better") else best - float_metric
    model["drop"] = drop
    mine, theirs = summary.get("best_latency_ms"), summary.get("float_latency_ms")
    model["latency"] = f"{show(mine)} / {show(theirs)}" if mine is not None else ""
    model["latency_ratio"] = _ratio(mine, theirs)
    mine, theirs = summary.get("best_model_size_bytes"), summary.get("float_model_size_bytes")
    model["size"] = f"{human_bytes(mine)} / {human_bytes(theirs)}" if mine is not None else ""
    model["size_ratio"] = _ratio(mine, theirs)
    if row.get("status") == "failed":
        model["detail"] = row.get("error") or ""
    else:
        params = summary.get("best_params")
        model["detail"] = "" if params is None else setting_text(params)
    return model


def _name_cell(name: str, out: Path) -> str:
    """The model's name, a relative link to its ``report.html`` when that file is there."""
    if (out / name / REPORT).is_file():
        return f'<td><a href="{_esc(name)}/{REPORT}">{_esc(name)}</a></td>'
    return f"<td>{_esc(name)}</td>"


def _models_table(models: Sequence[Mapping[str, Any]], out: Path) -> str:
    head = '<th data-type="text">model</th>' + "".join(
        f'<th data-type="{"num" if numeric else "text"}">{_esc(title)}</th>'
        for title, _, numeric in _COLUMNS
    )
    body = []
    for m in models:
        cells = _name_cell(str(m.get("name")), out)
        cells += "".join(_cell(m.get(key), numeric) for _, key, numeric in _COLUMNS)
        kind = "failed" if m.get("status") == "failed" else "ok"
        body.append(f'<tr class="{kind}">{cells}</tr>')
    return (
        '<p><input id="trials-filter" type="search" size="40" '
        'placeholder="filter: words every shown row holds"> <span id="trials-count"></span> '
        "(click a column's header to sort; a model's name opens its report)</p>\n"
        '<div class="tablebox"><table id="trials" data-noun="models"><thead><tr>'
        f"{head}</tr></thead>\n<tbody>\n{chr(10).join(body)}\n</tbody></table></div>\n"
    )


def _timeline(spans: Mapping[str, tuple[float, float]]) -> str:
    """A plotly bar per model from its search's start to its end, from the batch's first."""
    import plotly.graph_objects as go

    if not spans:
        return "<p>No model's search ran: nothing to chart.</p>\n"
    origin = min(start for start, _ in spans.values())
    names = sorted(spans, key=lambda n: spans[n][0])
    fig = go.Figure(
        go.Bar(
            y=names,
            x=[spans[n][1] - spans[n][0] for n in names],
            base=[spans[n][0] - origin for n in names],
            orientation="h",
            hovertemplate="%{y}: %{base:.1f} s to %{x:.1f} s later<extra></extra>",
        )
    )
    fig.update_layout(
        xaxis_title="seconds from the batch's first search start",
        yaxis={"autorange": "reversed"},
        height=max(250, 60 + 28 * len(names)),
    )
    caption = "When each model's search ran (from its start to its end, as this batch saw it)."
    return _figure_html(Figure("timeline", "Timeline", caption, fig))


def _summary(out: Path, name: str) -> dict[str, Any]:
    try:
        return json.loads((out / name / SUMMARY).read_text())
    except (OSError, ValueError):
        return {}


def build_batch_report(
    out: Path, rows: Sequence[Mapping[str, Any]], spans: Mapping[str, tuple[float, float]]
) -> str:
    """The page's HTML for the batch in ``out``: ``rows`` (one per model), ``spans`` (each
    model's search start and end, seconds since the epoch)."""
    models = [_model(r, _summary(out, str(r.get("name")))) for r in rows]
    ok = sum(m.get("status") == "ok" for m in models)
    title = f"raysearch batch report: {out.resolve().name}"
    parts = [page_head(title, "", PLOTLY_JS if spans else None), f"<h1>{_esc(title)}</h1>\n"]
    parts.append(
        f"<p>{ok} of {len(models)} models searched successfully. Float metric: the custom "
        "evaluator's score of the float model, or a built-in metric's value for the float "
        "model against itself. Drop: the best metric's loss against the float model's "
        "(positive: worse). Latency (ms) and size: the best model's / the float model's.</p>\n"
    )
    parts.append(f'<h2 id="models">Models ({len(models)})</h2>\n')
    parts.append(_models_table(models, out))
    parts.append('<h2 id="charts">Timeline</h2>\n')
    parts.append(_timeline(spans))
    parts.append("</body>\n</html>\n")
    return "".join(parts)


def write_batch_report(
    out: str | Path,
    rows: Sequence[Mapping[str, Any]],
    spans: Mapping[str, tuple[float, float]],
) -> Path | None:
    """Write :data:`BATCH_REPORT` in the batch's folder ``out`` and return its path (None,
    logged, when it cannot be built); its timeline loads :data:`PLOTLY_JS` beside it."""
    out = Path(out)
    return write_page(out / BATCH_REPORT, lambda: build_batch_report(out, rows, spans))
