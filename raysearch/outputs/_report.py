"""``report.html``: one self-contained page on a search (plotly.js inlined, nothing fetched):
the summary in words, the best setting against the default one, Optuna's figures
(:mod:`raysearch.outputs._study`), the per-tensor sensitivity, a sortable, filterable table
of every trial and the failures grouped by error.
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysearch.fileio import atomic_write_text
from raysearch.layout import REPORT
from raysearch.outputs._default import DefaultSetting, default_setting
from raysearch.outputs._fit import fit_figure, relabel_parallel
from raysearch.outputs._report_page import page_head
from raysearch.outputs._study import Figure, study_figures
from raysearch.outputs._values import NULL_WORDS, human_bytes, setting_value, show
from raysearch.outputs._words import summary_words
from raysearch.ranking import finite, is_candidate, order
from raysearch.trialrecord import TrialRecord

if TYPE_CHECKING:
    from raysearch.config import SearchConfig

__all__ = ["write_report", "build_report", "write_plotly_js", "PLOTLY_JS", "PLOTLY_SRC_ENV"]

_logger = logging.getLogger("raysearch.outputs")

#: The trials table's fixed columns: (header, record key, numeric); the settings follow.
_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("#", "number", True),
    ("trial", "trial_id", False),
    ("stage", "stage", False),
    ("status", "status", False),
    ("metric", "metric", True),
    ("candidate", "is_candidate", False),
    ("latency (ms)", "latency_ms", True),
    ("decode latency (ms)", "decode_latency_ms", True),
    ("prefill latency (ms)", "prefill_latency_ms", True),
    ("size", "model_size_bytes", True),
    ("device", "device", False),
    ("node", "node", False),
    ("duration (s)", "duration_s", True),
    ("rows evaluated (share)", "eval_rows", True),
    ("stopped at rung", "stopped_at_rung", True),
    ("reused from", "reused_from", False),
    ("error", "error", False),
)
#: plotly.js as one file, which the reports of a batch load (written once in the batch's folder).
PLOTLY_JS = "plotly.min.js"
#: plotly.js's path relative to a search's folder, set in its environment by ``raysearch
#: batch``: its report loads it from there.
PLOTLY_SRC_ENV = "RAYSEARCH_REPORT_PLOTLY_SRC"
#: Sensitivity rows shown per ranking (most sensitive first).
_SENSITIVITY_ROWS = 30


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _param_names(rows: Sequence[TrialRecord]) -> list[str]:
    return list(dict.fromkeys(name for r in rows for name in r.params or {}))


def _cell(value: Any, numeric: bool, text: str | None = None) -> str:
    """A cell showing ``text`` (default: ``value`` shown); a number sorts by ``value``."""
    shown = show(value) if text is None else text
    if numeric and isinstance(value, (int, float)) and not isinstance(value, bool):
        number = finite(float(value))
        raw = "" if number is None else repr(number)
        return f'<td class="num" data-v="{raw}">{_esc(shown)}</td>'
    return f"<td>{_esc(shown)}</td>"


def _evaluated(record: TrialRecord, by_rows: bool) -> str:
    """The rows a trial's metric is over: their number and share, or the share alone; sorted
    by the rows when the search counted them (``by_rows``), else by the share."""
    rows, share = record.eval_rows, finite(record.eval_fraction)
    said = f"{share:.0%}" if share is not None else ""
    if isinstance(rows, int) and not isinstance(rows, bool):
        return _cell(rows, True, f"{rows} ({said})" if said else str(rows))
    if share is None:
        return _cell(None, True)
    return _cell(None if by_rows else share, True, said)


#: The key of an interval column: a language-model metric with its 95 % interval.
_INTERVAL = "interval:"


def _interval_columns(rows: Sequence[TrialRecord]) -> list[tuple[str, str, bool]]:
    """A column per language-model metric some record holds, with its 95 % interval."""
    from raysearch.metrics import LM_METRICS

    return [
        (f"{name} [95 % interval]", _INTERVAL + name, True)
        for name in LM_METRICS
        if any(finite(r.extra.get(name)) is not None for r in rows)
    ]


def _interval_cell(record: TrialRecord, name: str) -> str:
    """``value [low, high]``, sorted by the value."""
    extra = record.extra
    value = finite(extra.get(name))
    low, high = finite(extra.get(f"{name}_ci_low")), finite(extra.get(f"{name}_ci_high"))
    if value is None:
        return _cell(None, True)
    bounds = f" [{show(low)}, {show(high)}]" if low is not None and high is not None else ""
    return _cell(value, True, f"{show(value)}{bounds}")


def _record_cell(record: TrialRecord, key: str, numeric: bool, by_rows: bool) -> str:
    if key == "eval_rows":
        return _evaluated(record, by_rows)
    if key.startswith(_INTERVAL):
        return _interval_cell(record, key[len(_INTERVAL) :])
    value = getattr(record, key)
    if key == "model_size_bytes":
        return _cell(value, True, human_bytes(value))
    return _cell(value, numeric)


def _param_cell(record: TrialRecord, name: str) -> str:
    """A setting's value in its meaning; empty for a parameter the trial does not have."""
    params = record.params or {}
    return _cell(None, False, setting_value(name, params[name]) if name in params else "")


