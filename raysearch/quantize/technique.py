"""Quantization techniques and their registry.

A technique is a :class:`FloatModelTransform` (before calibration: CLE, SmoothQuant), a
:class:`TensorOverrideProducer` (per-tensor types or float nodes: mixed precision) or a
:class:`QuantizedModelTransform` (after the quantizer: AdaRound/AdaQuant, power-of-two
scales, bias correction). Shipped ones are a module of ``techniques/`` plus a line in
:data:`BUILTIN_TECHNIQUES`.

Example:
    >>> sorted(BUILTIN_TECHNIQUES)
    ['bias_correction', 'cle', 'fast_finetune', 'mixed_precision', 'power_of_two', 'smooth_quant']
"""

from __future__ import annotations

import abc
import importlib
import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from raysearch.errors import ConfigError, suggest
from raysearch.providers import provider_names
from raysearch.space.catalogue import OptionSpec, register_shared_settings
from raysearch.usercode import note_plugin

if TYPE_CHECKING:
    from raysearch.data import DataSource

__all__ = [
    "BUILTIN_TECHNIQUES",
    "FLOAT",
    "OVERRIDES",
    "QUANTIZED",
    "Technique",
    "FloatModelTransform",
    "TensorOverrideProducer",
    "QuantizedModelTransform",
    "TensorOverrides",
    "TechniqueContext",
    "quantize_and_score",
    "register_technique",
    "technique_reject",
    "get_technique",
    "available_techniques",
    "registered_techniques",
]

_logger = logging.getLogger(__name__)

#: The kinds, in the order the trial applies them.
FLOAT = "float_transform"
OVERRIDES = "tensor_overrides"
QUANTIZED = "quantized_transform"

#: Techniques shipped with raysearch: registry key -> module that registers it when imported.
BUILTIN_TECHNIQUES: dict[str, str] = {
    "bias_correction": "raysearch.quantize.techniques.bias_correction",
    "cle": "raysearch.quantize.techniques.cle._cle",
    "fast_finetune": "raysearch.quantize.techniques.fast_finetune._fast_finetune",
    "mixed_precision": "raysearch.quantize.techniques.mixed_precision._mixed_precision",
    "power_of_two": "raysearch.quantize.techniques.power_of_two",
    "smooth_quant": "raysearch.quantize.techniques.smooth_quant._smooth_quant",
}

_REGISTRY: dict[str, type[Technique]] = {}


@dataclass
class TechniqueContext:
    """What a trial lends its techniques (:attr:`Technique.context`).

    Attributes:
        quantize: ``quantize(float_path, backend_settings, out_path)``, the trial's backend.
        score: ``score(model_path)``, the search's metric (None when it cannot be computed).
        calibration, higher_is_better: the calibration data and the metric's direction.
        cache_dir: the folder the processes of a node share (None: nothing kept on disk).
        score_settings: ``score_settings(float_path, settings_list)``, several at once on Ray;
            None: one after another (:meth:`score_each`).
    """

    quantize: Callable[[str, Mapping[str, Any], str], None]
    score: Callable[[str], float | None]
    calibration: DataSource
    higher_is_better: bool = False
    cache_dir: str | None = None
    score_settings: Callable[[str, Sequence[Mapping[str, Any]]], list[float | None]] | None = None

    def score_each(
        self, float_path: str, settings_list: Sequence[Mapping[str, Any]]
    ) -> list[float | None]:
        """Score several backend settings of one float model (through :attr:`score_settings`).

        Args:
            float_path: the float model (or a transform of it).
            settings_list: backend settings to quantize it with, one each.

        Returns:
            The metric of each, in order (None where quantizing or scoring fails).
        """
        if self.score_settings is not None:
            return self.score_settings(float_path, settings_list)
        return [quantize_and_score(self, float_path, s) for s in settings_list]


def quantize_and_score(
    context: TechniqueContext, float_path: str, settings: Mapping[str, Any]
) -> float | None:
    """``float_path`` quantized with ``settings`` and scored; None (logged) when either fails."""
    with tempfile.TemporaryDirectory(prefix="raysearch-score-") as folder:
        out = os.path.join(folder, "scored.onnx")
        try:
            context.quantize(float_path, settings, out)
            return context.score(out)
        except Exception as exc:
            _logger.info("scoring a setting failed: %s", exc)
            return None


