"""The parts of :mod:`raysearch.evaluate`, one concept each; import them from there.

- ``_run``: running a model over the data and timing it,
- ``_reference``: the float model's outputs, computed once and cached,
- ``_evaluator``: scores and the tolerance (:class:`~raysearch.evaluate.Evaluator`).

The metric maths and the one table of built-in metrics are :mod:`raysearch.metrics`.
"""
