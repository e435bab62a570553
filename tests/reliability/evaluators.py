"""Custom evaluators that inject faults, for the reliability tests.

A model built by :func:`tests.reliability.helpers.plan_model` carries a *plan* in its ONNX
metadata (``raysearch_test_plan``, JSON), which ONNX Runtime's quantizer copies into every
quantized model; so each call knows, from the model alone, where to log and which fault to
inject:

- ``log``: a JSON-lines file; every call appends one line (``trial``: the model file's stem,
  which is the trial id; ``sig``; ``pid``; ``node``: the Ray node id of the calling process,
  None outside Ray; ``file`` and ``size``: the model file scored, as it is during the trial;
  ``cuda``: ``CUDA_VISIBLE_DEVICES``; open file descriptors; files next to the model; the temp
  folder's raysearch entries; ``t``);
- ``faults``: signature -> fault, one of ``raise``, ``segv``, ``kill`` (SIGKILL, as the kernel's
  OOM killer sends), ``memory`` (allocate under an ``RLIMIT_AS`` until ``MemoryError``),
  ``hang`` (sleep ``hang_s``), ``segv_once`` (segfault on the setting's first call only);
- ``sleep_s``: seconds every quantized-model call sleeps (to stretch a search);
- ``node_faults``: test node name -> faults of the first, second, ... quantized call made on
  that node (the node whose processes have :data:`NODE_ENV` set to the name; counted across
  its processes), each a fault above or ``freeze_node``: stop the node's raylet (``SIGSTOP``:
  the node hangs until the test kills it) and score 1000 above the model's own score, so that
  the trial whose model the driver can no longer fetch is the best one.

The signature of a quantized model is ``"<excluded MatMul nodes>/<activation dtype>"``:
``"-/int8"``, ``"fc1/uint8"``, ``"fc1+fc2/int8"`` (``nodes_to_exclude`` and ``activation_type``
of the setting); the float model's is ``"float"``. The log line says which fault the call
injects (``fault``).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from tests.models import mlp_data

PLAN_KEY = "raysearch_test_plan"
#: The environment variable that names the test node a Ray worker runs on (set on the
#: ``ray start`` of that node; its workers inherit it).
NODE_ENV = "RAYSEARCH_TEST_NODE"
#: Temp-folder prefixes of what quantizing, calibrating and ONNX Runtime create.
TEMP_PREFIXES = ("raysearch-", "ort.quant.", "pre.quant.")


def read_plan(model: onnx.ModelProto) -> dict[str, Any]:
    for prop in model.metadata_props:
        if prop.key == PLAN_KEY:
            return json.loads(prop.value)
    raise ValueError(f"the model carries no {PLAN_KEY} metadata")


def signature(model: onnx.ModelProto) -> str:
    """Which MatMuls were excluded and the activations' integer type; ``float`` if unquantized."""
    nodes = list(model.graph.node)
    quantize = [n for n in nodes if n.op_type == "QuantizeLinear"]
    if not quantize:
        return "float"
    dequantized = {o for n in nodes if n.op_type == "DequantizeLinear" for o in n.output}
    initializers = {i.name: i for i in model.graph.initializer}
    excluded = sorted(
        n.name for n in nodes if n.op_type == "MatMul" and n.input[1] not in dequantized
    )
    dtypes = [
        onnx.helper.tensor_dtype_to_np_dtype(initializers[n.input[2]].data_type).name
        for n in quantize
        if n.input[0] not in initializers and len(n.input) > 2 and n.input[2] in initializers
    ]
    return f"{'+'.join(excluded) or '-'}/{dtypes[0] if dtypes else '?'}"