class Technique(abc.ABC):
    """One technique: subclass one of its kinds, declare ``settings`` and implement
    :meth:`effect_key`; constructed once per process, then asked each trial's effect key.

    Args:
        providers: the trial's ONNX Runtime providers, kept when ``devices`` includes their
            device, else the CPU's (None: the CPU's).
        threads: the CPU threads a trial may use.
    """

    #: The registry key, set by :func:`register_technique`.
    name: ClassVar[str] = ""
    #: One of :data:`FLOAT`, :data:`OVERRIDES`, :data:`QUANTIZED` (set by the kind's class).
    kind: ClassVar[str] = ""
    #: Top-level settings this technique takes (switches and their parameters).
    settings: ClassVar[Mapping[str, OptionSpec]] = {}
    #: Settings inside a container (``{"extra_options": {...}}``).
    containers: ClassVar[Mapping[str, Mapping[str, OptionSpec]]] = {}
    #: Devices the technique can run inference or optimisation on.
    devices: ClassVar[frozenset[str]] = frozenset({"cpu"})
    #: Where the technique runs among the active ones of its kind: lower first, then by name
    #: (power-of-two 10, fine-tuning 20 for the final scales, bias correction 30 last).
    order: ClassVar[int] = 50
    #: Whether the technique reads or rewrites Q/DQ pairs (refused with QOperator).
    needs_qdq: ClassVar[bool] = False

    def __init__(self, *, providers: Sequence[Any] | None = None, threads: int = 1) -> None:
        given = list(providers) if providers else ["CPUExecutionProvider"]
        on_gpu = any(name != "CPUExecutionProvider" for name in provider_names(given))
        self.providers = given if not on_gpu or "gpu" in self.devices else ["CPUExecutionProvider"]
        self.threads = threads
        #: Set by the trial before each use; None outside a trial.
        self.context: TechniqueContext | None = None

    @classmethod
    def missing_requirement(cls) -> str | None:
        """Whether this technique can run here (a config switching it on is refused otherwise).

        Returns:
            Why it cannot (a missing package, naming the extra), or None.
        """
        return None

    @abc.abstractmethod
    def effect_key(self, settings: Mapping[str, Any]) -> str | None:
        """The identity of this technique's effect: trials with equal keys share its work.

        Args:
            settings: one setting's nested settings.

        Returns:
            A string that differs exactly when the effect differs; None: the technique is off.
        """

    @classmethod
    def switched_on(cls, settings: Mapping[str, Any]) -> bool:
        """Whether ``settings`` switch this technique on (its ``include_*`` switch or a setting)."""
        switches = [key for key in cls.settings if key.startswith("include_")]
        if switches:
            return any(bool(settings.get(key)) for key in switches)
        return any(
            (settings.get(container) or {}).get(key) is not None
            for container, table in cls.containers.items()
            for key in table
        )

    @classmethod
    def reject(cls, settings: Mapping[str, Any]) -> str | None:
        """Why this technique cannot apply to ``settings`` (``needs_qdq`` refuses QOperator).

        Args:
            settings: one setting's nested settings.

        Returns:
            The reason, one line, or None.
        """
        if cls.needs_qdq and settings.get("quant_format") == "QOperator":
            if cls.switched_on(settings):
                return f"{cls.name} needs quant_format QDQ (it rewrites Q/DQ pairs)"
        return None

    @classmethod
    def owns(cls, container: str, key: str) -> bool:
        """Whether ``key`` inside ``container`` (``""``: top level) is this technique's."""
        table = cls.containers.get(container, {}) if container else cls.settings
        return key in table


class FloatModelTransform(Technique):
    """Rewrites the float model before calibration."""

    kind: ClassVar[str] = FLOAT

    @abc.abstractmethod
    def transform(
        self,
        model_path: str,
        out_path: str,
        settings: Mapping[str, Any],
        calibration: DataSource,
    ) -> None:
        """Transform the float model.

        Args:
            model_path: the float model (or the previous float transform's output).
            out_path: where to write the transformed model.
            settings: one setting's nested settings.
            calibration: the calibration data.
        """


