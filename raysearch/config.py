"""``SearchConfig``: one typed, fully validated config, loaded from YAML or a dict.

Everything is checked before Ray starts: unknown keys (with the closest known key suggested),
types, ranges, the search spaces, the evaluator's import path. Every error is a
:class:`~raysearch.errors.ConfigError` whose message names the key path.

Example:
    >>> cfg = SearchConfig.from_dict({
    ...     "model": "model.onnx", "calibration_data": "calib.npz",
    ...     "search_space": "A8W8_SEARCH", "search_algo": "Grid",
    ... }, check_paths=False)
    >>> cfg.metric, cfg.eval_data == cfg.calibration_data
    ('L2', True)
"""

from __future__ import annotations

import copy
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from raysearch.demo import BUILTIN_PREFIX, resolve_builtin
from raysearch.errors import ConfigError, suggest
from raysearch.space import SearchSpace

__all__ = [
    "ConfigError",
    "SearchConfig",
    "StopConfig",
    "ResourcesConfig",
    "SEARCH_ALGOS",
    "BUILTIN_METRICS",
    "load_config",
    "predefined_spaces",
    "load_predefined_space",
    "apply_overrides",
]

_logger = logging.getLogger(__name__)

SEARCH_ALGOS = ("Grid", "Random", "TPE", "CmaEs", "GPS", "NSGAII", "QMC")
_ALGO_ALIASES = {
    "grid": "Grid",
    "grid_search": "Grid",
    "gridsearch": "Grid",
    "random": "Random",
    "random_search": "Random",
    "tpe": "TPE",
    "cmaes": "CmaEs",
    "cma-es": "CmaEs",
    "cma_es": "CmaEs",
    "gps": "GPS",
    "gp": "GPS",
    "nsgaii": "NSGAII",
    "nsga2": "NSGAII",
    "nsga-ii": "NSGAII",
    "qmc": "QMC",
}
#: Built-in metrics and whether higher is better.
BUILTIN_METRICS = {"L1": False, "L2": False, "cos": True, "PSNR": True, "SSIM": True}
_METRIC_ALIASES = {"cosine": "cos", "cos_sim": "cos", "l1": "L1", "l2": "L2", "psnr": "PSNR"}

#: Quark AutoSearch names -> raysearch key paths.
_QUARK_KEYS = {
    "search_metric": "metric",
    "search_metric_tolerance": "tolerance",
    "search_stop_condition": "stop",
    "n_trials": "stop.iteration_limit",
    "n_jobs": "resources.max_concurrent_trials",
}


@dataclass
class StopConfig:
    """Stop conditions; ``-1`` (or absent) disables one.

    ``find_best_candidate`` is a target stricter than the tolerance, in the metric's units
    (``cos >= 0.9999``): the search ends at the first candidate that reaches it.
    """

    find_n_candidates: int = -1
    find_best_candidate: float | None = None
    iteration_limit: int = -1
    time_limit: float = -1


@dataclass
class ResourcesConfig:
    """Per-trial resources; ``max_concurrent_trials`` defaults to what the cluster can run."""

    cpu_per_trial: float = 1.0
    gpu_per_trial: float = 0.0
    max_concurrent_trials: int | None = None


