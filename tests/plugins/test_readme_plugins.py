"""README, "Plugins": its backend, technique and strategy, copied into a folder of their own
(not on ``sys.path``, not under ``tests/``), named by the README's config beside them and
searched for real: the trials run in Ray actors, which import the three modules from that
folder as the search ships them."""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

import pytest
import yaml

from raysearch.errors import ConfigError

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Plugins: your own backend, technique or strategy"


def readme_files() -> dict[str, str]:
    """The section's code blocks by the file name each one's first line gives."""
    text = README.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    blocks = re.findall(r"```(?:python|yaml)\n(.*?)```", section, re.S)
    return {re.match(r"# ([\w.]+)", block).group(1): block for block in blocks}


@pytest.fixture
def plugin_folder(tmp_path, mlp_files, monkeypatch) -> Path:
    """The README's files and the config's model and data in a folder, the working directory."""
    folder = tmp_path / "my_search"
    folder.mkdir()
    for name, text in readme_files().items():
        (folder / name).write_text(text)
    shutil.copy(mlp_files["model"], folder / "model.onnx")
    shutil.copy(mlp_files["data"], folder / "calib.npz")
    monkeypatch.chdir(folder)
    return folder


def test_the_readme_shows_three_modules_and_their_config():
    assert sorted(readme_files()) == [
        "config.yaml",
        "my_backend.py",
        "my_strategy.py",
        "my_technique.py",
    ]


def test_a_setting_outside_the_plugin_backends_catalogue_is_one_line(plugin_folder):
    from raysearch.config import SearchConfig

    config = yaml.safe_load((plugin_folder / "config.yaml").read_text())
    config["search_space"]["rounded_settings"]["bits"] = [9]
    with pytest.raises(ConfigError) as info:
        SearchConfig.from_dict(config, base_dir=plugin_folder)
    assert str(info.value) == "search_space.rounded_settings.bits: expected a value <= 8, got 9"


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_the_readme_plugins_run_a_search_from_their_own_folder(plugin_folder):
    from raysearch.search import AutoSearch
    from raysearch.space import expand_spaces

    path = plugin_folder / "config.yaml"
    config = yaml.safe_load(path.read_text())
    # One actor, no timing: the test is about the plugins, not about trials side by side.
    config.update(measure_latency=False, resources={"max_concurrent_trials": 1})
    path.write_text(yaml.safe_dump(config))
    result = AutoSearch(str(path)).run()
    rows = sorted(result.results.to_pylist(), key=lambda r: r["number"])
    # Every trial ran in an actor that imported the three modules: a trial without them
    # fails on an unknown backend, strategy setting or technique setting.
    assert [r["status"] for r in rows] == ["ok"] * 4, [r.get("error") for r in rows]
    assert result.summary["stop_reason"] == "space_exhausted"
    # The strategy's order: the grid shuffled by the config's seed.
    from raysearch.config import SearchConfig

    (space,) = SearchConfig.from_dict(config, base_dir=plugin_folder).search_spaces
    grid = [space.to_settings(point) for point in expand_spaces([space]).points]
    random.Random(0).shuffle(grid)
    assert [_settings(row) for row in rows] == grid
    # The backend's models count as quantized (its QuantizeInfo says so); the technique kept
    # one of the MLP's two MatMuls in float where it was on.
    ort = {
        r["params/ort_settings.include_keep_last_float"]: r for r in rows if r["quantizer"] == "ort"
    }
    assert ort[True]["extra/quantized_share"] == 0.5
    assert ort[False]["extra/quantized_share"] == 1.0
    assert [r["extra/quantized_share"] for r in rows if r["quantizer"] == "rounded"] == [1.0] * 2


def _settings(row: dict) -> dict:
    """A results row's settings as the space gives them (group names dropped)."""
    return {
        key.rpartition(".")[2]: value
        for column, value in row.items()
        if column.startswith("params/") and value is not None
        for key in [column.removeprefix("params/")]
    }
