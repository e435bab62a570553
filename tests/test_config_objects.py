"""Python objects in a config given from Python, as Quark's API takes them: an
``onnx.ModelProto`` as the model (``model_input``), ``CalibrationDataReader`` objects as the
data (``calib_data_reader``/``eval_data_reader``), read once, each mistake one line."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import yaml

from raysearch.config import SearchConfig
from raysearch.errors import ConfigError
from tests.models import make_mlp_model, mlp_data

SPACE = {"per_channel": [True, False], "activation_type": ["QUInt8"]}


class Reader:
    """A CalibrationDataReader over one row per feed, counting its ``get_next`` calls."""

    def __init__(self, arrays, fail_at: int | None = None) -> None:
        self.rows = iter([{k: v[i : i + 1] for k, v in arrays.items()} for i in range(16)])
        self.calls = 0
        self.fail_at = fail_at

    def get_next(self):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("disk went away")
        return next(self.rows, None)


class GeneratorReader:
    """A reader over a generator (no copy of it can be made)."""

    def __init__(self, arrays) -> None:
        self.feeds = ({k: v[i : i + 1] for k, v in arrays.items()} for i in range(16))

    def get_next(self):
        return next(self.feeds, None)


@pytest.fixture
def mlp(tmp_path):
    path = tmp_path / "mlp.onnx"
    make_mlp_model(path)
    return path, mlp_data(16)


def test_a_model_object_is_saved_once_to_a_file_named_by_its_content(mlp, tmp_path):
    path, data = mlp
    proto = onnx.load(str(path))
    first = SearchConfig.from_dict(
        {"model_input": proto, "calibration_data": data, "search_space": SPACE}
    )
    again = SearchConfig.from_dict(
        {"model": onnx.load(str(path)), "calibration_data": data, "search_space": SPACE}
    )
    assert first.model == again.model and first.model.read_bytes() == proto.SerializeToString()
    proto.graph.name = "another"
    other = SearchConfig.from_dict(
        {"model": proto, "calibration_data": data, "search_space": SPACE}
    )
    assert other.model != first.model and first.model.read_bytes() != other.model.read_bytes()


def test_a_planted_file_under_a_model_objects_name_is_not_used(mlp, tmp_path, monkeypatch):
    """Another file of the same name and size in the models folder (planted, or damaged) is
    replaced by the model itself; the folder is this user's private one."""
    import os
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path, data = mlp
    proto = onnx.load(str(path))
    first = SearchConfig.from_dict(
        {"model": proto, "calibration_data": data, "search_space": SPACE}
    )
    assert first.model.parent == tmp_path / f"raysearch-{os.getuid()}" / "raysearch-models"
    planted = bytearray(first.model.read_bytes())
    planted[-1] ^= 0xFF  # same size, another model
    first.model.write_bytes(bytes(planted))
    again = SearchConfig.from_dict(
        {"model": proto, "calibration_data": data, "search_space": SPACE}
    )
    assert again.model == first.model
    assert again.model.read_bytes() == proto.SerializeToString()


def test_a_shared_models_folder_is_refused_in_one_line(mlp, tmp_path, monkeypatch):
    import os
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shared = tmp_path / f"raysearch-{os.getuid()}"
    shared.mkdir(mode=0o700)
    (shared / "raysearch-models").mkdir()
    (shared / "raysearch-models").chmod(0o777)
    path, data = mlp
    with pytest.raises(ConfigError) as refused:
        SearchConfig.from_dict(
            {"model": onnx.load(str(path)), "calibration_data": data, "search_space": SPACE}
        )
    assert str(refused.value) == (
        f"model: cannot save the ModelProto: {shared / 'raysearch-models'}: refusing a"
        " temporary folder writable by others (mode 777); remove it, or set TMPDIR to a folder"
        " of your own"
    )


def test_one_reader_is_read_once_into_arrays_for_calibration_and_evaluation(mlp):
    path, data = mlp
    reader = Reader(data)
    config = SearchConfig.from_dict(
        {"model": str(path), "calib_data_reader": reader, "search_space": SPACE}
    )
    assert reader.calls == 17  # 16 feeds and the None that ends them
    assert config.eval_data is config.calibration_data
    for name, array in data.items():
        np.testing.assert_array_equal(config.calibration_data[name], array)


def test_a_reader_over_a_generator_is_read_as_well(mlp):
    path, data = mlp
    config = SearchConfig.from_dict(
        {"model": str(path), "calibration_data": GeneratorReader(data), "search_space": SPACE}
    )
    assert len(next(iter(config.calibration_data.values()))) == 16


@pytest.mark.parametrize(
    "reader, message",
    [
        ("spent", "calibration_data: Reader: the reader yielded no data"),
        ("raising", "calibration_data: Reader.get_next() raised RuntimeError: disk went away"),
    ],
)
def test_a_reader_that_cannot_be_read_is_one_line(mlp, reader, message):
    path, data = mlp
    source = Reader(data, fail_at=3 if reader == "raising" else None)
    if reader == "spent":
        while source.get_next() is not None:
            pass
    with pytest.raises(ConfigError) as info:
        SearchConfig.from_dict(
            {"model": str(path), "calibration_data": source, "search_space": SPACE}
        )
    assert str(info.value) == message


def test_a_model_of_another_type_is_refused_naming_what_it_got(mlp):
    _, data = mlp
    with pytest.raises(ConfigError) as info:
        SearchConfig.from_dict({"model": 3, "calibration_data": data, "search_space": SPACE})
    assert (
        str(info.value) == "model: expected a path to an .onnx file or an onnx.ModelProto, got int"
    )


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_a_search_from_a_model_object_and_readers_writes_every_output(mlp, tmp_path):
    from raysearch.search import AutoSearch

    path, data = mlp
    config = {
        "model_input": onnx.load(str(path)),
        "calib_data_reader": Reader(data),
        "eval_data_reader": GeneratorReader(mlp_data(16, seed=3)),
        "search_space": SPACE,
        "search_algo": "Grid",
        "metric": "cos",
        "measure_latency": False,
        # One trial actor: trials side by side are not this test's subject.
        "resources": {"max_concurrent_trials": 1},
        "output_dir": str(tmp_path / "out"),
    }
    result = AutoSearch(config).run()
    assert [r.status for r in result.records] == ["ok", "ok"]
    best = yaml.safe_load((result.output_dir / "best" / "config.yaml").read_text())
    assert best["calibration_data"] == "<python object: Reader>"
    assert best["eval_data"] == "<python object: GeneratorReader>"
    assert (result.output_dir / "best" / "model.onnx").is_file()
