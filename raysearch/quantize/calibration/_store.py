"""The calibration cache's entries: a bounded LRU in memory and, optionally, files on disk (one
folder per key, under a file lock); an entry of the same key and kind whose tensors cover
those asked for serves a lookup.

Example:
    >>> store = EntryStore(None, max_entries=2, stats=CacheStats())
    >>> store.store(("k",), Entry("stats", frozenset({"a", "b"}), {}))
    >>> store.lookup(("k",), "stats", frozenset({"a"}))[1]
    True
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from onnxruntime.quantization.calibrate import TensorsData, save_tensors_data

from raysearch.fileio import atomic_write_bytes, file_lock

__all__ = ["CacheStats", "Entry", "EntryStore"]

# The public module's logger: users (and tests) configure "raysearch.quantize.calibration._cache".
_logger = logging.getLogger("raysearch.quantize.calibration._cache")


@dataclass
class Entry:
    """One collection: its kind, the tensors it covers and what was collected."""

    kind: str  # "minmax" | "stats" | "hist"
    names: frozenset[str]
    payload: Any  # TensorsData | dict[name, stats tuple] | dict[name, histogram tuple]


@dataclass
class CacheStats:
    """Counters for tests and reports."""

    calibrations: int = 0  # calibrations computed (cache misses that ran inference)
    inference_passes: int = 0  # passes over the calibration data
    inference_batches: int = 0  # session.run calls during calibration
    memory_hits: int = 0
    disk_hits: int = 0
    lock_waits: int = 0  # entries another trial calibrated while this one waited for it
    calibration_s: float = 0.0


class EntryStore:
    """Entries by key, in memory (at most ``max_entries``) and under ``cache_dir``."""

    def __init__(self, cache_dir: Path | None, max_entries: int, stats: CacheStats) -> None:
        self.cache_dir = cache_dir
        self.max_entries = max(1, int(max_entries))
        self._stats = stats
        self._entries: OrderedDict[tuple[Any, ...], Entry] = OrderedDict()

    @property
    def entries(self) -> OrderedDict[tuple[Any, ...], Entry]:
        """The entries in memory, least recently used first."""
        return self._entries

    def lookup(
        self, key: tuple[Any, ...], kind: str, names: frozenset[str], *, waited: bool = False
    ) -> tuple[Entry | None, bool]:
        """An entry covering ``names`` from memory or disk, and whether that was a cache hit."""
        for slot, entry in self._entries.items():
            if slot[0] == key and entry.kind == kind and names <= entry.names:
                self._entries.move_to_end(slot)
                return entry, self._count_hit("memory_hits", waited)
        entry = self._load(key, kind, names)
        if entry is not None:
            self._remember(key, entry)
            return entry, self._count_hit("disk_hits", waited)
        return None, False

    def _count_hit(self, counter: str, waited: bool) -> bool:
        name = "lock_waits" if waited else counter
        setattr(self._stats, name, getattr(self._stats, name) + 1)
        return not waited

    def store(self, key: tuple[Any, ...], entry: Entry) -> None:
        """Keep ``entry`` in memory and, with ``cache_dir``, on disk (a failed write is logged)."""
        self._remember(key, entry)
        if self.cache_dir is not None:
            try:
                self._save(key, entry)
            except OSError as exc:
                _logger.warning("could not write the calibration cache: %s", exc)

    def lock(self, key: tuple[Any, ...]) -> contextlib.AbstractContextManager[None]:
        """Hold the file lock of ``key`` (a no-op without a ``cache_dir`` or file locks)."""
        return file_lock(self._key_dir(key) / ".lock" if self.cache_dir is not None else None)

    def _remember(self, key: tuple[Any, ...], entry: Entry) -> None:
        for slot in [s for s, e in self._entries.items() if s[0] == key and e.kind == entry.kind]:
            if self._entries[slot].names <= entry.names:
                del self._entries[slot]  # the new entry covers it
        self._entries[(key, entry.kind, entry.names)] = entry
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def _key_dir(self, key: tuple[Any, ...]) -> Path:
        assert self.cache_dir is not None
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:24]
        return self.cache_dir / digest

    def _save(self, key: tuple[Any, ...], entry: Entry) -> None:
        folder = self._key_dir(key)
        folder.mkdir(parents=True, exist_ok=True)
        key_file = folder / "key.json"
        if not key_file.exists():
            atomic_write_bytes(key_file, _key_text(key))
        names_hash = hashlib.sha256("\0".join(sorted(entry.names)).encode()).hexdigest()[:16]
        if entry.kind == "minmax":
            with tempfile.TemporaryDirectory(dir=folder, prefix=".minmax-") as scratch:
                written = Path(scratch) / "ranges.json"
                save_tensors_data(entry.payload, written)
                data = written.read_bytes()
            suffix = ".json"
        else:
            buffer = io.BytesIO()
            np.savez(buffer, **_arrays(entry))
            data, suffix = buffer.getvalue(), ".npz"
        # Named by its content's hash too: a file whose bytes are not what its name says (torn,
        # damaged, or replaced) is never read.
        atomic_write_bytes(
            folder / f"{entry.kind}-{names_hash}-{_content_hash(data)}{suffix}", data
        )

    def _load(self, key: tuple[Any, ...], kind: str, names: frozenset[str]) -> Entry | None:
        if self.cache_dir is None:
            return None
        folder = self._key_dir(key)
        if not folder.is_dir():
            return None
        try:
            held = (folder / "key.json").read_bytes()
        except OSError:  # nothing written yet (key.json comes before any entry)
            return None
        if held != _key_text(key):
            _logger.warning("ignoring calibration cache folder %s: it holds another key", folder)
            # Emptied once (its lock kept): this key's entries are written into it again.
            for stale in folder.iterdir():
                if stale.name != ".lock":
                    with contextlib.suppress(OSError):
                        stale.unlink()
            return None
        suffix = ".json" if kind == "minmax" else ".npz"
        for path in sorted(folder.glob(f"{kind}-*{suffix}")):
            try:
                data = path.read_bytes()
                if path.stem.rsplit("-", 1)[-1] != _content_hash(data):
                    raise ValueError("its content is not the content its name was written for")
                entry = _read(data, kind)
            except Exception as exc:  # a damaged file is recomputed, never trusted
                _logger.warning("ignoring unreadable calibration cache file %s: %s", path, exc)
                with contextlib.suppress(OSError):
                    path.unlink()  # once: the entry computed again is written beside it
                continue
            if names <= entry.names:
                _logger.debug("calibration cache hit on disk: %s", path)
                return entry
        return None


def _key_text(key: tuple[Any, ...]) -> bytes:
    """What ``key.json`` of ``key``'s folder holds: the folder serves only that key."""
    return json.dumps([str(k) for k in key]).encode()


