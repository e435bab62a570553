""":func:`write_outputs`: every output of a search from its records, each file moved into
place whole; and the summary it returns.

Example:
    >>> summary = write_outputs(out, records, config=cfg, stop_reason="space_exhausted",
    ...                         wall_time_s=12.5)                           # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysearch.cpu import cpu_info
from raysearch.fileio import atomic_write_text
from raysearch.layout import ATOMIC_FILES, RESULTS, SUMMARY, TENSORBOARD
from raysearch.outputs._best import write_best
from raysearch.outputs._pareto import write_pareto
from raysearch.outputs._plots import plot_job, write_plots
from raysearch.outputs._report import PLOTLY_SRC_ENV, write_report
from raysearch.outputs._table import results_table, write_parquet
from raysearch.outputs._tensorboard import write_tensorboard
from raysearch.ranking import best_record, finite, is_candidate, is_probe, order, unquantized
from raysearch.space.space import json_default

if TYPE_CHECKING:
    from raysearch.config import SearchConfig
    from raysearch.evaluate import Evaluator
    from raysearch.outputs._plots_process import PlotProcess

__all__ = ["write_outputs", "write_trial_plots", "preload_output_modules", "running_summary"]

_logger = logging.getLogger("raysearch.outputs")

#: What writing the outputs imports (seconds of imports a search does while trials run).
_OUTPUT_MODULES = (
    "tensorboardX",
    "matplotlib.pyplot",
    "optuna.importance",
    "optuna.visualization",
    "plotly.graph_objects",
    "plotly.offline",
)
#: What only drawing ``plots/`` in the driver needs (a search with a plot process does not).
_PLOT_MODULES = ("matplotlib.pyplot",)


def preload_output_modules(plots: bool = True, figures: bool = False) -> threading.Thread:
    """Import, in a daemon thread, the modules :func:`write_outputs` needs (without ``plots``,
    not matplotlib), so that a search does not import them after its last trial; with
    ``figures``, build the report's figures once too (:func:`raysearch.outputs._study.warm_up`).
    ``figures`` is for a process that ends with its search: the warm-up sets warnings filters,
    which are not thread-safe, and a program running several searches is warm from its first."""
    names = [name for name in _OUTPUT_MODULES if plots or name not in _PLOT_MODULES]

    def _import_all() -> None:
        if plots:
            import matplotlib

            matplotlib.use("Agg", force=False)
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as exc:  # the writer reports a missing module where it is used
                _logger.debug("preloading %s: %s", name, exc)
        if not figures:
            return
        try:
            from raysearch.outputs._study import warm_up

            warm_up()
        except Exception as exc:  # the report says what fails where it is written
            _logger.debug("warming the report's figures up: %s", exc)

    thread = threading.Thread(target=_import_all, name="raysearch-preload-outputs", daemon=True)
    thread.start()
    return thread


def _sweep_leftovers(out: Path) -> None:
    """Remove the temporary files of a writer that was killed mid-write."""
    for sub, stems in ATOMIC_FILES.items():
        folder = out / sub if sub else out
        if not folder.is_dir():
            continue
        for stem in stems:
            for item in folder.glob(f".{stem}.*"):
                if ".tmp" not in item.name and not item.name.endswith(".old"):
                    continue
                if item.is_dir() and not item.is_symlink():
                    shutil.rmtree(item, ignore_errors=True)
                else:
                    item.unlink(missing_ok=True)


def _summary(
    rows: list[Mapping[str, Any]],
    best: Mapping[str, Any] | None,
    best_path: Path | None,
    config: SearchConfig,
    **values: Any,
) -> dict[str, Any]:
    """``summary.json``'s content, in its order; ``values``: the caller's figures."""
    higher = config.metric_higher_is_better

    def of_best(key: str) -> Any:
        return None if best is None else getattr(best, key)

    summary: dict[str, Any] = {
        "stop_reason": values["stop_reason"],
        "n_trials": len(rows),
        "n_failed": sum(1 for r in rows if r.status != "ok"),
        "n_candidates": sum(1 for r in rows if is_candidate(r)),
        "best_metric": None if best is None else best.metric,
        "best_params": of_best("params"),
        "best_model_path": None if best_path is None else str(best_path),
        "best_trial_id": None if best is None else best.trial_id,
        "float_metric": values["float_metric"],
        "wall_time_s": round(float(values["wall_time_s"]), 3),
        "metric": config.metric,
        "higher_is_better": higher,
        "direction": "maximize" if higher else "minimize",
        "tolerance": config.tolerance,
        "tolerance_mode": config.tolerance_mode if config.is_custom_metric else None,
        "search_algo": config.search_algo,
        "seed": config.seed,
        "best_model_size_bytes": of_best("model_size_bytes"),
        "float_model_size_bytes": values["float_model_size_bytes"],
        "best_latency_ms": of_best("latency_ms"),
        "float_latency_ms": values["float_latency_ms"],
    }
    if any(r.decode_latency_ms is not None for r in rows):
        summary["best_decode_latency_ms"] = of_best("decode_latency_ms")
        summary["best_prefill_latency_ms"] = of_best("prefill_latency_ms")
    extra = of_best("extra") or {}
    if f"{config.metric}_ci_low" in extra:
        interval = [extra[f"{config.metric}_ci_low"], extra.get(f"{config.metric}_ci_high")]
        summary["best_metric_interval"] = interval
    devices = sorted({str(r.device) for r in rows if r.device})
    summary["device"] = ", ".join(devices) if devices else None
    summary["cpu"] = cpu_info()
    fallback = [r for r in rows if r.gpu_id is not None and r.device == "cpu"]
    if fallback:
        summary["gpu_note"] = (
            f"{len(fallback)} trials were assigned a GPU but ONNX Runtime's CUDA provider did "
            "not load on their node; they ran on the CPU"
        )
        _logger.warning(summary["gpu_note"])
    return summary


def _tolerance_notes(
    rows: list[Mapping[str, Any]],
    best: Mapping[str, Any] | None,
    config: SearchConfig,
    float_metric: float | None,
    evaluator: Evaluator | None,
) -> dict[str, Any]:
    """The summary's fields when no trial is a candidate: why (:func:`_unquantized_note`,
    else :func:`_bounds_note`) and how far the best missed the tolerance (``best_missed_by``:
    None without a tolerance, or for a custom metric without the float score its drop is
    measured against); empty while a trial is a candidate. ``evaluator``: else the config's."""
    if any(is_candidate(r) for r in rows):
        return {}
    if config.tolerance is None:
        return {"best_missed_by": None}
    if evaluator is None:
        from raysearch.evaluate import Evaluator

        evaluator = Evaluator.from_config(config)
    if evaluator.is_custom and float_metric is None:
        return {"best_missed_by": None}
    fields = _unquantized_note(rows, best, config, float_metric, evaluator)
    fields = fields or _bounds_note(rows, float_metric, evaluator)
    if "best_quantized_missed_by" not in fields:
        missed = None if best is None else evaluator.missed_by(best.metric, float_metric)
        fields["best_missed_by"] = missed
    return fields


