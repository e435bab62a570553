"""Moving files between the nodes of a Ray cluster, so worker nodes need no shared disk.

The driver ships the float model to every actor through the object store (:func:`model_blob`,
:func:`materialize_model`); a trial that ran on another node leaves its quantized model in that
node's temp folder, and the driver fetches it — or has it deleted — with a task pinned to that
node (:func:`take_file`). On one machine (or a shared file system) nothing is copied.

Example:
    >>> blob = model_blob("model.onnx")                     # doctest: +SKIP
    >>> path = materialize_model(blob)                      # on a worker node  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raysearch.fileio import atomic_write_bytes

__all__ = [
    "ModelBlob",
    "model_blob",
    "materialize_model",
    "node_local_dir",
    "take_file",
    "current_node_id",
]

_logger = logging.getLogger(__name__)
#: protobuf's limit for one serialized model; larger models must be on a shared file system.
_MAX_BLOB = 2**31 - 1


@dataclass(frozen=True)
class ModelBlob:
    """A model's bytes (external data inlined) with their hash, or only the path when the
    model is too large to travel as one blob."""

    path: str
    sha256: str
    data: bytes | None


def model_blob(path: str | os.PathLike) -> ModelBlob:
    """Read ``path`` (with any external data) into one blob for the object store."""
    import onnx

    path = os.fspath(path)
    model = onnx.load(path, load_external_data=True)
    if model.ByteSize() >= _MAX_BLOB:
        _logger.warning("%s is over 2 GB: worker nodes must see it at the same path", path)
        return ModelBlob(path, "", None)
    data = model.SerializeToString()
    return ModelBlob(path, hashlib.sha256(data).hexdigest(), data)


def node_local_dir(name: str) -> Path:
    """A folder in this node's temp directory (created)."""
    folder = Path(tempfile.gettempdir()) / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def materialize_model(blob: ModelBlob) -> str:
    """The model as a file on this node: written once per node from the blob."""
    if blob.data is None:
        return blob.path
    target = node_local_dir("raysearch-models") / f"{blob.sha256[:24]}.onnx"
    if not target.is_file():
        atomic_write_bytes(target, blob.data)
    return os.fspath(target)


def current_node_id() -> str:
    return ray.get_runtime_context().get_node_id()


@ray.remote(num_cpus=0)
def _take(path: str, keep: bool) -> bytes | None:
    try:
        data = Path(path).read_bytes() if keep else None
    except OSError:
        data = None
    try:
        os.unlink(path)
    except OSError:
        pass
    return data


def take_file(node_id: str, path: str, *, keep: bool) -> bytes | None:
    """Remove ``path`` on node ``node_id``; with ``keep``, return its bytes first (None when the
    file or the node is gone)."""
    task = _take.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
    ).remote(path, keep)
    if not keep:
        return None  # deletion needs no answer
    try:
        return ray.get(task, timeout=120)
    except Exception as exc:  # the node died: the model is lost, the record is not
        _logger.warning("could not fetch %s from node %s: %s", path, node_id[:12], exc)
        return None