def _row_class(record: TrialRecord) -> str:
    if record.status != "ok":
        return "failed"
    if record.stopped_at_rung is not None:
        return "stopped"
    return "candidate" if is_candidate(record) else "ok"


def _header(title: str) -> str:
    """A column's title that wraps after ``_`` and ``.``, not mid-word."""
    return re.sub(r"([_.])", r"\1<wbr>", _esc(title))


def _columns_shown(rows: Sequence[TrialRecord]) -> list[tuple[str, str, bool]]:
    """The fixed columns some record has a value in (an empty column only takes width)."""

    def has(key: str) -> bool:
        keys = (key, "eval_fraction") if key == "eval_rows" else (key,)
        return any(getattr(r, k) is not None for r in rows for k in keys)

    return [c for c in _COLUMNS if c[1] in ("number", "trial_id", "status") or has(c[1])]


def _trials_table(rows: Sequence[TrialRecord]) -> str:
    params = _param_names(rows)
    columns = _columns_shown(rows)
    at = next(i for i, c in enumerate(columns) if c[1] == "status") + 1
    at = next((i + 1 for i, c in enumerate(columns) if c[1] == "metric"), at)
    columns[at:at] = _interval_columns(rows)  # beside the metric
    head = "".join(
        f'<th data-type="{"num" if numeric else "text"}">{_header(title)}</th>'
        for title, _, numeric in columns
    )
    head += "".join(f'<th data-type="text">{_header(name)}</th>' for name in params)
    body = []
    by_rows = any(isinstance(r.eval_rows, int) for r in rows)
    for r in rows:
        cells = "".join(_record_cell(r, key, numeric, by_rows) for _, key, numeric in columns)
        cells += "".join(_param_cell(r, name) for name in params)
        body.append(f'<tr class="{_row_class(r)}">{cells}</tr>')
    return (
        '<p><input id="trials-filter" type="search" size="40" '
        'placeholder="filter: words every shown row holds"> <span id="trials-count"></span> '
        "(click a column's header to sort)</p>\n"
        f'<div class="tablebox"><table id="trials"><thead><tr>{head}</tr></thead>\n'
        f"<tbody>\n{chr(10).join(body)}\n</tbody></table></div>\n"
    )


def _failures(rows: Sequence[TrialRecord]) -> str:
    """The failed trials grouped by their error (numbers aside), the largest group first."""
    groups: dict[str, list[TrialRecord]] = {}
    for r in rows:
        if r.status != "ok":
            error = str(r.error or "(no error recorded)")
            groups.setdefault(re.sub(r"\d+", "N", error), []).append(r)
    if not groups:
        return "<p>No trial failed.</p>\n"
    items = []
    for trials in sorted(groups.values(), key=len, reverse=True):
        ids = ", ".join(_esc(t.trial_id) for t in trials)
        items.append(
            f'<tr><td class="num">{len(trials)}</td><td class="error">'
            f"{_esc(trials[0].error or '(no error recorded)')}</td><td>{ids}</td></tr>"
        )
    return (
        '<table id="failures"><thead><tr><th>trials</th><th>error (the first trial\'s)</th>'
        f"<th>trial ids</th></tr></thead><tbody>{''.join(items)}</tbody></table>\n"
    )


