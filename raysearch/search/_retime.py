"""Latency timed again, alone, after the last trial, where it decides or the config asks.

A trial times its model while other trials share the CPUs, so where a latency decides
(``select``, or among the ``objectives``) or ``retime_latency: true`` asks, the candidates
kept and the best setting and the float model are timed again one after another in
:data:`ROUNDS` rounds (the median, lowest and highest kept), in a process of the driver's own
(:mod:`raysearch.search._latency_timer`). A language-model metric's decode and prefill
latencies are timed the same way. The trials' own figures stay in ``summary.json``'s
``*_retimed`` fields. Not done without latency, with ``retime_latency: false`` or on GPUs.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysearch.ranking import best_record, is_candidate
from raysearch.trialrecord import TrialRecord

if TYPE_CHECKING:
    from raysearch.config import SearchConfig
    from raysearch.data import DataSource

__all__ = [
    "RetimePlan",
    "retime",
    "plan_retime",
    "needs_retime",
    "time_rounds",
    "latency_timing",
    "deciding",
    "ROUNDS",
    "RUNS",
]

_logger = logging.getLogger("raysearch.search")

#: Rounds over the models, and timed runs of each model per round (after one warm-up run).
ROUNDS, RUNS = 5, 5
#: Seconds after which no further round starts once :data:`MIN_ROUNDS` are done.
BUDGET_S, MIN_ROUNDS = 30.0, 2
#: The budget when latency decides nothing (time after the last trial is the user's wait).
REPORT_BUDGET_S = 3.0
#: The most candidate models timed again (the fastest by their trial's figure first).
MAX_MODELS = 12


#: The latencies a search times, each with the ``select`` that picks ``best/`` by it.
FIGURES = {
    "latency_ms": "latency",
    "decode_latency_ms": "decode_latency",
    "prefill_latency_ms": "prefill_latency",
}


#: How the latencies a search reports were timed (``summary.json``'s ``latency_timing``).
TIMED_ALONE = "timed alone after the search"
TIMED_IN_SEARCH = "timed during the search, beside other trials"


def latency_timing(config: SearchConfig, retimed: bool) -> str | None:
    """How a search's latencies were timed; None when latency is not measured."""
    if not config.measure_latency:
        return None
    return TIMED_ALONE if retimed else TIMED_IN_SEARCH


@dataclass
class Retimed:
    """What timing again changed: the records, the float model's figures by figure, and the
    fields it adds to ``summary.json``."""

    records: list[TrialRecord]
    summary: dict[str, Any] = field(default_factory=dict)
    float_ms: dict[str, float] = field(default_factory=dict)


def _complete(record: TrialRecord, figure: str = "latency_ms") -> bool:
    return (
        record.ok
        and record.stopped_at_rung is None
        and isinstance(getattr(record, figure), (int, float))
    )


def _model(folder: Path, record: TrialRecord) -> Path | None:
    path = folder / record.model_file if record.model_file else None
    return path if path is not None and path.is_file() else None


def deciding(config: SearchConfig, figure: str) -> bool:
    """Whether ``figure`` picks ``best/`` (``select``) or is one of the ``objectives``."""
    return config.select == FIGURES[figure] or figure in (config.objectives or ())


def _chosen(
    config: SearchConfig, folder: Path, records: Sequence[TrialRecord], figure: str
) -> tuple[list[TrialRecord], bool]:
    """The records whose models are timed again for ``figure``, and whether it decides."""
    decides = deciding(config, figure)
    chosen: list[TrialRecord] = []
    if decides:
        candidates = [r for r in records if is_candidate(r) and _complete(r, figure)]
        candidates.sort(key=lambda r: float(getattr(r, figure)))
        chosen = [r for r in candidates if _model(folder, r) is not None][:MAX_MODELS]
    best = best_record(records, config.metric_higher_is_better, config.select)
    if best is not None and _complete(best, figure) and _model(folder, best) is not None:
        if all(r.trial_id != best.trial_id for r in chosen):
            chosen.append(best)
    return chosen, decides


def _feeds(evaluation: DataSource, records: Sequence[TrialRecord]) -> dict[str, Mapping[str, Any]]:
    """The feed of each figure the trials measured."""
    feeds: dict[str, Mapping[str, Any]] = {"latency_ms": evaluation.batch(0)}
    if any(_complete(r, f) for r in records for f in ("decode_latency_ms", "prefill_latency_ms")):
        from raysearch.data import latency_feeds

        for name, feed in (latency_feeds(evaluation.arrays, evaluation.inputs) or {}).items():
            feeds[f"{name}_latency_ms"] = feed
    return feeds


def needs_retime(config: SearchConfig) -> bool:
    """Whether a search of ``config`` times latency again alone after its last trial."""
    if not config.measure_latency or config.resources.gpu_per_trial > 0:
        return False
    if config.retime_latency is not None:
        return config.retime_latency
    return any(deciding(config, figure) for figure in FIGURES)


