"""A search logging to MLflow, killed (SIGKILL) mid-way and resumed, logs each finished trial
once: the resumed session's Tune experiment runs only the trials the journal does not hold."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

from raysearch.search import AutoSearch
from tests.reliability.helpers import (
    interrupt_after,
    journal,
    probe_config,
    write_config,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

LIMIT = 12


def test_a_killed_search_resumed_logs_each_finished_trial_once(tmp_path: Path):
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    # A local SQLite store, not MLflow's file store: a SIGKILL while a run writes a metric
    # leaves the file store an empty metric file, and MLflow then refuses to read any run of
    # the experiment ("Metric 'metric' is malformed"); a database write is all or nothing.
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = probe_config(
        tmp_path,
        stop={"iteration_limit": LIMIT},
        plan={"sleep_s": 0.15},
        loggers={"mlflow": {"tracking_uri": uri, "experiment_name": "killed"}},
    )
    path = write_config(tmp_path / "config.yaml", config)
    out = tmp_path / "out"
    interrupt_after(["run", str(path)], tmp_path, out, 5, signal.SIGKILL)
    before = journal(out)
    assert 5 <= len(before) < LIMIT

    result = AutoSearch.resume(out)
    ids = [r.trial_id for r in result.records]
    assert len(ids) == len(set(ids)) == LIMIT
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("killed").experiment_id
    runs = client.search_runs([experiment], run_view_type=ViewType.ALL, max_results=1000)

    def trial_of(run) -> str | None:
        trial_id = run.data.tags["trial_id"]  # each run's tag (raysearch's MLflow logger)
        return trial_id if trial_id in ids else None

    # A trial the kill cut short before it was journaled is run again under a trial id of the
    # resumed session's (when Tune's saved experiment predates it): its first run stays
    # unfinished, and belongs to no journaled trial. At most the trials running at the kill.
    orphans = [r for r in runs if trial_of(r) is None]
    assert all(r.info.status != "FINISHED" for r in orphans), orphans
    assert len(orphans) <= 2, orphans
    every = Counter(trial_of(r) for r in runs if trial_of(r) is not None)
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