def _best_vs_default(best: TrialRecord | None, default: DefaultSetting | None) -> str:
    if best is None:
        return "<p>No trial completed: there is no best setting.</p>\n"
    best_params = best.params or {}
    default_params = (default.record.params or {}) if default is not None else {}
    names = list(best_params) + [n for n in default_params if n not in best_params]
    rows = []
    for name in names:
        mine = setting_value(name, best_params[name]) if name in best_params else ""
        theirs = setting_value(name, default_params[name]) if name in default_params else ""
        changed = ' class="changed"' if default is not None and mine != theirs else ""
        rows.append(
            f"<tr{changed}><td>{_esc(name)}</td><td>{_esc(theirs)}</td><td>{_esc(mine)}</td></tr>"
        )
    if default is None:
        head = "default setting (not run)"
    else:
        head = f"{default.name} (trial {default.record.trial_id})"
    return (
        f'<table id="best-vs-default"><thead><tr><th>parameter</th><th>{_esc(head)}</th>'
        f"<th>best setting (trial {_esc(best.trial_id)})</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>\n"
    )


def _figure_html(figure: Figure) -> str:
    fit_figure(figure.figure)
    div = figure.figure.to_html(
        full_html=False,
        include_plotlyjs=False,
        div_id=f"fig-{figure.key}",
        config={"displaylogo": False, "responsive": True},
    )
    return (
        f'<div class="chart" data-chart="{_esc(figure.key)}"><h3>{_esc(figure.title)}</h3>\n'
        f'<p class="caption">{_esc(figure.caption)}</p>\n{div}</div>\n'
    )


