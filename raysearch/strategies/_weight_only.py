"""The ``WeightOnly`` strategy: weight-only quantization of a language model
(``quantizer: weight_only``) in ordered stages, each built from the records before it only:

1. ``defaults``: the space's ``points_to_evaluate``, else its first setting.
2. ``blocks``: the space's grid, or TPE over it when larger than half the trial budget.
3. ``sensitivity``: the *base* (the best metric among the settings within
   :data:`SIZE_SLACK` of the smallest model) probed per weight MatMul, that node alone at
   the base's precision and every other float, and under each other choice of the
   :func:`menu`. Probes are never candidates and are reused from the probe cache.
4. ``allocation``: per size of a ladder, the per-node choices whose probes' losses add up
   least (:mod:`raysearch.strategies._allocation`), within the builder's decode step with
   ``max_decode_latency: builder``.
5. ``promotions``: the base with its ``k`` most sensitive nodes one step up, by sensitivity
   and by gain per byte (:func:`by_gain_per_byte`).
6. ``refinement``: allocations at the finer ladders of :data:`REFINEMENTS`.

Example:
    >>> promoted({"bits": 4, "block_size": 128}, ["c", "a", "b"], 2)
    {'bits': 4, 'block_size': 128, 'nodes_8bit': ['c', 'a']}
    >>> probe({"bits": 8}, ["a", "b", "c"], "b")
    {'bits': 8, 'nodes_8bit': ['b'], 'nodes_float': ['a', 'c']}
    >>> by_gain_per_byte([("big", 0.9), ("small", 0.5), ("least", 0.1)],
    ...                  {"big": (1024, 1024), "small": (64, 64), "least": (64, 64)}, 4, False)
    ['small', 'big', 'least']
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from raysearch.quantize.backends.weight_only.options import (
    NodeChoice,
    names_nodes,
    node_choices,
    top_choice,
)
from raysearch.ranking import PROBE_STAGE, finite, order
from raysearch.strategies._allocation import (
    allocate,
    allocate_within_time,
    builder_bytes,
    node_bytes,
)
from raysearch.strategies._registry import Phase, Proposal, StrategyContext, register_strategy
from raysearch.strategies._roles import complete_point
from raysearch.strategies._stages import BuiltPhase, ListPhase, distinct_accepted, sub_phase
from raysearch.trialrecord import TrialRecord

__all__ = ["PROMOTIONS", "base_record", "ranking", "probe", "promoted"]

_logger = logging.getLogger(__name__)

#: How many of the most sensitive nodes the promotions stage moves one step up.
PROMOTIONS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
#: A base is chosen among the settings whose model is within this factor of the smallest.
SIZE_SLACK = 1.05
#: The stages that give the base.
BASE_STAGES = ("defaults", "blocks")
#: The node lists a probe or a promotion writes (the backend's per-node precision).
_LISTS = ("nodes_4bit", "nodes_8bit", "nodes_float")
#: The per-node settings a menu probe or an allocation writes.
_NODE_SETTINGS = "node_settings"
#: The most 4-bit choices of the menu beside the base's.
MENU_MORE = 2
#: A uniform setting that decodes over this many times slower than the base is no choice.
MENU_DECODE_SLACK = 2.0
#: Algorithms no menu offers: HQQ's float zero points run without ONNX Runtime's int8-compute
#: kernel, far slower than float on CPU.
SLOW_ALGORITHMS = ("hqq",)
#: The roundings whose 8-bit form is the menu's step up from a base at 4 bits by them (GPTQ's
#: carries its error at 8 bits too); any other base steps up to RTN's.
EIGHT_BIT_ALGORITHMS = ("rtn", "gptq")
#: The allocation ladder's sizes between its smallest and largest, beside its named ones.
LADDER_STEPS = 6
#: The refinement stages' ladders, for a search with the time to run them.
REFINEMENTS = (20, 60)


def _bits(settings: Mapping[str, Any]) -> int:
    return int(settings.get("bits") or 4)


def _base(settings: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if k not in _LISTS}


def probe(base: Mapping[str, Any], nodes: Sequence[str], node: str) -> dict[str, Any]:
    """``base`` with ``node`` alone at the base's precision and every other node float."""
    key = "nodes_8bit" if _bits(base) == 8 else "nodes_4bit"
    return {**_base(base), key: [node], "nodes_float": [n for n in nodes if n != node]}


def promoted(base: Mapping[str, Any], ranked: Sequence[str], k: int) -> dict[str, Any]:
    """``base`` with the first ``k`` of ``ranked`` one step up (8 bits, or float from 8)."""
    key = "nodes_float" if _bits(base) == 8 else "nodes_8bit"
    return {**_base(base), key: list(ranked[:k])}


