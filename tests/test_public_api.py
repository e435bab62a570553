"""The public API: what ``raysearch.__all__`` lists, importable from ``raysearch``, documented
with ``Args:``/``Returns:`` as Optuna's and Ray's API is; everything else private by name."""

from __future__ import annotations

import inspect
import types

import raysearch

PUBLIC = [
    "AutoSearch",
    "SearchResult",
    "SearchConfig",
    "SearchSpace",
    "ConfigError",
    "InputError",
    "load_config",
    "register_backend",
    "register_technique",
    "register_strategy",
    "CustomEvaluator",
]


def test_the_public_api_is_listed_in_one_place_and_importable():
    assert raysearch.__all__ == PUBLIC
    for name in PUBLIC:
        assert getattr(raysearch, name) is not None, name
    from raysearch.search import AutoSearch, SearchResult

    assert raysearch.AutoSearch is AutoSearch and raysearch.SearchResult is SearchResult


def test_every_other_name_of_the_package_is_private_or_a_module():
    others = {
        name
        for name, value in vars(raysearch).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    # ``annotations`` (the __future__ import) and TYPE_CHECKING are the language's.
    assert others - {"annotations", "TYPE_CHECKING"} == set(PUBLIC) - {"AutoSearch", "SearchResult"}


def _documented(obj) -> str:
    return inspect.getdoc(obj) or ""


def test_the_public_callables_document_their_arguments_and_returns():
    documented = {
        "AutoSearch": raysearch.AutoSearch,
        "AutoSearch.run": raysearch.AutoSearch.run,
        "AutoSearch.resume": raysearch.AutoSearch.resume,
        "SearchConfig.from_dict": raysearch.SearchConfig.from_dict,
        "load_config": raysearch.load_config,
        "SearchResult.dataframe": raysearch.SearchResult.dataframe,
        "SearchSpace.parse": raysearch.SearchSpace.parse,
        "register_backend": raysearch.register_backend,
        "register_technique": raysearch.register_technique,
        "register_strategy": raysearch.register_strategy,
        "CustomEvaluator": raysearch.CustomEvaluator,
    }
    missing = []
    for name, obj in documented.items():
        doc = _documented(obj)
        # A class documents its constructor's arguments; a callable its arguments (when it
        # takes any) and its result.
        takes = [p for p in inspect.signature(obj).parameters if p not in ("self", "cls")]
        wanted = ["Args:"] if takes or name == "CustomEvaluator" else []
        if not inspect.isclass(obj) or name == "CustomEvaluator":
            wanted.append("Returns:")
        missing += [f"{name}: {w}" for w in wanted if w not in doc]
    assert not missing
    assert "Attributes:" in _documented(raysearch.SearchResult)


def test_a_custom_evaluator_of_the_documented_signature_is_one():
    def evaluate(model_path: str, providers: list[str]) -> float:
        return 0.0

    params = list(inspect.signature(raysearch.CustomEvaluator.__call__).parameters)
    assert params == ["self", *inspect.signature(evaluate).parameters]
    from raysearch.evaluate._custom import takes_providers

    assert takes_providers(evaluate)


def test_the_plugin_api_is_one_public_module_documented():
    """What a backend, technique or strategy written outside raysearch subclasses, calls and
    implements is in ``raysearch.plugins``, each documented; the decorators are those
    ``raysearch`` lists."""
    from raysearch import plugins

    assert all(getattr(plugins, name, None) is not None for name in plugins.__all__)
    for name in ("register_backend", "register_technique", "register_strategy"):
        assert getattr(plugins, name) is getattr(raysearch, name)
    documented = [
        *(
            getattr(plugins, name)
            for name in plugins.__all__
            if name not in ("QUANTIZER", "EXHAUSTED")
        ),
        *(
            getattr(getattr(plugins, cls), method)
            for cls, methods in {
                "QuantizerBackend": (
                    "validate",
                    "quantize",
                    "reject",
                    "reject_on_model",
                    "missing_requirement",
                ),
                "Technique": ("effect_key", "reject", "missing_requirement"),
                "FloatModelTransform": ("transform",),
                "TensorOverrideProducer": ("overrides",),
                "QuantizedModelTransform": ("transform",),
                "TechniqueContext": ("score_each",),
                "Phase": ("start", "propose", "completed"),
                "Proposal": ("of",),
                "StrategyContext": ("best",),
            }.items()
            for method in methods
        ),
    ]
    missing = []
    for obj in documented:
        doc, name = _documented(obj), obj.__qualname__
        if inspect.isclass(obj):
            # A class documents what it is built from (its own constructor's ``Args:``, a
            # dataclass's or a protocol's ``Attributes:``); an inherited constructor is
            # documented where it is defined.
            own = "__init__" in vars(obj) or "__dataclass_fields__" in vars(obj)
            if own and not ({"Args:", "Attributes:"} & set(doc.split())):
                missing.append(f"{name}: Args: or Attributes:")
            wanted = []
        else:
            takes = [p for p in inspect.signature(obj).parameters if p not in ("self", "cls")]
            returns = inspect.signature(obj).return_annotation not in ("None", None)
            wanted = (["Args:"] if takes else []) + (["Returns:"] if returns else [])
        missing += [f"{name}: {w}" for w in wanted if w not in doc]
        missing += [f"{name}: no docstring"] if not doc else []
    assert not missing
