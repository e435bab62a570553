"""What the command line says about a predefined space narrowed to this install (issue 48
item 8): without PyTorch, ``A8W8_SEARCH`` searches fine-tuning off only, so a search here runs
fewer of its settings than ``raysearch spaces`` counts. ``spaces`` says how many and why,
``validate`` says it in its own words (a note, not a warning), and ``export``, which fine-tunes
nothing, says nothing of it."""

from __future__ import annotations

import importlib.util
import json
import logging

import numpy as np
import pytest
import yaml

from raysearch.cli import main
from raysearch.config import NARROWED_LOGGER
from tests.models import make_mlp_model, mlp_data
from tests.test_report import _records

NOTE = (
    "A8W8_SEARCH: include_fast_ft searched as false only: fine-tuning needs PyTorch: "
    "pip install 'raysearch[finetune]'"
)


@pytest.fixture
def without_pytorch(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )


def _narrowing_logged(caplog) -> list[str]:
    """The warnings logged that speak of fine-tuning (from any logger)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and "fine-tuning" in r.getMessage()
    ]


@pytest.fixture
def a8w8_config(tmp_path):
    model = make_mlp_model(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "calib.npz", **mlp_data(32))
    config = {
        "model": str(model),
        "calibration_data": str(tmp_path / "calib.npz"),
        "search_space": "A8W8_SEARCH",
        "metric": "cos",
        "tolerance": 0.99,
        "output_dir": str(tmp_path / "out"),
    }
    path = tmp_path / "a8w8.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_spaces_says_how_many_settings_a_narrowed_preset_runs_here_and_why(without_pytorch, capsys):
    assert main(["spaces"]) == 0
    lines = capsys.readouterr().out.splitlines()
    a8w8 = next(line for line in lines if line.startswith("A8W8_SEARCH "))
    assert a8w8.split()[1] == "26920*"
    assert (
        "* A8W8_SEARCH: a search here runs 13480 of its 26920 settings: include_fast_ft "
        "searched as false only: fine-tuning needs PyTorch: pip install 'raysearch[finetune]'"
    ) in lines


def test_validate_notes_the_narrowing_and_logs_no_warning(
    without_pytorch, a8w8_config, capsys, caplog
):
    with caplog.at_level(logging.WARNING):
        assert main(["validate", str(a8w8_config)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "(13480 distinct valid settings of 40960 combinations)" in out[1]
    assert f"note: {NOTE} (raysearch spaces counts every setting of the preset)" in out
    assert _narrowing_logged(caplog) == []


def test_export_of_a_narrowed_preset_search_says_nothing_of_fine_tuning(
    without_pytorch, a8w8_config, tmp_path, capsys, caplog
):
    out = tmp_path / "out"
    out.mkdir()
    (out / "raysearch_config.yaml").write_text(a8w8_config.read_text())
    (out / ".raysearch.json").write_text(json.dumps({"status": "running"}))
    (out / "journal.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in _records()))
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    with caplog.at_level(logging.WARNING):
        assert main(["export", str(out), "--optuna", storage]) == 0
        assert main(["report", str(out)]) == 0
    assert _narrowing_logged(caplog) == []
    assert "fine-tuning" not in capsys.readouterr().err
    # A search still says it: it changes what is searched.
    from raysearch.config import load_config

    with caplog.at_level(logging.WARNING):
        load_config(a8w8_config)
    assert _narrowing_logged(caplog) == [NOTE]
    assert [r.name for r in caplog.records if r.getMessage() == NOTE] == [NARROWED_LOGGER]
