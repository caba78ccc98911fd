"""One cheap stamp of the settings an ISA path and a thread count are resolved from.

:func:`primitives.base.in_force` turns a call's ``isa`` and ``threads`` arguments into
the path and count a descriptor made now would take, and the one-off functions (the GEMM
calls, ``quantize``, ``pool2d``) key their kept set-ups on it at every call. Resolving
them walks half a dozen small functions (0.6-0.85 us on a Zen 4); :func:`stamp` reads
what their answers depend on in one go (about 0.2 us), so an answer seen with the same
stamp is still the answer.

Example::

    >>> import os
    >>> saved = os.environ.pop("INT8JIT_NUM_THREADS", None)
    >>> before = stamp()
    >>> stamp() == before
    True
    >>> os.environ["INT8JIT_NUM_THREADS"] = "3"
    >>> stamp() == before
    False
    >>> del os.environ["INT8JIT_NUM_THREADS"]
    >>> stamp() == before
    True
    >>> if saved is not None:
    ...     os.environ["INT8JIT_NUM_THREADS"] = saved
"""
from __future__ import annotations

import os

from runtime import cpu as _cpu
from runtime import isa as _isa
from runtime.isa import ENV_CAP
from runtime.threads import ENV_THREADS, usable_cores

_keys = tuple(os.environ.encodekey(name) for name in (ENV_CAP, ENV_THREADS))  # (its mapping's own keys)


def stamp() -> tuple:
    """What :func:`runtime.isa.planning_isa` and :func:`runtime.threads.resolve_threads`
    answer from besides their arguments: the two variables as set (``INT8JIT_MAX_ISA``,
    ``INT8JIT_NUM_THREADS``), the API's cap, the CPU probe's result and the functions a
    test may stand in for (``supported``, ``cpu_supports``), and the usable cores."""
    data = getattr(os.environ, "_data", None)
    # (runtime.env.env_raw's lookup, inlined for the two names: the stamp 0.23 us, against
    # 0.35 calling env_raw twice and 0.45 through a general reader of several names)
    if type(data) is dict:  # (os.environ's own mapping: no KeyError raised and caught for an unset name)
        cap, threads = data.get(_keys[0]), data.get(_keys[1])
    else:  # pragma: no cover - another Python's os.environ
        cap, threads = os.environ.get(ENV_CAP), os.environ.get(ENV_THREADS)
    return (cap, threads, _isa._cap_override, _cpu._cached, _isa.supported, _isa.cpu_supports, usable_cores())
