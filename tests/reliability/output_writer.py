"""Writes a search's outputs over and over until killed (``python -m
tests.reliability.output_writer OUT``): alternately from 3 and 5 records, whose best models
differ, and appends a journal record after each round. The reliability tests kill it and
check that every file is whole.

With ``RAYSEARCH_TEST_HOLD=<pattern>`` (a path relative to OUT, ``fnmatch`` style) the writer
stops inside the real atomic writer from the second round on: right before the ``os.replace``
that would move a finished temporary file onto a file matching the pattern, it prints
``holding <temporary file>`` and sleeps until it is killed. A kill then provably lands
between "temporary file written" and "renamed into place"."""

from __future__ import annotations

import fnmatch
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from raysearch.config import SearchConfig
from raysearch.outputs import write_outputs
from raysearch.search.record.journal import Journal
from raysearch.trialrecord import TrialRecord
from tests.models import make_mlp_model

SIZES = (3, 5)
#: The environment variable naming the output to hold before its rename (see above).
HOLD = "RAYSEARCH_TEST_HOLD"
_round = 0


def records(n: int) -> list[TrialRecord]:
    """``n`` records; the best one (the last) keeps the model ``models/m<n>.onnx``."""
    return [
        TrialRecord(
            trial_id=f"t{i}",
            number=i,
            phase=0,
            status="ok",
            metric=1.0 / i,
            is_candidate=1.0 / i <= 0.3,  # L2 within the config's tolerance
            duration_s=0.1 * i,
            params={"calibrate_method": ["MinMax", "Percentile"][i % 2], "per_channel": i > 2},
            model_file=f"models/m{n}.onnx" if i == n else None,
        )
        for i in range(1, n + 1)
    ]


def config(out: Path) -> SearchConfig:
    raw = {
        "model": "model.onnx",
        "calibration_data": "calib.npz",
        "search_space": {"calibrate_method": ["MinMax", "Percentile"], "per_channel": [True]},
        "search_algo": "Grid",
        "metric": "L2",
        "tolerance": 0.3,
        "output_dir": str(out),
    }
    return SearchConfig.from_dict(raw, check_paths=False)


def prepare(out: Path) -> None:
    """The two best models (different sizes, so that a copy of either is recognisable)."""
    (out / "models").mkdir(parents=True, exist_ok=True)
    for n in SIZES:
        make_mlp_model(out / "models" / f"m{n}.onnx", hidden=8 * n)


def hold_before_replace(out: Path, pattern: str) -> None:
    """Wrap ``os.replace`` in this process (the library's writers call it by attribute, so
    they run unchanged and reach this wrapper): hold before the rename onto ``pattern``."""
    real_replace = os.replace
    out = Path(os.path.abspath(out))

    def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        target = Path(os.path.abspath(dst))
        if _round >= 1 and target.is_relative_to(out):
            if fnmatch.fnmatch(target.relative_to(out).as_posix(), pattern):
                print(f"holding {os.path.abspath(src)}", flush=True)
                time.sleep(3600)  # the test kills this process here
        real_replace(src, dst, *args, **kwargs)

    os.replace = replace


def main(out: Path) -> None:
    global _round
    prepare(out)
    if os.environ.get(HOLD):
        hold_before_replace(out, os.environ[HOLD])
    cfg = config(out)
    journal = Journal(out / "journal.jsonl")
    payload = "x" * 20000  # a long line
    for round_ in range(1_000_000):
        _round = round_
        n = SIZES[round_ % 2]
        write_outputs(out, records(n), config=cfg, stop_reason="space_exhausted", wall_time_s=1)
        journal.append(TrialRecord(trial_id=f"r{round_}", error=payload))
        if round_ == 0:
            print("ready", flush=True)
    shutil.rmtree(out)  # never reached


if __name__ == "__main__":
    main(Path(sys.argv[1]))
