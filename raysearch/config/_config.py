"""``SearchConfig``: one typed config from YAML or a dict, every key checked before Ray starts.

Example:
    >>> cfg = SearchConfig.from_dict({
    ...     "model": "model.onnx", "calibration_data": "calib.npz",
    ...     "search_space": "A8W8_SEARCH", "search_algo": "Grid",
    ... }, check_paths=False)
    >>> cfg.metric, cfg.eval_data == cfg.calibration_data
    ('L2', True)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from raysearch.config._dialects import Translation
from raysearch.config._early_stopping import EarlyStoppingConfig, parse_early_stopping
from raysearch.config._files import apply_overrides, read_yaml
from raysearch.config._inc import translate_inc
from raysearch.config._loggers import parse_loggers
from raysearch.config._metric import check_evaluator, parse_metric_settings
from raysearch.config._objectives import (
    check_objectives_algo,
    parse_max_decode_latency,
    parse_objectives,
    parse_retime_latency,
    parse_size_budget,
)
from raysearch.config._objects import is_reader, plain_copy, read_reader
from raysearch.config._optuna_storage import parse_optuna_storage
from raysearch.config._paths import input_path, model_path, output_dir
from raysearch.config._quark import translate_quark
from raysearch.config._sampler import algo_of, given_sampler, parse_sampler_options
from raysearch.config._sections import (
    ResourcesConfig,
    StopConfig,
    parse_resources,
    parse_stop,
)
from raysearch.config._spaces import (
    parse_spaces,
    preset_search_algo,
)
from raysearch.config._values import check_keys, integer, number
from raysearch.errors import ConfigError, ErrorCollector
from raysearch.metrics import BUILTIN_METRICS
from raysearch.space import SearchSpace
from raysearch.strategies import BUILTIN_STRATEGIES, check_strategy_spaces

__all__ = ["SearchConfig", "load_config"]

_T = TypeVar("_T")

#: The modules of the strategies that take ``points_to_evaluate``.
_TAKE_START_POINTS = (
    "raysearch.strategies.grid",
    "raysearch.strategies.samplers",
    "raysearch.strategies._auto",
    "raysearch.strategies._two_stage",
    "raysearch.strategies._finetune_search",
    "raysearch.strategies._weight_only",
)
#: ``search_algo`` when a config names none: Auto for a predefined space, TPE for another.
DEFAULT_ALGO_PREDEFINED = "Auto"
DEFAULT_ALGO = "TPE"


@dataclass
class SearchConfig:
    """A complete, validated search config. Build with :meth:`from_dict` or :func:`load_config`."""

    model: Path
    calibration_data: Any
    search_spaces: list[SearchSpace]
    eval_data: Any = None
    search_algo: str = "TPE"
    seed: int | None = None
    #: A built-in metric's name, or a custom evaluator's import path or ``module:qualname``.
    metric: str = "L2"
    metric_key: str | None = None
    tolerance: float | None = None
    tolerance_mode: str = "absolute"
    higher_is_better: bool | None = None
    stop: StopConfig = field(default_factory=StopConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    #: Evaluation on growing subsets of the evaluation rows (``early_stopping``).
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    address: str | None = None
    output_dir: Path = Path("raysearch_output")
    storage_path: str | None = None
    batch_size: int | None = None
    trial_timeout_s: float | None = None
    max_failures: int = 0
    #: Candidate models kept under ``candidates/``, the best ones (None: every one).
    keep_candidates: int | None = 3
    measure_latency: bool = True
    #: Whether latency is timed again alone after the last trial: None (``auto``) where
    #: latency decides (``select``, ``objectives``), True always, False never.
    retime_latency: bool | None = None
    #: The Pareto front's objectives and what picks ``best/`` among the candidates.
    objectives: tuple[str, ...] = ("metric",)
    select: str = "metric"
    #: The slowest decode step a candidate may take: ``"float"``, milliseconds or None.
    max_decode_latency: float | str | None = None
    #: The largest model a candidate may be: megabytes, ``"builder"`` or None.
    size_budget: float | str | None = None
    #: ``run`` continues an earlier run of this search in ``output_dir``.
    resume_if_exists: bool = False
    #: Ray Tune's experiment loggers, ``(name, settings)`` each (``mlflow``, ``wandb``).
    loggers: tuple[tuple[str, dict[str, Any]], ...] = ()
    #: The Optuna sampler given as ``search_algo`` from Python (None: the strategy's own).
    sampler: Any = field(default=None, repr=False)
    sampler_options: dict[str, Any] = field(default_factory=dict)
    #: The Optuna storage URL the search writes its study into as each trial ends.
    optuna_storage: str | None = None
    #: The config as the user wrote it (names in their canonical spelling).
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    #: Where a module the config names is looked up when Python does not find it.
    code_dirs: tuple[Path, ...] = ()
    #: The evaluator given as ``metric`` from Python, shipped to the trials pickled.
    metric_function: Callable[..., Any] | None = field(default=None, repr=False)

    @property
    def is_custom_metric(self) -> bool:
        return self.metric not in BUILTIN_METRICS

    @property
    def metric_higher_is_better(self) -> bool:
        if self.metric in BUILTIN_METRICS:
            return BUILTIN_METRICS[self.metric]
        return True if self.higher_is_better is None else self.higher_is_better

    def load_evaluator(self) -> Callable[..., Any] | None:
        """The custom evaluator function, or None for a built-in metric."""
        if not self.is_custom_metric:
            return None
        return check_evaluator(self.metric_function or self.metric, "metric", self.code_dirs)

    def code_modules(self) -> list[str]:
        """The modules this config names: the custom evaluator's (by path) and the ``plugins``."""
        plugins = self.raw.get("plugins") or []
        named = self.is_custom_metric and self.metric_function is None
        evaluator = [self.metric.partition(":")[0]] if named else []
        return [*evaluator, *(m for m in plugins if isinstance(m, str))]

    @classmethod
    def from_dict(
        cls,
        raw: Mapping[str, Any],
        *,
        base_dir: Path | None = None,
        check_paths: bool = True,
        code_dirs: Sequence[str | os.PathLike] | None = None,
    ) -> SearchConfig:
        """Validate ``raw`` completely; every mistake is reported, one line each.

        Args:
            raw: the config's keys (README, "A complete config"), Python objects allowed.
            base_dir: the folder relative input paths are read from (default: the working one).
            check_paths: whether the input files must exist (and the model be ONNX).
            code_dirs: where a module the config names is looked up (default: ``base_dir``, cwd).

        Returns:
            The checked :class:`SearchConfig`.

        Raises:
            ConfigError: a mistake (``ConfigErrors``: several), each naming its key path.
        """
        if not isinstance(raw, Mapping):
            raise ConfigError("", f"a config must be a mapping of keys, got {type(raw).__name__}")
        errors = ErrorCollector()
        data = _read_dialects(plain_copy(dict(raw)), errors)
        base = Path(base_dir) if base_dir else Path.cwd()
        if code_dirs is None:
            code_dirs = [base, Path.cwd()]
        dirs = tuple(dict.fromkeys(Path(d).absolute() for d in code_dirs))
        _checked(errors, check_keys, data, _TOP_LEVEL_KEYS, "")
        model = _checked(errors, model_path, data, base, check_paths)
        calibration = _checked(
            errors, input_path, data, "calibration_data", True, base, check_paths
        )
        evaluation = _checked(errors, input_path, data, "eval_data", False, base, check_paths)
        if model is not None:
            # Readers are read once, here: one reader may serve as both.
            if is_reader(calibration):
                calibration = _checked(errors, read_reader, calibration, model, "calibration_data")
            if is_reader(evaluation):
                evaluation = _checked(errors, read_reader, evaluation, model, "eval_data")
        spaces, algo, seed = _parse_search(data, dirs, errors)
        metric = _checked(errors, parse_metric_settings, data, dirs)
        stop = _checked(errors, parse_stop, data.get("stop"))
        if stop is not None and metric is not None and metric.tolerance is None:
            if stop.find_n_candidates > 0:
                errors.add(
                    ConfigError(
                        "stop.find_n_candidates",
                        "needs a tolerance: a candidate is a trial within it",
                    )
                )
            if stop.find_best_candidate is not None:
                errors.add(ConfigError("stop.find_best_candidate", "needs a tolerance as well"))
        resources_cfg = _checked(errors, parse_resources, data.get("resources"))
        early_stopping = _checked(errors, parse_early_stopping, data.get("early_stopping"))
        run_options = _parse_run_options(data, check_paths, errors)
        if run_options["retime_latency"] and resources_cfg and resources_cfg.gpu_per_trial > 0:
            errors.add(
                ConfigError(
                    "retime_latency",
                    "true times on the driver's CPU, and the trials run on GPUs "
                    "(resources.gpu_per_trial)",
                )
            )
        sampler = given_sampler(data.get("search_algo"))
        options: dict[str, Any] | None = {}
        if algo is not None:
            _checked(errors, check_objectives_algo, run_options["objectives"], algo)
            options = _checked(
                errors, parse_sampler_options, data.get("sampler_options"), algo, sampler
            )
        errors.raise_any()
        assert metric is not None and algo is not None
        _keep_canonical_names(data, metric.metric, algo, metric.tolerance_mode)
        return cls(
            model=model,
            calibration_data=calibration,
            eval_data=evaluation if evaluation is not None else calibration,
            search_spaces=spaces,
            search_algo=algo,
            seed=seed,
            **vars(metric),  # MetricSettings: SearchConfig fields of the same names
            stop=stop,
            resources=resources_cfg,
            early_stopping=early_stopping,
            **run_options,
            sampler=sampler,
            sampler_options=options or {},
            raw=data,
            code_dirs=dirs,
        )


