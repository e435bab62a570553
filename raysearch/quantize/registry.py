"""Quantizer backends and their registry (see DEVELOPERS.md, "Add a backend")."""

from __future__ import annotations

import abc
import importlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from raysearch.errors import ConfigError, suggest
from raysearch.space.catalogue import (
    QUANTIZER,
    Catalogue,
    get_catalogue,
    register_catalogue,
)
from raysearch.usercode import note_plugin

if TYPE_CHECKING:
    import onnx

    from raysearch.data import DataSource
    from raysearch.quantize.calibration import CalibrationCache

__all__ = [
    "DEFAULT_BACKEND",
    "BUILTIN_BACKENDS",
    "QuantizeInfo",
    "QuantizerBackend",
    "register_backend",
    "get_backend",
    "available_backends",
    "backend_reject",
    "backend_missing_requirement",
    "first_refusal",
]

DEFAULT_BACKEND = "ort"

#: Backends shipped with raysearch: registry key -> module that registers it when imported.
BUILTIN_BACKENDS: dict[str, str] = {
    "ort": "raysearch.quantize.backends.ort._backend",
    "nncf": "raysearch.quantize.backends.nncf._backend",
    "weight_only": "raysearch.quantize.backends.weight_only._backend",
    "nncf_weight_only": "raysearch.quantize.backends.nncf_weight_only._backend",
}

_REGISTRY: dict[str, type[QuantizerBackend]] = {}