def _sensitivity(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per ranking (base setting, ranked by): a bar chart of its entries and their table."""
    import plotly.graph_objects as go

    rankings: dict[tuple[Any, Any], list[Mapping[str, Any]]] = {}
    for r in rows:
        rankings.setdefault((r.get("base"), r.get("rank_by")), []).append(r)
    parts = []
    for index, ((base, by), entries) in enumerate(rankings.items()):
        entries = sorted(entries, key=lambda e: e.get("rank") or 0)[:_SENSITIVITY_ROWS]
        value = "metric" if by == "metric" else "sqnr_db"
        fig = go.Figure(
            go.Bar(
                x=[e.get("tensor") for e in entries],
                y=[finite(e.get(value)) for e in entries],
                hovertext=[f"{e.get('node')} ({e.get('op_type')})" for e in entries],
            )
        )
        fig.update_layout(
            xaxis_title="tensor (most sensitive first)",
            yaxis_title="metric with it promoted" if by == "metric" else "SQNR (dB)",
        )
        title = f"Sensitivity ranked by {by} (base {str(base)[:12]})"
        how = "the metric with each alone promoted" if by == "metric" else "lower: more sensitive"
        caption = f"The {len(entries)} most sensitive tensors of this ranking ({how})."
        parts.append(_figure_html(Figure(f"sensitivity-{index}", title, caption, fig)))
    return parts


def _columns(rows: Sequence[TrialRecord], summary: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The parallel coordinates' axes: the metric and each parameter over the complete trials."""
    complete = [
        r
        for r in rows
        if r.status == "ok" and r.stopped_at_rung is None and finite(r.metric) is not None
    ]
    metric = str(summary.get("metric") or "metric").rsplit(":", 1)[-1]
    columns: dict[str, list[Any]] = {metric: [r.metric for r in complete]}
    for name in _param_names(complete):
        columns[name] = [(r.params or {}).get(name) for r in complete]
    return columns


def _in_words(rows: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The records with each null setting that means something in its words (a null
    ``op_types_to_quantize``: ``every op``) for the charts, where Optuna would write None."""
    out: list[TrialRecord] = []
    for r in rows:
        params = r.params or {}
        named = {
            k: NULL_WORDS.get(k.rsplit(".", 1)[-1], v) if v is None else v
            for k, v in params.items()
        }
        out.append(r if named == params else r.replace(params=named))
    return out


def _metric_doc(config: SearchConfig | None) -> str | None:
    """The first paragraph of a custom evaluator's docstring on one line, or None."""
    import inspect

    if config is None or not config.is_custom_metric:
        return None
    try:
        doc = inspect.getdoc(config.load_evaluator())
    except Exception as exc:  # the report never fails for it
        _logger.debug("report: the evaluator's docstring: %s", exc)
        return None
    first = (doc or "").strip().split("\n\n", 1)[0]
    return " ".join(first.split()) or None


def build_report(
    records: Sequence[TrialRecord],
    summary: Mapping[str, Any],
    *,
    config: SearchConfig | None = None,
    sensitivity: Sequence[Mapping[str, Any]] = (),
    title: str = "raysearch report",
    plotly_src: str | None = None,
) -> str:
    """The report's HTML for ``records`` (in any order) and ``summary``; ``config`` finds the
    space's default setting; ``sensitivity``: the rows of ``sensitivity.parquet``;
    ``plotly_src``: a relative path plotly.js is loaded from instead of inlined."""
    import plotly.offline

    rows = order(records)
    best_id = summary.get("best_trial_id")
    best = next((r for r in rows if r.trial_id == best_id), None)
    default = default_setting(rows, config)
    figures = study_figures(_in_words(rows), summary) if rows else []
    weighed = len(summary.get("objectives") or ("metric",)) > 1 or summary.get("select") not in (
        None,
        "metric",
    )
    if not weighed:
        # Chosen by the metric alone: a front of other figures shows trade-offs never weighed.
        figures = [f for f in figures if f.key != "pareto"]
    for figure in figures:
        if figure.key == "parallel":
            relabel_parallel(figure.figure, _columns(rows, summary))
    charts = [_figure_html(f) for f in figures]
    sens = _sensitivity(sensitivity) if sensitivity else []
    plotly_js = plotly.offline.get_plotlyjs() if (charts or sens) and not plotly_src else ""
    parts = [
        page_head(title, plotly_js, plotly_src if charts or sens else None),
        f"<h1>{_esc(title)}</h1>\n",
    ]
    parts.append('<h2 id="summary">Summary</h2>\n')
    words = summary_words(rows, summary, best, default, config, _metric_doc(config))
    parts += [f"<p>{_esc(line)}</p>\n" for line in words]
    parts.append('<h2 id="best">Best setting against the default setting</h2>\n')
    parts.append(_best_vs_default(best, default))
    parts.append('<h2 id="charts">Charts</h2>\n')
    parts += charts or ["<p>No trial completed: nothing to chart.</p>\n"]
    if sens:
        parts.append('<h2 id="sensitivity">Per-tensor sensitivity</h2>\n')
        parts += sens
    parts.append(f'<h2 id="trials-section">Every trial ({len(rows)})</h2>\n')
    parts.append(_trials_table(rows))
    parts.append('<h2 id="failures-section">Failures by error</h2>\n')
    parts.append(_failures(rows))
    parts.append("</body>\n</html>\n")
    return "".join(parts)


def write_report(
    output_dir: str | Path,
    records: Sequence[TrialRecord],
    summary: Mapping[str, Any],
    *,
    config: SearchConfig | None = None,
    plotly_src: str | None = None,
) -> Path | None:
    """Write ``report.html`` in ``output_dir`` and return its path (None, logged, when it
    cannot be built). ``plotly_src``: plotly.js's path relative to ``output_dir`` (a batch's
    shared file), loaded from there instead of inlined where the file exists."""
    out = Path(output_dir)
    if plotly_src and not (out / plotly_src).is_file():
        _logger.debug("%s: no %s, plotly.js inlined", out, plotly_src)
        plotly_src = None
    return write_page(
        out / REPORT,
        lambda: build_report(
            records,
            summary,
            config=config,
            sensitivity=_read_sensitivity(out),
            title=_title(out, config),
            plotly_src=plotly_src,
        ),
    )


def write_page(path: Path, build: Callable[[], str]) -> Path | None:
    """Write the page ``build`` makes at ``path`` and return ``path``; a page that cannot be
    built or written is a warning and None, never a reason to fail the search or batch."""
    try:
        atomic_write_text(path, build())
    except Exception as exc:  # a secondary output: never lose the search for it
        _logger.warning("writing %s failed: %s: %s", path.name, type(exc).__name__, exc)
        _logger.debug("writing %s failed", path.name, exc_info=True)
        return None
    return path


def write_plotly_js(folder: str | Path) -> Path:
    """Write plotly.js as :data:`PLOTLY_JS` in ``folder`` and return its path."""
    import plotly.offline

    path = Path(folder) / PLOTLY_JS
    atomic_write_text(path, plotly.offline.get_plotlyjs())
    return path


def _title(out: Path, config: SearchConfig | None) -> str:
    model = getattr(config, "model", None)
    name = Path(str(model)).name if model else out.resolve().name
    return f"raysearch report: {name}"


def _read_sensitivity(out: Path) -> list[dict[str, Any]]:
    from raysearch.quantize.techniques.mixed_precision.sensitivity import (
        SENSITIVITY_FILE,
        read_sensitivity_table,
    )

    return read_sensitivity_table(out / SENSITIVITY_FILE)
