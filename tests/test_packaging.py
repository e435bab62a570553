"""Every package under raysearch/ is listed in pyproject.toml: setuptools installs only the
listed ones, so a package left out is missing from a non-editable install.

The sdist and the wheel built from this tree (once per module, from a copy of it) carry what
they must: the wheel its license files, ``py.typed``, the predefined spaces and the demo's
model; the sdist its test suite (conftest files and helper modules), the files the tests read
and the license. Both build without a setuptools warning and carry raysearch's one version
(``raysearch.__version__``). The predefined spaces load from a source tree that is not
installed, and from the installed wheel.
"""

from __future__ import annotations

import email
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from email.message import Message
from importlib import metadata
from pathlib import Path

import pytest
import tomllib

import raysearch

ROOT = Path(__file__).resolve().parents[1]
#: Not part of a source tree: what a checkout or a run leaves beside it.
_NOT_SOURCE_PATTERNS = shutil.ignore_patterns(
    "__pycache__",
    "*.py[cod]",
    "*.egg-info",
    "build",
    "dist",
    "raysearch_output",
    "gpu_data",
    "*.tmp",
)
#: The one hidden folder of the source tree: CI's command, which the sdist carries.
_HIDDEN_SOURCE = {".ci"}


def _not_source(folder: str, names: list[str]) -> set[str]:
    """What a copy of the tree leaves out: the patterns above, and every hidden entry but
    :data:`_HIDDEN_SOURCE` (``.git``, the tools' caches, virtual environments such as
    ``.venv-genai``: gigabytes a checkout may keep beside its sources, which no build reads)."""
    hidden = {name for name in names if name.startswith(".") and name not in _HIDDEN_SOURCE}
    return hidden | set(_NOT_SOURCE_PATTERNS(folder, names))


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_of_the_source_tree_is_installed():
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "raysearch").rglob("__init__.py")
    }
    assert found <= listed, sorted(found - listed)


