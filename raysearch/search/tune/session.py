"""The live state of one search on the driver, and the thin Tune objects that reach it.

Ray Tune pickles the stopper and the callbacks into its experiment folder when a Tuner is
built. raysearch therefore hands Tune small proxies (:class:`SessionStopper`,
:class:`SessionCallback`) that hold only the search's key (its ``search_id``, kept in the
output folder's marker); each call looks up the :class:`SearchSession` registered under that
key in this process, which holds the live counts, clock, progress stream and journal handle.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from ray import tune
from ray.tune.stopper import Stopper

from raysearch.search.record.journal import Journal, SessionClock
from raysearch.search.record.recorder import TrialRecorder
from raysearch.search.tune.progress import ProgressCallback
from raysearch.search.tune.stopper import CandidateStopper

__all__ = [
    "SearchSession",
    "SessionStopper",
    "SessionCallback",
    "register",
    "lookup",
    "release",
]

_logger = logging.getLogger(__name__)

_SESSIONS: dict[str, SearchSession] = {}
_LOCK = threading.Lock()


@dataclass
class SearchSession:
    """Everything a running search keeps on the driver."""

    key: str
    journal: Journal
    clock: SessionClock
    stopper: CandidateStopper
    recorder: TrialRecorder
    progress: ProgressCallback
    #: The searcher Tune is using.
    searcher: Any = None
    #: The first wave's :class:`~raysearch.search.tune.trainable.StartBarrier` (None: one actor),
    #: which the searcher opens when it waits for results before proposing more.
    start_barrier: Any = None
    #: The Tune callbacks of this session (``run(callbacks=...)`` and the config's
    #: ``loggers``), each handed every event by ``_loggers.TrialLoggers``, and the
    #: ``objectives`` they get each trial's value of.
    callbacks: list[Any] = field(default_factory=list)
    objectives: tuple[str, ...] = ("metric",)
    #: Results of sensitivity probes kept across searches by content
    #: (:class:`~raysearch.search.record.probe_cache.ProbeCache`; None: none kept), which the
    #: searcher reuses instead of running a probe again.
    probe_cache: Any = None


def register(session: SearchSession) -> None:
    with _LOCK:
        _SESSIONS[session.key] = session


def lookup(key: str) -> SearchSession | None:
    """The session registered under ``key`` (the search's id: see ``search_id``), or None."""
    with _LOCK:
        return _SESSIONS.get(key)


def release(key: str) -> None:
    with _LOCK:
        session = _SESSIONS.pop(key, None)
    if session is not None:
        session.journal.close()


class SessionStopper(Stopper):
    """Tune's stopper: the session's :class:`CandidateStopper`, looked up by key."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        session = lookup(self.key)
        if session is None:
            return False
        return session.stopper(trial_id, result)

    def stop_all(self) -> bool:
        session = lookup(self.key)
        return bool(session is not None and session.stopper.stop_all())


class SessionCallback(tune.Callback):
    """Tune's callback: the session's recorder (journal, models) then its progress line."""

    def __init__(self, key: str) -> None:
        self.key = key

    def _targets(self) -> tuple[tune.Callback, ...]:
        session = lookup(self.key)
        return () if session is None else (session.recorder, session.progress)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        for target in self._targets():
            target.on_trial_start(iteration=iteration, trials=trials, trial=trial, **info)

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        for target in self._targets():
            target.on_trial_result(
                iteration=iteration, trials=trials, trial=trial, result=result, **info
            )

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        for target in self._targets():
            target.on_trial_recover(iteration=iteration, trials=trials, trial=trial, **info)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        for target in self._targets():
            target.on_trial_error(iteration=iteration, trials=trials, trial=trial, **info)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        for target in self._targets():
            target.on_trial_complete(iteration=iteration, trials=trials, trial=trial, **info)

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        session = lookup(self.key)
        if session is None:
            return
        if session.recorder.retries.watch is not None:
            session.recorder.retries.watch.poll()  # a node lost: one line, when Ray says so
        session.progress.on_step_end(iteration=iteration, trials=trials, **info)
