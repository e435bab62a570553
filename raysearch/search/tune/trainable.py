"""The Ray Tune trainable: one actor keeps one trial engine (built in ``setup``) across the
trials it runs (``reuse_actors``). A trial quantizes once and reports once per rung of its
evaluation, one ``step`` each; ``reset_config`` drops a trial ASHA stopped.
``trial_timeout_s`` bounds a trial's steps together.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray import tune

from raysearch.errors import is_disk_full
from raysearch.layout import TRIALS_TMP
from raysearch.modelfile import remove_model
from raysearch.ranking import PROBE_STAGE
from raysearch.search.record.reported import pack_record
from raysearch.search.record.retries import RETRIES_SPENT
from raysearch.search.runtime._start_barrier import wait_for_wave
from raysearch.search.runtime.transfer import current_node_id, node_folder_here
from raysearch.search.tune._rungs import (
    RUNG_CLOCK,
    RUNG_ERROR,
    RUNG_SCORE,
    UNRANKED,
    rung_clock,
    rung_score,
)
from raysearch.trialrecord import TrialRecord

if TYPE_CHECKING:
    from raysearch.trial import StagedTrial, TrialEngine

__all__ = ["QuantTrainable", "EngineFactory", "make_trainable", "TRIALS_TMP"]

_logger = logging.getLogger(__name__)


#: Builds the engine inside an actor: ``factory(threads=..., gpu_id=...)``.
EngineFactory = Callable[..., "TrialEngine"]


class QuantTrainable(tune.Trainable):
    """One trial per ``step``; the engine is built once per actor (see module docstring)."""

    def setup(
        self,
        config: dict[str, Any],
        output_dir: str = "",
        threads: int = 1,
        timeout_s: float | None = None,
        barrier: Any = None,
        driver_node: str | None = None,
        factory_box: list[Any] | None = None,
        helper_resources: Mapping[str, float] | None = None,
    ) -> None:
        if not factory_box:
            raise ValueError("QuantTrainable needs an engine factory (tune.with_parameters)")
        factory = ray.get(factory_box[0])
        self._output_dir = Path(output_dir)
        self._timeout_s = timeout_s
        self._node = ray.util.get_node_ip_address()
        self._node_id = current_node_id()
        # On another node, models go to its temp folder, where the driver fetches them.
        local = driver_node is None or driver_node == self._node_id
        here = self._output_dir / TRIALS_TMP
        self._trials_dir = here if local else node_folder_here("trials", self._output_dir)
        gpu_ids = ray.get_gpu_ids()
        self._gpu_id = gpu_ids[0] if gpu_ids else None
        started = time.perf_counter()
        self._engine = factory(threads=threads, gpu_id=self._gpu_id)
        self._engine.score_pool = _score_pool(factory_box[0], threads, helper_resources)
        self._setup_s = time.perf_counter() - started
        self._trials_run = 0
        self._poisoned = False
        rungs = self._engine.rungs
        self._factor = rungs.reduction_factor if rungs is not None else 1.0
        self._higher = self._engine.evaluator.higher_is_better
        #: The trial being evaluated rung by rung.
        self._live: _Live | None = None
        # What is alive now lives as long as the actor: out of the collector's full passes.
        gc.freeze()
        started = time.perf_counter()
        #: Whether this actor waited out the barrier's timeout.
        self._wait_timed_out = barrier is not None and not wait_for_wave(barrier)
        self._wait_s = time.perf_counter() - started

    def node_id(self) -> str:
        """The Ray node this actor runs on (a trial lost with its node is recorded with it)."""
        return self._node_id

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        # The engine stays for the next trial; a trial ASHA stopped leaves its session.
        self._drop_live()
        return not self._poisoned

    def _drop_live(self) -> None:
        if self._live is not None:
            self._live.trial.close()
            self._live = None

    def step(self) -> dict[str, Any]:
        trial_id = self.trial_id
        spent = self.config.get(RETRIES_SPENT)
        if spent is not None:  # its process failed max_failures times already
            return _failed(TrialRecord(status="failed", **spent))
        live = self._live
        if live is None or live.trial_id != trial_id:
            self._drop_live()
            live = self._begin(trial_id)
            if isinstance(live, dict):
                return live  # the disk filled up while quantizing
        try:
            result = self._call(live.trial.step, live)
        except Exception as exc:
            self._drop_live()
            if not is_disk_full(exc):
                raise
            return self._disk_full(exc, live.out_path)
        done = bool(live.trial.done)
        if done:
            self._live = None
        if done and not result.model_path:
            # A failed trial deletes its model file; its external data goes too.
            remove_model(live.out_path)
        return self._report(result, live, done)

    def _begin(self, trial_id: str) -> _Live | dict[str, Any]:
        """Start a trial: quantize it (its first rung follows in the same step)."""
        config = self.config
        # A custom evaluator's relative paths mean the driver's working directory.
        home = os.environ.get("TUNE_ORIG_WORKING_DIR")
        if home and os.getcwd() != home:
            os.chdir(home)
        self._trials_dir.mkdir(parents=True, exist_ok=True)
        out_path = self._trials_dir / f"{trial_id}.onnx"
        # What a killed first run left: ONNX Runtime would append to its external data.
        remove_model(out_path)
        live = _Live(trial_id, out_path)
        self._trials_run += 1
        try:
            live.trial = self._call(lambda: self._engine.start(config["settings"], out_path), live)
        except Exception as exc:
            if not is_disk_full(exc):
                raise
            return self._disk_full(exc, out_path)
        self._live = live
        return live

    def _disk_full(self, exc: BaseException, out_path: Path) -> dict[str, Any]:
        # Not the setting's failure: the driver stops the search unrecorded; resume reruns it.
        remove_model(out_path)
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return _failed(TrialRecord(status="failed", error=message, disk_full=True))

    def _report(self, result: TrialRecord, live: _Live, done: bool) -> dict[str, Any]:
        """What Tune gets for one rung: metric, objective, the record so far, ASHA's rung."""
        first = self._trials_run == 1
        record = result.replace(
            started_at=live.started_at,
            ended_at=time.time(),
            node=self._node,
            node_id=self._node_id,
            gpu_id=None if self._gpu_id is None else str(self._gpu_id),
            worker_pid=os.getpid(),
            actor_trials=self._trials_run,
            actor_setup_s=round(self._setup_s, 4) if first else None,
            actor_wait_s=round(self._wait_s, 4) if first else None,  # at the StartBarrier
            actor_wait_timed_out=self._wait_timed_out if first else None,
        )
        if self.config.get("stage") == PROBE_STAGE:  # a sensitivity probe is never a candidate
            record = record.replace(stage=PROBE_STAGE, is_candidate=False)
        ok = record.status == "ok"
        score = rung_score(record, self._higher) if ok else None
        clock = None
        if score is not None and record.rungs > 1:
            clock = rung_clock(record.rung, self._factor)
            # A resumed search puts these back into ASHA's rungs and the study's values.
            live.scores.append(score)
            live.ended_at.append(record.ended_at)
            live.metrics.append(record.metric)
            record = record.replace(
                rung_scores=list(live.scores),
                rung_ended_at=list(live.ended_at),
                rung_metrics=list(live.metrics),
            )
        return {
            "metric": record.metric if ok else None,
            "objective": record.objective if ok else None,
            # JSON text: Tune analyses every number of a result for as long as it runs.
            "trial": pack_record(record),
            "done": done,
            RUNG_CLOCK: clock,
            RUNG_SCORE: score if clock is not None else None,
            RUNG_ERROR: record.rung_error if clock is not None else None,
        }

    def _call(self, work: Callable[[], Any], live: _Live) -> Any:
        """``work()`` within what is left of the trial's ``trial_timeout_s``."""
        if not self._timeout_s:
            return work()
        left = self._timeout_s - (time.perf_counter() - live.started)
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["result"] = work()
            except BaseException as exc:  # reported to Tune from the main thread
                box["error"] = exc
                box["traceback"] = traceback.format_exc()

        # A daemon thread: a setting that hangs ONNX Runtime dies with the actor process.
        worker = threading.Thread(target=target, name="raysearch-trial", daemon=True)
        worker.start()
        worker.join(max(left, 0.0))
        if worker.is_alive():
            self._poisoned = True  # the hung call still holds this process: never reuse it
            raise TrialTimeoutError(
                f"trial timed out after {self._timeout_s:g} s (trial_timeout_s)"
            )
        if "error" in box:
            raise box["error"]
        return box["result"]

    def cleanup(self) -> None:
        self._drop_live()
        try:
            self._engine.close()
        except Exception:  # best effort: the actor is going away
            _logger.debug("closing the trial engine failed", exc_info=True)


