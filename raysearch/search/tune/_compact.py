"""What the driver keeps of a finished trial: :class:`FinishedTrialCompactor`.

Ray Tune keeps every trial of an experiment on the driver until the experiment ends, and with
it, for each number the trial reported, two windows of its last values (``deque`` objects of
5 and 10 values in ``run_metadata.metric_n_steps``), which only feed the running means of
the trial's next result, and which its experiment checkpoint writes as cloudpickled text. A
finished trial gets no next result, so its windows are dead weight, held for every trial of
the search (Tune's driver memory grows linearly with the trial count: ray-project/ray#64231,
open; what they cost per trial in ``benchmarks/scale.py``'s search: ``benchmarks/README.md``,
section 14). This callback
empties them when Tune says a trial has ended; the analysis itself (``metric_analysis``:
max, min, mean, last, last-5/10 means) stays, and so does everything else Tune's experiment
checkpoint writes. Written by hand: Tune has no setting for it.

Example:
    >>> from ray.tune.experiment import Trial
    >>> trial = Trial("__fake", stub=True)
    >>> trial.update_last_result({"metric": 0.5, "training_iteration": 1})
    >>> sorted(trial.run_metadata.metric_n_steps["metric"])
    ['10', '5']
    >>> FinishedTrialCompactor().on_trial_complete(iteration=1, trials=[trial], trial=trial)
    >>> trial.run_metadata.metric_n_steps, trial.run_metadata.metric_analysis["metric"]["last"]
    ({}, 0.5)
"""

from __future__ import annotations

from typing import Any

from ray import tune

__all__ = ["FinishedTrialCompactor"]


class FinishedTrialCompactor(tune.Callback):
    """Empties the last-n windows Tune keeps for a trial once it has ended: completed or
    stopped early (``on_trial_complete``, called while Tune still shows the trial RUNNING,
    after its last result) or failed for good (``on_trial_error`` comes after the last retry;
    a retried trial goes through ``on_trial_recover`` and keeps its windows)."""

    def _compact(self, trial: Any) -> None:
        # Assigning through the attribute also drops the metadata's cached JSON (Tune's
        # __setattr__), so the next experiment checkpoint writes the smaller state.
        trial.run_metadata.metric_n_steps = {}

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._compact(trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._compact(trial)
