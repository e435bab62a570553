"""What raysearch reads from users is never executed or unpickled: YAML with ``safe_load``,
``.npy``/``.npz`` with ``allow_pickle=False``, no ``eval``/``exec``; code runs only from the
import path a config names, and the README says so."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from raysearch.data import DataError, DataSource
from tests.reliability.helpers import REPO

SOURCES = sorted((REPO / "raysearch").rglob("*.py"))


def _calls(path: Path) -> Iterator[tuple[str, ast.Call]]:
    """``(dotted name of the callee, call)`` of every call in ``path``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            yield ast.unparse(node.func), node


def _where(path: Path, call: ast.Call) -> str:
    return f"{path.relative_to(REPO)}:{call.lineno}"


def test_the_sources_are_scanned():
    assert len(SOURCES) > 20 and any(p.name == "data.py" for p in SOURCES)


def test_yaml_is_only_read_with_safe_load():
    unsafe = [
        _where(path, call)
        for path in SOURCES
        for name, call in _calls(path)
        if name.startswith("yaml.") and "load" in name and name != "yaml.safe_load"
    ]
    assert unsafe == []
    assert any(name == "yaml.safe_load" for p in SOURCES for name, _ in _calls(p))


def test_numpy_files_are_never_loaded_with_pickle():
    loads = [(p, c) for p in SOURCES for name, c in _calls(p) if name in ("np.load", "numpy.load")]
    assert loads, "no np.load found: the scan is broken"
    for path, call in loads:
        flags = {k.arg: k.value for k in call.keywords}
        assert "allow_pickle" in flags, _where(path, call)
        value = flags["allow_pickle"]
        assert isinstance(value, ast.Constant) and value.value is False, _where(path, call)


def test_nothing_is_evaluated_and_only_raysearch_checkpoints_are_unpickled():
    found = {
        (path.relative_to(REPO).as_posix(), name)
        for path in SOURCES
        for name, _ in _calls(path)
        if name in ("eval", "exec", "compile", "__import__", "runpy.run_path")
        or name.startswith(("pickle.load", "cloudpickle.load", "marshal.load", "shelve."))
        or name.endswith("spec_from_file_location")
    }
    # The searcher's own state, written by its save() into Tune's experiment folder.
    assert found <= {("raysearch/search/searchers.py", "pickle.load")}, found


def test_dynamic_imports_take_the_path_as_written():
    """``importlib.import_module`` is the only way raysearch loads code by name; the custom
    evaluator's module name goes to it unchanged (tested in test_bad_input: a module beside
    the config is not found)."""
    importers = {
        path.relative_to(REPO).as_posix()
        for path in SOURCES
        for name, _ in _calls(path)
        if name.endswith("import_module")
    }
    assert "raysearch/evaluate.py" in importers
    text = (REPO / "raysearch" / "evaluate.py").read_text()
    assert "importlib.import_module(module_name)" in text
    assert "sys.path" not in text and "sys.path" not in (REPO / "raysearch/config.py").read_text()


@pytest.mark.parametrize("suffix", [".npy", ".npz"])
def test_a_pickled_object_array_is_refused_without_unpickling(tmp_path: Path, suffix: str):
    marker = tmp_path / "unpickled"
    payload = np.empty(2, dtype=object)
    payload[:] = [_Boom(str(marker)), _Boom(str(marker))]
    path = tmp_path / f"x{suffix}"
    if suffix == ".npy":
        np.save(path, payload, allow_pickle=True)
    else:
        np.savez(path, x=payload)
    with pytest.raises(DataError, match=r"holds Python objects \(pickled\)"):
        DataSource.load(path, _inputs())
    assert not marker.exists()


class _Boom:
    """Unpickling it would create ``marker``: proof that nothing was unpickled."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def _inputs():
    from raysearch.data import ModelInput

    return [ModelInput("x", np.dtype(np.float32), ("N", 4))]


def test_the_readme_says_a_config_names_code_to_run():
    text = " ".join((REPO / "README.md").read_text().split())
    assert "A config names code to run" in text
    assert "imported from exactly the path written there" in text
    assert "Only use configs you trust" in text
    assert "yaml.safe_load" in text and "data files are never unpickled" in text
