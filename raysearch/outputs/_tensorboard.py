"""``tensorboard/``: the metric, the best-so-far, the candidates found and the duration per
trial, as TensorBoard scalars, rewritten whole from the records: one search-wide series in
start order, which Ray Tune's per-trial ``TBXLoggerCallback`` does not write.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from raysearch.ranking import finite, is_candidate
from raysearch.trialrecord import TrialRecord

__all__ = ["write_tensorboard"]


def _swap_dir(built: Path, final: Path) -> None:
    """Move every file of ``built`` into ``final``, then remove the files of ``final`` that
    ``built`` did not hold (``final`` always holds complete files)."""
    final.mkdir(parents=True, exist_ok=True)
    new = {item.name for item in built.iterdir()}
    old = [item for item in final.glob("events.out.tfevents.*") if item.name not in new]
    for item in built.iterdir():
        os.replace(item, final / item.name)
    for item in old:
        item.unlink(missing_ok=True)
    shutil.rmtree(built, ignore_errors=True)


def write_tensorboard(rows: list[TrialRecord], folder: Path, higher: bool) -> None:
    """Write the scalars of ``rows`` (in start order) beside ``folder`` and swap them in."""
    from tensorboardX import SummaryWriter

    built = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(built, ignore_errors=True)
    writer = SummaryWriter(logdir=str(built))
    best = None
    candidates = 0
    try:
        for step, record in enumerate(rows, 1):
            metric = finite(record.metric)
            if is_candidate(record):
                candidates += 1
            if metric is not None and record.status == "ok":
                writer.add_scalar("trial/metric", metric, step)
                partial = record.stopped_at_rung is not None  # some rows only
                if not partial and (best is None or (metric > best if higher else metric < best)):
                    best = metric
            if best is not None:
                writer.add_scalar("search/best_metric", best, step)
            writer.add_scalar("search/candidates", candidates, step)
            duration = finite(record.duration_s)
            if duration is not None:
                writer.add_scalar("trial/duration_s", duration, step)
    finally:
        writer.close()
    _swap_dir(built, folder)