def _unquantized_note(
    rows: list[Mapping[str, Any]],
    best: Mapping[str, Any] | None,
    config: SearchConfig,
    float_metric: float | None,
    evaluator: Evaluator,
) -> dict[str, Any]:
    """The summary's words when some settings that quantize nothing met the tolerance: how
    many (``unquantized_met_tolerance``), how far the best quantized setting missed
    (``best_quantized_missed_by``) and a sentence (``tolerance_note``); empty otherwise."""
    met = [
        r
        for r in rows
        if r.status == "ok"
        and finite(r.metric) is not None
        and r.stopped_at_rung is None
        and unquantized(r)
        and evaluator.is_candidate(r.metric, float_metric)
    ]
    if not met:
        return {}
    name = str(config.metric).rsplit(":", 1)[-1]  # a custom evaluator by its function
    bound = f"{name} {'>=' if evaluator.higher_is_better else '<='} "
    bound += f"{evaluator.threshold(float_metric):.6g}"
    trials = "1 trial that keeps" if len(met) == 1 else f"{len(met)} trials that keep"
    said = (
        f"{trials} every MatMul/Gemm/Conv node float (never a candidate: the float model's "
        f"speed) met the tolerance ({bound}), but no setting that quantizes something"
    )
    fields: dict[str, Any] = {"unquantized_met_tolerance": len(met)}
    if best is None or unquantized(best):
        fields["best_quantized_missed_by"] = None
        fields["tolerance_note"] = f"{said} completed: best/ holds one that quantizes nothing"
    else:
        missed = evaluator.missed_by(best.metric, float_metric)
        fields["best_quantized_missed_by"] = missed
        fields["tolerance_note"] = (
            f"{said} did: the best quantized setting, trial {best.trial_id} ({name} = "
            f"{best.metric:.6g}, in best/), missed it by {missed:.3g}"
        )
    _logger.warning(fields["tolerance_note"])
    return fields


#: The bounds beyond the tolerance that keep a trial from being a candidate: the record's
#: ``extra`` flag, and how the note names the bound.
_BOUNDS = {"decode_over_bound": "decoded slower than max_decode_latency",
           "size_over_budget": "were larger than size_budget"}  # fmt: skip


