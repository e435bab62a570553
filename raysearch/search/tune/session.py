"""The live state of one search on the driver (:class:`SearchSession`), and the proxies Tune
pickles into its experiment folder, holding only the search's key to look it up by.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
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
    "forwarded",
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
    #: The first wave's start barrier (None: one actor), which the searcher opens.
    start_barrier: Any = None
    #: The user's Tune callbacks and the config's loggers, and the ``objectives`` they get.
    callbacks: list[Any] = field(default_factory=list)
    objectives: tuple[str, ...] = ("metric",)
    #: Sensitivity probes' results kept across searches (None: none kept).
    probe_cache: Any = None


def register(session: SearchSession) -> None:
    with _LOCK:
        _SESSIONS[session.key] = session


def lookup(key: str) -> SearchSession | None:
    """The session registered under ``key`` (the search's id), or None."""
    with _LOCK:
        return _SESSIONS.get(key)


def release(key: str) -> None:
    with _LOCK:
        session = _SESSIONS.pop(key, None)
    if session is not None:
        session.journal.close()


def forwarded(name: str) -> Callable[..., None]:
    """A Tune callback's method handing the event ``name`` (Tune passes its arguments by
    keyword) to each callback its class reaches (its ``_each``)."""

    def forward(self: Any, **info: Any) -> None:
        self._each(lambda c: getattr(c, name)(**info))

    return forward


class SessionStopper(Stopper):
    """Tune's stopper: the session's :class:`CandidateStopper`, looked up by key."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        session = lookup(self.key)
        return session is not None and session.stopper(trial_id, result)

    def stop_all(self) -> bool:
        session = lookup(self.key)
        return bool(session is not None and session.stopper.stop_all())


class SessionCallback(tune.Callback):
    """Tune's callback: the session's recorder (journal, models) then its progress line."""

    def __init__(self, key: str) -> None:
        self.key = key

    def _each(self, call: Callable[[tune.Callback], None]) -> None:
        session = lookup(self.key)
        for target in () if session is None else (session.recorder, session.progress):
            call(target)

    on_trial_start = forwarded("on_trial_start")
    on_trial_recover = forwarded("on_trial_recover")
    on_trial_error = forwarded("on_trial_error")
    on_trial_complete = forwarded("on_trial_complete")
    on_trial_result = forwarded("on_trial_result")

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        session = lookup(self.key)
        if session is None:
            return
        if session.recorder.retries.watch is not None:
            session.recorder.retries.watch.poll()  # a node lost: one line, when Ray says so
        session.progress.on_step_end(iteration=iteration, trials=trials, **info)
