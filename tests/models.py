"""Small, real ONNX models for tests, built with ``onnx.helper`` and numpy.

Every builder writes a valid model (IR version 8, opset 17) to ``path`` and returns the path.
The weights come from a seeded generator, so a model is the same bytes on every run. Data
helpers return matching ``{input name: array}`` dicts.

Example:
    >>> from tests.models import make_mlp_model, mlp_data
    >>> path = make_mlp_model(tmp_path / "mlp.onnx")        # doctest: +SKIP
    >>> data = mlp_data(32)                                   # doctest: +SKIP
    >>> data["x"].shape                                       # doctest: +SKIP
    (32, 16)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "OPSET",
    "IR_VERSION",
    "make_mlp_model",
    "make_conv_model",
    "make_encoder_model",
    "make_deep_encoder_model",
    "deep_encoder_data",
    "make_nan_model",
    "make_static_batch_model",
    "make_elementwise_model",
    "make_outlier_model",
    "make_attention_model",
    "attention_data",
    "outlier_data",
    "mlp_data",
    "conv_data",
    "encoder_data",
    "nan_model_data",
]

OPSET = 17
IR_VERSION = 8


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.ascontiguousarray(array), name)


def _save(graph: onnx.GraphProto, path: str | Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    model.producer_name = "raysearch-tests"
    onnx.checker.check_model(model, full_check=True)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def make_mlp_model(
    path: str | Path,
    in_features: int = 16,
    hidden: int = 32,
    out_features: int = 8,
    seed: int = 0,
) -> Path:
    """A two-layer MLP ``y = MatMul(Relu(MatMul(x, W1) + b1), W2) + b2``.

    Input ``x`` float32 ``[N, in_features]`` (dynamic batch ``N``), output ``y`` float32
    ``[N, out_features]``. Node names: ``fc1``, ``fc1_bias``, ``relu``, ``fc2``, ``fc2_bias``.
    """
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 1 / np.sqrt(in_features), (in_features, hidden)).astype(np.float32)
    b1 = rng.normal(0, 0.1, hidden).astype(np.float32)
    w2 = rng.normal(0, 1 / np.sqrt(hidden), (hidden, out_features)).astype(np.float32)
    b2 = rng.normal(0, 0.1, out_features).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="fc1"),
        helper.make_node("Add", ["h1", "b1"], ["h1b"], name="fc1_bias"),
        helper.make_node("Relu", ["h1b"], ["a1"], name="relu"),
        helper.make_node("MatMul", ["a1", "w2"], ["h2"], name="fc2"),
        helper.make_node("Add", ["h2", "b2"], ["y"], name="fc2_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", in_features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", out_features])],
        [_init("w1", w1), _init("b1", b1), _init("w2", w2), _init("b2", b2)],
    )
    return _save(graph, path)


def mlp_data(n: int, in_features: int = 16, seed: int = 1) -> dict[str, np.ndarray]:
    """``{"x": float32 [n, in_features]}`` drawn from a standard normal distribution."""
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(0, 1, (n, in_features)).astype(np.float32)}


def make_conv_model(path: str | Path, channels: int = 8, size: int = 16, seed: int = 0) -> Path:
    """A small CNN: Conv-Relu-Conv-Relu-GlobalAveragePool-Flatten-Gemm.

    Input ``x`` float32 ``[N, 3, size, size]``, output ``y`` float32 ``[N, 10]``.
    Node names: ``conv1``, ``relu1``, ``conv2``, ``relu2``, ``pool``, ``flatten``, ``fc``.
    """
    rng = np.random.default_rng(seed)
    k1 = rng.normal(0, 0.3, (channels, 3, 3, 3)).astype(np.float32)
    c1 = rng.normal(0, 0.1, channels).astype(np.float32)
    k2 = rng.normal(0, 0.2, (channels, channels, 3, 3)).astype(np.float32)
    c2 = rng.normal(0, 0.1, channels).astype(np.float32)
    wf = rng.normal(0, 0.3, (10, channels)).astype(np.float32)
    bf = rng.normal(0, 0.1, 10).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "k1", "c1"], ["h1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["h1"], ["a1"], name="relu1"),
        helper.make_node("Conv", ["a1", "k2", "c2"], ["h2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["h2"], ["a2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["a2"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        [_init(n, a) for n, a in (("k1", k1), ("c1", c1), ("k2", k2), ("c2", c2))]
        + [_init("wf", wf), _init("bf", bf)],
    )
    return _save(graph, path)


def conv_data(n: int, size: int = 16, seed: int = 2) -> dict[str, np.ndarray]:
    """``{"x": float32 [n, 3, size, size]}`` uniform in [0, 1)."""
    rng = np.random.default_rng(seed)
    return {"x": rng.random((n, 3, size, size), dtype=np.float32)}


def make_encoder_model(
    path: str | Path, seq: int = 8, dim: int = 16, ffn: int = 32, seed: int = 0
) -> Path:
    """A one-block transformer encoder with single-head attention and an attention mask.

    Inputs ``x`` float32 ``[N, seq, dim]`` and ``mask`` int64 ``[N, seq]`` (1 = attend,
    0 = padding); output ``y`` float32 ``[N, seq, dim]``. Ops: LayerNormalization, MatMul,
    Transpose, Mul, Add, Sub, Cast, Unsqueeze, Softmax, Relu.
    """
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return rng.normal(0, 1 / np.sqrt(shape[0]), shape).astype(np.float32)

    inits = {
        "ln1_g": np.ones(dim, np.float32),
        "ln1_b": np.zeros(dim, np.float32),
        "wq": weight(dim, dim),
        "wk": weight(dim, dim),
        "wv": weight(dim, dim),
        "wo": weight(dim, dim),
        "ln2_g": np.ones(dim, np.float32),
        "ln2_b": np.zeros(dim, np.float32),
        "w_up": weight(dim, ffn),
        "b_up": rng.normal(0, 0.1, ffn).astype(np.float32),
        "w_down": weight(ffn, dim),
        "b_down": rng.normal(0, 0.1, dim).astype(np.float32),
        "scale": np.array(1 / np.sqrt(dim), np.float32),
        "one": np.array(1.0, np.float32),
        "neg_big": np.array(-1e4, np.float32),
        "axes_1": np.array([1], np.int64),
    }
    n = helper.make_node
    nodes = [
        n("LayerNormalization", ["x", "ln1_g", "ln1_b"], ["ln1"], name="ln1", axis=-1),
        n("MatMul", ["ln1", "wq"], ["q"], name="q_proj"),
        n("MatMul", ["ln1", "wk"], ["k"], name="k_proj"),
        n("MatMul", ["ln1", "wv"], ["v"], name="v_proj"),
        n("Transpose", ["k"], ["kt"], name="k_transpose", perm=[0, 2, 1]),
        n("MatMul", ["q", "kt"], ["scores"], name="qk"),
        n("Mul", ["scores", "scale"], ["scaled"], name="scale_scores"),
        n("Cast", ["mask"], ["mask_f"], name="mask_cast", to=TensorProto.FLOAT),
        n("Sub", ["one", "mask_f"], ["inv_mask"], name="mask_invert"),
        n("Mul", ["inv_mask", "neg_big"], ["mask_bias"], name="mask_scale"),
        n("Unsqueeze", ["mask_bias", "axes_1"], ["mask_bias3"], name="mask_unsqueeze"),
        n("Add", ["scaled", "mask_bias3"], ["masked"], name="apply_mask"),
        n("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
        n("MatMul", ["probs", "v"], ["ctx"], name="attend"),
        n("MatMul", ["ctx", "wo"], ["attn_out"], name="o_proj"),
        n("Add", ["x", "attn_out"], ["res1"], name="residual1"),
        n("LayerNormalization", ["res1", "ln2_g", "ln2_b"], ["ln2"], name="ln2", axis=-1),
        n("MatMul", ["ln2", "w_up"], ["up"], name="ffn_up"),
        n("Add", ["up", "b_up"], ["up_b"], name="ffn_up_bias"),
        n("Relu", ["up_b"], ["up_a"], name="ffn_relu"),
        n("MatMul", ["up_a", "w_down"], ["down"], name="ffn_down"),
        n("Add", ["down", "b_down"], ["down_b"], name="ffn_down_bias"),
        n("Add", ["res1", "down_b"], ["y"], name="residual2"),
    ]
    graph = helper.make_graph(
        nodes,
        "encoder",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", seq, dim]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, ["N", seq]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", seq, dim])],
        [_init(k, v) for k, v in inits.items()],
    )
    return _save(graph, path)


def encoder_data(n: int, seq: int = 8, dim: int = 16, seed: int = 3) -> dict[str, np.ndarray]:
    """``{"x": float32 [n, seq, dim], "mask": int64 [n, seq]}``; each row attends to a random
    prefix of at least two positions."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, seq + 1, n)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    return {"x": rng.normal(0, 1, (n, seq, dim)).astype(np.float32), "mask": mask}


