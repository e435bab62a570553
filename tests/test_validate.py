"""``raysearch validate`` makes every check ``run`` makes before Ray starts (the data against
the model, the evaluator on the float model) and says in one line what it leaves to ``run``:
a config it calls valid is not refused by ``run`` a minute later (issue 48, item 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from raysearch.cli import main
from tests.models import attention_data, make_attention_model, make_mlp_model, mlp_data

NOT_CHECKED = (
    "not checked: whether a Ray node can hold one trial (resources), which needs Ray: run "
    "checks it once Ray starts"
)


@pytest.fixture
def folder(tmp_path: Path, monkeypatch) -> Path:
    """A real MLP (input ``x`` float [N, 16]) and a real attention block (input ``ids`` int64),
    data good and bad for them, and custom evaluators beside the configs."""
    monkeypatch.chdir(tmp_path)
    make_mlp_model(tmp_path / "mlp.onnx")
    make_attention_model(tmp_path / "att.onnx")
    data = mlp_data(32)
    np.savez(tmp_path / "ok.npz", **data)
    np.savez(tmp_path / "missing.npz", z=data["x"])
    np.savez(tmp_path / "short.npz", x=data["x"][:, :8])
    np.savez(tmp_path / "transposed.npz", x=np.ascontiguousarray(data["x"].T))
    ids = attention_data(32)["ids"]
    np.savez(tmp_path / "ids_float.npz", ids=ids.astype(np.float32))
    (tmp_path / "raises_on_float.py").write_text(
        "def score(model_path, providers):\n"
        "    raise RuntimeError('no labels for ' + model_path.rsplit('/', 1)[-1])\n"
    )
    (tmp_path / "scores_half.py").write_text("def score(model_path, providers):\n    return 0.5\n")
    return tmp_path


def _write(folder: Path, name: str, **keys: Any) -> Path:
    config = {
        "model": "mlp.onnx",
        "calibration_data": "ok.npz",
        "search_space": {"calibrate_method": ["MinMax"]},
        "search_algo": "Grid",
        "output_dir": "out",
        **keys,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _refused(path: Path, capsys) -> str:
    assert main(["validate", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # never "valid"
    lines = captured.err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_validate_refuses_calibration_data_without_a_model_input(folder, capsys):
    line = _refused(_write(folder, "missing", calibration_data="missing.npz"), capsys)
    assert line == (
        "raysearch: error: calibration data 'missing.npz': missing input 'x' (found 'z' "
        "instead); the model's inputs are x"
    )


@pytest.mark.parametrize(("name", "shape"), [("short", "(32, 8)"), ("transposed", "(16, 32)")])
def test_validate_refuses_an_array_of_the_wrong_shape(folder, capsys, name, shape):
    line = _refused(_write(folder, name, calibration_data=f"{name}.npz"), capsys)
    assert line.startswith(
        f"raysearch: error: calibration data '{name}.npz': input 'x' has shape {shape}"
    )
    assert line.endswith("model expects [N, 16]")


def test_validate_refuses_float_data_for_an_integer_input(folder, capsys):
    path = _write(folder, "ids_float", model="att.onnx", calibration_data="ids_float.npz")
    assert _refused(path, capsys) == (
        "raysearch: error: calibration data 'ids_float.npz': input 'ids' has dtype float32, "
        "model expects int64"
    )


def test_validate_runs_the_evaluator_on_the_float_model(folder, capsys):
    path = _write(folder, "raises", metric="raises_on_float:score", tolerance=0.1)
    assert _refused(path, capsys) == (
        "raysearch: error: evaluator 'raises_on_float:score' failed on the float model: "
        "RuntimeError: no labels for mlp.onnx"
    )


def test_validate_says_what_it_checked_and_what_it_left_to_run(folder, capsys):
    assert main(["validate", str(_write(folder, "ok", batch_size=8))]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{folder / 'ok.yaml'}: valid",
        "grid: 1 settings (1 combinations)",
        "float model: runs on the evaluation data's first batch (8 of 32 rows; run computes "
        "the rest while its first trials start)",
        NOT_CHECKED,
    ]
    assert not (folder / "out").exists()  # validate writes nothing


def test_validate_prints_the_float_score_and_its_share_of_the_time_limit(folder, capsys):
    path = _write(
        folder, "half", metric="scores_half:score", tolerance=0.1, stop={"time_limit": 600}
    )
    assert main(["validate", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("float model: score = 0.5 (scored in ")
    assert lines[2].endswith(" s, 0% of time_limit 600 s)")
    assert lines[3] == NOT_CHECKED


def test_validate_notes_an_output_folder_run_would_refuse(folder, capsys):
    (folder / "out").mkdir()
    (folder / "out" / "summary.json").write_text("{}")  # not raysearch's: run refuses it
    assert main(["validate", str(_write(folder, "ok"))]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == (
        f"note: run without --overwrite would refuse it: output_dir: {folder / 'out'} already "
        "holds 'summary.json', not created by raysearch (no .raysearch.json); choose another "
        "output_dir: raysearch never overwrites files it did not create"
    )
