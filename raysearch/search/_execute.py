"""One session of a search on Ray Tune, once the output folder is the search's:
:meth:`Execution.start` (journal, engine, searcher, stop conditions, recorder, live session),
:meth:`Execution.fit` (Tune runs the trials) and :meth:`Execution.finish` (the outputs).
"""

from __future__ import annotations

import functools
import logging
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from raysearch.errors import InputError, is_disk_full
from raysearch.layout import CACHE_DIR, JOURNAL, TRIALS_TMP
from raysearch.modelfolder import model_folder
from raysearch.quantize.registry import backend_reject
from raysearch.ranking import is_candidate
from raysearch.search._engine import EngineSpec, build_engine
from raysearch.search._latency_timer import LatencyTimer
from raysearch.search._logs import LogSetup, check_tune_disk, quiet_tune
from raysearch.search._result import SearchResult, build_result
from raysearch.search._retime import (
    latency_timing,
    needs_retime,
    plan_retime,
    slower_than_float_note,
)
from raysearch.search.preflight import STDERR_LOGGER
from raysearch.search.record._disk import disk_full_error
from raysearch.search.record.journal import Journal, SessionClock
from raysearch.search.record.output_dir import (
    begin_session,
    read_marker,
    restore_marker,
    search_id,
    storage_path,
    write_marker,
)
from raysearch.search.record.probe_cache import search_probe_cache
from raysearch.search.record.recorder import TrialRecorder
from raysearch.search.runtime._start_barrier import end_barrier, start_barrier
from raysearch.search.runtime.cluster import (
    ends_with_process,
    only_driver_node,
    slots,
    trials_ended,
    trials_placeable_now,
    tune_environment,
)
from raysearch.search.runtime.transfer import (
    current_node_id,
    model_blob,
    node_folder,
    remove_node_folders,
)
from raysearch.search.tune._loggers import after_search, make_live_study
from raysearch.search.tune._ray_loggers import make_loggers
from raysearch.search.tune._rungs import RungScheduler, early_stopping_summary
from raysearch.search.tune._tuner import make_tuner, restored_signal_handlers
from raysearch.search.tune._usage_tag import own_callbacks_tagged
from raysearch.search.tune.progress import ProgressCallback
from raysearch.search.tune.searchers import SettingSearcher
from raysearch.search.tune.session import SearchSession, register, release
from raysearch.search.tune.stopper import CandidateStopper, trial_limit
from raysearch.search.tune.trainable import make_trainable
from raysearch.strategies import ModelFacts, StrategyContext
from raysearch.strategies.grid import GridPhase
from raysearch.strategies.samplers import quiet_optuna
from raysearch.usercode import loaded_modules

if TYPE_CHECKING:
    from raysearch.config import SearchConfig
    from raysearch.outputs import PlotProcess
    from raysearch.search._pending_reference import PendingReference
    from raysearch.search.preflight import Prepared
    from raysearch.search.runtime import KeptWarm
    from raysearch.trialrecord import TrialRecord

__all__ = ["Execution", "most_frequent_error"]

_logger = logging.getLogger("raysearch.search")


@dataclass
class _Run:
    """What one session of a search holds while Tune runs it."""

    journal: Journal
    records: list[dict[str, Any]]
    #: This session's number (1 the first), counted in the marker.
    session_number: int
    clock: SessionClock
    spec: EngineSpec
    info: dict[str, Any]
    slots: int
    outstanding: int
    searcher: SettingSearcher
    expected: int | None
    stopper: CandidateStopper
    recorder: TrialRecorder
    progress: ProgressCallback
    session: SearchSession


