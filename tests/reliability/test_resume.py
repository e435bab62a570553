"""A search whose driver is killed (SIGKILL) or interrupted (Ctrl-C) mid-way resumes to exactly
what an uninterrupted search reports: every trial once, no finished trial run again, the stop
conditions' counts and time carried over. ``raysearch run`` runs as a real process here.
(These replace and extend the kill-and-resume test that lived in tests/search.)"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from raysearch.cli import main
from raysearch.outputs import best_records
from raysearch.search import AutoSearch
from raysearch.trialrecord import TrialRecord
from tests.reliability.helpers import (
    calls,
    journal,
    kill_group,
    probe_config,
    run_raysearch,
    start_raysearch,
    stop_leftovers,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

#: Of the grid's 24 settings: the stop condition, not the grid, ends the search. The kill comes
#: once 6 trials are journaled (4 for Ctrl-C): the 8 left give a poller that lags on a loaded
#: machine more than a second before the search could finish them all.
LIMIT = 14
COMPARED = ("stop_reason", "n_trials", "n_failed", "n_candidates", "best_metric", "best_params")


def _config(folder: Path) -> dict[str, Any]:
    return probe_config(folder, stop={"iteration_limit": LIMIT}, plan={"sleep_s": 0.15})


@pytest.fixture(scope="module")
def uninterrupted(ray_cluster, tmp_path_factory) -> tuple[dict[str, Any], dict[str, float]]:
    """The summary of the same search run straight through, and the settings it ran (their
    keys) with each one's metric."""
    folder = tmp_path_factory.mktemp("straight")
    summary = AutoSearch(_config(folder)).run().summary
    return summary, {r["key"]: r["metric"] for r in journal(folder / "out")}


def _tune_started(out: Path) -> bool:
    """Tune's experiment of the first session has saved its state (its trials start now)."""
    return any((out / "ray_results").glob("search/experiment_state-*.json"))


def _run_killed(folder: Path, at: int, sig: int, **env: str):
    """Run the search as a command and send ``sig`` once ``at`` trials are journaled; with
    ``at`` 0, once Tune's experiment has saved its state, before a trial is journaled."""
    config = write_config(folder / "config.yaml", _config(folder))
    out = folder / "out"
    proc = start_raysearch(["run", str(config)], folder, **env)
    try:
        wait_until(proc, lambda: len(journal(out)) >= at if at else _tune_started(out))
        kill_group(proc, sig)
        status = proc.wait(timeout=120)
    finally:
        stop_leftovers(proc)
    return status


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Callable[[int], Path]:
    """``killed(at)``: the folder of a search killed (SIGKILL) once ``at`` trials were
    journaled (0: before the first, :func:`_run_killed`), Tune saving its experiment at every
    step, put back as the kill left it, in the place where it ran. Each search runs and is
    killed once for the module; every call puts a fresh copy of what the kill left in place."""
    saved: dict[int, tuple[Path, Path]] = {}

    def restore(at: int) -> Path:
        if at not in saved:
            base = tmp_path_factory.mktemp(f"killed_at_{at}")
            folder, kept = base / "run", base / "as_killed"
            folder.mkdir()
            _run_killed(folder, at, signal.SIGKILL, TUNE_GLOBAL_CHECKPOINT_S="0")
            shutil.copytree(folder, kept, symlinks=True)
            saved[at] = (folder, kept)
        folder, kept = saved[at]
        shutil.rmtree(folder)
        shutil.copytree(kept, folder, symlinks=True)
        return folder

    return restore


