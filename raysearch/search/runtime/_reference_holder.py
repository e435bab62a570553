"""How a float reference still being computed on the driver reaches the trials:
:class:`ReferenceHolder` (a Ray actor) and :class:`HeldReference` (what a trial calls).

The search's first trials start while the driver still runs the float model over the
evaluation data (:mod:`raysearch.search._pending_reference`). When it is done, the driver puts
the reference into the object store once and hands its reference to the holder; a trial asks
the holder when it first evaluates (calibrating and quantizing do not need it) and waits there
if the driver is not done yet. A float model that fails on a later batch reaches every trial
as that one-line error. Written by hand: Ray has no promise an actor can wait on before its
value exists.

Example:
    >>> holder = reference_holder()                                     # doctest: +SKIP
    >>> source = HeldReference(holder)                                  # doctest: +SKIP
    >>> deliver(holder, pending.future)    # when the driver's run ends  # doctest: +SKIP
    >>> source().latency_ms                # in a trial                  # doctest: +SKIP
    0.84
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raysearch.errors import EvaluatorError
from raysearch.search.runtime.transfer import current_node_id

__all__ = ["HeldReference", "ReferenceHolder", "deliver", "reference_holder"]


@ray.remote(num_cpus=0)
class ReferenceHolder:
    """Holds ``("ok", [object ref])`` or ``("error", message)`` once the driver sets it;
    :meth:`get` waits until then (an async actor: every trial can wait at once)."""

    def __init__(self) -> None:
        self._value: tuple[str, Any] | None = None
        self._ready: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._ready is None:
            self._ready = asyncio.Event()
        return self._ready

    async def set(self, value: tuple[str, Any]) -> None:
        self._value = value
        self._event().set()

    async def get(self) -> tuple[str, Any]:
        await self._event().wait()
        assert self._value is not None
        return self._value


def reference_holder() -> Any:
    """A :class:`ReferenceHolder` on the driver's node (it lives as long as the search)."""
    strategy = NodeAffinitySchedulingStrategy(current_node_id(), soft=False)
    return ReferenceHolder.options(scheduling_strategy=strategy).remote()


@dataclass
class HeldReference:
    """What a trial calls for the float reference (``FloatBaseline.reference_source``)."""

    holder: Any

    def __call__(self) -> Any:
        kind, value = ray.get(self.holder.get.remote())
        if kind == "error":
            raise EvaluatorError(value)
        return ray.get(value[0])


def deliver(holder: Any, future: Future, keep: list[Any]) -> None:
    """Hand the holder what ``future`` (the driver's run of the float model) ended with; the
    object ref is appended to ``keep``, which the driver holds for the search (the object
    lives as long as a reference to it does)."""
    error = future.exception()
    if error is not None:
        holder.set.remote(("error", str(error)))
        return
    ref = ray.put(future.result())
    keep.append(ref)
    holder.set.remote(("ok", [ref]))
