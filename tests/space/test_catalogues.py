"""The space checks keys against catalogues given to it, and a setting declared with a switch
(``OptionSpec.requires``) is stripped while its switch is off."""

from __future__ import annotations

import pickle

import pytest

from raysearch.errors import ConfigError
from raysearch.space import Catalogue, OptionSpec, SearchSpace
from raysearch.space.catalogue import QUANTIZER

LAB = Catalogue(
    "lab",
    {
        "quantizer": QUANTIZER,
        "include_x": OptionSpec("bool", "switch X on"),
        "x_strength": OptionSpec("int", "X's strength", low=1, requires="include_x"),
    },
)


def test_a_setting_is_stripped_while_its_switch_is_off():
    space = SearchSpace.parse(
        {"include_x": [True, False], "x_strength": [1, 2]}, catalogues={"lab": LAB}
    )
    # No quantizer key and no ``ort`` catalogue here: the only catalogue is the backend.
    expansion = space.expand()
    assert expansion.points == [
        {"include_x": True, "x_strength": 1},
        {"include_x": True, "x_strength": 2},
        {"include_x": False},
    ]
    assert expansion.dropped == {"setting_without_its_switch": 1}
    # Ray Tune pickles the searcher and so the space with its rules.
    again = pickle.loads(pickle.dumps(space))
    assert again.canonical({"include_x": False, "x_strength": 2})[0] == {"include_x": False}


def test_only_the_given_catalogues_validate():
    with pytest.raises(ConfigError, match=r"search_space.per_channel: unknown key"):
        SearchSpace.parse({"quantizer": "lab", "per_channel": [True]}, catalogues={"lab": LAB})


OTHER = Catalogue(
    "other",
    {"quantizer": QUANTIZER, "strength": OptionSpec("int", "how strong", low=1)},
    aliases={"": {"level": "strength"}},
)
LAB_ALIASED = Catalogue("lab", dict(LAB.settings), aliases={"": {"level": "include_x"}})


@pytest.mark.parametrize(
    "raw, catalogues, message",
    [
        (
            {"quantizer": {"type": "int", "low": 1, "high": 2}},
            {"lab": LAB},
            "search_space.quantizer: expected a list of backend names",
        ),
        (
            {"pair": {"joint": ["include_x", "include_x"], "choices": [[True, True]]}},
            {"lab": LAB},
            "search_space.pair.joint: names a setting twice: include_x, include_x",
        ),
        (
            {"quantizer": ["lab", "other"], "level": [1]},
            {"lab": LAB_ALIASED, "other": OTHER},
            "search_space.level: 'level' means include_x, strength to different backends",
        ),
        (
            {"include_x": [True]},
            {"lab": LAB, "other": OTHER},
            "quantizer: is required: the default backend 'ort' has no catalogue here "
            "(known: lab, other)",
        ),
    ],
    ids=["quantizer range", "joint twice", "alias of two meanings", "no default backend"],
)
def test_bad_spaces_against_given_catalogues_name_the_problem(raw, catalogues, message):
    with pytest.raises(ConfigError) as info:
        SearchSpace.parse(raw, catalogues=catalogues)
    assert str(info.value) == message
