"""The files a search leaves under ``output_dir`` (README.md, "Outputs"), written from its
records.

:func:`write_outputs` takes the finished-trial records (the journal's lines, see
:mod:`raysearch.search.recorder`) and writes

- ``summary.json``: ``stop_reason``, ``n_trials``, ``n_failed``, ``n_candidates``,
  ``best_metric``, ``best_params``, ``best_model_path``, ``float_metric``, ``wall_time_s``,
  plus the metric's name and direction, the tolerance, the algorithm and the device;
- ``results.parquet``: one row per trial (``trial_id``, ``number``, ``status``, ``metric``,
  ``is_candidate``, the timings, ``calib_cache_hit``, ``node``, ``device``, ``error``, ...)
  and one ``params/<key path>`` column per parameter (a column whose values mix types, or hold
  lists, is JSON text);
- ``best/model.onnx`` (the best trial's model, with its external data as
  ``best/model.onnx.data`` when it has any: ``best/`` loads from wherever it is moved) and
  ``best/config.yaml`` (the user's config with the search space reduced to that one setting,
  ``search_algo: Grid``);
- ``tensorboard/`` (metric, best-so-far, duration per trial), ``plots/metric_per_trial.png``
  and, from two complete trials on, ``plots/param_importance.png`` (Optuna's PED-ANOVA
  importance, which needs no extra package).

Every file is written to a temporary name in its folder and moved into place with
``os.replace``; a folder (``tensorboard/``) is built beside its final name and swapped in.

Example:
    >>> summary = write_outputs(out, records, config=cfg, stop_reason="space_exhausted",
    ...                         wall_time_s=12.5)                           # doctest: +SKIP
    >>> summary["n_trials"], summary["best_metric"]                        # doctest: +SKIP
    (6, 0.0031)
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import os
import shutil
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from raysearch.fileio import replacing
from raysearch.modelfile import place_model
from raysearch.search.journal import atomic_write_text, json_default

if TYPE_CHECKING:
    from raysearch.config import SearchConfig

__all__ = [
    "write_outputs",
    "results_table",
    "fixed_space",
    "best_record",
    "RESULT_COLUMNS",
]

_logger = logging.getLogger(__name__)

#: Fixed columns of ``results.parquet`` and their Arrow types (``params/...`` follow).
RESULT_COLUMNS: dict[str, pa.DataType] = {
    "trial_id": pa.string(),
    "number": pa.int64(),
    "phase": pa.int64(),
    "status": pa.string(),
    "metric": pa.float64(),
    "is_candidate": pa.bool_(),
    "duration_s": pa.float64(),
    "calibration_s": pa.float64(),
    "quantization_s": pa.float64(),
    "evaluation_s": pa.float64(),
    "calib_cache_hit": pa.bool_(),
    "model_size_bytes": pa.int64(),
    "latency_ms": pa.float64(),
    "node": pa.string(),
    "node_id": pa.string(),
    "gpu_id": pa.string(),
    "device": pa.string(),
    "error": pa.string(),
    "model_file": pa.string(),
}


# -- records -------------------------------------------------------------------------------------
def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _order(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Records in the order their trials started (``number``), ties by trial id."""

    def key(record: Mapping[str, Any]) -> tuple[int, str]:
        number = record.get("number")
        return (number if isinstance(number, int) else 1 << 62, str(record.get("trial_id")))

    return sorted(records, key=key)


def best_record(
    records: Sequence[Mapping[str, Any]], higher_is_better: bool
) -> Mapping[str, Any] | None:
    """The complete trial with the best metric (the earliest one on a tie), or None."""
    best = None
    for record in _order(records):
        metric = _finite(record.get("metric"))
        if record.get("status") != "ok" or metric is None:
            continue
        if best is None or (
            metric > best["metric"] if higher_is_better else metric < best["metric"]
        ):
            best = record
    return best


