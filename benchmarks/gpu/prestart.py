"""What Ray's prestarted workers cost a search on a many-core machine: the embedded demo (16
trials, ``gpu_per_trial: 0.25``) on the search's own Ray, once with Ray's default (one idle
worker per CPU prestarted when the driver registers) and once with raysearch's setting
(``OWN_RAY_SYSTEM_CONFIG``: none), alternating, each in a fresh process
(``PRESTART_GPU_PER_TRIAL=0 PRESTART_TRIALS=4``: the same on a CPU). Printed per run: the
search's wall time, and sampled while it ran, the most Python workers at once, how many of them
never left ``ray::IDLE``, and the most resident memory all workers held together.

Run from the repository root on the lent GPU machine (``benchmarks/gpu/README.md``)::

    python3 benchmarks/gpu/prestart.py > $OUT/prestart.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

#: One run, in a child process: ``default`` (Ray's prestart) or ``raysearch`` (none).
_RUN = """
import json, os, sys, tempfile, threading, time
sys.path.insert(0, os.getcwd())
from raysearch import AutoSearch, load_config
from raysearch.search.runtime import cluster
if sys.argv[1] == "default":
    cluster.OWN_RAY_SYSTEM_CONFIG = {}

def workers():
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            title = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\\0")[0].decode()
            rss = int(open(f"/proc/{entry}/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
        agent = title.endswith("Agent")
        if (title.startswith("ray::") and not agent) or "default_worker.py" in title:
            found[int(entry)] = (title, rss)
    return found

seen, peak = {}, {"workers": 0, "rss": 0}
done = threading.Event()
def watch():
    while not done.wait(0.2):
        now = workers()
        peak["workers"] = max(peak["workers"], len(now))
        peak["rss"] = max(peak["rss"], sum(rss for _, rss in now.values()))
        for pid, (title, _) in now.items():
            seen.setdefault(pid, set()).add(title.split()[0])
threading.Thread(target=watch, daemon=True).start()
started = time.monotonic()
share = os.environ.get("PRESTART_GPU_PER_TRIAL", "0.25")
trials = os.environ.get("PRESTART_TRIALS", "16")
config = load_config("configs/quickstart.yaml", [f"resources.gpu_per_trial={share}",
    f"stop.iteration_limit={trials}",
    f"output_dir={tempfile.gettempdir()}/prestart-{sys.argv[1]}-{sys.argv[2]}"])
result = AutoSearch(config).run()
wall = time.monotonic() - started
done.set()
idle = sum(titles == {"ray::IDLE"} for titles in seen.values())
print(json.dumps({"setting": sys.argv[1], "trials": len(result.records),
    "search_s": round(wall, 1), "most_workers": peak["workers"], "never_left_idle": idle,
    "most_workers_rss_mb": round(peak["rss"] / 2**20)}))
"""


def main() -> None:
    rows = []
    for repeat in range(2):
        for setting in ("default", "raysearch"):
            proc = subprocess.run(
                [sys.executable, "-c", _RUN, setting, str(repeat)],
                capture_output=True,
                text=True,
                timeout=400,
            )
            line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
            row = json.loads(line) if line.startswith("{") else {"error": proc.stderr[-1500:]}
            rows.append({"repeat": repeat, **row})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"cpus": os.cpu_count(), "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
