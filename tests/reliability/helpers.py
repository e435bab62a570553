"""Shared pieces of the reliability tests: models that carry a fault plan, configs, the
evaluator's call log, and ``raysearch`` run as a real process (to be killed or interrupted)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import yaml

from tests.models import make_mlp_model, mlp_data
from tests.reliability.evaluators import PLAN_KEY

REPO = Path(__file__).resolve().parents[2]
PROBE = "tests.reliability.evaluators:probe"

#: A grid of 24 settings on the MLP (every one quantizes fine).
GRID_24: dict[str, Any] = {
    "calibrate_method": ["MinMax", "Percentile", "Entropy"],
    "per_channel": [True, False],
    "activation_type": ["QUInt8", "QInt8"],
    "reduce_range": [False, True],
}


def plan_model(path: Path, log: Path, **plan: Any) -> Path:
    """The test MLP with ``{"log": log, **plan}`` in its metadata (see ``evaluators``)."""
    make_mlp_model(path)
    model = onnx.load(str(path))
    onnx.helper.set_model_props(model, {PLAN_KEY: json.dumps({"log": str(log), **plan})})
    onnx.save(model, str(path))
    return path


def write_data(path: Path, n: int = 64) -> Path:
    np.savez(path, **mlp_data(n))
    return path


def probe_config(folder: Path, **overrides: Any) -> dict[str, Any]:
    """A Grid config over :data:`GRID_24` scored by the probe evaluator; the model (with an
    empty fault plan unless ``faults``/``plan`` say otherwise) and data are made in ``folder``."""
    plan = dict(overrides.pop("plan", {}))
    if "faults" in overrides:
        plan["faults"] = overrides.pop("faults")
    model = plan_model(folder / "model.onnx", folder / "calls.jsonl", **plan)
    data = write_data(folder / "calib.npz")
    config: dict[str, Any] = {
        "model": str(model),
        "calibration_data": str(data),
        "search_space": GRID_24,
        "search_algo": "Grid",
        "metric": PROBE,
        "higher_is_better": True,
        "tolerance": 0.05,
        "seed": 0,
        "output_dir": str(folder / "out"),
        "measure_latency": False,
    }
    config.update(overrides)
    return config


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def calls(log: Path) -> list[dict[str, Any]]:
    """The probe evaluator's calls, in the order written."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def journal(folder: Path) -> list[dict[str, Any]]:
    path = folder / "journal.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line being written
    return out


def subprocess_env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def start_raysearch(args: list[str], cwd: Path, **env: str) -> subprocess.Popen:
    """``raysearch ARGS`` as a real process in a session of its own (with the Ray it starts),
    as a terminal would run it; stdout and stderr go to files in ``cwd``. Its process group
    holds the driver and Ray's GCS and raylet; Ray's workers (the trials' actors) each lead a
    group of their own in the same session."""
    with open(cwd / "stdout.txt", "w") as out, open(cwd / "stderr.txt", "w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "raysearch.cli", *args],
            cwd=cwd,
            env=subprocess_env(**env),
            start_new_session=True,
            stdout=out,
            stderr=err,
        )


def run_raysearch(
    args: list[str], cwd: Path, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess:
    """``raysearch ARGS`` as a real process (``env`` added to its environment), run to its end;
    its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "raysearch.cli", *args],
        cwd=cwd,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_until(proc: subprocess.Popen, ready: Callable[[], bool], timeout: float = 120) -> None:
    """Wait for ``ready()`` while ``proc`` runs; fail when it ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        if proc.poll() is not None:
            raise AssertionError(f"raysearch ended (status {proc.returncode}) before the fault")
        time.sleep(0.05)
    raise AssertionError("timed out waiting for the search to progress")


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the process group of ``proc`` (the driver and the Ray it started)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def session_processes(sid: int) -> dict[int, str]:
    """The live processes of session ``sid`` (Linux ``/proc``): pid -> command line. The
    session, not the process group: Ray's workers lead groups of their own."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # Fields after the command's closing parenthesis: state, ppid, pgrp, session, ...
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[3]) == sid:
                found[int(entry.name)] = (entry / "cmdline").read_text().replace("\0", " ").strip()
        except (OSError, IndexError, ValueError):  # ended while we looked
            continue
    return found


def children(ppid: int) -> dict[int, tuple[str, dict[str, str]]]:
    """The live children of process ``ppid`` (Linux ``/proc``): pid -> (command line,
    environment)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[1]) == ppid:
                command = (entry / "cmdline").read_text().replace("\0", " ").strip()
                pairs = (entry / "environ").read_bytes().split(b"\0")
                env = dict(p.decode(errors="replace").partition("=")[::2] for p in pairs if p)
                found[int(entry.name)] = (command, env)
        except (OSError, IndexError, ValueError):  # ended while we looked
            continue
    return found


def stop_leftovers(proc: subprocess.Popen, timeout: float = 60) -> None:
    """Make sure nothing of ``proc``'s session outlives the call: its group is killed, then
    whatever else of the session is alive (Ray's workers: a killed driver leaves its trials'
    actors running until they notice that their raylet is gone, and one of them may still
    write a model into the output folder), and the call waits until they have ended."""
    kill_group(proc, signal.SIGKILL)
    proc.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while left := session_processes(proc.pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"still alive after SIGKILL: {left}")
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def interrupt_after(
    args: list[str], cwd: Path, out: Path, trials: int, sig: int, wait_s: float = 120
) -> int:
    """``raysearch ARGS`` (:func:`start_raysearch`) sent ``sig`` (its process group) once the
    journal in ``out`` holds ``trials`` trials, waited for up to ``wait_s``; its exit status.
    Nothing of its session outlives the call."""
    proc = start_raysearch(args, cwd)
    try:
        wait_until(proc, lambda: len(journal(out)) >= trials, timeout=wait_s)
        kill_group(proc, sig)
        return proc.wait(timeout=120)
    finally:
        stop_leftovers(proc)


def run_and_find_leftovers(
    args: list[str], cwd: Path, timeout: float = 300, grace_s: float = 10, **env: str
) -> tuple[int, dict[int, str]]:
    """``raysearch ARGS`` (:func:`start_raysearch`) run to its end: its exit status, and what of
    its session (the Ray it started, workers included) outlives the command after ``grace_s``,
    a grace period for processes that were told to end. Nothing is left once the call
    returns."""
    proc = start_raysearch(args, cwd, **env)
    try:
        status = proc.wait(timeout=timeout)
        deadline = time.monotonic() + grace_s
        while (left := session_processes(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop_leftovers(proc)
    return status, left


def run_with_fault(
    args: list[str],
    cwd: Path,
    ready: Callable[[], bool],
    fault: Callable[[], object],
    *,
    timeout: float = 300,
    **env: str,
) -> int:
    """``raysearch ARGS`` as a real process (:func:`start_raysearch`): once ``ready()``, call
    ``fault()``; the exit status. Nothing of its process group outlives the call."""
    return fault_then_wait(start_raysearch(args, cwd, **env), ready, fault, timeout)


def fault_then_wait(
    proc: subprocess.Popen, ready: Callable[[], bool], fault: Callable[[], object], timeout: float
) -> int:
    """Once ``ready()``, call ``fault()``; ``proc``'s exit status. Nothing of its session
    outlives the call."""
    try:
        wait_until(proc, ready, timeout=timeout)
        fault()
        return proc.wait(timeout=timeout)
    finally:
        stop_leftovers(proc)
