"""Atomic file writes: a reader (or a kill at any moment) sees the old file or the new one,
never half of one; and folders built beside their final name and renamed into place whole."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = [
    "replacing",
    "atomic_write_bytes",
    "atomic_write_text",
    "building_folder",
    "file_lock",
    "readable_mode",
]

_logger = logging.getLogger(__name__)

try:  # POSIX file locks; elsewhere concurrent processes may compute the same thing twice
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


def _umask() -> int:
    """The process's umask, read from ``/proc`` where Linux shows it, else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def readable_mode() -> int:
    """The mode a plain ``open`` gives a new file: 0666 less the umask."""
    return 0o666 & ~_umask()


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path that atomically replaces ``path`` when the block ends."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # ".<name>.<random>.tmp<suffix>": hidden, recognisable as this file's leftover, and with
    # the real suffix for writers that pick a format from it (matplotlib).
    fd, name = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}"
    )
    os.close(fd)
    tmp = Path(name)
    try:
        # mkstemp makes the file 0600; the file in place gets a plain open()'s mode.
        os.chmod(tmp, readable_mode())
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, flushed to disk before the rename."""
    with replacing(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def building_folder(
    folder: str | os.PathLike, is_complete: Callable[[Path], bool]
) -> Iterator[Path]:
    """Yield a temporary folder renamed to ``folder`` at the end (a copy renamed first stays)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    try:
        yield tmp
        try:
            os.replace(tmp, folder)
        except OSError:
            if not is_complete(folder):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike | None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` for the block (a no-op for None or no locks; a lock
    not taken is warned about once per folder).
    """
    if path is None or fcntl is None:
        yield
        return
    path = Path(path)
    handle = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a")  # noqa: SIM115 - closed below, after the unlock
        fcntl.flock(handle, fcntl.LOCK_EX)
    except OSError as exc:  # ENOLCK: a network file system without locks
        if handle is not None:
            handle.close()
        _unlocked(path, exc)
        yield
        return
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


#: Folders whose lock files could not be used (warned about once each).
_UNLOCKED: set[Path] = set()


def _unlocked(path: Path, exc: OSError) -> None:
    if path.parent not in _UNLOCKED:
        _UNLOCKED.add(path.parent)
        _logger.warning(
            "cannot lock %s (%s): processes sharing %s may compute the same entry twice",
            path,
            exc.strerror or exc,
            path.parent,
        )
