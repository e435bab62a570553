"""Benchmark: top-1 agreement with the float model on magika, quantizing only MatMul/Conv vs
every op ONNX Runtime quantizes.

The grid is the quickstart's (``configs/quickstart.yaml``): calibrate_method MinMax,
Percentile 99.99 and Percentile 99.999 x activation_type QUInt8/QInt8 x per_channel on/off,
weight_type QInt8, x op_types_to_quantize ``[MatMul, Conv]`` or ``None`` (every op): 24
settings. magika (``_common.magika_source``): 200 calibration rows, 500 evaluation rows
(``--smoke``: 20 and 20 rows, MinMax/QUInt8 only, 2 settings).

Each setting runs through raysearch's own trial engine (``TrialRunner``, calibration cache
shared) with a custom evaluator: the fraction of evaluation rows whose predicted content type
(argmax of ``target_label``) is the float model's. This is the figure behind the README's
sentence on quantizing every op vs MatMul/Conv only.

Run::

    python benchmarks/op_types_top1.py            # 24 settings, 500 evaluation rows
    python benchmarks/op_types_top1.py --smoke    # 2 settings, 20 rows (tests)

Writes ``benchmarks/results/op_types_top1.json`` (``.smoke.json``; or ``--out``).
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Run, magika_arrays, magika_model, print_table, quiet  # noqa: E402

from raysearch.data import DataSource  # noqa: E402
from raysearch.evaluate import Evaluator  # noqa: E402
from raysearch.providers import make_session  # noqa: E402
from raysearch.trial import TrialDevice, TrialRunner, TrialSpec  # noqa: E402

THREADS = 2
OP_TYPES = {"MatMul/Conv": ["MatMul", "Conv"], "every op": None}
CALIBRATIONS = [
    ("MinMax", {}),
    ("Percentile", {"CalibPercentile": 99.99}),
    ("Percentile", {"CalibPercentile": 99.999}),
]


def grid(smoke: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """(op-types label, setting) pairs: 24, or 2 with ``smoke``."""
    calibrations = CALIBRATIONS[:1] if smoke else CALIBRATIONS
    activations = ["QUInt8"] if smoke else ["QUInt8", "QInt8"]
    per_channel = [False] if smoke else [True, False]
    out = []
    for label, ops in OP_TYPES.items():
        for (method, extra), activation, pc in itertools.product(
            calibrations, activations, per_channel
        ):
            setting: dict[str, Any] = {
                "calibrate_method": method,
                "activation_type": activation,
                "weight_type": "QInt8",
                "per_channel": pc,
                "op_types_to_quantize": ops,
            }
            if extra:
                setting["extra_options"] = dict(extra)
            out.append((label, setting))
    return out


def predictions(model: str | Path, rows: np.ndarray) -> np.ndarray:
    """magika's predicted label per row (argmax of its only output)."""
    session = make_session(model, THREADS)
    name = session.get_inputs()[0].name
    return np.concatenate(
        [
            session.run(None, {name: rows[i : i + 100]})[0].argmax(axis=1)
            for i in range(0, len(rows), 100)
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="2 settings, 20 rows (tests)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    quiet()
    run = Run("op_types_top1", args)
    calib_rows, eval_rows = (20, 20) if args.smoke else (200, 500)
    rows = []
    work = Path(tempfile.mkdtemp(prefix="raysearch-bench-top1-"))
    try:
        model = magika_model(work)
        calib_arrays, eval_arrays = magika_arrays(calib_rows, eval_rows)
        inputs = eval_arrays["bytes"]
        reference = predictions(model, inputs)

        def top1_agreement(model_path: str, providers: list) -> float:
            return float(np.mean(predictions(model_path, inputs) == reference))

        calib = DataSource.load(calib_arrays, model, batch_size=50)
        evaluator = Evaluator(top1_agreement, higher_is_better=True)
        with TrialRunner(
            TrialSpec(
                model,
                calib,
                None,
                evaluator,
                cache_dir=work / "cache",
                device=TrialDevice(threads=THREADS),
                measure_latency=False,
            )
        ) as runner:
            for i, (label, setting) in enumerate(grid(args.smoke)):
                result = runner.run(setting, work / f"q{i}.onnx")
                if result.status != "ok":
                    raise RuntimeError(f"setting {i} failed: {result.error}")
                rows.append(
                    {
                        "op_types": label,
                        "calibration": setting["calibrate_method"]
                        + "".join(f" {v}" for v in (setting.get("extra_options") or {}).values()),
                        "activation_type": setting["activation_type"],
                        "per_channel": setting["per_channel"],
                        "top1_agreement": result.metric,
                        "setting": setting,
                    }
                )
                print(f"  {i:2d}  {label:11s}  top-1 agreement {result.metric:.4f}")
            float_score = runner.float_score
    finally:
        shutil.rmtree(work, ignore_errors=True)

    groups = {}
    for label in OP_TYPES:
        values = [r["top1_agreement"] for r in rows if r["op_types"] == label]
        groups[label] = {
            "settings": len(values),
            "min": min(values),
            "median": statistics.median(values),
            "max": max(values),
        }
    print()
    print_table(
        rows,
        ["op_types", "calibration", "activation_type", "per_channel", "top1_agreement"],
        title=f"magika, {eval_rows} evaluation rows: top-1 agreement with the float model",
    )
    print()
    for label, g in groups.items():
        print(
            f"{label:11s}: top-1 agreement {100 * g['min']:.1f} %-{100 * g['max']:.1f} % "
            f"(median {100 * g['median']:.1f} %, {g['settings']} settings)"
        )
    run.write(
        {
            "eval_rows": eval_rows,
            "calib_rows": calib_rows,
            "float_top1_agreement": float_score,
            "groups": groups,
            "rows": rows,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
