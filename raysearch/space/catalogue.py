"""Settings catalogues: the keys each backend understands (types, values, aliases, and which
change calibration: the cache key's one source), registered by the backend's module.

Example:
    >>> toy = Catalogue("toy", {"quantizer": QUANTIZER, "bits": OptionSpec("int", "bits", low=2)})
    >>> toy.check("", "bits", 1)
    'expected a value >= 2, got 1'
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "OptionSpec",
    "Catalogue",
    "QUANTIZER",
    "DEFAULT_BACKEND",
    "check_value",
    "UNAVAILABLE",
    "unavailable_reason",
    "register_catalogue",
    "register_shared_settings",
    "get_catalogue",
    "registered_catalogues",
]

#: The backend a point without a ``quantizer`` key uses.
DEFAULT_BACKEND = "ort"


@dataclass(frozen=True)
class OptionSpec:
    """One setting of a catalogue.

    Attributes:
        kind: ``enum``, ``bool``, ``int``, ``float``, ``str``, ``str_list``, ``num_list``,
            ``dict`` (a group of settings) or ``mapping`` (a mapping value).
        doc: what the setting does, in a few words (``raysearch spaces`` shows it).
        choices: an enum's values; low, high: a number's bounds (None: none).
        nullable: whether None is a value.
        affects_calibration: whether it changes the calibration (the cache's key).
        requires: a switch key (``include_cle``) without which it is stripped.
    """

    kind: str
    doc: str
    choices: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    nullable: bool = False
    affects_calibration: bool = False
    requires: str | None = None


#: The key that selects a backend; every catalogue has it.
QUANTIZER = OptionSpec("str", "quantizer backend registry key (default: ort)")


@dataclass(frozen=True)
class Catalogue:
    """The settings of one backend (``QuantizerBackend.catalogue``).

    Attributes:
        backend: the backend's name (``register_backend`` sets it).
        settings: top-level name -> :class:`OptionSpec` (``"quantizer": QUANTIZER`` selects it).
        containers: a key holding further settings (``extra_options``) -> their specs.
        aliases: per container (``""``: the top level), spelling -> canonical name.

    Example:
        >>> mine = Catalogue("mine", {"quantizer": QUANTIZER, "bits": OptionSpec("int", "bits")})
        >>> mine.check("", "bits", 4) is None, mine.check("", "rounding", "up")
        (True, "not a setting of backend 'mine'")
    """

    backend: str
    settings: Mapping[str, OptionSpec]
    containers: Mapping[str, Mapping[str, OptionSpec]] = field(default_factory=dict)
    aliases: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def table(self, container: str) -> Mapping[str, OptionSpec]:
        """The settings directly inside ``container`` (``""``: the top level)."""
        return self.containers.get(container, {}) if container else self.settings

    def canonical(self, container: str, key: str) -> str:
        """The canonical name of ``key`` inside ``container``."""
        return self.aliases.get(container, {}).get(key, key)

    def spec(self, container: str, name: str) -> OptionSpec | None:
        """The spec of ``name`` (canonical) inside ``container``, or None when unknown."""
        return self.table(container).get(name)

    def is_container(self, key: str) -> bool:
        return key in self.containers

    def check(self, container: str, name: str, value: Any) -> str | None:
        """Why ``value`` is not valid for ``name``, or None; an unknown name is a problem too."""
        spec = self.spec(container, name)
        if spec is None:
            return f"not a setting of backend '{self.backend}'"
        return check_value(spec, value)

    def calibration_keys(self) -> Iterator[tuple[str, str]]:
        """``(container, name)`` of every setting that changes calibration (the cache's key)."""
        for name, spec in self.settings.items():
            if spec.affects_calibration:
                yield "", name
        for container, table in self.containers.items():
            for name, spec in table.items():
                if spec.affects_calibration:
                    yield container, name

    def extended(self, other: Catalogue) -> Catalogue:
        """This catalogue with the settings of ``other`` added (a technique's settings)."""
        containers = {k: dict(v) for k, v in self.containers.items()}
        for name, table in other.containers.items():
            containers.setdefault(name, {}).update(table)
        aliases = {k: dict(v) for k, v in self.aliases.items()}
        for name, table in other.aliases.items():
            aliases.setdefault(name, {}).update(table)
        return Catalogue(self.backend, {**self.settings, **other.settings}, containers, aliases)


def check_value(spec: OptionSpec, value: Any) -> str | None:
    """Return why ``value`` is not valid for ``spec``, or None when it is.

    Example:
        >>> check_value(OptionSpec("enum", "format", ("QDQ", "QOperator")), "QDQ") is None
        True
    """
    if value is None:
        return None if spec.nullable else "null is not allowed here"
    kind = spec.kind
    if kind == "enum":
        if value not in spec.choices:
            return f"expected one of {', '.join(map(str, spec.choices))}, got {value!r}"
        return None
    if kind in ("int", "float"):
        return _check_number(spec, value)
    checks = {
        "bool": (lambda v: isinstance(v, bool), "true or false"),
        "str": (lambda v: isinstance(v, str), "a string"),
        "dict": (lambda v: isinstance(v, dict), "a mapping"),
        "mapping": (lambda v: isinstance(v, dict), "a mapping"),
        "num_list": (
            lambda v: (
                isinstance(v, list)
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
            ),
            "a list of numbers",
        ),
        "str_list": (
            lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
            "a list of names",
        ),
    }
    if kind not in checks:
        raise AssertionError(f"unknown option kind {kind}")
    ok, expected = checks[kind]
    return None if ok(value) else f"expected {expected}, got {value!r}"


def _check_number(spec: OptionSpec, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected a number, got {value!r}"
    if spec.kind == "int" and not float(value).is_integer():
        return f"expected an integer, got {value!r}"
    if spec.low is not None and value < spec.low:
        return f"expected a value >= {spec.low}, got {value!r}"
    if spec.high is not None and value > spec.high:
        return f"expected a value <= {spec.high}, got {value!r}"
    return None


_CATALOGUES: dict[str, Catalogue] = {}
#: Settings every backend takes that are not its own (a technique's), by owner.
_SHARED: dict[str, Catalogue] = {}


def register_catalogue(catalogue: Catalogue) -> Catalogue:
    """Make ``catalogue`` its backend's (replacing an earlier one, for a re-imported module)."""
    _CATALOGUES[catalogue.backend] = catalogue
    return catalogue


def register_shared_settings(
    owner: str,
    settings: Mapping[str, OptionSpec],
    *,
    containers: Mapping[str, Mapping[str, OptionSpec]] | None = None,
) -> None:
    """Add ``owner``'s (a technique's) settings to every backend's catalogue."""
    _SHARED[owner] = Catalogue(owner, dict(settings), dict(containers or {}))


def get_catalogue(backend: str | None, *, shared: bool = True) -> Catalogue | None:
    """The catalogue of ``backend`` with the shared settings (``shared=False``: without) or None."""
    name = backend or DEFAULT_BACKEND
    catalogue = _CATALOGUES.get(name)
    if catalogue is None or not shared:
        return catalogue
    for fragment in _SHARED.values():
        catalogue = catalogue.extended(fragment)
    return catalogue


def registered_catalogues() -> dict[str, Catalogue]:
    """Every registered backend's catalogue (shared settings included) by backend name."""
    return {name: get_catalogue(name) for name in _CATALOGUES}  # type: ignore[misc]


_FINETUNE = (
    "not a raysearch setting; fine-tuning is include_fast_ft: true with extra_options "
    "OptimAlgorithm (adaround, adaquant), NumIterations, LearningRate or NumIterLR, BatchSize, "
    "DataSize, OptimDevice, FixedSeed"
)

#: Spellings of techniques that raysearch refuses (other tools' names), with why and what to
#: write instead; a catalogue that knows one of these names takes precedence.
UNAVAILABLE: dict[str, str] = {
    **dict.fromkeys(("algorithm", "finetune", "num_iterations", "learning_rate"), _FINETUNE),
    "InferDevice": "not a raysearch setting; fine-tuning infers on the trial's device "
    "(extra_options.OptimDevice chooses where it optimises)",
    **dict.fromkeys(
        ("SmoothQuant", "SmoothQuantAlpha"),
        "ONNX Runtime's SmoothQuant needs neural-compressor 2.x, which raysearch does not "
        "install; raysearch's own is include_sq: true with extra_options.SmoothAlpha",
    ),
    "include_auto_mp": "not a raysearch setting; raysearch's mixed precision is the "
    "mixed_precision group (top_k, promote_to, rank_by)",
}


def unavailable_reason(key: str, catalogues: Iterable[Catalogue] = ()) -> str | None:
    """Why ``key`` names a technique raysearch refuses for now, or None.

    Example:
        >>> unavailable_reason("per_channel") is None
        True
    """
    reason = UNAVAILABLE.get(key)
    if reason is None:
        return None
    for catalogue in catalogues:
        if key in catalogue.settings or any(key in t for t in catalogue.containers.values()):
            return None
    return reason
