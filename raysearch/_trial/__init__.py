"""The parts of :mod:`raysearch.trial`, one concept each; import them from there.

- ``_staged``: a quantized model evaluated rung by rung (:class:`StagedTrial`).
"""
