"""A many-trial search on real nodes loses one worker node part-way (issue 37, item 6, at small
size): 40 trials of a Grid with evaluation on growing subsets, three ``ray start`` nodes of one
CPU (``benchmarks/scale.py`` runs four: the behaviour is the same with one node fewer, at a
node's start and a trial process less), the last worker killed once 20 trials are journaled
(:mod:`tests.scale.many_trials`, which ``benchmarks/scale.py`` runs at 1,000).

``tests/scale/test_hand_started_cluster.py`` covers what happens to the trials a lost node was
running and to the models left on it; this test covers the search around it: every trial
finished before the loss is kept as it was recorded, the search goes on on the surviving
nodes, and it ends with exactly its trial count, each trial recorded once.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.reliability.helpers import journal
from tests.scale.many_trials import run_many_trials

pytestmark = pytest.mark.slow

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "scale.py"

TRIALS = 40
KILL_AT = 20
#: Worker nodes beside the head: ``benchmarks/scale.py``'s smoke size.
WORKERS = 2
#: ASHA keeps the best fifth at a rung. With the default third, at most one of these 40
#: settings is far enough below a rung's cutoff to clear the near-tie rule (TIE_Z standard
#: errors), and only when the results reach ASHA in a favourable order: whether any trial
#: stopped was the order's doing. With a fifth, three or more stop whatever the order.
REDUCTION_FACTOR = 5


@pytest.fixture(scope="module")
def search(tmp_path_factory) -> dict[str, Any]:
    work = Path(tmp_path_factory.mktemp("many"))
    started = time.time()
    run = run_many_trials(
        work,
        TRIALS,
        KILL_AT,
        workers=WORKERS,
        timeout_s=600,
        reduction_factor=REDUCTION_FACTOR,
        lean=True,
    )
    assert run["status"] == 0, run["stderr_tail"]
    out = run["out"]
    return {
        **run,
        "started": started,
        "journal": journal(out),
        "rows": pq.read_table(out / "results.parquet").to_pylist(),
        "summary": json.loads((out / "summary.json").read_text()),
    }


def test_the_search_reaches_its_count_with_every_trial_recorded_once(search):
    ids = [r["trial_id"] for r in search["journal"]]
    assert len(ids) == len(set(ids)) == TRIALS
    rows = search["rows"]
    assert len(rows) == TRIALS and {r["trial_id"] for r in rows} == set(ids)
    assert search["summary"]["n_trials"] == TRIALS
    assert search["summary"]["stop_reason"] == "iteration_limit"


def test_early_stopping_stops_some_trials_each_still_one_record(search):
    stopped = [r for r in search["rows"] if r["stopped_at_rung"] is not None]
    assert stopped and search["summary"]["early_stopping"]["n_stopped"] == len(stopped)


def test_no_trial_finished_before_the_loss_is_lost_or_run_again(search):
    killed = search["killed"]
    assert killed is not None and killed["pids"] and killed["at_trials"] >= KILL_AT
    before = killed["journaled_ids"]
    # The journal is appended to, never rewritten: its first lines are those seen at the kill.
    assert [r["trial_id"] for r in search["journal"][: len(before)]] == before
    by_id = {r["trial_id"]: r for r in search["rows"]}
    for line in search["journal"][: len(before)]:
        row = by_id[line["trial_id"]]
        assert row["status"] == line["status"] and row["metric"] == line["metric"]


def test_the_search_goes_on_on_the_surviving_nodes(search):
    lines = search["journal"]
    kill_line = search["killed"]["at_trials"]
    nodes_before = {r["node_id"] for r in lines[:kill_line] if r.get("node_id")}
    assert len(nodes_before) == WORKERS + 1  # every node ran trials before the loss
    # Trials journaled well after the loss (the last quarter) ran on the others only.
    late = lines[TRIALS - TRIALS // 4 :]
    nodes_after = {r["node_id"] for r in late if r["status"] == "ok"}
    assert len(nodes_after) == WORKERS and nodes_after < nodes_before
    # A trial the lost node took with it is recorded as failed, naming why.
    for row in search["rows"]:
        if row["status"] != "ok":
            assert row["error"].startswith(("NodeLost", "TrialUnreachable")), row["error"]


def _scale_benchmark():
    """``benchmarks/scale.py`` as a module (it puts its own folder on ``sys.path`` for its
    ``_common``; the test process's path is put back)."""
    spec = importlib.util.spec_from_file_location("benchmark_scale", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    path = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path
    return module


def test_the_scale_benchmarks_figures_of_the_run(search):
    """``benchmarks/scale.py``'s figures of this run, which is its ``--smoke`` size (40 trials
    on three nodes, one killed at 20): its search and cluster are the ones checked above, so
    its smoke test reads them here instead of starting a cluster and a search of its own."""
    report = _scale_benchmark().report_of(search, TRIALS, KILL_AT)
    assert report["trials"] == TRIALS and report["kill_at"] == KILL_AT
    assert report["nodes"] == ["head", "worker1", "worker2"]
    assert report["status"] == 0 and report["killed"]["node"] == "worker2"
    assert report["killed"]["at_trials"] >= KILL_AT and report["killed"]["pids"]
    records = report["records"]
    # The claims, not only their keys: every trial once in the journal and results.parquet,
    # none journaled before the loss missing, the count reached.
    assert records["complete"] is True and records["not_exactly_once"] == []
    assert records["journal_lines"] == records["results_rows"] == TRIALS
    assert records["lost_after_kill"] == [] and records["summary_n_trials"] == TRIALS
    assert records["stop_reason"] == "iteration_limit"
    overhead, memory = report["overhead"], report["driver_memory"]
    for window in ("early", "late"):
        assert overhead[window]["n"] > 0 and overhead[window]["median_s"] >= 0
        assert overhead[window]["driver_cpu_s_per_trial"] > 0
    assert overhead["ratio"] is not None and isinstance(overhead["met"], bool)
    # A gap before every trial but the first on each of the three nodes (and the one or two
    # trials the lost node took with it).
    assert len(overhead["gaps"]) >= TRIALS - 6
    assert memory["range_mib"] is not None and memory["samples"] >= 2
    assert 0 < memory["rss_mib_min"] <= memory["rss_mib_max"] <= memory["peak_mib_whole_run"]
    assert json.dumps(report)  # what the benchmark writes as its JSON