@dataclass
class TensorOverrides:
    """What a :class:`TensorOverrideProducer` asks of the quantizer.

    Attributes:
        tensor_quant_overrides: ONNX Runtime's ``TensorQuantOverrides``.
        nodes_to_exclude: node names kept in float.
        report: numbers the trial records (``extra/<name>``).
        rankings: rows of sensitivity rankings (``sensitivity.parquet``).
    """

    tensor_quant_overrides: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    nodes_to_exclude: list[str] = field(default_factory=list)
    report: dict[str, float] = field(default_factory=dict)
    rankings: list[dict[str, Any]] = field(default_factory=list)


class TensorOverrideProducer(Technique):
    """Decides per-tensor quantization types, or which nodes stay in float."""

    kind: ClassVar[str] = OVERRIDES

    @abc.abstractmethod
    def overrides(self, model_path: str, settings: Mapping[str, Any]) -> TensorOverrides:
        """What the quantizer should do differently for these settings.

        Args:
            model_path: the (possibly transformed) float model.
            settings: one setting's nested settings.

        Returns:
            The overrides, merged into the settings the backend gets.
        """


class QuantizedModelTransform(Technique):
    """Rewrites the quantized model after the quantizer, in place."""

    kind: ClassVar[str] = QUANTIZED

    @abc.abstractmethod
    def transform(
        self,
        quantized_path: str,
        float_path: str,
        settings: Mapping[str, Any],
        calibration: DataSource,
    ) -> None:
        """Rewrite the quantized model in place.

        Args:
            quantized_path: the quantized model, rewritten in place.
            float_path: the float model it was quantized from.
            settings: one setting's nested settings.
            calibration: the calibration data.
        """


_T = TypeVar("_T", bound=type[Technique])


def register_technique(name: str) -> Callable[[_T], _T]:
    """Class decorator registering a :class:`Technique` under ``name`` and its settings in
    every backend's catalogue.

    Args:
        name: the technique's name.

    Returns:
        The decorator, which returns the class registered.

    Example:
        >>> register_technique("mine")(Technique)
        Traceback (most recent call last):
        ...
        TypeError: @register_technique('mine') needs a subclass of a technique kind
    """

    def decorate(cls: _T) -> _T:
        if not (isinstance(cls, type) and issubclass(cls, Technique) and cls.kind):
            raise TypeError(f"@register_technique({name!r}) needs a subclass of a technique kind")
        existing = _REGISTRY.get(name)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            raise ValueError(f"technique {name!r} is already registered by {existing}")
        cls.name = name
        register_shared_settings(name, dict(cls.settings), containers=dict(cls.containers))
        _REGISTRY[name] = cls
        note_plugin(cls.__module__)  # actors import it too
        return cls

    return decorate


def get_technique(name: str) -> type[Technique]:
    """The technique class registered as ``name``, importing a built-in one on first use.

    Raises:
        ConfigError: no such technique, or its module cannot be imported.
    """
    if name not in _REGISTRY and name in BUILTIN_TECHNIQUES:
        try:
            importlib.import_module(BUILTIN_TECHNIQUES[name])
        except ImportError as exc:
            raise ConfigError(
                name, f"technique '{name}' needs a package that is not installed: {exc}"
            ) from None
    if name not in _REGISTRY:
        known = available_techniques()
        raise ConfigError(name, f"unknown technique '{name}'" + suggest(name, known))
    return _REGISTRY[name]


def available_techniques() -> list[str]:
    """Registry keys of every technique: the built-in ones and any registered since."""
    return sorted(set(BUILTIN_TECHNIQUES) | set(_REGISTRY))


def technique_reject(settings: Mapping[str, Any]) -> str | None:
    """The first refusal of a registered technique for ``settings``, or None.

    Example:
        >>> technique_reject({"quant_format": "QOperator", "include_bias_correction": True})
        'bias_correction needs quant_format QDQ (it rewrites Q/DQ pairs)'
    """
    for cls in registered_techniques():
        reason = cls.reject(settings)
        if reason:
            return reason
    return None


def registered_techniques() -> list[type[Technique]]:
    """Every technique class (a built-in one whose optional dependency is missing left out)."""
    for name in BUILTIN_TECHNIQUES:
        if name not in _REGISTRY:
            try:
                get_technique(name)
            except ConfigError:
                continue
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]
