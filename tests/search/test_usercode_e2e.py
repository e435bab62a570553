"""A custom evaluator beside the config reaches every trial worker: a real search run as a
user runs it (the command, from another folder) whose evaluator module lies in the config's
own folder only, where the search's Ray workers import it from."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.drivers import run_cli_here

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
@pytest.mark.usefixtures("ray_cluster")
def test_an_evaluator_beside_the_config_runs_in_every_trial(make_config, tmp_path: Path, capsys):
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
    done = run_cli_here(["run", str(path)], tmp_path / "elsewhere", capsys)
    assert done.returncode == 0, done.stderr
    rows = pq.read_table(tmp_path / "out" / "results.parquet").to_pylist()
    assert len(rows) == 2
    assert [r["status"] for r in rows] == ["ok", "ok"], [r.get("error") for r in rows]
    assert all(isinstance(r["metric"], float) for r in rows)
    # `resume` reads the config the search saved in its output folder: it looks for the
    # evaluator where the search found it, whatever folder it is run from. (This process
    # imported the module for the run: forgotten, as a new `raysearch resume` process has it.)
    sys.modules.pop("rs_e2e_beside", None)
    again = run_cli_here(["resume", str(tmp_path / "out")], tmp_path / "another", capsys)
    assert again.returncode == 0, again.stderr
