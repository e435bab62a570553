"""The float model a node materializes from the object store lives in this user's private
folder and is used only when its files hash to the shipped model's hash: a model planted
under the same name is replaced, and a folder others may write to is refused in one line."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

import numpy as np
import onnxruntime as ort
import pytest

from raysearch.modelfile import file_hash
from raysearch.quantize.tempdirs import UnsafeFolderError
from raysearch.search.runtime.transfer import materialize_model, model_blob
from tests.models import make_mlp_model, mlp_data

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]


@pytest.fixture
def tmpdir_here(tmp_path, monkeypatch):
    """This process's temp directory, as another node's would be (``TMPDIR``)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return tmp_path / "tmp"


def test_a_planted_model_under_the_hash_is_not_used(tmp_path, tmpdir_here, caplog):
    model = make_mlp_model(tmp_path / "float" / "mlp.onnx")
    other = make_mlp_model(tmp_path / "other" / "mlp.onnx", seed=7)
    assert file_hash(other) != file_hash(model)
    blob = model_blob(model)
    planted = tmpdir_here / f"raysearch-{os.getuid()}" / "raysearch-models" / blob.sha256[:24]
    planted.mkdir(parents=True, mode=0o700)
    shutil.copy(other, planted / "mlp.onnx")

    with caplog.at_level(logging.WARNING, logger="raysearch.search.runtime.transfer"):
        path = materialize_model(blob)
    assert path == os.fspath(planted / "mlp.onnx")
    assert file_hash(path) == file_hash(model)
    data = mlp_data(4)
    expected = ort.InferenceSession(str(model)).run(None, data)[0]
    np.testing.assert_array_equal(ort.InferenceSession(path).run(None, data)[0], expected)
    assert [r.getMessage() for r in caplog.records] == [
        f"{planted} does not hold the model of hash {blob.sha256[:24]}: written again from the"
        " object store"
    ]
    assert materialize_model(blob) == path  # intact now: used as it is


def test_a_models_folder_others_may_write_to_is_refused(tmp_path, tmpdir_here):
    model = make_mlp_model(tmp_path / "float" / "mlp.onnx")
    blob = model_blob(model)
    planted = tmpdir_here / f"raysearch-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)
    with pytest.raises(UnsafeFolderError) as refused:
        materialize_model(blob)
    assert str(refused.value) == (
        f"{planted}: refusing a temporary folder writable by others (mode 777); remove it, or"
        " set TMPDIR to a folder of your own"
    )
    assert list(planted.iterdir()) == []
