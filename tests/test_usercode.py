"""Code a config names: found as Python finds it, else in the config's folder, then the
working directory; never by changing ``sys.path``; and named for shipping to Ray's workers when
it lies in one of those folders."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from raysearch.config import SearchConfig
from raysearch.errors import ConfigError
from raysearch.evaluate import load_custom_evaluator
from raysearch.usercode import import_named, import_plugins, local_modules
from tests.models import make_mlp_model, mlp_data

SCORE = "def score(model_path, providers):\n    return {value}\n"


@pytest.fixture
def fresh_modules() -> Iterator[list[str]]:
    """Names the test imports: removed from ``sys.modules`` afterwards."""
    names: list[str] = []
    yield names
    for name in list(sys.modules):
        if name.partition(".")[0] in names:
            del sys.modules[name]


def _module(folder: Path, name: str, value: float = 1.0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(SCORE.format(value=value))
    return path


def test_a_module_python_does_not_find_comes_from_the_first_search_folder(
    tmp_path: Path, fresh_modules: list[str]
):
    fresh_modules.append("rs_uc_first")
    _module(tmp_path / "config", "rs_uc_first", 1.0)
    _module(tmp_path / "cwd", "rs_uc_first", 2.0)
    path_before = list(sys.path)
    module = import_named("rs_uc_first", [tmp_path / "config", tmp_path / "cwd"])
    assert module.score("m.onnx", []) == 1.0
    assert Path(module.__file__) == tmp_path / "config" / "rs_uc_first.py"
    assert sys.path == path_before
    with pytest.raises(ModuleNotFoundError):
        import_named("rs_uc_nowhere", [tmp_path / "config", tmp_path / "cwd"])


def test_a_module_on_the_python_path_wins_over_one_in_a_search_folder(
    tmp_path: Path, fresh_modules: list[str], monkeypatch
):
    fresh_modules.append("rs_uc_installed")
    _module(tmp_path / "site", "rs_uc_installed", 3.0)
    _module(tmp_path / "config", "rs_uc_installed", 1.0)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert import_named("rs_uc_installed", [tmp_path / "config"]).score("m", []) == 3.0
    assert local_modules(["rs_uc_installed"], [tmp_path / "config"]) == []


def test_a_package_its_submodules_and_a_folder_without_init(
    tmp_path: Path, fresh_modules: list[str]
):
    fresh_modules.extend(["rs_uc_pkg", "rs_uc_ns"])
    package = tmp_path / "rs_uc_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("FACTOR = 2.0\n")
    (package / "evals.py").write_text(
        "from rs_uc_pkg.helpers import FACTOR\n\n\n"
        "def score(model_path, providers):\n    return FACTOR\n"
    )
    namespace = tmp_path / "rs_uc_ns"
    namespace.mkdir()
    (namespace / "evals.py").write_text(SCORE.format(value=5.0))
    assert import_named("rs_uc_pkg.evals", [tmp_path]).score("m", []) == 2.0
    assert import_named("rs_uc_ns.evals", [tmp_path]).score("m", []) == 5.0
    assert local_modules(["rs_uc_pkg.evals", "rs_uc_ns.evals"], [tmp_path]) == [
        package,
        namespace,
    ]


def test_only_the_named_module_comes_from_a_search_folder(tmp_path: Path, fresh_modules: list[str]):
    """A sibling it imports is not found: no folder is put on ``sys.path`` (the workers get
    the named module only, so the driver must not find more)."""
    fresh_modules.extend(["rs_uc_main", "rs_uc_sibling"])
    (tmp_path / "rs_uc_sibling.py").write_text("VALUE = 1\n")
    (tmp_path / "rs_uc_main.py").write_text("import rs_uc_sibling\n" + SCORE.format(value=1))
    with pytest.raises(ConfigError, match=r"cannot import module 'rs_uc_main': No module named "):
        load_custom_evaluator("rs_uc_main:score", search_dirs=[tmp_path])
    assert "rs_uc_main" not in sys.modules


def test_what_is_shipped_is_what_lies_in_a_search_folder(tmp_path: Path, fresh_modules):
    fresh_modules.append("rs_uc_ship")
    path = _module(tmp_path, "rs_uc_ship")
    assert local_modules(["rs_uc_ship"], [tmp_path]) == []  # not imported yet
    import_named("rs_uc_ship", [tmp_path])
    assert local_modules(["rs_uc_ship", "json", "rs_uc_ship"], [tmp_path]) == [path]
    assert local_modules(["rs_uc_ship"], [tmp_path / "elsewhere"]) == []


def test_the_missing_module_message_names_the_folders_looked_in(tmp_path: Path):
    with pytest.raises(ConfigError) as error:
        load_custom_evaluator("rs_uc_absent:score", search_dirs=[tmp_path / "a", tmp_path / "b"])
    assert str(error.value) == (
        "metric: cannot import module 'rs_uc_absent': No module named 'rs_uc_absent' "
        f"(looked in {tmp_path / 'a'}, {tmp_path / 'b'} too)"
    )


def test_a_config_finds_its_evaluator_and_plugin_beside_it(
    tmp_path: Path, fresh_modules: list[str], monkeypatch
):
    fresh_modules.extend(["rs_uc_eval", "rs_uc_plugin"])
    folder = tmp_path / "config"
    _module(folder, "rs_uc_eval", 0.5)
    (folder / "rs_uc_plugin.py").write_text("LOADED = True\n")
    make_mlp_model(folder / "mlp.onnx")
    np.savez(folder / "calib.npz", **mlp_data(8))
    monkeypatch.chdir(tmp_path)
    raw = {
        "model": "mlp.onnx",
        "calibration_data": "calib.npz",
        "search_space": {"per_channel": [True]},
        "metric": "rs_uc_eval:score",
        "higher_is_better": True,
        "plugins": ["rs_uc_plugin"],
    }
    config = SearchConfig.from_dict(raw, base_dir=folder)
    assert config.code_dirs == (folder, tmp_path)
    assert config.load_evaluator()("m", []) == 0.5
    assert config.code_modules() == ["rs_uc_eval", "rs_uc_plugin"]
    assert local_modules(config.code_modules(), config.code_dirs) == [
        folder / "rs_uc_eval.py",
        folder / "rs_uc_plugin.py",
    ]
    for name in fresh_modules:
        del sys.modules[name]
    with pytest.raises(ConfigError, match=r"plugins\[0\]: cannot import 'rs_uc_plugin'"):
        SearchConfig.from_dict(raw, base_dir=folder, code_dirs=[tmp_path / "other"])
    with pytest.raises(ConfigError, match="metric: cannot import module 'rs_uc_eval'"):
        SearchConfig.from_dict({**raw, "plugins": None}, base_dir=folder, code_dirs=[])
    import_plugins(["rs_uc_plugin"], search_dirs=[folder])
    assert sys.modules["rs_uc_plugin"].LOADED