def _check_resumed(
    folder: Path,
    before: list[dict[str, Any]],
    summary: dict[str, Any],
    uninterrupted: tuple[dict[str, Any], dict[str, float]],
) -> None:
    out = folder / "out"
    straight, settings = uninterrupted
    assert {k: summary[k] for k in COMPARED} == {k: straight[k] for k in COMPARED}
    rows = pq.read_table(out / "results.parquet").to_pylist()
    ids = [r["trial_id"] for r in rows]
    assert len(ids) == len(set(ids)) == LIMIT
    after = journal(out)
    assert len({r["key"] for r in after}) == len(after) == LIMIT  # no setting twice
    # The settings of the search run straight through with the same seed, each scored alike.
    assert {r["key"]: r["metric"] for r in after} == settings
    # The journal of the first session is kept as it was, the second one's follows it.
    assert [r["trial_id"] for r in after[: len(before)]] == [r["trial_id"] for r in before]
    assert {r["trial_id"] for r in before} <= set(ids)
    # No trial finished before the interruption ran again (one evaluation each).
    evaluations = Counter(c["trial"] for c in calls(folder / "calls.jsonl"))
    assert all(evaluations[r["trial_id"]] == 1 for r in before), evaluations
    assert set(evaluations) - {"float"} >= set(ids)
    # candidates/ holds the models of the best candidates of both sessions (keep_candidates,
    # 3 by default): the resume neither brought back one the first session removed nor lost
    # one of them.
    candidates = [TrialRecord.from_dict(r) for r in after if r["is_candidate"]]
    top = best_records(candidates, 3, higher_is_better=True)
    kept = {r["trial_id"] for r in rows if (r["model_file"] or "").startswith("candidates/")}
    assert kept == {r.trial_id for r in top}
    assert {p.stem for p in (out / "candidates").glob("*.onnx")} == kept
    # The stop condition counted the trials of both sessions, and the time of both (the
    # first one's up to its last journaled trial).
    log = (out / "auto_search.log").read_text()
    assert re.search(rf"stop condition met: iteration_limit \({LIMIT} trials finished", log)
    assert summary["sessions"] == 2
    assert summary["wall_time_s"] >= max((r["elapsed_s"] for r in before), default=0)
    # The second session ran in a Tune experiment of its own.
    assert (out / "ray_results" / "search-2").is_dir()


def _resume_moved(folder: Path) -> dict[str, Any]:
    """Resume the search of ``folder`` from ``folder/elsewhere``, its output folder moved there
    (the model, data and evaluator log stay), then put back; the resume's summary."""
    out, moved = folder / "out", folder / "elsewhere"
    shutil.move(out, moved)
    try:
        return AutoSearch.resume(moved).summary
    finally:
        shutil.move(moved, out)


@pytest.mark.parametrize("case", ["before_first", "early", "twice_moved"])
def test_a_killed_driver_resumes_to_the_uninterrupted_result(
    tmp_path: Path,
    killed: Callable[[int], Path],
    uninterrupted: tuple[dict[str, Any], dict[str, float]],
    case: str,
):
    # "before_first": killed once Tune's experiment had saved its state, with no trial
    # journaled (the first trials running), resumed where it ran;
    # "early": killed once 2 trials were journaled (the next ones running), resumed where it ran;
    # "twice_moved": killed once 6 were, the folder moved before the resume (the live session
    # is found by the search's id, which moves with the folder); then the folder put back as
    # the kill left it, moved to the same place and resumed again in the same process (the
    # same Ray session, the same path), which must not find the first resume's Tune
    # experiment and end at once.
    at = {"before_first": 0, "early": 2}.get(case, 6)
    folder = killed(at)
    out = folder / "out"
    before = journal(out)
    assert at <= len(before) < LIMIT
    if case == "before_first":
        assert before == [] and _tune_started(out)
    assert not (out / "summary.json").exists()
    if case == "twice_moved":
        _check_resumed(folder, before, _resume_moved(folder), uninterrupted)
        folder = killed(6)
        _check_resumed(folder, before, _resume_moved(folder), uninterrupted)
    else:
        _check_resumed(folder, before, AutoSearch.resume(out).summary, uninterrupted)