def base_record(records: Sequence[TrialRecord], higher_is_better: bool) -> TrialRecord | None:
    """Among the finished records of :data:`BASE_STAGES` within :data:`SIZE_SLACK` of the
    smallest model (:data:`SLOW_ALGORITHMS` only when there is no other, and those that
    decode slower than ``max_decode_latency`` only when no other does), the one with the
    best metric (the earliest on a tie); None without one.

    Example:
        >>> rows = [TrialRecord(stage="blocks", status="ok", metric=m, model_size_bytes=s,
        ...                     trial_id=t) for t, m, s in [("a", 0.5, 100), ("b", 0.2, 105),
        ...                                                 ("c", 0.1, 200)]]
        >>> base_record(rows, higher_is_better=False).trial_id
        'b'
    """
    done = [
        r
        for r in records
        if r.stage in BASE_STAGES
        and r.ok
        and finite(r.metric) is not None
        and r.model_size_bytes
        and not r.stopped_at_rung
    ]
    if not done:
        return None
    fast = [r for r in done if (r.settings or {}).get("algorithm") not in SLOW_ALGORITHMS]
    done = fast or done
    # what decodes within max_decode_latency: the allocation can only trade its speed away
    within = [r for r in done if not r.extra.get("decode_over_bound")]
    done = within or done
    smallest = min(float(r.model_size_bytes) for r in done)
    small = [r for r in done if float(r.model_size_bytes) <= SIZE_SLACK * smallest]
    sign = -1.0 if higher_is_better else 1.0
    # the first of equal metrics by start order
    return min(order(small), key=lambda r: sign * float(r.metric))


def ranking(
    records: Sequence[TrialRecord], base: TrialRecord, higher_is_better: bool
) -> list[tuple[str, float]]:
    """The probes of ``base`` that finished, most sensitive first: ``(node, metric)``; of
    equal metrics, the probe started first first (not the one that finished first)."""
    key = "nodes_8bit" if _bits(base) == 8 else "nodes_4bit"
    wanted = _base(base)
    scored = []
    for r in order(records):
        settings = r.settings or {}
        if r.stage != PROBE_STAGE or _base(settings) != wanted:
            continue
        if not r.ok or finite(r.metric) is None:
            continue
        scored.append((settings[key][0], float(r.metric)))
    # the worst metric first: lower is worse when higher is better
    return sorted(scored, key=lambda item: item[1] if higher_is_better else -item[1])


def by_gain_per_byte(
    ranked: Sequence[tuple[str, float]],
    weights: Mapping[str, Sequence[int]],
    bits: int,
    higher_is_better: bool,
) -> list[str] | None:
    """The nodes of ``ranked`` (``(node, probe metric)``) by what promoting each one step up
    gains per byte it adds (the gain over the least sensitive node's probe); ties keep
    ``ranked``'s order. None when a node's weight shape is unknown."""
    if not ranked or any(node not in weights for node, _ in ranked):
        return None
    metrics = [metric for _, metric in ranked]
    floor = max(metrics) if higher_is_better else min(metrics)
    added_bits = 4 if bits == 4 else 24

    def per_byte(item: tuple[str, float]) -> float:
        node, metric = item
        gain = floor - metric if higher_is_better else metric - floor
        return gain / max(1.0, math.prod(weights[node]) * added_bits / 8)

    return [node for node, _ in sorted(ranked, key=per_byte, reverse=True)]


def reused_probes(records: Sequence[TrialRecord], base: TrialRecord) -> set[str]:
    """The nodes whose probe of ``base`` an earlier search measured (``reused_from``: taken
    from the probe cache instead of run)."""
    key = "nodes_8bit" if _bits(base) == 8 else "nodes_4bit"
    wanted = _base(base)
    return {
        (r.settings or {})[key][0]
        for r in records
        if r.stage == PROBE_STAGE and r.reused_from and _base(r.settings or {}) == wanted
    }


def _same_but_choice(settings: Mapping[str, Any], base: Mapping[str, Any]) -> bool:
    """Whether ``settings`` equals ``base`` but for the choice of every node."""
    keys = ("algorithm", "bits", "block_size", "symmetric", *_LISTS, _NODE_SETTINGS)
    strip = lambda d: {k: v for k, v in d.items() if k not in keys}  # noqa: E731
    return strip(settings) == strip(base)


