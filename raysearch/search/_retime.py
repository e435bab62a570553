"""Latency timed again, alone, before it decides or is set against the float model's.

A trial times its model while other trials share the CPUs (the same float model read 424 ms
and 1,524 ms in one search), so at the end of a search the models whose latency counts are
timed again on the driver, one after another with nothing else of the search running: the
best setting and the float model, and, where latency decides (``select: latency``, or
``latency_ms`` among the ``objectives`` of the Pareto front), every candidate whose model is
still on disk (the ``keep_candidates`` kept and the front's). Each is timed as a trial times
it (:func:`raysearch.evaluate.measure_latency`: the first evaluation batch, one warm-up run,
the median of :data:`RUNS`, on ``resources.cpu_per_trial`` threads), in :data:`ROUNDS` rounds
that take the models in turn, so that a slower moment of the machine falls on all of them
(no round starts after :data:`BUDGET_S` seconds, :data:`REPORT_BUDGET_S` where latency
decides nothing, once :data:`MIN_ROUNDS` are done); the figure
is the median of the rounds and the spread their lowest and highest.

Not done when latency is not measured (``measure_latency: false``) or the trials ran on GPUs
(the driver's CPU would time another device).

Example:
    >>> retimed = retime(config, folder, records, evaluation, "model.onnx")  # doctest: +SKIP
    >>> retimed.summary["best_latency_vs_float"]                             # doctest: +SKIP
    4.94
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

if TYPE_CHECKING:
    from raysearch.config import SearchConfig
    from raysearch.data import DataSource

__all__ = ["Retimed", "retime", "ROUNDS", "RUNS", "MAX_MODELS"]

_logger = logging.getLogger("raysearch.search")

#: Rounds over the models, and timed runs of each model per round (after one warm-up run).
ROUNDS, RUNS = 5, 5
#: Seconds of timing after which no further round starts once :data:`MIN_ROUNDS` are done
#: (magika's batch of 64 takes 0.6-2.2 s a run on a loaded 2-core machine: 5 rounds of two
#: models took 80 s there).
BUDGET_S, MIN_ROUNDS = 30.0, 2
#: The budget when latency decides nothing (the best against the float model only): time
#: after the last trial is what a user waits for.
REPORT_BUDGET_S = 3.0
#: The most candidate models timed again (the fastest by their trial's figure first).
MAX_MODELS = 12


@dataclass
class Retimed:
    """What timing again changed: the records (``latency_ms`` timed alone where it was, the
    trial's own figure kept as ``latency_ms_in_search``), the float model's latency timed
    alone, and the fields it adds to ``summary.json``."""

    records: list[dict[str, Any]]
    float_latency_ms: float | None
    summary: dict[str, Any] = field(default_factory=dict)


def _complete(record: Mapping[str, Any]) -> bool:
    return (
        record.get("status") == "ok"
        and record.get("stopped_at_rung") is None
        and isinstance(record.get("latency_ms"), (int, float))
    )


def _model(folder: Path, record: Mapping[str, Any]) -> Path | None:
    name = record.get("model_file")
    path = folder / name if name else None
    return path if path is not None and path.is_file() else None


def _chosen(
    config: SearchConfig, folder: Path, records: Sequence[Mapping[str, Any]]
) -> tuple[list[Mapping[str, Any]], bool]:
    """The records whose models are timed again, and whether latency decides among them."""
    deciding = config.select == "latency" or "latency_ms" in (config.objectives or ())
    chosen: list[Mapping[str, Any]] = []
    if deciding:
        candidates = [r for r in records if is_candidate(r) and _complete(r)]
        candidates.sort(key=lambda r: float(r["latency_ms"]))
        chosen = [r for r in candidates if _model(folder, r) is not None][:MAX_MODELS]
    best = best_record(records, config.metric_higher_is_better, config.select)
    if best is not None and _complete(best) and _model(folder, best) is not None:
        if all(r["trial_id"] != best["trial_id"] for r in chosen):
            chosen.append(best)
    return chosen, deciding


def retime(
    config: SearchConfig,
    folder: str | os.PathLike,
    records: Sequence[Mapping[str, Any]],
    evaluation: DataSource,
    float_model: str | os.PathLike,
) -> Retimed | None:
    """Time the float model and the models whose latency counts again, alone (see the
    module); None when nothing is timed (latency not measured, trials on GPUs, or no model
    of a finished trial left on disk).

    Returns:
        :class:`Retimed`; its ``summary`` holds ``latency_retimed`` (how: rounds, runs,
        threads; per model the median, lowest and highest of the rounds in milliseconds, and
        the trial's own figure) and ``best_latency_vs_float`` (the best setting's latency
        over the float model's, both timed alone).
    """
    if not config.measure_latency or config.resources.gpu_per_trial > 0:
        return None
    folder = Path(folder)
    chosen, deciding = _chosen(config, folder, records)
    if not chosen:
        return None
    threads = max(1, int(config.resources.cpu_per_trial))
    paths = {"float": Path(float_model)} | {str(r["trial_id"]): _model(folder, r) for r in chosen}
    budget = BUDGET_S if deciding else REPORT_BUDGET_S
    rounds = _time_rounds(paths, threads, evaluation.batch(0), budget)
    if rounds is None:
        return None
    timed = {name: _spread(values) for name, values in rounds.items()}
    during = {str(r["trial_id"]): float(r["latency_ms"]) for r in chosen}
    for name, figures in timed.items():
        if name in during:
            figures["in_search_ms"] = round(during[name], 4)
    out = []
    for record in records:
        figures = timed.get(str(record.get("trial_id")))
        if figures is not None:
            record = {
                **record,
                "latency_ms": figures["median_ms"],
                "latency_ms_in_search": record.get("latency_ms"),
            }
        out.append(dict(record))
    if deciding:
        _drop_unkept(config, folder, out)
    float_ms = timed["float"]["median_ms"]
    best = best_record(out, config.metric_higher_is_better, config.select)
    ratio = None
    if best is not None and str(best["trial_id"]) in timed and float_ms > 0:
        ratio = round(timed[str(best["trial_id"])]["median_ms"] / float_ms, 4)
    summary = {
        "latency_retimed": {
            "decides": deciding,
            "rounds": len(rounds["float"]),
            "runs_per_round": RUNS,
            "threads": threads,
            "models": timed,
        },
        "best_latency_vs_float": ratio,
    }
    _logger.info(
        "latency timed again alone (%d rounds of %d runs, %d threads): %s",
        len(rounds["float"]),
        RUNS,
        threads,
        ", ".join(f"{name} {f['median_ms']:.4g} ms" for name, f in timed.items()),
    )
    return Retimed(out, float_ms, summary)


def _time_rounds(
    paths: Mapping[str, Path], threads: int, feed: Mapping[str, Any], budget_s: float
) -> dict[str, list[float]] | None:
    """Each model's figure per round (see the module; no round starts after ``budget_s``
    once :data:`MIN_ROUNDS` are done); None (and a warning) when ONNX Runtime cannot time
    one: the trials' figures stay."""
    from raysearch.evaluate import measure_latency
    from raysearch.providers import make_session

    try:
        sessions = {name: make_session(path, threads) for name, path in paths.items()}
        rounds: dict[str, list[float]] = {name: [] for name in sessions}
        started = time.perf_counter()
        for done in range(ROUNDS):
            if done >= MIN_ROUNDS and time.perf_counter() - started > budget_s:
                break
            for name, session in sessions.items():
                rounds[name].append(measure_latency(session, feed, runs=RUNS))
    except Exception as exc:  # noqa: BLE001 - latency is secondary: keep the trials' figures
        _logger.warning("latency could not be timed again alone: %s", exc)
        return None
    return rounds


def _drop_unkept(config: SearchConfig, folder: Path, records: list[dict[str, Any]]) -> None:
    """Once latency timed alone has decided, keep under ``candidates/`` and ``kept/`` what the
    recorder keeps by the same rule (the ``keep_candidates`` best, the Pareto front, the best
    trial's), by the figures timed alone: a model kept for its figure in the search that is
    none of those now is deleted, its record's ``model_file`` None (the journal keeps its
    line; a finished search's model that is gone reads as not kept)."""
    from raysearch.layout import CANDIDATES, KEPT
    from raysearch.modelfile import remove_model
    from raysearch.ranking import best_records, pareto_front

    higher = config.metric_higher_is_better
    with_models = [r for r in records if _model(folder, r) is not None]
    top = [r for r in with_models if str(r.get("model_file")).startswith(CANDIDATES + "/")]
    if config.keep_candidates is not None:
        top = best_records(top, config.keep_candidates, higher, config.select)
    front = pareto_front(records, config.objectives, higher) if len(config.objectives) > 1 else []
    keep = {id(r) for r in [*top, *front, best_record(records, higher, config.select)]}
    for record in with_models:
        model_file = str(record.get("model_file"))
        if id(record) not in keep and model_file.startswith((CANDIDATES + "/", KEPT + "/")):
            remove_model(folder / model_file)
            record["model_file"] = None
            _logger.debug("trial %s: its model is no longer kept (timed alone)", record["trial_id"])


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
    (``ratio``: ``best_latency_vs_float``; ``deciding``: latency chose the best).

    Example:
        >>> slower_than_float_note(4.94)
        'the best setting is slower than the float model: 494% of its latency, each timed alone after the search (select: latency, or objectives with latency_ms, weighs speed)'
        >>> slower_than_float_note(1.5, deciding=True)
        'the best setting is slower than the float model: 150% of its latency, each timed alone after the search (no candidate timed was faster)'
        >>> slower_than_float_note(0.8) is None
        True
    """  # noqa: E501
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
