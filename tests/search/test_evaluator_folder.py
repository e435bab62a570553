"""A custom evaluator runs where it lives (issue 48, item 2): a module beside the config that
opens a file beside itself (via ``__file__``) scores every trial, not the float model only; a
cluster's other nodes get its folder whole (size-checked, without the model, the data and the
output folder), and a search in which no trial succeeded exits 1 naming the most frequent
error."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from raysearch.errors import ConfigError
from raysearch.evaluate import Evaluator
from raysearch.search.runtime.cluster import shipped_code
from raysearch.usercode import RAY_PKG_PREFIX, check_shippable, where_code_lives
from tests.drivers import run_cli_here

#: Opens ``data.npz`` beside itself, as a user's evaluator with its labels does.
READS_BESIDE = """
import os

import numpy as np
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))


def score(model_path, providers):
    weight = float(np.load(os.path.join(HERE, "data.npz"))["w"])
    session = ort.InferenceSession(model_path, providers=providers)
    x = np.ones((4, 16), np.float32)
    return weight * float(session.run(None, {"x": x})[0].mean())
"""

#: Scores the float model; raises on every quantized one.
FAILS_QUANTIZED = """
import os


def score(model_path, providers):
    if os.path.basename(model_path) == "mlp.onnx":
        return 1.0
    raise ValueError("no labels for quantized models")