def menu(
    records: Sequence[TrialRecord], base: TrialRecord, higher_is_better: bool
) -> list[NodeChoice]:
    """The choices the probes measure each node under, the base's first: up to
    :data:`MENU_MORE` uniform settings of stages 1-2 on the size/metric front, more accurate
    than the base and not over :data:`MENU_DECODE_SLACK` times its decode step (the most
    accurate, then those nearest halfway to it in size); the base's block at 8 bits, by the
    base's rounding where :data:`EIGHT_BIT_ALGORITHMS` has it, else by RTN."""
    settings = base.settings or {}
    own = top_choice(settings)
    sign = -1.0 if higher_is_better else 1.0
    decode = base.decode_latency_ms
    rows = []
    for r in records:
        other = r.settings or {}
        if r.stage not in BASE_STAGES or not r.ok:
            continue
        if finite(r.metric) is None or not r.model_size_bytes or names_nodes(other):
            continue
        if r.stopped_at_rung or not _same_but_choice(other, settings):
            continue
        slow = r.decode_latency_ms
        if decode and slow and slow > MENU_DECODE_SLACK * decode:
            continue
        if other.get("algorithm") in SLOW_ALGORITHMS:
            continue
        rows.append((float(r.model_size_bytes), sign * float(r.metric), top_choice(other)))
    base_loss = sign * float(base.metric)
    base_size = float(base.model_size_bytes)
    # the front's settings more accurate than the base, the most accurate first
    better = sorted(
        (row for row in rows
         if row[2] != own and row[2].bits == own.bits and row[1] < base_loss
         and not any(s2 <= row[0] and l2 < row[1] for s2, l2, _ in rows)),
        key=lambda row: row[1],
    )  # fmt: skip
    out = [own]
    if better:
        out.append(better[0][2])
        # then the sizes between: the one nearest halfway from the base to the most accurate
        middle = (base_size + better[0][0]) / 2
        rest = sorted(better[1:], key=lambda row: abs(row[0] - middle))
        out += [row[2] for row in rest[: MENU_MORE - 1] if row[2] not in out]
    if own.bits == 4:
        eight = own.algorithm if own.algorithm in EIGHT_BIT_ALGORITHMS else "rtn"
        out.append(NodeChoice(eight, 8, own.block_size, True))
    return out


def menu_probe(
    base: Mapping[str, Any], nodes: Sequence[str], node: str, choice: NodeChoice
) -> dict[str, Any]:
    """``base`` with ``node`` alone at ``choice`` and every other node float."""
    return {
        **_base(base),
        _NODE_SETTINGS: {node: choice.settings()},
        "nodes_float": [n for n in nodes if n != node],
    }


def probe_losses(
    records: Sequence[TrialRecord], base: TrialRecord, higher_is_better: bool
) -> dict[str, dict[NodeChoice, float]]:
    """What each node's probes measured, by choice (negated when higher is better)."""
    wanted = _base(base)
    own = top_choice(base)
    sign = -1.0 if higher_is_better else 1.0
    out: dict[str, dict[NodeChoice, float]] = {}
    for r in order(records):
        settings = r.settings or {}
        if r.stage != PROBE_STAGE or not r.ok:
            continue
        if finite(r.metric) is None:
            continue
        per_node = settings.get(_NODE_SETTINGS) or {}
        plain = {k: v for k, v in settings.items() if k != _NODE_SETTINGS}
        if _base(plain) != wanted:
            continue
        if len(per_node) > 1:  # the whole model at one choice, for its decode step
            continue
        if per_node:
            ((node, entry),) = per_node.items()
            choice = top_choice({**wanted, **entry})
        else:
            key = "nodes_8bit" if settings.get("nodes_8bit") else "nodes_4bit"
            if not settings.get(key):
                continue
            node = settings[key][0]
            choice = own._replace(bits=8) if key == "nodes_8bit" else own
        out.setdefault(node, {})[choice] = sign * float(r.metric)
    return out


def decode_ratio(record: TrialRecord) -> float | None:
    """A trial's decode step over the builder's int4's (``max_decode_latency: builder``)."""
    anchor = record.extra.get("builder_decode_latency_ms")
    own = record.decode_latency_ms
    if finite(anchor) is None or finite(own) is None or anchor <= 0:
        return None
    return float(own) / float(anchor)


def uniform_choice(settings: Mapping[str, Any], nodes: Sequence[str]) -> NodeChoice | None:
    """The one choice every node of ``nodes`` has under ``settings`` (a uniform setting, or
    one that names each node at the same choice), else None."""
    choices = set(node_choices(settings, nodes).values())
    choice = choices.pop() if len(choices) == 1 else None
    return choice if isinstance(choice, NodeChoice) else None


