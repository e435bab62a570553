"""A search logging to MLflow, killed (SIGKILL) mid-way and resumed, logs each finished trial
once: Tune's restored experiment runs the trials journaled after its last save again only to
replay their records, and those reach no logger."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

from raysearch.search import AutoSearch
from tests.reliability.helpers import (
    journal,
    kill_group,
    probe_config,
    start_raysearch,
    stop_leftovers,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

LIMIT = 12


def test_a_killed_search_resumed_logs_each_finished_trial_once(tmp_path: Path, monkeypatch):
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    # MLflow 3 keeps its local file store behind this switch (a database is its default).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    config = probe_config(
        tmp_path,
        stop={"iteration_limit": LIMIT},
        plan={"sleep_s": 0.15},
        loggers={"mlflow": {"tracking_uri": uri, "experiment_name": "killed"}},
    )
    path = write_config(tmp_path / "config.yaml", config)
    out = tmp_path / "out"
    # Tune saves its experiment once near the start (every 60 s): the restored experiment
    # runs most of the journaled trials again, to replay them.
    proc = start_raysearch(["run", str(path)], tmp_path, MLFLOW_ALLOW_FILE_STORE="true")
    try:
        wait_until(proc, lambda: len(journal(out)) >= 5)
        kill_group(proc, signal.SIGKILL)
        proc.wait(timeout=120)
    finally:
        stop_leftovers(proc)
    before = journal(out)
    assert 5 <= len(before) < LIMIT

    result = AutoSearch.resume(out)
    ids = [r["trial_id"] for r in result.records]
    assert len(ids) == len(set(ids)) == LIMIT
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("killed").experiment_id
    runs = client.search_runs([experiment], run_view_type=ViewType.ALL, max_results=1000)

    def trial_of(run) -> str:
        return next(i for i in ids if run.data.tags["trial_name"].endswith(i))

    every = Counter(trial_of(r) for r in runs)
    finished = Counter(trial_of(r) for r in runs if r.info.status == "FINISHED")
    first = {r["trial_id"] for r in before}
    # The first session's trials were logged once, and not again by the resumed session (a
    # trial the kill caught between its journal line and the end of its run keeps that run
    # unfinished).
    assert all(every[i] == 1 for i in first), every
    # The resumed session's trials each have one finished run; a trial the kill cut short
    # before it was journaled left an unfinished run, and its rerun is a run of its own.
    assert all(finished[i] == 1 for i in ids if i not in first), finished
    assert all(every[i] <= 2 for i in ids)