def _log(path: str, **fields: Any) -> None:
    line = json.dumps({**fields, "t": time.time()}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write: lines of concurrent actors never interleave
    finally:
        os.close(fd)


def _temp_entries() -> int:
    folder = tempfile.gettempdir()
    return sum(1 for name in os.listdir(folder) if name.startswith(TEMP_PREFIXES))


def _node_id() -> str | None:
    """The Ray node this process runs on (None when it is not connected to Ray)."""
    ray = sys.modules.get("ray")  # never import Ray into a process that runs without it
    if ray is None or not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


def _node_fault(plan: dict[str, Any]) -> str | None:
    """This call's fault by its rank among the quantized calls on this process's test node:
    the rank is claimed with a marker file created exclusively, so concurrent processes of
    the node never take the same one."""
    node = os.environ.get(NODE_ENV)
    for rank, fault in enumerate(plan.get("node_faults", {}).get(node or "", [])):
        try:
            os.close(os.open(f"{plan['log']}.{node}-{rank}", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        return fault
    return None


def _freeze_node() -> None:
    """Stop this Ray worker's raylet (its parent process): the node stops answering."""
    raylet = os.getppid()
    name = Path(f"/proc/{raylet}/comm").read_text().strip()
    if name != "raylet":  # never stop anything else
        raise RuntimeError(f"freeze_node: the parent process {raylet} is {name!r}, not a raylet")
    os.kill(raylet, signal.SIGSTOP)


def _rss_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def _exhaust_memory(limit_mib: int = 256) -> None:
    """Allocate under an address-space limit just above what this process uses, until
    ``MemoryError``; the limit is lifted again before the error propagates."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    status = Path("/proc/self/status").read_text()
    used = int(next(ln for ln in status.splitlines() if ln.startswith("VmSize:")).split()[1])
    resource.setrlimit(resource.RLIMIT_AS, ((used << 10) + (limit_mib << 20), hard))
    hoard = []
    try:
        while True:
            hoard.append(np.ones(32 << 20, np.uint8))
    finally:
        hoard.clear()
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def probe(model_path: str, providers: list) -> float:
    """Mean output on 32 fixed inputs; logs the call and injects the plan's fault first."""
    model = onnx.load(model_path, load_external_data=False)
    plan = read_plan(model)
    sig = signature(model)
    path = Path(model_path)
    quantized = sig != "float"
    fault = plan.get("faults", {}).get(sig) if quantized else None
    if quantized and fault is None:
        fault = _node_fault(plan)
    _log(
        plan["log"],
        trial=path.stem if quantized else "float",
        sig=sig,
        pid=os.getpid(),
        node=_node_id(),
        file=os.path.abspath(model_path),
        size=path.stat().st_size,
        cuda=os.environ.get("CUDA_VISIBLE_DEVICES"),
        fds=len(os.listdir("/proc/self/fd")),
        siblings=len(list(path.parent.iterdir())) if quantized else None,
        temp=_temp_entries(),
        rss_mib=_rss_mib(),
        fault=fault,
    )
    if fault == "segv_once":
        marker = Path(f"{plan['log']}.crashed-{sig.replace('/', '_')}")
        fault = None if marker.exists() else "segv"
        marker.touch()
    if fault == "raise":
        raise RuntimeError(f"injected failure for {sig}")
    if fault == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "memory":
        _exhaust_memory()
    if fault == "hang":
        time.sleep(float(plan.get("hang_s", 600)))
    bonus = 0.0
    if fault == "freeze_node":
        _freeze_node()
        bonus = 1000.0
    if quantized and plan.get("sleep_s"):
        time.sleep(float(plan["sleep_s"]))
    session = ort.InferenceSession(model_path, providers=providers)
    try:
        return float(session.run(None, mlp_data(32, seed=7))[0].mean()) + bonus
    finally:
        del session


def returns_text(model_path: str, providers: list) -> str:
    return "good"


def returns_nan(model_path: str, providers: list) -> float:
    return float("nan")


def raises_on_float(model_path: str, providers: list) -> float:
    raise FileNotFoundError("labels.csv")


def one_argument(model_path: str) -> float:
    return 1.0


not_callable = 3
