"""Ray's MLflow and W&B logger callbacks (config ``loggers``), subclassed to log each setting
once (``settings/<key>``), per result the documented numbers (:data:`LOGGED_NUMBERS`,
``objectives/<name>``), the trial's words (id, number, stage, status, error) and the search's
id and name, each run named ``<search> trial <number>``. A W&B run's actor waits for W&B's
service (Ray's callback would kill it first), and each trial's ``wandb/`` folder is copied
into the output folder once every run ended (Tune copied its staging folder before).

Example:
    >>> trial_settings({"settings": {"calibrate_method": "MinMax",
    ...                              "extra_options": {"ActivationSymmetric": True}}})
    {'calibrate_method': 'MinMax', 'extra_options/ActivationSymmetric': True}
    >>> logged_numbers({"metric": 0.5, "objective": 8.5, "rung_score": 1e300,
    ...                 "is_candidate": True, "objectives/metric": 0.5})
    {'metric': 0.5, 'is_candidate': 1.0, 'objectives/metric': 0.5}
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ray.tune.logger import LoggerCallback

__all__ = ["LOGGED_NUMBERS", "make_loggers", "trial_settings", "logged_numbers", "log_best_model"]

_logger = logging.getLogger("raysearch.search")

#: The numbers of a trial's result that a logger gets (beside ``objectives/<name>``).
LOGGED_NUMBERS = (
    "metric",
    "is_candidate",
    "model_size_bytes",
    "latency_ms",
    "decode_latency_ms",
    "prefill_latency_ms",
    "duration_s",
    "calibration_s",
    "quantization_s",
    "evaluation_s",
    "eval_rows",
    "eval_fraction",
    "rung",
    "rungs",
)

#: The words of a trial's result that a logger keeps (MLflow's tags, W&B's config).
_RESULT_WORDS = ("status", "stage", "error")


def trial_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a trial ran, flat: nested keys joined by ``/``, as Ray's loggers do."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for key, inner in value.items():
                walk(f"{prefix}/{key}" if prefix else str(key), inner)
        else:
            flat[prefix] = value

    walk("", dict(config.get("settings") or {}))
    return flat


def trial_words(trial: Any, search_id: str, search_name: str) -> dict[str, str]:
    """What names a trial, as words: the search's id and name, the trial's id, number, stage."""
    config = getattr(trial, "config", None) or {}
    words = {"search_id": search_id, "search": search_name, "trial_id": str(trial.trial_id)}
    if config.get("number") is not None:
        words["trial_number"] = str(config["number"])
    if config.get("stage"):
        words["stage"] = str(config["stage"])
    return words


def run_name(trial: Any, search_name: str) -> str:
    """A trial's run name: ``<search> trial <number>`` (its id without a number)."""
    number = (getattr(trial, "config", None) or {}).get("number")
    return f"{search_name} trial {number if number is not None else trial.trial_id}"


def logged_numbers(result: Mapping[str, Any]) -> dict[str, float]:
    """The result's finite :data:`LOGGED_NUMBERS` and ``objectives/<name>`` (bools as 0, 1)."""
    out: dict[str, float] = {}
    for key, value in result.items():
        if key not in LOGGED_NUMBERS and not key.startswith("objectives/"):
            continue
        if isinstance(value, bool):
            value = float(value)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[key] = value
    return out


def _result_words(result: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(result[k]) for k in _RESULT_WORDS if result.get(k) not in (None, "")}


def make_loggers(
    specs: Sequence[tuple[str, Mapping[str, Any]]], search_id: str, search_name: str
) -> list[LoggerCallback]:
    """Ray's logger callback for each ``(name, settings)`` of the config's ``loggers``."""
    callbacks: list[LoggerCallback] = []
    for name, settings in specs:
        if name == "mlflow":
            callbacks.append(_mlflow_logger(dict(settings), search_id, search_name))
        elif name == "wandb":
            callbacks.append(_wandb_logger(dict(settings), search_id, search_name))
    return callbacks


def _mlflow_logger(settings: dict[str, Any], search_id: str, search_name: str) -> LoggerCallback:
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    class MLflowTrialLogger(MLflowLoggerCallback):
        """Ray's ``MLflowLoggerCallback``: one run per trial (see the module docstring)."""

        def log_trial_start(self, trial: Any) -> None:
            if trial not in self._trial_runs:
                tags = {**self.tags, **trial_words(trial, search_id, search_name)}
                run = self.mlflow_util.start_run(tags=tags, run_name=run_name(trial, search_name))
                self._trial_runs[trial] = run.info.run_id
            if not self.log_params_on_trial_end:
                self._log_settings(trial)

        def _log_settings(self, trial: Any) -> None:
            self.mlflow_util.log_params(
                run_id=self._trial_runs[trial],
                params_to_log={f"settings/{k}": v for k, v in trial_settings(trial.config).items()},
            )

        def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
            if trial not in self._trial_runs:
                self.log_trial_start(trial)
            run_id = self._trial_runs[trial]
            step = result.get("training_iteration") or iteration
            self.mlflow_util.log_metrics(
                run_id=run_id, metrics_to_log=logged_numbers(result), step=step
            )
            words = _result_words(result)
            if words:
                from mlflow.tracking import MlflowClient

                client = MlflowClient(self.tracking_uri, self.registry_uri)
                for key, value in words.items():
                    client.set_tag(run_id, key, value[:5000])  # MLflow's longest tag

        def log_trial_end(self, trial: Any, failed: bool = False) -> None:
            run_id = self._trial_runs[trial]
            if self.should_save_artifact:
                self.mlflow_util.save_artifacts(run_id=run_id, dir=trial.local_path)
            if self.log_params_on_trial_end:
                self._log_settings(trial)
            self.mlflow_util.end_run(run_id=run_id, status="FAILED" if failed else "FINISHED")

    return MLflowTrialLogger(**settings)


