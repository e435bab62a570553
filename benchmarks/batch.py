"""Benchmark: ``raysearch batch`` of many models against the same searches run one
``raysearch run`` after another (issue 37, item 4).

Each model is searched over ``MATMUL_CONV_INT8_SEARCH`` (12 settings: activation QUInt8 /
QInt8 x per-channel on / off x MinMax, Percentile 99.99, Percentile 99.999; MatMul, Gemm and
Conv only), ``search_algo: Grid`` (every setting runs), metric ``cos`` against the float
model's outputs, tolerance 0.99, ``early_stopping: false`` (every trial on every evaluation
row: the per-setting metrics, and so the best setting, do not depend on which trial reached a
rung first, which differs with the number of trials at once), batch size 32.

Models (the full run, 20):

- magika (``../shared/models/magika``, else the packaged copy, see ``_common.magika_source``):
  100 calibration rows, 200 evaluation rows;
- ppocr_rec (``../shared/models/ppocr_rec``, PP-OCRv4's text recognizer; skipped with a note
  when absent): 16 calibration lines, 32 evaluation lines (the first of its ``calib.npz`` and
  ``eval.npz``); metric ``cos`` of the per-column character probabilities against the float
  model's, not its task evaluator (``evaluator:char_accuracy``), to keep 12 trials affordable;
- the benchmark encoder (``_common.encoder_model``: seq 64, dim 256, ffn 1024): 100
  calibration rows, 300 evaluation rows;
- 17 test CNNs (``tests.models.make_conv_model``: Conv-Relu-Conv-Relu-pool-Gemm), channels
  8, 16, 32, 64 x input 16, 32, 48, 64 pixels and one of 128 channels at 32 pixels, each its
  own seed: 64 calibration rows, 128 evaluation rows.

``--quick``: 4 small CNNs (8 and 16 channels at 16 and 32 pixels). ``--smoke``: 1 tiny CNN
(what ``tests/test_benchmarks_smoke.py`` runs: every step of both sides once; a smoke's time is
the processes' and Ray's starts, which a second model would only repeat).

Both sides run the very same config per model, written as a user would:

(a) sequential: ``python -m raysearch run <model>.yaml`` for each model, one process after
    another, each starting and stopping its own local Ray (``address`` empty) and running
    ``max_concurrent_trials`` = what the cluster holds (the config's default: CPUs);
(b) batch: ``python -m raysearch batch manifest.yaml`` once: one local Ray, each model's
    search a ``raysearch run`` child joined to it, with the manifest's defaults for
    ``max_concurrent_models`` and ``max_concurrent_trials_per_model``.

Each side is timed from starting its first process to the end of its last. ``--repeat``
pairs alternate the order (a, b), (b, a), ... so that a quieter or busier stretch of a shared
machine falls on both; the load average is recorded before and after each side. Reported per
side: wall time, the trials' busy share of the cores (sum of the trials' durations / (wall x
CPUs)), each model's time from its process's start to its first trial (sequential only: the
batch starts its children itself), and per model whether the best setting is the same: the
same setting, or (a tie) the batch's best setting has exactly the sequential best metric in
the sequential run. Every setting's metric is compared too (``max_abs_metric_diff``).
Target: batch at least 2x faster, every model's best setting the same.

Run::

    python benchmarks/batch.py            # 20 models
    python benchmarks/batch.py --quick    # 4 small CNNs
    python benchmarks/batch.py --smoke    # 1 tiny CNN (tests)

Writes ``benchmarks/results/batch.json`` (``batch.quick.json``, ``batch.smoke.json``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    CPUS,
    ROOT,
    Run,
    encoder_arrays,
    encoder_model,
    load_average,
    magika_arrays,
    magika_model,
    print_table,
    save_npz,
)

SPACE = "MATMUL_CONV_INT8_SEARCH"
SHARED_PPOCR = ROOT.parent / "shared" / "models" / "ppocr_rec"
#: (channels, input size) of the full run's test CNNs.
CNNS = [(c, s) for c in (8, 16, 32, 64) for s in (16, 32, 48, 64)] + [(128, 32)]
QUICK_CNNS = [(8, 16), (8, 32), (16, 16), (16, 32)]
SMOKE_CNNS = [(4, 8)]
#: What every model's config holds besides its model and data.
DEFAULTS: dict[str, Any] = {
    "search_space": SPACE,
    "search_algo": "Grid",
    "metric": "cos",
    "tolerance": 0.99,
    "early_stopping": False,
    "batch_size": 32,
}


# -- the models ----------------------------------------------------------------------------------
def _cnn(folder: Path, channels: int, size: int, seed: int) -> dict[str, Any]:
    from tests.models import conv_data, make_conv_model

    name = f"cnn_c{channels}_s{size}"
    model = make_conv_model(folder / f"{name}.onnx", channels=channels, size=size, seed=seed)
    calib = save_npz(folder / f"{name}_calib.npz", conv_data(64, size=size, seed=100 + seed))
    evaluation = save_npz(folder / f"{name}_eval.npz", conv_data(128, size=size, seed=200 + seed))
    return {"name": name, "model": model, "calibration_data": calib, "eval_data": evaluation}


def _magika(folder: Path) -> dict[str, Any]:
    calib, evaluation = magika_arrays(100, 200)
    return {
        "name": "magika",
        "model": magika_model(folder),
        "calibration_data": save_npz(folder / "magika_calib.npz", calib),
        "eval_data": save_npz(folder / "magika_eval.npz", evaluation),
    }


def _ppocr(folder: Path) -> dict[str, Any] | None:
    if not all((SHARED_PPOCR / n).is_file() for n in ("model.onnx", "calib.npz", "eval.npz")):
        return None
    arrays = {}
    for kind, rows in (("calib", 16), ("eval", 32)):
        with np.load(SHARED_PPOCR / f"{kind}.npz", allow_pickle=False) as f:
            arrays[kind] = save_npz(folder / f"ppocr_rec_{kind}.npz", {"x": f["x"][:rows]})
    return {
        "name": "ppocr_rec",
        "model": SHARED_PPOCR / "model.onnx",
        "calibration_data": arrays["calib"],
        "eval_data": arrays["eval"],
    }


def _encoder(folder: Path) -> dict[str, Any]:
    return {
        "name": "encoder",
        "model": encoder_model(folder),
        "calibration_data": save_npz(folder / "encoder_calib.npz", encoder_arrays(100, seed=3)),
        "eval_data": save_npz(folder / "encoder_eval.npz", encoder_arrays(300, seed=9)),
    }


def prepare(folder: Path, args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    """The models' entries (name, model, data files) and notes on models left out."""
    folder.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    if args.smoke:
        cnns = SMOKE_CNNS
    elif args.quick:
        cnns = QUICK_CNNS
    else:
        cnns = CNNS
    models = []
    if not (args.smoke or args.quick):
        models.append(_magika(folder))
        ppocr = _ppocr(folder)
        if ppocr is None:
            notes.append(f"ppocr_rec left out: {SHARED_PPOCR} is missing")
        else:
            models.append(ppocr)
        models.append(_encoder(folder))
    models += [_cnn(folder, c, s, seed) for seed, (c, s) in enumerate(cnns)]
    return [{k: str(v) for k, v in m.items()} for m in models], notes


