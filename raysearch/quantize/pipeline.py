"""How a trial applies the techniques its settings switch on: :meth:`TechniquePipeline.plan`
finds them and strips their settings; float transforms run once per process and chain of
effect keys (an LRU of :data:`_KEEP`), overrides merge into the settings, quantized
transforms run on the file. With none active the quantizer's input is unchanged.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysearch.quantize.technique import (
    FloatModelTransform,
    QuantizedModelTransform,
    Technique,
    TechniqueContext,
    TensorOverrideProducer,
    TensorOverrides,
    registered_techniques,
)
from raysearch.quantize.tempdirs import make_workdir

if TYPE_CHECKING:
    from raysearch.data import DataSource
    from raysearch.space.catalogue import Catalogue

__all__ = [
    "Plan",
    "TechniquePipeline",
    "merge_overrides",
    "strip_technique_settings",
    "unknown_settings",
]

_logger = logging.getLogger("raysearch.quantize.technique")

#: Transformed float models kept per process (each also keeps a backend and its cache entries).
_KEEP = 4


@dataclass
class Plan:
    """One trial's active techniques by kind, with effect keys, and the backend's settings."""

    backend_settings: Mapping[str, Any]
    float_steps: list[tuple[FloatModelTransform, str]] = field(default_factory=list)
    override_steps: list[tuple[TensorOverrideProducer, str]] = field(default_factory=list)
    quantized_steps: list[tuple[QuantizedModelTransform, str]] = field(default_factory=list)
    settings: Mapping[str, Any] = field(default_factory=dict)
    #: What the override producers reported, merged (:meth:`TechniquePipeline.backend_settings`).
    report: dict[str, float] = field(default_factory=dict)
    #: Rows of the sensitivity rankings the producers used.
    rankings: list[dict[str, Any]] = field(default_factory=list)

    @property
    def active(self) -> list[str]:
        """``name=key`` of every active technique, in the order they apply."""
        steps = [*self.float_steps, *self.override_steps, *self.quantized_steps]
        return [f"{technique.name}={key}" for technique, key in steps]


def strip_technique_settings(
    settings: Mapping[str, Any], techniques: Sequence[type[Technique]]
) -> Mapping[str, Any]:
    """``settings`` without any technique's keys (the same object when it has none).

    Example:
        >>> strip_technique_settings({"per_channel": True}, [])
        {'per_channel': True}
    """

    def owned(container: str, key: str) -> bool:
        return any(t.owns(container, key) for t in techniques)

    stripped: dict[str, Any] = {}
    changed = False
    for key, value in settings.items():
        if owned("", key):
            changed = True
            continue
        if isinstance(value, Mapping) and any(owned(key, inner) for inner in value):
            value = {k: v for k, v in value.items() if not owned(key, k)}
            changed = True
        stripped[key] = value
    return stripped if changed else settings


def unknown_settings(settings: Mapping[str, Any], catalogue: Catalogue | None) -> list[str]:
    """The keys of ``settings`` that ``catalogue`` does not know, as dotted paths.

    Example:
        >>> from raysearch.space.catalogue import QUANTIZER, Catalogue
        >>> toy = Catalogue("toy", {"quantizer": QUANTIZER})
        >>> unknown_settings({"quantizer": "toy", "bits": 4}, toy)
        ['bits']
    """
    if catalogue is None:
        return []
    unknown = []
    for key, value in settings.items():
        name = catalogue.canonical("", key)
        if catalogue.spec("", name) is None:
            unknown.append(key)
        elif catalogue.is_container(name) and isinstance(value, Mapping):
            unknown += [
                f"{key}.{inner}"
                for inner in value
                if catalogue.spec(name, catalogue.canonical(name, inner)) is None
            ]
    return unknown


def merge_overrides(settings: Mapping[str, Any], overrides: TensorOverrides) -> dict[str, Any]:
    """``settings`` with ``overrides`` merged into ``TensorQuantOverrides``, ``nodes_to_exclude``.

    Example:
        >>> merge_overrides({"nodes_to_exclude": ["a"]}, TensorOverrides(nodes_to_exclude=["b"]))
        {'nodes_to_exclude': ['a', 'b']}
    """
    merged = dict(settings)
    if overrides.tensor_quant_overrides:
        extra = dict(merged.get("extra_options") or {})
        tensors = dict(extra.get("TensorQuantOverrides") or {})
        tensors.update(overrides.tensor_quant_overrides)
        extra["TensorQuantOverrides"] = tensors
        merged["extra_options"] = extra
    if overrides.nodes_to_exclude:
        excluded = list(merged.get("nodes_to_exclude") or [])
        excluded += [n for n in overrides.nodes_to_exclude if n not in excluded]
        merged["nodes_to_exclude"] = excluded
    return merged


class TechniquePipeline:
    """Applies techniques for one process's trials on the float model at ``model_path``."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        calibration: DataSource,
        *,
        providers: Sequence[Any] | None = None,
        threads: int = 1,
    ) -> None:
        self.model_path = os.fspath(model_path)
        self.calibration = calibration
        self.providers = list(providers) if providers else None
        self.threads = threads
        #: Lent to every technique before it runs (the trial sets it).
        self.context: TechniqueContext | None = None
        self._instances: dict[str, Technique] = {}
        self._models: OrderedDict[tuple[tuple[str, str], ...], str] = OrderedDict()
        self._workdir: str | None = None
        self._cleanup: weakref.finalize | None = None

    def plan(self, settings: Mapping[str, Any]) -> Plan:
        """The techniques ``settings`` switch on, and the settings the backend gets."""
        classes = sorted(registered_techniques(), key=lambda c: (c.order, c.name))
        plan = Plan(strip_technique_settings(settings, classes), settings=settings)
        for cls in classes:
            technique = self._instance(cls)
            key = technique.effect_key(settings)
            if key is None:
                continue
            if isinstance(technique, FloatModelTransform):
                plan.float_steps.append((technique, key))
            elif isinstance(technique, TensorOverrideProducer):
                plan.override_steps.append((technique, key))
            elif isinstance(technique, QuantizedModelTransform):
                plan.quantized_steps.append((technique, key))
        if plan.active:
            _logger.debug("techniques: %s", ", ".join(plan.active))
        return plan

    def float_model(self, plan: Plan) -> tuple[str, float]:
        """The float model the backend quantizes for ``plan`` (the original without a float
        transform) and the seconds spent transforming it now."""
        if not plan.float_steps:
            return self.model_path, 0.0
        start = time.perf_counter()
        source, computed = self.model_path, False
        chain: tuple[tuple[str, str], ...] = ()
        for technique, key in plan.float_steps:
            chain = (*chain, (technique.name, key))
            if chain not in self._models:
                target = self._target(chain)
                step_start = time.perf_counter()
                technique.transform(source, target, plan.settings, self.calibration)
                _timed(plan, technique, step_start)
                self._remember(chain, target)
                computed = True
            else:  # computed by an earlier trial of this process: no time spent now
                plan.report.setdefault(f"{technique.name}_s", 0.0)
            self._models.move_to_end(chain)
            source = self._models[chain]
        return source, (time.perf_counter() - start) if computed else 0.0

    def backend_settings(self, plan: Plan, float_path: str) -> Mapping[str, Any]:
        """The settings the backend gets: technique keys removed, tensor overrides merged."""
        settings = plan.backend_settings
        for technique, _ in plan.override_steps:
            step_start = time.perf_counter()
            overrides = technique.overrides(float_path, plan.settings)
            _timed(plan, technique, step_start)
            settings = merge_overrides(settings, overrides)
            plan.report.update(overrides.report)
            plan.rankings += overrides.rankings
        return settings

    def finish(self, plan: Plan, quantized_path: str | os.PathLike, float_path: str) -> float:
        """Apply the quantized-model transforms to the file at ``quantized_path``; seconds."""
        start = time.perf_counter()
        for technique, _ in plan.quantized_steps:
            step_start = time.perf_counter()
            technique.transform(
                os.fspath(quantized_path), float_path, plan.settings, self.calibration
            )
            _timed(plan, technique, step_start)
        return time.perf_counter() - start

    def live_models(self) -> set[str]:
        """The float models backends may be built on: the original and the kept transforms."""
        return {self.model_path, *self._models.values()}

    def close(self) -> None:
        """Remove the transformed models."""
        self._models.clear()
        if self._cleanup is not None:
            self._cleanup()

    def _instance(self, cls: type[Technique]) -> Technique:
        if cls.name not in self._instances or type(self._instances[cls.name]) is not cls:
            self._instances[cls.name] = cls(providers=self.providers, threads=self.threads)
        self._instances[cls.name].context = self.context
        return self._instances[cls.name]

    def _target(self, chain: tuple[tuple[str, str], ...]) -> str:
        if self._workdir is None:
            self._workdir = str(make_workdir("raysearch-techniques"))
            self._cleanup = weakref.finalize(self, shutil.rmtree, self._workdir, True)
        digest = hashlib.sha256(repr(chain).encode()).hexdigest()[:16]
        return str(Path(self._workdir) / f"float-{digest}.onnx")

    def _remember(self, chain: tuple[tuple[str, str], ...], path: str) -> None:
        self._models[chain] = path
        while len(self._models) > _KEEP:
            _, old = self._models.popitem(last=False)
            if old not in self._models.values():
                Path(old).unlink(missing_ok=True)


def _timed(plan: Plan, technique: Technique, start: float) -> None:
    """Record in the trial's result the seconds ``technique`` took (``<name>_s``; a float
    transform reused from an earlier trial of this process records 0)."""
    key = f"{technique.name}_s"
    plan.report[key] = plan.report.get(key, 0.0) + time.perf_counter() - start
