"""A config with several mistakes reports every one of them, one line each and always in the
same order (keys, sections, space entries), not only the first; exit status 2 stays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from raysearch.cli import main
from raysearch.config import SearchConfig
from raysearch.errors import ConfigError, ConfigErrors
from tests.models import make_mlp_model, mlp_data

#: Seven mistakes in four places, and the line each must get (in the order they are read).
MISTAKES = {
    "bogus": 1,
    "search_space": {
        "per_chanel": [True],
        "calibrate_method": ["MinMaxx"],
        "extra_options": {"Foo": [1]},
    },
    "search_algo": "Gridd",
    "stop": {"iteration_limt": 3},
    "resources": {"cpu_per_trial": 0},
}
EXPECTED = [
    "bogus: unknown key",
    "search_space.per_chanel: unknown key (did you mean 'per_channel'?)",
    "search_space.calibrate_method: expected one of MinMax, Entropy, Percentile, Distribution, "
    "got 'MinMaxx'",
    "search_space.extra_options.Foo: unknown key",
    "search_algo: expected one of ",
    "stop.iteration_limt: unknown key (did you mean 'iteration_limit'?)",
    "resources.cpu_per_trial: expected a number > 0, got 0",
]


@pytest.fixture
def config(tmp_path: Path) -> dict:
    model = make_mlp_model(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "calib.npz", **mlp_data(8))
    return {"model": str(model), "calibration_data": str(tmp_path / "calib.npz"), **MISTAKES}


def test_every_mistake_is_raised_at_once_in_a_fixed_order(config):
    with pytest.raises(ConfigErrors) as info:
        SearchConfig.from_dict(config)
    lines = [str(e) for e in info.value.errors]
    assert len(lines) == len(EXPECTED)
    for line, expected in zip(lines, EXPECTED, strict=True):
        assert line.startswith(expected) and "\n" not in line
    assert str(info.value) == "\n".join(lines)
    assert isinstance(info.value, ConfigError) and info.value.path == "bogus"


def test_validate_prints_every_mistake_one_line_each_and_exits_2(config, tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == len(EXPECTED)
    for line, expected in zip(err, EXPECTED, strict=True):
        assert line.startswith(f"raysearch: error: {expected}")


def test_run_refuses_before_it_starts_with_every_mistake(config, tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**config, "output_dir": str(tmp_path / "out")}))
    assert main(["run", str(path)]) == 2
    assert len(capsys.readouterr().err.splitlines()) == len(EXPECTED)
    assert not (tmp_path / "out").exists()


def test_a_single_mistake_is_raised_as_itself(config):
    for key in ("bogus", "stop", "resources", "search_algo"):
        del config[key]
    config["search_space"] = {"per_chanel": [True]}
    with pytest.raises(ConfigError) as info:
        SearchConfig.from_dict(config)
    assert type(info.value) is ConfigError
    assert str(info.value) == "search_space.per_chanel: unknown key (did you mean 'per_channel'?)"


def test_each_space_of_several_reports_its_mistakes(config):
    for key in ("bogus", "stop", "resources", "search_algo", "search_space"):
        del config[key]
    config["search_spaces"] = [{"per_chanel": [True]}, "A8W8", {"reduce_rang": [True]}]
    with pytest.raises(ConfigErrors) as info:
        SearchConfig.from_dict(config)
    assert [e.path for e in info.value.errors] == [
        "search_spaces[0].per_chanel",
        "search_spaces[1]",
        "search_spaces[2].reduce_rang",
    ]
