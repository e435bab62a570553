"""Fixtures shared by the whole suite."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Sensitivity probes kept across searches (raysearch.search.record.probe_cache) would make a
# test's search reuse what an earlier test of the same model measured: what a test runs would
# depend on the tests before it. Off for the suite (and the processes it starts); the cache's
# own tests turn it on in a temporary folder of their own.
os.environ["RAYSEARCH_PROBE_CACHE"] = "0"


@contextlib.contextmanager
def _signals_seen() -> Iterator[bytearray]:
    """The numbers of the signals this process gets inside the block, whichever Python
    handler takes them (Python writes each one to its wakeup file descriptor first)."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    seen = bytearray()
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    try:
        yield seen
    finally:
        signal.set_wakeup_fd(previous)
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(read, 4096):
                seen += chunk
        os.close(read)
        os.close(write)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Ctrl-C stops the test run, also during a search in this process. Ray Tune's run puts
    a SIGINT handler of its own in place (the first Ctrl-C ends the Tune run gracefully and
    the search returns as interrupted, so the test goes on) and leaves it there after the run
    (a later Ctrl-C ends nothing and puts back the handler of the run before: one more
    Ctrl-C per search run so far). Each test therefore starts with the SIGINT handler the
    run started with, and a SIGINT that a handler other than pytest's took stops the run
    after the test, as pytest stops on its own KeyboardInterrupt (exit status 2)."""
    handler = signal.getsignal(signal.SIGINT)
    with _signals_seen() as seen:
        try:
            result = yield
        finally:
            if signal.getsignal(signal.SIGINT) is not handler:
                signal.signal(signal.SIGINT, handler)
    if signal.SIGINT in seen:
        item.session.shouldstop = "interrupted: Ctrl-C (SIGINT)"
    return result


#: Resources for a search on :func:`ray_cluster` (one CPU) that runs two trials side by side.
TWO_AT_A_TIME = {"max_concurrent_trials": 2, "cpu_per_trial": 0.5}


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray instance shared by every end-to-end test of the session, started as a
    search starts its own; its workers can import ``tests`` (custom evaluators named
    "tests.module:function"). A Ray of the session's own (``address="local"``): without it
    ``ray.init`` joins a Ray that ``ray start`` left running on this machine (another user's,
    or a test's) and refuses ``num_cpus``.

    One CPU: a search on it runs one trial actor (a Ray worker process, some 3 CPU-seconds to
    start) unless it asks for two (``cpu_per_trial: 0.5``), and each pytest-xdist worker has a
    Ray of its own: two trials side by side would only share the machine's two cores with the
    other worker's."""
    import ray

    from raysearch.search.runtime.cluster import OWN_RAY_SYSTEM_CONFIG, _stop_unused_processes

    if not ray.is_initialized():
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        ray.init(
            address="local",
            num_cpus=1,
            include_dashboard=False,
            log_to_driver=False,
            logging_level="WARNING",
            runtime_env={"env_vars": {"PYTHONPATH": path}},
            _system_config=OWN_RAY_SYSTEM_CONFIG,
        )
        _stop_unused_processes()
    yield ray
    ray.shutdown()


#: The test files that take longest, longest first (one worker's seconds, summed from the
#: slowest tests of the two-worker suite on a quiet 2-core machine). They are handed out first
#: so that no long file starts near the end of the run; a file missing here (or measured
#: shorter since) changes only how evenly the two workers end, never what runs.
LONGEST_FILES = (
    "tests/test_benchmarks_smoke.py",
    "tests/scale/test_cluster.py",
    "tests/reliability/test_batch_faults.py",
    "tests/search/test_grid_counts.py",
    "tests/scale/test_hand_started_cluster.py",
    "tests/test_batch.py",
    "tests/search/test_loggers_e2e.py",
    "tests/search/test_staged_strategies.py",
    "tests/reliability/test_resume.py",
    "tests/scale/test_many_trials.py",
    "tests/scale/test_warm_cluster.py",
    "tests/search/test_search_e2e.py",
    "tests/reliability/test_soak.py",
    "tests/search/test_large_decoder.py",
    "tests/test_packaging.py",
)


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist's ``--dist loadfile`` keeps the order of :func:`pytest_collection_modifyitems`
    (by default it hands out the files with the most tests first, which put the long files of
    one or two tests last: one worker ran them while the other had long finished)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest test files run first (:data:`LONGEST_FILES`, then the other files that
    hold slow tests), each file's tests in their order: with the suite's two pytest-xdist
    workers taking a file at a time (``--dist loadfile``), each worker takes the next file
    when it is done with one, the many short files fill the end of the run, and no long file
    taken last keeps one worker busy while the other idles."""
    rank = {REPO / name: index for index, name in enumerate(LONGEST_FILES)}
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (rank.get(item.path, len(rank)), item.path not in slow_files))
