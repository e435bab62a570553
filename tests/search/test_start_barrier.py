"""The start barrier of the first wave of actors, on a real local Ray: the actors of a wave
go together, and a searcher that waits for results before a second trial opens it for the
one actor Tune started."""

from __future__ import annotations

import pytest
import ray

from raysearch.search.trainable import start_barrier

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_one_actor_needs_no_barrier():
    assert start_barrier(1) is None


def test_the_wave_goes_when_all_have_arrived_or_the_barrier_is_opened():
    barrier = start_barrier(2)
    assert ray.get(barrier.arrive.remote()) is False
    assert ray.get(barrier.ready.remote()) is False
    assert ray.get(barrier.arrive.remote()) is True

    alone = start_barrier(2)
    assert ray.get(alone.arrive.remote()) is False
    ray.get(alone.open.remote())
    assert ray.get(alone.ready.remote()) is True
    assert ray.get(alone.arrive.remote()) is True  # one starting later does not wait either