# -- results.parquet -----------------------------------------------------------------------------
def _column(values: list[Any]) -> pa.Array:
    """One Arrow column: bool, int64, float64 or string when the values agree, else JSON."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return pa.array(values, pa.bool_())
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pa.array(values, pa.int64())
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return pa.array([None if v is None else float(v) for v in values], pa.float64())
    if all(isinstance(v, str) for v in present):
        return pa.array(values, pa.string())
    return pa.array(
        [
            None if v is None else json.dumps(v, sort_keys=True, default=json_default)
            for v in values
        ],
        pa.string(),
    )


def results_table(records: Sequence[Mapping[str, Any]]) -> pa.Table:
    """The ``results.parquet`` table of ``records`` (one row per trial, in start order)."""
    rows = _order(records)
    columns: dict[str, pa.Array] = {}
    for name, dtype in RESULT_COLUMNS.items():
        values = [r.get(name) for r in rows]
        if dtype == pa.float64():
            values = [_finite(v) for v in values]
        elif dtype == pa.int64():
            values = [v if isinstance(v, int) and not isinstance(v, bool) else None for v in values]
        elif dtype == pa.bool_():
            values = [None if v is None else bool(v) for v in values]
        else:
            values = [None if v is None else str(v) for v in values]
        columns[name] = pa.array(values, dtype)
    param_names: list[str] = []
    extra_names: list[str] = []
    for r in rows:
        for name in r.get("params") or {}:
            if name not in param_names:
                param_names.append(name)
        for name in r.get("extra") or {}:
            if name not in extra_names:
                extra_names.append(name)
    for name in param_names:
        columns[f"params/{name}"] = _column([(r.get("params") or {}).get(name) for r in rows])
    for name in extra_names:
        columns[f"extra/{name}"] = pa.array(
            [_finite((r.get("extra") or {}).get(name)) for r in rows], pa.float64()
        )
    return pa.table(columns)


# -- best/config.yaml ----------------------------------------------------------------------------
def fixed_space(params: Mapping[str, Any]) -> dict[str, Any]:
    """A flat-dialect search space with one choice per key: ``params`` (dotted key paths)
    nested back into groups, every value wrapped in a one-element list.

    Example:
        >>> fixed_space({"calibrate_method": "MinMax", "extra_options.WeightSymmetric": True})
        {'calibrate_method': ['MinMax'], 'extra_options': {'WeightSymmetric': [True]}}
    """
    space: dict[str, Any] = {}
    for name, value in params.items():
        parts = name.split(".")
        target = space
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = [copy.deepcopy(value)]
    return space


def _best_config(raw: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    config = copy.deepcopy(dict(raw))
    for key in ("search_space", "search_spaces", "stop", "output_dir", "storage_path", "seed"):
        config.pop(key, None)
    config["search_algo"] = "Grid"
    config["search_space"] = fixed_space(params)
    return config


# -- writers -------------------------------------------------------------------------------------
def _write_parquet(table: pa.Table, path: Path) -> None:
    with replacing(path) as tmp:
        pq.write_table(table, tmp)


def _swap_dir(built: Path, final: Path) -> None:
    """Move every file of ``built`` into ``final`` (each with ``os.replace``), then remove the
    files of ``final`` that ``built`` did not hold: ``final`` always exists and holds complete
    files, and files a user put there stay unless ``built`` had one of the same name."""
    final.mkdir(parents=True, exist_ok=True)
    new = {item.name for item in built.iterdir()}
    old = [item for item in final.glob("events.out.tfevents.*") if item.name not in new]
    for item in built.iterdir():
        os.replace(item, final / item.name)
    for item in old:
        with contextlib.suppress(FileNotFoundError):
            item.unlink()
    shutil.rmtree(built, ignore_errors=True)


def _sweep_leftovers(out: Path) -> None:
    """Remove the temporary files of a writer that was killed mid-write (one writer per
    output folder: none of them is in use)."""
    names = {
        out: (
            "summary.json",
            "results.parquet",
            "tensorboard",
            "state.json",
            ".raysearch.json",
            "raysearch_config.yaml",
        ),
        out / "best": ("model.onnx", "config.yaml"),
        out / "plots": ("metric_per_trial", "param_importance"),
    }
    for folder, stems in names.items():
        if not folder.is_dir():
            continue
        for stem in stems:
            for item in folder.glob(f".{stem}.*"):
                if ".tmp" not in item.name and not item.name.endswith(".old"):
                    continue
                if item.is_dir() and not item.is_symlink():
                    shutil.rmtree(item, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        item.unlink()


def _write_tensorboard(rows: list[Mapping[str, Any]], folder: Path, higher: bool) -> None:
    from tensorboardX import SummaryWriter

    built = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(built, ignore_errors=True)
    writer = SummaryWriter(logdir=str(built))
    best = None
    candidates = 0
    try:
        for step, record in enumerate(rows, 1):
            metric = _finite(record.get("metric"))
            if record.get("is_candidate"):
                candidates += 1
            if metric is not None and record.get("status") == "ok":
                writer.add_scalar("trial/metric", metric, step)
                if best is None or (metric > best if higher else metric < best):
                    best = metric
            if best is not None:
                writer.add_scalar("search/best_metric", best, step)
            writer.add_scalar("search/candidates", candidates, step)
            duration = _finite(record.get("duration_s"))
            if duration is not None:
                writer.add_scalar("trial/duration_s", duration, step)
    finally:
        writer.close()
    _swap_dir(built, folder)


def _save_figure(fig: Any, path: Path) -> None:
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")


def _plot_metric(
    rows: list[Mapping[str, Any]],
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

    xs, ys, colors, best_x, best_y = [], [], [], [], []
    best = None
    for step, record in enumerate(rows, 1):
        metric = _finite(record.get("metric"))
        if metric is None or record.get("status") != "ok":
            continue
        xs.append(step)
        ys.append(metric)
        colors.append("tab:green" if record.get("is_candidate") else "tab:blue")
        if best is None or (metric > best if higher else metric < best):
            best = metric
        best_x.append(step)
        best_y.append(best)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    try:
        ax.scatter(xs, ys, c=colors, s=18, label="trial (green: candidate)")
        if best_x:
            ax.step(best_x, best_y, where="post", color="tab:orange", label="best so far")
        line = _threshold(tolerance, tolerance_mode, float_metric, higher)
        if line is not None:
            ax.axhline(line, color="tab:red", linestyle="--", label=f"candidate bound {line:.6g}")
        if float_metric is not None:
            ax.axhline(float_metric, color="gray", linestyle=":", label="float model")
        failed = sum(1 for r in rows if r.get("status") != "ok")
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


def _importances(rows: list[Mapping[str, Any]], higher: bool) -> dict[str, float]:
    """Optuna's PED-ANOVA importance of each parameter over the complete trials."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    ok = [r for r in rows if r.get("status") == "ok" and _finite(r.get("metric")) is not None]
    names: list[str] = []
    for r in ok:
        for name in r.get("params") or {}:
            if name not in names:
                names.append(name)
    distributions: dict[str, Any] = {}
    encode: dict[str, Any] = {}
    for name in names:
        values = [(r.get("params") or {}).get(name) for r in ok if name in (r.get("params") or {})]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if numeric and len({float(v) for v in values}) > 1:
            distributions[name] = FloatDistribution(min(values), max(values))
            encode[name] = float
        else:
            labels = sorted({json.dumps(v, sort_keys=True, default=json_default) for v in values})
            if len(labels) < 2:
                continue  # a fixed setting explains nothing
            distributions[name] = CategoricalDistribution(labels)
            encode[name] = lambda v: json.dumps(v, sort_keys=True, default=json_default)
    if not distributions:
        return {}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize" if higher else "minimize")
    for r in ok:
        params = {n: encode[n](v) for n, v in (r.get("params") or {}).items() if n in encode}
        study.add_trial(
            optuna.trial.create_trial(
                params=params,
                distributions={n: distributions[n] for n in params},
                value=float(r["metric"]),
            )
        )
    evaluator = optuna.importance.PedAnovaImportanceEvaluator()
    importances: dict[str, float] = {}
    # Conditional parameters exist in some trials only: score each with the trials having it.
    for name in distributions:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                warnings.simplefilter("ignore", UserWarning)  # "few trials" notes
                value = optuna.importance.get_param_importances(
                    study, evaluator=evaluator, params=[name], normalize=False
                )
        except (ValueError, RuntimeError) as exc:
            _logger.debug("importance of %s: %s", name, exc)
            continue
        importances[name] = float(value.get(name, 0.0))
    total = sum(importances.values())
    if total > 0:
        importances = {k: v / total for k, v in importances.items()}
    return dict(sorted(importances.items(), key=lambda kv: kv[1], reverse=True))


