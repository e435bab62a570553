"""Reading a batch manifest (no Ray): a model whose config holds several mistakes keeps them
all, on one line, as its reason in the batch summary; a model's own time limit."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import yaml

from raysearch.batch import BatchManifest
from raysearch.errors import ConfigError
from tests.models import make_mlp_model, mlp_data


def test_a_model_config_with_several_mistakes_gets_one_line_naming_each(tmp_path):
    make_mlp_model(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "mlp.npz", **mlp_data(16))
    bad = {"name": "bad", "model": "mlp.onnx", "calibration_data": "mlp.npz"}
    bad.update(metric="cosine_typo")  # and no search_space
    manifest = {"models": [bad], "output_dir": str(tmp_path / "out")}
    (tmp_path / "batch.yaml").write_text(yaml.safe_dump(manifest))
    (entry,) = BatchManifest.load(tmp_path / "batch.yaml").models
    assert entry.config is None and "\n" not in entry.error
    assert entry.error.startswith("models[0]: ")
    assert "search_space: is required" in entry.error
    assert "; metric: unknown metric 'cosine_typo'" in entry.error


def test_a_model_sets_its_own_time_limit_over_the_manifests(tmp_path):
    make_mlp_model(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "mlp.npz", **mlp_data(16))
    common = {"model": "mlp.onnx", "calibration_data": "mlp.npz"}
    manifest = {
        "output_dir": str(tmp_path / "out"),
        "model_timeout_s": 600,
        "defaults": {"search_space": {"per_channel": [True, False]}, "metric": "cos"},
        "models": [{"name": "big", "model_timeout_s": 7200, **common}, {"name": "small", **common}],
    }
    (tmp_path / "batch.yaml").write_text(yaml.safe_dump(manifest))
    loaded = BatchManifest.load(tmp_path / "batch.yaml")
    big, small = loaded.models
    assert (big.timeout_s, small.timeout_s, loaded.model_timeout_s) == (7200.0, None, 600.0)
    assert big.config is not None and "model_timeout_s" not in big.raw  # not the search's key

    manifest["models"][0]["model_timeout_s"] = 0
    (tmp_path / "batch.yaml").write_text(yaml.safe_dump(manifest))
    with pytest.raises(ConfigError) as error:
        BatchManifest.load(tmp_path / "batch.yaml")
    assert str(error.value) == "models[0].model_timeout_s: expected a number of seconds > 0, got 0"


def test_the_batch_cluster_is_the_manifests_address_or_the_command_lines(
    tmp_path, capsys, monkeypatch
):
    """``address`` is a key of the manifest (a string), never of a model's config (every
    search of a batch runs on the batch's cluster); ``raysearch batch --address`` names it
    too, and a cluster that does not answer is bad input: exit 2 before anything is written."""
    from raysearch.cli import main

    make_mlp_model(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "mlp.npz", **mlp_data(16))
    entry = {"name": "mlp", "model": "mlp.onnx", "calibration_data": "mlp.npz"}
    manifest = {
        "output_dir": str(tmp_path / "out"),
        "address": "auto",
        "defaults": {"search_space": {"per_channel": [True, False]}, "metric": "cos"},
        "models": [entry],
    }
    path = tmp_path / "batch.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert BatchManifest.load(path).address == "auto"
    assert BatchManifest.load(path, address="10.0.0.1:6379").address == "10.0.0.1:6379"

    path.write_text(yaml.safe_dump({**manifest, "address": 6379}))
    with pytest.raises(ConfigError) as error:
        BatchManifest.load(path)
    assert (
        str(error.value) == "address: expected 'auto', 'host:port' or 'ray://host:port', got 6379"
    )

    for where in ("defaults", "models"):
        model = {**entry, "address": "auto"} if where == "models" else entry
        defaults = {**manifest["defaults"], "address": "auto"} if where == "defaults" else None
        bad = {**manifest, "models": [model], "defaults": defaults or manifest["defaults"]}
        path.write_text(yaml.safe_dump(bad))
        with pytest.raises(ConfigError) as error:
            BatchManifest.load(path)
        assert str(error.value).endswith(
            "address: the batch's searches all run on the batch's cluster: set it with the "
            "manifest's address or raysearch batch --address"
        ), where

    # Nothing listens on port 1: the command says so in one line, and writes nothing (after
    # half a second of trying, not the 10 s a head that is starting gets).
    from raysearch.search.runtime import cluster

    quick = functools.partial(cluster.check_reachable, wait_s=0.5)
    monkeypatch.setattr(cluster, "check_reachable", quick)
    path.write_text(yaml.safe_dump({**manifest, "address": None}))
    capsys.readouterr()
    assert main(["batch", str(path), "--address", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raysearch: error: address: no Ray cluster answers at 127.0.0.1:1")
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