class Execution:
    """One session of the search of ``config`` in ``output_dir`` (already claimed)."""

    def __init__(self, config: SearchConfig, output_dir: Path) -> None:
        self.config = config
        self.output_dir = output_dir
        #: What Tune's proxies, the searcher and the scheduler find the live session by.
        self.session_key = search_id(output_dir)
        #: What the cluster keeps for later searches (None: a Ray that ends with the search).
        self.kept: KeptWarm | None = None
        #: The float reference the first trials started without (None: there before them).
        self.pending_reference: PendingReference | None = None
        #: The user's Tune callbacks (``run(callbacks=...)``), beside the config's loggers.
        self.callbacks: list[Any] = []
        #: The first wave's start barrier (None: none started yet, or one actor).
        self.barrier: Any = None
        #: The marker as this session found it (put back when the session is refused).
        self.marker_before: dict[str, Any] = {}
        #: Where latency is timed again after the last trial (None: nowhere, _retime).
        self.timer = LatencyTimer() if needs_retime(config) else None
        #: What draws plots/ beside the other outputs (None: the driver, after them), started
        #: at the first record where this process ends with the search.
        self.plots: PlotProcess | None = None

    def _searcher(
        self, model: ModelFacts, concurrent: int = 1, size_budget_bytes: int | None = None
    ) -> SettingSearcher:
        """The searcher over the phases of the config's strategy (``search_algo``)."""
        config = self.config
        context = StrategyContext(
            config.search_spaces,
            mode="max" if config.metric_higher_is_better else "min",
            seed=config.seed,
            # The model's weight shapes too: what a backend refuses on this model is left out.
            reject=functools.partial(backend_reject, weights=model.weights),
            max_trials=trial_limit(config.stop),
            model=model,
            concurrent=concurrent,
            objectives=config.objectives,
            sampler=config.sampler,
            sampler_options=config.sampler_options,
            size_budget_bytes=size_budget_bytes,
        )
        searcher = SettingSearcher.from_strategy(config.search_algo, context)
        searcher.session_key = self.session_key
        return searcher

    def _loggers(self, config: SearchConfig, folder: Path) -> list[Any]:
        """Ray's logger callbacks of the config's ``loggers``, told the search's id and name."""
        if not config.loggers:
            return []
        from raysearch.outputs import default_study_name

        name = default_study_name(folder, self.session_key)
        return make_loggers(config.loggers, self.session_key, name)

    @staticmethod
    def _expected_trials(searcher: SettingSearcher) -> int | None:
        """How many trials the search runs unless another stop condition fires: the smaller
        of a grid strategy's size and ``stop.iteration_limit``; None when neither is known."""
        total = None
        if all(isinstance(phase, GridPhase) for phase in searcher.phases):
            total = sum(len(phase) for phase in searcher.phases)  # type: ignore[arg-type]
        limit = searcher.max_trials
        if limit is not None:
            total = limit if total is None else min(total, limit)
        return total

    def execute(
        self,
        *,
        resume: bool,
        progress: TextIO | None,
        prepared: Prepared,
        started_at: float | None = None,
    ) -> SearchResult:
        folder = self.output_dir
        log = LogSetup(folder)
        key = self.session_key
        run: _Run | None = None
        try:
            config = self.config
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
            run = self.start(resume, progress, prepared, started_at)
            self.fit(run)
            self._refuse_missing_module(run)
            self._trials_over(run)
            result = self.finish(run)
            after_search(run.session.callbacks, result.summary, folder, self.session_key)
            return result
        except Exception as exc:
            if not is_disk_full(exc):
                raise
            # The journal holds every trial recorded before the disk filled up; resume goes on.
            finished = len(run.recorder.records) if run is not None else 0
            expected = run.expected if run is not None else None
            raise disk_full_error(folder, self.config, finished, expected) from exc
        finally:
            end_barrier(self.barrier)  # however the search ends: no actor of it outlives it
            for process in (self.timer, self.plots):
                if process is not None:
                    process.close()
            release(key)
            log.close()

    def start(
        self,
        resume: bool,
        progress: TextIO | None,
        prepared: Prepared,
        started_at: float | None,
    ) -> _Run:
        """Everything a session needs before Tune runs (on resume, rebuilt from the journal)."""
        config, folder = self.config, self.output_dir
        journal = Journal(folder / JOURNAL)
        records = journal.load() if resume else []
        self.marker_before = read_marker(folder)
        session_number = begin_session(folder, storage_path(config, folder))
        clock = SessionClock(records, started_at=started_at)
        for line in prepared.stderr_lines:  # ONNX Runtime's warnings: the log, not the terminal
            logging.getLogger(STDERR_LOGGER).info("%s", line)
        if self.kept is not None:
            self.kept.log_reused()
        spec, info = build_engine(config, str(folder / CACHE_DIR), prepared)
        share = _float_share_warning(config, info.get("float_score_s"))
        if share is not None:
            _say(share, progress)
        self.pending_reference = prepared.pending_reference
        spec.driver_node = current_node_id()
        one_node = only_driver_node()
        if not one_node:  # other nodes get the files; one machine reads them in place
            spec.model = model_blob(spec.model.path)
            if spec.decode_anchor is not None:
                spec.decode_anchor = model_blob(spec.decode_anchor.path)
        n_slots, outstanding = slots(config)
        tune_environment(outstanding)
        with quiet_optuna():
            searcher = self._searcher(
                prepared.model, max(n_slots, outstanding), spec.max_model_size_bytes
            )
            searcher.add_finished(records)
        stopper = CandidateStopper(
            config.stop,
            higher_is_better=config.metric_higher_is_better,
            elapsed_before_s=clock.elapsed_before_s,
            prior=records,
            started_at=clock.started_at,
        )
        if prepared.pending_reference is not None:
            prepared.pending_reference.stop_on_failure(stopper)
        recorder = TrialRecorder(
            folder,
            journal,
            higher_is_better=config.metric_higher_is_better,
            keep_candidates=config.keep_candidates,
            select=config.select,
            objectives=config.objectives,
            prior=records,
            clock=lambda: clock.elapsed_s,
            on_record=_OnRecord(
                stopper,
                self.kept,
                prepared.reference,
                self.timer,
                self._start_plots if ends_with_process() else None,
            ),
            # On a cluster: which node each trial runs on, and the nodes lost meanwhile.
            watch_nodes=not one_node,
            max_failures=config.max_failures,
            client_folder=model_folder(config.model),
        )
        if recorder.retries.watch is not None:
            recorder.retries.watch.poll(force=True)  # the nodes alive as the search starts
        expected = self._expected_trials(searcher)
        progress_cb = self._progress(progress, expected, clock, records, recorder)
        session = SearchSession(self.session_key, journal, clock, stopper, recorder, progress_cb)
        live = make_live_study(config, folder, self.session_key, records, recorder)
        session.callbacks = [*live, *self.callbacks, *self._loggers(config, folder)]
        session.objectives = tuple(config.objectives)
        session.probe_cache = search_probe_cache(
            model_path=spec.model.path,
            evaluation=spec.evaluation,
            calibration=spec.calibration,
            evaluator=spec.evaluator,
            float_score=spec.float_score,
            measure_latency=spec.measure_latency,
            gpu=bool(config.resources.gpu_per_trial),
            origin=str(folder),
        )
        session.searcher = searcher
        register(session)
        return _Run(
            journal,
            records,
            session_number,
            clock,
            spec,
            info,
            n_slots,
            outstanding,
            searcher,
            expected,
            stopper,
            recorder,
            progress_cb,
            session,
        )

    def _start_plots(self) -> None:
        """Start the process that draws plots/ (at the first record)."""
        from raysearch.outputs import PlotProcess

        self.plots = PlotProcess()
        self.plots.start()

    def _progress(
        self,
        stream: TextIO | None,
        expected: int | None,
        clock: SessionClock,
        records: list[dict[str, Any]],
        recorder: TrialRecorder,
    ) -> ProgressCallback:
        config = self.config
        return ProgressCallback(
            stream,
            metric=config.metric.rsplit(":", 1)[-1],  # a custom evaluator by its name
            higher_is_better=config.metric_higher_is_better,
            total=expected,
            every=max(1, min(25, (expected or 100) // 10)),
            elapsed_before_s=clock.elapsed_before_s,
            started_at=clock.started_at,  # the stopper's clock: what time_limit counts
            done_before=len(records),
            failed_before=sum(1 for r in records if not r.ok),
            candidates_before=sum(1 for r in records if is_candidate(r)),
            best_before=recorder.best.metric if recorder.best else None,
        )

    def fit(self, run: _Run) -> None:
        """Run Tune until the searcher is exhausted or a stop condition holds."""
        config, folder = self.config, self.output_dir
        expected, records = run.expected, run.records
        wave = run.slots if expected is None else max(1, min(run.slots, expected - len(records)))
        # Only actors placeable now: else the first waits out the barrier for one with no room.
        wave = min(wave, trials_placeable_now(config))
        run.session.start_barrier = self.barrier = barrier = start_barrier(wave)
        trainable = make_trainable(
            run.spec,
            folder,
            cpu_per_trial=config.resources.cpu_per_trial,
            gpu_per_trial=config.resources.gpu_per_trial,
            timeout_s=config.trial_timeout_s,
            barrier=barrier,
            driver_node=current_node_id(),
        )
        rungs = run.spec.rungs
        scheduler = None if rungs is None else RungScheduler(rungs, records)
        with quiet_tune():
            tuner = make_tuner(
                trainable,
                run.searcher,
                config,
                storage_path(self.config, self.output_dir),
                key=self.session_key,
                max_outstanding=run.outstanding,
                session=run.session_number,
                scheduler=scheduler,
            )
        _logger.info(
            "running up to %d trials at once (%d kept queued); %s",
            run.slots,
            run.outstanding,
            f"{expected} trials expected" if expected else "no fixed number of trials",
        )
        try:
            with quiet_tune(), quiet_optuna(), restored_signal_handlers(), own_callbacks_tagged():
                tuner.fit()
                check_tune_disk()
        finally:
            run.progress.close()

    def _refuse_missing_module(self, run: _Run) -> None:
        """Refuse the session (InputError), the marker put back, when a phase could not import
        a module before any trial."""
        missing = run.searcher.missing_module
        if missing is None:
            return
        restore_marker(self.output_dir, self.marker_before)
        raise missing_module_error(self.output_dir, self.config.search_algo, missing)

    def _trials_over(self, run: _Run) -> None:
        """Every trial has ended: the start barrier goes, and the other nodes' folders unless
        interrupted; then a Ray that ends with this process begins its shutdown."""
        end_barrier(self.barrier)
        self.barrier = None
        if _stop_reason(run.stopper, run.searcher, run.recorder) != "interrupted":
            records = run.recorder.records
            elsewhere = {r.node_id for r in records} - {run.spec.driver_node, None}
            remove_node_folders(
                sorted(elsewhere),
                [
                    node_folder("trials", self.output_dir),
                    node_folder("cache", run.spec.cache_dir),
                ],
            )
        trials_ended()

    def finish(self, run: _Run) -> SearchResult:
        """Write the outputs from the journal's records and mark the search's end."""
        from raysearch.outputs import write_outputs, write_trial_plots

        config, folder = self.config, self.output_dir
        live = run.searcher
        reason = _stop_reason(run.stopper, live, run.recorder)
        if self.kept is not None:
            self.kept.wait()
        if self.pending_reference is not None:  # its latency, or its failure as the error
            run.info["float_latency_ms"] = self.pending_reference.result().latency_ms
        shutil.rmtree(folder / TRIALS_TMP, ignore_errors=True)
        records = run.recorder.records
        # Latency timed again alone while the outputs that read no latency are written.
        plan = plan_retime(config, folder, records, run.spec.evaluation, str(config.model))
        if plan is not None and self.timer is not None:
            self.timer.submit(plan.job)
        plotted = write_trial_plots(
            folder, records, config, run.info.get("float_metric"), plots=self.plots
        )
        retimed = None
        if plan is not None and self.timer is not None:
            retimed = plan.apply(self.timer.result())
        if retimed is not None:
            records = retimed.records
            for figure, value in retimed.float_ms.items():  # latency_ms, a decoder's figures
                run.info[f"float_{figure}"] = value
        timed_alone = retimed.summary if retimed is not None else {}
        summary = write_outputs(
            folder,
            records,
            config=config,
            stop_reason=reason,
            wall_time_s=run.clock.elapsed_s,
            float_metric=run.info.get("float_metric"),
            float_model_size_bytes=run.info.get("float_model_size_bytes"),
            float_latency_ms=run.info.get("float_latency_ms"),
            extra={
                "sessions": run.session_number,
                "trials_started": max(live.n_started, len(records)),
                "slots": run.slots,
                "early_stopping": early_stopping_summary(run.info["early_stopping"], records),
                "kept_warm": dict(self.kept.reused) if self.kept and self.kept.enabled else None,
                "lost_nodes": run.recorder.retries.lost_nodes(records),
                "trials_retried": sum(1 for r in records if r.retries),
                # Seconds the custom evaluator took to score the float model (None: built-in).
                "float_score_s": _rounded(run.info.get("float_score_s")),
                "stop_note": _stop_note(reason, records, config, run.info.get("float_score_s")),
                "most_frequent_error": most_frequent_error(records),
                "best_latency_vs_float": timed_alone.get("best_latency_vs_float"),
                "latency_note": slower_than_float_note(
                    timed_alone.get("best_latency_vs_float"),
                    deciding=bool((timed_alone.get("latency_retimed") or {}).get("decides")),
                ),
                "latency_timing": latency_timing(config, retimed is not None),
                "latency_retimed": timed_alone.get("latency_retimed"),
                "decode_latency_retimed": timed_alone.get("decode_latency_retimed"),
                "prefill_latency_retimed": timed_alone.get("prefill_latency_retimed"),
                # Sensitivity probes taken from an earlier search of the same content.
                "probes_reused": sum(1 for r in records if r.reused_from),
                # A language-model metric's float decode step and prefill (None: another).
                "float_decode_latency_ms": run.info.get("float_decode_latency_ms"),
                "float_prefill_latency_ms": run.info.get("float_prefill_latency_ms"),
                "builder_decode_latency_ms": run.info.get("builder_decode_latency_ms"),
            },
            evaluator=run.spec.evaluator,
            plotted=plotted,
        )
        if self.plots is not None:
            self.plots.wait(folder)  # drawn while the rest was written
        for said in ("stop_note", "latency_note"):
            if summary.get(said):
                _say(summary[said], run.progress.stream)
        status = "interrupted" if reason == "interrupted" else "finished"
        # The modules of the config's plugins this session imported, a phase's late imports
        # included: a resume imports them before Ray starts (runner.AutoSearch.resume).
        plugins = [m for m in config.raw.get("plugins") or () if isinstance(m, str)]
        imported = loaded_modules(plugins)
        write_marker(folder, status, storage_path(config, folder), plugin_imports=imported)
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
        return build_result(folder, summary, records, config.metric_higher_is_better)


def missing_module_error(folder: Path, search_algo: str, missing: ImportError) -> InputError:
    """The one-line refusal of a session whose strategy needs a module not importable here:
    before Ray starts (a module a session of the search imported) or when a phase starts."""
    return InputError(
        f"{folder}: the search strategy {search_algo} needs the module "
        f"{missing.name or str(missing)!r}, which cannot be imported here ({missing}); make "
        "it importable (install it, or put it beside the config) and resume again"
    )


@dataclass
class _OnRecord:
    """What the driver does with each trial it records: the stopper observes it; at the
    first one, the output modules are preloaded, the float reference kept on the cluster,
    and the latency timer and the plot process started."""

    stopper: CandidateStopper
    kept: KeptWarm | None = None
    reference: Any = None
    timer: LatencyTimer | None = None
    plots: Callable[[], None] | None = None
    preloading: bool = False

    def __call__(self, record: TrialRecord) -> None:
        self.stopper.observe(str(record.trial_id), record)
        if not self.preloading:
            from raysearch.outputs import preload_output_modules

            self.preloading = True
            preload_output_modules(plots=self.plots is None, figures=ends_with_process())
            if self.kept is not None:
                self.kept.keep_reference(self.reference)
            if self.timer is not None:  # its imports while the trials run, not after
                self.timer.start()
            if self.plots is not None:
                self.plots()


def _stop_reason(
    stopper: CandidateStopper, searcher: SettingSearcher, recorder: TrialRecorder
) -> str:
    """The stop condition that fired first, else why the searcher stopped suggesting (once
    every trial it started has finished), else ``interrupted``."""
    if stopper.reason is not None:
        return stopper.reason
    finished = searcher.finish_reason
    if finished is not None and len(recorder.records) >= searcher.n_started:
        return finished
    return "interrupted"


#: The share of ``stop.time_limit`` a custom evaluator's float score may take unremarked.
FLOAT_SHARE_WARNING = 0.25


def _float_share_warning(config: SearchConfig, float_score_s: float | None) -> str | None:
    """The warning when a custom evaluator's float score took :data:`FLOAT_SHARE_WARNING` of
    ``stop.time_limit`` or more."""
    limit = config.stop.time_limit
    if float_score_s is None or limit is None or limit <= 0:
        return None
    if float_score_s < FLOAT_SHARE_WARNING * limit:
        return None
    return (
        f"the custom evaluator's score of the float model took {float_score_s:.1f} s, "
        f"{float_score_s / limit:.0%} of stop.time_limit ({limit:g} s): every trial scores its "
        "model as long, so few trials, or none, can finish in time; raise stop.time_limit or "
        "let the evaluator score fewer rows"
    )


def _stop_note(
    reason: str,
    records: list[dict[str, Any]],
    config: SearchConfig,
    float_score_s: float | None,
) -> str | None:
    """``summary.json``'s ``stop_note``: why a search ended without a finished trial."""
    if records or reason != "time_limit":
        return None
    note = f"no trial finished within the time limit ({config.stop.time_limit:g} s"
    if float_score_s is not None:
        note += (
            f"; the custom evaluator's score of the float model took {float_score_s:.1f} s of it"
        )
    return note + ")"


def _say(message: str, stream: TextIO | None) -> None:
    """Log ``message`` as a WARNING, and without logging set up write it to ``stream`` too."""
    _logger.warning("%s", message)
    if stream is not None and not logging.getLogger().handlers:
        stream.write(f"raysearch: {message}\n")
        stream.flush()


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 3)


def most_frequent_error(records: list[TrialRecord]) -> dict[str, Any] | None:
    """The error line most failed trials ended with, and how many; None when none failed.

    Example:
        >>> from raysearch.trialrecord import TrialRecord
        >>> most_frequent_error([
        ...     TrialRecord(status="failed", error="FileNotFoundError: data.npz"),
        ...     TrialRecord(status="ok"),
        ...     TrialRecord(status="failed", error="FileNotFoundError: data.npz"),
        ... ])
        {'error': 'FileNotFoundError: data.npz', 'trials': 2}
    """
    counts = Counter(str(r.error or "no error message") for r in records if not r.ok)
    if not counts:
        return None
    error, trials = counts.most_common(1)[0]
    return {"error": error, "trials": trials}
