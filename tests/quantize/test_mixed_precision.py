"""Sensitivity analysis and the mixed_precision technique, on a model with one planted outlier
tensor (``h4``, the output of ``mm4``): real ONNX Runtime quantization and sessions."""

from __future__ import annotations

import numpy as np
import onnx
import pyarrow.parquet as pq
import pytest

from raysearch.data import DataSource
from raysearch.evaluate import Evaluator
from raysearch.quantize.techniques.mixed_precision import precisions
from raysearch.quantize.techniques.mixed_precision.sensitivity import (
    SENSITIVITY_FILE,
    Ranking,
    SensitivityEntry,
    SensitivityStore,
    node_groups,
    read_sensitivity_table,
    write_sensitivity_table,
)
from raysearch.space import SearchSpace, expand_spaces
from raysearch.trial import TrialRunner, TrialSpec
from tests.models import make_encoder_model, make_outlier_model, outlier_data

BASE = {"op_types_to_quantize": ["MatMul"], "per_channel": False}


@pytest.fixture
def outlier(tmp_path):
    model = make_outlier_model(tmp_path / "outlier.onnx")
    calib = DataSource.load(outlier_data(64), model, batch_size=16)
    evaluation = DataSource.load(outlier_data(64, seed=9), model, batch_size=16)
    return model, calib, evaluation


def _runner(outlier, tmp_path, cache="cache"):
    model, calib, evaluation = outlier
    return TrialRunner(
        TrialSpec(
            model,
            calib,
            evaluation,
            Evaluator("cos", 0.999),
            cache_dir=tmp_path / cache,
            measure_latency=False,
        )
    )


def _run(runner, tmp_path, mixed=None):
    settings = dict(BASE, **({"mixed_precision": mixed} if mixed else {}))
    result = runner.run(settings, tmp_path / "q.onnx")
    assert result.status == "ok", result.error
    return result


@pytest.mark.parametrize("rank_by", ["sqnr", "metric"])
def test_both_rankings_put_the_planted_outlier_first(outlier, tmp_path, rank_by):
    with _runner(outlier, tmp_path) as runner:
        base = _run(runner, tmp_path)
        result = _run(runner, tmp_path, {"top_k": 1, "rank_by": rank_by})
    rows = [r for r in result.sensitivity if r["rank_by"] == rank_by]
    assert rows[0]["tensor"] == "h4" and rows[0]["node"] == "mm4"
    assert rows[0]["op_type"] == "MatMul"
    # Its SQNR is the lowest by far: the crushed channels, not the outlier, are measured.
    assert rows[0]["sqnr_db"] < min(r["sqnr_db"] for r in rows[1:]) - 10
    if rank_by == "metric":
        measured = [r["metric"] for r in rows if r["metric"] is not None]
        assert rows[0]["metric"] == max(measured) > base.metric
    assert result.extra["promoted"] == 1 and result.extra["ranked"] == len(rows)
    assert result.metric > base.metric + 0.1


