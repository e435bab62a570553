"""Outputs are never left half-written, and a search never deletes or overwrites files it did
not create: a kill between writing an output's temporary file and renaming it into place
leaves each output file whole (the old version), and user files in the output folder survive
``run`` and ``run --overwrite``."""

from __future__ import annotations

import json
import queue
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path

import onnx
import pyarrow.parquet as pq
import pytest
import yaml

from raysearch.cli import main
from raysearch.outputs import write_outputs
from raysearch.search import AutoSearch
from raysearch.search.record.journal import Journal
from raysearch.trialrecord import TrialRecord
from tests.reliability.helpers import probe_config, subprocess_env, write_config
from tests.reliability.output_writer import HOLD, SIZES, config, records

#: The outputs a writer is stopped in, right before the rename of each (patterns under the
#: output folder, as ``output_writer`` takes them).
HELD = (
    "summary.json",
    "results.parquet",
    "best/model.onnx",
    "best/config.yaml",
    "plots/metric_per_trial.png",
    "tensorboard/events.out.tfevents.*",
)


def _events(path: Path) -> int:
    """The records of a TensorBoard event file; fails unless its framing runs to its end."""
    data = path.read_bytes()
    pos = count = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        pos += 12 + length + 4  # length, its CRC, the record, its CRC
        count += 1
    assert pos == len(data) and count, f"{path} is cut short"
    return count


def _version(out: Path, path: Path) -> int | None:
    """How many records (3 or 5) the output file ``path`` was written from, or None where its
    content does not say; fails unless the file is whole."""
    name = path.name
    if name.endswith(".json"):
        return json.loads(path.read_text())["n_trials"]
    if name.endswith(".parquet"):
        return pq.read_table(path).num_rows
    if name.endswith(".onnx"):
        data = path.read_bytes()
        onnx.checker.check_model(onnx.load_from_string(data))
        return next(n for n in SIZES if data == (out / "models" / f"m{n}.onnx").read_bytes())
    if name.endswith(".yaml"):
        text = path.read_text()
        assert yaml.safe_load(text)["search_algo"] == "Grid"
        return int(re.search(r"\(trial t(\d+),", text).group(1))  # the best trial is the last
    if name.endswith(".png"):
        png = path.read_bytes()
        assert png.startswith(b"\x89PNG") and b"IEND" in png[-12:]
        return None
    return (_events(path) - 1) // 4  # a header, then 4 scalars per trial


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
    events = list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert events and all(_events(p) for p in events)
    lines = Journal(out / "journal.jsonl").load()
    assert lines and all(len(r.error) == 20000 for r in lines)


