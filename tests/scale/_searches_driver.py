"""Runs searches one after the other in one process of its own, each one a Ray driver of its
own as a ``raysearch run`` command is (it joins the cluster its config or ``RAY_ADDRESS`` names,
or starts a Ray for itself, and is disconnected before the next search), without an
interpreter and its imports per search. Usage:

    python -m tests.scale._searches_driver WORKDIR

``WORKDIR/searches.json`` lists the searches in order: ``{"config": YAML path, "env": {name:
value, or null to unset}}``, each run with those environment variables set from then on (a
changed ``TMPDIR`` is the temp folder of everything after it). ``WORKDIR/driver.json`` maps
each config to ``{}`` for a search that finished, or to ``{"error": traceback}`` for one that
failed (the next searches still run). What each search wrote is in its output folder.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path


def _set_env(env: dict[str, str | None]) -> None:
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if "TMPDIR" in env:
        tempfile.tempdir = None  # read TMPDIR again


def run_search(config: str) -> dict[str, str]:
    """Run the search of ``config`` as ``raysearch run`` does; disconnect from Ray after it."""
    from raysearch import load_config
    from raysearch.search import AutoSearch
    from raysearch.search.runtime.cluster import shutdown_ray

    try:
        AutoSearch(load_config(config)).run()
        return {}
    except Exception:
        text = traceback.format_exc()
        print(text, file=sys.stderr)
        return {"error": text}
    finally:
        shutdown_ray()


if __name__ == "__main__":
    work = Path(sys.argv[1])
    done = {}
    for search in json.loads((work / "searches.json").read_text()):
        _set_env(search.get("env", {}))
        done[search["config"]] = run_search(search["config"])
    (work / "driver.json").write_text(json.dumps(done))
