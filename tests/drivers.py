"""Running a test driver: a module that starts its own Ray cluster in a subprocess (so the
test process keeps its own Ray) and writes what it saw to ``driver.json`` in its folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_driver(
    work: Path, module: str, *argv: str
) -> tuple[dict[str, Any], subprocess.CompletedProcess]:
    """Run ``python -m module *argv`` from the repository root; the ``driver.json`` it wrote in
    ``work`` and the finished process. A driver that fails fails the test with the end of its
    stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((work / "driver.json").read_text()), proc
