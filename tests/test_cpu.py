"""The CPU's flags as ONNX Runtime's integer kernels see them, and the one-line warning a
search gives where uint8 x int8 products saturate."""

from __future__ import annotations

import logging
import platform

import pytest
from numpy._core._multiarray_umath import __cpu_features__

import raysearch.cpu
from raysearch.cpu import cpu_flags, cpu_info, u8s8_saturates
from raysearch.search.preflight import may_saturate, warn_if_u8s8_saturates
from raysearch.space import SearchSpace


def test_flags_are_what_the_cpuid_instruction_says():
    flags = cpu_flags()
    assert list(flags) == sorted(flags)
    for name in ("AVX2", "AVX512VNNI", "ASIMD"):
        assert (name in flags) == bool(__cpu_features__.get(name))
    info = cpu_info()
    assert info["flags"] == list(flags) and info["arch"] == platform.machine()
    assert info["u8s8_saturates"] == u8s8_saturates()


def test_saturation_is_x86_without_vnni():
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    vnni = bool(__cpu_features__.get("AVX512VNNI")) or "AVX_VNNI" in cpu_flags()
    assert u8s8_saturates() == (x86 and not vnni)


@pytest.mark.parametrize(
    "space, saturating",
    [
        ({"calibrate_method": ["MinMax"]}, True),  # ONNX Runtime's defaults: QInt8 x QInt8
        ({"activation_type": ["QUInt8"], "weight_type": ["QInt8"]}, True),
        ({"activation_type": ["QUInt8"], "reduce_range": [True]}, False),
        ({"activation_type": ["QUInt8"], "reduce_range": [True, False]}, True),
        ({"activation_type": ["QUInt8"], "weight_type": ["QUInt8"]}, False),
        ({"activation_type": ["QInt16"], "weight_type": ["QInt8"]}, False),
    ],
)
def test_which_spaces_can_select_a_saturating_setting(space, saturating):
    assert may_saturate(SearchSpace.parse(space)) is saturating


def test_the_warning_is_one_line_and_only_where_it_bites(monkeypatch, caplog):
    space = SearchSpace.parse({"activation_type": ["QUInt8"]})
    safe = SearchSpace.parse({"activation_type": ["QUInt8"], "reduce_range": [True]})
    logger = "raysearch.search.preflight"
    # The CPU itself cannot be changed in a test: its answer is.
    for saturates in (True, False):
        monkeypatch.setattr(raysearch.cpu, "u8s8_saturates", lambda s=saturates: s)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=logger):
            assert warn_if_u8s8_saturates([safe]) is False
            assert warn_if_u8s8_saturates([safe, space]) is saturates
        lines = [r.getMessage() for r in caplog.records if r.name == logger]
        assert len(lines) == (1 if saturates else 0)
        assert all("\n" not in line and "reduce_range" in line for line in lines)
