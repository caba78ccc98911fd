"""The data caches of one core, as Linux describes them: the sizes the kernels' blocking
plans against (oneDNN reads the same figures from CPUID).

``/sys/devices/system/cpu/cpu0/cache/index*/`` holds one folder per cache with its
``level``, ``type`` (Data, Instruction, Unified) and ``size`` ("48K"). Where that is
missing or unreadable (not Linux, a restricted container), the sizes of a common AVX-512
server core stand in and ``source`` says so.

Example::

    >>> from runtime.caches import data_caches
    >>> caches = data_caches()
    >>> caches.l1d >= 16 << 10 and caches.l2 >= caches.l1d
    True
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclass(frozen=True)
class DataCaches:
    """Bytes of a core's L1 data cache and of its L2 (0 where there is none), where the
    figures came from, and the L3 the core sees (0: none, or not described)."""

    l1d: int
    l2: int
    source: str
    l3: int = 0


DEFAULT = DataCaches(l1d=48 << 10, l2=2 << 20, source="default (no cache description found)")


def _size(text: str) -> int:
    """'48K' -> 49152; a plain number is bytes."""
    text = text.strip().upper()
    if text and text[-1] in _UNITS:
        return int(text[:-1]) * _UNITS[text[-1]]
    return int(text)


def read(root: Path = SYSFS) -> DataCaches:
    """The caches described under ``root`` (sysfs's layout), or :data:`DEFAULT`."""
    l1d = l2 = l3 = 0
    try:
        for folder in sorted(root.glob("index*")):
            level = int((folder / "level").read_text())
            kind = (folder / "type").read_text().strip()
            size = _size((folder / "size").read_text())
            if level == 1 and kind in ("Data", "Unified"):
                l1d = size
            elif level == 2 and kind in ("Data", "Unified"):
                l2 = size
            elif level == 3 and kind in ("Data", "Unified"):
                l3 = size
    except (OSError, ValueError):
        return DEFAULT
    if not l1d:
        return DEFAULT
    return DataCaches(l1d=l1d, l2=l2, source=str(root), l3=l3)


@functools.lru_cache(maxsize=1)
def data_caches() -> DataCaches:
    """:func:`read` of this machine, once per process."""
    return read()


__all__ = ["DataCaches", "DEFAULT", "read", "data_caches"]
