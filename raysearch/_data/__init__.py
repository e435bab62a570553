"""The parts of :mod:`raysearch.data`, one concept each; import them from there.

- ``_inputs``: the model's inputs (:class:`~raysearch.data.ModelInput`),
- ``_checks``: data checked against those inputs, and batching,
- ``_files``: ``.npz`` / ``.npy`` files and folders of them,
- ``_parquet``: ``.parquet`` files,
- ``_reader``: draining a ``CalibrationDataReader``.
"""
