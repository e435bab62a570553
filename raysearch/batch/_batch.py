"""Batch mode: many models searched concurrently on one Ray cluster.

A manifest lists models (data, space, evaluator) and defaults shared by all. Each model's
search runs as its own ``raysearch run`` process joined to the same cluster, so one crash
cannot take the others down, each at most ``max_concurrent_trials_per_model`` trials at once;
the batch writes ``batch_summary.parquet``, ``batch_summary.md`` and ``batch_report.html``.
Running the same manifest again resumes the batch: finished searches are kept, interrupted
ones resumed, failed ones tried again.

Example manifest::

    output_dir: batch_output
    defaults: {search_algo: Grid, metric: cos, tolerance: 0.999}
    models:
      - name: magika
        model: models/magika.onnx
        calibration_data: data/magika_calib.npz
        search_space: A8W8_SEARCH
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from raysearch.batch._searches import BatchSearches, local_ray_env, say
from raysearch.config import SearchConfig, read_yaml
from raysearch.errors import ConfigError, InputError, suggest
from raysearch.fileio import atomic_write_text, replacing
from raysearch.layout import JOURNAL
from raysearch.outputs import (
    PLOTLY_JS,
    PLOTLY_SRC_ENV,
    float_model_metric,
    write_batch_report,
    write_plotly_js,
)
from raysearch.search.record.journal import Journal

__all__ = ["BatchManifest", "run_batch"]

_logger = logging.getLogger(__name__)

_MANIFEST_KEYS = {
    "output_dir",
    "defaults",
    "models",
    "max_concurrent_trials_per_model",
    "max_concurrent_models",
    "model_timeout_s",
    "address",
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_PATH_KEYS = ("model", "calibration_data", "eval_data")
#: Columns of ``batch_summary.parquet``, one row per model.
BATCH_COLUMNS = (
    "name",
    "status",
    "error",
    "float_metric",
    "best_metric",
    "best_params",
    "n_candidates",
    "n_trials",
    "n_failed",
    "wall_time_s",
    "stop_reason",
    "output_dir",
)


@dataclass
class ModelEntry:
    """One model of a batch: its merged raw config and, if it is valid, the validated one."""

    name: str
    raw: dict[str, Any]
    config: SearchConfig | None = None
    error: str | None = None
    #: This model's own ``model_timeout_s``, over the manifest's.
    timeout_s: float | None = None


@dataclass
class BatchManifest:
    """A validated batch manifest. Invalid model entries are kept with their error: they are
    reported in the summary instead of stopping the batch."""

    path: Path
    output_dir: Path
    models: list[ModelEntry]
    per_model_concurrency: int | None = None
    address: str | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    #: Model searches running at once (default: :func:`default_models_at_once`).
    max_concurrent_models: int | None = None
    #: A model's search still running after this long is stopped (None: no limit).
    model_timeout_s: float | None = None

    @classmethod
    def load(
        cls, path: str | os.PathLike, output_dir: Path | None = None, address: str | None = None
    ) -> BatchManifest:
        """The manifest at ``path``; ``output_dir`` and ``address`` (the command line's) over
        the manifest's own.

        Raises:
            ConfigError: the manifest itself is bad (a model's config that is bad is kept
                with its error instead).
        """
        path = Path(path)
        data = read_yaml(path)
        for key in data:
            if key not in _MANIFEST_KEYS:
                raise ConfigError(str(key), "unknown key" + suggest(str(key), _MANIFEST_KEYS))
        base = path.resolve().parent
        defaults = data.get("defaults") or {}
        if not isinstance(defaults, dict):
            raise ConfigError("defaults", f"expected a mapping of config keys, got {defaults!r}")
        _no_own_cluster(defaults, "defaults.")
        address = address or _address(data.get("address"))
        items = data.get("models")
        if not isinstance(items, list) or not items:
            raise ConfigError("models", "expected a non-empty list of models")
        concurrency = _positive(data, "max_concurrent_trials_per_model", int)
        models_at_once = _positive(data, "max_concurrent_models", int)
        timeout_s = _positive(data, "model_timeout_s", float)
        out = Path(output_dir or data.get("output_dir", "batch_output"))
        out = out if out.is_absolute() else Path.cwd() / out
        models: list[ModelEntry] = []
        seen: set[str] = set()
        for i, item in enumerate(items):
            models.append(_model_entry(i, item, defaults, base, out, seen))
        return cls(
            path,
            out,
            models,
            concurrency,
            address,
            defaults,
            max_concurrent_models=models_at_once,
            model_timeout_s=timeout_s,
        )


def _address(value: Any) -> str | None:
    """The manifest's ``address`` (None: a Ray of the batch's own)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(
            "address", f"expected 'auto', 'host:port' or 'ray://host:port', got {value!r}"
        )
    return value


def _no_own_cluster(config: dict[str, Any], where: str) -> None:
    """Refuse a model's own ``address`` (or the defaults'): a batch runs on one cluster."""
    if "address" in config:
        raise ConfigError(
            f"{where}address",
            "the batch's searches all run on the batch's cluster: set it with the manifest's "
            "address or raysearch batch --address",
        )