def _plot_importance(importances: Mapping[str, float], path: Path, metric_name: str) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    names = list(importances)[::-1]
    values = [importances[n] for n in names]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(names) + 1.5))
    try:
        ax.barh(names, values, color="tab:blue")
        ax.set_xlabel("importance (PED-ANOVA, normalized)")
        ax.set_title(f"parameter importance for {metric_name}")
        ax.grid(axis="x", alpha=0.3)
        _save_figure(fig, path)
    finally:
        plt.close(fig)


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
) -> dict[str, Any]:
    """Write every output of a search from its ``records``; return the summary dict."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    _sweep_leftovers(out)
    higher = config.metric_higher_is_better
    rows = _order(records)
    best = best_record(rows, higher)

    # best/model.onnx and best/config.yaml
    best_path: Path | None = None
    best_dir = out / "best"
    if best is not None:
        best_dir.mkdir(exist_ok=True)
        model_file = best.get("model_file")
        if model_file and (out / model_file).is_file():
            # With its external-data files, renamed model.onnx.data (and the location
            # inside rewritten to match).
            best_path = place_model(out / model_file, best_dir / "model.onnx", move=False)
        else:
            _logger.warning("the best trial's model file is missing; best/model.onnx not written")
        raw = config.raw or {}
        text = yaml.safe_dump(
            _best_config(raw, best.get("params") or {}), sort_keys=False, allow_unicode=True
        )
        atomic_write_text(
            best_dir / "config.yaml",
            f"# raysearch: the best setting of {out} (trial {best['trial_id']}, "
            f"{config.metric} = {best['metric']:.6g})\n" + text,
        )

    n_failed = sum(1 for r in rows if r.get("status") != "ok")
    summary: dict[str, Any] = {
        "stop_reason": stop_reason,
        "n_trials": len(rows),
        "n_failed": n_failed,
        "n_candidates": sum(1 for r in rows if r.get("is_candidate")),
        "best_metric": None if best is None else best["metric"],
        "best_params": None if best is None else best.get("params"),
        "best_model_path": None if best_path is None else str(best_path),
        "best_trial_id": None if best is None else best["trial_id"],
        "float_metric": float_metric,
        "wall_time_s": round(float(wall_time_s), 3),
        "metric": config.metric,
        "higher_is_better": higher,
        "direction": "maximize" if higher else "minimize",
        "tolerance": config.tolerance,
        "tolerance_mode": config.tolerance_mode if config.is_custom_metric else None,
        "search_algo": config.search_algo,
        "seed": config.seed,
        "best_model_size_bytes": None if best is None else best.get("model_size_bytes"),
        "float_model_size_bytes": float_model_size_bytes,
        "best_latency_ms": None if best is None else best.get("latency_ms"),
        "float_latency_ms": float_latency_ms,
    }
    devices = sorted({str(r["device"]) for r in rows if r.get("device")})
    summary["device"] = ", ".join(devices) if devices else None
    fallback = [r for r in rows if r.get("gpu_id") is not None and r.get("device") == "cpu"]
    if fallback:
        # Said once, here, rather than per trial: GPUs were assigned but could not be used.
        summary["gpu_note"] = (
            f"{len(fallback)} trials were assigned a GPU but ONNX Runtime's CUDA provider did "
            "not load on their node; they ran on the CPU"
        )
        _logger.warning(summary["gpu_note"])
    summary.update(extra or {})

    table = results_table(rows)
    _write_parquet(table, out / "results.parquet")
    try:
        _write_tensorboard(rows, out / "tensorboard", higher)
    except Exception:  # secondary output: never lose the summary for it
        _logger.exception("writing tensorboard/ failed")
    try:
        _plot_metric(
            rows,
            out / "plots" / "metric_per_trial.png",
            config.metric,
            config.tolerance,
            higher,
            float_metric,
            config.tolerance_mode,
        )
        complete = [r for r in rows if r.get("status") == "ok" and _finite(r.get("metric"))]
        if len(complete) >= 2:
            importances = _importances(rows, higher)
            summary["param_importance"] = importances or None
            if importances:
                _plot_importance(importances, out / "plots" / "param_importance.png", config.metric)
    except Exception:
        _logger.exception("writing plots/ failed")
    atomic_write_text(
        out / "summary.json", json.dumps(summary, indent=2, default=json_default) + "\n"
    )
    return summary
