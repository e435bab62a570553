"""AutoRound's weights as a per-node choice on bytellama's genai folder, searched on the lent
machine's 16 CPU cores (issue 55): the allocation stage, which the 2-core machine under load
did not reach within the time limit, mixing the source's 4-bit nodes with 8-bit ones.

Usage (on the lent machine, after ``setup.sh``)::

    python3 benchmarks/gpu/genai_source.py GENAI_DIR INT4_DIR SOURCE_DIR DATA_DIR WORK OUT_JSON

``GENAI_DIR``: the builder's fp32 ``-e cpu`` folder; ``INT4_DIR``: its ``-p int4 -e cpu``;
``SOURCE_DIR``: AutoRound's rounding through the builder; ``DATA_DIR``: bytegpt's
``calib.npz`` and ``eval.npz``. The search: WeightOnly with ``algorithm: source`` beside the
preset's (``benchmarks/weight_only.py``'s ``source_space``), ``metric: kl``, the builder's KL
as the tolerance, its size as ``size_budget`` (MB), ``select: metric``, CPU trials, a time
limit of ``GENAI_SOURCE_TIME_LIMIT`` seconds (200). KL over all 8,192 positions on the CPU;
decode is onnxruntime-genai's, one thread, best of 3 rounds, the folders interleaved.
"""

from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.weight_only import (  # noqa: E402
    _folder_logits,
    _genai_row,
    genai_decode_ms,
    search,
    source_space,
)
from raysearch.modelfile import model_size_bytes  # noqa: E402


def main(genai: str, int4: str, source: str, data_dir: str, work: str, out: str) -> None:
    float_dir, int4_dir, source_dir, data = Path(genai), Path(int4), Path(source), Path(data_dir)
    work_dir = Path(work)
    ids = np.load(data / "eval.npz")["input_ids"]
    reference = _folder_logits(float_dir / "model.onnx", ids)
    folders = {"builder int4": int4_dir, "AutoRound through the builder": source_dir}
    rows = [_genai_row(n, f / "model.onnx", reference, ids) for n, f in folders.items()]
    builder = rows[0]
    budget_mb = model_size_bytes(int4_dir / "model.onnx") / 1e6
    limit = int(os.environ.get("GENAI_SOURCE_TIME_LIMIT", "200"))
    wall = search(
        float_dir, data / "calib.npz", data / "eval.npz", work_dir, builder["kl"],
        select="metric", size_budget=round(budget_mb, 6), stop={"time_limit": limit},
        resources={"max_concurrent_trials": int(os.environ.get("GENAI_SOURCE_TRIALS", "8"))},
        **source_space(source_dir),
    )  # fmt: skip
    best_dir = work_dir / "search" / "best"
    folders["raysearch best/ (source a choice)"] = best_dir
    best = _genai_row("raysearch best/ (source a choice)", best_dir / "model.onnx", reference, ids)
    best["time_s"] = round(wall, 1)
    rows.append(best)
    trials = pq.read_table(work_dir / "search" / "results.parquet").to_pylist()
    summary = json.loads((work_dir / "search" / "summary.json").read_text())
    decode = genai_decode_ms(list(folders.values()))
    for row, path in zip(rows, folders.values()):
        row["genai_decode_ms"] = decode[str(path)]
        row["builder_kl_over_this"] = builder["kl"] / row["kl"]
        row["size_over_builder"] = row["size_kb"] / builder["size_kb"]
    result = {
        "cpus": os.cpu_count(), "rows": rows, "search_wall_s": wall,
        "trials": len(trials), "n_candidates": summary.get("n_candidates"),
        "by_stage": dict(collections.Counter(t["stage"] for t in trials)),
        "by_status": dict(collections.Counter(t["status"] for t in trials)),
        "best_params": summary.get("best_params"), "stop_reason": summary.get("stop_reason"),
    }  # fmt: skip
    Path(out).write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main(*sys.argv[1:])
