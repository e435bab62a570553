"""A tiny causal language model exported the way Optimum and onnxruntime-genai export them, for
the tests of weight-only quantization and the language-model metrics.

:func:`make_decoder_lm` writes a decoder built with ``onnx.helper``: token and position
embeddings (``Gather``), ``layers`` blocks of grouped-query attention (4 query heads over 2
key/value heads, past keys and values concatenated in front of the new ones, a causal mask
shifted by the past length and the ``attention_mask``) and a SwiGLU MLP, a final
``LayerNormalization`` and an untied ``lm_head``. Inputs: ``input_ids``, ``attention_mask``
``[batch, past + seq]``, ``position_ids``, ``past_key_values.<i>.key``/``.value``
``[batch, 2, past, 16]``; outputs ``logits [batch, seq, vocab]`` and ``present.<i>.key``/
``.value``. The weights come from a seeded generator (the same bytes every run).

Example:
    >>> path = make_decoder_lm(tmp_path / "lm.onnx")          # doctest: +SKIP
    >>> feeds = decoder_lm_data(8, 12)                        # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.models import IR_VERSION, OPSET

__all__ = [
    "make_decoder_lm",
    "decoder_lm_data",
    "Dims",
    "TINY",
    "LARGE",
    "VOCAB",
    "KV_HEADS",
    "HEAD_DIM",
]


@dataclass(frozen=True)
class Dims:
    """A decoder's sizes."""

    vocab: int = 96
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    ff: int = 128
    max_positions: int = 64

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def weight_bytes(self, layers: int) -> int:
        """float32 bytes of the weight matrices and embeddings of ``layers`` blocks."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        block = 2 * h * h + 2 * h * kv + 3 * h * self.ff
        return 4 * (layers * block + 2 * self.vocab * h + self.max_positions * h)


TINY = Dims()
# 5 blocks of 2048 wide with a 16384-wide SwiGLU and a 8192-token vocabulary: 2.20 GiB of
# float32 weights (36 weight MatMuls), past ONNX's 2 GB protobuf limit.
LARGE = Dims(vocab=8192, hidden=2048, heads=16, kv_heads=4, ff=16384, max_positions=64)
LARGE_LAYERS = 5

VOCAB = TINY.vocab
KV_HEADS = TINY.kv_heads
HEAD_DIM = TINY.head_dim


class _Graph:
    def __init__(self, rng: np.random.Generator, dims: Dims, data: BinaryIO | None = None) -> None:
        self.rng, self.d, self.nodes, self.inits = rng, dims, [], []
        self.data, self.location = data, Path(data.name).name if data else None

    def weight(self, name: str, shape: tuple[int, ...], scale: float | None = None) -> str:
        scale = 1 / np.sqrt(shape[0]) if scale is None else scale
        if self.data is None:
            array = self.rng.normal(0, scale, shape).astype(np.float32)
            self.inits.append(numpy_helper.from_array(array, name))
            return name
        # Straight into the external file, never held whole in memory, and uniform with the
        # same standard deviation: a normal draw of 2 GiB of weights takes 5x as long. The
        # float32 is made from random bits (a mantissa under the exponent of 1.0: [1, 2)).
        offset = self.data.tell()
        bits = self.rng.integers(0, 2**32, shape, dtype=np.uint32)
        bits >>= 9
        bits |= np.uint32(0x3F800000)
        array = bits.view(np.float32)
        array -= np.float32(1.5)
        array *= np.float32(scale * np.sqrt(12))
        array.tofile(self.data)
        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape))
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (
            ("location", self.location),
            ("offset", offset),
            ("length", array.nbytes),
        ):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
        self.inits.append(tensor)
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], name: str, outputs: int = 1, **attrs) -> list[str]:
        outs = [f"{name}_out{i}" if outputs > 1 else f"{name}_out" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs

    def one(self, op: str, inputs: list[str], name: str, **attrs) -> str:
        return self.node(op, inputs, name, **attrs)[0]


def _attention(g: _Graph, x: str, i: int, past_k: str, past_v: str, mask: str) -> tuple[str, ...]:
    p, d = f"/layers.{i}/attn", g.d
    q = g.one("MatMul", [x, g.weight(f"{p}.q.weight", (d.hidden, d.hidden))], f"{p}/q_proj/MatMul")
    k = g.one(
        "MatMul",
        [x, g.weight(f"{p}.k.weight", (d.hidden, d.kv_heads * d.head_dim))],
        f"{p}/k_proj/MatMul",
    )
    v = g.one(
        "MatMul",
        [x, g.weight(f"{p}.v.weight", (d.hidden, d.kv_heads * d.head_dim))],
        f"{p}/v_proj/MatMul",
    )
    groups = d.heads // d.kv_heads
    q5 = g.const(f"{p}.q_shape", np.array([0, 0, d.kv_heads, groups, d.head_dim], np.int64))
    kv4 = g.const(f"{p}.kv_shape", np.array([0, 0, d.kv_heads, d.head_dim], np.int64))
    q = g.one(
        "Transpose", [g.one("Reshape", [q, q5], f"{p}/q_r")], f"{p}/q_t", perm=[0, 2, 3, 1, 4]
    )
    k = g.one("Transpose", [g.one("Reshape", [k, kv4], f"{p}/k_r")], f"{p}/k_t", perm=[0, 2, 1, 3])
    v = g.one("Transpose", [g.one("Reshape", [v, kv4], f"{p}/v_r")], f"{p}/v_t", perm=[0, 2, 1, 3])
    present_k = g.one("Concat", [past_k, k], f"{p}/k_cat", axis=2)
    present_v = g.one("Concat", [past_v, v], f"{p}/v_cat", axis=2)
    axis2 = g.const(f"{p}.axis2", np.array([2], np.int64))
    k5 = g.one("Unsqueeze", [present_k, axis2], f"{p}/k_u")  # [B, KV, 1, S, D]
    v5 = g.one("Unsqueeze", [present_v, axis2], f"{p}/v_u")
    kt = g.one("Transpose", [k5], f"{p}/k_tt", perm=[0, 1, 2, 4, 3])
    scores = g.one("MatMul", [q, kt], f"{p}/scores")  # [B, KV, G, T, S]
    scale = g.const(f"{p}.scale", np.array(1 / np.sqrt(d.head_dim), np.float32))
    scores = g.one("Add", [g.one("Mul", [scores, scale], f"{p}/scale")], f"{p}/mask_add")
    g.nodes[-1].input.append(mask)
    probs = g.one("Softmax", [scores], f"{p}/softmax", axis=-1)
    out = g.one("MatMul", [probs, v5], f"{p}/context")  # [B, KV, G, T, D]
    out = g.one("Transpose", [out], f"{p}/ctx_t", perm=[0, 3, 1, 2, 4])
    flat = g.const(f"{p}.flat", np.array([0, 0, d.hidden], np.int64))
    out = g.one("Reshape", [out, flat], f"{p}/ctx_r")
    out = g.one(
        "MatMul", [out, g.weight(f"{p}.o.weight", (d.hidden, d.hidden))], f"{p}/o_proj/MatMul"
    )
    return out, present_k, present_v


def _swiglu(g: _Graph, x: str, i: int) -> str:
    p, d = f"/layers.{i}/mlp", g.d
    gate = g.one(
        "MatMul", [x, g.weight(f"{p}.gate.weight", (d.hidden, d.ff))], f"{p}/gate_proj/MatMul"
    )
    up = g.one("MatMul", [x, g.weight(f"{p}.up.weight", (d.hidden, d.ff))], f"{p}/up_proj/MatMul")
    silu = g.one("Mul", [gate, g.one("Sigmoid", [gate], f"{p}/sigmoid")], f"{p}/silu")
    act = g.one("Mul", [silu, up], f"{p}/glu")
    return g.one(
        "MatMul", [act, g.weight(f"{p}.down.weight", (d.ff, d.hidden))], f"{p}/down_proj/MatMul"
    )


def _norm(g: _Graph, x: str, name: str) -> str:
    d = g.d
    gamma = g.const(f"{name}.weight", np.ones(d.hidden, np.float32))
    beta = g.const(f"{name}.bias", np.zeros(d.hidden, np.float32))
    return g.one("LayerNormalization", [x, gamma, beta], name, axis=-1)


def _mask(g: _Graph, attention_mask: str, ids: str) -> str:
    """``[B, 1, 1, T, S]`` additive mask: causal (key j <= past + query i) and padding."""
    s_shape = g.one("Shape", [attention_mask], "/mask/shape_s")
    t_shape = g.one("Shape", [ids], "/mask/shape_t")
    one = g.const("/mask.one", np.array([1], np.int64))
    s = g.one("Slice", [s_shape, one, g.const("/mask.two", np.array([2], np.int64))], "/mask/s")
    t = g.one("Slice", [t_shape, one, g.const("/mask.two_t", np.array([2], np.int64))], "/mask/t")
    ts = g.one("Concat", [t, s], "/mask/ts", axis=0)
    ones = g.one(
        "ConstantOfShape", [ts], "/mask/ones", value=helper.make_tensor("v", 1, [1], [1.0])
    )
    shift = g.one("Sub", [s, t], "/mask/shift")
    shift = g.one("Squeeze", [shift], "/mask/shift_s")
    causal = g.one("Trilu", [ones, shift], "/mask/causal", upper=0)  # 1 where visible
    pad = g.one("Cast", [attention_mask], "/mask/pad", to=TensorProto.FLOAT)  # [B, S]
    axes = g.const("/mask.axes", np.array([1, 2, 3], np.int64))
    pad = g.one("Unsqueeze", [pad, axes], "/mask/pad_u")  # [B, 1, 1, 1, S]
    visible = g.one("Mul", [pad, causal], "/mask/visible")  # [B, 1, 1, T, S]
    big = g.const("/mask.big", np.array(-1e9, np.float32))
    hidden = g.one("Sub", [g.const("/mask.one_f", np.array(1.0, np.float32)), visible], "/mask/inv")
    return g.one("Mul", [hidden, big], "/mask/add")


def make_decoder_lm(
    path: str | Path,
    layers: int = 2,
    seed: int = 0,
    dims: Dims = TINY,
    external_data: str | None = None,
) -> Path:
    """Write the decoder (see the module) with ``layers`` blocks of ``dims`` to ``path``; with
    ``external_data``, every weight goes to that file beside ``path`` (written as it is drawn,
    so a model over 2 GB is never one protobuf in memory) and small constants stay inline."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        data = (
            stack.enter_context(open(path.parent / external_data, "wb")) if external_data else None
        )
        model = _decoder(_Graph(np.random.default_rng(seed), dims, data), layers)
    if external_data:
        onnx.save_model(model, str(path))
        onnx.checker.check_model(str(path))  # by path: the external file is checked too
    else:
        onnx.checker.check_model(model)
        onnx.save(model, str(path))
    return path


