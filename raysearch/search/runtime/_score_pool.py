"""Score many settings of one trial at once (``TrialRunner.score_settings``, the precise
sensitivity ranking): :class:`ScorePool` puts them on a :class:`WorkBoard` (a small actor that,
unlike ``ray.util.queue``, records who took what) and starts helper tasks on the trial's node
with its resources; the trial's actor takes settings too (helpers start only on free CPUs),
and scores those a helper that died took.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

__all__ = ["ScorePool"]

_logger = logging.getLogger(__name__)

#: Helper processes keep the engine of the search they last helped (one: bounded memory).
_ENGINES: dict[str, Any] = {}


@ray.remote(num_cpus=0)
class WorkBoard:
    """The settings to score, who took which and what came back."""

    def __init__(self, count: int) -> None:
        self._free = list(range(count))
        self._taken: dict[int, str] = {}
        self.scores: dict[int, float | None] = {}

    def take(self, worker: str) -> int | None:
        """The next setting's index for ``worker``; None when none is left."""
        if not self._free:
            return None
        index = self._free.pop(0)
        self._taken[index] = worker
        return index

    def give(self, index: int, score: float | None) -> None:
        self.scores[index] = score
        self._taken.pop(index, None)

    def state(self) -> tuple[dict[int, float | None], dict[int, str]]:
        """What came back, and what is taken and not yet back (index -> worker)."""
        return self.scores, self._taken


def _engine(factory_ref: ray.ObjectRef, threads: int) -> Any:
    key = factory_ref.hex()
    if key not in _ENGINES:
        _ENGINES.clear()
        factory = ray.get(factory_ref)
        gpu_ids = ray.get_gpu_ids()
        _ENGINES[key] = factory(threads=threads, gpu_id=gpu_ids[0] if gpu_ids else None)
    return _ENGINES[key]


@ray.remote(max_retries=0)
def _help(
    boxed_factory: list[ray.ObjectRef],
    threads: int,
    float_path: str,
    settings_list: Sequence[Mapping[str, Any]],
    board: Any,
    worker: str,
) -> int:
    """Score settings from ``board`` until none is left; how many this helper scored."""
    done = 0
    while (index := ray.get(board.take.remote(worker))) is not None:
        engine = _engine(boxed_factory[0], threads)
        score = engine.score_here(float_path, [settings_list[index]])[0]
        ray.get(board.give.remote(index, score))
        done += 1
    return done


class ScorePool:
    """``pool(runner, float_path, settings_list)``: the scores of ``settings_list`` in order, by
    ``runner`` (the trial's engine) and up to ``helpers`` tasks building theirs from
    ``factory_ref``; ``last_helped``: how many the helpers scored in the latest call."""

    def __init__(
        self,
        factory_ref: ray.ObjectRef,
        *,
        threads: int = 1,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        helpers: int = 15,
    ) -> None:
        self._factory = [factory_ref]  # boxed: a task argument Ray must not resolve
        self._threads = threads
        self._resources = {"num_cpus": num_cpus, "num_gpus": num_gpus}
        self._helpers = helpers
        self.last_helped = 0

    def __call__(
        self, runner: Any, float_path: str, settings_list: Sequence[Mapping[str, Any]]
    ) -> list[float | None]:
        work = _Work(runner, float_path, [dict(s) for s in settings_list])
        node = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        work.board = WorkBoard.options(scheduling_strategy=node).remote(len(work.settings))
        settings_ref = ray.put(work.settings)
        helpers = {
            _help.options(scheduling_strategy=node, **self._resources).remote(
                self._factory, self._threads, float_path, settings_ref, work.board, name
            ): name
            for name in (f"helper-{i}" for i in range(min(self._helpers, len(work.settings) - 1)))
        }
        try:
            scores = work.run(helpers)
        finally:
            for ref in helpers:  # those not started yet: nothing is left for them
                ray.cancel(ref)
            ray.kill(work.board)
        self.last_helped = len(scores) - work.scored_here
        return [scores[i] for i in range(len(work.settings))]


@dataclass
class _Work:
    """One call of a :class:`ScorePool`, seen from the calling process."""

    runner: Any
    float_path: str
    settings: list[dict[str, Any]]
    board: Any = None
    scored_here: int = 0

    def run(self, helpers: Mapping[ray.ObjectRef, str]) -> dict[int, float | None]:
        while (index := ray.get(self.board.take.remote("trial"))) is not None:
            self._score(index)
        pending = list(helpers)
        dead: set[str] = set()
        while True:
            scores, taken = ray.get(self.board.state.remote())
            if len(scores) == len(self.settings):
                return scores
            # Held by a helper that died, or by anyone once every helper has ended.
            orphans = [i for i, worker in taken.items() if worker in dead or not pending]
            for index in orphans:
                self._score(index)
            if orphans or not pending:
                continue
            finished, pending = ray.wait(pending, num_returns=1, timeout=0.2)
            for ref in finished:
                try:
                    ray.get(ref)
                except Exception as exc:
                    _logger.info("a sensitivity helper failed: %s", exc)
                    dead.add(helpers[ref])

    def _score(self, index: int) -> None:
        score = self.runner.score_here(self.float_path, [self.settings[index]])[0]
        ray.get(self.board.give.remote(index, score))
        self.scored_here += 1