def _positive(data: dict[str, Any], key: str, kind: type, where: str = "") -> Any:
    """``data[key]``: None when absent, else a number > 0 (an integer when ``kind`` is int)."""
    value = data.get(key)
    if value is None:
        return None
    number = isinstance(value, int) or (kind is float and isinstance(value, float))
    if isinstance(value, bool) or not number or value <= 0:
        what = "an integer >= 1" if kind is int else "a number of seconds > 0"
        raise ConfigError(where + key, f"expected {what}, got {value!r}")
    return kind(value)


def _model_entry(
    i: int, item: Any, defaults: dict[str, Any], base: Path, out: Path, seen: set[str]
) -> ModelEntry:
    """Entry ``i`` of the manifest's models: its name checked, the defaults merged under it,
    its paths made absolute, its config validated (an invalid one keeps its error)."""
    where = f"models[{i}]"
    if not isinstance(item, dict):
        raise ConfigError(where, f"expected a mapping, got {item!r}")
    name = item.get("name") or Path(str(item.get("model", f"model{i}"))).stem
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{where}.name", f"expected a folder-safe name, got {name!r}")
    if name in seen:
        raise ConfigError(f"{where}.name", f"'{name}' is used by two models")
    seen.add(name)
    _no_own_cluster(item, f"{where}.")
    # A model's own time limit is a batch key, taken out of the search's config.
    timeout_s = _positive(item, "model_timeout_s", float, f"{where}.")
    raw = copy.deepcopy(defaults)
    raw.update({k: v for k, v in item.items() if k not in ("name", "model_timeout_s")})
    for key in _PATH_KEYS:
        value = raw.get(key)
        if isinstance(value, str) and not value.startswith("builtin:"):
            p = Path(os.path.expanduser(value))
            raw[key] = str(p if p.is_absolute() else base / p)
    raw["output_dir"] = str(out / name)
    entry = ModelEntry(name, raw, timeout_s=timeout_s)
    try:
        entry.config = SearchConfig.from_dict(raw, base_dir=base)
    except InputError as exc:
        # One line per model in the batch summary.
        entry.error = f"{where}: " + "; ".join(str(exc).splitlines())
    return entry


def _search_state(folder: Path) -> str:
    """``finished``, ``interrupted`` (resumable), or ``new``."""
    summary = folder / "summary.json"
    if summary.exists():
        try:
            reason = json.loads(summary.read_text()).get("stop_reason")
        except (OSError, json.JSONDecodeError):
            reason = None
        return "interrupted" if reason == "interrupted" else "finished"
    if folder.exists() and any(folder.iterdir()):
        return "interrupted"
    return "new"


