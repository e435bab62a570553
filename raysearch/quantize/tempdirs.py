"""Private working folders for quantization, named after their process so that folders left
behind by a killed process (a Ray actor ended without clean-up) are removed by the next one.

Example:
    >>> from raysearch.quantize.tempdirs import make_workdir
    >>> folder = make_workdir("raysearch-doc")
    >>> folder.name.startswith(f"raysearch-doc-{os.getpid()}-")
    True
    >>> shutil.rmtree(folder)
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["make_workdir", "sweep_stale"]

_logger = logging.getLogger(__name__)
_swept: set[str] = set()


def make_workdir(prefix: str) -> Path:
    """A new folder ``<tmp>/<prefix>-<pid>-<random>``; the first call per prefix and process
    also removes folders of that prefix whose process no longer exists."""
    if prefix not in _swept:
        _swept.add(prefix)
        sweep_stale(prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}-{os.getpid()}-"))


def sweep_stale(prefix: str, root: str | os.PathLike | None = None) -> int:
    """Remove ``<prefix>-<pid>-*`` folders under ``root`` (default: the temp dir) whose process
    is gone; returns how many were removed."""
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
