"""``AutoSearch``: one search from a config to its outputs, on Ray Tune; and its resume.

How a search runs:

1. The config is validated; :func:`~raysearch.search.preflight.preflight` checks the model,
   loads the data against it and computes the float reference (built-in metrics) or the float
   model's score (custom evaluators) once, on the driver; Ray starts (or is joined) and must
   have a node that can hold one trial. Nothing is written before all of that passed.
2. The output folder is claimed: a folder holding an earlier search is refused unless
   ``overwrite`` (then only what raysearch created there is removed), and files of the names
   raysearch writes that it did not create are never overwritten. A marker goes to
   ``.raysearch.json``, the config (paths made absolute) to ``raysearch_config.yaml``, the log
   to ``auto_search.log``.
3. Tune runs :class:`~raysearch.search.trainable.QuantTrainable` actors, reused between
   trials, fed by :class:`~raysearch.search.searchers.SettingSearcher` and stopped by
   :class:`~raysearch.search.stopper.CandidateStopper`.
4. Every finished trial is journaled at once (:mod:`raysearch.search.recorder`); at the end the
   outputs are written from the journal (:mod:`raysearch.outputs`).

Speed: Tune's own cost per trial is what decides whether a search of small trials is fast.
raysearch reuses actors (``reuse_actors=True``), switches off Tune's per-result loggers
(``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1``; raysearch writes its own outputs), saves Tune's
experiment state only every ``TUNE_GLOBAL_CHECKPOINT_S`` (60 s) because the journal already
makes every finished trial durable, keeps one queued trial per running one so a finished actor
always has a next trial, and starts the first wave of actors together (a start barrier).

Resume (:meth:`AutoSearch.resume`): Tune's experiment is restored (``Tuner.restore``) when it
was saved, else a new Tune experiment starts; either way the journal decides what is done.
A trial Tune runs again whose id is journaled returns its recorded result without running;
a trial journaled after Tune's last save is counted by the searcher (never run again) and by
the stop conditions; the elapsed time of earlier sessions counts against ``time_limit``.
A saved Tune state that a kill cut short is not restored: the journal carries the search on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from raysearch.config import SearchConfig, load_config
from raysearch.errors import ConfigError, InputError
from raysearch.quantize.registry import backend_reject
from raysearch.search.journal import Journal, SessionClock, atomic_write_text
from raysearch.search.preflight import Prepared
from raysearch.search.progress import ProgressCallback
from raysearch.search.recorder import CANDIDATES, KEPT, TrialRecorder
from raysearch.search.searchers import (
    SAMPLER_ALGOS,
    SettingSearcher,
    check_algo_available,
    quiet_optuna,
)
from raysearch.search.session import (
    SearchSession,
    SessionCallback,
    SessionStopper,
    register,
    release,
)
from raysearch.search.stopper import CandidateStopper
from raysearch.search.trainable import TRIALS_TMP, make_trainable
from raysearch.search.transfer import (
    ModelBlob,
    current_node_id,
    materialize_model,
    model_blob,
    node_local_dir,
)

__all__ = ["AutoSearch", "SearchResult", "run_search", "resume_search", "EngineSpec"]

_logger = logging.getLogger("raysearch.search")

MARKER = ".raysearch.json"
CONFIG_FILE = "raysearch_config.yaml"
JOURNAL = "journal.jsonl"
STATE = "state.json"
LOG_FILE = "auto_search.log"
CACHE_DIR = "cache"
RAY_RESULTS = "ray_results"
EXPERIMENT = "search"
#: Everything raysearch may create in an output folder (what ``overwrite`` removes).
OWNED = (
    MARKER,
    CONFIG_FILE,
    JOURNAL,
    STATE,
    LOG_FILE,
    CACHE_DIR,
    RAY_RESULTS,
    TRIALS_TMP,
    CANDIDATES,
    KEPT,
    "summary.json",
    "results.parquet",
    "best",
    "plots",
    "tensorboard",
)
#: Seconds between two saves of Tune's experiment state (the journal covers the gap).
EXPERIMENT_CHECKPOINT_S = 60
#: The GCS address of the one-machine Ray that :func:`start_ray` started (None: none, or Ray
#: was started or joined elsewhere): there every trial runs on the driver's node.
_local_ray: str | None = None


@dataclass
class SearchResult:
    """What a search found.

    ``candidates`` lists the candidate trials (``trial_id``, ``metric``, ``params``,
    ``model_path``), best first; ``results`` is the ``results.parquet`` table.
    """

    best_params: dict[str, Any] | None
    best_metric: float | None
    candidates: list[dict[str, Any]]
    summary: dict[str, Any]
    results: Any
    output_dir: Path
    records: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def stop_reason(self) -> str:
        return self.summary.get("stop_reason", "")


@dataclass
class EngineSpec:
    """Builds a :class:`~raysearch.trial.TrialRunner` inside an actor from read-only inputs
    computed once on the driver (shipped through the object store; the float model as its
    files, external data included, see :mod:`raysearch.search.transfer`)."""

    model: ModelBlob
    calibration: Any
    evaluation: Any
    evaluator: Any
    cache_dir: str
    reference: Any = None
    float_score: float | None = None
    measure_latency: bool = True
    driver_node: str | None = None
    gpu_fraction: float = 0.0

    def __call__(self, *, threads: int = 1, gpu_id: int | None = None) -> Any:
        from raysearch.providers import gpu_memory_limit
        from raysearch.trial import TrialRunner

        model_path, cache_dir = self.model.path, self.cache_dir
        if self.driver_node is not None and current_node_id() != self.driver_node:
            # Another node: the model comes from the object store, the calibration cache
            # lives on this node (the driver's output folder need not exist here).
            model_path = materialize_model(self.model)
            tag = hashlib.sha256(self.cache_dir.encode()).hexdigest()[:12]
            cache_dir = os.fspath(node_local_dir(f"raysearch-cache-{tag}"))
        return TrialRunner(
            model_path,
            self.calibration,
            self.evaluation,
            self.evaluator,
            cache_dir,
            threads,
            gpu_id,
            self.reference,
            float_score=self.float_score,
            measure_latency=self.measure_latency,
            gpu_mem_limit=gpu_memory_limit(gpu_id, self.gpu_fraction),
        )


# -- the output folder ---------------------------------------------------------------------------
#: Result folders a user browses: only the files raysearch writes there are removed
#: (``{trial}``: the id of a trial in the search's journal).
_RESULT_FILES = {
    "best": ("model.onnx", "model.onnx.data*", "config.yaml"),
    CANDIDATES: ("{trial}.onnx", "{trial}.onnx.data*"),
    KEPT: ("{trial}.onnx", "{trial}.onnx.data*"),
    "plots": ("metric_per_trial.png", "param_importance.png"),
    "tensorboard": ("events.out.tfevents.*",),
}


def _holds_search(folder: Path) -> bool:
    return any((folder / name).exists() for name in (MARKER, JOURNAL, "summary.json"))


def _foreign_names(folder: Path) -> list[str]:
    """Names raysearch writes that exist in ``folder`` although no raysearch search is there
    (no marker): files raysearch did not create and must not overwrite."""
    if not folder.is_dir() or (folder / MARKER).is_file():
        return []
    return [name for name in OWNED if (folder / name).exists() or (folder / name).is_symlink()]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _clean_output_dir(folder: Path, storage_owned: bool) -> None:
    """Remove what raysearch created in ``folder`` (never anything else): its files, its
    working folders, and in the result folders only the files it writes there (a folder left
    empty goes too); a file a user put anywhere else stays."""
    trials = [str(r["trial_id"]) for r in Journal(folder / JOURNAL).load()]
    for name in OWNED:
        path = folder / name
        if name == RAY_RESULTS and not storage_owned:
            continue
        if name in _RESULT_FILES and path.is_dir() and not path.is_symlink():
            for pattern in _RESULT_FILES[name]:
                names = [pattern.format(trial=t) for t in trials] if "{" in pattern else [pattern]
                for item in (i for n in names for i in path.glob(n)):
                    _remove(item)
                for n in names:  # a writer's leftovers after a kill: .<name>.<...>.tmp...
                    for stem in {n, n.rsplit(".", 1)[0]}:
                        for item in path.glob(f".{stem}.*"):
                            if ".tmp" in item.name:
                                _remove(item)
            with contextlib.suppress(OSError):
                path.rmdir()  # only when empty
        elif name not in _RESULT_FILES:  # its files, and its working folders whole
            _remove(path)
    for item in folder.glob(".*.tmp*"):
        if any(item.name.startswith(f".{name}.") for name in OWNED):
            _remove(item)
    _logger.info("overwrite: removed the previous search's files from %s", folder)


def _raw_for_resume(config: SearchConfig) -> tuple[dict[str, Any], list[str]]:
    """The config as written, paths made absolute; keys holding Python objects are listed."""
    raw = dict(config.raw)
    raw["model"] = str(config.model)
    for key in ("calibration_data", "eval_data"):
        value = getattr(config, key)
        if key in raw and isinstance(value, (str, os.PathLike)):
            raw[key] = str(value)
    raw["output_dir"] = str(config.output_dir)
    unserializable = []
    for key, value in list(raw.items()):
        try:
            yaml.safe_dump(value)
        except yaml.YAMLError:
            unserializable.append(key)
            raw[key] = f"<python object: {type(value).__name__}>"
    return raw, unserializable


class _LogSetup:
    """``auto_search.log`` gets every ``raysearch`` record from INFO on (DEBUG when the
    ``raysearch`` logger is set to it), while the console keeps the verbosity its owner chose:
    a root handler without a level of its own gets the root logger's level for the search."""

    def __init__(self, folder: Path) -> None:
        self.handler = logging.FileHandler(folder / LOG_FILE, encoding="utf-8")
        self.handler.setLevel(logging.DEBUG)
        self.handler.setFormatter(
            logging.Formatter(
                "%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"
            )
        )
        self.logger = logging.getLogger("raysearch")
        self.level = self.logger.level
        root = logging.getLogger()
        self.pinned = []
        if self.logger.getEffectiveLevel() > logging.INFO:
            for handler in root.handlers:
                if handler.level == logging.NOTSET:
                    handler.setLevel(root.level)
                    self.pinned.append(handler)
            self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self.handler)
        logging.getLogger("ray.tune").addHandler(self.handler)

    def close(self) -> None:
        self.logger.removeHandler(self.handler)
        logging.getLogger("ray.tune").removeHandler(self.handler)
        self.logger.setLevel(self.level)
        for handler in self.pinned:
            handler.setLevel(logging.NOTSET)
        self.handler.close()


