"""raysearch.modelfile: the graph walks and header loads every stage shares."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from raysearch.modelfile import graph_nodes, graph_tensors, has_external_data, load_header
from tests.external_models import make_external_mlp
from tests.models import make_mlp_model


def _if_model() -> onnx.GraphProto:
    """A graph whose ``If`` node holds a subgraph with a ``Relu`` and a constant tensor."""
    const = helper.make_tensor("c", TensorProto.FLOAT, [1], [1.0])
    then = helper.make_graph(
        [
            helper.make_node("Constant", [], ["k"], name="inner_const", value=const),
            helper.make_node("Relu", ["k"], ["t"], name="inner_relu"),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1])],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"], name="inner_id")],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1])],
    )
    node = helper.make_node(
        "If", ["cond"], ["y"], name="branch", then_branch=then, else_branch=other
    )
    return helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )


def test_graph_nodes_walks_subgraphs_each_node_before_its_subgraphs():
    names = [n.name for n in graph_nodes(_if_model())]
    # helper.make_node keeps attributes sorted by name: else_branch, then then_branch.
    assert names == ["branch", "inner_id", "inner_const", "inner_relu"]


def test_graph_tensors_finds_attribute_tensors_in_subgraphs():
    assert [t.name for t in graph_tensors(_if_model())] == ["c"]


def test_external_data_is_seen_without_loading_it(tmp_path):
    external = make_external_mlp(tmp_path / "ext" / "m.onnx")
    single = make_mlp_model(tmp_path / "one.onnx")
    assert has_external_data(external) and not has_external_data(single)
    header = load_header(external)
    assert has_external_data(header)
    assert any(t.data_location == TensorProto.EXTERNAL for t in header.graph.initializer)
