"""Moving models between the nodes of a Ray cluster as their files (a protobuf cannot hold
2 GB), so worker nodes need no shared disk: the float model through the object store
(:func:`model_blob`, :func:`materialize_model`), a trial's model fetched from its node
(:func:`fetch_model`) or deleted there (:func:`drop_model`) by tasks pinned to it.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raysearch.fileio import replacing
from raysearch.modelfile import external_data_locations, remove_model
from raysearch.quantize.tempdirs import private_dir
from raysearch.search.runtime._node_loss import ModelLostError, lost_model_line, node_alive

__all__ = [
    "ModelBlob",
    "model_blob",
    "materialize_model",
    "node_folder",
    "node_folder_here",
    "remove_node_folders",
    "fetch_model",
    "drop_model",
    "current_node_id",
]

_logger = logging.getLogger(__name__)
#: Bytes per object-store object when a file travels.
CHUNK_BYTES = 64 << 20
#: Chunk reads in flight while a model is fetched from another node.
_WINDOW = 4
#: Seconds to wait for one answer from another node before calling it lost.
_TIMEOUT_S = 120


@dataclass(frozen=True)
class ShippedFile:
    """One file of a model in the object store: its name relative to the model's folder, its
    size and its chunks."""

    name: str
    size: int
    chunks: tuple[Any, ...]


@dataclass(frozen=True)
class ModelBlob:
    """The float model for the actors: its path on the driver's node and, once shipped, its
    files in the object store (``files[0]`` is the model file) with a hash of them all."""

    path: str
    sha256: str = ""
    files: tuple[ShippedFile, ...] = ()

    @property
    def shipped(self) -> bool:
        return bool(self.files)


def _relative(location: str) -> str:
    """``location`` as a path inside the model's folder; ValueError when it leaves it."""
    parts = PurePosixPath(location.replace("\\", "/")).parts
    if not parts or parts[0] == "/" or ".." in parts:
        raise ValueError(f"external data location '{location}' is outside the model's folder")
    return "/".join(parts)