def _decoder(g: _Graph, layers: int) -> onnx.ModelProto:
    d, ids = g.d, "input_ids"
    x = g.one(
        "Gather", [g.weight("embed_tokens.weight", (d.vocab, d.hidden), 0.5), ids], "/embed/Gather"
    )
    pos = g.one(
        "Gather",
        [g.weight("embed_positions.weight", (d.max_positions, d.hidden), 0.1), "position_ids"],
        "/embed_positions/Gather",
    )
    x = g.one("Add", [x, pos], "/embed/add")
    mask = _mask(g, "attention_mask", ids)
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", d.vocab])
    ]
    for i in range(layers):
        kv = ["batch", d.kv_heads, "past", d.head_dim]
        past = [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, kv) for n in past]
        attn, pk, pv = _attention(g, _norm(g, x, f"/layers.{i}/ln_1"), i, past[0], past[1], mask)
        x = g.one("Add", [x, attn], f"/layers.{i}/res_1")
        x = g.one("Add", [x, _swiglu(g, _norm(g, x, f"/layers.{i}/ln_2"), i)], f"/layers.{i}/res_2")
        for kind, tensor in (("key", pk), ("value", pv)):
            name = f"present.{i}.{kind}"
            g.nodes.append(
                helper.make_node("Identity", [tensor], [name], name=f"/present.{i}.{kind}")
            )
            outputs.append(
                helper.make_tensor_value_info(
                    name, TensorProto.FLOAT, ["batch", d.kv_heads, "total", d.head_dim]
                )
            )
    x = _norm(g, x, "/norm")
    head = g.weight("lm_head.weight", (d.hidden, d.vocab), 2.0 / np.sqrt(d.hidden))
    g.nodes.append(helper.make_node("MatMul", [x, head], ["logits"], name="/lm_head/MatMul"))
    graph = helper.make_graph(g.nodes, "decoder_lm", inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def decoder_lm_data(
    rows: int, seq: int, layers: int = 2, seed: int = 1, dims: Dims = TINY
) -> dict[str, np.ndarray]:
    """Feeds for :func:`make_decoder_lm` without a past: ``rows`` sequences of ``seq`` tokens
    drawn from a seeded generator (a skewed distribution, so that the text has structure),
    every position attended, positions ``0..seq-1`` and an empty past."""
    rng = np.random.default_rng(seed)
    ids = rng.zipf(1.5, (rows, seq)).clip(1, dims.vocab - 1).astype(np.int64)
    feeds = {
        "input_ids": ids,
        "attention_mask": np.ones((rows, seq), np.int64),
        "position_ids": np.broadcast_to(np.arange(seq, dtype=np.int64), (rows, seq)).copy(),
    }
    for i in range(layers):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = np.zeros(
                (rows, dims.kv_heads, 0, dims.head_dim), np.float32
            )
    return feeds
