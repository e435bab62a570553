"""Outputs are never left half-written, and a search never deletes or overwrites files it did
not create: a kill at any moment leaves each output file whole (old or new), and user files
in the output folder survive ``run`` and ``run --overwrite``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pyarrow.parquet as pq
import pytest
import yaml

from raysearch.cli import main
from raysearch.outputs import write_outputs
from raysearch.search import AutoSearch
from raysearch.search.journal import Journal
from tests.reliability.helpers import probe_config, subprocess_env, write_config
from tests.reliability.output_writer import SIZES, config, records

KILL_AFTER_S = (0.05, 0.16, 0.3)


def _check_whole(out: Path) -> None:
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_trials"] in SIZES
    assert pq.read_table(out / "results.parquet").num_rows in SIZES
    best = (out / "best" / "model.onnx").read_bytes()
    sources = [(out / "models" / f"m{n}.onnx").read_bytes() for n in SIZES]
    assert best in sources  # a whole copy of one of them, never part of one
    onnx.checker.check_model(onnx.load_from_string(best))
    assert yaml.safe_load((out / "best" / "config.yaml").read_text())["search_algo"] == "Grid"
    png = (out / "plots" / "metric_per_trial.png").read_bytes()
    assert png.startswith(b"\x89PNG") and b"IEND" in png[-12:]
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    lines = Journal(out / "journal.jsonl").load()
    assert lines and all(len(r["payload"]) == 20000 for r in lines)


@pytest.mark.slow
def test_a_kill_at_any_moment_leaves_every_output_whole(tmp_path: Path):
    procs = []
    for i in range(len(KILL_AFTER_S)):
        out = tmp_path / f"w{i}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.output_writer", str(out)],
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append((proc, out))
    try:
        for proc, _ in procs:
            assert proc.stdout.readline().strip() == "ready"
        # One round of rewriting takes 0.15-0.35 s: kill each writer at another moment of it.
        start = time.monotonic()
        for (proc, _), offset in zip(procs, KILL_AFTER_S):
            time.sleep(max(0.0, start + offset - time.monotonic()))
            proc.send_signal(signal.SIGKILL)
    finally:
        for proc, _ in procs:
            proc.kill()
            proc.wait()
    for _, out in procs:
        _check_whole(out)
    # The next writer sweeps what the killed one left half-done, and appends after a torn line.
    out = procs[0][1]
    write_outputs(out, records(3), config=config(out), stop_reason="space_exhausted", wall_time_s=1)
    leftovers = [p.name for p in out.rglob(".*") if ".tmp" in p.name or p.name.endswith(".old")]
    assert leftovers == []
    journal = Journal(out / "journal.jsonl")
    before = len(journal.load())
    journal.append({"trial_id": "after-the-kill", "payload": "x" * 20000})
    journal.close()
    assert [r["trial_id"] for r in Journal(out / "journal.jsonl").load()][-1] == "after-the-kill"
    assert len(Journal(out / "journal.jsonl").load()) == before + 1
    _check_whole(out)


def _user_files(out: Path) -> dict[str, str]:
    return {
        "notes.txt": "top level",
        "best/README.md": "my notes on the best model",
        "plots/mine.png": "my own plot",
        "candidates/keep-me.txt": "mine",
    }


@pytest.mark.slow
def test_run_and_overwrite_never_remove_files_raysearch_did_not_create(
    ray_cluster, tmp_path: Path, capsys
):
    config = probe_config(tmp_path, search_space={"per_channel": [True, False]})
    out = Path(config["output_dir"])
    out.mkdir()
    (out / "notes.txt").write_text("top level")  # a folder that exists already: fine
    first = AutoSearch(config).run()
    assert first.summary["n_trials"] == 2
    assert (out / "notes.txt").read_text() == "top level"

    mine = _user_files(out)
    for name, text in mine.items():
        (out / name).write_text(text)
    path = write_config(tmp_path / "config.yaml", config)
    assert main(["run", str(path)]) == 2  # a previous search: refused, nothing touched
    assert "holds a previous search" in capsys.readouterr().err
    assert main(["run", str(path), "--overwrite"]) == 0
    for name, text in mine.items():
        assert (out / name).read_text() == text, name
    journal = Journal(out / "journal.jsonl").load()
    assert len(journal) == 2 and not {r["trial_id"] for r in journal} & {
        r["trial_id"] for r in first.records
    }
    # raysearch's own files of the first search are gone or replaced.
    assert not any((out / "candidates" / f"{r['trial_id']}.onnx").exists() for r in first.records)
    assert json.loads((out / "summary.json").read_text())["best_trial_id"] in {
        r["trial_id"] for r in journal
    }
