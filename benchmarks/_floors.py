"""What Ray alone and Ray Tune alone take on this machine, each in a new Python process: the
floors ``sequential_vs_raysearch.py`` holds raysearch's fixed cost against."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from _common import CPUS

__all__ = ["ray_floor", "tune_floor"]


_RAY_FLOOR = """
import time, sys
started = float(sys.argv[1])
import ray
ray.init(address="local", num_cpus=%d, include_dashboard=False, log_to_driver=False,
         logging_level=30)
initialised = time.time()
@ray.remote(num_cpus=1)
class Probe:
    def ping(self):
        return time.time()
first_call = ray.get(Probe.remote().ping.remote())
before_shutdown = time.time()
ray.shutdown()
print(initialised - started, first_call - started, time.time() - before_shutdown)
"""


_TUNE_FLOOR = """
import sys, tempfile, time
started = float(sys.argv[1])
import ray
from ray import tune
ray.init(address="local", num_cpus=%d, include_dashboard=False, log_to_driver=False,
         logging_level=30)
class Nothing(tune.Trainable):
    def step(self):
        return {"done": True, "at": time.time()}
    def reset_config(self, new_config):
        return True
with tempfile.TemporaryDirectory() as tmp:
    tuner = tune.Tuner(
        tune.with_resources(Nothing, {"cpu": 1}),
        tune_config=tune.TuneConfig(num_samples=2, reuse_actors=True),
        run_config=tune.RunConfig(storage_path=tmp, verbose=0, log_to_file=False),
    )
    first = min(result.metrics["at"] for result in tuner.fit())
before_shutdown = time.time()
ray.shutdown()
print(first - started, time.time() - before_shutdown)
"""


def _timed_script(script: str, keys: tuple[str, ...], **env: str) -> dict[str, float]:
    """Run ``script`` (``%d`` in it: this machine's CPUs) in a new Python process, given the
    time it was started at; the numbers it prints last, rounded, under ``keys``."""
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-c", script % CPUS, repr(started)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    )
    values = done.stdout.split()[-len(keys) :]
    return {key: round(float(value), 2) for key, value in zip(keys, values)}


def tune_floor() -> dict[str, float]:
    """What Ray Tune alone takes here (see the module docstring): to the first trial's step of
    a Tuner of two no-op trials, from a new process's start, and ``ray.shutdown``."""
    keys = ("to_first_trial_s", "shutdown_s")
    return _timed_script(_TUNE_FLOOR, keys, TUNE_DISABLE_AUTO_CALLBACK_LOGGERS="1")


def ray_floor() -> dict[str, float]:
    """What Ray alone takes here: a new process imports Ray, starts a local Ray, runs one
    actor's first method (``to_first_actor_call_s``, from the process's start) and shuts Ray
    down (``shutdown_s``). raysearch's fixed cost cannot go below it."""
    keys = ("to_ray_initialised_s", "to_first_actor_call_s", "shutdown_s")
    return _timed_script(_RAY_FLOOR, keys)
