"""What raysearch reads from users is never executed or unpickled: YAML with ``safe_load``,
``.npy``/``.npz`` with ``allow_pickle=False``, no ``eval``/``exec``; code runs only from the
module names a config writes (installed, else beside the config or in the working directory,
never by changing ``sys.path``), and the README says so."""

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
    assert len(SOURCES) > 20 and any(p.name == "_data.py" for p in SOURCES)


def _safe_loader_call(path: Path, call: ast.Call) -> bool:
    """Whether ``call`` is ``yaml.load(..., Loader=X)`` with X a class of ``path``'s module
    that derives from ``yaml.SafeLoader`` (the config reader's, which reads ``1e-3`` as a
    number): as safe as ``yaml.safe_load``."""
    import importlib

    import yaml

    loader = next((k.value for k in call.keywords if k.arg == "Loader"), None)
    if ast.unparse(call.func) != "yaml.load" or not isinstance(loader, ast.Name):
        return False
    module = ".".join(path.relative_to(REPO).with_suffix("").parts)
    cls = getattr(importlib.import_module(module), loader.id, None)
    return isinstance(cls, type) and issubclass(cls, yaml.SafeLoader)


def test_yaml_is_only_read_with_safe_load():
    unsafe = [
        _where(path, call)
        for path in SOURCES
        for name, call in _calls(path)
        if name.startswith("yaml.")
        and "load" in name
        and name != "yaml.safe_load"
        and not _safe_loader_call(path, call)
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
    # The searcher's own state, written by its save() into Tune's experiment folder; and
    # raysearch's own configs/ package (the predefined spaces) in a source tree not installed,
    # loaded from the file beside the package, never from a path a config names; and a metric
    # function given from Python, pickled by the driver for the trials inside the Evaluator
    # that Ray sends them (never bytes read from a file); and the jobs and answers of the
    # latency timer and the plot process, through the pipes between the driver and the
    # process it started.
    assert found <= {
        ("raysearch/jobprocess.py", "pickle.load"),
        ("raysearch/outputs/_plot_render.py", "pickle.load"),
        ("raysearch/search/tune/searchers.py", "pickle.load"),
        ("raysearch/_source_tree.py", "importlib.util.spec_from_file_location"),
        ("raysearch/evaluate/_evaluator.py", "pickle.loads"),
    }, found


def test_code_a_config_names_is_imported_by_one_helper_that_never_changes_sys_path():
    """The custom evaluator and the plugins are imported by ``usercode.import_named`` only: the
    name goes to ``importlib.import_module`` unchanged, and a module Python does not find is
    looked up by a finder given just the config's folder and the working directory (tested in
    test_bad_input: a module beside the config is found, an installed one of the same name
    wins). No source changes ``sys.path``, so nothing else in those folders shadows a module."""
    users = {
        path.relative_to(REPO).as_posix()
        for path in SOURCES
        for name, _ in _calls(path)
        if name == "import_named"
    }
    assert {"raysearch/evaluate/_custom.py", "raysearch/usercode.py"} <= users
    text = (REPO / "raysearch" / "usercode.py").read_text()
    assert "importlib.import_module(name)" in text
    assert "PathFinder.find_spec(top, folders)" in text
    changes = [
        _where(path, node)
        for path in SOURCES
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if (isinstance(node, ast.Call) and ast.unparse(node.func).startswith("sys.path."))
        or (
            isinstance(node, (ast.Assign, ast.AugAssign))
            and any(
                ast.unparse(t).startswith("sys.path")
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            )
        )
    ]
    assert changes == []


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
    assert "from the config's folder, then the working directory" in text
    assert "Only use configs and output folders you trust" in text
    assert "yaml.safe_load" in text and "data files are never unpickled" in text
