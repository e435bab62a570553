"""Private folders in the shared temp dir: working folders named after their process (a killed
process's are removed by the next), and :func:`private_dir` for a fixed name: used only when
this user's, no link and writable by no one else, else :class:`UnsafeFolderError`.

Example:
    >>> folder = make_workdir("raysearch-doc")
    >>> folder.name.startswith(f"raysearch-doc-{os.getpid()}-")
    True
    >>> shutil.rmtree(folder)
    >>> root = tempfile.mkdtemp()
    >>> mine = private_dir("raysearch-models", root=root)
    >>> oct(mine.stat().st_mode & 0o777), mine.parent.name == f"raysearch-{os.getuid()}"
    ('0o700', True)
    >>> shutil.rmtree(root)
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

from raysearch.errors import InputError

__all__ = ["UnsafeFolderError", "check_private", "make_workdir", "private_dir", "sweep_stale"]

_logger = logging.getLogger(__name__)
_swept: set[str] = set()


def make_workdir(prefix: str) -> Path:
    """A new folder ``<tmp>/<prefix>-<pid>-<random>``, stale ones of the prefix swept first."""
    if prefix not in _swept:
        _swept.add(prefix)
        sweep_stale(prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}-{os.getpid()}-"))


def sweep_stale(prefix: str, root: str | os.PathLike | None = None) -> int:
    """Remove ``<prefix>-<pid>-*`` folders under ``root`` whose process is gone; how many."""
    folder = Path(root or tempfile.gettempdir())
    removed = 0
    try:
        candidates = list(folder.glob(f"{prefix}-*-*"))
    except OSError:
        return 0
    for path in candidates:
        pid_text = path.name[len(prefix) + 1 :].split("-", 1)[0]
        if not pid_text.isdigit() or not path.is_dir() or _alive(int(pid_text)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    if removed:
        _logger.debug("removed %d stale %s folders", removed, prefix)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OSError:
        return True
    return True


class UnsafeFolderError(InputError):
    """A fixed-name temp folder not to trust: another user's, a link, or writable by others."""


def _uid() -> int | None:
    getuid = getattr(os, "getuid", None)  # POSIX only
    return getuid() if getuid is not None else None


def _user_name(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def check_private(path: str | os.PathLike) -> None:
    """Refuse ``path`` unless it is a folder (no link) of this user no one else may write to."""
    path = Path(path)
    uid = _uid()
    if uid is None:  # no owners to check (Windows): the user's own TEMP folder
        return
    info = os.lstat(path)
    remedy = "remove it, or set TMPDIR to a folder of your own"
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeFolderError(
            f"{path}: refusing a temporary folder that is a link or a file; {remedy}"
        )
    if info.st_uid != uid:
        raise UnsafeFolderError(
            f"{path}: refusing a temporary folder owned by {_user_name(info.st_uid)} instead"
            f" of {_user_name(uid)}; {remedy}"
        )
    if info.st_mode & 0o022:
        raise UnsafeFolderError(
            f"{path}: refusing a temporary folder writable by others"
            f" (mode {stat.S_IMODE(info.st_mode):o}); {remedy}"
        )


def private_dir(name: str | None = None, *, root: str | os.PathLike | None = None) -> Path:
    """This user's folder ``<tmp>/raysearch-<uid>/<name>``, mode 0700, each level checked
    (:class:`UnsafeFolderError` otherwise).
    """
    uid = _uid()
    base = Path(root or tempfile.gettempdir()) / f"raysearch-{uid if uid is not None else 'user'}"
    folders = [base] if not name else [base, base / name]
    for folder in folders:
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            pass
        check_private(folder)
    return folders[-1]
