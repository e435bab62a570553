"""``tune_state_intact``: the newest of each file Ray Tune's restore reads must load, in a
folder and behind a URI (a real pyarrow file system, ``file://``)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from raysearch.search.tune._tuner import tune_state_intact

STAMPS = ("2026-11-24_00-41-48", "2026-11-24_00-41-50")


def _saved(folder: Path) -> None:
    """Two saves of an experiment, as Tune names them (the newest sorts last)."""
    folder.mkdir()
    for stamp in STAMPS:
        (folder / f"experiment_state-{stamp}.json").write_text(json.dumps({"trial_data": []}))
        (folder / f"search_gen_state-{stamp}.json").write_bytes(pickle.dumps({"counter": 3}))
        (folder / f"searcher-state-{stamp}.pkl").write_bytes(pickle.dumps({"done": {}}))


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("as_uri", [False, True])
@pytest.mark.parametrize(
    "kind", ["experiment_state-{}.json", "search_gen_state-{}.json", "searcher-state-{}.pkl"]
)
def test_a_newest_file_cut_short_is_found(tmp_path: Path, as_uri: bool, kind: str):
    folder = tmp_path / "search"
    _saved(folder)
    where = folder.as_uri() if as_uri else str(folder)
    assert tune_state_intact(where)
    _cut(folder / kind.format(STAMPS[0]))  # an older save: Tune reads only the newest
    assert tune_state_intact(where)
    _cut(folder / kind.format(STAMPS[1]))
    assert not tune_state_intact(where)


def test_nothing_saved_yet_is_not_a_torn_state(tmp_path: Path):
    assert tune_state_intact(str(tmp_path / "absent"))
    assert tune_state_intact((tmp_path / "absent").as_uri())
    (tmp_path / "empty").mkdir()
    assert tune_state_intact(str(tmp_path / "empty"))


def test_a_state_naming_a_module_missing_here_stops_the_resume(tmp_path: Path, monkeypatch):
    """A whole state whose pickle names a module that cannot be imported is not a torn file:
    the resume stops with one line naming the module, and goes on once it is back."""
    import importlib
    import sys

    from raysearch.search.tune._tuner import MissingModuleError

    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "gone_plugin.py").write_text("class Phase:\n    pass\n")
    monkeypatch.syspath_prepend(str(plugins))
    module = importlib.import_module("gone_plugin")
    folder = tmp_path / "search"
    _saved(folder)
    newest = folder / f"searcher-state-{STAMPS[1]}.pkl"
    newest.write_bytes(pickle.dumps({"phases": [module.Phase()]}))
    (plugins / "gone_plugin.py").rename(tmp_path / "gone_plugin.py")
    del sys.modules["gone_plugin"]
    importlib.invalidate_caches()

    with pytest.raises(MissingModuleError) as stopped:
        tune_state_intact(str(folder))
    assert str(stopped.value) == (
        f"{folder}: Ray Tune's saved state searcher-state-{STAMPS[1]}.pkl needs the module"
        " 'gone_plugin', which cannot be imported here (No module named 'gone_plugin'); make it"
        " importable (install it, or put it beside the config) and resume again"
    )
    (tmp_path / "gone_plugin.py").rename(plugins / "gone_plugin.py")
    importlib.invalidate_caches()
    assert tune_state_intact(str(folder))
    sys.modules.pop("gone_plugin", None)
