"""Fast fine-tuning's parameters (:class:`FinetuneOptions`) read from a trial's settings, with
their defaults and ranges (Quark's names: ``OptimAlgorithm``, ``NumIterations``,
``LearningRate``, ``NumIterLR``, ``BatchSize``, ``DataSize``, ``OptimDevice``, ``FixedSeed``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["SWITCH", "FinetuneOptions", "finetune_options"]

#: The switch.
SWITCH = "include_fast_ft"
GROUP = "FastFinetune"
ALGORITHMS = ("adaround", "adaquant")
DEVICES = ("cpu", "cuda", *(f"cuda:{i}" for i in range(8)))
_LEARNING_RATE = {"adaround": 0.1, "adaquant": 1e-5}
_ITERATIONS = 1000
_BATCH_SIZE = 2


@dataclass(frozen=True)
class FinetuneOptions:
    """The resolved fine-tuning parameters (``data_size`` None: every calibration sample)."""

    algorithm: str = "adaround"
    iterations: int = _ITERATIONS
    learning_rate: float = _LEARNING_RATE["adaround"]
    batch_size: int = _BATCH_SIZE
    data_size: int | None = None
    device: str = "cpu"
    seed: int = 0

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def finetune_options(
    settings: Mapping[str, Any], default_device: str = "cpu", samples: int | None = None
) -> FinetuneOptions:
    """The fine-tuning parameters of ``settings``, defaults filled in, ``DataSize`` capped at
    ``samples`` (ValueError for one out of range or contradicting another).
    """
    extra = settings.get("extra_options") or {}
    nested = extra.get(GROUP) or {}
    if not isinstance(nested, Mapping):
        raise ValueError(f"extra_options.{GROUP} must be a mapping, got {nested!r}")
    options = {**nested, **{k: v for k, v in extra.items() if k != GROUP}}
    algorithm = str(options.get("OptimAlgorithm") or "adaround")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"OptimAlgorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    iterations = _or(options.get("NumIterations"), _ITERATIONS)
    rate = _or(options.get("LearningRate"), _LEARNING_RATE[algorithm])
    joint = options.get("NumIterLR")
    if joint is not None:
        if not isinstance(joint, (list, tuple)) or len(joint) != 2:
            raise ValueError(f"NumIterLR must be [NumIterations, LearningRate], got {joint!r}")
        for name, value in (("NumIterations", joint[0]), ("LearningRate", joint[1])):
            if name in options and float(options[name]) != float(value):
                raise ValueError(f"NumIterLR {list(joint)} contradicts {name} {options[name]}")
        iterations, rate = joint
    iterations = _int(iterations, "NumIterations", 1)
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not rate > 0:
        raise ValueError(f"LearningRate must be a positive number, got {rate!r}")
    rate = float(rate)
    if not np.isfinite(rate):
        raise ValueError(f"LearningRate must be a positive number, got {rate!r}")
    data_size = options.get("DataSize")
    data_size = None if data_size is None else _int(data_size, "DataSize", 1)
    if data_size is not None and samples is not None and data_size >= samples:
        data_size = None  # every sample either way: one effect
    device = str(options.get("OptimDevice") or default_device)
    if device not in DEVICES:
        raise ValueError(f"OptimDevice must be one of {DEVICES}, got {device!r}")
    return FinetuneOptions(
        algorithm=algorithm,
        iterations=iterations,
        learning_rate=rate,
        batch_size=_int(options.get("BatchSize", _BATCH_SIZE), "BatchSize", 1),
        data_size=data_size,
        device="cuda:0" if device == "cuda" else device,
        seed=_int(options.get("FixedSeed", 0), "FixedSeed", 0),
    )


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def _int(value: Any, name: str, low: int) -> int:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not (ok and float(value).is_integer() and int(value) >= low):
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)