def make_deep_encoder_model(
    path: str | Path,
    layers: int = 6,
    features: int = 24,
    seq: int = 8,
    dim: int = 16,
    ffn: int = 32,
    seed: int = 0,
) -> Path:
    """A transformer encoder of ``layers`` pre-norm blocks (single-head attention with an
    attention mask, then a ReLU MLP, each with its residual) behind an input projection.

    Inputs ``x`` float32 ``[N, seq, features]`` (raw features, projected by the MatMul
    ``in_proj`` before any normalisation) and ``mask`` int64 ``[N, seq]`` (1 = attend);
    output ``y`` float32 ``[N, seq, dim]``. With :func:`deep_encoder_data`, whose batches
    differ in scale by orders of magnitude, static calibration's one range per tensor crushes
    the small batches at ``in_proj`` where dynamic quantization's per-batch range does not:
    dynamic quantization ranks best on it.
    """
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return rng.normal(0, 1 / np.sqrt(shape[0]), shape).astype(np.float32)

    inits: dict[str, np.ndarray] = {
        "w_in": weight(features, dim),
        "scale": np.array(1 / np.sqrt(dim), np.float32),
        "one": np.array(1.0, np.float32),
        "neg_big": np.array(-1e4, np.float32),
        "axes_1": np.array([1], np.int64),
    }
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "w_in"], ["h0"], name="in_proj"),
        n("Cast", ["mask"], ["mask_f"], name="mask_cast", to=TensorProto.FLOAT),
        n("Sub", ["one", "mask_f"], ["inv_mask"], name="mask_invert"),
        n("Mul", ["inv_mask", "neg_big"], ["mask_bias"], name="mask_scale"),
        n("Unsqueeze", ["mask_bias", "axes_1"], ["mask_bias3"], name="mask_unsqueeze"),
    ]
    for i in range(layers):
        p, h = f"l{i}_", f"h{i}"
        inits.update(
            {
                p + "ln1_g": np.ones(dim, np.float32),
                p + "ln1_b": np.zeros(dim, np.float32),
                p + "wq": weight(dim, dim),
                p + "wk": weight(dim, dim),
                p + "wv": weight(dim, dim),
                p + "wo": weight(dim, dim),
                p + "ln2_g": np.ones(dim, np.float32),
                p + "ln2_b": np.zeros(dim, np.float32),
                p + "w_up": weight(dim, ffn),
                p + "b_up": rng.normal(0, 0.1, ffn).astype(np.float32),
                p + "w_down": weight(ffn, dim),
                p + "b_down": rng.normal(0, 0.1, dim).astype(np.float32),
            }
        )
        out = "y" if i == layers - 1 else f"h{i + 1}"
        nodes += [
            n("LayerNormalization", [h, p + "ln1_g", p + "ln1_b"], [p + "ln1"], name=p + "ln1"),
            n("MatMul", [p + "ln1", p + "wq"], [p + "q"], name=p + "q_proj"),
            n("MatMul", [p + "ln1", p + "wk"], [p + "k"], name=p + "k_proj"),
            n("MatMul", [p + "ln1", p + "wv"], [p + "v"], name=p + "v_proj"),
            n("Transpose", [p + "k"], [p + "kt"], name=p + "k_transpose", perm=[0, 2, 1]),
            n("MatMul", [p + "q", p + "kt"], [p + "scores"], name=p + "qk"),
            n("Mul", [p + "scores", "scale"], [p + "scaled"], name=p + "scale_scores"),
            n("Add", [p + "scaled", "mask_bias3"], [p + "masked"], name=p + "apply_mask"),
            n("Softmax", [p + "masked"], [p + "probs"], name=p + "softmax", axis=-1),
            n("MatMul", [p + "probs", p + "v"], [p + "ctx"], name=p + "attend"),
            n("MatMul", [p + "ctx", p + "wo"], [p + "attn"], name=p + "o_proj"),
            n("Add", [h, p + "attn"], [p + "res1"], name=p + "residual1"),
            n(
                "LayerNormalization",
                [p + "res1", p + "ln2_g", p + "ln2_b"],
                [p + "ln2"],
                name=p + "ln2",
            ),
            n("MatMul", [p + "ln2", p + "w_up"], [p + "up"], name=p + "ffn_up"),
            n("Add", [p + "up", p + "b_up"], [p + "up_b"], name=p + "ffn_up_bias"),
            n("Relu", [p + "up_b"], [p + "up_a"], name=p + "ffn_relu"),
            n("MatMul", [p + "up_a", p + "w_down"], [p + "down"], name=p + "ffn_down"),
            n("Add", [p + "down", p + "b_down"], [p + "down_b"], name=p + "ffn_down_bias"),
            n("Add", [p + "res1", p + "down_b"], [out], name=p + "residual2"),
        ]
    graph = helper.make_graph(
        nodes,
        "deep_encoder",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", seq, features]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, ["N", seq]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", seq, dim])],
        [_init(k, v) for k, v in inits.items()],
    )
    return _save(graph, path)


