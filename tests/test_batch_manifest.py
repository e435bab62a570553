"""Reading a batch manifest (no Ray): a model whose config holds several mistakes keeps them
all, on one line, as its reason in the batch summary."""

from __future__ import annotations

import numpy as np
import yaml

from raysearch.batch import BatchManifest
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
