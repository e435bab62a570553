"""Every package under raysearch/ is listed in pyproject.toml: setuptools installs only the
listed ones, so a package left out is missing from a non-editable install."""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_of_the_source_tree_is_installed():
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "raysearch").rglob("__init__.py")
    }
    assert found <= listed, sorted(found - listed)
