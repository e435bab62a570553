"""Working folders of killed processes are swept by the next process."""

from __future__ import annotations

import os
import subprocess
import sys

from raysearch.quantize.tempdirs import make_workdir, sweep_stale


def test_sweep_removes_only_folders_of_dead_processes(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead = int(done.stdout)
    stale = tmp_path / f"rs-test-{dead}-abc"
    mine = tmp_path / f"rs-test-{os.getpid()}-def"
    other = tmp_path / "rs-test-notapid-x"
    for folder in (stale, mine, other):
        folder.mkdir()
    assert sweep_stale("rs-test", tmp_path) == 1
    assert not stale.exists() and mine.exists() and other.exists()


def test_make_workdir_names_the_process():
    folder = make_workdir("rs-test-workdir")
    try:
        assert folder.is_dir() and folder.name.startswith(f"rs-test-workdir-{os.getpid()}-")
    finally:
        folder.rmdir()
