"""The technique seam, worked from outside the package: toy techniques registered by a module
under ``tests/plugins`` are switched on in a search space and take effect in the models a real
search (real Ray) writes; no ``raysearch/`` module knows them."""

from __future__ import annotations

import subprocess

import onnx
import pytest

from raysearch.search import AutoSearch
from tests.plugins.technique_fixture import registered_toy_techniques
from tests.search.conftest import REPO, make_config, mlp_files  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]


@pytest.fixture
def toys():
    with registered_toy_techniques() as module:
        yield module


def test_a_search_switches_toy_techniques_on_and_they_take_effect(toys, request):
    build = request.getfixturevalue("make_config")
    space = {
        "calibrate_method": ["MinMax"],
        "include_toy_identity": [True, False],
        "toy_identity_count": [2],
        "include_toy_float_tail": [True, False],
    }
    # Every trial's model is read below: keep every candidate's.
    config = build(search_space=space, tolerance=10.0, measure_latency=False, keep_candidates=True)
    result = AutoSearch(config).run()
    rows = result.results.to_pylist()
    assert [r["status"] for r in rows] == ["ok"] * 4, [r.get("error") for r in rows]
    for row in rows:
        model = onnx.load(str(result.output_dir / row["model_file"]))
        nodes = {n.name: n for n in model.graph.node}
        # The float transform ran in the actor: its Identity nodes are in the quantized model.
        identity = {"toy_identity_0", "toy_identity_1"} <= set(nodes)
        assert identity is row["params/include_toy_identity"]
        # The override producer kept the last MatMul's weight in float only when switched on.
        assert (nodes["fc2"].input[1] == "w2") is row["params/include_toy_float_tail"]


def test_no_raysearch_module_names_the_toy_techniques():
    found = subprocess.run(
        ["git", "grep", "-l", "-e", "toy_identity", "-e", "toy_float_tail", "--", "raysearch"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert found.stdout == ""
