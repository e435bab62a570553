"""raysearch.data._data: loading, checking, batching and hashing calibration/evaluation data."""

from __future__ import annotations

import numpy as np
import onnx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from onnxruntime.quantization import CalibrationDataReader

from raysearch.data import DataError, DataSource, model_inputs
from tests.models import (
    encoder_data,
    make_encoder_model,
    make_mlp_model,
    make_static_batch_model,
    mlp_data,
)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return make_mlp_model(tmp_path_factory.mktemp("data") / "mlp.onnx")


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return make_encoder_model(tmp_path_factory.mktemp("data") / "encoder.onnx")


class _Reader(CalibrationDataReader):
    def __init__(self, feeds):
        self._feeds = iter(feeds)

    def get_next(self):
        return next(self._feeds, None)


# -- model inputs ---------------------------------------------------------------------------


def test_model_inputs_skip_initializers_and_show_dynamic_dims(mlp, tmp_path):
    model = onnx.load(str(mlp))
    # Some exporters list initializers as graph inputs too: they are not fed.
    model.graph.input.append(onnx.helper.make_tensor_value_info("w1", 1, [16, 32]))
    inputs = model_inputs(model)
    assert [i.name for i in inputs] == ["x"]
    assert inputs[0].dtype == np.float32
    assert inputs[0].shape == ("N", 16)
    assert inputs[0].shape_text() == "[N, 16]"


# -- formats --------------------------------------------------------------------------------


def test_npz_batches_hash_and_reader(mlp, tmp_path):
    arrays = mlp_data(10)
    np.savez(tmp_path / "calib.npz", **arrays)
    src = DataSource.load(tmp_path / "calib.npz", mlp, batch_size=4)
    assert len(src) == 10 and src.num_batches == 3
    assert [f["x"].shape[0] for f in src.batches()] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([f["x"] for f in src.batches()]), arrays["x"])
    reader = src.reader()
    assert len(reader) == 3
    assert sum(1 for _ in iter(reader.get_next, None)) == 3
    reader.set_range(1, 2)
    assert len(reader) == 1
    np.testing.assert_array_equal(reader.get_next()["x"], arrays["x"][4:8])
    assert reader.get_next() is None
    # The hash depends on content, not on the batch size or where the data came from.
    same = DataSource.load(dict(arrays), mlp, batch_size=5)
    assert same.content_hash == src.content_hash and len(src.content_hash) == 64
    changed = dict(arrays)
    changed["x"] = changed["x"].copy()
    changed["x"][0, 0] += 1
    assert DataSource.load(changed, mlp).content_hash != src.content_hash


def test_two_input_npz_and_default_batch_size(encoder, tmp_path):
    np.savez(tmp_path / "enc.npz", **encoder_data(40))
    src = DataSource.load(tmp_path / "enc.npz", encoder)
    assert src.batch_size == 16 and src.num_batches == 3
    feed = src.batch(0)
    assert set(feed) == {"x", "mask"} and feed["mask"].dtype == np.int64


def test_directory_of_npy_uses_file_stems(encoder, tmp_path):
    data = encoder_data(6)
    folder = tmp_path / "npy"
    folder.mkdir()
    for name, array in data.items():
        np.save(folder / f"{name}.npy", array)
    src = DataSource.load(folder, encoder, batch_size=6)
    np.testing.assert_array_equal(src.arrays["mask"], data["mask"])


