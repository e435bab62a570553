"""Shared pieces of the benchmarks: machine information, result files, tables, the models and
data they run on, and the *naive loop* (how existing tools search: one setting after another,
each a full ``quantize_static`` call with its own calibration).

Every benchmark writes ``benchmarks/results/<name>.json`` through :func:`write_result`, which
adds :func:`machine_info` (CPUs, load average before and after, memory, library versions), so
a number can always be traced to the machine and the load it was measured under.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import logging
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from raysearch.cpu import cpu_info  # noqa: E402  (after the repository is on the path)

RESULTS = ROOT / "benchmarks" / "results"
#: magika's model and data beside the repository (``RAYSEARCH_MAGIKA_DIR`` overrides); when
#: absent, :func:`magika_source` falls back to the model that ships in the package.
SHARED_MAGIKA = ROOT.parent / "shared" / "models" / "magika"
#: Rows of magika's calibration and evaluation sets (as in ``../shared/models/magika``).
MAGIKA_ROWS = (200, 500)
CPUS = os.cpu_count() or 1

# Benchmark encoder: tests.models.make_encoder_model (LayerNormalization, MatMul, Softmax, an
# int64 attention mask; IR 8, opset 17) at a size where one trial takes about 0.3-1 s.
ENCODER = {"seq": 64, "dim": 256, "ffn": 1024}


# -- machine and results -------------------------------------------------------------------------
def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("raysearch", "onnxruntime", "onnx", "ray", "optuna", "numpy", "pyarrow"):
        try:
            module = __import__(name)
            out[name] = str(getattr(module, "__version__", "?"))
        except Exception:  # noqa: BLE001 - best effort
            out[name] = "missing"
    return out


def _meminfo_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def machine_info() -> dict[str, Any]:
    """CPUs, CPU model, memory, platform, the current load average and library versions."""
    cpu = cpu_info()  # int8 results and the best setting can differ by instruction set
    return {
        "cpus": CPUS,
        "cpu_model": cpu["model"],
        "cpu": cpu,
        "memory_gib": _meminfo_gib(),
        "platform": platform.platform(),
        "load_average": load_average(),
        "versions": _versions(),
    }


class Run:
    """The envelope of one benchmark run: machine information (load average at start and at
    the end), the arguments, wall time; :meth:`write` puts it with the payload in the JSON."""

    def __init__(self, name: str, args: Any) -> None:
        self.name = name
        self.args = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        self.machine = machine_info()
        self.started = time.perf_counter()
        self.started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")

    def write(self, payload: Mapping[str, Any], out: Path | None = None) -> Path:
        machine = dict(self.machine)
        machine["load_average_end"] = load_average()
        report = {
            "benchmark": self.name,
            "started_at": self.started_at,
            "benchmark_wall_s": round(time.perf_counter() - self.started, 2),
            "args": self.args,
            "machine": machine,
            **payload,
        }
        if _MAGIKA_USED:  # which magika files the figures come from
            report["magika"] = dict(_MAGIKA_USED)
        if out is None:
            # The full run writes <name>.json; --quick and --smoke runs keep their own files.
            mode = (
                "smoke" if self.args.get("smoke") else ("quick" if self.args.get("quick") else "")
            )
            out = RESULTS / (f"{self.name}.{mode}.json" if mode else f"{self.name}.json")
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        text = json.dumps(_finite(report), indent=1, default=_json_default, allow_nan=False)
        tmp.write_text(text + "\n")
        os.replace(tmp, out)
        print(f"written: {out}")
        return out


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities replaced by None (strict JSON)."""
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    return str(value)


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], title: str = "") -> None:
    """A plain text table of ``rows`` (floats with 3 significant decimals)."""

    def fmt(value: Any) -> str:
        if isinstance(value, bool) or value is None:
            return str(value)
        if isinstance(value, float):
            return f"{value:.4g}" if abs(value) < 1e-3 and value else f"{value:.3f}"
        return str(value)

    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    if title:
        print(title)
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def quiet() -> None:
    """Silence quantize_static's pre-processing hints and Ray's start-up notes."""
    logging.getLogger().setLevel(logging.ERROR)


