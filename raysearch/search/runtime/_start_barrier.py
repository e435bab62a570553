"""The start barrier of a search's first wave of trial actors: :class:`StartBarrier`.

Tune starts the actors of the trials that run in parallel one after another (about 2 s each
on a loaded machine); the first actor's first trial can end before the second actor has
started, and Tune then hands the finished actor the second trial and removes the starting one,
over and over. The actors of the first wave therefore wait at the barrier
(:func:`wait_for_wave`, in ``QuantTrainable.setup``) until all of them are there, or until the
search says no more are coming at first (``StartBarrier.open``): a strategy that proposes
one trial and waits for its result (Conservative, Fallback's first trial) starts one actor,
which would otherwise wait out the timeout for a second one that Tune never starts. The wave
is only as large as the cluster's free resources hold when the search starts (another job on
a shared cluster, or nodes its autoscaler has yet to add, would otherwise hold the first actor
for the whole timeout).

Example:
    >>> barrier = start_barrier(2)                                            # doctest: +SKIP
    >>> ray.get(barrier.arrive.remote()), ray.get(barrier.arrive.remote())    # doctest: +SKIP
    (False, True)
    >>> end_barrier(barrier)            # when the search ends, however it ends  # doctest: +SKIP
"""

from __future__ import annotations

import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raysearch.search.runtime.transfer import current_node_id

__all__ = [
    "START_BARRIER_TIMEOUT_S",
    "StartBarrier",
    "end_barrier",
    "start_barrier",
    "wait_for_wave",
]


@ray.remote(num_cpus=0)
class StartBarrier:
    """Counts the actors of the first wave as they start; the wave goes when all ``wave``
    of them are there, or once :meth:`open` says no more are coming at first."""

    def __init__(self, wave: int) -> None:
        self.wave = wave
        self.count = 0

    def arrive(self) -> bool:
        """An actor has started; whether the wave may go."""
        self.count += 1
        return self.ready()

    def ready(self) -> bool:
        return self.count >= self.wave

    def open(self) -> None:
        """No more actors start before the first trials' results: let those there go."""
        self.wave = 0


def start_barrier(wave: int) -> Any:
    """The :class:`StartBarrier` of a first wave of ``wave`` actors; None for one."""
    if wave <= 1:
        return None
    # On the driver's node, which lives as long as the search: a barrier lost with another
    # node would fail the setup of every actor started after it.
    here = NodeAffinitySchedulingStrategy(current_node_id(), soft=False)
    return StartBarrier.options(scheduling_strategy=here).remote(wave)


def end_barrier(barrier: Any) -> None:
    """End ``barrier`` with the search that started it (None: nothing to end).

    Its handle travels pickled inside the search's trainable, which Ray Tune registers in the
    cluster: the barrier would otherwise outlive the search, one actor per search, in a process
    that runs search after search on one Ray."""
    if barrier is not None and ray.is_initialized():
        ray.kill(barrier, no_restart=True)


#: How long the first actors wait at most for the rest of their wave.
START_BARRIER_TIMEOUT_S = 30.0


def wait_for_wave(barrier: Any, timeout_s: float = START_BARRIER_TIMEOUT_S) -> bool:
    """Arrive at ``barrier`` and wait (at most ``timeout_s``) until the wave may go.

    Returns:
        Whether the wave went (all arrived, or the search opened it); False: timed out.
    """
    ready = ray.get(barrier.arrive.remote())
    deadline = time.monotonic() + timeout_s
    while not ready and time.monotonic() < deadline:
        time.sleep(0.02)
        ready = ray.get(barrier.ready.remote())
    return bool(ready)
