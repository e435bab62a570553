"""Print what a search did, trial by trial: device, GPU id, timings, metric, then its summary.

Usage: ``python3 benchmarks/gpu/report.py OUTPUT_DIR`` (a finished search's folder).
"""

from __future__ import annotations

import json
import sys

import pyarrow.parquet as pq


def main(out: str) -> None:
    for row in pq.read_table(f"{out}/results.parquet").to_pylist():
        given = {k: v for k, v in row.items() if v is not None}
        print({k: v for k, v in given.items() if not k.startswith("params/")})
        print("   ", {k[7:]: v for k, v in given.items() if k.startswith("params/")})
    with open(f"{out}/summary.json") as fh:
        print(json.dumps(json.load(fh), default=str)[:4000])


if __name__ == "__main__":
    main(sys.argv[1])
