"""What the driver keeps of a finished trial: :class:`FinishedTrialCompactor`.

Ray Tune keeps, for each number every trial reported, windows of its last values
(``run_metadata.metric_n_steps``) until the experiment ends; they only feed the running means
of a trial's next result, which a finished trial never gets (ray-project/ray#64231). This
callback empties them when a trial has ended; ``metric_analysis`` stays.

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
    """Empties the last-n windows Tune keeps for a trial once it has ended: completed,
    stopped early or failed for good (a retried trial keeps its windows)."""

    def _compact(self, trial: Any) -> None:
        # Assigned, so that Tune's __setattr__ drops the metadata's cached JSON too.
        trial.run_metadata.metric_n_steps = {}

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._compact(trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._compact(trial)
