"""raysearch.config.builtin_paths: the table of ``builtin:`` names the config stage resolves."""

from __future__ import annotations

import pytest

from raysearch.config import SearchConfig
from raysearch.config.builtin_paths import BUILTIN_NAMES, is_builtin, resolve_builtin
from raysearch.demo import MAGIKA_DIR
from raysearch.errors import ConfigError


def test_the_magika_names_resolve_to_the_demos_files():
    assert (
        resolve_builtin("builtin:magika") == resolve_builtin("magika") == MAGIKA_DIR / "model.onnx"
    )


def test_names_and_unknown_names():
    assert BUILTIN_NAMES == ("builtin:magika", "builtin:magika-calib", "builtin:magika-eval")
    assert is_builtin("builtin:x") and not is_builtin("model.onnx") and not is_builtin(3)
    with pytest.raises(KeyError):
        resolve_builtin("builtin:magikaa")


def test_the_config_lists_every_builtin_name_in_its_error():
    with pytest.raises(ConfigError) as info:
        SearchConfig.from_dict(
            {
                "model": "builtin:magikaa",
                "calibration_data": "c.npz",
                "search_space": "A8W8_SEARCH",
            },
            check_paths=False,
        )
    assert str(info.value) == (
        "model: unknown built-in 'builtin:magikaa'; known: builtin:magika, builtin:magika-calib, "
        "builtin:magika-eval"
    )
