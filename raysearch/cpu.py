"""What the CPU offers ONNX Runtime's integer kernels: without VNNI, x86-64 saturates uint8 x
int8 sums, so scores differ by CPU; the flags are recorded with every search.

Example:
    >>> sorted(cpu_info())
    ['arch', 'flags', 'model', 'u8s8_saturates']
"""

from __future__ import annotations

import functools
import platform
from typing import Any

__all__ = ["cpu_flags", "cpu_info", "u8s8_saturates"]

#: The flags that decide ONNX Runtime's integer kernels, as NumPy names them.
_RELEVANT = (
    "SSE41", "AVX", "AVX2", "FMA3", "AVX512F", "AVX512BW", "AVX512VL", "AVX512VNNI",
    "AVX512_CLX", "AVX512BF16", "ASIMD", "ASIMDDP",
)  # fmt: skip
_X86 = {"x86_64", "amd64", "i386", "i686", "x86"}


@functools.cache
def _proc_cpuinfo() -> tuple[str, frozenset[str]]:
    """The CPU's model name and flags as Linux lists them (empty elsewhere), read once."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return "", frozenset()
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return model, frozenset(flags)


@functools.cache
def cpu_flags() -> tuple[str, ...]:
    """The CPU features that decide ONNX Runtime's integer kernels, sorted."""
    from numpy._core._multiarray_umath import __cpu_features__  # NumPy's CPUID reading

    found = {name for name in _RELEVANT if __cpu_features__.get(name)}
    if "avx_vnni" in _proc_cpuinfo()[1]:
        found.add("AVX_VNNI")
    return tuple(sorted(found))


def u8s8_saturates() -> bool:
    """Whether ONNX Runtime's u8s8 CPU kernels saturate here (x86-64 without a VNNI)."""
    if platform.machine().lower() not in _X86:
        return False
    flags = set(cpu_flags())
    return not flags & {"AVX512VNNI", "AVX_VNNI"}


def cpu_info() -> dict[str, Any]:
    """The CPU as recorded in ``summary.json`` and in benchmarks' machine block."""
    return {
        "model": _proc_cpuinfo()[0] or platform.processor() or platform.machine(),
        "arch": platform.machine(),
        "flags": list(cpu_flags()),
        "u8s8_saturates": u8s8_saturates(),
    }