def _bounds_note(
    rows: list[Mapping[str, Any]], float_metric: float | None, evaluator: Evaluator
) -> dict[str, Any]:
    """The summary's ``tolerance_note`` when some trials that met the tolerance were kept out
    by ``max_decode_latency`` or ``size_budget``."""
    met = [
        r
        for r in rows
        if finite(r.metric) is not None
        and not is_probe(r)
        and evaluator.is_candidate(r.metric, float_metric)
    ]
    counts = {flag: sum(1 for r in met if r.extra.get(flag)) for flag in _BOUNDS}
    said = [f"{n} {_BOUNDS[flag]}" for flag, n in counts.items() if n]
    if not said:
        return {}
    note = f"no candidate: of the {len(met)} settings that met the tolerance, " + " and ".join(said)
    _logger.warning(note)
    return {"tolerance_note": note}


def write_trial_plots(
    output_dir: str | os.PathLike,
    records: Sequence[Mapping[str, Any]],
    config: SearchConfig,
    float_metric: float | None = None,
    plots: PlotProcess | None = None,
) -> dict[str, Any]:
    """Write ``tensorboard/`` and ``plots/`` (which read neither latency nor ``best/``, so a
    search writes them while latency is timed again) and return the fields they give
    ``summary.json``; with ``plots`` the plot process draws them."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    _sweep_leftovers(out)
    rows = order(records)
    fields: dict[str, Any] = {}
    if plots is not None:
        try:
            plots.draw(plot_job(rows, config, float_metric, fields))
        except Exception:  # secondary output: never lose the summary for it
            _logger.exception("writing plots/ failed")
    try:
        write_tensorboard(rows, out / TENSORBOARD, config.metric_higher_is_better)
    except Exception:  # secondary output: never lose the summary for it
        _logger.exception("writing tensorboard/ failed")
    if plots is None:
        write_plots(rows, out, config, float_metric, fields)
    return fields


def write_outputs(
    output_dir: str | os.PathLike,
    records: Sequence[Mapping[str, Any]],
    *,
    config: SearchConfig,
    stop_reason: str,
    wall_time_s: float,
    float_metric: float | None = None,
    float_model_size_bytes: int | None = None,
    float_latency_ms: float | None = None,
    extra: Mapping[str, Any] | None = None,
    evaluator: Evaluator | None = None,
    plotted: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write every output of a search from its ``records``; return the summary dict.
    ``evaluator``: the search's (built from ``config`` when a note needs one); ``plotted``:
    what :func:`write_trial_plots` returned when the caller wrote those before (None: here)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    _sweep_leftovers(out)
    higher = config.metric_higher_is_better
    rows = order(records)
    best = best_record(rows, higher, config.select)
    best_path = None if best is None else write_best(out, best, config)
    summary = _summary(
        rows,
        best,
        best_path,
        config,
        stop_reason=stop_reason,
        wall_time_s=wall_time_s,
        float_metric=float_metric,
        float_model_size_bytes=float_model_size_bytes,
        float_latency_ms=float_latency_ms,
    )
    summary.update(_tolerance_notes(rows, best, config, float_metric, evaluator))
    summary.update(write_pareto(out, rows, config))
    summary.update(extra or {})
    if best is not None and best.device not in (None, "cpu"):
        # The float model is timed on the driver's CPU: a best timed on a GPU is not set
        # against it.
        for key in ("float_latency_ms", "float_decode_latency_ms", "float_prefill_latency_ms"):
            if summary.get(key) is not None:
                summary[key.replace("_ms", "_cpu_ms")], summary[key] = summary[key], None
    write_parquet(results_table(rows), out / RESULTS)
    if plotted is None:
        plotted = write_trial_plots(out, rows, config, float_metric)
    summary.update(plotted)
    atomic_write_text(out / SUMMARY, json.dumps(summary, indent=2, default=json_default) + "\n")
    write_report(out, rows, summary, config=config, plotly_src=os.environ.get(PLOTLY_SRC_ENV))
    return summary


def running_summary(records: Sequence[Mapping[str, Any]], config: SearchConfig) -> dict[str, Any]:
    """``summary.json``'s fields for a search that has not finished: what its ``records`` say
    so far, ``stop_reason`` ``running``, no float model figures."""
    rows = order(records)
    best = best_record(rows, config.metric_higher_is_better, config.select)
    elapsed = [float(r.elapsed_s) for r in rows if finite(r.elapsed_s) is not None]
    summary = _summary(
        rows,
        best,
        None,
        config,
        stop_reason="running",
        wall_time_s=max(elapsed, default=0.0),
        float_metric=None,
        float_model_size_bytes=None,
        float_latency_ms=None,
    )
    summary.pop("cpu", None)  # this machine's, not the search's driver's
    return summary
