"""``shutdown_ray``: a local Ray's autoscaler monitor is killed before Ray's own shutdown
(which would otherwise stop the GCS first and then wait on the monitor's SIGTERM handler),
nothing of that Ray is left running afterwards, and the process no longer takes the Ray it
is on for the one a search started."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = textwrap.dedent(
    """
    import json, os

    import psutil
    import ray

    from raysearch.search.runtime.cluster import (
        _MONITOR_SCRIPT, only_driver_node, shutdown_ray, start_ray, started_locally)

    assert start_ray(None)
    children = psutil.Process().children(recursive=True)
    monitors = [p for p in children if any(a.endswith(_MONITOR_SCRIPT) for a in p.cmdline())]
    seen = {}
    original = ray.shutdown

    def watched_shutdown(*args, **kwargs):
        seen["monitor_alive_when_ray_shuts_down"] = any(p.is_running() and
            p.status() != psutil.STATUS_ZOMBIE for p in monitors)
        return original(*args, **kwargs)

    ray.shutdown = watched_shutdown
    shutdown_ray()
    gone, alive = psutil.wait_procs(children, timeout=10)
    seen["started_locally_after_shutdown"] = started_locally()
    ray_initialized = ray.is_initialized()
    # Another Ray started after it in the process (as the tests' session Ray is) is no Ray
    # of a search's own: a search on it keeps its float reference on it.
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
    seen["started_locally_on_another_ray"] = started_locally()
    seen["only_driver_node_on_another_ray"] = only_driver_node()
    ray.shutdown()
    print(json.dumps({
        "monitors": len(monitors),
        "ray_initialized": ray_initialized,
        "left": [p.pid for p in alive],
        **seen,
    }))
    """
)


def test_a_local_ray_loses_its_monitor_first_and_leaves_nothing_behind(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads(done.stdout.strip().splitlines()[-1])
    assert state["monitors"] == 1, state
    assert state["monitor_alive_when_ray_shuts_down"] is False, state
    assert state["ray_initialized"] is False, state
    assert state["left"] == [], state
    # Forgotten once shut down: a search in this process on a Ray started after it (whose
    # GCS may even take the freed port) does not take that Ray for one it started.
    assert state["started_locally_after_shutdown"] is False, state
    assert state["started_locally_on_another_ray"] is False, state
    assert state["only_driver_node_on_another_ray"] is False, state


@pytest.mark.usefixtures("ray_cluster")
def test_a_ray_the_search_did_not_start_outlives_its_trials(monkeypatch):
    # The session's Ray stands for a cluster joined or a Ray started before the search: even
    # in a process that ends with its search, its trials' end shuts nothing down.
    import ray

    from raysearch.search.runtime import cluster

    monkeypatch.setattr(cluster, "_ends_with_process", True)
    cluster.trials_ended()
    assert cluster._ending is None
    assert ray.is_initialized() and ray.get(ray.put(1)) == 1