# -- Ray -----------------------------------------------------------------------------------------
def _tune_environment(max_pending: int) -> None:
    """Environment Ray Tune reads when a run starts (none of these is read at import)."""
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    # The legacy output engine prints nothing at verbose=0 (the new one still draws a table).
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", str(EXPERIMENT_CHECKPOINT_S))
    os.environ["TUNE_MAX_PENDING_TRIALS_PG"] = str(max(1, max_pending))
    os.environ.setdefault("TUNE_WARN_THRESHOLD_S", "5")


def start_ray(address: str | None) -> bool:
    """Join the Ray cluster at ``address``, or start a local one with this machine's CPUs;
    nothing when Ray is already initialised. Returns whether this call started Ray."""
    import ray

    global _local_ray
    if ray.is_initialized():
        return False
    # Token authentication stays on (Ray's default); its notice about that default on every
    # start is noise for a local search. (Setting RAY_AUTH_MODE here would be too late: Ray
    # reads it at import, and a mismatch locks the driver out of its own cluster.)
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR
    )
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": logging.WARNING,
        "log_to_driver": False,
        "configure_logging": True,
    }
    _local_ray = None
    if address:
        _logger.info("joining the Ray cluster at %s", address)
        ray.init(address=address, **kwargs)
    else:
        ray.init(num_cpus=os.cpu_count(), **kwargs)
        _local_ray = ray.get_runtime_context().gcs_address
    _logger.info("Ray resources: %s", ray.cluster_resources())
    return True


