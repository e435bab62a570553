"""cluster.yaml stays a valid Ray cluster launcher config (Ray's own schema validation), installs
what the launcher needs on every node, and every command it and the README give is one Ray's
command line (and raysearch's) parses as written. Nothing is launched: each command is parsed
by the CLI's own click (argparse for raysearch) parser, the way `ray CMD --help` would read it."""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path

import click
import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from raysearch import cli as raysearch_cli

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_YAML = ROOT / "cluster.yaml"
#: The README's section on clusters (up to the next section).
README_CLUSTERS = re.search(
    r"## GPUs, clusters and many models\n(.*?)\n## ", (ROOT / "README.md").read_text(), re.S
).group(1)


@pytest.fixture
def cluster() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def test_cluster_yaml_passes_ray_schema_validation(cluster):
    validate_config(cluster)
    validate_config(prepare_config(copy.deepcopy(cluster)))


def test_cluster_yaml_has_a_cpu_head_and_autoscaling_gpu_workers(cluster):
    types = cluster["available_node_types"]
    head = types[cluster["head_node_type"]]
    assert "GPU" not in head["resources"]
    gpus = sorted(
        t["resources"].get("GPU", 0) for n, t in types.items() if n != cluster["head_node_type"]
    )
    assert gpus == [1, 4]
    assert all(t.get("min_workers", 0) == 0 for t in types.values())


def test_every_node_installs_raysearch_with_the_launchers_extra(cluster):
    # setup_commands run on the head and on every worker: raysearch from the copy file_mounts
    # makes, with the extra that brings the autoscaler's AWS dependencies.
    assert cluster["file_mounts"]["~/raysearch"] == "."
    assert 'python3 -m pip install "$HOME/raysearch[aws]"' in " ".join(cluster["setup_commands"])
    # (pyproject.toml read as text: tomllib is Python 3.11+, raysearch supports 3.10.)
    aws = re.search(r"^aws = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    names = {re.match(r"[\w\[\]-]+", d).group(0) for d in re.findall(r'"([^"]+)"', aws)}
    assert names == {"ray[default]", "boto3"}


def test_every_node_type_names_a_current_image(cluster):
    # Without ImageId Ray falls back to its built-in Ubuntu 18.04 AMI (Python 3.6/3.7).
    for name, node_type in cluster["available_node_types"].items():
        image = node_type["node_config"].get("ImageId", "")
        assert image.startswith("resolve:ssm:/aws/service/deeplearning/ami/x86_64/"), name
        assert "ubuntu-22.04" in image or "ubuntu-24.04" in image, name


def test_the_aws_node_provider_imports():
    # `ray up` and the head's autoscaler load Ray's AWS node provider, which imports boto3 and
    # botocore (the extra aws; the test extra installs boto3 too).
    pytest.importorskip("boto3", reason="boto3 (extra aws) is not installed")
    from ray.autoscaler._private.providers import _get_node_provider_cls

    provider = _get_node_provider_cls({"type": "aws"})
    assert provider.__name__ == "AWSNodeProvider"


def _commands(text: str, prefix: str = "") -> list[list[str]]:
    """Each ``ray``, ``raysearch`` or ``pip`` command line of ``text`` (lines starting with
    ``prefix`` then the command), split as a shell splits it, without trailing comments."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith(prefix):
            continue
        line = line[len(prefix) :].strip()
        if line.split(" ", 1)[0] in {"ray", "pip"}:
            found.append(shlex.split(line, comments=True))
    return found


def _parse_ray(argv: list[str]) -> click.Context:
    """Parse ``ray ...`` with Ray's own click command (no command runs); click's usage error
    for a line Ray's CLI refuses."""
    from ray.scripts.scripts import cli

    assert argv[0] == "ray"
    name, *rest = argv[1:]
    command = cli.get_command(click.Context(cli), name)
    assert command is not None, f"ray has no command {name!r}"
    return command.make_context(f"ray {name}", rest)


def _parse_raysearch(command: str) -> None:
    """Parse the ``raysearch ...`` part of a shell command line with raysearch's parser."""
    part = next(p for p in command.split("&&") if p.strip().startswith("raysearch "))
    argv = shlex.split(part)[1:]
    raysearch_cli._build_parser().parse_args(argv)


def _check_commands(commands: list[list[str]]) -> set[str]:
    seen = set()
    for argv in commands:
        if argv[0] == "pip":
            assert argv[1:] == ["install", "-e", ".[aws]"], argv
            continue
        context = _parse_ray(argv)
        seen.add(argv[1])
        if argv[1] == "exec":
            _parse_raysearch(context.params["cmd"])
        if argv[1] in {"rsync-up", "rsync-down"}:
            assert context.params["source"] and context.params["target"], argv
        if argv[1] == "exec":
            # The search outlives the SSH session.
            assert context.params["tmux"] or context.params["screen"], argv
    return seen


def test_the_readme_cluster_commands_parse_as_written():
    (block,) = re.findall(r"```bash\n(pip install -e '\.\[aws\]'.*?)```", README_CLUSTERS, re.S)
    seen = _check_commands(_commands(block))
    assert seen == {"up", "rsync-up", "exec", "attach", "rsync-down", "down"}


def test_the_cluster_yaml_header_commands_parse_as_written():
    seen = _check_commands(_commands(CLUSTER_YAML.read_text(), prefix="#"))
    assert seen == {"up", "rsync-up", "exec", "attach", "rsync-down", "down"}
    # And the header shows the README's commands, not others.
    readme = {shlex.join(c) for c in _commands(README_CLUSTERS)}
    header = {shlex.join(c) for c in _commands(CLUSTER_YAML.read_text(), prefix="#")}
    assert header <= readme


def test_the_node_start_commands_parse_as_written(cluster):
    lines = cluster["head_start_ray_commands"] + cluster["worker_start_ray_commands"]
    starts = [shlex.split(line.split(";")[-1]) for line in lines]
    assert [argv[:2] for argv in starts] == [["ray", "stop"], ["ray", "start"]] * 2
    for argv in starts:
        _parse_ray(argv)


def test_a_command_ray_refuses_fails_the_check():
    # What the README said before: rsync-up takes one source and one target.
    with pytest.raises(click.UsageError, match=r"unexpected extra argument \(~/work/\)"):
        _parse_ray(shlex.split("ray rsync-up cluster.yaml my_config.yaml data/ ~/work/"))
    with pytest.raises(SystemExit):
        _parse_raysearch("cd ~/work && raysearch run my_config.yaml --adress auto")


def test_a_broken_copy_fails_validation(cluster):
    broken = copy.deepcopy(cluster)
    broken["available_node_types"]["worker.gpu1"]["min_workers"] = "two"
    with pytest.raises(jsonschema.ValidationError, match="'two' is not of type 'integer'"):
        validate_config(broken)
    unknown_head = copy.deepcopy(cluster)
    unknown_head["head_node_type"] = "head.gpu"
    with pytest.raises(ValueError, match="head_node_type"):
        validate_config(unknown_head)