def _files_hash(
    folder: Path,
    names: list[str],
    each: Callable[[str, bytes], None] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> tuple[str, list[int]]:
    """The hash of the files ``names`` in ``folder`` (each file's bytes, then its name and
    size) and their sizes; ``each(name, block)`` gets every block read."""
    sha, sizes = hashlib.sha256(), []
    for name in names:
        size = 0
        with open(folder / name, "rb") as fh:
            while block := fh.read(chunk_bytes):
                sha.update(block)
                size += len(block)
                if each is not None:
                    each(name, block)
        sha.update(f"\0{name}\0{size}\0".encode())
        sizes.append(size)
    return sha.hexdigest(), sizes


def model_blob(path: str | os.PathLike, *, chunk_bytes: int = CHUNK_BYTES) -> ModelBlob:
    """Put the model ``path`` and its external-data files, as they are, into the object store
    (Ray must be initialised), ``chunk_bytes`` per object."""
    path = Path(path)
    names = [path.name] + [_relative(loc) for loc in external_data_locations(path)]
    chunks: dict[str, list[Any]] = {name: [] for name in names}
    put = lambda name, block: chunks[name].append(ray.put(block))  # noqa: E731
    digest, sizes = _files_hash(path.parent, names, put, chunk_bytes)
    shipped = [ShippedFile(n, size, tuple(chunks[n])) for n, size in zip(names, sizes)]
    total = sum(sizes)
    _logger.info(
        "%s shipped to the object store as %d file(s), %.1f MB", path, len(shipped), total / 1e6
    )
    return ModelBlob(os.fspath(path), digest, tuple(shipped))


def node_folder(kind: str, driver_path: str | os.PathLike) -> str:
    """The name of the node-local folder of ``kind`` (``trials`` or ``cache``) that stands,
    on another node, for the search's folder ``driver_path``: named after it, so that a
    resumed search finds it again.

    Example:
        >>> node_folder("cache", "/data/out/calibration_cache")
        'raysearch-cache-315ddc2c902d'
    """
    tag = hashlib.sha256(os.fspath(driver_path).encode()).hexdigest()[:12]
    return f"raysearch-{kind}-{tag}"


#: Beside each node folder (see :func:`node_folder_here`): the id of the Ray node that uses it.
_OWNER_SUFFIX = ".node"
#: The node folders a search leaves on a node other than the driver's.
_NODE_FOLDER_KINDS = ("trials", "cache")


def node_folder_here(kind: str, driver_path: str | os.PathLike) -> Path:
    """This node's folder of ``kind`` for the search's folder ``driver_path``, created, with
    this node's id beside it (the folders of nodes the cluster counts dead removed first)."""
    name = node_folder(kind, driver_path)
    folder = private_dir(name)
    here = current_node_id()
    _remove_dead_nodes_folders(folder.parent, here)
    owner = folder.parent / f"{name}{_OWNER_SUFFIX}"
    try:
        if not owner.is_file() or owner.read_text() != here:
            with replacing(owner) as tmp:
                Path(tmp).write_text(here)
    except OSError as exc:  # the folder is usable without its note
        _logger.debug("could not note the node of %s: %s", folder, exc)
    return folder


def _remove_dead_nodes_folders(base: Path, here: str) -> None:
    """Remove the node folders in ``base`` whose owner note names a node, other than
    ``here``, that the cluster counts dead."""
    owners = []
    for kind in _NODE_FOLDER_KINDS:
        owners += base.glob(f"raysearch-{kind}-*{_OWNER_SUFFIX}")
    notes = {}
    for owner in owners:
        with contextlib.suppress(OSError):
            notes[owner] = owner.read_text().strip()
    if not any(node != here for node in notes.values()):
        return
    dead = {n["NodeID"] for n in ray.nodes() if not n.get("Alive")}
    for owner, node in notes.items():
        if node != here and node in dead:
            folder = owner.with_name(owner.name[: -len(_OWNER_SUFFIX)])
            _logger.info("removing %s, left by the lost node %s", folder, node[:12])
            shutil.rmtree(folder, ignore_errors=True)
            owner.unlink(missing_ok=True)


@ray.remote(num_cpus=0)
def _remove_node_folders(names: list[str]) -> None:
    base = private_dir()
    for name in names:
        shutil.rmtree(base / name, ignore_errors=True)
        (base / f"{name}{_OWNER_SUFFIX}").unlink(missing_ok=True)


def remove_node_folders(node_ids: Iterable[str], names: Sequence[str]) -> None:
    """Remove this user's node-local folders ``names`` on each live node of ``node_ids``,
    waiting at most a node's answer time: else they stay as long as the cluster lives."""
    pending = [
        _remove_node_folders.options(scheduling_strategy=_pinned(node)).remote(list(names))
        for node in node_ids
        if node_alive(node)
    ]
    if not pending:
        return
    done, _ = ray.wait(pending, num_returns=len(pending), timeout=_TIMEOUT_S)
    for ref in done:
        try:
            ray.get(ref)
        except Exception as exc:  # the node went meanwhile: its temp folder went with it
            _logger.warning("could not remove %s on a node: %s", ", ".join(names), exc)


#: Models verified in this process: (folder, each file's inode, size and mtime).
_VERIFIED: set[tuple[Any, ...]] = set()


def _intact(folder: Path, blob: ModelBlob) -> bool:
    """Whether ``folder`` holds exactly the files of ``blob`` (their hash is the blob's)."""
    names = [f.name for f in blob.files]
    try:
        seen = (
            folder,
            *((s.st_ino, s.st_size, s.st_mtime_ns) for s in ((folder / n).stat() for n in names)),
        )
    except OSError:
        return False
    if seen in _VERIFIED:
        return True
    try:
        if _files_hash(folder, names)[0] != blob.sha256:
            return False
    except OSError:
        return False
    _VERIFIED.add(seen)
    return True


def materialize_model(blob: ModelBlob) -> str:
    """The path of the model as files on this node, written once per node from the object
    store into ``raysearch-models/<hash>/`` (files found there used only if their hash is it)."""
    if not blob.shipped:
        return blob.path
    folder = private_dir("raysearch-models") / blob.sha256[:24]
    model = folder / blob.files[0].name
    if folder.exists():
        if _intact(folder, blob):
            return os.fspath(model)
        _logger.warning(
            "%s does not hold the model of hash %s: written again from the object store",
            folder,
            blob.sha256[:24],
        )
        _discard(folder)
    # Built beside and renamed into place whole: no actor sees half a model; the first wins.
    build = folder.with_name(f".{folder.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        for shipped in blob.files:
            target = build / shipped.name
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as fh:
                for chunk in shipped.chunks:
                    fh.write(ray.get(chunk))
                fh.flush()
                os.fsync(fh.fileno())
        try:
            os.rename(build, folder)
        except OSError:  # another actor of this node was first
            if not _intact(folder, blob):
                raise
    finally:
        shutil.rmtree(build, ignore_errors=True)
    _logger.info("float model materialised at %s", folder)
    return os.fspath(model)


def _discard(folder: Path) -> None:
    """Move ``folder`` out of the way (whole, so no actor reads half of it), then remove it."""
    gone = folder.with_name(f".{folder.name}.{uuid.uuid4().hex[:8]}.stale")
    with contextlib.suppress(OSError):  # another actor of this node moved it first
        os.rename(folder, gone)
    shutil.rmtree(gone, ignore_errors=True)


def current_node_id() -> str:
    return ray.get_runtime_context().get_node_id()


@ray.remote(num_cpus=0)
def _list_model(path: str) -> list[tuple[str, int]] | None:
    """The model's files (the model file first) as (name relative to its folder, size); None
    when it is gone."""
    try:
        names = [Path(path).name] + [_relative(loc) for loc in external_data_locations(path)]
        folder = Path(path).parent
        return [(name, (folder / name).stat().st_size) for name in names]
    except Exception:  # gone, or no readable model any more (protobuf's DecodeError, ...)
        return None


@ray.remote(num_cpus=0)
def _read_chunk(path: str, offset: int, size: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(size)


@ray.remote(num_cpus=0)
def _remove_model(path: str) -> None:
    remove_model(path)


def _pinned(node_id: str) -> NodeAffinitySchedulingStrategy:
    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def _fetch(node_id: str, path: str, folder: Path) -> Path | None:
    listing = ray.get(
        _list_model.options(scheduling_strategy=_pinned(node_id)).remote(path),
        timeout=_TIMEOUT_S,
    )
    if listing is None:
        return None
    source = Path(path).parent
    # The data files first, the model file last: a model file in ``folder`` has its data.
    for name, size in listing[1:] + listing[:1]:
        with replacing(folder / name) as tmp, open(tmp, "wb") as fh:
            pending: collections.deque[Any] = collections.deque()
            for offset in range(0, size, CHUNK_BYTES):
                pending.append(
                    _read_chunk.options(scheduling_strategy=_pinned(node_id)).remote(
                        os.fspath(source / name), offset, min(CHUNK_BYTES, size - offset)
                    )
                )
                if len(pending) >= _WINDOW:
                    fh.write(ray.get(pending.popleft(), timeout=_TIMEOUT_S))
            while pending:
                fh.write(ray.get(pending.popleft(), timeout=_TIMEOUT_S))
            fh.flush()
            os.fsync(fh.fileno())
    return folder / listing[0][0]


def fetch_model(node_id: str, path: str, folder: str | os.PathLike) -> Path:
    """Move the model ``path`` with its data files from node ``node_id`` into ``folder``;
    the local model file's path. :class:`ModelLostError` says why it cannot."""
    _logger.debug("fetching %s from node %s", path, node_id[:12])
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        local = _fetch(node_id, path, folder)
    except Exception as exc:  # the node died (or stopped answering)
        _logger.warning("could not fetch %s from node %s: %s", path, node_id[:12], exc)
        with contextlib.suppress(OSError):
            remove_model(folder / Path(path).name)  # what came before the node went
        alive = node_alive(node_id)
        if alive:
            drop_model(node_id, path)
        raise ModelLostError(lost_model_line(node_id, exc, alive)) from exc
    if local is None:
        raise ModelLostError(lost_model_line(node_id, None, node_alive(node_id)))
    drop_model(node_id, path)
    return local


def drop_model(node_id: str, path: str) -> None:
    """Remove the model ``path`` and its external-data files on node ``node_id`` (no wait)."""
    _remove_model.options(scheduling_strategy=_pinned(node_id)).remote(path)