def _wandb_logger(settings: dict[str, Any], search_id: str, search_name: str) -> LoggerCallback:
    """Ray's ``WandbLoggerCallback`` (``project`` ``raysearch`` by default); ``mode: offline``
    is ``WANDB_MODE`` during its setup alone, where Ray reads it to ask for no API key."""
    import os

    from ray.air.integrations.wandb import WandbLoggerCallback, _WandbLoggingActor

    mode = settings.get("mode")

    class WandbRunActor(_WandbLoggingActor):
        """Ray's actor of one trial's W&B run, returning once W&B's service wrote it whole."""

        def run(self) -> None:
            import wandb

            try:
                super().run()
            finally:
                wandb.teardown()

    class WandbTrialLogger(WandbLoggerCallback):
        """Ray's ``WandbLoggerCallback``: one run per trial (see the module docstring)."""

        _logger_actor_cls = WandbRunActor

        def setup(self, *args: Any, **kwargs: Any) -> None:
            self.logged_trials: list[Any] = []
            if mode not in ("offline", "disabled") or os.environ.get("WANDB_MODE"):
                super().setup(*args, **kwargs)
                return
            os.environ["WANDB_MODE"] = mode
            try:
                super().setup(*args, **kwargs)
            finally:
                del os.environ["WANDB_MODE"]

        def log_trial_start(self, trial: Any) -> None:
            words = trial_words(trial, search_id, search_name)
            config = {"settings": dict(trial.config.get("settings") or {})}
            config.update({k: v for k, v in words.items() if k not in ("search_id", "search")})
            kwargs = {
                "id": trial.trial_id,
                "name": run_name(trial, search_name),
                "resume": False,
                "reinit": True,
                "allow_val_change": True,
                "group": self.group or search_name,
                "project": self.project,
                "config": config,
                "tags": [search_id],
                **self.kwargs,
            }
            self.logged_trials.append(trial)
            # Ray's result keys it never logs ("done", ...), and the user's ``excludes``.
            exclude = [*self._exclude_results, *self.excludes]
            self._start_logging_actor(trial, exclude, **kwargs)

        def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
            logged: dict[str, Any] = dict(logged_numbers(result))
            logged["training_iteration"] = result.get("training_iteration") or iteration
            # Ray's logging actor puts a result's ``config`` into the run's config: the words.
            logged["config"] = _result_words(result)
            super().log_trial_result(iteration, trial, logged)

        def on_experiment_end(self, trials: list, **info: Any) -> None:
            super().on_experiment_end(trials, **info)  # waits for each run's wandb.finish
            for trial in self.logged_trials:
                _copy_runs(trial)

    settings.setdefault("project", "raysearch")
    return WandbTrialLogger(**settings)


def _copy_runs(trial: Any) -> None:
    """The trial's ``wandb/`` folder from Tune's staging folder into its experiment folder."""
    import pyarrow.fs

    local = Path(trial.local_path) / "wandb"
    if not local.is_dir():  # the run went where the config's ``dir`` says
        return
    storage = trial.storage
    target = f"{storage.trial_fs_path}/wandb"
    try:
        storage.storage_filesystem.create_dir(target, recursive=True)
        pyarrow.fs.copy_files(
            str(local),
            target,
            source_filesystem=pyarrow.fs.LocalFileSystem(),
            destination_filesystem=storage.storage_filesystem,
        )
    except OSError:
        _logger.warning("W&B: the run of trial %s was not copied", trial.trial_id, exc_info=True)


def log_best_model(
    callbacks: Sequence[Any], trial_id: str | None, folder: Path, search_id: str
) -> None:
    """The best model's files (``folder``) as artifacts of the best trial's MLflow run (W&B's
    runs end in processes Ray's callback does not reopen)."""
    # A callback is an instance of Ray's MLflow class only if something imported it.
    integration = sys.modules.get("ray.air.integrations.mlflow")
    if integration is None or trial_id is None or not folder.is_dir():
        return
    for callback in callbacks:
        if not isinstance(callback, integration.MLflowLoggerCallback):
            continue
        try:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(callback.tracking_uri, callback.registry_uri)
            named = callback.experiment_name and client.get_experiment_by_name(
                callback.experiment_name
            )
            experiments = (
                [named.experiment_id]
                if named
                else [e.experiment_id for e in client.search_experiments()]
            )
            # A user's own MLflow callback names the run by Tune's trial name only.
            runs = client.search_runs(
                experiments,
                filter_string=f"tags.trial_id = '{trial_id}' and tags.search_id = '{search_id}'",
            ) or client.search_runs(
                experiments, filter_string=f"tags.trial_name LIKE '%_{trial_id}'"
            )
            for run in runs[:1]:
                client.log_artifacts(run.info.run_id, str(folder), artifact_path="best_model")
        except Exception:  # the search's outputs are written; the logger's copy is extra
            _logger.warning("MLflow: the best model could not be logged", exc_info=True)
