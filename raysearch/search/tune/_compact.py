""":class:`FinishedTrialCompactor` empties the windows of last values Ray Tune keeps of each
number a trial reported (``run_metadata.metric_n_steps``) once the trial ended: they feed only
a next result's running means (ray-project/ray#64231); ``metric_analysis`` stays.

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
    """Empties a trial's last-n windows once it completed or failed for good."""

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        # Assigned, so that Tune's __setattr__ drops the metadata's cached JSON too.
        trial.run_metadata.metric_n_steps = {}

    on_trial_error = on_trial_complete