def test_the_version_is_written_once():
    project = _pyproject()["project"]
    assert "version" not in project and "version" in project["dynamic"]
    attr = _pyproject()["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "raysearch.__version__"


def test_the_copy_to_build_leaves_out_what_a_checkout_keeps_beside_its_sources(tmp_path):
    tree = tmp_path / "tree"
    kept = ["pyproject.toml", ".ci/run", "raysearch/__init__.py", "tests/conftest.py"]
    left_out = [
        ".git/HEAD",
        ".venv/bin/python",
        ".venv-genai/lib/big.so",
        ".gpucarry/model.onnx",
        ".ruff_cache/0.1/x",
        ".grimp_cache/x.json",
        "raysearch/__pycache__/x.pyc",
        "raysearch.egg-info/PKG-INFO",
        "dist/raysearch.whl",
        "gpu_data/x.npz",
    ]
    for name in kept + left_out:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(name)
    shutil.copytree(tree, tmp_path / "copy", ignore=_not_source)
    copied = {str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*")}
    assert {p for p in copied if (tmp_path / "copy" / p).is_file()} == set(kept)


@dataclass
class Built:
    sdist: Path
    wheel: Path
    log: str


def _setuptools_can_build() -> bool:
    """Whether this environment's setuptools meets pyproject's build requirement (77: the
    license as an SPDX expression), so that the build needs no isolated environment."""
    try:
        major = int(metadata.version("setuptools").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return major >= 77


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The sdist, and the wheel built from it, of a copy of this tree (a build writes beside
    its sources); ``python -m build``'s output, the backend's included."""
    pytest.importorskip("build", reason="the test extra installs `build`")
    work = tmp_path_factory.mktemp("build")
    source, out = work / "source", work / "dist"
    shutil.copytree(ROOT, source, ignore=_not_source)
    command = [sys.executable, "-m", "build", "--outdir", str(out), str(source)]
    if _setuptools_can_build():  # offline and faster; else an isolated build environment
        command.insert(3, "--no-isolation")
    # Without PYTHONDONTWRITEBYTECODE: its "byte-compiling is disabled" notes are this
    # environment's, not the project's.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    (sdist,) = out.glob("raysearch-*.tar.gz")
    (wheel,) = out.glob("raysearch-*.whl")
    return Built(sdist, wheel, log)


def test_the_build_warns_of_nothing(built: Built):
    warned = [
        line
        for line in built.log.splitlines()
        if "warning" in line.lower() or "deprecat" in line.lower()
    ]
    assert not warned, "\n".join(warned)


def _wheel_metadata(wheel: Path) -> tuple[set[str], Message]:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (info,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        return names, email.message_from_bytes(archive.read(info))


def test_the_wheel_ships_licenses_types_spaces_and_the_demo_model(built: Built):
    names, meta = _wheel_metadata(built.wheel)
    info = f"raysearch-{raysearch.__version__}.dist-info"
    assert {f"{info}/licenses/LICENSE", f"{info}/licenses/raysearch/demo/magika/NOTICE.md"} <= names
    assert meta["License-Expression"] == "Apache-2.0"
    assert "raysearch/py.typed" in names
    spaces = {f"raysearch/configs/{p.name}" for p in (ROOT / "configs").glob("*.yaml")}
    assert spaces and spaces <= names
    assert "raysearch/demo/magika/model.onnx" in names
    assert meta["Version"] == raysearch.__version__


def test_the_sdist_holds_the_test_suite_and_what_it_reads(built: Built):
    prefix = f"raysearch-{raysearch.__version__}/"
    with tarfile.open(built.sdist) as archive:
        names = {m.name.removeprefix(prefix) for m in archive.getmembers() if m.isfile()}
        meta = email.message_from_bytes(archive.extractfile(prefix + "PKG-INFO").read())
    assert meta["Version"] == raysearch.__version__
    tests = {
        str(p.relative_to(ROOT))
        for folder in ("tests", "benchmarks", "configs")
        for p in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert {"tests/conftest.py", "tests/models.py", "tests/search/conftest.py"} <= tests
    assert tests <= names, sorted(tests - names)
    read_by_tests = {"README.md", "DEVELOPERS.md", ".ci/run", "cluster.yaml", "pyproject.toml"}
    assert read_by_tests | {"LICENSE", "raysearch/py.typed"} <= names
    assert {f"configs/{p.name}" for p in (ROOT / "configs").glob("*.yaml")} <= names


#: Run in a child: raysearch imported without an install (setuptools' editable finder, which
#: maps the package onto this checkout, is dropped), and what it finds.
_PLAIN_IMPORT = """
import json, sys
sys.meta_path[:] = [
    f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")
]
from importlib import resources
import raysearch
from raysearch.config import predefined_spaces
print(json.dumps({
    "raysearch": raysearch.__file__,
    "spaces": {name: str(path) for name, path in predefined_spaces().items()},
    "quickstart": (resources.files("raysearch.configs") / "quickstart.yaml").is_file(),
    "typed": (resources.files("raysearch") / "py.typed").is_file(),
}))
"""


def _import_from(folder: Path, cwd: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(folder)}
    done = subprocess.run(
        [sys.executable, "-c", _PLAIN_IMPORT],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _predefined_names() -> set[str]:
    return {p.stem for p in (ROOT / "configs").glob("*.yaml") if p.stem.isupper()}


def test_predefined_spaces_load_from_a_source_tree_that_is_not_installed(tmp_path: Path):
    found = _import_from(ROOT, tmp_path)
    assert Path(found["raysearch"]).is_relative_to(ROOT)
    assert set(found["spaces"]) == _predefined_names()
    assert all(Path(p).parent == ROOT / "configs" for p in found["spaces"].values())
    assert found["quickstart"] and found["typed"]


def test_predefined_spaces_load_from_the_installed_wheel(built: Built, tmp_path: Path):
    site = tmp_path / "site"  # a pure-Python wheel unpacked is its installed layout
    with zipfile.ZipFile(built.wheel) as archive:
        archive.extractall(site)
    found = _import_from(site, tmp_path)
    assert Path(found["raysearch"]).is_relative_to(site)
    assert set(found["spaces"]) == _predefined_names()
    assert all(Path(p).parent == site / "raysearch" / "configs" for p in found["spaces"].values())
    assert found["quickstart"] and found["typed"]
