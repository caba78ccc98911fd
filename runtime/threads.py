"""Threads for kernel calls: one kernel call per thread chunk, the GIL released by cffi.

``INT8JIT_NUM_THREADS`` (or an argument) overrides the default of all usable cores.
The pool is persistent, so a parallel call costs a queue hand-off per chunk, not a
thread start.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def default_threads() -> int:
    """``INT8JIT_NUM_THREADS`` if set, else the cores this process may run on."""
    env = os.environ.get("INT8JIT_NUM_THREADS", "").strip()
    if env:
        try:
            value = int(env)
        except ValueError:
            raise ValueError(f"INT8JIT_NUM_THREADS: expected a positive integer, got {env!r}") from None
        if value < 1:
            raise ValueError(f"INT8JIT_NUM_THREADS: expected a positive integer, got {value}")
        return value
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def resolve_threads(threads: int | None) -> int:
    """Validate a ``threads`` argument; ``None`` means the default."""
    if threads is None:
        return default_threads()
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads: expected a positive integer or None, got {threads!r}")
    return threads


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(2, (os.cpu_count() or 2) * 2), thread_name_prefix="int8jit")
        return _pool


def run_chunks(call: Callable, chunks: Sequence) -> None:
    """``call(chunk)`` for every chunk; the first runs on this thread, the rest in the pool."""
    if len(chunks) == 1:
        call(chunks[0])
        return
    pool = _get_pool()
    futures = [pool.submit(call, chunk) for chunk in chunks[1:]]
    call(chunks[0])
    for f in futures:
        f.result()


def split(total: int, parts: int, quantum: int = 1) -> list[tuple[int, int]]:
    """Split ``range(total)`` into at most ``parts`` (begin, end) ranges of whole quanta."""
    units = -(-total // quantum)
    parts = max(1, min(parts, units))
    out = []
    begin = 0
    for p in range(parts):
        count = units // parts + (1 if p < units % parts else 0)
        end = min(total, begin + count * quantum)
        if end > begin:
            out.append((begin, end))
        begin = end
    return out