def _content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def _arrays(entry: Entry) -> dict[str, np.ndarray]:
    """The ``.npz`` arrays of a ``stats`` or ``hist`` entry."""
    arrays: dict[str, np.ndarray] = {}
    ordered = list(entry.payload)
    arrays["names"] = np.array(ordered, dtype=str)
    for i, name in enumerate(ordered):
        value = entry.payload[name]
        if entry.kind == "stats":
            if value[2] is None:
                arrays[f"s{i}"] = np.array([value[0], value[1]], dtype=value[0].dtype)
            else:
                arrays[f"s{i}"] = np.array(value, dtype=np.asarray(value[0]).dtype)
        else:  # (hist, edges, min, max[, threshold of a signed histogram])
            arrays[f"h{i}"] = value[0]
            arrays[f"e{i}"] = value[1]
            arrays[f"s{i}"] = np.array(value[2:], dtype=np.asarray(value[2]).dtype)
    return arrays


def _read(data: bytes, kind: str) -> Entry:
    """The entry in a file's bytes (read once: what was hashed is what is read)."""
    if kind == "minmax":  # what ONNX Runtime's load_tensors_data reads, from these bytes
        ranges = TensorsData.from_dict(json.loads(data))
        return Entry(kind, frozenset(ranges.keys()), ranges)
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        ordered = [str(n) for n in archive["names"]]
        payload: dict[str, tuple[Any, ...]] = {}
        for i, name in enumerate(ordered):
            s = archive[f"s{i}"]
            if kind == "stats":
                payload[name] = tuple(s) if len(s) == 4 else (s[0], s[1], None, None)
                continue
            hist, hist_edges = archive[f"h{i}"], archive[f"e{i}"]
            if len(hist) + 1 != len(hist_edges):
                raise ValueError(f"histogram of {name!r} is inconsistent")
            if len(s) == 3:  # signed: ONNX Runtime keeps the threshold as a 0-d array
                payload[name] = (hist, hist_edges, s[0], s[1], np.array(s[2], dtype=s.dtype))
            else:
                payload[name] = (hist, hist_edges, s[0], s[1])
    return Entry(kind, frozenset(payload), payload)