@dataclass
class RetimePlan:
    """The models a finished search times again: :attr:`job` is :func:`time_rounds`'s
    arguments (run in :class:`raysearch.search._latency_timer.LatencyTimer`)."""

    config: SearchConfig
    folder: Path
    records: Sequence[TrialRecord]
    #: Per figure, the records timed again and whether the figure decides.
    plans: dict[str, tuple[list[TrialRecord], bool]]
    job: dict[str, Any]

    def apply(self, rounds: Mapping[str, Mapping[str, list[float]]] | None) -> Retimed | None:
        """The records, float figures and summary fields from ``rounds``; None without them."""
        if rounds is None:
            return None
        return _retimed(self.config, self.folder, self.records, self.plans, rounds)


def plan_retime(
    config: SearchConfig,
    folder: str | os.PathLike,
    records: Sequence[TrialRecord],
    evaluation: DataSource,
    float_model: str | os.PathLike,
) -> RetimePlan | None:
    """What :func:`retime` times; None when nothing is (:func:`needs_retime`, no model left)."""
    if not needs_retime(config):
        return None
    folder = Path(folder)
    feeds = _feeds(evaluation, records)
    plans = _with_deciding(records, {f: _chosen(config, folder, records, f) for f in feeds})
    if not plans:
        return None
    paths: dict[str, Path | None] = {"float": Path(float_model)}
    which: dict[str, list[str]] = {"float": list(plans)}
    for figure, (chosen, _) in plans.items():
        for record in chosen:
            name = str(record.trial_id)
            paths[name] = _model(folder, record)
            which.setdefault(name, []).append(figure)
    job = {
        "paths": paths,
        "which": which,
        "feeds": {figure: dict(feeds[figure]) for figure in plans},
        "threads": max(1, int(config.resources.cpu_per_trial)),
        "budget_s": BUDGET_S if any(d for _, d in plans.values()) else REPORT_BUDGET_S,
    }
    return RetimePlan(config, folder, records, plans, job)


def retime(
    config: SearchConfig,
    folder: str | os.PathLike,
    records: Sequence[TrialRecord],
    evaluation: DataSource,
    float_model: str | os.PathLike,
) -> Retimed | None:
    """Time the float model and the models whose latency counts again, alone, in this
    process; None when nothing is timed or ONNX Runtime could not time a model."""
    plan = plan_retime(config, folder, records, evaluation, float_model)
    if plan is None:
        return None
    try:
        rounds = time_rounds(**plan.job)
    except Exception as exc:  # noqa: BLE001 - latency is secondary: keep the trials' figures
        _logger.warning("latency could not be timed again alone: %s", exc)
        return None
    return plan.apply(rounds)


def _retimed(
    config: SearchConfig,
    folder: Path,
    records: Sequence[TrialRecord],
    plans: Mapping[str, tuple[list[TrialRecord], bool]],
    rounds: Mapping[str, Mapping[str, list[float]]],
) -> Retimed:
    """:class:`Retimed` from the ``rounds`` of the models of ``plans``."""
    from raysearch.outputs import timed_alone

    threads = max(1, int(config.resources.cpu_per_trial))
    timed: dict[str, dict[str, dict[str, float]]] = {}
    for figure, (chosen, _) in plans.items():
        timed[figure] = {name: _spread(values) for name, values in rounds[figure].items()}
        for record in chosen:
            in_search = round(float(getattr(record, figure)), 4)
            timed[figure][str(record.trial_id)]["in_search_ms"] = in_search
    n_rounds = len(next(iter(rounds.values()))["float"])
    summary: dict[str, Any] = {
        retimed_field(figure): {
            "decides": plans[figure][1],
            "rounds": n_rounds,
            "runs_per_round": RUNS,
            "threads": threads,
            "models": by_model,
        }
        for figure, by_model in timed.items()
    }
    out = timed_alone(records, summary)
    if any(d for _, d in plans.values()):
        _drop_unkept(config, folder, out)
    float_ms = {figure: by_model["float"]["median_ms"] for figure, by_model in timed.items()}
    best = best_record(out, config.metric_higher_is_better, config.select)
    latency = timed.get("latency_ms", {})
    summary["best_latency_vs_float"] = None
    if best is not None and str(best.trial_id) in latency and float_ms["latency_ms"] > 0:
        ratio = latency[str(best.trial_id)]["median_ms"] / float_ms["latency_ms"]
        summary["best_latency_vs_float"] = round(ratio, 4)
    for figure, by_model in timed.items():
        _logger.info(
            "%s timed again alone (%d rounds of %d runs, %d threads): %s",
            figure,
            n_rounds,
            RUNS,
            threads,
            ", ".join(f"{name} {f['median_ms']:.4g} ms" for name, f in by_model.items()),
        )
    return Retimed(out, summary, float_ms)


