"""What the score pool's tests ship to helper processes, importable there as
``tests.search.score_pool_fixture`` (a test module itself is imported under another name)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from raysearch.data import DataSource
from raysearch.evaluate import Evaluator
from raysearch.trial import TrialDevice, TrialRunner, TrialSpec
from tests.models import outlier_data

BASE = {"op_types_to_quantize": ["MatMul"], "per_channel": False}
#: One setting per MatMul kept float (what the precise sensitivity ranking scores), with and
#: without per-channel weights.
SETTINGS = [
    {**BASE, "per_channel": per_channel, "nodes_to_exclude": [f"mm{i}"]}
    for i in range(1, 6)
    for per_channel in (False, True)
]


class SlowRunner(TrialRunner):
    """A trial engine whose every score takes ``delay_s`` longer: the tiny model scores in
    milliseconds, a helper process starts in seconds, and the test is about who scores."""

    delay_s = 0.0

    def score_here(self, float_path, settings_list):
        time.sleep(self.delay_s * len(settings_list))
        return super().score_here(float_path, settings_list)


@dataclass
class Factory:
    """An engine factory as the search ships one to its actors (picklable, built anywhere);
    with ``only_in`` set, building it in any other process fails (a helper that dies)."""

    model: str
    cache_dir: str
    only_in: int | None = None
    delay_s: float = 0.0

    def __call__(self, *, threads: int = 1, gpu_id: int | None = None) -> TrialRunner:
        if self.only_in is not None and os.getpid() != self.only_in:
            raise RuntimeError("this helper cannot build its engine")
        calib = DataSource.load(outlier_data(64), self.model, batch_size=16)
        evaluation = DataSource.load(outlier_data(64, seed=9), self.model, batch_size=16)
        runner = SlowRunner(
            TrialSpec(
                self.model,
                calib,
                evaluation,
                Evaluator("cos", 0.999),
                cache_dir=self.cache_dir,
                device=TrialDevice(threads=threads),
                measure_latency=False,
            )
        )
        runner.delay_s = self.delay_s
        return runner
