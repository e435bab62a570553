"""Ray Tune's ``Tuner`` for one session of a search: always a new Tune experiment (a resumed
search's searcher, scheduler and stop conditions are rebuilt from the journal)."""

from __future__ import annotations

import contextlib
import operator
import signal
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from raysearch.layout import EXPERIMENT
from raysearch.search.record.retries import tune_max_failures
from raysearch.search.tune._compact import FinishedTrialCompactor
from raysearch.search.tune._loggers import TrialLoggers
from raysearch.search.tune.session import SessionCallback, SessionStopper

if TYPE_CHECKING:
    from raysearch.config import SearchConfig
    from raysearch.search.tune.searchers import SettingSearcher

__all__ = ["make_tuner", "restored_signal_handlers"]


@contextlib.contextmanager
def restored_signal_handlers() -> Iterator[None]:
    """Put back the main thread's SIGINT and SIGUSR1 handlers after the block (a Tune run),
    which Tune replaces and never restores.

    Example:
        >>> before = signal.getsignal(signal.SIGINT)
        >>> with restored_signal_handlers():
        ...     _ = signal.signal(signal.SIGINT, signal.SIG_IGN)
        >>> signal.getsignal(signal.SIGINT) is before
        True
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    names = [signal.SIGINT] + ([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])
    saved = {number: signal.getsignal(number) for number in names}
    try:
        yield
    finally:
        for number, handler in saved.items():
            if handler is not None:  # None: a handler not installed from Python
                signal.signal(number, handler)


def make_tuner(
    trainable: Any,
    searcher: SettingSearcher,
    config: SearchConfig,
    storage: str,
    *,
    key: str,
    max_outstanding: int,
    session: int = 1,
    scheduler: Any = None,
) -> Any:
    """A new Tune experiment for the search's ``session`` (1 the first) under ``storage``,
    named ``search``, then ``search-<session>``; ``scheduler`` None is Tune's FIFO.
    ``max_outstanding``: the trials suggested but unfinished at most (Tune's
    ``max_concurrent_trials``, a ``ConcurrencyLimiter`` around the searcher; running trials
    are bounded by the cluster's resources)."""
    from ray import tune

    run_config = tune.RunConfig(
        name=EXPERIMENT if session == 1 else f"{EXPERIMENT}-{session}",
        storage_path=storage,
        stop=SessionStopper(key),
        callbacks=[SessionCallback(key), TrialLoggers(key), FinishedTrialCompactor()],
        verbose=0,
        log_to_file=False,
        # A trial's own failures and its node's losses: the recorder tells them apart.
        failure_config=tune.FailureConfig(
            max_failures=tune_max_failures(config.max_failures), fail_fast=False
        ),
        checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False),
    )
    tune_config = tune.TuneConfig(
        search_alg=searcher,
        num_samples=searcher.max_trials or -1,
        max_concurrent_trials=max_outstanding,
        reuse_actors=True,
        trial_dirname_creator=operator.attrgetter("trial_id"),
        scheduler=scheduler,
    )
    return tune.Tuner(trainable, tune_config=tune_config, run_config=run_config)
