"""The report's summary in words, and the trial that ran the space's default setting.

Every number said is one the search wrote: ``summary.json``'s fields and the records'.

Example:
    >>> summary = {"stop_reason": "space_exhausted", "n_trials": 2, "n_failed": 0,
    ...            "n_candidates": 1, "metric": "cos", "higher_is_better": True,
    ...            "tolerance": 0.99, "search_algo": "Grid", "wall_time_s": 3.0}
    >>> best = {"trial_id": "b", "metric": 0.995, "is_candidate": True, "params": {}}
    >>> summary_words([best], summary, best, None)[-1]
    'It stopped because the strategy had no setting left to try.'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from raysearch.ranking import finite
from raysearch.space import Categorical
from raysearch.space.points import agrees

if TYPE_CHECKING:
    from raysearch.config import SearchConfig
    from raysearch.space import SearchSpace

__all__ = ["summary_words", "default_record", "STOP_WORDS"]

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


def _first_setting(space: SearchSpace) -> dict[str, Any]:
    """The space's default setting: its first start point (``points_to_evaluate``) completed
    with the first choice (a range: its low end) of each active parameter it leaves out."""
    point = dict(space.points_to_evaluate[0]) if space.points_to_evaluate else {}
    for param in space.params:
        if param.name in point or not space.is_active(param, point):
            continue
        domain = param.domain
        point[param.name] = domain.choices[0] if isinstance(domain, Categorical) else domain.low
    return point


def default_record(
    rows: Sequence[Mapping[str, Any]], config: SearchConfig | None
) -> Mapping[str, Any] | None:
    """The trial that ran the space's default setting: Auto's ``defaults`` stage, else the
    first trial whose setting is the first space's default (:func:`_first_setting`); None when
    no trial ran it."""
    for r in rows:
        if r.get("stage") == "defaults":
            return r
    spaces = getattr(config, "search_spaces", None) or []
    if not spaces:
        return None
    default = _first_setting(spaces[0])
    for r in rows:
        point = r.get("point") or r.get("params") or {}
        if agrees(point, default) and agrees(default, point):
            return r
    return None


def _searched(rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], metric: str) -> str:
    names: list[str] = []
    for r in rows:
        names += [n for n in r.get("params") or {} if n not in names]
    direction = "higher" if summary.get("higher_is_better") else "lower"
    stopped = sum(1 for r in rows if r.get("stopped_at_rung") is not None)
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
        f"tolerance {_num(summary.get('tolerance'))}) over "
        f"{', '.join(names) or 'a single setting'}: {counts}"
        + (f" in {_num(took)} s" if took is not None else "")
        + (f" over {sessions} sessions" if isinstance(sessions, int) and sessions > 1 else "")
        + "."
    )


def _won(best: Mapping[str, Any] | None, metric: str) -> str:
    if best is None:
        return "No trial completed, so there is no best setting."
    params = ", ".join(f"{k} = {v}" for k, v in (best.get("params") or {}).items())
    kind = "a candidate" if best.get("is_candidate") else "not a candidate"
    return (
        f"The best setting is trial {best.get('trial_id')} ({kind}): {metric} = "
        f"{_num(best.get('metric'))}" + (f", with {params}." if params else ".")
    )


def _against_default(
    best: Mapping[str, Any] | None, default: Mapping[str, Any] | None, metric: str, higher: bool
) -> str | None:
    if best is None:
        return None
    if default is None:
        return "The space's default setting was not run in this search: no comparison."
    if default.get("trial_id") == best.get("trial_id"):
        return "The best setting is the space's default setting."
    theirs, mine = finite(default.get("metric")), finite(best.get("metric"))
    if default.get("status") != "ok" or theirs is None or mine is None:
        return f"The default setting (trial {default.get('trial_id')}) failed: no comparison."
    gain = mine - theirs if higher else theirs - mine
    partial = " over some of the rows" if default.get("stopped_at_rung") is not None else ""
    said = f"default setting (trial {default.get('trial_id')}, {metric} = {_num(theirs)}{partial})"
    if gain >= 0:
        return f"It beats the {said} by {_num(gain)} in {metric}."
    # The ranking puts candidates first, and among them the most quantized.
    return (
        f"The {said} scores {_num(-gain)} better in {metric}, but ranks below the best setting "
        "(candidates first, then the most quantized)."
    )


def _against_float(summary: Mapping[str, Any], metric: str) -> str | None:
    said = []
    if summary.get("float_metric") is not None:
        said.append(f"{metric} {_num(summary['float_metric'])}")
    for key, unit in (("latency_ms", "ms per batch"), ("model_size_bytes", "bytes")):
        mine = finite(summary.get(f"best_{key}"))
        theirs = finite(summary.get(f"float_{key}"))
        if mine is None or theirs is None or theirs <= 0:
            continue
        word = "latency" if key == "latency_ms" else "size"
        said.append(
            f"{word} {_num(mine)} against {_num(theirs)} {unit} ({mine / theirs:.1%} of the float "
            "model's)"
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


def summary_words(
    rows: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
    best: Mapping[str, Any] | None,
    default: Mapping[str, Any] | None,
) -> list[str]:
    """The report's summary, one sentence or two per line."""
    metric = str(summary.get("metric") or "metric").rsplit(":", 1)[-1]
    higher = bool(summary.get("higher_is_better"))
    lines = [_searched(rows, summary, metric), _won(best, metric)]
    lines += [
        line
        for line in (
            _against_default(best, default, metric, higher),
            _against_float(summary, metric),
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
        lines.append(f"It stopped because {STOP_WORDS.get(str(reason), reason)}.")
    return lines
