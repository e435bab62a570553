"""Searches run one after another in one process on one Ray (a notebook, a service) leave no
actor of theirs alive, and no start barrier's key: everything a search starts ends with it,
whether it finished or was interrupted. What is deliberately kept warm between searches (the
cluster's named store of float references) is one named actor, bounded, and said in the log."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import ray
from ray._private.state import actors
from ray.experimental.internal_kv import _internal_kv_list
from ray.util import placement_group_table

from raysearch.search import AutoSearch
from raysearch.search.runtime._start_barrier import KV_NAMESPACE
from raysearch.search.runtime._warm import STORE_NAME
from tests.conftest import TWO_AT_A_TIME

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]


def _held() -> dict[str, str]:
    """Ray's own tables of the cluster: id -> class name of each actor alive, and the
    placement groups not removed (Tune's trials run in them); and the keys of start barriers
    in the cluster's key-value store."""
    held = {i: info["ActorClassName"] for i, info in actors(actor_state_name="ALIVE").items()}
    for pg_id, pg in placement_group_table().items():
        if pg["state"] != "REMOVED":
            held[pg_id] = "placement group"
    for key in _internal_kv_list("start-barrier/", namespace=KV_NAMESPACE):
        held[key.decode()] = "start barrier key"
    return held


def _left_behind(before: dict[str, str], *, within_s: float = 30.0) -> dict[str, str]:
    """The actors alive now that were not before (the cluster's named store aside) and the
    placement groups not removed, once those that are ending have ended (a killed actor is
    marked dead asynchronously)."""
    deadline = time.monotonic() + within_s
    while True:
        new = {
            held_id: name
            for held_id, name in _held().items()
            if held_id not in before
            and (
                name in ("placement group", "start barrier key")
                or actors(held_id)["Name"] != STORE_NAME
            )
        }
        if not new or time.monotonic() > deadline:
            return new
        time.sleep(0.2)


def _config(make_config, out: Path) -> dict[str, Any]:
    # Two trials at once: the first wave has a start barrier.
    return make_config(
        search_space={"calibrate_method": ["MinMax", "Percentile"], "per_channel": [True, False]},
        resources=TWO_AT_A_TIME,
        measure_latency=False,
        output_dir=str(out),
    )


def _interrupt_after(out: Path, records: int) -> threading.Thread:
    """SIGUSR1 to this process (Ray Tune's graceful stop, as Ctrl-C) once ``records`` trials
    are journaled."""

    def watch() -> None:
        journal = out / "journal.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if journal.exists() and len(journal.read_text().splitlines()) >= records:
                break
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGUSR1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_searches_in_one_process_leave_no_actor_alive(make_config, tmp_path):
    ray.get(ray.put(0))  # Ray is up
    before = _held()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGUSR1)}
    for run in range(2):
        out = tmp_path / f"out{run}"
        result = AutoSearch(_config(make_config, out)).run()
        assert len(result.records) == 4
        assert _left_behind(before) == {}, f"after search {run + 1}"
        # Ray Tune's own Ctrl-C handlers end with its run: a later Ctrl-C reaches the process.
        assert {s: signal.getsignal(s) for s in handlers} == handlers, f"after search {run + 1}"
    log = (tmp_path / "out0" / "auto_search.log").read_text()

    out = tmp_path / "interrupted"
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        watcher = _interrupt_after(out, 1)
        interrupted = AutoSearch(_config(make_config, out)).run()
        watcher.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert interrupted.summary["stop_reason"] == "interrupted"
    assert _left_behind(before) == {}, json.dumps(interrupted.summary)
    # What is kept between searches: one named actor, bounded, said in the log, whether this
    # search kept the float reference or found it kept by an earlier search of the session.
    where = "in the actor raysearch-kept-warm, namespace raysearch, at most 1024 MB: "
    assert (
        f"kept on the cluster for later searches: reference ({where}RAYSEARCH_WARM_MAX_MB)" in log
        or f"reused from the cluster (kept by an earlier search, {where}RAYSEARCH_WARM" in log
    ), log