def _reader(proc: subprocess.Popen) -> queue.Queue:
    """The lines ``proc`` prints, as they come (a thread, so that waiting can time out)."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line.strip())
        lines.put(None)  # the process closed its output

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _next_line(lines: queue.Queue, what: str, timeout: float = 120) -> str:
    try:
        line = lines.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"{what}: the writer printed nothing in {timeout:g} s") from None
    assert line is not None, f"{what}: the writer ended"
    return line


@pytest.mark.slow
def test_a_kill_between_writing_and_renaming_leaves_every_output_whole(tmp_path: Path):
    writers = []
    for i, pattern in enumerate(HELD):
        out = tmp_path / f"w{i}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.output_writer", str(out)],
            env=subprocess_env(**{HOLD: pattern}),
            stdout=subprocess.PIPE,
            text=True,
        )
        writers.append((pattern, out, proc, _reader(proc)))
    held: dict[str, Path] = {}
    try:
        for pattern, out, proc, lines in writers:
            assert _next_line(lines, pattern) == "ready"  # round 0 (3 records) is in place
            line = _next_line(lines, pattern)
            assert line.startswith("holding "), line
            tmp = held[pattern] = Path(line.removeprefix("holding "))
            # The writer stands inside the atomic writer: the new version (5 records) is
            # complete in its temporary file, the old one (3 records) still in place.
            before = {p: p.read_bytes() for p in out.glob(pattern)}
            assert before and tmp not in before, pattern
            assert _version(out, tmp) in (5, None), pattern
            assert all(_version(out, p) in (3, None) for p in before), pattern
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=30) == -signal.SIGKILL
            # The kill landed there: the temporary file is still there, never renamed, and
            # the old version is untouched.
            assert tmp.is_file(), pattern
            assert {p: p.read_bytes() for p in out.glob(pattern)} == before, pattern
            _check_whole(out)
    finally:
        for _, _, proc, _ in writers:
            proc.kill()
            proc.wait()
    # The next writer sweeps what each killed one left half-done and writes anew.
    for pattern, out, _, _ in writers:
        summary = write_outputs(
            out, records(3), config=config(out), stop_reason="space_exhausted", wall_time_s=1
        )
        assert summary["n_trials"] == 3
        assert not held[pattern].exists(), pattern
        leftovers = [p.name for p in out.rglob(".*") if ".tmp" in p.name or p.name.endswith(".old")]
        assert leftovers == [], pattern
        _check_whole(out)


def test_the_journal_appends_after_a_torn_last_line(tmp_path: Path):
    # What a crash inside an append leaves (a record without its end): the reader skips it
    # and the next record starts on a line of its own.
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    journal.append(TrialRecord(trial_id="whole", error="x" * 20000))
    journal.close()
    line = path.read_text()
    with open(path, "a") as fh:
        fh.write(line[: len(line) // 2].replace("whole", "torn"))
    assert [r.trial_id for r in Journal(path).load()] == ["whole"]
    journal = Journal(path)
    journal.append(TrialRecord(trial_id="after-the-crash", error="x" * 20000))
    journal.close()
    assert [r.trial_id for r in Journal(path).load()] == ["whole", "after-the-crash"]


#: One trial actor a search (a Ray worker's start, several CPU-seconds): what these tests check
#: is the folder, not trials side by side.
ONE_AT_A_TIME = {"max_concurrent_trials": 1}


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
    config = probe_config(
        tmp_path, search_space={"per_channel": [True, False]}, resources=ONE_AT_A_TIME
    )
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
    assert len(journal) == 2 and not {r.trial_id for r in journal} & {
        r.trial_id for r in first.records
    }
    # raysearch's own files of the first search are gone or replaced.
    assert not any((out / "candidates" / f"{r.trial_id}.onnx").exists() for r in first.records)
    assert json.loads((out / "summary.json").read_text())["best_trial_id"] in {
        r.trial_id for r in journal
    }


#: Links planted in a finished search's folder, each to a file or folder outside it: names
#: raysearch writes (files and folders), a model of the first search, and a user's own link.
LINKS = {
    "summary.json": "file",
    "results.parquet": "file",
    "journal.jsonl": "file",
    "best/model.onnx": "file",
    "best/config.yaml": "file",
    "plots/metric_per_trial.png": "file",
    "candidates/{trial}.onnx": "file",
    "candidates/my-link.onnx": "file",
    "tensorboard": "dir",
    "cache": "dir",
    "trials_tmp": "dir",
}


@pytest.mark.slow
def test_a_link_at_a_name_raysearch_writes_is_refused_and_never_followed(
    ray_cluster, tmp_path: Path, capsys
):
    config = probe_config(
        tmp_path, search_space={"per_channel": [True, False]}, resources=ONE_AT_A_TIME
    )
    config["keep_candidates"] = True
    out = Path(config["output_dir"])
    first = AutoSearch(config).run(progress=False)  # stderr below holds the commands' only
    trial = first.records[0].trial_id
    outside = tmp_path / "outside"
    targets = {}
    for pattern, kind in LINKS.items():
        link = out / pattern.format(trial=trial)
        target = outside / pattern.replace("/", "_").format(trial=trial)
        target.parent.mkdir(parents=True, exist_ok=True)
        if kind == "dir":
            target.mkdir()
            (target / "precious.txt").write_text(f"mine: {pattern}")
        else:
            target.write_text(f"mine: {pattern}")
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_dir() and not link.is_symlink():
            shutil.rmtree(link)
        elif link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(target, target_is_directory=kind == "dir")
        targets[pattern] = target

    path = write_config(tmp_path / "config.yaml", config)
    for command in (["run", str(path), "--overwrite"], ["resume", str(out)]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert "symbolic link" in err and "did not create" in err and "\n" not in err, err
    for pattern, target in targets.items():
        link = out / pattern.format(trial=trial)
        assert link.is_symlink() and link.resolve() == target.resolve(), pattern
        if LINKS[pattern] == "dir":
            assert sorted(p.name for p in target.iterdir()) == ["precious.txt"], pattern
            assert (target / "precious.txt").read_text() == f"mine: {pattern}"
        else:
            assert target.read_text() == f"mine: {pattern}", pattern
    # With the links at raysearch's names moved away, the folder is replaced; a link at a
    # name of the user's own stays, and its target too.
    for pattern in LINKS:
        if pattern != "candidates/my-link.onnx":
            (out / pattern.format(trial=trial)).unlink()
    assert main(["run", str(path), "--overwrite"]) == 0
    assert (out / "candidates" / "my-link.onnx").is_symlink()
    assert targets["candidates/my-link.onnx"].read_text() == "mine: candidates/my-link.onnx"
    for name in ("summary.json", "results.parquet", "journal.jsonl", "best/model.onnx"):
        assert (out / name).is_file() and not (out / name).is_symlink(), name