def _only_driver_node() -> bool:
    """Whether every trial runs on the driver's node: Ray is the one-machine instance
    :func:`start_ray` started (a cluster joined, or a Ray started elsewhere, may have or gain
    other nodes)."""
    import ray

    if _local_ray is None or ray.get_runtime_context().gcs_address != _local_ray:
        return False
    return sum(1 for n in ray.nodes() if n.get("Alive")) <= 1


def check_resources(config: SearchConfig) -> None:
    """Raise :class:`InputError` when no node of the Ray cluster can hold one trial
    (``resources.cpu_per_trial`` CPUs and ``resources.gpu_per_trial`` GPUs on one node): its
    trials would wait for ever. A cluster joined with ``address`` may grow (the autoscaler of
    ``cluster.yaml`` adds GPU workers when trials wait), so there it is only a warning."""
    import ray

    res = config.resources
    nodes = [n.get("Resources") or {} for n in ray.nodes() if n.get("Alive")]
    if not nodes:
        nodes = [ray.cluster_resources()]
    if any(
        n.get("CPU", 0) >= res.cpu_per_trial and n.get("GPU", 0) >= res.gpu_per_trial for n in nodes
    ):
        return
    most_gpus = max(n.get("GPU", 0) for n in nodes)
    most_cpus = max(n.get("CPU", 0) for n in nodes)
    total_gpus = sum(n.get("GPU", 0) for n in nodes)
    if res.gpu_per_trial and most_gpus < res.gpu_per_trial:
        have = (
            "the Ray cluster has no GPU"
            if not total_gpus
            else f"no node of the Ray cluster has more than {most_gpus:g} GPUs "
            f"({total_gpus:g} in all)"
        )
        message = f"resources.gpu_per_trial is {res.gpu_per_trial:g} but {have}"
    elif most_cpus < res.cpu_per_trial:
        message = (
            f"resources.cpu_per_trial is {res.cpu_per_trial:g} but no node of the Ray cluster "
            f"has more than {most_cpus:g} CPUs"
        )
    else:
        message = (
            f"no node of the Ray cluster has {res.cpu_per_trial:g} CPUs and "
            f"{res.gpu_per_trial:g} GPUs for one trial (resources.cpu_per_trial, "
            "resources.gpu_per_trial)"
        )
    if config.address:
        _logger.warning("%s yet; trials wait for the cluster's autoscaler to add a node", message)
        return
    raise InputError(message)


