"""A search's own Ray runs neither the log monitor nor the autoscaler's monitor (no search uses
them, each takes CPU while it runs, and ``ray.shutdown`` would wait on the monitor's SIGTERM
handler after stopping the GCS); ``shutdown_ray`` leaves nothing of that Ray running, and the
process no longer takes the Ray it is on for the one a search started."""

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
        only_driver_node, shutdown_ray, start_ray, started_locally)

    assert start_ray(None)
    children = psutil.Process().children(recursive=True)
    seen = {"scripts": sorted({os.path.basename(part) for p in children
                               for part in p.cmdline() if part.endswith(".py")})}
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
        "ray_initialized": ray_initialized,
        "left": [p.pid for p in alive],
        **seen,
    }))
    """
)


def test_a_searchs_own_ray_runs_no_monitor_and_leaves_nothing_behind(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads(done.stdout.strip().splitlines()[-1])
    # Ray's Python processes are seen (its dashboard's), the two monitors are not
    assert "dashboard.py" in state["scripts"], state
    assert not {"log_monitor.py", "monitor.py"} & set(state["scripts"]), state
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