def init_ray(cpus: int = CPUS) -> None:
    """A local Ray of ``cpus`` CPUs, with the Ray settings of the Ray a search starts for
    itself (no idle workers prestarted)."""
    import ray

    from raysearch.search.runtime.cluster import OWN_RAY_SYSTEM_CONFIG

    if not ray.is_initialized():
        ray.init(
            address="local",  # its own, never a `ray start` cluster running on this machine
            num_cpus=cpus,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
            _system_config=OWN_RAY_SYSTEM_CONFIG,
        )


def shutdown_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


# -- models and data -----------------------------------------------------------------------------
_MAGIKA_USED: dict[str, str] = {}


def magika_source(shared: Path | None = None) -> dict[str, Path | str]:
    """Where magika's model and data come from: ``RAYSEARCH_MAGIKA_DIR`` when set (it must
    hold ``model.onnx``, ``calib.npz`` and ``eval.npz``), else ``shared`` (default
    ``../shared/models/magika`` beside the repository) when it holds them, else the model that
    ships in the package (``raysearch/demo/magika``, the same file) with 200 calibration and
    500 evaluation rows made by the package's own data builder
    (:func:`raysearch.demo.build_demo_data`, from the Python installation's files; cached).

    Returns ``{"model", "calib", "eval", "source"}``; ``source`` is ``"shared"`` or
    ``"package"``."""
    env = os.environ.get("RAYSEARCH_MAGIKA_DIR")
    folder = Path(env) if env else (SHARED_MAGIKA if shared is None else Path(shared))
    names = ("model.onnx", "calib.npz", "eval.npz")
    if all((folder / name).is_file() for name in names):
        return {
            "model": folder / "model.onnx",
            "calib": folder / "calib.npz",
            "eval": folder / "eval.npz",
            "source": "shared",
        }
    if env:
        raise SystemExit(f"RAYSEARCH_MAGIKA_DIR={env}: expected {', '.join(names)} there")
    from raysearch.demo import MAGIKA_DIR, build_demo_data, demo_data_dir

    calib, evaluation = build_demo_data(
        demo_data_dir().parent / "magika-bench", n_calib=MAGIKA_ROWS[0], n_eval=MAGIKA_ROWS[1]
    )
    return {
        "model": MAGIKA_DIR / "model.onnx",
        "calib": calib,
        "eval": evaluation,
        "source": "package",
    }


def magika_arrays(calib_rows: int = 200, eval_rows: int = 500) -> tuple[dict, dict]:
    """magika's calibration and evaluation arrays (``{"bytes": int32 [N, 2048]}``), from
    :func:`magika_source`; the source is recorded in the result file."""
    if calib_rows > MAGIKA_ROWS[0] or eval_rows > MAGIKA_ROWS[1]:
        raise SystemExit(f"magika has {MAGIKA_ROWS[0]} / {MAGIKA_ROWS[1]} rows at most")
    source = magika_source()
    _MAGIKA_USED.update({k: str(v) for k, v in source.items()})
    with np.load(source["calib"], allow_pickle=False) as f:
        calib = {"bytes": f["bytes"][:calib_rows]}
    with np.load(source["eval"], allow_pickle=False) as f:
        evaluation = {"bytes": f["bytes"][:eval_rows]}
    return calib, evaluation


def magika_model(folder: Path) -> Path:
    """A copy of magika's model in ``folder`` (quantize_static writes next to its input)."""
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "magika.onnx"
    shutil.copyfile(magika_source()["model"], model)
    return model


def encoder_model(folder: Path, **size: int) -> Path:
    """The benchmark encoder (:data:`ENCODER` sizes unless overridden) in ``folder``."""
    from tests.models import make_encoder_model

    dims = {**ENCODER, **size}
    return make_encoder_model(folder / "encoder_{seq}x{dim}x{ffn}.onnx".format(**dims), **dims)