def test_directory_of_npz_concatenates_in_sorted_order(mlp, tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    a, b = mlp_data(3, seed=1)["x"], mlp_data(2, seed=2)["x"]
    np.savez(folder / "part_b.npz", x=b)
    np.savez(folder / "part_a.npz", x=a)
    src = DataSource.load(folder, mlp)
    np.testing.assert_array_equal(src.arrays["x"], np.concatenate([a, b]))


def test_single_npy_for_a_single_input_model(mlp, tmp_path):
    np.save(tmp_path / "x.npy", mlp_data(5)["x"])
    assert len(DataSource.load(tmp_path / "x.npy", mlp)) == 5


def test_parquet_list_and_fixed_size_list_columns_are_reshaped(encoder, tmp_path):
    data = encoder_data(5)
    table = pa.table(
        {
            # list<list<float>>: [seq][dim] per row
            "x": pa.array([row.tolist() for row in data["x"]]),
            # fixed_size_list<int64, 8>
            "mask": pa.FixedSizeListArray.from_arrays(pa.array(data["mask"].ravel()), 8),
        }
    )
    pq.write_table(table, tmp_path / "enc.parquet")
    src = DataSource.load(tmp_path / "enc.parquet", encoder)
    np.testing.assert_array_equal(src.arrays["x"], data["x"])
    np.testing.assert_array_equal(src.arrays["mask"], data["mask"])


def test_calibration_data_reader_is_drained_once_and_reusable(mlp):
    x = mlp_data(9)["x"]
    reader = _Reader([{"x": x[i : i + 3]} for i in range(0, 9, 3)])
    src = DataSource.load(reader, mlp, batch_size=2)
    assert len(src) == 9
    first = [f["x"] for f in src.batches()]
    second = [f["x"] for f in src.batches()]
    assert len(first) == 5
    np.testing.assert_array_equal(np.concatenate(first), np.concatenate(second))


def test_static_batch_model_feeds_one_sample_per_batch(tmp_path):
    path = make_static_batch_model(tmp_path / "static.onnx")
    src = DataSource.load({"x": np.ones((3, 4), np.float32)}, path, batch_size=8)
    assert src.batch_size == 1 and src.num_batches == 3
    assert src.batch(2)["x"].shape == (1, 4)
    # One more axis than the model input: each sample is a whole feed.
    stacked = DataSource.load({"x": np.ones((3, 1, 4), np.float32)}, path)
    assert stacked.sample_is_feed and stacked.batch(0)["x"].shape == (1, 4)


# -- errors, each with its exact message ----------------------------------------------------


def test_missing_input(encoder, tmp_path):
    data = encoder_data(4)
    np.savez(tmp_path / "x.npz", x=data["x"])
    with pytest.raises(DataError) as err:
        DataSource.load(tmp_path / "x.npz", encoder, label="calibration data")
    assert str(err.value) == (
        "calibration data 'x.npz': missing input 'mask'; the model's inputs are x, mask"
    )


def test_extra_array_with_suggestion(mlp, tmp_path):
    np.savez(tmp_path / "x.npz", x=mlp_data(2)["x"], xx=mlp_data(2)["x"])
    with pytest.raises(DataError, match=r"array 'xx' is not a model input \(did you mean 'x'\?\)"):
        DataSource.load(tmp_path / "x.npz", mlp)


def test_wrong_dtype(mlp, tmp_path):
    np.savez(tmp_path / "x.npz", x=np.zeros((3, 16), np.int32))
    with pytest.raises(DataError) as err:
        DataSource.load(tmp_path / "x.npz", mlp, label="calibration data")
    assert str(err.value) == (
        "calibration data 'x.npz': input 'x' has dtype int32, model expects float32"
    )


def test_wrong_shape(mlp, tmp_path):
    np.savez(tmp_path / "x.npz", x=np.zeros((10, 3), np.float32))
    with pytest.raises(DataError) as err:
        DataSource.load(tmp_path / "x.npz", mlp, label="calibration data")
    assert str(err.value) == (
        "calibration data 'x.npz': input 'x' has shape (10, 3) (the whole array, its first "
        "axis the model's batch axis), model expects [N, 16]"
    )


def test_wrong_shape_per_sample(mlp, tmp_path):
    np.savez(tmp_path / "x.npz", x=np.zeros((4, 2, 3), np.float32))
    with pytest.raises(DataError) as err:
        DataSource.load(tmp_path / "x.npz", mlp, label="calibration data")
    assert str(err.value) == (
        "calibration data 'x.npz': input 'x' has shape (4, 2, 3) (4 samples of shape (2, 3), "
        "each one feed), model expects [N, 16]"
    )


def test_a_dimension_named_by_shape_inference_shows_as_any(mlp, tmp_path):
    """ONNX shape inference names the dimensions it cannot name ``unk__N``: an internal name,
    shown as ``any`` (as an unnamed dynamic dimension)."""
    model = onnx.load(str(mlp))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "unk__214"
    onnx.save(model, tmp_path / "inferred.onnx")
    np.savez(tmp_path / "x.npz", x=np.zeros((10, 3), np.float32))
    with pytest.raises(DataError) as err:
        DataSource.load(tmp_path / "x.npz", tmp_path / "inferred.onnx", label="data")
    assert str(err.value) == (
        "data 'x.npz': input 'x' has shape (10, 3) (the whole array, its first axis the "
        "model's batch axis), model expects [any, 16]"
    )
    model.graph.input[0].type.tensor_type.shape.dim[0].ClearField("dim_param")
    assert model_inputs(model)[0].shape_text() == "[any, 16]"


def test_wrong_rank(mlp):
    with pytest.raises(DataError, match=r"input 'x' has shape \(2, 2, 2, 16\), model expects"):
        DataSource.load({"x": np.zeros((2, 2, 2, 16), np.float32)}, mlp)


def test_empty_file(mlp, tmp_path):
    (tmp_path / "x.npz").write_bytes(b"")
    with pytest.raises(DataError) as err:
        DataSource.load(tmp_path / "x.npz", mlp, label="calibration data")
    assert str(err.value) == "calibration data 'x.npz': file is empty"


def test_pickled_object_arrays_are_never_loaded(mlp, tmp_path):
    np.savez(tmp_path / "x.npz", x=np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(DataError) as err:
        DataSource.load(tmp_path / "x.npz", mlp, label="calibration data")
    assert str(err.value) == (
        "calibration data 'x.npz': array 'x' holds Python objects (pickled); "
        "raysearch never loads pickles"
    )
    np.save(tmp_path / "x.npy", np.array([1, "a"], dtype=object))
    with pytest.raises(DataError, match=r"array 'x' holds Python objects \(pickled\)"):
        DataSource.load(tmp_path / "x.npy", mlp)


def test_unknown_extension(mlp, tmp_path):
    (tmp_path / "x.csv").write_text("1,2,3\n")
    with pytest.raises(DataError) as err:
        DataSource.load(tmp_path / "x.csv", mlp, label="calibration data")
    assert str(err.value) == (
        "calibration data 'x.csv': unsupported file type '.csv'; expected .npz, .npy, .parquet "
        "or a directory of .npy/.npz files"
    )


def test_not_an_npz_archive_and_missing_file(mlp, tmp_path):
    (tmp_path / "x.npz").write_text("hello")
    with pytest.raises(DataError, match=r"'x.npz': file is not a NumPy .npz archive$"):
        DataSource.load(tmp_path / "x.npz", mlp)
    with pytest.raises(DataError, match=r"'nope.npz': file not found"):
        DataSource.load(tmp_path / "nope.npz", mlp)


def test_zero_samples_and_unequal_sample_counts(encoder):
    with pytest.raises(DataError, match=r"holds 0 samples$"):
        DataSource.load(
            {"x": np.zeros((0, 8, 16), np.float32), "mask": np.zeros((0, 8), np.int64)}, encoder
        )
    data = encoder_data(4)
    data["mask"] = data["mask"][:3]
    with pytest.raises(DataError, match=r"inputs hold different numbers of samples \('x' 4, "):
        DataSource.load(data, encoder)


def test_npy_file_for_a_two_input_model(encoder, tmp_path):
    np.save(tmp_path / "x.npy", encoder_data(2)["x"])
    with pytest.raises(DataError, match=r"a .npy file holds one array but the model has 2 inputs"):
        DataSource.load(tmp_path / "x.npy", encoder)


def test_directory_errors(mlp, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match=r"directory holds no .npy or .npz files$"):
        DataSource.load(empty, mlp)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    np.save(mixed / "x.npy", mlp_data(2)["x"])
    np.savez(mixed / "y.npz", x=mlp_data(2)["x"])
    with pytest.raises(DataError, match=r"directory mixes .npy and .npz files"):
        DataSource.load(mixed, mlp)


def test_parquet_errors(encoder, mlp, tmp_path):
    data = encoder_data(3)
    pq.write_table(pa.table({"x": pa.array([r.tolist() for r in data["x"]])}), tmp_path / "a.pq")
    with pytest.raises(DataError) as err:
        DataSource.load(tmp_path / "a.pq", encoder, label="evaluation data")
    assert str(err.value) == (
        "evaluation data 'a.pq': missing input 'mask'; the model's inputs are x, mask"
    )
    pq.write_table(pa.table({"x": pa.array([[1.0, 2.0, 3.0]] * 4)}), tmp_path / "b.parquet")
    with pytest.raises(DataError) as err:
        DataSource.load(tmp_path / "b.parquet", mlp, label="evaluation data")
    assert str(err.value) == (
        "evaluation data 'b.parquet': column 'x' holds 12 values over 4 rows, which do not "
        "reshape to the model's shape [N, 16]"
    )
    pq.write_table(pa.table({"x": pa.array(["a", "b"])}), tmp_path / "c.parquet")
    with pytest.raises(DataError, match=r"column 'x' holds string values"):
        DataSource.load(tmp_path / "c.parquet", mlp)
    (tmp_path / "d.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"'d.parquet': cannot read the Parquet file"):
        DataSource.load(tmp_path / "d.parquet", mlp)


def test_reader_yielding_nothing_and_unsupported_objects(mlp):
    with pytest.raises(DataError, match=r"the reader yielded no data$"):
        DataSource.load(_Reader([]), mlp)
    with pytest.raises(DataError, match=r"expected a path .* got int$"):
        DataSource.load(3, mlp)


def test_static_batch_must_divide_the_samples(tmp_path):
    path = tmp_path / "static4.onnx"
    make_static_batch_model(path)
    model = onnx.load(str(path))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 4
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 4
    onnx.save(model, str(path))
    with pytest.raises(DataError, match=r"static batch of 4; 6 samples is not a multiple of it"):
        DataSource.load({"x": np.ones((6, 4), np.float32)}, path)


def test_undeclared_input_shape_takes_the_data_as_batches(mlp, tmp_path):
    model = onnx.load(str(mlp))
    model.graph.input[0].type.tensor_type.ClearField("shape")
    path = tmp_path / "noshape.onnx"
    onnx.save(model, str(path))
    assert model_inputs(path)[0].shape is None
    src = DataSource.load(mlp_data(10), path, batch_size=4)
    assert src.num_batches == 3 and src.inputs[0].shape == (None, None)