# -- the two sides -------------------------------------------------------------------------------
def run_sequential(models: list[dict[str, Any]], folder: Path) -> dict[str, Any]:
    """One ``raysearch run`` process per model, one after another."""
    out = folder / "sequential"
    shutil.rmtree(out, ignore_errors=True)
    (out / "configs").mkdir(parents=True)
    load_before = load_average()
    per_model = {}
    started = time.perf_counter()
    for entry in models:
        config = {**DEFAULTS, **{k: v for k, v in entry.items() if k != "name"}}
        config["output_dir"] = str(out / entry["name"])
        path = out / "configs" / f"{entry['name']}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        t0, at = time.perf_counter(), time.time()
        done = subprocess.run(
            [sys.executable, "-m", "raysearch", "run", str(path)], capture_output=True, text=True
        )
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(
                f"{entry['name']}: raysearch run exited {done.returncode}: {done.stderr[-2000:]}"
            )
        per_model[entry["name"]] = {"wall_s": round(wall, 2), "process_started_at": at}
        print(f"  sequential {entry['name']:16s} {wall:6.1f} s")
    wall = time.perf_counter() - started
    return {
        "wall_s": round(wall, 2),
        "load_average": [load_before, load_average()],
        "models": per_model,
        "folders": {m["name"]: str(out / m["name"]) for m in models},
    }


