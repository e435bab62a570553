"""The weight-only backend's settings catalogue and the combinations it refuses.

``quantizer: weight_only`` writes ONNX Runtime's ``MatMulNBits`` (blocked 4- or 8-bit
weights, float activations). A key the quantizer cannot honour with the others is refused by
:func:`reject_reason` in one line before anything runs. Pure data: imports neither ONNX
Runtime nor PyTorch.

- ``algorithm``: ``rtn`` (default), ``hqq`` (its 8-bit nodes are rounded by RTN; ``bits: 8``
  is refused), ``k_quant``, ``gptq`` (raysearch's GPTQ on the calibration data's Hessians,
  ``_gptq``), ``source`` (the node's ``MatMulNBits`` from ``weight_source``).
- ``bits`` 4 or 8 (4); ``block_size`` 16-256, a power of two (128); ``symmetric`` (true;
  ``rtn``, ``gptq`` and ``source`` only); ``accuracy_level`` 0-4 (unset).
- ``weight_source``: an ONNX model or client folder, a fixed top-level setting.
- ``quantize_embeddings``: the embedding ``Gather`` as ``GatherBlockQuantized`` (``rtn``, 4
  bits, QOperator); ``quant_format``: ``QOperator`` or ``QDQ`` (``rtn`` at 4 bits only).
- ``nodes_4bit``, ``nodes_8bit``, ``nodes_float``: per-node precision (a node in two is
  refused); ``node_settings``: a node's own ``algorithm``, ``bits``, ``block_size`` and
  ``symmetric`` (what the ``WeightOnly`` strategy's allocation stage writes).

Example:
    >>> WEIGHT_ONLY_CATALOGUE.spec("", "algorithm").choices
    ('rtn', 'hqq', 'k_quant', 'gptq', 'source')
    >>> reject_reason({"block_size": 48})
    'block_size 48: MatMulNBits needs a power of two from 16 to 256'
    >>> reject_reason({"algorithm": "hqq", "symmetric": True})
    'algorithm hqq has no symmetric form (its zero points are float): leave symmetric unset'
    >>> node_choices({"block_size": 64, "node_settings": {"a": {"bits": 8}}}, ["a", "b"])["a"]
    NodeChoice(algorithm='rtn', bits=8, block_size=64, symmetric=True)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from raysearch.quantize.registry import first_refusal
from raysearch.space.catalogue import (
    QUANTIZER,
    Catalogue,
    OptionSpec,
    check_value,
    register_catalogue,
)

__all__ = [
    "WEIGHT_ONLY_CATALOGUE",
    "SETTINGS",
    "ALGORITHMS",
    "SYMMETRIC_ALGORITHMS",
    "DEFAULTS",
    "FLOAT",
    "node_precisions",
    "NODE_LISTS",
    "NODE_SETTINGS",
    "NODE_KEYS",
    "NodeChoice",
    "names_nodes",
    "node_choices",
    "top_choice",
    "reject_reason",
]

ALGORITHMS = ("rtn", "hqq", "k_quant", "gptq", "source")
#: The algorithms whose ``symmetric`` is a choice (HQQ and k-quant always write zero points).
SYMMETRIC_ALGORITHMS = ("rtn", "gptq", "source")
#: The precision of a node kept float (``nodes_float``).
FLOAT = "float"
#: What a setting the space did not set means (ONNX Runtime's defaults: block 128, symmetric).
DEFAULTS: dict[str, Any] = {
    "algorithm": "rtn",
    "bits": 4,
    "block_size": 128,
    "symmetric": True,
    "accuracy_level": 0,
    "quantize_embeddings": False,
    "quant_format": "QOperator",
}
SETTINGS: dict[str, OptionSpec] = {
    "quantizer": QUANTIZER,
    "algorithm": OptionSpec("enum", "how weights are rounded to their blocks", ALGORITHMS),
    "bits": OptionSpec("enum", "bits per weight of the nodes no node list names", (4, 8)),
    "block_size": OptionSpec("int", "weights per scale (a power of two)", low=16, high=256),
    "symmetric": OptionSpec("bool", "symmetric blocks, no zero point (rtn, gptq, source)"),
    "weight_source": OptionSpec(
        "str", "a model or client folder whose MatMulNBits algorithm source takes"
    ),
    "accuracy_level": OptionSpec(
        "int", "MatMulNBits compute type: 0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8", low=0, high=4
    ),
    "quantize_embeddings": OptionSpec("bool", "embedding Gathers as GatherBlockQuantized"),
    "quant_format": OptionSpec("enum", "MatMulNBits or DequantizeLinear", ("QOperator", "QDQ")),
    "nodes_4bit": OptionSpec("str_list", "weight MatMul node names at 4 bits"),
    "nodes_8bit": OptionSpec("str_list", "weight MatMul node names at 8 bits"),
    "nodes_float": OptionSpec("str_list", "weight MatMul node names kept float"),
    "node_settings": OptionSpec(
        "mapping", "per weight MatMul: its own algorithm, bits, block_size and symmetric"
    ),
}
#: The settings ``node_settings`` can give one node.
NODE_SETTINGS = ("algorithm", "bits", "block_size", "symmetric")
#: The per-node precision settings and the precision each names.
NODE_LISTS: dict[str, int | str] = {"nodes_4bit": 4, "nodes_8bit": 8, "nodes_float": FLOAT}
#: The settings that name nodes of the model, checked against it before the search.
NODE_KEYS = (*NODE_LISTS, "node_settings")

#: The ``weight_only`` backend's catalogue, registered for the space to validate against.
WEIGHT_ONLY_CATALOGUE = register_catalogue(Catalogue("weight_only", SETTINGS))


def node_precisions(settings: Mapping[str, Any]) -> dict[str, int | str]:
    """Each listed node's precision: 4, 8 or :data:`FLOAT` (ValueError for a node in two lists).

    Example:
        >>> node_precisions({"nodes_8bit": ["a"], "nodes_float": ["b"]})
        {'a': 8, 'b': 'float'}
    """
    out: dict[str, int | str] = {}
    for key, precision in NODE_LISTS.items():
        for name in settings.get(key) or ():
            if name in out and out[name] != precision:
                raise ValueError(f"node '{name}' is in two of nodes_4bit, nodes_8bit, nodes_float")
            out[str(name)] = precision
    return out


class NodeChoice(NamedTuple):
    """How one weight MatMul is quantized."""

    algorithm: str
    bits: int
    block_size: int
    #: False for k-quant and HQQ, which always write zero points.
    symmetric: bool

    def settings(self) -> dict[str, Any]:
        """The ``node_settings`` entry (``symmetric`` only where the algorithm takes it)."""
        out: dict[str, Any] = {
            "algorithm": self.algorithm,
            "bits": self.bits,
            "block_size": self.block_size,
        }
        if self.algorithm in SYMMETRIC_ALGORITHMS:
            out["symmetric"] = self.symmetric
        return out

    def label(self) -> str:
        """``rtn/4/32/sym``: how the log and the report name the choice."""
        symmetry = "sym" if self.symmetric else "asym"
        return f"{self.algorithm}/{self.bits}/{self.block_size}/{symmetry}"


def top_choice(settings: Mapping[str, Any]) -> NodeChoice:
    """The choice of a node nothing names: :data:`DEFAULTS` for what is unset (HQQ's 8 bits: RTN).

    Example:
        >>> top_choice({"algorithm": "k_quant", "block_size": 32})
        NodeChoice(algorithm='k_quant', bits=4, block_size=32, symmetric=False)
    """
    algorithm, bits = str(_get(settings, "algorithm")), int(_get(settings, "bits"))
    if algorithm == "hqq" and bits == 8:
        algorithm = "rtn"
    symmetric = bool(_get(settings, "symmetric")) if algorithm in SYMMETRIC_ALGORITHMS else False
    return NodeChoice(algorithm, bits, int(_get(settings, "block_size")), symmetric)


def names_nodes(settings: Mapping[str, Any]) -> bool:
    """Whether ``settings`` name any node (:data:`NODE_KEYS`): no uniform setting."""
    return any(settings.get(key) for key in NODE_KEYS)


def node_choices(settings: Mapping[str, Any], names: Iterable[str]) -> dict[str, NodeChoice | str]:
    """Each of ``names``' choice: ``node_settings`` over its node list over the top level.

    Example:
        >>> node_choices({"algorithm": "hqq", "nodes_8bit": ["a"]}, ["a"])["a"].algorithm
        'rtn'
    """
    lists = node_precisions(settings)
    per_node = settings.get("node_settings") or {}
    top = {k: v for k, v in settings.items() if k in NODE_SETTINGS}
    out: dict[str, NodeChoice | str] = {}
    for name in names:
        precision = lists.get(name, _get(settings, "bits"))
        if precision == FLOAT:
            out[name] = FLOAT
            continue
        own = {k: v for k, v in (per_node.get(name) or {}).items() if v is not None}
        out[name] = top_choice({**top, "bits": precision, **own})
    return out


def _get(settings: Mapping[str, Any], key: str) -> Any:
    value = settings.get(key)
    return DEFAULTS[key] if value is None else value


def _reject_block(settings: Mapping[str, Any]) -> str | None:
    block = int(_get(settings, "block_size"))
    if block < 16 or block > 256 or block & (block - 1):
        return f"block_size {block}: MatMulNBits needs a power of two from 16 to 256"
    return None


def _reject_symmetric(settings: Mapping[str, Any]) -> str | None:
    algorithm = _get(settings, "algorithm")
    if settings.get("symmetric") is True and algorithm == "hqq":
        return (
            "algorithm hqq has no symmetric form (its zero points are float): leave symmetric unset"
        )
    if settings.get("symmetric") is True and algorithm == "k_quant":
        return "algorithm k_quant always writes zero points: leave symmetric unset"
    return None


def _reject_source(settings: Mapping[str, Any]) -> str | None:
    per_node = settings.get("node_settings") or {}
    algorithms = {settings.get("algorithm")} | {
        own.get("algorithm") for own in per_node.values() if isinstance(own, Mapping)
    }
    if "source" in algorithms and not settings.get("weight_source"):
        return (
            "algorithm source takes its weights from weight_source: set it to the model or "
            "folder whose MatMulNBits a library wrote"
        )
    return None


def _reject_node_bits(settings: Mapping[str, Any]) -> str | None:
    try:
        node_precisions(settings)
    except ValueError as exc:
        return str(exc)
    if int(_get(settings, "bits")) == 8 and _get(settings, "algorithm") == "hqq":
        return (
            "algorithm hqq at 8 bits writes float zero points, which ONNX Runtime 1.31's CPU "
            "MatMulNBits runs at 2 and 4 bits only: use rtn or k_quant with bits 8"
        )
    return None


def _reject_embeddings(settings: Mapping[str, Any]) -> str | None:
    if not settings.get("quantize_embeddings"):
        return None
    if _get(settings, "algorithm") != "rtn" or _get(settings, "quant_format") != "QOperator":
        return "quantize_embeddings needs algorithm rtn and quant_format QOperator (ONNX Runtime)"
    if int(_get(settings, "bits")) != 4:
        return "quantize_embeddings needs bits 4: ONNX Runtime quantizes a Gather to 4 bits only"
    return None


def _reject_qdq(settings: Mapping[str, Any]) -> str | None:
    if _get(settings, "quant_format") != "QDQ":
        return None
    if _get(settings, "algorithm") != "rtn":
        algorithm = settings["algorithm"]
        return f"quant_format QDQ needs algorithm rtn ({algorithm} writes MatMulNBits only)"

    if int(_get(settings, "bits")) == 8 or 8 in node_precisions(settings).values():
        return "quant_format QDQ writes 4-bit weights only (ONNX Runtime): no node at 8 bits"
    if int(_get(settings, "accuracy_level")):
        return "accuracy_level is a MatMulNBits attribute: quant_format QDQ writes none"
    return None


#: The refusals that apply to one node's settings as to the top level's.
_NODE_RULES: tuple[Callable[[Mapping[str, Any]], str | None], ...] = (
    _reject_block,
    _reject_symmetric,
)


def _reject_node_settings(settings: Mapping[str, Any]) -> str | None:
    """A ``node_settings`` entry that is malformed, in a node list, or refused for that node."""
    per_node = settings.get("node_settings") or {}
    listed = node_precisions(settings)
    for name, own in per_node.items():
        if not isinstance(own, Mapping):
            return f"node_settings '{name}': expected a mapping of {', '.join(NODE_SETTINGS)}"
        unknown = sorted(set(own) - set(NODE_SETTINGS))
        if unknown:
            return f"node_settings '{name}': {unknown[0]} is not one of {', '.join(NODE_SETTINGS)}"
        for key, value in own.items():
            problem = check_value(SETTINGS[key], value)
            if problem:
                return f"node_settings '{name}': {key}: {problem}"
        if name in listed:
            return f"node '{name}' is in node_settings and in a node list: name it in one"
        merged = {k: v for k, v in settings.items() if k not in (*NODE_LISTS, "node_settings")}
        merged.update({k: v for k, v in own.items() if v is not None})
        if own.get("symmetric") is None and own.get("algorithm") in ("hqq", "k_quant"):
            merged.pop("symmetric", None)
        reason = first_refusal(_NODE_RULES, merged)
        if not reason and int(_get(merged, "bits")) == 8 and _get(merged, "algorithm") == "hqq":
            reason = "algorithm hqq at 8 bits does not run on CPU: use rtn or k_quant"
        if reason:
            return f"node_settings '{name}': {reason}"
    if per_node and _get(settings, "quant_format") == "QDQ":
        return "node_settings needs quant_format QOperator (MatMulNBits)"
    return None


#: Every refusal, in the order :func:`reject_reason` applies them.
REJECT_RULES: tuple[Callable[[Mapping[str, Any]], str | None], ...] = (
    _reject_block,
    _reject_symmetric,
    _reject_source,
    _reject_node_bits,
    _reject_node_settings,
    _reject_embeddings,
    _reject_qdq,
)


def reject_reason(settings: Mapping[str, Any]) -> str | None:
    """The first refusal of ``settings`` (one line), or None."""
    return first_refusal(REJECT_RULES, settings)
