"""Running a test driver: a module that starts its own Ray cluster in a subprocess (so the
test process keeps its own Ray) and writes what it saw to ``driver.json`` in its folder; and a
``raysearch`` command run in the test's process, from a folder of its own."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from raysearch.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run_driver(
    work: Path, module: str, *argv: str, timeout_s: float = 300
) -> tuple[dict[str, Any], subprocess.CompletedProcess]:
    """Run ``python -m module *argv`` from the repository root; the ``driver.json`` it wrote in
    ``work`` and the finished process. A driver that fails, or still runs after ``timeout_s``
    (a bound for one that hangs, not a speed check), fails the test with the end of its
    stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((work / "driver.json").read_text()), proc


@dataclasses.dataclass
class CliRun:
    """What a ``raysearch`` command run in this process returned and printed."""

    returncode: int
    stdout: str
    stderr: str


def run_cli_here(args: list[str], cwd: Path, capsys: Any) -> CliRun:
    """``raysearch ARGS`` run from ``cwd`` (made if missing) by :func:`raysearch.cli.main` in the
    test's process, on the suite's Ray (``ray_cluster``): what the command returns and prints,
    its log lines on stderr in the command's own format, as the console script prints them.
    For tests whose subject is what the command does from a folder other than the config's,
    not the process boundary: a ``raysearch`` process would start and stop a Ray of its own
    for each run (the suite's costliest part). The root logger's handlers and level are put
    back afterwards, so that later tests do not log into this test's closed capture."""
    cwd.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    # pytest's own handlers on the root logger would make main's logging.basicConfig a no-op.
    root.handlers[:] = []
    here = Path.cwd()
    capsys.readouterr()
    try:
        os.chdir(cwd)
        returncode = main(args)
    finally:
        os.chdir(here)
        root.handlers[:] = handlers
        root.setLevel(level)
    printed = capsys.readouterr()
    return CliRun(returncode, printed.out, printed.err)
