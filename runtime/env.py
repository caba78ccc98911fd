"""Number settings from the environment (the ``INT8JIT_*`` variables): read, checked and
refused with one message, naming the variable.

Example::

    >>> import os
    >>> from runtime.env import env_int
    >>> os.environ["INT8JIT_EXAMPLE"] = " 12 "
    >>> env_int("INT8JIT_EXAMPLE", 3, 1, "a positive integer")
    12
    >>> os.environ["INT8JIT_EXAMPLE"] = "lots"
    >>> env_int("INT8JIT_EXAMPLE", 3, 1, "a positive integer")
    Traceback (most recent call last):
    ValueError: INT8JIT_EXAMPLE: expected a positive integer, got 'lots'
    >>> del os.environ["INT8JIT_EXAMPLE"]
    >>> env_int("INT8JIT_EXAMPLE", 3, 1, "a positive integer")
    3
"""
from __future__ import annotations

import math
import os


def env_raw(name: str, default: str = "") -> str:
    """``os.environ.get(name, default)``, faster where ``name`` is unset. The primitives
    ask for some variables at every call (``INT8JIT_VERBOSE``; the ISA cap and thread
    count the one-off functions key their set-ups on), and ``os.environ.get`` of an unset
    name raises and catches a KeyError inside (0.5 us); its own mapping (bytes keys on
    POSIX) answers without one. A set one takes the general lookup."""
    data = getattr(os.environ, "_data", None)
    if type(data) is dict:
        key = _KEYS.get(name)
        if key is None:
            key = _KEYS[name] = os.environ.encodekey(name)
        if key not in data:
            return default
    return os.environ.get(name, default)


_KEYS: dict = {}  # name -> os.environ's key for it (bytes on POSIX)


def env_int(name: str, default: int, minimum: int, what: str, maximum: int | None = None) -> int:
    """``name``'s value as an int in [minimum, maximum], or ``default`` where it is unset
    or blank; anything else raises ``ValueError`` saying ``what`` was expected."""
    return _env_number(name, default, int, lambda v: v >= minimum and (maximum is None or v <= maximum), what)


def env_size(name: str, default: float, what: str) -> float:
    """``name``'s value as a finite number of 0 or more (a fraction allowed), or
    ``default`` where it is unset or blank; anything else raises ``ValueError`` saying
    ``what`` was expected."""
    return _env_number(name, default, float, lambda v: math.isfinite(v) and v >= 0, what)


_OFF, _ON = ("0", "off", "false", "no"), ("1", "on", "true", "yes")


def env_switch(name: str, default: bool) -> bool:
    """``name`` as a switch: ``0``/``off``/``false``/``no`` or ``1``/``on``/``true``/``yes``
    (any case), ``default`` where it is unset or blank; anything else raises ``ValueError``."""
    raw = env_raw(name).strip().lower()
    if not raw:
        return default
    if raw in _OFF or raw in _ON:
        return raw in _ON
    raise ValueError(f"{name}: expected 0, off, false, no or 1, on, true, yes, got {env_raw(name).strip()!r}")


def _env_number(name: str, default, parse, ok, what: str):
    """``name``'s value read by ``parse`` and held to ``ok``: the one place the variables
    are read, checked and refused by name."""
    raw = env_raw(name).strip()
    if not raw:
        return default
    try:
        value = parse(raw)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise ValueError(f"{name}: expected {what}, got {raw!r}")
    return value
