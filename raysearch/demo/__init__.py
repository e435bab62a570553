"""The embedded demo: Google's magika content-type model (shipped, Apache-2.0, see
``magika/NOTICE.md``) and data built on first use from the Python installation's own files,
turned into magika's input features as magika does, and cached; nothing is downloaded.
Configs name them by ``builtin:`` paths (:mod:`raysearch.config.builtin_paths`).

Example:
    >>> (MAGIKA_DIR / "model.onnx").is_file()
    True
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import sysconfig
from importlib import resources
from pathlib import Path

import numpy as np

from raysearch.fileio import replacing

__all__ = [
    "MAGIKA_DIR",
    "magika_features",
    "build_demo_data",
    "demo_data_dir",
]

_logger = logging.getLogger(__name__)

MAGIKA_DIR = Path(str(resources.files("raysearch.demo") / "magika"))
_CONFIG = json.loads((MAGIKA_DIR / "config.min.json").read_text())
_WHITESPACE = b" \t\n\r\x0b\x0c"
#: Rows of each demo data set: enough for stable ranges and a meaningful agreement figure.
N_CALIB, N_EVAL = 100, 400


def magika_features(data: bytes) -> np.ndarray:
    """magika's model input for one file's bytes: ``beg_size`` leading bytes (after leading
    white space is stripped, padded at the end) then ``end_size`` trailing bytes (after trailing
    white space is stripped, padded at the start), as int32 with ``padding_token`` for padding."""
    block, beg, end = _CONFIG["block_size"], _CONFIG["beg_size"], _CONFIG["end_size"]
    pad = _CONFIG["padding_token"]
    head = data[:block].lstrip(_WHITESPACE)[:beg]
    tail = data[-block:].rstrip(_WHITESPACE)
    tail = tail[-end:] if end else b""
    row = np.full(beg + end, pad, dtype=np.int32)
    row[: len(head)] = np.frombuffer(head, dtype=np.uint8)
    if tail:
        row[beg + end - len(tail) :] = np.frombuffer(tail, dtype=np.uint8)
    return row


def _python_files() -> list[Path]:
    """Files of the Python installation, grouped by extension and interleaved, so the sample
    spans many content types (sources, headers, text, data, shared libraries)."""
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "include", "platstdlib")}
    by_ext: dict[str, list[Path]] = {}
    for root in sorted(roots):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(
                d for d in dirnames if d not in ("site-packages", "__pycache__", "test", "tests")
            )
            for name in sorted(filenames):
                path = Path(dirpath) / name
                try:
                    if not path.is_file() or path.stat().st_size < _CONFIG["min_file_size_for_dl"]:
                        continue
                except OSError:
                    continue
                by_ext.setdefault(path.suffix.lower(), []).append(path)
    # A fixed shuffle per extension (hash of the name), then round-robin across extensions.
    for files in by_ext.values():
        files.sort(key=lambda p: hashlib.sha256(str(p.name).encode()).hexdigest())
    rounds = itertools.zip_longest(*(by_ext[k] for k in sorted(by_ext)))
    return [path for paths in rounds for path in paths if path is not None]


def demo_data_dir() -> Path:
    """Where the demo data is cached (``$XDG_CACHE_HOME/raysearch/magika-demo``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "raysearch" / "magika-demo"


def build_demo_data(folder: Path | None = None, n_calib: int = N_CALIB, n_eval: int = N_EVAL):
    """Build (once) and return the paths of the demo's ``calib.npz`` and ``eval.npz``."""
    folder = Path(folder) if folder else demo_data_dir()
    calib, evaluation = folder / "calib.npz", folder / "eval.npz"
    if calib.exists() and evaluation.exists():
        return calib, evaluation
    folder.mkdir(parents=True, exist_ok=True)
    rows: list[np.ndarray] = []
    seen: set[bytes] = set()
    for path in _python_files():
        try:
            data = path.read_bytes()
        except OSError:
            continue
        row = magika_features(data)
        digest = hashlib.sha1(row.tobytes()).digest()
        if digest in seen:
            continue
        seen.add(digest)
        rows.append(row)
        if len(rows) == n_calib + n_eval:
            break
    if len(rows) < n_calib + n_eval:
        raise RuntimeError(
            f"found only {len(rows)} distinct files in the Python installation; "
            f"the demo needs {n_calib + n_eval}"
        )
    # Alternate rows so both sets span the same mix of content types.
    every = np.stack(rows)
    calib_idx = np.arange(len(every))[:: (n_calib + n_eval) // n_calib][:n_calib]
    eval_idx = np.setdiff1d(np.arange(len(every)), calib_idx)[:n_eval]
    for target, idx in ((calib, calib_idx), (evaluation, eval_idx)):
        with replacing(target) as tmp:  # its temporary name ends in .npz: savez keeps it
            np.savez(tmp, bytes=every[idx])
    _logger.info("demo data built from %d Python installation files in %s", len(rows), folder)
    return calib, evaluation