def encoder_arrays(n: int, seed: int, **size: int) -> dict[str, np.ndarray]:
    from tests.models import encoder_data

    dims = {**ENCODER, **size}
    return encoder_data(n, seq=dims["seq"], dim=dims["dim"], seed=seed)


def one_calibration_space(op_types: list[list[str]] | None = None) -> dict[str, Any]:
    """A grid of 64 settings (times the ``op_types`` choices) that share one MinMax
    calibration per op-type choice: after the first trial, trials are cache hits, so their
    time is quantization and evaluation."""
    space: dict[str, Any] = {"calibrate_method": ["MinMax"]}
    if op_types is not None:
        space["op_types_to_quantize"] = op_types
    space.update(
        {
            "activation_type": ["QUInt8", "QInt8"],
            "per_channel": [True, False],
            "reduce_range": [False, True],
            "extra_options": {
                "ActivationSymmetric": [False, True],
                "WeightSymmetric": [True, False],
                "CalibTensorRangeSymmetric": [False, True],
            },
        }
    )
    return space


def save_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path


# -- settings ------------------------------------------------------------------------------------
def calibration_id(setting: Mapping[str, Any]) -> str:
    """What decides calibration in ``quantize_static``: the method and its options."""
    extra = setting.get("extra_options") or {}
    calib = {k: v for k, v in extra.items() if k.startswith("Calib") or k == "num_bins"}
    return json.dumps([setting["calibrate_method"], calib], sort_keys=True)


def setting_id(setting: Mapping[str, Any]) -> str:
    """Identity of a setting for matching the naive loop's rows with raysearch's trials:
    defaults made explicit (ActivationSymmetric false, per_channel false)."""
    extra = dict(setting.get("extra_options") or {})
    extra.setdefault("ActivationSymmetric", False)
    return json.dumps(
        {
            "calibrate_method": setting["calibrate_method"],
            "activation_type": setting.get("activation_type", "QUInt8"),
            "weight_type": setting.get("weight_type", "QInt8"),
            "per_channel": bool(setting.get("per_channel", False)),
            "op_types_to_quantize": setting.get("op_types_to_quantize"),
            "extra_options": extra,
        },
        sort_keys=True,
    )


def product_settings(
    calibrations: Iterable[tuple[str, Mapping[str, Any]]],
    activations: Iterable[tuple[str, bool | None]],
    per_channel: Iterable[bool],
    op_types: Sequence[str],
    weight_type: str = "QInt8",
) -> list[dict[str, Any]]:
    """Settings (raysearch's nested form, which ``quantize_static`` takes key by key):
    calibration x (activation type, ActivationSymmetric or None) x per_channel."""
    out = []
    for (method, calib_extra), (activation, symmetric), pc in itertools.product(
        list(calibrations), list(activations), list(per_channel)
    ):
        setting: dict[str, Any] = {
            "calibrate_method": method,
            "activation_type": activation,
            "weight_type": weight_type,
            "per_channel": pc,
            "op_types_to_quantize": list(op_types),
        }
        extra = dict(calib_extra)
        if symmetric is not None:
            extra["ActivationSymmetric"] = symmetric
        if extra:
            setting["extra_options"] = extra
        out.append(setting)
    return out


