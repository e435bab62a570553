"""The parts of :mod:`raysearch.config`, one concept each; import them from there.

- ``_values``: reading one value (numbers, integers, known keys, Quark's key names),
- ``_paths``: input paths (``builtin:`` names included) and the output folder,
- ``_metric``: the metric, its tolerance and direction, the custom evaluator's check,
- ``_algo``: the search algorithm's name,
- ``_sections``: the ``stop`` and ``resources`` sections,
- ``_spaces``: search spaces, predefined ones by name,
- ``_files``: YAML files and ``key=value`` overrides.
"""