def deep_encoder_data(
    n: int, seq: int = 8, features: int = 24, batch: int = 8, seed: int = 8
) -> dict[str, np.ndarray]:
    """``{"x": float32 [n, seq, features], "mask": int64 [n, seq]}``: each run of ``batch``
    rows drawn at its own scale (1e-3, 1, then 1e3, in turn), each row attending to a random
    prefix of at least two positions."""
    rng = np.random.default_rng(seed)
    scales = np.repeat([1e-3, 1.0, 1e3], batch)[np.arange(n) % (3 * batch)]
    x = rng.normal(0, 1, (n, seq, features)) * scales[:, None, None]
    lengths = rng.integers(2, seq + 1, n)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    return {"x": x.astype(np.float32), "mask": mask}


def make_nan_model(path: str | Path, features: int = 4) -> Path:
    """A model whose float outputs are finite but whose MatMul-quantized outputs hold NaN.

    ``z = MatMul(x, W)`` has one column of tiny positive values (about 1e-5, far below one
    quantization step), ``y = (Log(z) - Log(z)) + z``. In float, ``y == z``. Quantized with
    ``op_types_to_quantize: [MatMul]``, that column rounds to 0, ``Log(0) = -inf`` and
    ``-inf - -inf = NaN``. Input ``x`` float32 ``[N, features]`` (use :func:`nan_model_data`).
    """
    w = np.full((features, features), 0.5, np.float32)
    w[:, 0] = 1e-5
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["z"], name="matmul"),
        helper.make_node("Log", ["z"], ["log_z"], name="log"),
        helper.make_node("Sub", ["log_z", "log_z"], ["zero"], name="sub"),
        helper.make_node("Add", ["zero", "z"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "nan_after_quantization",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", features])],
        [_init("w", w)],
    )
    return _save(graph, path)


def make_elementwise_model(path: str | Path, features: int = 4, seed: int = 0) -> Path:
    """``y = Relu(x * w + b)``: no MatMul/Gemm/Conv at all (nothing whose quantization makes a
    model faster, so no quantized share). Input ``x`` float32 ``[N, features]`` (use
    :func:`nan_model_data`)."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["xw"], name="scale"),
        helper.make_node("Add", ["xw", "b"], ["xwb"], name="shift"),
        helper.make_node("Relu", ["xwb"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "elementwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", features])],
        [
            _init("w", rng.normal(1, 0.2, features).astype(np.float32)),
            _init("b", rng.normal(0, 0.1, features).astype(np.float32)),
        ],
    )
    return _save(graph, path)


def nan_model_data(n: int, features: int = 4, seed: int = 4) -> dict[str, np.ndarray]:
    """Positive inputs for :func:`make_nan_model`: ``{"x": float32 [n, features]}`` in [0.5, 1)."""
    rng = np.random.default_rng(seed)
    return {"x": (0.5 + 0.5 * rng.random((n, features))).astype(np.float32)}


def make_static_batch_model(path: str | Path, features: int = 4) -> Path:
    """``y = x * 2`` with a static batch of 1: input ``x`` float32 ``[1, features]``."""
    nodes = [helper.make_node("Mul", ["x", "two"], ["y"], name="double")]
    graph = helper.make_graph(
        nodes,
        "static_batch",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, features])],
        [_init("two", np.array(2.0, np.float32))],
    )
    return _save(graph, path)


def make_outlier_model(
    path: str | Path, layers: int = 8, outlier: int = 4, width: int = 16, seed: int = 5
) -> Path:
    """A chain of ``layers`` MatMuls (``mm0`` ... with outputs ``h0`` ..., ``y`` the last)
    whose ``mm{outlier}`` output has one outlier channel (column 0 of its weight x 300; row 0
    of the next weight / 300, so the float function is a plain chain). Quantized per tensor,
    that output's other channels are crushed: the one tensor that loses the accuracy.

    Input ``x`` float32 ``[N, width]``, output ``y`` float32 ``[N, width]``.
    """
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    previous = "x"
    for i in range(layers):
        weight = rng.normal(0, 1 / np.sqrt(width), (width, width)).astype(np.float32)
        weight += np.eye(width, dtype=np.float32)  # keep the signal alive along the chain
        if i == outlier:
            weight[:, 0] *= 300.0
        if i == outlier + 1:
            weight[0, :] /= 300.0
        output = "y" if i == layers - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [previous, f"w{i}"], [output], name=f"mm{i}"))
        inits.append(_init(f"w{i}", weight))
        previous = output
    graph = helper.make_graph(
        nodes,
        "outlier_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
        inits,
    )
    return _save(graph, path)


def outlier_data(n: int, width: int = 16, seed: int = 6) -> dict[str, np.ndarray]:
    """``{"x": float32 [n, width]}`` drawn from a standard normal distribution."""
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(0, 1, (n, width)).astype(np.float32)}


def make_attention_model(
    path: str | Path, vocab: int = 50, seq: int = 8, dim: int = 16, ffn: int = 32, seed: int = 0
) -> Path:
    """A BERT-like block: token embeddings (Gather) plus positions, LayerNormalization, biased
    Q, K and V projections of the one normalised tensor, single-head attention, a biased
    output projection and a biased feed-forward block, with residuals.

    Input ``ids`` int64 ``[N, seq]`` (< ``vocab``); output ``y`` float32 ``[N, seq, dim]``.
    NNCF 3.4's BiasCorrection (``fast_bias_correction=False``) fails on it: the layer norm's
    output feeds three biased MatMuls, and the subgraph it extracts defines that tensor twice.
    """
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return rng.normal(0, 1 / np.sqrt(shape[0]), shape).astype(np.float32)

    def bias(n: int) -> np.ndarray:
        return rng.normal(0, 0.1, n).astype(np.float32)

    inits = {
        "embedding": rng.normal(0, 1, (vocab, dim)).astype(np.float32),
        "positions": rng.normal(0, 0.1, (seq, dim)).astype(np.float32),
        "ln1_g": np.ones(dim, np.float32),
        "ln1_b": np.zeros(dim, np.float32),
        "ln2_g": np.ones(dim, np.float32),
        "ln2_b": np.zeros(dim, np.float32),
        "scale": np.array(1 / np.sqrt(dim), np.float32),
    }
    for name, rows, cols in (("q", dim, dim), ("k", dim, dim), ("v", dim, dim), ("o", dim, dim)):
        inits[f"w{name}"], inits[f"b{name}"] = weight(rows, cols), bias(cols)
    inits["w_up"], inits["b_up"] = weight(dim, ffn), bias(ffn)
    inits["w_down"], inits["b_down"] = weight(ffn, dim), bias(dim)
    n = helper.make_node

    def linear(source: str, name: str, out: str) -> list[onnx.NodeProto]:
        return [
            n("MatMul", [source, f"w{name}"], [f"{out}_mm"], name=f"{name}_proj"),
            n("Add", [f"{out}_mm", f"b{name}"], [out], name=f"{name}_bias"),
        ]

    nodes = [
        n("Gather", ["embedding", "ids"], ["tokens"], name="embed"),
        n("Add", ["tokens", "positions"], ["x"], name="add_positions"),
        n("LayerNormalization", ["x", "ln1_g", "ln1_b"], ["ln1"], name="ln1", axis=-1),
        *linear("ln1", "q", "q"),
        *linear("ln1", "k", "k"),
        *linear("ln1", "v", "v"),
        n("Transpose", ["k"], ["kt"], name="k_transpose", perm=[0, 2, 1]),
        n("MatMul", ["q", "kt"], ["scores"], name="qk"),
        n("Mul", ["scores", "scale"], ["scaled"], name="scale_scores"),
        n("Softmax", ["scaled"], ["probs"], name="softmax", axis=-1),
        n("MatMul", ["probs", "v"], ["ctx"], name="attend"),
        *linear("ctx", "o", "attn"),
        n("Add", ["x", "attn"], ["res1"], name="residual1"),
        n("LayerNormalization", ["res1", "ln2_g", "ln2_b"], ["ln2"], name="ln2", axis=-1),
        *linear("ln2", "_up", "up"),
        n("Relu", ["up"], ["up_a"], name="ffn_relu"),
        *linear("up_a", "_down", "down"),
        n("Add", ["res1", "down"], ["y"], name="residual2"),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", seq])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", seq, dim])],
        [_init(k, v) for k, v in inits.items()],
    )
    return _save(graph, path)


def attention_data(n: int, vocab: int = 50, seq: int = 8, seed: int = 7) -> dict[str, np.ndarray]:
    """``{"ids": int64 [n, seq]}`` token ids below ``vocab``."""
    rng = np.random.default_rng(seed)
    return {"ids": rng.integers(0, vocab, (n, seq)).astype(np.int64)}