def test_promotion_to_16_bits_and_to_float_change_the_quantized_graph(outlier, tmp_path):
    with _runner(outlier, tmp_path) as runner:
        base = _run(runner, tmp_path)
        sixteen = _run(runner, tmp_path, {"top_k": 1, "promote_to": "int16"})
        model = onnx.load(str(tmp_path / "q.onnx"))
        zero_points = {
            n.input[0]: n.input[2] for n in model.graph.node if n.op_type == "QuantizeLinear"
        }
        inits = {i.name: i for i in model.graph.initializer}
        assert inits[zero_points["h4"]].data_type == onnx.TensorProto.INT16  # QInt8 base
        assert inits[zero_points["h2"]].data_type == onnx.TensorProto.INT8
        floats = _run(runner, tmp_path, {"top_k": 1, "promote_to": "float"})
        model = onnx.load(str(tmp_path / "q.onnx"))
        quantized_inputs = {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
        assert "h4" not in quantized_inputs and "h2" in quantized_inputs
    assert base.metric < sixteen.metric < floats.metric
    assert floats.metric > 0.99


def _weight_types(path) -> dict[str, int]:
    """Each MatMul's weight type in a QDQ model: that of the DequantizeLinear feeding input 1."""
    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    dq = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return {
        n.name: inits[dq[n.input[1]]].data_type
        for n in model.graph.node
        if n.op_type == "MatMul" and dq.get(n.input[1]) in inits
    }


def test_promote_weights_gives_the_promoted_nodes_16_bit_weights(outlier, tmp_path):
    with _runner(outlier, tmp_path) as runner:
        sixteen = _run(runner, tmp_path, {"top_k": 1, "promote_to": "int16"})
        assert set(_weight_types(tmp_path / "q.onnx").values()) == {onnx.TensorProto.INT8}
        both = _run(runner, tmp_path, {"top_k": 1, "promote_weights": True})
        types = _weight_types(tmp_path / "q.onnx")
    # mm4 reads the outlier: it runs A16W16, every other MatMul keeps its 8-bit weight.
    assert types.pop("mm4") == onnx.TensorProto.INT16
    assert types and set(types.values()) == {onnx.TensorProto.INT8}
    assert both.extra["promoted"] == 1 and both.extra["promoted_weights"] == 1
    assert "promoted_weights" not in sixteen.extra
    assert both.extra["quantized_share"] == sixteen.extra["quantized_share"] == 1.0


def test_a_ranking_is_computed_once_per_base_and_shared_on_disk(outlier, tmp_path):
    with _runner(outlier, tmp_path) as first:
        _run(first, tmp_path, {"top_k": 1})
        _run(first, tmp_path, {"top_k": 2, "promote_to": "float"})
        technique = first.techniques._instances["mixed_precision"]
        assert technique._store().computed == 1
    with _runner(outlier, tmp_path) as second:  # another process on the node: read from disk
        result = _run(second, tmp_path, {"top_k": 1})
        assert second.techniques._instances["mixed_precision"]._store().computed == 0
        assert result.sensitivity[0]["tensor"] == "h4"
        # Another base setting is another ranking.
        other = second.run(
            {**BASE, "per_channel": True, "mixed_precision": {"top_k": 1}}, tmp_path / "q.onnx"
        )
        assert other.status == "ok"
        assert second.techniques._instances["mixed_precision"]._store().computed == 1


def test_per_rank_choices_override_top_k():
    assert precisions({"top_k": 3, "promote_to": "float", "rank_2": "int8"}, 5) == [
        "float",
        "int8",
        "float",
        "int8",
        "int8",
    ]
    assert precisions({"rank_17": "float"}, 20) == ["int8"] * 20  # only ranks 1..16 exist


def test_settings_that_promote_nothing_collapse_to_one_grid_point():
    space = SearchSpace.parse(
        {"mixed_precision": {"top_k": [0, 1], "promote_to": ["int16", "float"]}}
    )
    grid = expand_spaces([space])
    assert [space.to_settings(p)["mixed_precision"] for p in grid.points] == [
        {"top_k": 0},
        {"top_k": 1, "promote_to": "int16"},
        {"top_k": 1, "promote_to": "float"},
    ]
    assert grid.dropped["mixed_precision_without_promotion"] == 1


def test_unknown_mixed_precision_keys_are_refused():
    with pytest.raises(Exception, match="top_j"):
        SearchSpace.parse({"mixed_precision": {"top_j": [1]}})


def test_groups_are_the_blocks_between_normalisations(tmp_path):
    model = onnx.load(str(make_encoder_model(tmp_path / "enc.onnx")))
    groups = node_groups(model)
    assert len(set(groups.values())) >= 2
    order = [int(groups[n.name][5:]) for n in model.graph.node]
    assert order == sorted(order)  # blocks follow graph order


def test_the_sensitivity_table_round_trips(tmp_path):
    ranking = Ranking(
        "base1",
        "sqnr",
        [SensitivityEntry("t", "n", "MatMul", "block0", 3.5, float_nodes=("n", "m"))],
    )
    path = write_sensitivity_table(tmp_path / SENSITIVITY_FILE, ranking.rows())
    rows = read_sensitivity_table(path)
    assert rows[0]["rank"] == 1 and rows[0]["float_nodes"] == ["n", "m"]
    assert set(pq.read_table(path).column_names) >= {
        "node",
        "op_type",
        "tensor",
        "group",
        "sqnr_db",
        "metric",
        "rank",
    }
    store = SensitivityStore(tmp_path)
    assert store.get("k", lambda: ranking).entries == ranking.entries
    assert (
        SensitivityStore(tmp_path).get("k", lambda: pytest.fail("recomputed")).base_key == "base1"
    )


def test_the_ranking_data_is_a_subset_of_the_calibration_data(outlier, tmp_path):
    model, calib, _ = outlier
    with _runner(outlier, tmp_path) as runner:
        few = _run(runner, tmp_path, {"top_k": 1, "samples": 16})
    assert few.sensitivity[0]["tensor"] == "h4"
    assert np.isfinite(few.sensitivity[0]["sqnr_db"])