def _with_deciding(
    records: Sequence[TrialRecord],
    plans: Mapping[str, tuple[list[TrialRecord], bool]],
) -> dict[str, tuple[list[TrialRecord], bool]]:
    """``plans`` with a figure that decides nothing also timing the models of the figures
    that decide (which is ``best/`` is known only then); figures with nothing to time left out."""
    deciding_ones = {str(r.trial_id): r for chosen, d in plans.values() if d for r in chosen}
    out = {}
    for figure, (chosen, decides) in plans.items():
        if not decides:
            have = {str(r.trial_id) for r in chosen}
            chosen = chosen + [
                r for name, r in deciding_ones.items() if name not in have and _complete(r, figure)
            ]
        if chosen:
            out[figure] = (chosen, decides)
    return out


def retimed_field(figure: str) -> str:
    """The ``summary.json`` field that says how ``figure`` was timed again.

    Example:
        >>> retimed_field("latency_ms"), retimed_field("decode_latency_ms")
        ('latency_retimed', 'decode_latency_retimed')
    """
    return figure.removesuffix("_ms") + "_retimed"


def time_rounds(
    paths: Mapping[str, Path | None],
    which: Mapping[str, Sequence[str]],
    feeds: Mapping[str, Mapping[str, Any]],
    threads: int,
    budget_s: float,
) -> dict[str, dict[str, list[float]]]:
    """Per figure, each model's figure per round: model ``name`` timed on the feed of each
    figure of ``which[name]``. Raises what ONNX Runtime raises when it cannot time one."""
    from raysearch.evaluate import measure_latency
    from raysearch.providers import make_session

    sessions = {name: make_session(path, threads) for name, path in paths.items()}
    rounds: dict[str, dict[str, list[float]]] = {}
    for name, figures in which.items():
        for figure in figures:
            rounds.setdefault(figure, {})[name] = []
    started = time.perf_counter()
    for done in range(ROUNDS):
        if done >= MIN_ROUNDS and time.perf_counter() - started > budget_s:
            break
        for name, session in sessions.items():
            for figure in which[name]:
                rounds[figure][name].append(measure_latency(session, feeds[figure], runs=RUNS))
    return rounds


def _drop_unkept(config: SearchConfig, folder: Path, records: list[TrialRecord]) -> None:
    """Delete the models kept for their in-search figure that the recorder's rule (the
    ``keep_candidates`` best, the Pareto front, the best) no longer keeps by the figures timed
    alone; their records' ``model_file`` becomes None."""
    from raysearch.layout import CANDIDATES, KEPT
    from raysearch.modelfile import remove_model
    from raysearch.ranking import best_records, pareto_front

    higher = config.metric_higher_is_better
    with_models = [r for r in records if _model(folder, r) is not None]
    top = [r for r in with_models if str(r.model_file).startswith(CANDIDATES + "/")]
    if config.keep_candidates is not None:
        top = best_records(top, config.keep_candidates, higher, config.select)
    front = pareto_front(records, config.objectives, higher) if len(config.objectives) > 1 else []
    keep = {id(r) for r in [*top, *front, best_record(records, higher, config.select)]}
    for i, record in enumerate(records):
        model_file = str(record.model_file)
        if id(record) in keep or _model(folder, record) is None:
            continue
        if model_file.startswith((CANDIDATES + "/", KEPT + "/")):
            remove_model(folder / model_file)
            records[i] = record.replace(model_file=None)
            _logger.debug("trial %s: its model is no longer kept (timed alone)", record.trial_id)


def _spread(values: list[float]) -> dict[str, float]:
    """The median, lowest and highest of the rounds' figures, in milliseconds.

    Example:
        >>> _spread([2.0, 1.0, 4.0])
        {'median_ms': 2.0, 'min_ms': 1.0, 'max_ms': 4.0}
        >>> _spread([2.0, 1.0])["median_ms"]
        1.5
    """
    ordered = sorted(values)
    return {
        "median_ms": round(statistics.median(ordered), 4),
        "min_ms": round(ordered[0], 4),
        "max_ms": round(ordered[-1], 4),
    }


def slower_than_float_note(ratio: float | None, deciding: bool = False) -> str | None:
    """The summary's ``latency_note`` when the best setting is slower than the float model
    (``ratio``: ``best_latency_vs_float``; ``deciding``: latency chose the best)."""
    if ratio is None or ratio <= 1.0:
        return None
    advice = (
        "no candidate timed was faster"
        if deciding
        else "select: latency, or objectives with latency_ms, weighs speed"
    )
    return (
        f"the best setting is slower than the float model: {ratio:.0%} of its latency, each "
        f"timed alone after the search ({advice})"
    )