"""


def _beside(tmp_path: Path, make_config, module: str, text: str) -> Path:
    folder = tmp_path / "config"
    folder.mkdir()
    (folder / f"{module}.py").write_text(text)
    np.savez(folder / "data.npz", w=np.float32(2.0))
    config = make_config(
        search_space={"calibrate_method": ["MinMax"], "per_channel": [True, False]},
        metric=f"{module}:score",
        higher_is_better=True,
        tolerance=10.0,
        early_stopping=False,
        measure_latency=False,
    )
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_an_evaluator_reading_a_file_beside_itself_scores_every_trial(
    make_config, tmp_path, capsys
):
    path = _beside(tmp_path, make_config, "rs_reads_beside", READS_BESIDE)
    done = run_cli_here(["run", str(path)], tmp_path / "elsewhere", capsys)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = pq.read_table(tmp_path / "out" / "results.parquet").to_pylist()
    assert [r["status"] for r in rows] == ["ok", "ok"], [r.get("error") for r in rows]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["most_frequent_error"] is None and summary["best_metric"] is not None


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_a_search_in_which_no_trial_succeeded_exits_1_naming_the_error(
    make_config, tmp_path, capsys
):
    path = _beside(tmp_path, make_config, "rs_fails_quantized", FAILS_QUANTIZED)
    done = run_cli_here(["run", str(path)], tmp_path / "elsewhere", capsys)
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1] == (
        "raysearch: error: No trial succeeded: 2 of 2 failed, 2 with: no labels for quantized "
        "models (see results.parquet and auto_search.log)"
    )
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["most_frequent_error"] == {
        "error": "no labels for quantized models",
        "trials": 2,
    }
    assert "Outputs: " in done.stdout and "best/" not in done.stdout


def test_an_evaluator_named_by_path_is_imported_where_it_lives_when_unpickled(tmp_path):
    """A trial worker gets the evaluator by its name and imports it from the search folder
    (pickle's own import of ``rs_where_it_lives`` finds no such module there)."""
    (tmp_path / "rs_where_it_lives.py").write_text(
        "import os\n\ndef score(model_path, providers):\n    return os.path.abspath(__file__)\n"
    )
    evaluator = Evaluator("rs_where_it_lives:score", 0.1, search_dirs=[tmp_path])
    data = pickle.dumps(evaluator)
    sys.modules.pop("rs_where_it_lives", None)
    script = (
        "import pickle, sys\n"
        "evaluator = pickle.loads(sys.stdin.buffer.read())\n"
        "print(evaluator.function('m.onnx', []))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=data,
        capture_output=True,
        cwd=tmp_path.parent,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().strip() == str(tmp_path / "rs_where_it_lives.py")


def test_a_folder_missing_here_is_found_where_ray_unpacked_it(tmp_path, monkeypatch):
    copy = tmp_path / f"{RAY_PKG_PREFIX}0123abcd" / "config"
    copy.mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [*sys.path, str(copy.parent)])
    here = tmp_path / "here"
    here.mkdir()
    assert where_code_lives([here, "/no/such/place/config"]) == [here, copy]


def test_ray_unpacks_a_shipped_package_under_the_prefix_raysearch_looks_for():
    from ray._private.runtime_env.packaging import RAY_PKG_PREFIX as RAYS

    assert RAYS == RAY_PKG_PREFIX


def test_a_folder_too_large_to_ship_is_refused_in_one_line(tmp_path):
    (tmp_path / "my_metric.py").write_text("def score(model_path, providers):\n    return 1\n")
    (tmp_path / "labels.bin").write_bytes(b"\0" * 3_000_000)
    (tmp_path / "model.onnx").write_bytes(b"\0" * 5_000_000)  # the search ships it itself
    check_shippable(tmp_path, [tmp_path / "model.onnx"], limit=4_000_000, modules=["my_metric"])
    with pytest.raises(ConfigError) as info:
        check_shippable(tmp_path, [], limit=4_000_000, modules=["my_metric"])
    assert str(info.value) == (
        f"metric: {tmp_path} holds 8 MB besides the model and data, more than the 4 MB "
        "raysearch ships to the other nodes of a Ray cluster with my_metric (a module runs in "
        "its folder, beside the files it reads): move my_metric and the files it reads into "
        "a folder of their own, or install it on every node"
    )


def test_what_ray_would_not_ship_is_not_counted(tmp_path, monkeypatch):
    """A folder whose .gitignore lists a virtual environment (a project's root, the working
    directory of a test run) ships without it: Ray's upload leaves it out, so the size check
    does too; with RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1 Ray ships it, and the check counts it."""
    (tmp_path / "my_metric.py").write_text("def score(model_path, providers):\n    return 1\n")
    venv = tmp_path / ".venv" / "lib"
    venv.mkdir(parents=True)
    (venv / "big.so").write_bytes(b"\0" * 5_000_000)
    (tmp_path / ".gitignore").write_text(".venv/\n")
    check_shippable(tmp_path, [], limit=4_000_000, modules=["my_metric"])
    monkeypatch.setenv("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "1")
    with pytest.raises(ConfigError, match="holds 5 MB besides the model and data"):
        check_shippable(tmp_path, [], limit=4_000_000, modules=["my_metric"])


def test_the_shipped_folder_leaves_out_the_model_data_and_outputs():
    assert shipped_code(["project"], ["project/model.onnx", "project/out", "data/calib.npz"]) == {
        "py_modules": ["project"],
        "excludes": ["/model.onnx", "/out"],
    }


_SHIPPED = """
import json, sys
import ray
from raysearch.search.runtime.cluster import shipped_code

folder = sys.argv[1]
ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR",
         runtime_env=shipped_code([folder], [folder + "/model.onnx"]))


@ray.remote
def score_on_a_node_without_the_folder():
    import os
    from raysearch.usercode import import_named, where_code_lives

    # The folder as another node sees it: not there (the same name elsewhere).
    found = where_code_lives(["/no/such/node/path/" + os.path.basename(folder)])
    # What Ray unpacked, listed before the import adds __pycache__ (where bytecode is written).
    shipped = sorted(os.listdir(found[0]))
    module = import_named("rs_shipped_eval", found)
    return [str(p) for p in found], module.score("m.onnx", []), shipped


print(json.dumps(ray.get(score_on_a_node_without_the_folder.remote())))
ray.shutdown()
"""


@pytest.mark.slow
def test_a_node_without_the_folder_runs_the_module_from_the_copy_ray_shipped(tmp_path):
    """Ray's own unpacking of a shipped folder (runtime_env py_modules), found by
    where_code_lives as a node without the folder finds it: the module runs beside the files
    shipped with it, the model left out."""
    folder = tmp_path / "evalcfg"
    folder.mkdir()
    (folder / "rs_shipped_eval.py").write_text(
        "import os\nimport numpy as np\n\n"
        "def score(model_path, providers):\n"
        "    here = os.path.dirname(os.path.abspath(__file__))\n"
        "    return float(np.load(os.path.join(here, 'data.npz'))['w'])\n"
    )
    np.savez(folder / "data.npz", w=np.float32(2.5))
    (folder / "model.onnx").write_bytes(b"\0" * 1000)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", _SHIPPED, str(folder)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found, value, files = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(found) == 1 and "_ray_pkg_" in found[0] and found[0].endswith("/evalcfg")
    assert value == 2.5
    assert files == ["data.npz", "rs_shipped_eval.py"]
