"""Verbose mode: one CSV line to stderr per primitive creation, execution or dispatch decision.

``INT8JIT_VERBOSE`` (read at every call, so it can change while a process runs):

=================  ===============================================================
unset, ``0``       nothing
``1`` / ``all``    a ``create`` line per primitive creation and an ``exec`` line per execution
``create``         only creation lines; ``exec``: only execution lines
``dispatch``       creation and execution lines, plus a ``dispatch`` line per
                   implementation a primitive descriptor rejected, saying why
=================  ===============================================================

Several values may be combined with commas (``create,dispatch``). The lines are::

    int8jit_verbose,create,<primitive>,<impl>,<isa>,<descs>,<attrs>,<ms>
    int8jit_verbose,exec,<primitive>,<impl>,<isa>,<descs>,<attrs>,<ms>
    int8jit_verbose,dispatch,<primitive>,<impl>,<reason>

``<descs>`` lists ``name:dt:tag:dims`` entries separated by spaces (e.g.
``src:u8:ab:128x768 weights:s8:packed:768x768 dst:s8:ab:128x768``), ``<attrs>`` the
non-default attributes, ``<ms>`` the wall time in milliseconds. Commas inside a
field are written as ``;`` so every line splits into the same number of fields.
``INT8JIT_VERBOSE_TIMESTAMP=1`` inserts a time stamp (milliseconds since the epoch)
as the second field, as ``ONEDNN_VERBOSE_TIMESTAMP`` does.

Example::

    >>> import os, sys, io
    >>> os.environ["INT8JIT_VERBOSE"] = "dispatch"
    >>> err, sys.stderr = sys.stderr, io.StringIO()
    >>> dispatch("matmul", "avx2_vnni", "CPU lacks AVX-VNNI")
    >>> text, sys.stderr = sys.stderr.getvalue(), err
    >>> del os.environ["INT8JIT_VERBOSE"]
    >>> text
    'int8jit_verbose,dispatch,matmul,avx2_vnni,CPU lacks AVX-VNNI\\n'
"""
from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from contextlib import contextmanager

from runtime import isa as _isa
from runtime.env import env_raw

ENV = "INT8JIT_VERBOSE"
ENV_TIMESTAMP = "INT8JIT_VERBOSE_TIMESTAMP"
PREFIX = "int8jit_verbose"
KINDS = ("create", "exec", "dispatch")

_TOKENS: dict[str, frozenset[str]] = {
    "": frozenset(), "0": frozenset(), "none": frozenset(), "off": frozenset(),
    "1": frozenset({"create", "exec"}), "all": frozenset({"create", "exec"}),
    "2": frozenset(KINDS),
    "create": frozenset({"create"}), "profile_create": frozenset({"create"}),
    "exec": frozenset({"exec"}), "profile_exec": frozenset({"exec"}),
    "profile": frozenset({"create", "exec"}),
    "dispatch": frozenset(KINDS),
}
_lock = threading.Lock()  # one line at a time, even from several threads
_warned: set[str] = set()
_parsed: tuple[str, frozenset[str]] = ("", frozenset())


_NONE: frozenset[str] = frozenset()


def flags() -> frozenset[str]:
    """The kinds of line ``INT8JIT_VERBOSE`` asks for now."""
    global _parsed
    raw = env_raw(ENV)  # (asked on every execute(): env_raw answers an unset one fast)
    if not raw or getattr(_muted, "depth", 0):
        return _NONE
    if raw == _parsed[0]:  # the common case: unchanged since the last call
        return _parsed[1]
    out: set[str] = set()
    for token in raw.lower().replace("+", ",").split(","):
        token = token.strip()
        if token in _TOKENS:
            out |= _TOKENS[token]
        elif token not in _warned:
            # A typo must not break the computation it was meant to observe: warn once.
            _warned.add(token)
            warnings.warn(f"{ENV}: unknown value {token!r} ignored; expected 0, 1, all, create, exec or "
                          "dispatch (comma-separated)", RuntimeWarning, stacklevel=3)
    result = frozenset(out)
    _parsed = (raw, result)
    return result


_KEY = os.environ.encodekey(ENV)  # (os.environ's own mapping's key for it)
_muted = threading.local()  # per thread: the depth of muted() blocks


@contextmanager
def muted():
    """No lines from this thread inside the block: for a primitive a primitive makes and
    runs on its own (a K = 0 matmul's K = 1 one), which the user did not ask for."""
    _muted.depth = getattr(_muted, "depth", 0) + 1
    try:
        yield
    finally:
        _muted.depth -= 1


def exec_quiet() -> bool:
    """No ``exec`` lines now: the test every execution makes. An unset variable is
    answered from os.environ's own mapping (60 ns, against 150 through :func:`flags`)."""
    data = getattr(os.environ, "_data", None)
    if type(data) is dict and _KEY not in data:
        return True
    return "exec" not in flags()


def enabled(kind: str) -> bool:
    """Whether lines of ``kind`` (``create``, ``exec``, ``dispatch``) are printed now."""
    return kind in flags()


def _field(value: object) -> str:
    text = "" if value is None else str(value)
    return text.replace(",", ";").replace("\n", " ").replace("\r", " ")


def emit(kind: str, *fields: object) -> None:
    """Print ``int8jit_verbose,<kind>,<fields...>`` to ``sys.stderr`` if ``kind`` is enabled."""
    if kind not in flags():
        return
    head = [PREFIX]
    if os.environ.get(ENV_TIMESTAMP, "").strip() not in ("", "0"):
        head.append(f"{time.time() * 1e3:.3f}")
    line = ",".join(head + [kind] + [_field(f) for f in fields])
    with _lock:
        # Looked up at each call: pytest's capsys and callers may swap sys.stderr.
        print(line, file=sys.stderr, flush=True)


def _record(kind: str, primitive: str, impl: str, isa: str | None, descs: str, attrs: str, ms: float) -> None:
    emit(kind, primitive, impl, isa or "-", descs, attrs, f"{ms:.4f}")


def create(primitive: str, impl: str, isa: str | None, descs: str, attrs: str, ms: float) -> None:
    """The line for one primitive creation (``ms``: time to create it)."""
    _record("create", primitive, impl, isa, descs, attrs, ms)


def execution(primitive: str, impl: str, isa: str | None, descs: str, attrs: str, ms: float) -> None:
    """The line for one execution (``ms``: wall time of the execution)."""
    _record("exec", primitive, impl, isa, descs, attrs, ms)


def dispatch(primitive: str, impl: str, reason: str) -> None:
    """Say why a primitive descriptor rejected implementation ``impl`` (``INT8JIT_VERBOSE=dispatch``)."""
    emit("dispatch", primitive, impl, reason)


def planned_isa(primitive: str, isa: str | None) -> str:
    """:func:`runtime.isa.planning_isa` for a descriptor of ``primitive``, with a
    ``dispatch`` line for each higher path it passed over, saying why (the CPU lacks it, or
    a cap left it out)."""
    chosen = _isa.planning_isa(isa)
    if "dispatch" in flags():
        for name, why in _isa.passed_over(chosen, isa):
            dispatch(primitive, name, why)
    return chosen


__all__ = ["ENV", "ENV_TIMESTAMP", "PREFIX", "KINDS", "flags", "exec_quiet", "enabled", "emit", "create",
           "execution", "dispatch", "planned_isa", "muted"]
