"""``validate`` refuses every input ``run`` would refuse, and ``run`` refuses it before it
writes anything: an Optuna storage Optuna cannot open, a logger's place that cannot be
written, ``sampler_options`` and logger settings of the wrong type (issue 57, items 2, 3, 6).
Each refusal is one line and exit status 2, and the output folder is left absent. ``run``'s
side of each case is a row of ``tests/reliability/test_bad_input.py``'s matrix (the Optuna
storage's in a real process too)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
import yaml

from raysearch.cli import main
from raysearch.errors import ConfigError
from tests.models import make_mlp_model, mlp_data


@pytest.fixture
def folder(tmp_path: Path, monkeypatch) -> Path:
    """A real MLP and its data; the working directory, where the configs are."""
    monkeypatch.chdir(tmp_path)
    make_mlp_model(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "ok.npz", **mlp_data(32))
    return tmp_path


def _write(folder: Path, **keys: Any) -> Path:
    config = {
        "model": "mlp.onnx",
        "calibration_data": "ok.npz",
        "search_space": {"calibrate_method": ["MinMax"]},
        "search_algo": "Grid",
        "output_dir": "out",
        **keys,
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _refused(argv: list[str], capsys) -> str:
    """The one line a command refusing its input prints, exit status 2, nothing written."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, lines
    assert not Path("out").exists()
    return lines[0]


def test_validate_refuses_the_storage_run_refuses(folder, capsys):
    path = _write(folder, optuna_storage="sqlite:///no_such_folder/study.db")
    line = _refused(["validate", str(path)], capsys)
    assert line.startswith("raysearch: error: optuna_storage: Optuna cannot open sqlite:///")
    (folder / "notes.db").write_text("not a database")
    path = _write(folder, optuna_storage="sqlite:///notes.db")
    line = _refused(["validate", str(path)], capsys)
    assert line.endswith("notes.db: file is not a database)")


def test_validate_opens_a_storage_without_writing_it(folder, capsys):
    from raysearch.search.targets import check_optuna_storage

    # A storage that is not there yet is not created; an Optuna one is opened, unchanged.
    path = _write(folder, optuna_storage="sqlite:///new.db")
    assert main(["validate", str(path)]) == 0
    assert not (folder / "new.db").exists()
    optuna.create_study(storage="sqlite:///old.db", study_name="kept")
    before = (folder / "old.db").read_bytes()
    check_optuna_storage("sqlite:///old.db")
    assert (folder / "old.db").read_bytes() == before
    capsys.readouterr()


def test_an_optuna_storage_of_another_schema_is_refused(folder):
    from raysearch.search.targets import check_optuna_storage

    optuna.create_study(storage="sqlite:///old.db", study_name="kept")
    with sqlite3.connect(folder / "old.db") as connection:
        connection.execute("UPDATE alembic_version SET version_num = 'v0.0.0.a'")
    connection.close()
    with pytest.raises(ConfigError, match=r"optuna_storage: Optuna cannot open sqlite:///old.db"):
        check_optuna_storage("sqlite:///old.db")


def test_sampler_options_of_the_wrong_type_are_refused_in_one_line(folder, capsys):
    path = _write(folder, search_algo="TPE", sampler_options={"n_startup_trials": "five"})
    assert _refused(["validate", str(path)], capsys) == (
        "raysearch: error: sampler_options.n_startup_trials: TPESampler's n_startup_trials "
        "takes an integer, got 'five'"
    )


def test_a_logger_setting_of_a_value_it_does_not_take_is_refused(folder, capsys):
    path = _write(folder, loggers={"wandb": {"mode": "offlin"}})
    assert _refused(["validate", str(path)], capsys) == (
        "raysearch: error: loggers.wandb.mode: wandb's mode takes one of 'online', 'offline', "
        "'disabled', 'shared' or null, got 'offlin' (did you mean 'offline'?)"
    )


def test_a_logger_place_that_cannot_be_written_is_refused(folder, capsys):
    uri = f"sqlite:///{folder}/no_such_folder/mlflow.db"
    path = _write(folder, loggers={"mlflow": {"tracking_uri": uri, "experiment_name": "q"}})
    assert _refused(["validate", str(path)], capsys) == (
        f"raysearch: error: loggers.mlflow.tracking_uri: MLflow cannot open {uri} (no folder "
        f"{folder}/no_such_folder for its database file)"
    )


def test_wandb_dir_and_mlflow_file_store_are_checked(folder, monkeypatch):
    from raysearch.config import SearchConfig
    from raysearch.search.targets import check_targets

    def targets(**keys: Any) -> None:
        check_targets(SearchConfig.from_dict(yaml.safe_load(_write(folder, **keys).read_text())))

    # W&B writes a run it cannot put in ``dir`` into the system temp folder instead.
    with pytest.raises(ConfigError, match=r"loggers.wandb.dir: ok.npz/runs: .*ok.npz is not a"):
        targets(loggers={"wandb": {"mode": "offline", "dir": "ok.npz/runs"}})
    targets(loggers={"wandb": {"mode": "offline", "dir": "runs/wandb"}})
    assert not (folder / "runs").exists()
    # MLflow 3 refuses its file store unless allowed.
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    store = {"tracking_uri": f"file://{folder}/mlruns", "experiment_name": "q"}
    with pytest.raises(ConfigError, match="MLFLOW_ALLOW_FILE_STORE=true"):
        targets(loggers={"mlflow": store})
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    targets(loggers={"mlflow": store})


@pytest.mark.parametrize("command", ["validate", "run"])
def test_wandb_online_without_an_api_key_is_refused(folder, capsys, monkeypatch, command):
    # Ray's callback finds no key, warns, and logs nothing (the search ended with exit 0).
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_SETUP_API_KEY_HOOK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(folder))  # no key saved by `wandb login`
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(folder / "wandb_config"))
    path = _write(folder, loggers={"wandb": {"project": "q"}})
    assert _refused([command, str(path)], capsys) == (
        "raysearch: error: loggers.wandb: W&B's mode online needs an API key (WANDB_API_KEY, "
        "api_key, api_key_file or `wandb login`); mode: offline needs none"
    )
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert main(["validate", str(path)]) == 0
