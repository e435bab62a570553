"""A custom evaluator beside the config reaches every trial worker: a real search run as a
user runs it (the command, from another folder, with no ``PYTHONPATH``) whose evaluator module
lies in the config's own folder only, shipped to Ray's workers by the search."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

#: The evaluator: self-contained (numpy and ONNX Runtime), as a user's module is.
EVALUATOR = """
import numpy as np
import onnxruntime as ort


def mean_output(model_path, providers):
    session = ort.InferenceSession(model_path, providers=providers)
    feeds = {}
    for spec in session.get_inputs():
        shape = [d if isinstance(d, int) else 8 for d in spec.shape]
        feeds[spec.name] = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    return float(session.run(None, feeds)[0].mean())
"""


@pytest.mark.slow
def test_an_evaluator_beside_the_config_runs_in_every_trial(make_config, tmp_path: Path):
    folder = tmp_path / "config"
    folder.mkdir()
    (folder / "rs_e2e_beside.py").write_text(EVALUATOR)
    config = make_config(
        search_space={"calibrate_method": ["MinMax"], "per_channel": [True, False]},
        metric="rs_e2e_beside:mean_output",
        higher_is_better=True,
        tolerance=10.0,
        early_stopping=False,
        measure_latency=False,
    )
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    done = _raysearch(["run", str(path)], tmp_path / "elsewhere")
    assert done.returncode == 0, done.stderr
    rows = pq.read_table(tmp_path / "out" / "results.parquet").to_pylist()
    assert len(rows) == 2
    assert [r["status"] for r in rows] == ["ok", "ok"], [r.get("error") for r in rows]
    assert all(isinstance(r["metric"], float) for r in rows)
    # `resume` reads the config the search saved in its output folder: it looks for the
    # evaluator where the search found it, whatever folder it is run from.
    again = _raysearch(["resume", str(tmp_path / "out")], tmp_path / "another")
    assert again.returncode == 0, again.stderr


def _raysearch(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``raysearch ARGS`` as a user runs it: from ``cwd`` (made empty), no ``PYTHONPATH``."""
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-m", "raysearch.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