# -- the naive loop ------------------------------------------------------------------------------
def quantize_static_setting(model: Path, out: Path, reader: Any, setting: Mapping) -> None:
    """One ``onnxruntime.quantization.quantize_static`` call for ``setting`` (calibration
    inference included, as every call does)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType
    from onnxruntime.quantization import quantize_static as ort_quantize_static

    with contextlib.redirect_stdout(io.StringIO()):
        ort_quantize_static(
            model,
            out,
            reader,
            quant_format=QuantFormat[setting.get("quant_format", "QDQ")],
            op_types_to_quantize=setting.get("op_types_to_quantize"),
            per_channel=bool(setting.get("per_channel", False)),
            reduce_range=bool(setting.get("reduce_range", False)),
            activation_type=QuantType[setting.get("activation_type", "QUInt8")],
            weight_type=QuantType[setting.get("weight_type", "QInt8")],
            calibrate_method=CalibrationMethod[setting["calibrate_method"]],
            extra_options=dict(setting.get("extra_options") or {}) or None,
        )


def naive_loop(
    model: Path,
    settings: Sequence[Mapping[str, Any]],
    calib: Any,
    evaluation: Any,
    work: Path,
    *,
    threads: int = CPUS,
    reference: str = "recompute",
    metrics: Sequence[str] = ("cos", "L2"),
    log: Callable[[str], None] | None = print,
) -> dict[str, Any]:
    """The way existing tools search: for every setting, ``quantize_static`` (calibration
    again every time), then the quantized model's outputs on the evaluation data against the
    float model's, and the metrics.

    ``reference``: ``"recompute"`` runs the float model on the evaluation data for every
    setting; ``"npy"`` runs it once, saves the outputs as ``.npy`` and loads them for every
    setting (counted in ``wall_s``, as ``float_reference_once_s``). ``calib`` and
    ``evaluation`` are :class:`raysearch.data.DataSource` (only ``reader()`` and
    ``batches()`` are used). ``threads``: intra-op threads of the evaluation sessions
    (``quantize_static``'s own calibration sessions use ONNX Runtime's default, every core).
    """
    from raysearch.evaluate import compute_metric, run_model
    from raysearch.providers import make_session

    if reference not in ("recompute", "npy"):
        raise ValueError(f"reference must be 'recompute' or 'npy', not {reference!r}")
    rows = []
    start = time.perf_counter()
    once_s = 0.0
    ref_files: dict[str, Path] = {}
    if reference == "npy":
        t0 = time.perf_counter()
        outputs, _ = run_model(make_session(model, threads), evaluation)
        for i, (name, value) in enumerate(outputs.items()):
            ref_files[name] = work / f"float_reference_{i}.npy"
            np.save(ref_files[name], value, allow_pickle=False)
        once_s = time.perf_counter() - t0
    for i, setting in enumerate(settings):
        out = work / f"naive_{i}.onnx"
        t0 = time.perf_counter()
        quantize_static_setting(model, out, calib.reader(), setting)
        t1 = time.perf_counter()
        if reference == "npy":
            ref = {name: np.load(path, allow_pickle=False) for name, path in ref_files.items()}
        else:
            ref, _ = run_model(make_session(model, threads), evaluation)
        t2 = time.perf_counter()
        quantized, _ = run_model(make_session(out, threads), evaluation)
        values = {m: compute_metric(m, quantized, ref) for m in metrics}
        t3 = time.perf_counter()
        with contextlib.suppress(OSError):
            out.unlink()
        rows.append(
            {
                "setting": dict(setting),
                "quantize_static_s": t1 - t0,
                "float_reference_s": t2 - t1,
                "evaluation_s": t3 - t2,
                **values,
            }
        )
        if log:
            shown = "  ".join(f"{m} {values[m]:.6f}" for m in metrics)
            log(f"  naive {i:2d}  qs {t1 - t0:6.2f}s  eval {t3 - t1:5.2f}s  {shown}")
    return {"wall_s": time.perf_counter() - start, "float_reference_once_s": once_s, "trials": rows}


def best_row(rows: Sequence[Mapping[str, Any]], metric: str, higher: bool) -> Mapping[str, Any]:
    """The row with the best ``metric`` (the first one on a tie)."""
    best = None
    for row in rows:
        value = row.get(metric)
        if value is None or not np.isfinite(value):
            continue
        if best is None or (value > best[metric] if higher else value < best[metric]):
            best = row
    if best is None:
        raise RuntimeError(f"no row has a finite {metric}")
    return best


# -- processes and disk --------------------------------------------------------------------------
def proc_status(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (bytes) of ``pid`` from ``/proc/<pid>/status`` ({} if gone)."""
    out: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def proc_io(pid: int) -> dict[str, int]:
    """``/proc/<pid>/io`` counters (``write_bytes``: bytes sent to the storage layer)."""
    out: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = int(value)
    return out


def du_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 when it does not exist)."""
    total = 0
    if not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total
