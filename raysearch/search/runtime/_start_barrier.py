"""The start barrier of a search's first wave of trial actors: :class:`StartBarrier`.

Without it, the first actor's first trial can end before the second actor started, and Tune
hands the finished actor the second trial and removes the starting one, over and over. So
the first wave's actors wait (:func:`wait_for_wave`) until all are there, or the search opens
it (:meth:`StartBarrier.open`). Each arriving actor writes a key of its own under the
barrier's prefix in the cluster's key-value store, so no update is lost.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

__all__ = ["StartBarrier", "end_barrier", "start_barrier", "wait_for_wave"]

#: The key-value namespace of every search's barrier keys.
KV_NAMESPACE = "raysearch"


@dataclass(frozen=True)
class StartBarrier:
    """The first wave of ``wave`` actors, counted under ``prefix`` in the cluster's key-value
    store (picklable: it travels inside the trainable)."""

    wave: int
    prefix: str = field(default_factory=lambda: f"start-barrier/{uuid.uuid4().hex}/")

    def arrive(self) -> bool:
        """An actor has started; whether the wave may go."""
        _kv_put(f"{self.prefix}arrived/{uuid.uuid4().hex}")
        return self.ready()

    def ready(self) -> bool:
        from ray.experimental.internal_kv import _internal_kv_list

        keys = _internal_kv_list(self.prefix, namespace=KV_NAMESPACE)
        opened = f"{self.prefix}open".encode()
        return opened in keys or len(keys) >= self.wave

    def open(self) -> None:
        """No more actors start before the first trials' results: let those there go."""
        _kv_put(f"{self.prefix}open")

    def end(self) -> None:
        """Delete the barrier's keys (the search has ended)."""
        from ray.experimental.internal_kv import _internal_kv_del

        _internal_kv_del(self.prefix, del_by_prefix=True, namespace=KV_NAMESPACE)


def _kv_put(key: str) -> None:
    from ray.experimental.internal_kv import _internal_kv_put

    _internal_kv_put(key, b"", namespace=KV_NAMESPACE)


def start_barrier(wave: int) -> StartBarrier | None:
    """The :class:`StartBarrier` of a first wave of ``wave`` actors; None for one."""
    return StartBarrier(wave) if wave > 1 else None


def end_barrier(barrier: StartBarrier | None) -> None:
    """End ``barrier`` (None: nothing to end), so that its keys do not outlive the search."""
    import ray

    if barrier is not None and ray.is_initialized():
        barrier.end()


#: How long the first actors wait at most for the rest of their wave.
START_BARRIER_TIMEOUT_S = 30.0


def wait_for_wave(barrier: StartBarrier, timeout_s: float = START_BARRIER_TIMEOUT_S) -> bool:
    """Arrive at ``barrier`` and wait (at most ``timeout_s``) until the wave may go.

    Returns:
        Whether the wave went (all arrived, or the search opened it); False: timed out.
    """
    ready = barrier.arrive()
    deadline = time.monotonic() + timeout_s
    while not ready and time.monotonic() < deadline:
        time.sleep(0.02)
        ready = barrier.ready()
    return bool(ready)
