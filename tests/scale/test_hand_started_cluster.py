"""A cluster started by hand as the README says (issue 58, item 3), on Ray 2.60's token
authentication: the README's "A cluster started by hand" steps, run as written on this machine
(``HEAD_IP`` is 127.0.0.1, the head's port a free one, each node's ``ray start`` with the
options :class:`tests.nodes.NodeCluster` adds so that the test stops exactly its own nodes),
in a home folder of their own (Ray keeps its token in ``~/.ray``): the head, one worker and a
search that joins them."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.models import conv_data, make_conv_model
from tests.nodes import NodeCluster, _free_port

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_steps(port: int) -> dict[str, str]:
    """The README's three scripts (head, worker, search), keyed by where they run, with
    ``HEAD_IP`` and the port made this machine's."""
    section = README.read_text().split("**A cluster started by hand.**", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    block = block.replace("HEAD_IP", "127.0.0.1").replace("6379", str(port))
    parts = re.split(
        r"^# (on the head node|on each worker node|where the search runs).*$", block, flags=re.M
    )
    steps = dict(zip(parts[1::2], (p.strip() for p in parts[2::2])))
    assert list(steps) == ["on the head node", "on each worker node", "where the search runs"]
    return {
        "head": steps["on the head node"],
        "worker": steps["on each worker node"],
        "search": steps["where the search runs"],
    }


def write_search_config(work: Path, name: str, **extra: Any) -> Path:
    """A four-setting Grid search of the tests' small conv model, one trial per node's CPU."""
    model = work / "conv.onnx"
    data = work / "data.npz"
    if not model.exists():
        make_conv_model(model, channels=8, size=16)
        np.savez(data, **conv_data(64))
    config = {
        "model": str(model),
        "calibration_data": str(data),
        "search_algo": "Grid",
        "metric": "cos",
        "early_stopping": False,
        "measure_latency": False,
        "search_space": {
            "calibrate_method": ["MinMax", "Percentile"],
            "per_channel": [True, False],
        },
        "resources": {"cpu_per_trial": 1},
        "output_dir": str(work / name),
        **extra,
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run_search(cluster: NodeCluster, work: Path, script: str, env: dict[str, str]) -> Any:
    return subprocess.run(
        ["bash", "-c", script],
        cwd=work,
        env={**cluster.env, **env},
        capture_output=True,
        text=True,
        timeout=420,
    )


@pytest.fixture(scope="module")
def hand_started(tmp_path_factory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("hand_started")
    home = work / "home"
    home.mkdir()
    env = {"HOME": str(home)}
    steps = readme_steps(_free_port())
    with NodeCluster(auth=False) as cluster:
        cluster.start("head", num_cpus=1, script=steps["head"], cwd=work, env=env)
        cluster.start("worker", num_cpus=1, script=steps["worker"], cwd=work, env=env)
        write_search_config(work, "my_config")
        done = run_search(cluster, work, steps["search"], env)
        yield {"work": work, "done": done, "cluster": cluster, "env": env, "steps": steps}


def test_the_readme_steps_make_a_cluster_a_search_joins(hand_started):
    done, work = hand_started["done"], hand_started["work"]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    token = (work / "ray_token").read_text().strip()
    assert len(token) >= 32
    assert (work / "home" / ".ray" / "auth_token").read_text().strip() == token
    out = work / "my_config"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_trials"] == 4 and summary["n_failed"] == 0
    # The search ran on the cluster the two nodes make (one CPU each), not a Ray of its own.
    assert summary["kept_warm"] is not None  # (None: a Ray of the search's own)
    log = (out / "auto_search.log").read_text()
    assert "running up to 2 trials at once" in log


def test_without_the_token_a_worker_is_refused(hand_started, tmp_path):
    # What the README's exports are for: a worker with no token is refused by the head.
    cluster, steps = hand_started["cluster"], hand_started["steps"]
    script = "\n".join(
        line for line in steps["worker"].splitlines() if not line.startswith("export ")
    )
    home = tmp_path / "home"
    home.mkdir()
    with pytest.raises(AssertionError, match="(?i)auth"):
        cluster.start(
            "stranger",
            num_cpus=1,
            script=script,
            cwd=hand_started["work"],
            env={"HOME": str(home)},
            timeout=120,
        )