def _failed(trial: TrialRecord) -> dict[str, Any]:
    """The last report of a trial that failed before any rung."""
    return {
        "metric": None,
        "objective": None,
        "trial": pack_record(trial),
        "done": True,
        **UNRANKED,
    }


@dataclass
class _Live:
    """The trial an actor is evaluating rung by rung (``trial``: the engine's, once quantized)."""

    trial_id: str
    out_path: Path
    trial: StagedTrial | None = None
    started: float = field(default_factory=time.perf_counter)
    started_at: float = field(default_factory=time.time)
    scores: list[float] = field(default_factory=list)
    ended_at: list[float] = field(default_factory=list)
    metrics: list[float | None] = field(default_factory=list)


class TrialTimeoutError(TimeoutError):
    """A trial ran longer than ``trial_timeout_s``."""


def _score_pool(factory_ref: Any, threads: int, resources: Mapping[str, float] | None) -> Any:
    """The trial engine's score pool: as many helpers as this node has room for."""
    from raysearch.search.runtime._score_pool import ScorePool

    resources = dict(resources or {"num_cpus": float(threads)})
    node = current_node_id()
    cpus = next((n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n["NodeID"] == node), 1)
    per_helper = max(resources.get("num_cpus", 1.0), 1e-3)
    helpers = max(0, int(cpus // per_helper) - 1)
    if not helpers:  # no room for one: the trial scores alone, as without Ray
        return None
    return ScorePool(factory_ref, threads=threads, helpers=helpers, **resources)


def make_trainable(
    factory: EngineFactory,
    output_dir: str | os.PathLike,
    *,
    cpu_per_trial: float = 1.0,
    gpu_per_trial: float = 0.0,
    timeout_s: float | None = None,
    barrier: Any = None,
    driver_node: str | None = None,
) -> Any:
    """``QuantTrainable`` with its read-only inputs in the object store and its resources;
    ``barrier`` (:func:`start_barrier`) starts the first wave's trials together."""
    trainable = tune.with_parameters(
        QuantTrainable,
        # Boxed: the actor gets the reference, which its helper tasks build engines from.
        factory_box=[ray.put(factory)],
        helper_resources={"num_cpus": cpu_per_trial, "num_gpus": gpu_per_trial},
        output_dir=os.fspath(output_dir),
        threads=max(1, int(cpu_per_trial)),
        timeout_s=timeout_s,
        barrier=barrier,
        driver_node=driver_node,
    )
    resources = {"cpu": cpu_per_trial}
    if gpu_per_trial:
        resources["gpu"] = gpu_per_trial
    return tune.with_resources(trainable, resources)
