"""The report's summary in words.

Every number said is one the search wrote: ``summary.json``'s fields and the records'.

Example:
    >>> summary = {"stop_reason": "space_exhausted", "n_trials": 2, "n_failed": 0,
    ...            "n_candidates": 1, "metric": "cos", "higher_is_better": True,
    ...            "tolerance": 0.99, "search_algo": "Grid", "wall_time_s": 3.0}
    >>> best = TrialRecord(trial_id="b", metric=0.995, is_candidate=True, params={})
    >>> summary_words([best], summary, best, None)[-1]
    'It stopped because the strategy had no setting left to try.'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from raysearch.metrics import METRICS
from raysearch.outputs._default import DefaultSetting
from raysearch.outputs._values import human_bytes, setting_text
from raysearch.ranking import LATENCIES, deciding_rule, finite, is_candidate
from raysearch.trialrecord import TrialRecord

if TYPE_CHECKING:
    from raysearch.config import SearchConfig

__all__ = ["summary_words"]

#: ``stop_reason`` in words (``running``: the report of a search not finished).
STOP_WORDS = {
    "candidates_found": "it found the candidates stop.find_n_candidates asks for",
    "best_candidate_found": "a candidate reached stop.find_best_candidate",
    "iteration_limit": "it started the trials stop.iteration_limit allows",
    "time_limit": "its time (stop.time_limit) ran out",
    "space_exhausted": "the strategy had no setting left to try",
    "strategy_failed": "a stage of the strategy failed (its error is in the log); the best "
    "of the trials that finished is kept",
    "interrupted": "it was interrupted (raysearch resume continues it)",
}


def _num(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _searched_names(rows: Sequence[TrialRecord], config: SearchConfig | None) -> list[str]:
    """The parameters searched: the trials', else, when no trial ran one (none finished),
    the config's spaces'."""
    names: list[str] = []
    for r in rows:
        names += [n for n in r.params or {} if n not in names]
    if names:
        return names
    for space in getattr(config, "search_spaces", None) or []:
        names += [p.name for p in space.params if not p.domain.is_fixed and p.name not in names]
    return names


def _searched(
    rows: Sequence[TrialRecord],
    summary: Mapping[str, Any],
    metric: str,
    config: SearchConfig | None = None,
) -> str:
    names = _searched_names(rows, config)
    if names:
        over = f"over {', '.join(names)}"
    elif rows:
        over = "over a single setting"  # trials ran, none with a parameter of its own
    else:
        over = "before any trial finished"
    direction = "higher" if summary.get("higher_is_better") else "lower"
    stopped = sum(1 for r in rows if r.stopped_at_rung is not None)
    counts = (
        f"{summary.get('n_trials', len(rows))} trials ({summary.get('n_failed', 0)} failed, "
        f"{summary.get('n_candidates', 0)} candidates"
        + (f", {stopped} stopped at a rung of the evaluation on growing subsets" if stopped else "")
        + ")"
    )
    took = summary.get("wall_time_s")
    sessions = summary.get("sessions")
    return (
        f"A {summary.get('search_algo', '')} search of {metric} ({direction} is better, "
        f"tolerance {_num(summary.get('tolerance'))}) {over}: {counts}"
        + (f" in {_num(took)} s" if took is not None else "")
        + (f" over {sessions} sessions" if isinstance(sessions, int) and sessions > 1 else "")
        + "."
    )


def _metric_range(
    rows: Sequence[TrialRecord], summary: Mapping[str, Any], metric: str
) -> str | None:
    """What the metric's values mean: its direction, its range (a built-in metric's), where
    the float model stands and the range the complete trials scored."""
    higher = bool(summary.get("higher_is_better"))
    said = [f"{metric}: {'higher' if higher else 'lower'} is better"]
    builtin = METRICS.get(metric)
    if builtin is not None:
        low, high = sorted((builtin.best, builtin.worst))
        said.append(f"it lies in [{_num(float(low))}, {_num(float(high))}]")
        said.append(f"the float model against itself scores {_num(float(builtin.best))}")
    elif finite(summary.get("float_metric")) is not None:
        said.append(f"the float model scores {_num(summary['float_metric'])} (a custom metric)")
    scores = [finite(r.metric) for r in rows if r.status == "ok" and finite(r.metric) is not None]
    if scores:
        partial = any(r.stopped_at_rung is not None for r in rows)
        said.append(
            f"the trials scored from {_num(min(scores))} to {_num(max(scores))}"
            + (" (some stopped at a rung: their score is over some of the rows)" if partial else "")
        )
    return "; ".join(said) + "."


def _won(best: TrialRecord | None, metric: str) -> str:
    if best is None:
        return "No trial completed, so there is no best setting."
    params = setting_text(best.params or {})
    kind = "a candidate" if is_candidate(best) else "not a candidate"
    extra = best.extra
    low, high = finite(extra.get(f"{metric}_ci_low")), finite(extra.get(f"{metric}_ci_high"))
    interval = f" (95 % interval {_num(low)}-{_num(high)})" if None not in (low, high) else ""
    return (
        f"The best setting is trial {best.trial_id} ({kind}): {metric} = "
        f"{_num(best.metric)}{interval}" + (f", with {params}." if params else ".")
    )


def _tie(
    rows: Sequence[TrialRecord],
    summary: Mapping[str, Any],
    best: TrialRecord | None,
    metric: str,
) -> str | None:
    """The complete trials whose metric equals the best's exactly, and the rule of the ranking
    that put the best first (:func:`raysearch.ranking.deciding_rule`)."""
    if best is None or finite(best.metric) is None:
        return None
    higher = bool(summary.get("higher_is_better"))
    select = str(summary.get("select") or "metric")
    tied = [
        r
        for r in rows
        if r is not best
        and r.trial_id != best.trial_id
        and r.status == "ok"
        and r.stopped_at_rung is None
        and finite(r.metric) == finite(best.metric)
    ]
    if not tied:
        return None
    rules = list(dict.fromkeys(deciding_rule(best, r, higher, select) for r in tied))
    ids = ", ".join(str(r.trial_id) for r in tied)
    trials = "Trial" if len(tied) == 1 else "Trials"
    return (
        f"{trials} {ids} tied with the best on {metric} = {_num(best.metric)} exactly; "
        f"the ranking kept trial {best.trial_id}: {'; '.join(rules)}."
    )


def _against_default(
    best: TrialRecord | None, default: DefaultSetting | None, metric: str, higher: bool
) -> str | None:
    if best is None:
        return None
    if default is None:
        return "The space's default setting was not run in this search: no comparison."
    record, name = default.record, default.name
    if record.trial_id == best.trial_id:
        return f"The best setting is {name}."
    theirs, mine = finite(record.metric), finite(best.metric)
    if record.status != "ok" or theirs is None or mine is None:
        return f"{name[0].upper()}{name[1:]} (trial {record.trial_id}) failed: no comparison."
    gain = mine - theirs if higher else theirs - mine
    partial = " over some of the rows" if record.stopped_at_rung is not None else ""
    said = f"{name} (trial {record.trial_id}, {metric} = {_num(theirs)}{partial})"
    if gain >= 0:
        return f"It beats {said} by {_num(gain)} in {metric}."
    # The ranking puts candidates first, and among them the most quantized.
    return (
        f"{said[0].upper()}{said[1:]} scores {_num(-gain)} better in {metric}, but ranks below "
        "the best setting (candidates first, then the most quantized)."
    )


def _latency_spread(summary: Mapping[str, Any], name: str, field: str = "latency_retimed") -> str:
    """How ``name``'s latency (``float``, or a trial id) was timed alone after the search, and
    the spread of the rounds (``field``: ``latency_retimed``, or a decoder's
    ``decode_latency_retimed``, ``prefill_latency_retimed``); empty when it was not."""
    retimed = summary.get(field)
    models = retimed.get("models") if isinstance(retimed, Mapping) else None
    figures = models.get(name) if isinstance(models, Mapping) else None
    if not isinstance(figures, Mapping):
        return ""
    low, high = finite(figures.get("min_ms")), finite(figures.get("max_ms"))
    if low is None or high is None:
        return ""
    return f" ({_num(low)}-{_num(high)} over {retimed.get('rounds')} rounds)"


def _timing(summary: Mapping[str, Any]) -> str:
    """How latencies not timed alone were timed (``latency_timing``: "timed during the
    search, beside other trials"), as a clause; empty when the summary does not say."""
    timing = summary.get("latency_timing")
    return f", {timing}" if isinstance(timing, str) and timing else ""


def _against_float(summary: Mapping[str, Any], metric: str) -> str | None:
    said = []
    if summary.get("float_metric") is not None:
        said.append(f"{metric} {_num(summary['float_metric'])}")
    for key, words, unit, field in LATENCIES:
        mine, theirs = finite(summary.get(f"best_{key}")), finite(summary.get(f"float_{key}"))
        if mine is None or theirs is None or theirs <= 0:
            continue
        best_id = str(summary.get("best_trial_id"))
        alone = _latency_spread(summary, "float", field)
        ratio = mine / theirs
        said.append(
            f"{words} {_num(mine)}{_latency_spread(summary, best_id, field)} against "
            f"{_num(theirs)}{alone} {unit}"
            + (", each timed alone after the search" if alone else _timing(summary))
            + f" ({ratio:.1%} of the float model's: "
            + ("slower than the float model)" if ratio > 1 else "faster)")
        )
    mine = finite(summary.get("best_model_size_bytes"))
    theirs = finite(summary.get("float_model_size_bytes"))
    if mine is not None and theirs is not None and theirs > 0:
        said.append(
            f"size {human_bytes(mine)} against {human_bytes(theirs)} ({mine / theirs:.1%} of "
            "the float model's)"
        )
    if not said:
        return None
    return "Against the float model: " + "; ".join(said) + "."


def _tolerance(summary: Mapping[str, Any]) -> str | None:
    if summary.get("n_candidates") or summary.get("tolerance") is None:
        return None
    if summary.get("tolerance_note"):
        return f"{summary['tolerance_note']}."
    missed = summary.get("best_missed_by")
    if missed is not None:
        return f"No setting met the tolerance: the best missed it by {_num(missed)}."
    return "No setting met the tolerance."


def _sentence(note: Any) -> str | None:
    """A summary note (lower case, no full stop) as a sentence."""
    if not note:
        return None
    text = str(note)
    return f"{text[0].upper()}{text[1:]}" + ("" if text.endswith(".") else ".")


def summary_words(
    rows: Sequence[TrialRecord],
    summary: Mapping[str, Any],
    best: TrialRecord | None,
    default: DefaultSetting | None,
    config: SearchConfig | None = None,
    metric_doc: str | None = None,
) -> list[str]:
    """The report's summary, one sentence or two per line; ``metric_doc``: what a custom
    evaluator's docstring says its metric is."""
    metric = str(summary.get("metric") or "metric").rsplit(":", 1)[-1]
    higher = bool(summary.get("higher_is_better"))
    lines = [_searched(rows, summary, metric, config), _metric_range(rows, summary, metric)]
    if metric_doc:
        lines.append(f"{metric}, as its evaluator ({summary.get('metric')}) says: {metric_doc}")
    lines.append(_won(best, metric))
    lines += [
        line
        for line in (
            _tie(rows, summary, best, metric),
            _against_default(best, default, metric, higher),
            _against_float(summary, metric),
            _sentence(summary.get("latency_note")),
            _tolerance(summary),
            summary.get("gpu_note") and f"{summary['gpu_note']}.",
        )
        if line
    ]
    reason = summary.get("stop_reason")
    if reason == "running":
        lines.append(
            "The search has not finished (it is running, or it was killed: raysearch resume "
            "continues it): this report holds the trials finished so far."
        )
    else:
        note = summary.get("stop_note")
        lines.append(
            f"It stopped because {STOP_WORDS.get(str(reason), reason)}"
            + (f": {note}." if note else ".")
        )
    return lines
