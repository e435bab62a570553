"""A search's trials reported to the user's Tune callbacks (``run(callbacks=...)``) and the
config's ``loggers``, through one proxy holding only the search's key (:class:`TrialLoggers`:
Tune pickles its callbacks, a user's need not pickle), each result with the trial's record
read out of its JSON text (:func:`logged_result`).

Example:
    >>> logged_result({"metric": 0.5, "trial": '{"status": "ok", "is_candidate": true,'
    ...                ' "model_size_bytes": 2000000}'}, {"stage": "defaults"},
    ...               objectives=("metric", "model_size_mb"))["objectives/model_size_mb"]
    2.0
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ray import tune

from raysearch.ranking import is_candidate, objective_value
from raysearch.search.record.reported import RECORD_KEY, reported_record
from raysearch.search.tune._ray_loggers import LOGGED_NUMBERS, log_best_model
from raysearch.search.tune.session import forwarded, lookup
from raysearch.trialrecord import TrialRecord

__all__ = ["TrialLoggers", "logged_result", "after_search", "make_live_study"]

_logger = logging.getLogger("raysearch.search")

#: The record's fields a logger gets as numbers or words (beside Tune's own result keys).
_FIELDS = ("status", "objective", *LOGGED_NUMBERS, "error")


def logged_result(
    result: Mapping[str, Any],
    config: Mapping[str, Any] | None,
    *,
    objectives: Sequence[str] = ("metric",),
) -> dict[str, Any]:
    """Tune's ``result`` of a trial (suggested as ``config``), its record's JSON text replaced
    by its fields."""
    record = reported_record(result) or TrialRecord()
    out = {k: v for k, v in result.items() if k != RECORD_KEY}
    for key in _FIELDS:
        out[key] = getattr(record, key)
    out["is_candidate"] = is_candidate(record)
    stage = record.stage or (config or {}).get("stage")
    if stage is not None:
        out["stage"] = stage
    for name in objectives:
        value = objective_value(record, name)
        if value is not None:
            out[f"objectives/{name}"] = value
    return out


class TrialLoggers(tune.Callback):
    """Tune's callback that hands each event to the live session's callbacks."""

    def __init__(self, key: str) -> None:
        self.key = key

    def _live(self) -> tuple[list[tune.Callback], tuple[str, ...]]:
        session = lookup(self.key)
        if session is None or not session.callbacks:
            return [], ()
        return list(session.callbacks), session.objectives

    def _each(self, call: Callable[[tune.Callback], None]) -> None:
        callbacks, _ = self._live()
        for callback in callbacks:
            try:
                call(callback)
            except Exception:  # a logger's failure never stops the search
                _logger.warning("Tune callback %s failed", type(callback).__name__, exc_info=True)

    def setup(self, **info: Any) -> None:
        """Each callback's setup; one that fails (a tracking server out of reach) is dropped
        for the session with one warning, rather than failing at every trial after."""
        session = lookup(self.key)
        for callback in list(session.callbacks if session is not None else ()):
            try:
                callback.setup(**info)
            except Exception as exc:
                session.callbacks.remove(callback)
                _logger.warning(
                    "Tune callback %s failed to set up (%s: %s); it gets no trial of this session",
                    type(callback).__name__,
                    type(exc).__name__,
                    exc,
                )

    on_step_begin = forwarded("on_step_begin")
    on_step_end = forwarded("on_step_end")
    on_experiment_end = forwarded("on_experiment_end")
    on_trial_start = forwarded("on_trial_start")
    on_trial_restore = forwarded("on_trial_restore")
    on_trial_save = forwarded("on_trial_save")
    on_trial_complete = forwarded("on_trial_complete")
    on_trial_recover = forwarded("on_trial_recover")
    on_trial_error = forwarded("on_trial_error")
    on_checkpoint = forwarded("on_checkpoint")

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        objectives = self._live()[1] or ("metric",)
        logged = logged_result(result, getattr(trial, "config", None), objectives=objectives)
        self._each(
            lambda c: c.on_trial_result(
                iteration=iteration, trials=trials, trial=trial, result=logged, **info
            ),
        )


class LiveStudyCallback(tune.Callback):
    """Writes each trial's journaled record into the live Optuna study (config
    ``optuna_storage``) when Tune ends the trial."""

    def __init__(self, study: Any, recorder: Any) -> None:
        self.study = study
        self.recorder = recorder

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        trial_id = getattr(trial, "trial_id", None)
        for record in reversed(self.recorder.records):
            if record.trial_id == trial_id:
                self.study.add(record)
                return

    on_trial_error = on_trial_complete


def make_live_study(
    config: Any, folder: Path, key: str, records: Sequence[Mapping[str, Any]], recorder: Any
) -> list[tune.Callback]:
    """The live Optuna study's callback of a search whose config names ``optuna_storage``
    (none without), the study opened with the ``records`` it lacks added.

    Raises:
        InputError: Optuna cannot open the storage.
    """
    if not getattr(config, "optuna_storage", None):
        return []
    from raysearch.outputs import LiveStudy, default_study_name

    study = LiveStudy(
        config.optuna_storage,
        default_study_name(folder, key),
        {
            "metric": config.metric,
            "higher_is_better": config.metric_higher_is_better,
            "tolerance": config.tolerance,
            "tolerance_mode": config.tolerance_mode if config.is_custom_metric else None,
            "objectives": list(config.objectives),
        },
        spaces=config.search_spaces,
    )
    study.open(records)
    _logger.info(
        "trials go into the Optuna study '%s' in %s as they end",
        study.study_name,
        config.optuna_storage,
    )
    return [LiveStudyCallback(study, recorder)]


def after_search(
    callbacks: Sequence[Any], summary: Mapping[str, Any], folder: Path, search_id: str
) -> None:
    """What the loggers get once the outputs are written: the best model's files and the
    live study's final attributes."""
    from raysearch.layout import BEST

    log_best_model(callbacks, summary.get("best_trial_id"), folder / BEST, search_id)
    for callback in callbacks:
        if isinstance(callback, LiveStudyCallback):
            try:
                callback.study.finish(summary)
            except Exception:  # the outputs are written; the study's attributes are extra
                _logger.warning("the live Optuna study's summary was not written", exc_info=True)