def run_batch(models: list[dict[str, Any]], folder: Path) -> dict[str, Any]:
    """``raysearch batch manifest.yaml`` once."""
    out = folder / "batch"
    shutil.rmtree(out, ignore_errors=True)
    manifest = {
        "output_dir": str(out),
        "defaults": DEFAULTS,
        "models": models,
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "manifest.yaml"
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    load_before = load_average()
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "raysearch", "batch", str(path)], capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"raysearch batch exited {done.returncode}: {done.stderr[-3000:]}")
    print(f"  batch of {len(models)}: {wall:.1f} s")
    return {
        "wall_s": round(wall, 2),
        "load_average": [load_before, load_average()],
        "folders": {m["name"]: str(out / m["name"]) for m in models},
    }


# -- reading the outputs -------------------------------------------------------------------------
def _key(settings: Any) -> str:
    return json.dumps(settings, sort_keys=True, default=str)


def read_search(folder: Path) -> dict[str, Any]:
    """A search's best setting and metric, every setting's metric and its trials' timeline."""
    summary = json.loads((folder / "summary.json").read_text())
    records = [json.loads(line) for line in (folder / "journal.jsonl").read_text().splitlines()]
    ok = [r for r in records if r.get("status") == "ok"]
    timed = [r for r in records if r.get("started_at") and r.get("ended_at")]
    return {
        "best_params": summary.get("best_params"),
        "best_metric": summary.get("best_metric"),
        "n_trials": summary.get("n_trials"),
        "n_failed": summary.get("n_failed"),
        "wall_time_s": summary.get("wall_time_s"),
        "metrics": {_key(r.get("params")): r.get("metric") for r in ok},
        "busy_s": sum(r.get("duration_s") or 0.0 for r in records),
        "first_trial_at": min((r["started_at"] for r in timed), default=None),
        "last_trial_at": max((r["ended_at"] for r in timed), default=None),
    }


def compare(name: str, seq: dict[str, Any], batch: dict[str, Any]) -> dict[str, Any]:
    """Whether the batch found the sequential run's best setting (a tie counts: the batch's
    best setting has exactly the sequential best metric in the sequential run)."""
    same_setting = _key(seq["best_params"]) == _key(batch["best_params"])
    tied = seq["metrics"].get(_key(batch["best_params"])) == seq["best_metric"]
    common = set(seq["metrics"]) & set(batch["metrics"])
    diffs = [abs(seq["metrics"][k] - batch["metrics"][k]) for k in common]
    return {
        "model": name,
        "same_best": bool(same_setting or tied),
        "same_setting": same_setting,
        "seq_best_metric": seq["best_metric"],
        "batch_best_metric": batch["best_metric"],
        "settings_compared": len(common),
        "max_abs_metric_diff": max(diffs) if diffs else None,
        "seq_trials": seq["n_trials"],
        "batch_trials": batch["n_trials"],
        "seq_search_s": seq["wall_time_s"],
        "batch_search_s": batch["wall_time_s"],
    }