def _slots(config: SearchConfig) -> tuple[int, int]:
    """(trials that run at once, trials kept suggested but unfinished)."""
    import ray

    check_resources(config)
    resources = ray.cluster_resources()
    res = config.resources
    bound = int(resources.get("CPU", 1) // res.cpu_per_trial) if res.cpu_per_trial else 1
    if res.gpu_per_trial:
        gpus = resources.get("GPU", 0)
        bound = min(bound, int(math.floor(gpus / res.gpu_per_trial + 1e-9)))
    bound = max(1, bound)
    if res.max_concurrent_trials is None or res.max_concurrent_trials >= bound:
        return bound, 2 * bound
    # A user limit below what the cluster could run: no queued trial may start early.
    return res.max_concurrent_trials, res.max_concurrent_trials


@contextlib.contextmanager
def _quiet_tune() -> Iterator[None]:
    """Silence what Tune logs that raysearch makes moot: the per-trial result files it no
    longer writes (raysearch keeps its own), and its end-of-run notes."""
    names = ("ray.tune.analysis.experiment_analysis", "ray.tune.tune", "ray.tune.result_grid")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _trial_dirname(trial: Any) -> str:
    return trial.trial_id


# -- the search ----------------------------------------------------------------------------------
class AutoSearch:
    """A quantization search from a config (a :class:`SearchConfig`, a dict or a YAML path).

    Example:
        >>> result = AutoSearch("config.yaml").run()                      # doctest: +SKIP
        >>> result.best_metric, result.summary["stop_reason"]              # doctest: +SKIP
        (0.0042, 'candidates_found')
        >>> AutoSearch.resume("raysearch_output")                          # doctest: +SKIP
    """

    def __init__(self, config: SearchConfig | Mapping[str, Any] | str | os.PathLike) -> None:
        if isinstance(config, SearchConfig):
            self.config = config
        elif isinstance(config, Mapping):
            self.config = SearchConfig.from_dict(config)
        else:
            self.config = load_config(config)
        if self.config.search_algo in SAMPLER_ALGOS:
            check_algo_available(self.config.search_algo)
        self.output_dir = Path(self.config.output_dir).resolve()

    # -- public ----------------------------------------------------------------------------
    def run(self, *, overwrite: bool = False, progress: TextIO | None = None) -> SearchResult:
        """Run the search to its end and write its outputs.

        Args:
            overwrite: replace a previous search in ``output_dir`` (only files raysearch
                created there are removed).
            progress: a stream for the live progress line (the CLI passes ``sys.stderr``);
                None logs progress instead.

        Nothing is written before the model, the data and the evaluator passed
        :func:`~raysearch.search.preflight.preflight` and the Ray cluster proved able to hold
        a trial: a search with bad input leaves ``output_dir`` as it was (or absent).

        Raises:
            ConfigError: ``output_dir`` holds a previous search and ``overwrite`` is False, or
                files of the names raysearch writes that raysearch did not create.
            InputError: the model, the data, the evaluator or the resources are unusable.
        """
        from raysearch.search.preflight import preflight

        started = time.monotonic()
        folder = self.output_dir
        storage_owned = self.config.storage_path is None
        foreign = _foreign_names(folder)
        if foreign:
            names = ", ".join(f"'{n}'" for n in foreign)
            raise ConfigError(
                "output_dir",
                f"{folder} already holds {names}, not created by raysearch (no {MARKER}); "
                "choose another output_dir: raysearch never overwrites files it did not create",
            )
        previous = folder.exists() and _holds_search(folder)
        if previous and not overwrite:
            raise ConfigError(
                "output_dir",
                f"{folder} holds a previous search; continue it with "
                f"`raysearch resume {folder}` or start over with --overwrite",
            )
        prepared = preflight(self.config)
        start_ray(self.config.address)
        check_resources(self.config)
        if previous:
            _clean_output_dir(folder, storage_owned)
        folder.mkdir(parents=True, exist_ok=True)
        raw, unserializable = _raw_for_resume(self.config)
        # The marker first: whatever follows in this folder is raysearch's.
        self._write_marker("running", unserializable=unserializable)
        header = "# The config of this search (paths absolute); `raysearch resume` reads it.\n"
        atomic_write_text(folder / CONFIG_FILE, header + yaml.safe_dump(raw, sort_keys=False))
        return self._execute(resume=False, progress=progress, prepared=prepared, started_at=started)

    @classmethod
    def resume(
        cls,
        output_dir: str | os.PathLike,
        *,
        config: SearchConfig | Mapping[str, Any] | None = None,
        progress: TextIO | None = None,
        address: str | None = None,
    ) -> SearchResult:
        """Continue the interrupted search in ``output_dir``; finished trials are neither lost
        nor run again. ``config`` is needed only when the search was started from Python
        objects that a YAML file cannot hold (arrays, a data reader, a callable metric);
        ``address`` joins another Ray cluster than the one the search was started on.

        Raises:
            InputError: ``output_dir`` holds no raysearch search.
        """
        folder = Path(output_dir).resolve()
        marker = folder / MARKER
        if not marker.is_file():
            raise InputError(f"{folder}: no raysearch search to resume here ({MARKER} missing)")
        state = json.loads(marker.read_text())
        if config is None:
            if state.get("unserializable"):
                keys = ", ".join(state["unserializable"])
                raise InputError(
                    f"{folder}: this search was started from Python objects ({keys}); resume "
                    "it from Python with AutoSearch.resume(dir, config=...)"
                )
            if not (folder / CONFIG_FILE).is_file():
                raise InputError(
                    f"{folder}: the search was stopped before it started ({CONFIG_FILE} "
                    "missing); start it again with `raysearch run CONFIG --overwrite`"
                )
            raw = yaml.safe_load((folder / CONFIG_FILE).read_text())
            raw["output_dir"] = str(folder)
            search = cls(SearchConfig.from_dict(raw, base_dir=folder))
        else:
            search = cls(config if isinstance(config, SearchConfig) else dict(config))
            search.config.output_dir = folder
            search.output_dir = folder
        if address:
            search.config.address = address
        if state.get("status") == "finished" and (folder / "summary.json").is_file():
            _logger.info("%s: the search had finished; nothing to resume", folder)
            summary = json.loads((folder / "summary.json").read_text())
            records = Journal(folder / JOURNAL).load()
            return _result(folder, summary, records, search.config.metric_higher_is_better)
        return search._execute(resume=True, progress=progress)

    # -- internals -------------------------------------------------------------------------
    def _write_marker(self, status: str, **extra: Any) -> None:
        path = self.output_dir / MARKER
        state: dict[str, Any] = {}
        if path.exists():
            try:
                state = json.loads(path.read_text())
            except (OSError, ValueError):
                state = {}
        state.update(
            {
                "tool": "raysearch",
                "version": 1,
                "status": status,
                "experiment": EXPERIMENT,
                "storage_path": self._storage_path(),
                "updated_at": time.time(),
            }
        )
        state.update(extra)
        atomic_write_text(path, json.dumps(state, indent=1) + "\n")

    def _storage_path(self) -> str:
        return self.config.storage_path or str(self.output_dir / RAY_RESULTS)

    def _engine(self, prepared: Prepared | None) -> tuple[EngineSpec, dict[str, Any]]:
        """The trial engine's factory from what :func:`preflight` checked and computed once,
        here on the driver (run again on resume, where the float reference comes from the
        cache; a reference computed before the output folder existed is saved there now)."""
        from raysearch.search.preflight import preflight

        config = self.config
        model = str(config.model)
        cache_dir = str(self.output_dir / CACHE_DIR)
        if prepared is None:
            prepared = preflight(config, cache_dir=cache_dir)
        elif prepared.reference is not None:
            folder = Path(cache_dir) / "reference" / prepared.reference.key
            if not (folder / "meta.json").is_file():
                try:
                    prepared.reference.save(folder)
                except OSError as exc:
                    _logger.warning("could not save the float reference: %s", exc)
        calibration, evaluation = prepared.calibration, prepared.evaluation
        evaluator, reference = prepared.evaluator, prepared.reference
        float_score = prepared.float_score
        info = dict(prepared.info)
        _logger.info(
            "float reference ready in %.2f s (%s)",
            info.pop("float_s", 0.0),
            "outputs" if reference is not None else f"score {float_score}",
        )
        spec = EngineSpec(
            ModelBlob(model),  # shipped once Ray runs
            calibration,
            evaluation,
            evaluator,
            cache_dir,
            reference,
            float_score,
            config.measure_latency,
            gpu_fraction=config.resources.gpu_per_trial,
        )
        return spec, info

    def _searcher(self, max_outstanding: int) -> SettingSearcher:
        config = self.config
        mode = "max" if config.metric_higher_is_better else "min"
        limit = config.stop.iteration_limit if config.stop.iteration_limit > 0 else None
        if config.search_algo == "Grid":
            searcher = SettingSearcher.grid(
                config.search_spaces,
                mode=mode,
                reject=backend_reject,
                max_trials=limit,
                max_outstanding=max_outstanding,
            )
        else:
            searcher = SettingSearcher.sampler(
                config.search_algo,
                config.search_spaces,
                mode=mode,
                seed=config.seed,
                reject=backend_reject,
                max_trials=limit,
                max_outstanding=max_outstanding,
            )
        searcher.session_key = str(self.output_dir)
        return searcher

    def _expected_trials(self, searcher: SettingSearcher) -> int | None:
        limit = self.config.stop.iteration_limit
        total = None
        phases = searcher.phases
        if self.config.search_algo == "Grid":
            total = len(phases[0])  # type: ignore[arg-type]
        if limit and limit > 0:
            total = limit if total is None else min(total, limit)
        return total

    def _execute(
        self,
        *,
        resume: bool,
        progress: TextIO | None,
        prepared: Prepared | None = None,
        started_at: float | None = None,
    ) -> SearchResult:
        from ray import tune

        config = self.config
        folder = self.output_dir
        log = _LogSetup(folder)
        key = str(folder)
        try:
            _logger.info(
                "%s search in %s: %s over %d space(s), metric %s, tolerance %s, stop %s",
                "resuming" if resume else "starting",
                folder,
                config.search_algo,
                len(config.search_spaces),
                config.metric,
                config.tolerance,
                config.stop,
            )
            journal = Journal(folder / JOURNAL)
            records = journal.load() if resume else []
            clock = SessionClock(folder / STATE, started_at=started_at)
            clock.at_least(max((float(r.get("elapsed_s") or 0.0) for r in records), default=0))
            spec, info = self._engine(prepared)
            start_ray(config.address)
            spec.driver_node = current_node_id()
            if not _only_driver_node():
                # Actors on other nodes build the float model from these files; on one
                # machine they read it where it is (no copy of a large model in memory).
                spec.model = model_blob(spec.model.path)
            slots, outstanding = _slots(config)
            _tune_environment(outstanding)
            with quiet_optuna():
                searcher = self._searcher(outstanding)
            expected = self._expected_trials(searcher)
            higher = config.metric_higher_is_better
            stopper = CandidateStopper(
                config.stop,
                higher_is_better=higher,
                elapsed_before_s=clock.elapsed_before_s,
                prior=records,
                started_at=clock.started_at,
            )
            recorder = TrialRecorder(
                folder,
                journal,
                higher_is_better=higher,
                keep_candidates=config.keep_candidates,
                prior=records,
                clock=lambda: clock.elapsed_s,
                # Tune shows the stopper results only: count trials that raised, too.
                on_record=lambda r: stopper.observe(r["trial_id"], r),
            )
            best_before = recorder.best["metric"] if recorder.best else None
            progress_cb = ProgressCallback(
                progress,
                metric=config.metric.rsplit(":", 1)[-1],  # a custom evaluator by its name
                higher_is_better=higher,
                total=expected,
                every=max(1, min(25, (expected or 100) // 10)),
                elapsed_before_s=clock.elapsed_before_s,
                done_before=len(records),
                failed_before=sum(1 for r in records if r.get("status") != "ok"),
                candidates_before=sum(1 for r in records if r.get("is_candidate")),
                best_before=best_before,
            )
            session = SearchSession(
                key, journal, clock, stopper, recorder, progress_cb, records=list(records)
            )
            register(session)
            wave = slots if expected is None else max(1, min(slots, expected - len(records)))
            trainable = make_trainable(
                spec,
                folder,
                cpu_per_trial=config.resources.cpu_per_trial,
                gpu_per_trial=config.resources.gpu_per_trial,
                timeout_s=config.trial_timeout_s,
                replay={r["trial_id"]: _replay_result(r) for r in records},
                wave=wave,
                driver_node=current_node_id(),
            )
            with _quiet_tune():
                tuner, restored = self._tuner(tune, trainable, searcher, key, resume, records)
            if not restored:
                session.searcher = searcher  # a restored one registers itself when it runs
            _logger.info(
                "running up to %d trials at once (%d kept queued); %s",
                slots,
                outstanding,
                f"{expected} trials expected" if expected else "no fixed number of trials",
            )
            try:
                with _quiet_tune(), quiet_optuna():
                    tuner.fit()
            finally:
                progress_cb.close()
                clock.tick(force=True)
            live = session.searcher or searcher
            reason = self._stop_reason(stopper, live, recorder)
            shutil.rmtree(folder / TRIALS_TMP, ignore_errors=True)
            from raysearch.outputs import write_outputs

            summary = write_outputs(
                folder,
                recorder.records,
                config=config,
                stop_reason=reason,
                wall_time_s=clock.elapsed_s,
                float_metric=info.get("float_metric"),
                float_model_size_bytes=info.get("float_model_size_bytes"),
                float_latency_ms=info.get("float_latency_ms"),
                extra={
                    "sessions": len(clock.sessions),
                    "trials_started": max(live.n_started, len(recorder.records)),
                    "slots": slots,
                },
            )
            self._write_marker("interrupted" if reason == "interrupted" else "finished")
            _logger.info(
                "search ended (%s): %d trials, %d failed, %d candidates, best %s = %s, %.1f s",
                reason,
                summary["n_trials"],
                summary["n_failed"],
                summary["n_candidates"],
                config.metric,
                summary["best_metric"],
                summary["wall_time_s"],
            )
            return _result(folder, summary, recorder.records, higher)
        finally:
            release(key)
            log.close()

    def _tuner(
        self,
        tune: Any,
        trainable: Any,
        searcher: SettingSearcher,
        key: str,
        resume: bool,
        records: list[dict[str, Any]],
    ) -> tuple[Any, bool]:
        """The Tuner, and whether it restored Tune's saved experiment."""
        storage = self._storage_path()
        path = os.path.join(storage, EXPERIMENT)
        if resume and tune.Tuner.can_restore(path) and _tune_state_intact(path):
            _logger.info(
                "restoring Ray Tune's experiment %s (%d trials journaled)", path, len(records)
            )
            tuner = tune.Tuner.restore(
                path,
                trainable=trainable,
                resume_unfinished=True,
                resume_errored=False,
                restart_errored=False,
            )
            return tuner, True
        name = EXPERIMENT
        if resume:
            # Tune never saved this experiment: a new one, told what the journal holds.
            name = f"{EXPERIMENT}-{int(time.time())}"
            searcher.add_finished(records)
            _logger.info("no saved Tune state; a new Tune experiment continues the journal")
        config = self.config
        limit = config.stop.iteration_limit
        run_config = tune.RunConfig(
            name=name,
            storage_path=storage,
            stop=SessionStopper(key),
            callbacks=[SessionCallback(key)],
            verbose=0,
            log_to_file=False,
            failure_config=tune.FailureConfig(max_failures=config.max_failures, fail_fast=False),
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False),
        )
        tune_config = tune.TuneConfig(
            search_alg=searcher,
            num_samples=limit if limit and limit > 0 else -1,
            reuse_actors=True,
            trial_dirname_creator=_trial_dirname,
        )
        return tune.Tuner(trainable, tune_config=tune_config, run_config=run_config), False

    @staticmethod
    def _stop_reason(
        stopper: CandidateStopper, searcher: SettingSearcher, recorder: TrialRecorder
    ) -> str:
        if stopper.reason is not None:
            return stopper.reason
        finished = searcher.finish_reason
        if finished is not None and len(recorder.records) >= searcher.n_started:
            return finished
        return "interrupted"


def _tune_state_intact(path: str) -> bool:
    """Whether Ray Tune's newest saved experiment state in ``path`` can be read. Tune rewrites
    that file in place, so a kill while it wrote leaves it cut short; the journal then
    carries the search on in a new Tune experiment. (Remote storage is not checked.)"""
    folder = Path(path)
    if "://" in path or not folder.is_dir():
        return True
    states = sorted(folder.glob("experiment_state-*.json"))
    if not states:
        return True
    try:
        json.loads(states[-1].read_text())
    except (OSError, ValueError) as exc:
        _logger.warning(
            "Ray Tune's saved state %s is unreadable (%s): the journal carries the search on",
            states[-1].name,
            exc,
        )
        return False
    return True


def _replay_result(record: Mapping[str, Any]) -> dict[str, Any]:
    """What a journaled trial returns when Tune runs it again after a restore."""
    trial = {k: v for k, v in record.items() if k not in ("point", "params", "settings")}
    return {"metric": record.get("metric"), "trial": trial}


def _result(
    folder: Path, summary: dict[str, Any], records: list[dict[str, Any]], higher: bool
) -> SearchResult:
    import pyarrow.parquet as pq

    candidates = [r for r in records if r.get("is_candidate")]
    candidates.sort(key=lambda r: r["metric"], reverse=higher)
    return SearchResult(
        best_params=summary.get("best_params"),
        best_metric=summary.get("best_metric"),
        candidates=[
            {
                "trial_id": r["trial_id"],
                "metric": r["metric"],
                "params": r.get("params"),
                "model_path": str(folder / r["model_file"]) if r.get("model_file") else None,
            }
            for r in candidates
        ],
        summary=summary,
        results=pq.read_table(folder / "results.parquet"),
        output_dir=folder,
        records=list(records),
    )


def run_search(
    config: SearchConfig | Mapping[str, Any] | str | os.PathLike,
    *,
    overwrite: bool = False,
    progress: TextIO | None = None,
) -> SearchResult:
    """``AutoSearch(config).run(...)``."""
    return AutoSearch(config).run(overwrite=overwrite, progress=progress)


def resume_search(
    output_dir: str | os.PathLike,
    *,
    config: SearchConfig | Mapping[str, Any] | None = None,
    progress: TextIO | None = None,
    address: str | None = None,
) -> SearchResult:
    """``AutoSearch.resume(output_dir, ...)``."""
    return AutoSearch.resume(output_dir, config=config, progress=progress, address=address)


if __name__ == "__main__":  # pragma: no cover - a debugging aid: python -m raysearch.search.runner
    print(run_search(sys.argv[1], overwrite=True, progress=sys.stderr).summary)
