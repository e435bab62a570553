"""Sensitivity analysis: which tensors lose the accuracy when quantized.

For a base setting, each quantized activation tensor is ranked by :func:`sqnr_ranking` (one
pass: the median over channels of the SQNR against its own quantize-dequantize, ONNX Runtime's
``qdq_loss_debug``; lowest first) or :func:`metric_ranking` (the search's metric with one
entry promoted at a time, for the ``candidates`` lowest-SQNR entries; best first). A ranking
is kept by :class:`SensitivityStore` and written to ``sensitivity.parquet``; each entry names
the node promoting acts on and ``group``, its block between normalisations.

Example:
    >>> entry = SensitivityEntry("t", "mm", "MatMul", "block0", sqnr_db=12.5)
    >>> Ranking("k", "sqnr", [entry]).rows()[0]["rank"]
    1
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysearch.fileio import atomic_write_bytes, file_lock
from raysearch.quantize.techniques.mixed_precision._activation_noise import activation_errors

if TYPE_CHECKING:
    import onnx

    from raysearch.data import DataSource

__all__ = [
    "SensitivityEntry",
    "Ranking",
    "SensitivityStore",
    "sqnr_ranking",
    "metric_ranking",
    "node_groups",
    "write_sensitivity_table",
    "read_sensitivity_table",
    "SENSITIVITY_FILE",
]

_logger = logging.getLogger(__name__)

#: The file in a search's output folder that holds every ranking the search used.
SENSITIVITY_FILE = "sensitivity.parquet"
_NORMALIZATIONS = frozenset(
    {"LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization"}
)
_MEANS = frozenset({"ReduceMean", "ReduceSum"})


@dataclass(frozen=True)
class SensitivityEntry:
    """One quantized activation: the node promoting acts on, its SQNRs (lower: more sensitive)
    and ``metric`` with it alone promoted (None: not measured).
    """

    tensor: str
    node: str
    op_type: str
    group: str
    sqnr_db: float
    float_sqnr_db: float | None = None
    weight_sqnr_db: float | None = None
    metric: float | None = None
    #: The nodes kept in float to keep this tensor in float: its producer and its consumers
    #: that the base quantizes (each quantizes the tensor as its input or output).
    float_nodes: tuple[str, ...] = ()


@dataclass
class Ranking:
    """Entries most sensitive first, for base ``base_key``, ranked ``by`` sqnr or metric."""

    base_key: str
    by: str
    entries: list[SensitivityEntry] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per entry with its 1-based ``rank``, the ``base`` key and ``rank_by``."""
        return [
            {
                "rank": i + 1,
                "base": self.base_key,
                "rank_by": self.by,
                **asdict(e),
                "float_nodes": list(e.float_nodes),
            }
            for i, e in enumerate(self.entries)
        ]

    def to_json(self) -> str:
        return json.dumps({"base_key": self.base_key, "by": self.by, "entries": self.rows()})

    @classmethod
    def from_json(cls, text: str) -> Ranking:
        data = json.loads(text)
        names = set(SensitivityEntry.__dataclass_fields__)
        entries = [
            SensitivityEntry(
                **{k: v for k, v in row.items() if k in names and k != "float_nodes"},
                float_nodes=tuple(row.get("float_nodes") or ()),
            )
            for row in data["entries"]
        ]
        return cls(data["base_key"], data["by"], entries)


class SensitivityStore:
    """Rankings by key, in memory and on disk under ``cache_dir``, computed once under a lock."""

    def __init__(self, cache_dir: str | os.PathLike | None) -> None:
        self.cache_dir = Path(cache_dir) / "sensitivity" if cache_dir else None
        self._memory: dict[str, Ranking] = {}
        #: Rankings this process computed (not read from disk or memory).
        self.computed = 0

    def get(self, key: str, compute: Callable[[], Ranking]) -> Ranking:
        """The ranking of ``key``, computed by ``compute`` on the first request only."""
        if key in self._memory:
            return self._memory[key]
        path = self.cache_dir / f"{key}.json" if self.cache_dir else None
        with file_lock(self.cache_dir / f"{key}.lock" if self.cache_dir else None):
            ranking = _read(path)
            if ranking is None:
                ranking = compute()
                self.computed += 1
                if path is not None:
                    with contextlib.suppress(OSError):
                        atomic_write_bytes(path, ranking.to_json().encode())
        self._memory[key] = ranking
        return ranking