def _read_dialects(data: dict[str, Any], errors: ErrorCollector) -> dict[str, Any]:
    """``data`` with Quark's and Neural Compressor's names read as raysearch's."""
    translation = Translation(data, errors)
    translate_quark(translation)
    translate_inc(translation)
    translation.log()
    return translation.data


def _checked(
    errors: ErrorCollector, check: Callable[..., _T], *args: Any, **kwargs: Any
) -> _T | None:
    """``check(*args, **kwargs)``, or None when it raised a ConfigError (kept in ``errors``)."""
    with errors.check():
        return check(*args, **kwargs)
    return None


#: The keys a config may give: every field of :class:`SearchConfig` but those set from another
#: key or from Python (a new field is a key unless listed here), ``search_space`` (one
#: space), ``points_to_evaluate`` and ``plugins``.
_TOP_LEVEL_KEYS = {f.name for f in fields(SearchConfig)} - {
    "sampler",  # given as search_algo
    "raw",
    "code_dirs",
    "metric_function",  # given as metric
} | {"search_space", "points_to_evaluate", "plugins"}


def _load_plugins(value: Any, search_dirs: Sequence[Path] = ()) -> tuple[str, ...]:
    """Import the ``plugins`` before the spaces and the algorithm are checked."""
    from raysearch.usercode import import_plugins

    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(m, str) and m for m in value):
        raise ConfigError("plugins", f"expected a list of module names, got {value!r}")
    for i, module in enumerate(value):
        try:
            import_plugins([module], search_dirs=search_dirs)
        except ImportError as exc:
            raise ConfigError(f"plugins[{i}]", f"cannot import {module!r}: {exc}") from None
    return tuple(value)


