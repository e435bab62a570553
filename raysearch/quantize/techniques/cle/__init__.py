"""Cross-layer equalization (``include_cle``): the technique in ``_cle``, the layer pairs in
``_graph``; the registry imports ``_cle`` by name (``technique.BUILTIN_TECHNIQUES``)."""