def _read(path: Path | None) -> Ranking | None:
    if path is None or not path.is_file():
        return None
    try:
        return Ranking.from_json(path.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        _logger.warning("ignoring an unreadable sensitivity ranking: %s", path)
        return None


def node_groups(model: onnx.ModelProto) -> dict[str, str]:
    """Node name -> ``block<i>``, ``i`` the normalisations before it in graph order."""
    producers = {o: n for n in model.graph.node for o in n.output}

    def mean_of(tensor: str, source: str) -> bool:
        node = producers.get(tensor)
        for _ in range(2):  # mean(x) may be sum(x) scaled by a Mul or a Div
            if node is None:
                return False
            if node.op_type in _MEANS:
                return node.input[0] == source
            if node.op_type not in ("Mul", "Div"):
                return False
            node = producers.get(node.input[0])
        return False

    groups: dict[str, str] = {}
    block = 0
    for node in model.graph.node:
        boundary = node.op_type in _NORMALIZATIONS or (
            node.op_type == "Sub" and len(node.input) == 2 and mean_of(node.input[1], node.input[0])
        )
        if boundary:
            block += 1
        groups[node.name] = f"block{block}"
    return groups


def _quantized_nodes(qdq_model: onnx.ModelProto) -> set[str]:
    """Names of the QDQ model's nodes that read a DequantizeLinear output."""
    dq_outputs = {
        o for n in qdq_model.graph.node if n.op_type == "DequantizeLinear" for o in n.output
    }
    return {
        n.name
        for n in qdq_model.graph.node
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear")
        and any(i in dq_outputs for i in n.input)
    }


def _acting_node(
    tensor: str,
    producers: Mapping[str, onnx.NodeProto],
    consumers: Mapping[str, list[onnx.NodeProto]],
    quantized: set[str],
) -> onnx.NodeProto | None:
    producer = producers.get(tensor)
    if producer is not None and producer.name in quantized:
        return producer
    for consumer in consumers.get(tensor, []):
        if consumer.name in quantized:
            return consumer
    return producer


def sqnr_ranking(
    float_path: str | os.PathLike,
    quantized_path: str | os.PathLike,
    data: DataSource,
    *,
    base_key: str = "",
    samples: int = 32,
    providers: Sequence[Any] | None = None,
) -> Ranking:
    """Rank the quantized activation tensors by SQNR, lowest first, on ``samples`` samples."""
    import onnx

    float_model = onnx.load(os.fspath(float_path), load_external_data=False)
    qdq_model = onnx.load(os.fspath(quantized_path), load_external_data=False)
    errors, weights = activation_errors(
        float_path, quantized_path, float_model, data, samples=samples, providers=providers
    )

    producers = {o: n for n in float_model.graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in float_model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    quantized = _quantized_nodes(qdq_model)
    groups = node_groups(float_model)
    entries = []
    for tensor, error in errors.items():
        node = _acting_node(tensor, producers, consumers, quantized)
        if node is None:
            continue
        weight = [weights[i] for i in node.input if i in weights]
        channel_sqnr = error.get("channel_err")
        adjacent = [producers.get(tensor), *consumers.get(tensor, [])]
        float_nodes = [n.name for n in adjacent if n is not None and n.name in quantized]
        entries.append(
            SensitivityEntry(
                tensor=tensor,
                node=node.name,
                op_type=node.op_type,
                group=groups.get(node.name, "block0"),
                sqnr_db=_finite(
                    channel_sqnr if channel_sqnr is not None else error.get("qdq_err"), math.inf
                ),
                float_sqnr_db=_finite(error.get("xmodel_err")),
                weight_sqnr_db=_finite(min(weight)) if weight else None,
                float_nodes=tuple(dict.fromkeys(float_nodes or [node.name])),
            )
        )
    # Lowest SQNR first; ties (and an exact tensor, +inf) by the error accumulated up to it.
    entries.sort(key=lambda e: (e.sqnr_db, _or(e.float_sqnr_db, math.inf), e.tensor))
    return Ranking(base_key, "sqnr", entries)


def metric_ranking(
    ranking: Ranking,
    score_all: Callable[[list[SensitivityEntry]], Sequence[float | None]],
    *,
    higher_is_better: bool,
    candidates: int = 16,
) -> Ranking:
    """``ranking`` with its first ``candidates`` entries measured by ``score_all``, best first."""
    head = ranking.entries[: max(0, candidates)]
    scores = list(score_all(list(head))) if head else []
    if len(scores) != len(head):
        raise ValueError(f"score_all returned {len(scores)} scores for {len(head)} entries")
    measured = [
        replace(entry, metric=_finite(score)) for entry, score in zip(head, scores, strict=True)
    ]
    sign = -1.0 if higher_is_better else 1.0
    measured.sort(key=lambda e: (e.metric is None, sign * (e.metric or 0.0)))
    entries = measured + ranking.entries[len(head) :]
    return Ranking(ranking.base_key, "metric", entries)


def write_sensitivity_table(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write ranking rows to a Parquet file at ``path``, atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = list(rows)
    columns = ["rank", "base", "rank_by", *SensitivityEntry.__dataclass_fields__]
    table = pa.table({c: [row.get(c) for row in rows] for c in columns})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    target = Path(path)
    atomic_write_bytes(target, sink.getvalue().to_pybytes())
    return target


def _finite(value: Any, default: float | None = None) -> float | None:
    if value is None:
        return default
    value = float(value)
    return value if math.isfinite(value) else default


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def read_sensitivity_table(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a ``sensitivity.parquet`` file (empty when there is none)."""
    import pyarrow.parquet as pq

    if not Path(path).is_file():
        return []
    return pq.read_table(os.fspath(path)).to_pylist()