@dataclass
class SearchConfig:
    """A complete, validated search config. Build with :meth:`from_dict` or :func:`load_config`."""

    model: Path
    calibration_data: Any
    search_spaces: list[SearchSpace]
    eval_data: Any = None
    search_algo: str = "TPE"
    seed: int | None = None
    metric: str = "L2"
    metric_key: str | None = None
    tolerance: float | None = None
    tolerance_mode: str = "absolute"
    higher_is_better: bool | None = None
    stop: StopConfig = field(default_factory=StopConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    address: str | None = None
    output_dir: Path = Path("raysearch_output")
    storage_path: str | None = None
    batch_size: int | None = None
    trial_timeout_s: float | None = None
    max_failures: int = 0
    keep_candidates: bool = True
    measure_latency: bool = True
    #: The config as the user wrote it (after key mapping), for ``best/config.yaml``.
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    # -- derived ---------------------------------------------------------------------------
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
        return _import_evaluator(self.metric, "metric")

    # -- loading ---------------------------------------------------------------------------
    @classmethod
    def from_dict(
        cls,
        raw: Mapping[str, Any],
        *,
        base_dir: Path | None = None,
        check_paths: bool = True,
    ) -> SearchConfig:
        """Validate ``raw`` completely and return the config. Relative paths are resolved
        against ``base_dir`` (the config file's folder; default: the working directory)."""
        if not isinstance(raw, Mapping):
            raise ConfigError("", f"a config must be a mapping of keys, got {type(raw).__name__}")
        data = _map_quark_names(copy.deepcopy(dict(raw)))
        base = Path(base_dir) if base_dir else Path.cwd()
        _check_keys(data, _TOP_LEVEL_KEYS, "")

        def path_of(key: str, required: bool) -> Any:
            value = data.get(key)
            if value is None:
                if required:
                    raise ConfigError(key, "is required")
                return None
            if not isinstance(value, (str, os.PathLike)):
                return value  # a CalibrationDataReader object given from Python
            if isinstance(value, str) and value.startswith(BUILTIN_PREFIX):
                try:
                    return resolve_builtin(value)
                except KeyError:
                    raise ConfigError(
                        key,
                        f"unknown built-in {value!r}; known: builtin:magika, "
                        "builtin:magika-calib, builtin:magika-eval",
                    ) from None
            p = Path(os.path.expanduser(str(value)))
            p = p if p.is_absolute() else base / p
            if check_paths and not p.exists():
                raise ConfigError(key, f"file not found: {p}")
            return p

        model = path_of("model", True)
        if not isinstance(model, Path):
            raise ConfigError("model", f"expected a path to an .onnx file, got {model!r}")
        if check_paths and model.is_dir():
            raise ConfigError("model", f"expected an .onnx file, got a directory: {model}")
        calibration = path_of("calibration_data", True)
        evaluation = path_of("eval_data", False)

        spaces = _parse_spaces(data)
        algo = _choose_algo(data.get("search_algo", "TPE"))
        if algo == "Grid":
            for space in spaces:
                space.check_grid()
        seed = data.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError("seed", f"expected an integer, got {seed!r}")

        metric = _parse_metric(data.get("metric", "L2"))
        custom = metric not in BUILTIN_METRICS
        tolerance = _number(data, "tolerance", None)
        mode = data.get("tolerance_mode", "absolute")
        if mode not in ("absolute", "relative"):
            raise ConfigError("tolerance_mode", f"expected absolute or relative, got {mode!r}")
        hib = data.get("higher_is_better")
        if hib is not None and not isinstance(hib, bool):
            raise ConfigError("higher_is_better", f"expected true or false, got {hib!r}")
        if not custom:
            if "tolerance_mode" in data:
                raise ConfigError(
                    "tolerance_mode",
                    f"applies to custom metrics only; for {metric} the tolerance bounds the "
                    "metric itself",
                )
            if hib is not None and hib != BUILTIN_METRICS[metric]:
                raise ConfigError(
                    "higher_is_better",
                    f"{metric} is {'higher' if BUILTIN_METRICS[metric] else 'lower'}-is-better "
                    "by definition; remove this key",
                )
        metric_key = data.get("metric_key")
        if metric_key is not None and not isinstance(metric_key, str):
            raise ConfigError("metric_key", f"expected a string, got {metric_key!r}")
        if custom:
            _import_evaluator(metric, "metric")
        stop = _parse_stop(data.get("stop"))
        if stop.find_n_candidates > 0 and tolerance is None:
            raise ConfigError(
                "stop.find_n_candidates", "needs a tolerance: a candidate is a trial within it"
            )
        if stop.find_best_candidate is not None and tolerance is None:
            raise ConfigError("stop.find_best_candidate", "needs a tolerance as well")
        resources_cfg = _parse_resources(data.get("resources"))
        address = data.get("address")
        if address is not None and not isinstance(address, str):
            raise ConfigError(
                "address", f"expected 'auto', 'ray://host:port' or empty, got {address!r}"
            )
        out = data.get("output_dir", "raysearch_output")
        if not isinstance(out, (str, os.PathLike)):
            raise ConfigError("output_dir", f"expected a path, got {out!r}")
        out_path = Path(os.path.expanduser(str(out)))
        # Outputs go where the user runs raysearch, not next to a (possibly installed) config.
        out_path = out_path if out_path.is_absolute() else Path.cwd() / out_path
        if check_paths and out_path.exists() and not out_path.is_dir():
            raise ConfigError("output_dir", f"exists and is not a directory: {out_path}")
        storage = data.get("storage_path")
        if storage is not None and not isinstance(storage, str):
            raise ConfigError("storage_path", f"expected a path or URI, got {storage!r}")
        batch_size = _integer(data, "batch_size", None, low=1)
        timeout = _number(data, "trial_timeout_s", None)
        if timeout is not None and timeout <= 0:
            raise ConfigError("trial_timeout_s", f"expected a positive number, got {timeout!r}")
        max_failures = _integer(data, "max_failures", 0, low=0)
        for flag in ("keep_candidates", "measure_latency"):
            if flag in data and not isinstance(data[flag], bool):
                raise ConfigError(flag, f"expected true or false, got {data[flag]!r}")
        return cls(
            model=model,
            calibration_data=calibration,
            eval_data=evaluation if evaluation is not None else calibration,
            search_spaces=spaces,
            search_algo=algo,
            seed=seed,
            metric=metric,
            metric_key=metric_key,
            tolerance=tolerance,
            tolerance_mode=mode,
            higher_is_better=hib,
            stop=stop,
            resources=resources_cfg,
            address=address or None,
            output_dir=out_path,
            storage_path=storage,
            batch_size=batch_size,
            trial_timeout_s=timeout,
            max_failures=max_failures,
            keep_candidates=data.get("keep_candidates", True),
            measure_latency=data.get("measure_latency", True),
            raw=data,
        )


_TOP_LEVEL_KEYS = {
    "model",
    "calibration_data",
    "eval_data",
    "search_space",
    "search_spaces",
    "search_algo",
    "seed",
    "metric",
    "metric_key",
    "tolerance",
    "tolerance_mode",
    "higher_is_better",
    "stop",
    "resources",
    "address",
    "output_dir",
    "storage_path",
    "batch_size",
    "trial_timeout_s",
    "max_failures",
    "keep_candidates",
    "measure_latency",
}


def _check_keys(data: Mapping[str, Any], known: set[str], prefix: str) -> None:
    for key in data:
        if key not in known:
            path = f"{prefix}.{key}" if prefix else str(key)
            raise ConfigError(path, "unknown key" + suggest(str(key), known))


def _map_quark_names(data: dict[str, Any]) -> dict[str, Any]:
    """Accept the names an AMD Quark AutoSearch config uses, logging each mapping."""
    for quark, ours in _QUARK_KEYS.items():
        if quark not in data:
            continue
        value = data.pop(quark)
        head, _, tail = ours.partition(".")
        target = data if not tail else data.setdefault(head, {})
        key = tail or head
        if not isinstance(target, dict):
            raise ConfigError(head, f"expected a mapping, got {target!r}")
        if key in target:
            raise ConfigError(quark, f"given together with '{ours}': keep one of them")
        target[key] = value
        _logger.info("config: Quark key '%s' read as '%s'", quark, ours)
    return data


def _choose_algo(value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(
            "search_algo", f"expected one of {', '.join(SEARCH_ALGOS)}, got {value!r}"
        )
    if value in SEARCH_ALGOS:
        return value
    mapped = _ALGO_ALIASES.get(value.lower())
    if mapped is None:
        raise ConfigError(
            "search_algo",
            f"expected one of {', '.join(SEARCH_ALGOS)}, got {value!r}"
            + suggest(value, SEARCH_ALGOS + tuple(_ALGO_ALIASES)),
        )
    _logger.info("config: search_algo '%s' read as '%s'", value, mapped)
    return mapped


def _parse_metric(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(
            "metric",
            f"expected L1, L2, cos, PSNR, SSIM or 'package.module:function', got {value!r}",
        )
    if value in BUILTIN_METRICS:
        return value
    if value in _METRIC_ALIASES or value.upper() in BUILTIN_METRICS:
        return _METRIC_ALIASES.get(value, value.upper())
    if ":" not in value:
        raise ConfigError(
            "metric",
            f"unknown metric {value!r}; expected L1, L2, cos, PSNR, SSIM or "
            "'package.module:function'" + suggest(value, BUILTIN_METRICS),
        )
    return value


def _import_evaluator(spec: str, path: str) -> Callable[..., Any]:
    """Import ``package.module:function`` exactly as written and check it can be called with
    ``(model_path, providers)`` (the evaluate stage's loader, imported only when needed)."""
    from raysearch.evaluate import load_custom_evaluator

    return load_custom_evaluator(spec, key=path)


def _number(data: Mapping[str, Any], key: str, default: float | None, *, prefix: str = "") -> Any:
    value = data.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{prefix}{key}", f"expected a number, got {value!r}")
    return value


def _integer(
    data: Mapping[str, Any],
    key: str,
    default: int | None,
    *,
    low: int | None = None,
    prefix: str = "",
) -> Any:
    value = data.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{prefix}{key}", f"expected an integer, got {value!r}")
    if low is not None and value < low and value != -1:
        raise ConfigError(f"{prefix}{key}", f"expected an integer >= {low}, got {value!r}")
    return value


def _parse_stop(raw: Any) -> StopConfig:
    if raw is None:
        return StopConfig()
    if not isinstance(raw, Mapping):
        raise ConfigError("stop", f"expected a mapping of stop conditions, got {raw!r}")
    _check_keys(raw, {f.name for f in fields(StopConfig)}, "stop")
    stop = StopConfig(
        find_n_candidates=_integer(raw, "find_n_candidates", -1, low=1, prefix="stop."),
        find_best_candidate=_number(raw, "find_best_candidate", None, prefix="stop."),
        iteration_limit=_integer(raw, "iteration_limit", -1, low=1, prefix="stop."),
        time_limit=_number(raw, "time_limit", -1, prefix="stop."),
    )
    if stop.find_best_candidate == -1:
        stop.find_best_candidate = None
    if stop.time_limit != -1 and stop.time_limit <= 0:
        raise ConfigError("stop.time_limit", f"expected seconds > 0 or -1, got {stop.time_limit!r}")
    return stop


def _parse_resources(raw: Any) -> ResourcesConfig:
    if raw is None:
        return ResourcesConfig()
    if not isinstance(raw, Mapping):
        raise ConfigError("resources", f"expected a mapping, got {raw!r}")
    _check_keys(raw, {f.name for f in fields(ResourcesConfig)}, "resources")
    cpu = _number(raw, "cpu_per_trial", 1.0, prefix="resources.")
    gpu = _number(raw, "gpu_per_trial", 0.0, prefix="resources.")
    if cpu <= 0:
        raise ConfigError("resources.cpu_per_trial", f"expected a number > 0, got {cpu!r}")
    if gpu < 0:
        raise ConfigError("resources.gpu_per_trial", f"expected a number >= 0, got {gpu!r}")
    if gpu > 1 and not float(gpu).is_integer():
        raise ConfigError(
            "resources.gpu_per_trial",
            f"a fraction must be at most 1 (a share of one GPU), got {gpu!r}",
        )
    concurrent = _integer(raw, "max_concurrent_trials", None, low=1, prefix="resources.")
    if concurrent == -1:
        concurrent = None
    return ResourcesConfig(cpu, gpu, concurrent)


# -- search spaces ---------------------------------------------------------------------------
def predefined_spaces() -> dict[str, Path]:
    """Names of the predefined spaces shipped under ``configs/`` and their files."""
    folder = resources.files("raysearch.configs")
    out: dict[str, Path] = {}
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".yaml") and name[:-5].isupper():
            out[name[:-5]] = Path(str(entry))
    return dict(sorted(out.items()))


def load_predefined_space(name: str, path: str = "search_space") -> dict[str, Any]:
    """The raw dict of a predefined space (its file's ``search_space`` key)."""
    spaces = predefined_spaces()
    if name not in spaces:
        raise ConfigError(
            path,
            f"unknown predefined space '{name}'"
            + suggest(name, spaces)
            + f"; known: {', '.join(spaces)}",
        )
    with spaces[name].open() as fh:
        data = yaml.safe_load(fh)
    return data["search_space"]


def _parse_spaces(data: Mapping[str, Any]) -> list[SearchSpace]:
    if "search_space" in data and "search_spaces" in data:
        raise ConfigError("search_spaces", "give either search_space or search_spaces, not both")
    if "search_spaces" in data:
        items = data["search_spaces"]
        if not isinstance(items, list) or not items:
            raise ConfigError("search_spaces", "expected a non-empty list of spaces")
        where = [f"search_spaces[{i}]" for i in range(len(items))]
    elif "search_space" in data:
        items, where = [data["search_space"]], ["search_space"]
    else:
        raise ConfigError("search_space", "is required (a mapping, or a predefined space name)")
    spaces = []
    for raw, path in zip(items, where, strict=True):
        if isinstance(raw, str):
            raw = load_predefined_space(raw, path)
        spaces.append(SearchSpace.parse(raw, path=path))
    return spaces


# -- files and overrides -----------------------------------------------------------------------
def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (values parsed as YAML) to a raw config dict."""
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(
                item, "an override is written key=value, e.g. stop.iteration_limit=20"
            )
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(key, f"cannot read value {text!r}: {exc}") from None
        target = data
        parts = key.split(".")
        for part in parts[:-1]:
            nxt = target.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(key, f"'{part}' is not a mapping")
            target = nxt
        target[parts[-1]] = value
    return data


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a config file with ``yaml.safe_load``, one-line errors for what cannot be read."""
    path = Path(path)
    if not path.exists():
        raise ConfigError("", f"config file not found: {path}")
    if path.is_dir():
        raise ConfigError("", f"expected a YAML file, got a directory: {path}")
    try:
        with path.open(encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError("", f"{path}: not valid YAML{where}: {problem}") from None
    except UnicodeDecodeError:
        raise ConfigError("", f"{path}: not a text file") from None
    if data is None:
        raise ConfigError("", f"{path}: the config file is empty")
    if not isinstance(data, dict):
        raise ConfigError("", f"{path}: expected a mapping of keys, got {type(data).__name__}")
    return data


def load_config(
    path: str | Path, overrides: list[str] | None = None, *, check_paths: bool = True
) -> SearchConfig:
    """Load a YAML config file, apply ``key=value`` overrides, validate everything.

    Relative input paths in the file are read relative to the file's folder; ``output_dir``
    relative to the working directory.
    """
    path = Path(path)
    data = apply_overrides(read_yaml(path), overrides or [])
    return SearchConfig.from_dict(data, base_dir=path.resolve().parent, check_paths=check_paths)