def test_ctrl_c_stops_gracefully_writes_outputs_and_resumes(
    tmp_path: Path, uninterrupted: tuple[dict[str, Any], dict[str, float]], capsys
):
    status = _run_killed(tmp_path, 4, signal.SIGINT)
    out = tmp_path / "out"
    assert status == 130, (tmp_path / "stderr.txt").read_text()
    stdout = (tmp_path / "stdout.txt").read_text()
    assert "Search finished (interrupted)" in stdout
    assert "raysearch resume" in (tmp_path / "stderr.txt").read_text()
    # Complete outputs for what finished.
    before = journal(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted"
    assert summary["n_trials"] == len(before) < LIMIT
    assert pq.read_table(out / "results.parquet").num_rows == len(before)
    assert all(r["status"] == "ok" for r in before)  # nothing in flight was blamed
    assert json.loads((out / ".raysearch.json").read_text())["status"] == "interrupted"

    assert main(["resume", str(out)]) == 0
    resumed = json.loads((out / "summary.json").read_text())
    _check_resumed(tmp_path, before, resumed, uninterrupted)
    capsys.readouterr()


@pytest.fixture(scope="module")
def finished_search(ray_cluster, tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    """A search run to its end, once for the module: its folder (model, data, evaluator log
    and output folder) and its summary. Tests work on copies of the folder."""
    folder = tmp_path_factory.mktemp("finished")
    config = probe_config(folder, search_space={"per_channel": [True, False]})
    return folder, AutoSearch(config).run().summary


def _killed_after_last_trial(
    finished_search: tuple[Path, dict[str, Any]], folder: Path
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A copy in ``folder`` of the finished search, put back to what its folder held between
    Tune's end and the outputs (the driver killed there): the journal and Tune's state, the
    marker still "running", no summary or results table. Its summary and journal. (A resume
    works on the folder it is given, wherever the search ran.)"""
    template, finished = finished_search
    shutil.copytree(template, folder, dirs_exist_ok=True)
    out = folder / "out"
    for name in ("summary.json", "results.parquet"):
        (out / name).unlink()
    marker = json.loads((out / ".raysearch.json").read_text())
    (out / ".raysearch.json").write_text(json.dumps({**marker, "status": "running"}))
    return finished, journal(out)


def test_a_driver_killed_after_its_last_trial_resumes_to_finished(
    tmp_path: Path, finished_search: tuple[Path, dict[str, Any]]
):
    """The driver killed after its last trial was journaled, before the outputs (a batch's
    Ray lost under a search that was finishing): the resume has no trial left to run, and
    writes the finished search's outputs, not "interrupted"."""
    out = tmp_path / "out"
    finished, before = _killed_after_last_trial(finished_search, tmp_path)
    assert main(["resume", str(out)]) == 0
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["stop_reason"] == finished["stop_reason"] == "space_exhausted"
    assert {k: resumed[k] for k in COMPARED} == {k: finished[k] for k in COMPARED}
    assert journal(out) == before  # nothing ran again
    assert json.loads((out / ".raysearch.json").read_text())["status"] == "finished"


def test_a_resume_on_a_cluster_that_is_gone_is_refused_in_seconds(
    tmp_path: Path, finished_search: tuple[Path, dict[str, Any]]
):
    """The search's saved address names a cluster that is gone: one line naming the address
    and exit status 2, in seconds (Ray itself retries for about 14 minutes), the folder kept
    as it was."""
    out = tmp_path / "out"
    _, before = _killed_after_last_trial(finished_search, tmp_path)
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    saved = yaml.safe_load((out / "raysearch_config.yaml").read_text())
    (out / "raysearch_config.yaml").write_text(yaml.safe_dump({**saved, "address": dead}))
    done = run_raysearch(["resume", str(out)], tmp_path)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and f"no Ray cluster answers at {dead}" in lines[0], done.stderr
    assert journal(out) == before and not (out / "summary.json").exists()