def decode_ratios(
    records: Sequence[TrialRecord], base: TrialRecord, nodes: Sequence[str]
) -> dict[NodeChoice, float]:
    """Each choice's decode step over the builder's (:func:`decode_ratio`, the median of the
    models that have every node at that choice and otherwise the base's settings)."""
    settings = base.settings or {}
    seen: dict[NodeChoice, list[float]] = {}
    for r in records:
        other = r.settings or {}
        ratio = decode_ratio(r)
        if not r.ok or ratio is None or not _same_but_choice(other, settings):
            continue
        choice = uniform_choice(other, nodes)
        if choice is not None:
            seen.setdefault(choice, []).append(ratio)
    return {c: sorted(v)[len(v) // 2] for c, v in seen.items()}


def whole_model(
    base: Mapping[str, Any], nodes: Sequence[str], choice: NodeChoice
) -> dict[str, Any]:
    """``base`` with every node of ``nodes`` at ``choice`` (``node_settings``)."""
    return {**_base(base), _NODE_SETTINGS: {n: choice.settings() for n in nodes}}


def allocations(
    context: StrategyContext, base: TrialRecord, steps: int = LADDER_STEPS
) -> list[tuple[float, dict[str, Any]]]:
    """The settings of an allocation stage with ``steps`` sizes between the ladder's
    smallest and largest, each with the size it is planned to have."""
    settings = base.settings or {}
    weights = context.model.weights
    losses = probe_losses(context.records, settings, context.mode == "max")
    choices = menu(context.records, base, context.mode == "max")
    own = top_choice(settings)
    nodes = [n for n in context.model.weight_matmuls if own in losses.get(n, {})]
    if not nodes or len(nodes) < len(context.model.weight_matmuls):
        return []
    if any(n not in weights for n in nodes) or len(choices) < 2:
        return []
    table = {n: {c: v for c, v in losses[n].items() if c in choices} for n in nodes}
    sizes = {n: {c: node_bytes(weights[n], c) for c in table[n]} for n in nodes}
    rest = float(base.model_size_bytes) - sum(sizes[n][own] for n in nodes)
    smallest = rest + sum(min(sizes[n].values()) for n in nodes)
    largest = rest + sum(max(sizes[n].values()) for n in nodes)
    named = [rest + sum(sizes[n].get(c, sizes[n][own]) for n in nodes) for c in choices]
    float_bytes = rest + sum(node_bytes(weights[n], None) for n in nodes)
    named.append(builder_bytes(int(float_bytes), {n: weights[n] for n in nodes}))
    cap = context.size_budget_bytes
    if cap is not None:
        named.append(cap)
        largest = min(largest, cap)
    ladder = [smallest + (largest - smallest) * (i + 1) / (steps + 1)
              for i in range(steps)]  # fmt: skip
    budgets = sorted({b for b in [*named, *ladder, largest] if smallest <= b <= largest})
    out: list[tuple[float, dict[str, Any]]] = []
    seen: set[str] = set()
    ratios = decode_ratios(context.records, base, nodes) if decode_ratio(base) else {}
    if own not in ratios:
        plans = allocate(table, sizes, [b - rest for b in budgets])
    else:
        # within the builder's decode step: each node's share of the weights at its choice's
        # step over the builder's
        total = sum(math.prod(weights[n]) for n in nodes)
        table = {n: {c: v for c, v in table[n].items() if c in ratios} for n in nodes}
        times = {n: {c: math.prod(weights[n]) / total * ratios[c] for c in table[n]}
                 for n in nodes}  # fmt: skip
        plans = allocate_within_time(table, sizes, times, [b - rest for b in budgets], 1.0)
    for picked in plans:
        if picked is None:
            continue
        per_node = {n: c.settings() for n, c in picked.items() if c != own}
        key = repr(sorted((n, c.label()) for n, c in picked.items()))
        if key in seen or not per_node:
            continue
        seen.add(key)
        planned = rest + sum(sizes[n][c] for n, c in picked.items())
        out.append((planned, {**_base(settings), _NODE_SETTINGS: per_node}))
    return out


class _Sensitivity(BuiltPhase):
    """Stage 3: the per-layer probes of the base: never candidates nor ``best/``."""

    stage = PROBE_STAGE

    def build(self, context: StrategyContext) -> list[dict[str, Any]] | None:
        base = base_record(context.records, context.mode == "max")
        nodes = list(context.model.weight_matmuls)
        if base is None or not nodes:
            _logger.info(
                "weight_only: no sensitivity stage (%s)",
                "no setting finished" if base is None else "the model has no weight MatMul",
            )
            return None
        settings = base.settings or {}
        # the menu's probes serve the allocation, which needs every weight's shape
        known = all(n in context.model.weights for n in nodes)
        choices = menu(context.records, base, context.mode == "max") if known else []
        _logger.info(
            "weight_only: probing %d weight MatMuls of trial %s (metric %s) under %s",
            len(nodes),
            base.trial_id,
            base.metric,
            ", ".join(c.label() for c in choices) or top_choice(settings).label(),
        )
        out = [probe(settings, nodes, node) for node in nodes]
        out += [menu_probe(settings, nodes, node, c) for c in choices[1:] for node in nodes]
        if decode_ratio(base) is not None:
            # the choices no uniform model timed, whole, for their decode step
            timed = decode_ratios(context.records, base, nodes)
            out += [whole_model(settings, nodes, c) for c in choices if c not in timed]
        return out

    def proposals(self, settings: Sequence[Mapping[str, Any]]) -> list[Proposal]:
        """The probes, each ``reusable`` from the probe cache."""
        out = super().proposals(settings)
        for proposal in out:
            proposal.reusable = True
        return out


class _Promotions(BuiltPhase):
    """Stage 4: the base with its most sensitive nodes one step up (see the module)."""

    stage = "promotions"

    def build(self, context: StrategyContext) -> list[dict[str, Any]] | None:
        higher = context.mode == "max"
        base = base_record(context.records, higher)
        if base is None:
            return None
        settings = base.settings or {}
        ranked = ranking(context.records, settings, higher)
        if not ranked:
            _logger.info("weight_only: no probe finished; no promotions")
            return None
        reused = reused_probes(context.records, settings)
        _logger.info(
            "weight_only: sensitivity ranking (most sensitive first%s): %s",
            f"; {len(reused)} of {len(ranked)} probes reused from an earlier search, marked *"
            if reused
            else "",
            ", ".join(
                f"{node}{'*' if node in reused else ''} {metric:.4g}" for node, metric in ranked
            ),
        )
        nodes = [node for node, _ in ranked]
        ks = [k for k in PROMOTIONS if k < len(nodes)]
        out = [promoted(settings, nodes, k) for k in ks]
        per_byte = by_gain_per_byte(ranked, context.model.weights, _bits(settings), higher)
        if per_byte is not None:
            seen = [frozenset(nodes[:k]) for k in ks]
            out += [promoted(settings, per_byte, k) for k in ks
                    if frozenset(per_byte[:k]) not in seen]  # fmt: skip
        return out


class _Allocation(BuiltPhase):
    """Stage 4, and the refinements after the promotions: the per-node choices of
    :func:`allocations` at ``steps`` sizes (one an earlier stage ran is not run again)."""

    stage = "allocation"

    def __init__(self, index: int, steps: int = LADDER_STEPS, stage: str = "allocation"):
        super().__init__(index)
        self.steps = steps
        self.stage = stage

    def build(self, context: StrategyContext) -> list[dict[str, Any]] | None:
        base = base_record(context.records, context.mode == "max")
        if base is None:
            return None
        planned = allocations(context, base, self.steps)
        if not planned:
            _logger.info(
                "weight_only: no allocation (a node without its base probe, a weight's shape "
                "unknown, or one choice only)"
            )
            return None
        _logger.info(
            "weight_only: %s: %d allocations planned at %s MB",
            self.stage,
            len(planned),
            ", ".join(f"{size / 1e6:.3g}" for size, _ in planned),
        )
        return [settings for _, settings in planned]


class _Defaults(ListPhase):
    stage = "defaults"


def _defaults(context: StrategyContext) -> Phase:
    """Stage 1: the spaces' ``points_to_evaluate`` (completed with each space's first
    values), else each space's first setting."""
    proposals = [
        Proposal.of(space, index, complete_point(space, point))
        for index, space in enumerate(context.spaces)
        for point in space.points_to_evaluate or [{}]
    ]
    return _Defaults(distinct_accepted(proposals, context.reject, "defaults"), "defaults")


@register_strategy("WeightOnly", aliases=("weight_only",))
def weight_only_strategy(context: StrategyContext) -> list[Phase]:
    """WeightOnly: defaults, blocks, sensitivity, allocation, promotions, refinements."""
    budget = max(1, context.max_trials // 2) if context.max_trials else None
    blocks = [
        sub_phase(context, space, index, budget, "blocks")
        for index, space in enumerate(context.spaces)
    ]
    n = len(context.spaces)
    refinements = [_Allocation(n, steps, "refinement") for steps in REFINEMENTS]
    return [
        _defaults(context),
        *blocks,
        _Sensitivity(n),
        _Allocation(n),
        _Promotions(n),
        *refinements,
    ]