def _keep_canonical_names(data: dict[str, Any], metric: str, algo: str, mode: str) -> None:
    """Write the names ``data`` spells in another case or as an alias canonically."""
    for key, name in (("metric", metric), ("search_algo", algo), ("tolerance_mode", mode)):
        if key in data and isinstance(data[key], str):
            data[key] = name


def _default_algo(data: Mapping[str, Any]) -> str:
    """:data:`DEFAULT_ALGO_PREDEFINED` when every space is predefined, else :data:`DEFAULT_ALGO`."""
    raws = data.get("search_spaces", [data.get("search_space")])
    if isinstance(raws, list) and raws and all(isinstance(r, str) for r in raws):
        try:  # a preset may name its own strategy (the weight-only ones: WeightOnly)
            named = {preset_search_algo(r) for r in raws}
        except ConfigError:  # an unknown preset: parse_spaces says so
            named = {None}
        return named.pop() if len(named) == 1 and None not in named else DEFAULT_ALGO_PREDEFINED
    return DEFAULT_ALGO


def _parse_search(
    data: Mapping[str, Any], search_dirs: Sequence[Path], errors: ErrorCollector
) -> tuple[list[SearchSpace], str | None, int | None]:
    """The plugins, spaces, algorithm and seed (unchecked when the plugins failed)."""
    plugins_ok = len(errors.errors)
    _checked(errors, _load_plugins, data.get("plugins"), search_dirs)
    spaces: list[SearchSpace] | None = None
    algo: str | None = None
    if len(errors.errors) == plugins_ok:
        spaces = _checked(errors, parse_spaces, data)
        algo = _checked(errors, algo_of, data.get("search_algo", _default_algo(data)))
    if spaces is not None and algo is not None:
        with errors.check():
            _check_algo_spaces(data, algo, spaces)
    seed = data.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        errors.add(ConfigError("seed", f"expected an integer, got {seed!r}"))
    return spaces or [], algo, seed


