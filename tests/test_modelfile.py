"""raysearch.modelfile: models placed, copied and removed together with their external data."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from raysearch.modelfile import (
    data_file_names,
    external_data_locations,
    model_files,
    model_size_bytes,
    place_model,
    remove_model,
)
from tests.external_models import external_mlp_data, make_external_mlp
from tests.models import make_mlp_model


def _run(path) -> np.ndarray:
    return ort.InferenceSession(str(path)).run(None, external_mlp_data(8))[0]


def test_a_copy_renames_the_data_file_and_rewrites_its_location(tmp_path):
    source = make_external_mlp(tmp_path / "src" / "t1.onnx", location="weights.bin")
    expected = _run(source)
    target = place_model(source, tmp_path / "best" / "model.onnx", move=False)
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.onnx", "model.onnx.data"]
    assert external_data_locations(target) == ["model.onnx.data"]
    assert external_data_locations(source) == ["weights.bin"]  # the source is untouched
    # The folder loads from anywhere once moved, the source gone.
    moved = tmp_path / "elsewhere"
    shutil.move(str(target.parent), str(moved))
    shutil.rmtree(tmp_path / "src")
    np.testing.assert_array_equal(_run(moved / "model.onnx"), expected)


def test_a_models_size_does_not_depend_on_what_its_files_are_called(tmp_path):
    """Each external tensor's header holds its data file's name: a trial's model
    (``<trial id>.onnx``) weighs what the same model weighs in best/ (``model.onnx``), which is
    what a size_budget measured on a model.onnx is compared with."""
    trial = make_external_mlp(tmp_path / "trials" / "0f3a9c2e.onnx", location="0f3a9c2e.onnx.data")
    best = place_model(trial, tmp_path / "best" / "model.onnx", move=False)
    on_disk = [sum(p.stat().st_size for p in model_files(m)) for m in (trial, best)]
    assert on_disk[0] > on_disk[1]  # the longer name, in every tensor's header
    assert model_size_bytes(trial) == model_size_bytes(best) == on_disk[1]


def test_a_move_takes_the_data_along_and_leaves_nothing_behind(tmp_path):
    source = make_external_mlp(tmp_path / "trials" / "t1.onnx", location="t1.onnx.data")
    expected = _run(source)
    target = place_model(source, tmp_path / "candidates" / "t1.onnx", move=True)
    assert list((tmp_path / "trials").iterdir()) == []
    assert [p.name for p in model_files(target)] == ["t1.onnx", "t1.onnx.data"]
    np.testing.assert_array_equal(_run(target), expected)


def test_a_model_in_one_file_replaces_an_earlier_one_and_its_stale_data(tmp_path):
    best = tmp_path / "best" / "model.onnx"
    place_model(make_external_mlp(tmp_path / "a.onnx"), best, move=False)
    assert (tmp_path / "best" / "model.onnx.data").is_file()
    single = make_mlp_model(tmp_path / "b.onnx")
    place_model(single, best, move=False)
    assert [p.name for p in best.parent.iterdir()] == ["model.onnx"]
    assert best.read_bytes() == single.read_bytes()


def test_remove_model_deletes_the_data_even_when_the_model_file_is_gone(tmp_path):
    path = make_external_mlp(tmp_path / "t1.onnx", location="shared_name.bin")
    (tmp_path / "keep.txt").write_text("a user's file")
    remove_model(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
    # A failed trial removed its model file but not its data: the name says what it was.
    (tmp_path / "t2.onnx.data").write_bytes(b"\0" * 16)
    remove_model(tmp_path / "t2.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_data_file_names_and_a_location_outside_the_folder_is_refused(tmp_path):
    assert data_file_names("t1.onnx", 3) == ["t1.onnx.data", "t1.onnx.data.1", "t1.onnx.data.2"]
    path = make_external_mlp(tmp_path / "inner" / "m.onnx", location="w.bin")
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../w.bin"  # not a model raysearch writes
    onnx.save_model(model, str(path))
    with pytest.raises(ValueError, match="outside its folder"):
        place_model(path, tmp_path / "out" / "m.onnx", move=False)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_copying_the_same_model_twice_leaves_no_temporary_file(tmp_path):
    # The first copy is a hard link where the file system allows: renaming a second link of
    # the same file onto it would do nothing and leave the temporary name behind.
    for source in (
        make_mlp_model(tmp_path / "single.onnx"),
        make_external_mlp(tmp_path / "ext.onnx", location="ext.onnx.data"),
    ):
        for _ in range(2):
            place_model(source, tmp_path / "best" / source.name, move=False)
        assert not [p.name for p in (tmp_path / "best").iterdir() if ".tmp" in p.name]
    np.testing.assert_array_equal(_run(tmp_path / "best" / "ext.onnx"), _run(source))
