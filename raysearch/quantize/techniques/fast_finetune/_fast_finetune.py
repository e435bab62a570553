"""Fast fine-tuning: AdaRound or AdaQuant weight rounding of the quantized model.

Switched on by ``include_fast_ft``; parameters in ``extra_options`` (or Quark's
``extra_options.FastFinetune``; a flat key wins): ``OptimAlgorithm`` (``adaround``, default,
or ``adaquant``: weights and bias with straight-through rounding), ``NumIterations`` (1000),
``LearningRate`` (0.1 AdaRound, 1e-5 AdaQuant) or both as ``NumIterLR``, ``BatchSize`` (2),
``DataSize`` (default all), ``FixedSeed`` (0), ``OptimDevice`` (default: the trial's GPU,
else ``cpu``).

Layer by layer in graph order (Conv, Gemm, MatMul with a quantized constant weight), it
minimises ``|| f(W_q, X_q) - f(W, X) ||^2`` with ``X_q`` the input in the quantized model
(earlier layers already tuned) and ``f(W, X)`` the float output, both captured by ONNX Runtime
on the calibration data; only the integer weights (and AdaQuant's bias) change.

Example:
    >>> options = finetune_options({"include_fast_ft": True,
    ...                             "extra_options": {"FastFinetune": {"NumIterLR": [200, 0.01]}}})
    >>> options.algorithm, options.iterations, options.learning_rate, options.batch_size
    ('adaround', 200, 0.01, 2)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from raysearch.errors import ConfigError
from raysearch.providers import device_label
from raysearch.quantize.technique import QuantizedModelTransform, register_technique
from raysearch.quantize.techniques.fast_finetune._layers import finetune_model
from raysearch.quantize.techniques.fast_finetune._options import (
    ALGORITHMS,
    DEVICES,
    GROUP,
    SWITCH,
    FinetuneOptions,
    finetune_options,
)
from raysearch.space.catalogue import OptionSpec

if TYPE_CHECKING:
    from raysearch.data import DataSource

__all__ = ["FastFinetune", "FinetuneOptions", "finetune_options", "finetune_model"]

_logger = logging.getLogger(__name__)


_TORCH_MISSING = "fine-tuning needs PyTorch: pip install 'raysearch[finetune]'"


def _spec(kind: str, doc: str, **kw: Any) -> OptionSpec:
    return OptionSpec(kind, doc, requires=SWITCH, **kw)


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
            GROUP: _spec("dict", "Quark's group of the fine-tuning parameters below"),
            "OptimAlgorithm": _spec("enum", "adaround or adaquant", choices=ALGORITHMS),
            "NumIterations": _spec("int", "optimisation steps per layer", low=1),
            "LearningRate": _spec("float", "Adam's learning rate", low=0.0),
            "NumIterLR": _spec("num_list", "[NumIterations, LearningRate] set together"),
            "BatchSize": _spec("int", "calibration samples per step", low=1),
            "DataSize": _spec("int", "calibration samples used (default all)", low=1),
            "OptimDevice": _spec("enum", "device PyTorch optimises on", choices=DEVICES),
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
        samples = len(self.context.calibration) if self.context else None
        return finetune_options(settings, self._default_device(), samples)

    def _default_device(self) -> str:
        label = device_label(self.providers)
        if not label.startswith("cuda"):
            return "cpu"
        from raysearch.quantize.techniques.fast_finetune import _torch as _finetune_torch

        return label if _finetune_torch.cuda_available() else "cpu"

    def transform(
        self,
        quantized_path: str,
        float_path: str,
        settings: Mapping[str, Any],
        calibration: DataSource,
    ) -> None:
        _require_torch()
        options = finetune_options(settings, self._default_device(), len(calibration))
        finetune_model(
            quantized_path,
            float_path,
            calibration,
            options,
            providers=self.providers,
            threads=self.threads,
        )
