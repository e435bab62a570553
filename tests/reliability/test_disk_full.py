"""A full disk under the output folder: the search stops with one line naming the folder and
the space it needs, exit status 1, the journal intact; once space is freed, ``raysearch
resume`` completes it with no trial lost or run again. The folder is a small tmpfs mounted
by the test (the tests run as root; where mounting is impossible the test is skipped). The
search that meets the full disk is a real ``raysearch run`` process (its exit status and last
line are the behaviour); the resume is the same command called in the test's process, on the
suite's Ray (a second command process costs its imports and a Ray start of its own)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections import Counter
from pathlib import Path

import pytest

from raysearch.cli import main
from tests.reliability.helpers import (
    calls,
    journal,
    probe_config,
    start_raysearch,
    stop_leftovers,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.slow]

#: Eight settings, one trial at a time: the disk fills after the fourth, with four to go.
SPACE = {
    "calibrate_method": ["MinMax", "Percentile"],
    "per_channel": [True, False],
    "activation_type": ["QUInt8", "QInt8"],
}
SETTINGS = 8


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 4 MiB tmpfs of its own, unmounted afterwards."""
    mount = Path("/tmp") / f"raysearch-full-{uuid.uuid4().hex[:8]}"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        mount.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        with contextlib.suppress(OSError):
            mount.rmdir()


def _fill(folder: Path) -> Path:
    """A file taking every free byte of ``folder``'s disk (unbuffered writes: the last one
    that fits is kept)."""
    filler = folder / "filler.bin"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (65536, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


@pytest.mark.usefixtures("ray_cluster")
def test_a_full_disk_stops_the_search_in_one_line_and_resume_completes_it(
    small_disk: Path, tmp_path: Path
):
    out = small_disk / "out"
    config = probe_config(
        tmp_path,
        output_dir=str(out),
        keep_candidates=True,
        search_space=SPACE,
        plan={"sleep_s": 0.3},
        resources={"max_concurrent_trials": 1},
    )
    path = write_config(tmp_path / "config.yaml", config)
    proc = start_raysearch(["run", str(path)], tmp_path)
    try:
        wait_until(proc, lambda: len(journal(out)) >= 4)
        filler = _fill(small_disk)
        status = proc.wait(timeout=240)
    finally:
        stop_leftovers(proc)
    err = (tmp_path / "stderr.txt").read_text().strip().splitlines()
    assert status == 1, err
    last = err[-1]
    assert last.startswith(f"raysearch: error: {out}: no space left on its disk"), last
    assert "more there" in last and f"raysearch resume {out}" in last
    assert not any("Traceback" in line for line in err), err
    before = journal(out)
    assert 4 <= len(before) < SETTINGS
    assert len({r["trial_id"] for r in before}) == len(before)
    assert all(r["status"] == "ok" for r in before)  # no trial blamed for the disk

    filler.unlink()
    assert main(["resume", str(out)]) == 0
    after = journal(out)
    assert len(after) == len({r["key"] for r in after}) == SETTINGS
    assert [r["trial_id"] for r in after[: len(before)]] == [r["trial_id"] for r in before]
    evaluations = Counter(c["trial"] for c in calls(tmp_path / "calls.jsonl"))
    assert all(evaluations[r["trial_id"]] == 1 for r in before), evaluations
    assert (out / "summary.json").is_file() and (out / "best" / "model.onnx").is_file()