def _check_algo_spaces(data: Mapping[str, Any], algo: str, spaces: list[SearchSpace]) -> None:
    """What the algorithm needs of the spaces (a finite grid, ``points_to_evaluate``)."""
    if algo == "Grid":
        for space in spaces:
            space.check_grid()
    check_strategy_spaces(algo, spaces)
    info = BUILTIN_STRATEGIES.get(algo)
    if "points_to_evaluate" in data and info and info.module not in _TAKE_START_POINTS:
        raise ConfigError(
            "points_to_evaluate",
            f"{algo} chooses its own first settings; Grid, the Optuna samplers, Auto, "
            "TwoStage, FinetuneSearch and WeightOnly take points_to_evaluate",
        )


def _parse_run_options(
    data: Mapping[str, Any], check_paths: bool, errors: ErrorCollector
) -> dict[str, Any]:
    """The keys of how a search runs, each checked on its own (mistakes go to ``errors``)."""
    address = data.get("address")
    if address is not None and not isinstance(address, str):
        errors.add(
            ConfigError("address", f"expected 'auto', 'ray://host:port' or empty, got {address!r}")
        )
    out_path = _checked(errors, output_dir, data, check_paths)
    storage = data.get("storage_path")
    if storage is not None and not isinstance(storage, str):
        errors.add(ConfigError("storage_path", f"expected a path or URI, got {storage!r}"))
    batch_size = _checked(errors, integer, data, "batch_size", None, low=1)
    timeout = _checked(errors, number, data, "trial_timeout_s", None)
    if timeout is not None and timeout <= 0:
        errors.add(ConfigError("trial_timeout_s", f"expected a positive number, got {timeout!r}"))
    max_failures = _checked(errors, integer, data, "max_failures", 0, low=0)
    for flag in ("measure_latency", "resume_if_exists"):
        if flag in data and not isinstance(data[flag], bool):
            errors.add(ConfigError(flag, f"expected true or false, got {data[flag]!r}"))
    objectives, select = _checked(errors, parse_objectives, data) or (("metric",), "metric")
    return {
        "address": address or None,
        "output_dir": out_path,
        "storage_path": storage,
        "batch_size": batch_size,
        "trial_timeout_s": timeout,
        "max_failures": max_failures,
        "keep_candidates": _checked(errors, _keep_candidates, data.get("keep_candidates", 3)),
        "measure_latency": data.get("measure_latency", True),
        "retime_latency": _checked(errors, parse_retime_latency, data),
        "resume_if_exists": data.get("resume_if_exists", False),
        "objectives": objectives,
        "select": select,
        "max_decode_latency": _checked(errors, parse_max_decode_latency, data),
        "size_budget": _checked(errors, parse_size_budget, data),
        "loggers": _checked(errors, parse_loggers, data.get("loggers")) or (),
        "optuna_storage": _checked(errors, parse_optuna_storage, data.get("optuna_storage")),
    }


def _keep_candidates(value: Any) -> int | None:
    """``keep_candidates``: an integer >= 0, ``true`` (every candidate) or ``false`` (none)."""
    if isinstance(value, bool):
        return None if value else 0
    if not isinstance(value, int) or value < 0:
        raise ConfigError(
            "keep_candidates",
            f"expected an integer >= 0 (the candidate models kept), got {value!r}",
        )
    return value


def load_config(
    path: str | Path, overrides: list[str] | None = None, *, check_paths: bool = True
) -> SearchConfig:
    """Load a YAML config, apply ``key=value`` overrides, validate everything (input paths
    relative to the file's folder, ``output_dir`` to the working one).

    Args:
        path: the YAML file.
        overrides: ``key.path=value`` strings (values as YAML), applied before the checks.
        check_paths: whether the input files must exist.

    Returns:
        The checked :class:`SearchConfig`.
    """
    path = Path(path)
    data = apply_overrides(read_yaml(path), overrides or [])
    return SearchConfig.from_dict(data, base_dir=path.resolve().parent, check_paths=check_paths)
