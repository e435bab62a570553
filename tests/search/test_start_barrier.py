"""The start barrier of the first wave of actors, on a real local Ray: the actors of a wave
go together, and a searcher that waits for results before a second trial opens it for the
one actor Tune started."""

from __future__ import annotations

import pytest
import ray
from ray.experimental.internal_kv import _internal_kv_list

from raysearch.search.runtime._start_barrier import (
    KV_NAMESPACE,
    StartBarrier,
    end_barrier,
    start_barrier,
    wait_for_wave,
)

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_one_actor_needs_no_barrier():
    assert start_barrier(1) is None


def test_the_wave_goes_when_all_have_arrived_or_the_barrier_is_opened():
    barrier = start_barrier(2)
    assert barrier.arrive() is False
    assert barrier.ready() is False
    assert barrier.arrive() is True

    alone = start_barrier(2)
    assert alone.arrive() is False
    alone.open()
    assert alone.ready() is True
    assert alone.arrive() is True  # one starting later does not wait either
    assert barrier.ready() is True and start_barrier(2).ready() is False  # each its own keys


def test_actors_arriving_at_once_are_each_counted():
    """Each actor writes a key of its own: arrivals at the same moment, from actor processes
    as a wave's are, are not lost (a shared counter without a transaction would lose them)."""
    barrier = start_barrier(4)

    @ray.remote(num_cpus=0)
    def arrive(barrier: StartBarrier) -> bool:
        return barrier.arrive()

    went = ray.get([arrive.remote(barrier) for _ in range(3)])
    assert went == [False, False, False] and barrier.ready() is False
    assert barrier.arrive() is True


def test_waiting_at_the_barrier_says_whether_the_wave_went_or_the_wait_timed_out():
    alone = start_barrier(2)
    assert wait_for_wave(alone, timeout_s=0.5) is False  # nobody came, nobody opened it
    opened = start_barrier(2)
    opened.open()
    assert wait_for_wave(opened, timeout_s=0.5) is True
    full = start_barrier(2)
    full.arrive()
    assert wait_for_wave(full, timeout_s=0.5) is True


def test_an_ended_barrier_leaves_no_key_in_the_cluster():
    barrier = start_barrier(2)
    barrier.arrive()
    barrier.open()
    assert _internal_kv_list(barrier.prefix, namespace=KV_NAMESPACE)
    end_barrier(barrier)
    assert _internal_kv_list(barrier.prefix, namespace=KV_NAMESPACE) == []
    end_barrier(None)  # no barrier (one actor): nothing to end


@ray.remote(num_cpus=0.5)
class _OtherJob:
    """Holds half the session's one CPU, as another job on a shared cluster does."""

    def ping(self) -> bool:
        return True


def test_the_first_wave_is_what_the_cluster_can_place_now(make_config):
    """With half the cluster's CPU held elsewhere and two trials of half a CPU each asked for,
    the search's first actor does not wait at the barrier for a second one that has no room
    (it waited the whole timeout before)."""
    from raysearch.search import AutoSearch

    other = _OtherJob.remote()
    try:
        ray.get(other.ping.remote())
        config = make_config(
            search_space={"calibrate_method": ["MinMax"], "per_channel": [True, False]},
            resources={"max_concurrent_trials": 2, "cpu_per_trial": 0.5},
            measure_latency=False,
        )
        result = AutoSearch(config).run()
    finally:
        ray.kill(other)
    records = sorted(result.records, key=lambda r: r.number)
    assert [r.status for r in records] == ["ok", "ok"]
    assert records[0].actor_wait_timed_out is False