def side_figures(side: dict[str, Any], searches: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A side's trials' busy share of the cores, and (sequential) each model's start-up."""
    busy = sum(s["busy_s"] for s in searches.values())
    out = {
        "wall_s": side["wall_s"],
        "load_average": side["load_average"],
        "trial_busy_s": round(busy, 2),
        "trial_busy_share": round(busy / (side["wall_s"] * CPUS), 3),
    }
    if "models" in side:  # sequential: each process's start to its first trial
        startup = [
            searches[n]["first_trial_at"] - m["process_started_at"]
            for n, m in side["models"].items()
            if searches[n]["first_trial_at"]
        ]
        out["to_first_trial_s_median"] = round(float(np.median(startup)), 2)
        out["per_model_wall_s"] = {n: m["wall_s"] for n, m in side["models"].items()}
    return out


def one_pair(models: list[dict[str, Any]], folder: Path, batch_first: bool) -> dict[str, Any]:
    sides = {}
    for kind in ("batch", "sequential") if batch_first else ("sequential", "batch"):
        sides[kind] = (run_batch if kind == "batch" else run_sequential)(models, folder / kind)
    searches = {
        kind: {n: read_search(Path(f)) for n, f in side["folders"].items()}
        for kind, side in sides.items()
    }
    rows = [
        compare(m["name"], searches["sequential"][m["name"]], searches["batch"][m["name"]])
        for m in models
    ]
    return {
        "order": "batch, sequential" if batch_first else "sequential, batch",
        "ratio": round(sides["sequential"]["wall_s"] / sides["batch"]["wall_s"], 3),
        "sequential": side_figures(sides["sequential"], searches["sequential"]),
        "batch": side_figures(sides["batch"], searches["batch"]),
        "every_best_same": all(r["same_best"] for r in rows),
        "models": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="4 small CNNs")
    parser.add_argument("--smoke", action="store_true", help="1 tiny CNN (tests)")
    parser.add_argument("--repeat", type=int, default=1, help="alternating pairs (default 1)")
    parser.add_argument("--out", type=Path, default=None, help="the result JSON's path")
    parser.add_argument("--keep", type=Path, default=None, help="keep the outputs in this folder")
    args = parser.parse_args(argv)
    run = Run("batch", args)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="raysearch-batch-"))
    try:
        models, notes = prepare(work / "models", args)
        print(f"== {len(models)} models, {SPACE}, {CPUS} CPUs")
        pairs = []
        for i in range(args.repeat):
            pairs.append(one_pair(models, work / f"pair_{i}", batch_first=bool(i % 2)))
            print(f"  pair {i + 1}: {pairs[-1]['ratio']:.2f}x")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    ratios = [p["ratio"] for p in pairs]
    median = sorted(range(len(ratios)), key=ratios.__getitem__)[(len(ratios) - 1) // 2]
    result = pairs[median]
    print_table(
        result["models"],
        [
            "model",
            "same_best",
            "seq_best_metric",
            "batch_best_metric",
            "max_abs_metric_diff",
            "seq_search_s",
            "batch_search_s",
        ],
        title="median pair, per model",
    )
    sides = [
        {"side": k, **{c: v for c, v in result[k].items() if not isinstance(v, dict)}}
        for k in ("sequential", "batch")
    ]
    print_table(
        sides, ["side", "wall_s", "trial_busy_share", "to_first_trial_s_median", "load_average"]
    )
    print(
        f"batch {result['ratio']:.2f}x faster than sequential (median of {len(pairs)}; "
        f"target >= 2); every best setting the same: {result['every_best_same']}"
    )
    run.write(
        {
            "space": SPACE,
            "defaults": DEFAULTS,
            "models": [m["name"] for m in models],
            "notes": notes,
            "ratio": result["ratio"],
            "ratios": ratios,
            "every_best_same": all(p["every_best_same"] for p in pairs),
            "median_pair": result,
            "pairs": pairs,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
