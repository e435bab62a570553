"""Writes a search's outputs over and over until killed (``python -m
tests.reliability.output_writer OUT``): alternately from 3 and 5 records, whose best models
differ, and appends a journal record after each round. The reliability tests kill it at
random moments and check that every file is whole."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from raysearch.config import SearchConfig
from raysearch.outputs import write_outputs
from raysearch.search.journal import Journal
from tests.models import make_mlp_model

SIZES = (3, 5)


def records(n: int) -> list[dict[str, Any]]:
    """``n`` records; the best one (the last) keeps the model ``models/m<n>.onnx``."""
    return [
        {
            "trial_id": f"t{i}",
            "number": i,
            "phase": 0,
            "status": "ok",
            "metric": 1.0 / i,
            "is_candidate": i % 2 == 0,
            "duration_s": 0.1 * i,
            "params": {"calibrate_method": ["MinMax", "Percentile"][i % 2], "per_channel": i > 2},
            "model_file": f"models/m{n}.onnx" if i == n else None,
        }
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


def main(out: Path) -> None:
    prepare(out)
    cfg = config(out)
    journal = Journal(out / "journal.jsonl")
    payload = "x" * 20000  # a long line: a kill mid-append tears it
    for round_ in range(1_000_000):
        n = SIZES[round_ % 2]
        write_outputs(out, records(n), config=cfg, stop_reason="space_exhausted", wall_time_s=1)
        journal.append({"trial_id": f"r{round_}", "payload": payload})
        if round_ == 0:
            print("ready", flush=True)
    shutil.rmtree(out)  # never reached


if __name__ == "__main__":
    main(Path(sys.argv[1]))
