"""Where a command's CPU goes, by kind of process: every process on the machine sampled from
``/proc`` twice a second while the command runs (Ray's processes escape the command's own
accounting: ``/usr/bin/time`` counts only the children it waits for), each process's CPU
summed under the first kind its command line names (a Ray worker, the GCS, the raylet, Ray's
agents and monitors, pytest's workers, a ``raysearch`` command, a benchmark, ...).

A process shorter than the sampling interval is missed, and one that ends loses its last
interval: the table is a lower bound, close to the machine's own figure (printed beside it)
for a command of many minutes such as the test suite.

Usage::

    python benchmarks/suite_cpu.py -- .venv/bin/python -m pytest -n 2 --dist loadfile

Prints the table (CPU-seconds, processes, kind) and the 20 processes that took most.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections import Counter
from pathlib import Path

#: Kinds of process, by a piece of the command line; the first that matches names it.
KINDS = (
    ("ray worker (actor or task)", ("setup_worker.py", "default_worker.py", "ray::")),
    ("ray gcs_server", ("gcs_server",)),
    ("ray raylet", ("raylet/raylet",)),
    ("ray dashboard", ("dashboard/dashboard.py",)),
    ("ray dashboard agent", ("dashboard/agent.py",)),
    ("ray runtime-env agent", ("runtime_env/agent",)),
    ("ray log monitor", ("log_monitor.py",)),
    ("ray autoscaler monitor", ("autoscaler/_private/monitor.py",)),
    ("ray start", ("bin/ray start",)),
    ("pytest-xdist worker", ("exec(eval(sys.stdin.readline()))",)),
    ("raysearch command", ("-m raysearch", "bin/raysearch")),
    ("benchmark script", ("benchmarks/",)),
    ("pytest", ("pytest",)),
    ("chromium", ("chromium",)),
)
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _machine_busy_s() -> float:
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / _TICK


def kind(command: str) -> str:
    """The kind of process ``command`` (a command line) names.

    Example:
        >>> kind("/usr/bin/python -m raysearch run config.yaml")
        'raysearch command'
    """
    for name, pieces in KINDS:
        if any(piece in command for piece in pieces):
            return name
    return "other: " + (command.split(" ", 1)[0].rsplit("/", 1)[-1] or "?")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    seen: dict[int, list] = {}  # pid -> [command line, CPU at first sight, CPU at last sight]
    before = {int(p): _cpu_s(int(p)) for p in os.listdir("/proc") if p.isdigit()}
    busy, started = _machine_busy_s(), time.monotonic()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            pid = int(entry)
            cpu = _cpu_s(pid)
            if cpu is None:
                continue
            if pid not in seen:
                seen[pid] = [_command(pid), before.get(pid) or 0.0, cpu]
            seen[pid][2] = cpu
            if not seen[pid][0]:
                seen[pid][0] = _command(pid)
        time.sleep(args.interval)
    busy, wall = _machine_busy_s() - busy, time.monotonic() - started
    per_kind, count = Counter(), Counter()
    for line, first, last in seen.values():
        name = kind(line)
        per_kind[name] += last - first
        count[name] += 1
    print(f"exit status {proc.returncode}, wall {wall:.1f} s, machine busy {busy:.1f} CPU-s,")
    print(f"sampled {sum(per_kind.values()):.1f} CPU-s in {len(seen)} processes")
    for name, cpu in per_kind.most_common():
        if cpu >= 0.05:
            print(f"{cpu:9.1f} {count[name]:6d}  {name}")
    print("the processes that took most:")
    top = sorted(seen.items(), key=lambda item: item[1][1] - item[1][2])[:20]
    for pid, (line, first, last) in top:
        print(f"{last - first:9.1f} {pid:8d}  {line[:110]}")
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
