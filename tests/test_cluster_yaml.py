"""cluster.yaml stays a valid Ray cluster launcher config (Ray's own schema validation)."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

CLUSTER_YAML = Path(__file__).resolve().parents[1] / "cluster.yaml"


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
    assert any("pip install ~/raysearch" in c for c in cluster["setup_commands"])


def test_a_broken_copy_fails_validation(cluster):
    broken = copy.deepcopy(cluster)
    broken["available_node_types"]["worker.gpu1"]["min_workers"] = "two"
    with pytest.raises(jsonschema.ValidationError, match="'two' is not of type 'integer'"):
        validate_config(broken)
    unknown_head = copy.deepcopy(cluster)
    unknown_head["head_node_type"] = "head.gpu"
    with pytest.raises(ValueError, match="head_node_type"):
        validate_config(unknown_head)