@dataclass
class QuantizeInfo:
    """What one :meth:`QuantizerBackend.quantize` call cost and did.

    Attributes:
        calibration_s, quantization_s: seconds in calibration (0 on a cache hit) and quantizing.
        calib_cache_hit: whether the calibration came from the cache.
        extra: the backend's own figures, recorded as the trial's ``extra/<name>``.
        quantized_share: the share of MatMul/Gemm/Conv nodes quantized, for a backend whose
            graph does not show it; None: counted from the graph.

    Example:
        >>> QuantizeInfo(quantization_s=0.5, quantized_share=1.0).to_dict()["quantized_share"]
        1.0
    """

    calibration_s: float = 0.0
    quantization_s: float = 0.0
    calib_cache_hit: bool = False
    extra: dict[str, float] = field(default_factory=dict)
    quantized_share: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class QuantizerBackend(abc.ABC):
    """One quantizer, built once per process with the float model and the calibration data, then
    called once per trial.

    Args:
        model_path: the float model (or a technique's transform of it).
        calibration: the calibration data (``batches()`` yields the model's input feeds).
        cache: the search's calibration cache, shared by the trials of a node (None: none).
        threads: the CPU threads a trial may use.
        gpu_id: the trial's GPU, or None.
        providers: the trial's ONNX Runtime providers; None: derived from ``gpu_id``.
    """

    #: The registry key, set by :func:`register_backend`.
    name: ClassVar[str] = ""
    #: Every setting this backend takes: search spaces are validated against it.
    catalogue: ClassVar[Catalogue | None] = None
    #: The settings :meth:`validate` checks against the model, as dotted key paths: the
    #: search checks every choice of them before it starts.
    model_settings: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        model_path: str | os.PathLike,
        calibration: DataSource,
        cache: CalibrationCache | None = None,
        *,
        threads: int = 1,
        gpu_id: int | None = None,
        providers: Sequence[Any] | None = None,
    ) -> None:
        self.model_path = os.fspath(model_path)
        self.calibration = calibration
        self.cache = cache
        self.threads = threads
        self.gpu_id = gpu_id
        self.providers = list(providers) if providers else None

    @classmethod
    @abc.abstractmethod
    def validate(
        cls, settings: Mapping[str, Any], model: str | os.PathLike | onnx.ModelProto
    ) -> None:
        """Check ``settings`` against ``model`` before any trial runs.

        Args:
            settings: one setting's nested settings (DEVELOPERS.md, "A point and its settings").
            model: the float model, as a path or an ``onnx.ModelProto``.

        Raises:
            ConfigError: a setting that cannot apply to ``model``.
        """

    @classmethod
    def reject(cls, settings: Mapping[str, Any]) -> str | None:
        """Why the backend would refuse ``settings`` (left out of the space before anything runs).

        Args:
            settings: one setting's nested settings.

        Returns:
            The reason, one line, or None.
        """
        return None

    @classmethod
    def reject_on_model(
        cls, settings: Mapping[str, Any], weights: Mapping[str, Sequence[int]]
    ) -> str | None:
        """Why the backend would refuse ``settings`` on a model, beyond :meth:`reject`.

        Args:
            settings: one setting's nested settings.
            weights: the model's weight MatMuls: node name -> weight shape.

        Returns:
            The reason, one line, or None.
        """
        return None

    @classmethod
    def missing_requirement(cls) -> str | None:
        """Whether this backend can run here (a config that selects it is refused otherwise).

        Returns:
            Why it cannot (a missing package, naming the extra), or None.
        """
        return None

    @abc.abstractmethod
    def quantize(self, settings: Mapping[str, Any], out_path: str | os.PathLike) -> QuantizeInfo:
        """Write the model quantized with ``settings`` to ``out_path`` (an error fails the trial).

        Args:
            settings: one setting's nested settings (only the keys the space set).
            out_path: where to write the quantized model.

        Returns:
            What the call cost (:class:`QuantizeInfo`).
        """

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release temporary files and sessions when the process is done; by default nothing."""

    def __enter__(self) -> QuantizerBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_B = TypeVar("_B", bound=type[QuantizerBackend])


def register_backend(name: str) -> Callable[[_B], _B]:
    """Class decorator registering a :class:`QuantizerBackend` under ``name``, with its catalogue.

    Args:
        name: the backend's name, as a space's ``quantizer`` selects it.

    Returns:
        The decorator, which returns the class registered.

    Example:
        >>> register_backend("mine")(object)
        Traceback (most recent call last):
        ...
        TypeError: @register_backend('mine') needs a QuantizerBackend subclass
    """

    def decorate(cls: _B) -> _B:
        if not (isinstance(cls, type) and issubclass(cls, QuantizerBackend)):
            raise TypeError(f"@register_backend({name!r}) needs a QuantizerBackend subclass")
        existing = _REGISTRY.get(name)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            raise ValueError(f"quantizer backend {name!r} is already registered by {existing}")
        catalogue = cls.catalogue or get_catalogue(name, shared=False)
        if catalogue is None:  # it declares no settings: a space may only select it
            catalogue = Catalogue(name, {"quantizer": QUANTIZER})
        if catalogue.backend != name:
            catalogue = Catalogue(name, catalogue.settings, catalogue.containers, catalogue.aliases)
        cls.name = name
        cls.catalogue = register_catalogue(catalogue)
        _REGISTRY[name] = cls
        note_plugin(cls.__module__)  # actors import it too
        return cls

    return decorate


def get_backend(name: str | None = None) -> type[QuantizerBackend]:
    """The backend class registered as ``name`` (default ``"ort"``), imported on first use.

    Raises:
        ConfigError: (key ``quantizer``) no such backend, or its module cannot be imported.
    """
    name = name or DEFAULT_BACKEND
    if name not in _REGISTRY and name in BUILTIN_BACKENDS:
        try:
            importlib.import_module(BUILTIN_BACKENDS[name])
        except ImportError as exc:
            raise ConfigError(
                "quantizer", f"backend '{name}' needs a package that is not installed: {exc}"
            ) from None
    if name not in _REGISTRY:
        known = available_backends()
        raise ConfigError(
            "quantizer",
            f"unknown quantizer backend '{name}'"
            + suggest(name, known)
            + "; known: "
            + ", ".join(known),
        )
    return _REGISTRY[name]


def available_backends() -> list[str]:
    """Registry keys of every backend: the built-in ones and any registered since."""
    return sorted(set(BUILTIN_BACKENDS) | set(_REGISTRY))


def backend_reject(
    settings: dict[str, Any], weights: Mapping[str, Sequence[int]] | None = None
) -> str | None:
    """Why the backend ``settings`` select would refuse them (on a model with ``weights``), or None.

    Example:
        >>> backend_reject({"activation_type": "QInt8", "weight_type": "QUInt8"})
        'activation_type QInt8 with weight_type QUInt8 is not supported by ONNX Runtime'
    """
    from raysearch.quantize.technique import technique_reject

    backend = get_backend(settings.get("quantizer"))
    reason = backend.reject(settings) or technique_reject(settings)
    if reason is None and weights is not None:
        reason = backend.reject_on_model(settings, weights)
    return reason


def first_refusal(
    rules: Iterable[Callable[[Mapping[str, Any]], str | None]], settings: Mapping[str, Any]
) -> str | None:
    """The first of ``rules`` that refuses ``settings`` (its one line), or None.

    Example:
        >>> rules = [lambda s: None, lambda s: "bits 3 is refused" if s.get("bits") == 3 else None]
        >>> first_refusal(rules, {"bits": 3})
        'bits 3 is refused'
    """
    for rule in rules:
        reason = rule(settings)
        if reason:
            return reason
    return None


def backend_missing_requirement(name: str | None) -> str | None:
    """Why backend ``name`` cannot run here (a missing package, naming the extra), or None.

    Example:
        >>> backend_missing_requirement("ort") is None
        True
    """
    try:
        cls = get_backend(name)
    except ConfigError as exc:
        return None if name not in BUILTIN_BACKENDS else exc.message
    return cls.missing_requirement()
