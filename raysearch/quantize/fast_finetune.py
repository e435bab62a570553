"""Fast fine-tuning: AdaRound or AdaQuant weight rounding of the quantized model.

Switched on by ``include_fast_ft``; its parameters live in ``extra_options`` (Quark nests them
in ``extra_options.FastFinetune``, which is accepted too; a flat key wins):

- ``OptimAlgorithm``: ``adaround`` (learn to round each weight up or down) or ``adaquant``
  (learn the weights and the bias with straight-through rounding). Default ``adaround``.
- ``NumIterations`` (default 1000) and ``LearningRate`` (default 0.1 for AdaRound, 1e-5 for
  AdaQuant, Quark's defaults), or both at once as ``NumIterLR: [iterations, rate]``.
- ``BatchSize``: calibration samples per step (default 2, Quark's auto-search preset).
- ``DataSize``: the first calibration samples used (default: all).
- ``OptimDevice``: where PyTorch optimises: ``cpu``, ``cuda`` or ``cuda:<i>`` (default: the
  trial's GPU when it runs on CUDA and PyTorch sees one, else ``cpu``).
- ``FixedSeed``: seed of the batch sampling (default 0: the result is deterministic).

Layer by layer, in graph order, over the Conv, Gemm and MatMul nodes whose weight is a
quantized constant (``DequantizeLinear`` of an integer initializer, per tensor or per
channel, as ONNX Runtime's QDQ quantizer writes it), it minimises the layer's reconstruction
error ``|| f(W_q, X_q) - f(W, X) ||^2``: ``X_q`` is the layer's input in the quantized model
(earlier layers already fine-tuned, as NNCF's and Quark's AdaRound do, so each layer corrects
the error that reaches it) and ``f(W, X)`` the layer's output in the float model at
``float_path``, both captured by ONNX Runtime on the calibration data, one layer at a time;
``W`` is the float initializer of the same node. The new integer weights (and, for AdaQuant,
the bias, requantized to int32 with its scale ``s_in * s_w``) replace the old ones; scales,
zero points and the graph are unchanged. PyTorch does the optimisation (see
:mod:`raysearch.quantize._finetune_torch`).

Example:
    >>> options = finetune_options({"include_fast_ft": True,
    ...                             "extra_options": {"FastFinetune": {"NumIterLR": [200, 0.01]}}})
    >>> options.algorithm, options.iterations, options.learning_rate, options.batch_size
    ('adaround', 200, 0.01, 2)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from raysearch.errors import ConfigError
from raysearch.providers import device_label
from raysearch.quantize._finetune_layers import finetune_model
from raysearch.quantize.technique import QuantizedModelTransform, register_technique
from raysearch.space.catalogue import OptionSpec

if TYPE_CHECKING:
    from raysearch.data import DataSource

__all__ = ["FastFinetune", "FinetuneOptions", "finetune_options", "finetune_model", "SWITCH"]

_logger = logging.getLogger(__name__)

#: The switch.
SWITCH = "include_fast_ft"
_GROUP = "FastFinetune"
_ALGORITHMS = ("adaround", "adaquant")
_DEVICES = ("cpu", "cuda", *(f"cuda:{i}" for i in range(8)))
_LEARNING_RATE = {"adaround": 0.1, "adaquant": 1e-5}
_ITERATIONS = 1000
_BATCH_SIZE = 2
_TORCH_MISSING = "fine-tuning needs PyTorch: pip install 'raysearch[finetune]'"


def _spec(kind: str, doc: str, **kw: Any) -> OptionSpec:
    return OptionSpec(kind, doc, requires=SWITCH, **kw)


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
    """The fine-tuning parameters of trial ``settings`` (defaults filled in; ``samples``, the
    calibration size when known, caps ``DataSize``).

    Raises:
        ValueError: a parameter out of range, or ``NumIterLR`` not ``[iterations, rate]`` or
            contradicting ``NumIterations``/``LearningRate``.
    """
    extra = settings.get("extra_options") or {}
    nested = extra.get(_GROUP) or {}
    if not isinstance(nested, Mapping):
        raise ValueError(f"extra_options.{_GROUP} must be a mapping, got {nested!r}")
    options = {**nested, **{k: v for k, v in extra.items() if k != _GROUP}}
    algorithm = str(options.get("OptimAlgorithm") or "adaround")
    if algorithm not in _ALGORITHMS:
        raise ValueError(f"OptimAlgorithm must be one of {_ALGORITHMS}, got {algorithm!r}")
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
    if device not in _DEVICES:
        raise ValueError(f"OptimDevice must be one of {_DEVICES}, got {device!r}")
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


def _require_torch() -> None:
    """Raise the one-line error when PyTorch cannot be imported."""
    try:
        import torch  # noqa: F401
    except (ImportError, OSError):
        raise ConfigError(SWITCH, _TORCH_MISSING) from None


@register_technique("fast_finetune")
class FastFinetune(QuantizedModelTransform):
    """AdaRound/AdaQuant rounding of the quantized weights (see the module)."""

    needs_qdq: ClassVar[bool] = True

    settings: ClassVar[Mapping[str, OptionSpec]] = {
        SWITCH: OptionSpec("bool", "fine-tune the quantized weights (AdaRound/AdaQuant)"),
    }
    containers: ClassVar[Mapping[str, Mapping[str, OptionSpec]]] = {
        "extra_options": {
            _GROUP: _spec("dict", "Quark's group of the fine-tuning parameters below"),
            "OptimAlgorithm": _spec("enum", "adaround or adaquant", choices=_ALGORITHMS),
            "NumIterations": _spec("int", "optimisation steps per layer", low=1),
            "LearningRate": _spec("float", "Adam's learning rate", low=0.0),
            "NumIterLR": _spec("num_list", "[NumIterations, LearningRate] set together"),
            "BatchSize": _spec("int", "calibration samples per step", low=1),
            "DataSize": _spec("int", "calibration samples used (default all)", low=1),
            "OptimDevice": _spec("enum", "device PyTorch optimises on", choices=_DEVICES),
            "FixedSeed": _spec("int", "seed of the batch sampling", low=0),
        }
    }
    devices = frozenset({"cpu", "gpu"})
    order = 20

    @classmethod
    def missing_requirement(cls) -> str | None:
        import importlib.util

        return None if importlib.util.find_spec("torch") else _TORCH_MISSING

    def effect_key(self, settings: Mapping[str, Any]) -> str | None:
        if not settings.get(SWITCH):
            return None
        _require_torch()
        return self.options(settings).key()

    def options(self, settings: Mapping[str, Any]) -> FinetuneOptions:
        """The resolved parameters for ``settings`` on this trial's device."""
        samples = self.context.calibration.num_samples if self.context else None
        return finetune_options(settings, self._default_device(), samples)

    def _default_device(self) -> str:
        label = device_label(self.providers)
        if not label.startswith("cuda"):
            return "cpu"
        from raysearch.quantize import _finetune_torch

        return label if _finetune_torch.cuda_available() else "cpu"

    def transform(
        self,
        quantized_path: str,
        float_path: str,
        settings: Mapping[str, Any],
        calibration: DataSource,
    ) -> None:
        _require_torch()
        options = finetune_options(settings, self._default_device(), calibration.num_samples)
        finetune_model(
            quantized_path,
            float_path,
            calibration,
            options,
            providers=self.providers,
            threads=self.threads,
        )
