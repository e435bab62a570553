"""The README's install-and-test command is what CI runs, and it installs what the suite needs
(PyTorch for the GPS sampler, as a CPU build) without pinning that build for users."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _command(text: str) -> str:
    """The shell command that starts with ``python3 -m venv .venv`` and ends with ``pytest``
    and its options, its continuation lines joined."""
    match = re.search(r"^python3 -m venv \.venv.*?-m pytest\b[^\n]*$", text, re.S | re.M)
    assert match, "no install-and-test command found"
    return re.sub(r"\\\n\s*", "", match.group(0))


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("Install and run the tests", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return _command(block)


def test_ci_runs_exactly_the_readme_command():
    assert _command((ROOT / ".ci" / "run").read_text()) == _readme_test_command()


def test_test_command_installs_a_cpu_torch_before_the_gp_extra():
    command = _readme_test_command()
    cpu = command.find("pip install 'torch==2.13.0+cpu'")
    extra = command.find("pip install -e '.[test,gp,nncf]'")
    assert cpu != -1 and extra != -1, command
    # torch first: the extra then finds it satisfied and pulls no CUDA build.
    assert cpu < extra


def test_users_get_the_normal_torch_wheel():
    """The CPU pin lives only in the test command: the package's own extras ask for plain
    ``torch`` (no local version label such as ``+cpu``)."""
    requires = metadata.requires("raysearch") or []
    torch = [r for r in requires if r.startswith("torch")]
    assert {r.split(";")[1].strip() for r in torch} == {'extra == "gp"', 'extra == "finetune"'}
    assert all("+" not in r.split(";")[0] for r in torch), torch
