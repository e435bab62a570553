"""Ray Tune's ``Tuner`` for a search: a new experiment, or the saved one restored on resume
when it can be read.

Example:
    >>> tuner, restored = make_tuner(trainable, searcher, config, storage, key=str(folder),
    ...                              resume=False, records=[])          # doctest: +SKIP
    >>> tuner.fit()                                                      # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import os
import pickle
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysearch.errors import InputError
from raysearch.layout import EXPERIMENT
from raysearch.search.record.reported import pack_record
from raysearch.search.record.retries import tune_max_failures
from raysearch.search.tune._compact import FinishedTrialCompactor
from raysearch.search.tune._loggers import TrialLoggers
from raysearch.search.tune.session import SessionCallback, SessionStopper

if TYPE_CHECKING:
    from raysearch.config import SearchConfig
    from raysearch.search.tune.searchers import SettingSearcher

__all__ = [
    "MissingModuleError",
    "make_tuner",
    "replay_result",
    "restored_signal_handlers",
    "tune_state_intact",
]

_logger = logging.getLogger("raysearch.search")


@contextlib.contextmanager
def restored_signal_handlers() -> Iterator[None]:
    """Put back the process's SIGINT and SIGUSR1 handlers after the block (a Tune run).

    Ray Tune's run installs its own handlers for both (the first Ctrl-C ends the run
    gracefully) and never puts the previous ones back once the run ends, so in a notebook or
    a service that runs search after search, a later Ctrl-C only ended an earlier search's
    run. Signal handlers belong to the main thread: elsewhere this does nothing.

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


class MissingModuleError(InputError):
    """A resume whose saved Tune state names a module that cannot be imported (one line)."""


#: The files of a saved experiment that ``Tuner.restore`` reads (the newest of each kind, by
#: name, as Tune picks them), and how each is read: the experiment state is JSON, the search
#: generator's and the searcher's states are pickles (Tune's ``search_gen_state-*.json`` too).
_SAVED_STATES = (
    ("experiment_state-*.json", json.loads),
    ("search_gen_state-*.json", pickle.loads),
    ("searcher-state-*.pkl", pickle.loads),
)


def tune_state_intact(path: str) -> bool:
    """Whether Ray Tune's newest saved experiment state in ``path`` (a folder or a URI that
    pyarrow's file systems open, as Tune's ``storage_path``) can be read: the experiment's,
    the search generator's and the searcher's. Tune copies them to the storage folder at every
    save, so a kill during the copy leaves one cut short (a restore then fails inside Tune,
    which logs it and carries on without the searcher); the journal then carries the search on
    in a new Tune experiment. A folder that cannot be listed is Tune's to report.

    Raises:
        MissingModuleError: a saved state names a module (a plugin's) that cannot be imported
            here: the state is whole, and a new experiment's trials would fail on the same
            module, so the resume stops until it can be imported.
    """
    from pyarrow import fs as pafs

    try:
        if "://" in path:
            filesystem, folder = pafs.FileSystem.from_uri(path)
        else:
            filesystem, folder = pafs.LocalFileSystem(), os.path.abspath(path)
        listed = filesystem.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    except (OSError, ValueError):
        return True
    files = {Path(info.path).name: info.path for info in listed if info.type == pafs.FileType.File}
    for pattern, read in _SAVED_STATES:
        matching = sorted(name for name in files if fnmatch.fnmatch(name, pattern))
        if not matching:
            continue
        try:
            with filesystem.open_input_stream(files[matching[-1]]) as stream:
                read(stream.read())
        except ImportError as exc:  # whole, but it names code this process cannot import
            raise MissingModuleError(
                f"{path}: Ray Tune's saved state {matching[-1]} needs the module"
                f" {exc.name or '?'!r}, which cannot be imported here ({exc}); make it"
                " importable (install it, or put it beside the config) and resume again"
            ) from None
        except Exception as exc:  # any way a cut-short file fails to load
            _logger.warning(
                "Ray Tune's saved state %s is unreadable (%s): the journal carries the search on",
                matching[-1],
                f"{type(exc).__name__}: {exc}",
            )
            return False
    return True


def replay_result(record: Mapping[str, Any]) -> dict[str, Any]:
    """What a journaled trial returns when Tune runs it again after a restore."""
    trial = {k: v for k, v in record.items() if k not in ("point", "params", "settings")}
    return {
        "metric": record.get("metric"),
        "objective": record.get("objective"),
        "trial": pack_record(trial),
    }


def _trial_dirname(trial: Any) -> str:
    return trial.trial_id


def make_tuner(
    trainable: Any,
    searcher: SettingSearcher,
    config: SearchConfig,
    storage: str,
    *,
    key: str,
    resume: bool,
    records: list[dict[str, Any]],
    scheduler: Any = None,
    restore: bool = True,
) -> tuple[Any, bool]:
    """The Tuner, and whether it restored Tune's saved experiment. ``scheduler`` (Tune's
    trial scheduler: ASHA over the rungs of evaluation on growing subsets) is Tune's FIFO
    when None; a restored experiment keeps the one it was created with. ``restore=False``
    resumes in a new Tune experiment told the journal's trials: a search that goes on with
    other stop conditions (its saved searcher holds the old limit, a finished one is done).

    Tune's ``TimeoutStopper`` does not replace ``time_limit``: its budget starts at its first
    check and knows nothing of earlier sessions, while ``time_limit`` counts from the start
    of the first session (see :class:`~raysearch.search.tune.stopper.CandidateStopper`), so the
    one ``SessionStopper`` asks the stopper of the live session.
    """
    from ray import tune

    path = os.path.join(storage, EXPERIMENT)
    if resume and restore and tune.Tuner.can_restore(path) and tune_state_intact(path):
        _logger.info("restoring Ray Tune's experiment %s (%d trials journaled)", path, len(records))
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
    run_config = tune.RunConfig(
        name=name,
        storage_path=storage,
        stop=SessionStopper(key),
        # The user's callbacks and the config's loggers are the live session's, reached
        # through TrialLoggers (a restored Tuner brings back its pickled callbacks only).
        callbacks=[SessionCallback(key), TrialLoggers(key), FinishedTrialCompactor()],
        verbose=0,
        log_to_file=False,
        # The trial's own failures (config max_failures) and its node's losses: the recorder
        # tells them apart (search/record/retries.py).
        failure_config=tune.FailureConfig(
            max_failures=tune_max_failures(config.max_failures), fail_fast=False
        ),
        checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False),
    )
    tune_config = tune.TuneConfig(
        search_alg=searcher,
        # stop.iteration_limit is the searcher's (it caps the trials started); Tune's sample
        # count only mirrors it.
        num_samples=searcher.max_trials or -1,
        reuse_actors=True,
        trial_dirname_creator=_trial_dirname,
        scheduler=scheduler,
    )
    return tune.Tuner(trainable, tune_config=tune_config, run_config=run_config), False
