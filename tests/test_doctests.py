"""Every docstring example of the package runs and prints what it shows; examples that need
files, a cluster or a model are marked ``# doctest: +SKIP`` in place. Run with :mod:`doctest`
itself rather than ``--doctest-modules``, which would report each module whose examples are all
marked as a skipped test."""

from __future__ import annotations

import doctest
import importlib
import io
import pkgutil

import pytest

import raysearch

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(raysearch.__path__, "raysearch.")
    if not info.name.startswith("raysearch.configs")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS, verbose=False)
    report = io.StringIO()
    for test in doctest.DocTestFinder().find(module):
        runner.run(test, out=report.write)
    assert runner.failures == 0, report.getvalue()


def test_the_examples_are_found():
    """A broken discovery would pass vacuously: the package has dozens of runnable examples."""
    attempted = 0
    for name in MODULES:
        module = importlib.import_module(name)
        attempted += doctest.testmod(module, report=False).attempted
    assert attempted >= 50
