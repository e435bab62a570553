"""The peak memory of this process and of every process it started (a local Ray's trial
actors among them), for the tests and benchmarks that bound a search's memory.

A process's peak is its ``VmHWM`` (``/proc/<pid>/status``: the kernel's high-water mark of
its resident set), so a sample every ``period_s`` misses no peak of a process alive at one
sample. Linux only.

Example:
    >>> with PeakMemory() as memory:                           # doctest: +SKIP
    ...     AutoSearch(config).run()
    >>> memory.of("Trainable")                                  # doctest: +SKIP
    [925696000, 912261120]
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["PeakMemory", "descendants", "high_water_mark"]


def descendants(pid: int) -> list[int]:
    """``pid``'s child processes, recursively (``/proc/<pid>/task/*/children``)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.append(child)
                    todo.append(child)
    return found


def high_water_mark(pid: int) -> int | None:
    """``VmHWM`` of ``pid`` in bytes (None when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class PeakMemory(threading.Thread):
    """While running (a context manager), the peak resident set of this process and each
    process it started, with each one's name (a Ray worker's is its actor's: ``ray::...``)."""

    def __init__(self, period_s: float = 0.2) -> None:
        super().__init__(daemon=True, name="peak-memory")
        self.period_s = period_s
        self.peaks: dict[int, int] = {}
        self.names: dict[int, str] = {}
        self._halt = threading.Event()

    def sample(self) -> None:
        for pid in [os.getpid(), *descendants(os.getpid())]:
            peak = high_water_mark(pid)
            if peak is None:
                continue
            self.peaks[pid] = max(self.peaks.get(pid, 0), peak)
            try:
                name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            except OSError:
                continue
            if name.startswith("ray::") or pid not in self.names:
                self.names[pid] = name  # a Ray worker's name once it runs an actor

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.period_s)

    def __enter__(self) -> PeakMemory:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        self.join()
        self.sample()

    def of(self, name_part: str) -> list[int]:
        """The peaks of the processes whose name holds ``name_part``, largest first."""
        return sorted(
            (b for p, b in self.peaks.items() if name_part in self.names.get(p, "")), reverse=True
        )