def _row(entry: ModelEntry, folder: Path, error: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {c: None for c in BATCH_COLUMNS}
    row.update(name=entry.name, output_dir=str(folder))
    summary_path = folder / "summary.json"
    if error is None and summary_path.exists():
        summary = json.loads(summary_path.read_text())
        keys = ("best_metric", "n_candidates", "n_trials", "n_failed", "wall_time_s", "stop_reason")
        row.update({k: summary.get(k) for k in keys})
        row["float_metric"] = float_model_metric(summary)
        row["best_params"] = json.dumps(summary.get("best_params"), default=str)
        if summary.get("n_trials") and summary.get("n_failed") == summary.get("n_trials"):
            error = "every trial failed (see results.parquet)"
    elif error is None:
        error = "the search left no summary.json"
    row["status"] = "failed" if error else "ok"
    row["error"] = error
    return row


def default_models_at_once(cpus: int) -> int:
    """Model searches a batch runs at once by default: twice the cluster's CPUs, since a
    search holds no CPU while it starts and while it writes its outputs (Ray's resources
    still run at most one trial per CPU).
    Example:
        >>> default_models_at_once(2)
        4
    """
    return 2 * max(1, cpus)


def run_batch(
    manifest: BatchManifest, *, progress: TextIO | None = None, overwrite: bool = False
) -> pa.Table:
    """Run (or resume) every model of the manifest on one Ray cluster; return the summary
    table. The searches join it by ``RAY_ADDRESS``, so each ``best/config.yaml`` holds no
    address."""
    import ray

    from raysearch.search.runtime.cluster import shutdown_ray, start_ray, started_locally, stop_ray

    out = manifest.output_dir
    # A cluster that does not answer is refused before anything is written.
    started_here = start_ray(manifest.address)
    address = ray.get_runtime_context().gcs_address
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / "configs").mkdir(exist_ok=True)
    cpus = int(ray.cluster_resources().get("CPU", 1))
    runnable = [m for m in manifest.models if m.config is not None]
    at_once = manifest.max_concurrent_models or default_models_at_once(cpus)
    running_models = max(1, min(at_once, len(runnable)))
    per_model = manifest.per_model_concurrency or max(1, cpus // running_models)

    errors: dict[str, str] = {m.name: m.error for m in manifest.models if m.error}
    queue, kept = [], {}
    for entry in runnable:
        cmd = _command(entry, out, address, per_model, overwrite, progress)
        if cmd is None:  # finished before: it counts as it ended
            kept[entry.name] = _row(entry, out / entry.name, None)["status"] == "ok"
        else:
            queue.append((entry.name, cmd))
    # A Ray this batch started (not a cluster it joined) ends with the batch.
    env = local_ray_env() if started_here and not manifest.address else dict(os.environ)
    env["RAY_ADDRESS"] = address
    if _shared_plotly(out):  # the models' reports load it from the batch's folder
        env[PLOTLY_SRC_ENV] = f"../{PLOTLY_JS}"
    timeouts = {m.name: m.timeout_s or manifest.model_timeout_s for m in runnable}
    searches = BatchSearches(out, at_once, timeouts, errors, progress, env=env)
    try:
        searches.run(
            queue,
            models=[m.name for m in manifest.models],
            kept=kept,
            fresh=[name for name, _ in queue] if overwrite else (),
        )
    finally:
        searches.stop_all()
        if started_here:
            # stop_ray also forgets the local Ray, which a later search must not take for one
            # it started.
            stop_ray() if started_locally() else shutdown_ray()
    rows = [_row(m, out / m.name, errors.get(m.name)) for m in manifest.models]
    table = pa.Table.from_pylist(rows, schema=_schema())
    _write_summary(table, out)
    spans = {m.name: _span(out / m.name, searches.spans.get(m.name)) for m in manifest.models}
    write_batch_report(out, rows, {k: v for k, v in spans.items() if v is not None})
    return table


def _shared_plotly(out: Path) -> bool:
    """Write plotly.js once in the batch's folder; False (a warning) when that fails."""
    try:
        write_plotly_js(out)
    except Exception as exc:  # the reports are secondary: never fail the batch for them
        _logger.warning("writing %s failed: %s: %s", PLOTLY_JS, type(exc).__name__, exc)
        return False
    return True


def _span(folder: Path, seen: tuple[float, float] | None) -> tuple[float, float] | None:
    """A model's search start and end: as this batch saw them, else its journal's first start
    and last end; None when neither is known."""
    if seen is not None:
        return seen
    try:
        records = Journal(folder / JOURNAL).load()
    except OSError:
        return None
    starts = [r.started_at for r in records if r.started_at is not None]
    ends = [r.ended_at for r in records if r.ended_at is not None]
    return (min(starts), max(ends)) if starts and ends else None


def _command(
    entry: ModelEntry,
    out: Path,
    address: str,
    per_model: int,
    overwrite: bool,
    progress: TextIO | None,
) -> list[str] | None:
    """The ``raysearch`` command line that runs or resumes ``entry``'s search; None when it
    finished before and is kept."""
    folder = out / entry.name
    state = _search_state(folder)
    if state == "finished" and not overwrite:
        say(progress, f"{entry.name}: finished before, kept")
        return None
    if state == "interrupted" and not overwrite:
        return ["resume", str(folder), "--address", address]
    raw = copy.deepcopy(entry.raw)
    resources = dict(raw.get("resources") or {})
    resources.setdefault("max_concurrent_trials", per_model)
    raw["resources"] = resources
    cfg_path = out / "configs" / f"{entry.name}.yaml"
    cfg_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    cmd = ["run", str(cfg_path)]
    cmd += ["--overwrite"] if overwrite else []
    return cmd


def _schema() -> pa.Schema:
    types = {
        "float_metric": pa.float64(),
        "best_metric": pa.float64(),
        "n_candidates": pa.int64(),
        "n_trials": pa.int64(),
        "n_failed": pa.int64(),
        "wall_time_s": pa.float64(),
    }
    return pa.schema([(c, types.get(c, pa.string())) for c in BATCH_COLUMNS])


def _write_summary(table: pa.Table, out: Path) -> None:
    with replacing(out / "batch_summary.parquet") as tmp:
        pq.write_table(table, tmp)
    lines = [
        "| model | status | float | best | candidates | trials | failed | wall s | stop | "
        "best setting / error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def fmt(v: Any) -> str:
        return "" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)

    for r in table.to_pylist():
        detail = r["error"] if r["status"] == "failed" else r["best_params"]
        detail = (detail or "").replace("|", "\\|")
        lines.append(
            f"| {r['name']} | {r['status']} | {fmt(r['float_metric'])} | {fmt(r['best_metric'])} "
            f"| {fmt(r['n_candidates'])} | {fmt(r['n_trials'])} | {fmt(r['n_failed'])} "
            f"| {fmt(r['wall_time_s'])} | {fmt(r['stop_reason'])} | {detail} |"
        )
    atomic_write_text(
        out / "batch_summary.md", "# raysearch batch summary\n\n" + "\n".join(lines) + "\n"
    )
