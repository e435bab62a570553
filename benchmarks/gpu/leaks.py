"""Searches one after another in one process on one Ray, on a GPU workstation: what each leaves
behind. Three searches of the embedded magika demo with four trials sharing the GPU
(``gpu_per_trial: 0.25``), then a fourth stopped by Ray Tune's graceful stop (SIGUSR1, as
Ctrl-C) after its first trial. After each: the actors, placement groups and start-barrier keys
that are new on the cluster (Ray's own tables, the same count as
``tests/search/test_nothing_left_behind.py``), the processes holding GPU memory
(``nvidia-smi``; and the most seen at once during the search), and the mode and owner of this
user's private temporary folder.

Run from the repository root on the lent GPU machine (``benchmarks/gpu/README.md``)::

    python3 benchmarks/gpu/leaks.py /tmp/leaks > $OUT/leaks.json
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from raysearch import AutoSearch, load_config  # noqa: E402
from tests.search.test_nothing_left_behind import (  # noqa: E402
    _held,
    _interrupt_after,
    _left_behind,
)

#: Each trial's share of the GPU; ``LEAKS_GPU_PER_TRIAL=0`` runs the same searches on the CPU.
GPU_PER_TRIAL = float(os.environ.get("LEAKS_GPU_PER_TRIAL", "0.25"))


def _gpu_processes() -> list[dict[str, str]]:
    """Each process holding memory on the GPU, with what its command line says it is."""
    if not GPU_PER_TRIAL:
        return []
    rows = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()
    found = []
    for row in filter(None, rows):
        pid, used = (part.strip() for part in row.split(",", 1))
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:80].decode()
        except OSError:
            title = "(not visible from this process)"
        mine = pid == str(os.getpid())
        found.append({"pid": pid, "used": used, "is_this_process": mine, "title": title})
    return found


class _GpuWatch:
    """The most processes seen holding GPU memory at once while a search runs (sampled every
    0.5 s): shows that ``nvidia-smi`` sees the trials' processes here, so an empty list after
    the search means they let go."""

    def __init__(self) -> None:
        self.most = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(0.5):
            self.most = max(self.most, len(_gpu_processes()))

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.most


def _config(out: Path):
    return load_config(
        Path("configs/quickstart.yaml"),
        [
            f"resources.gpu_per_trial={GPU_PER_TRIAL}",
            "stop.iteration_limit=8",
            f"output_dir={out}",
        ],
    )


def main(root: Path) -> None:
    ray.init(num_cpus=8, num_gpus=1 if GPU_PER_TRIAL else 0, include_dashboard=False)
    before = _held()
    report = []
    for run in range(4):
        out = root / f"search{run}"
        interrupt = run == 3
        started = time.monotonic()
        if interrupt:
            previous = signal.getsignal(signal.SIGUSR1)
            watcher = _interrupt_after(out, 1)
        watch = _GpuWatch()
        try:
            result = AutoSearch(_config(out)).run()
        finally:
            most_on_gpu = watch.stop()
            if interrupt:
                watcher.join()
                signal.signal(signal.SIGUSR1, previous)
        devices = sorted({str(r.get("device")) for r in result.records if isinstance(r, dict)})
        report.append(
            {
                "search": run + 1,
                "interrupted": interrupt,
                "stop_reason": result.summary.get("stop_reason"),
                "trials": len(result.records),
                "seconds": round(time.monotonic() - started, 1),
                "devices": devices,
                "most_gpu_processes_during": most_on_gpu,
                "left_behind": _left_behind(before),
                "gpu_processes": _gpu_processes(),
            }
        )
        print(json.dumps(report[-1]), file=sys.stderr, flush=True)
    mine = Path(tempfile.gettempdir()) / f"raysearch-{os.getuid()}"
    info = mine.stat() if mine.exists() else None
    print(
        json.dumps(
            {
                "searches": report,
                "private_tmp": {
                    "path": str(mine),
                    "mode": oct(info.st_mode & 0o777) if info else None,
                    "owner_uid": info.st_uid if info else None,
                    "contents": sorted(p.name for p in mine.iterdir()) if info else [],
                },
            },
            indent=1,
        )
    )
    ray.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.gettempdir()) / "leaks")
