"""Size-aware per-node allocation for weight-only quantization: each weight MatMul gets the
choice (algorithm, bits, block size, symmetry) that buys the most accuracy for its bytes.

Single-node probe losses add up, so :func:`allocate` solves the multiple-choice knapsack (one
choice per node, bytes under a budget, least sum of losses) by dynamic programming over the
bytes; each allocation then runs as a trial, whose measured metric decides. Bytes are those
``MatMulNBits`` stores (:func:`node_bytes`).

Example:
    >>> node_bytes((512, 256), NodeChoice("rtn", 4, 128, False))
    70144
    >>> losses = {"a": {"4": 5.0, "8": 0.1}, "b": {"4": 1.0, "8": 0.1}}
    >>> sizes = {"a": {"4": 10, "8": 20}, "b": {"4": 10, "8": 20}}
    >>> allocate(losses, sizes, [30, 19])
    [{'a': '8', 'b': '4'}, None]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from raysearch.quantize.backends.weight_only.options import NodeChoice, names_nodes, top_choice

__all__ = [
    "allocate",
    "allocate_within_time",
    "anchor_name",
    "builder_bytes",
    "node_bytes",
    "BUILDER_SETTINGS",
]

#: Bytes per float weight and per block scale (a float32 model's).
FLOAT_BYTES = 4
#: The byte steps :func:`allocate`'s table has between nothing and the budget: a size error
#: of at most ``nodes / STEPS`` of the budget.
STEPS = 2000


#: onnxruntime-genai's model builder's ``-p int4``: RTN, block 32, symmetric (its
#: ``is_symmetric`` default), every weight MatMul.
BUILDER_CHOICE = NodeChoice("rtn", 4, 32, True)
#: The builder's ``-p int4`` as the settings of ``quantizer: weight_only`` (``accuracy_level``
#: 4: int8 compute, as the builder writes it).
BUILDER_SETTINGS = {"quantizer": "weight_only", **BUILDER_CHOICE.settings(), "accuracy_level": 4}


def node_bytes(shape: Sequence[int], choice: NodeChoice | None) -> int:
    """The bytes a weight of ``shape`` (rows = the reduced axis, columns) takes at
    ``choice`` in ``MatMulNBits`` (None: kept float)."""
    rows, columns = int(shape[0]), int(shape[1])
    if choice is None:
        return rows * columns * FLOAT_BYTES
    blocks = -(-rows // choice.block_size)
    packed = columns * blocks * (choice.block_size * choice.bits // 8)
    scales = columns * blocks * FLOAT_BYTES
    zero_points = 0 if choice.symmetric else columns * (-(-blocks * choice.bits // 8))
    return packed + scales + zero_points


def builder_bytes(float_bytes: int, weights: Mapping[str, Sequence[int]]) -> int:
    """The size of the float model of ``float_bytes`` with every weight MatMul of
    ``weights`` at :data:`BUILDER_CHOICE`: what onnxruntime-genai's builder's int4 weighs."""
    saved = sum(node_bytes(s, None) - node_bytes(s, BUILDER_CHOICE) for s in weights.values())
    return int(float_bytes) - saved


def allocate_within_time(
    losses: Mapping[str, Mapping[Any, float]],
    sizes: Mapping[str, Mapping[Any, int]],
    times: Mapping[str, Mapping[Any, float]],
    budgets: Sequence[float],
    limit: float,
) -> list[dict[str, Any] | None]:
    """:func:`allocate` with each plan's time (the sum of its choices' ``times``) at most
    ``limit``: the time priced in at ever higher prices (Lagrangian relaxation), each budget
    taking the plan of the lowest price within ``limit``; None where none is.

    Example:
        >>> losses = {"a": {"4": 5.0, "8": 0.1}, "b": {"4": 3.0, "8": 0.1}}
        >>> sizes = {"a": {"4": 10, "8": 20}, "b": {"4": 10, "8": 20}}
        >>> times = {"a": {"4": 1.0, "8": 3.0}, "b": {"4": 1.0, "8": 1.5}}
        >>> allocate_within_time(losses, sizes, times, [40, 30], limit=3.0)
        [{'a': '4', 'b': '8'}, {'a': '4', 'b': '8'}]
        >>> allocate_within_time(losses, sizes, times, [40], limit=1.5)
        [None]
    """
    spread_loss = sum(max(v.values()) - min(v.values()) for v in losses.values())
    spread_time = sum(max(times[n].values()) - min(times[n].values()) for n in losses)
    scale = spread_loss / spread_time if spread_time > 0 else 1.0
    out: list[dict[str, Any] | None] = [None for _ in budgets]
    for price in [0.0, *(scale * 2.0**k for k in range(-12, 13))]:
        priced = {n: {c: v + price * times[n][c] for c, v in losses[n].items()} for n in losses}
        for i, plan in enumerate(allocate(priced, sizes, budgets)):
            if out[i] is None and plan is not None:
                if sum(times[n][c] for n, c in plan.items()) <= limit:
                    out[i] = plan
        if all(plan is not None for plan in out):
            break
    return out


def allocate(
    losses: Mapping[str, Mapping[Any, float]],
    sizes: Mapping[str, Mapping[Any, int]],
    budgets: Sequence[float],
) -> list[dict[str, Any] | None]:
    """For each of ``budgets``, the choice per node whose bytes add up to at most that budget
    with the least sum of losses; None where even the smallest choices exceed it. One table
    serves every budget, exact up to :data:`STEPS` byte steps (bytes rounded up)."""
    nodes = [n for n in losses if losses[n]]
    smallest = {n: min(sizes[n][c] for c in losses[n]) for n in nodes}
    floor = sum(smallest.values())
    room = max(budgets, default=0.0) - floor
    if room < 0:
        return [None for _ in budgets]
    unit = max(1.0, room / STEPS)
    width = int(room // unit) + 1
    # best[w]: the least loss of the nodes so far within w units above their smallest choices
    best = np.zeros(width)
    picks = []
    for node in nodes:
        options = list(losses[node])
        table = np.full((len(options), width), np.inf)
        for i, choice in enumerate(options):
            cost = math.ceil((sizes[node][choice] - smallest[node]) / unit)
            if cost < width:
                table[i, cost:] = best[: width - cost] + losses[node][choice]
        pick = table.argmin(axis=0)
        best = table[pick, np.arange(width)]
        picks.append([options[i] for i in pick])
    out: list[dict[str, Any] | None] = []
    for budget in budgets:
        if budget - floor < 0:
            out.append(None)
            continue
        w = min(width - 1, int((budget - floor) // unit))
        chosen: dict[str, Any] = {}
        for node, pick in zip(reversed(nodes), reversed(picks)):
            choice = pick[w]
            chosen[node] = choice
            w -= math.ceil((sizes[node][choice] - smallest[node]) / unit)
        out.append({node: chosen[node] for node in nodes})
    return out


#: The uniform settings one-shot tools write, by name (``accuracy_level`` 4 for the builder).
ANCHORS = {
    "onnxruntime-genai builder's int4": (BUILDER_CHOICE, 4),
    "ONNX Runtime's and Olive's default": (NodeChoice("rtn", 4, 128, True), None),
    "ONNX Runtime's class default": (NodeChoice("rtn", 4, 128, False), None),
}


def anchor_name(settings: Mapping[str, Any]) -> str | None:
    """The one-shot tool whose model ``settings`` write (weight-only, every weight MatMul at
    one choice), or None.

    Example:
        >>> anchor_name({"quantizer": "weight_only", "block_size": 32, "symmetric": True,
        ...              "accuracy_level": 4})
        "onnxruntime-genai builder's int4"
        >>> anchor_name({"quantizer": "weight_only", "nodes_8bit": ["a"]}) is None
        True
    """
    if settings.get("quantizer") != "weight_only" or settings.get("quantize_embeddings"):
        return None
    if names_nodes(settings):
        return None
    choice, level = top_choice(settings), int(settings.get("accuracy_level") or 0)
    for name, (anchor, wanted) in ANCHORS.items():
        if choice == anchor and (wanted is None or level == wanted):
            return name
    return None
