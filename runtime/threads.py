"""Threads for kernel calls: one kernel call per thread chunk, the GIL released by cffi.

``INT8JIT_NUM_THREADS`` (or an argument) overrides the default of all usable cores.
Workers are persistent and parked on a lock, so a parallel call costs a lock hand-off
per chunk, not a thread start or a queue.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Callable, Sequence

from runtime.env import env_int

_idle: list = []  # parked workers
_idle_lock = threading.Lock()


class _Worker:
    """A parked thread that runs one ``call(chunk)`` per hand-off.

    Two plain locks make the hand-off (release ``go``, later acquire ``done``): a
    futex wake each way, about 10 us for a two-chunk call on this project's VM, where
    a ``ThreadPoolExecutor`` submit + result took about 25 us.
    """

    def __init__(self):
        self._go = threading.Lock()
        self._go.acquire()
        self._done = threading.Lock()
        self._done.acquire()
        self._job = None
        self._error: BaseException | None = None
        threading.Thread(target=self._loop, name="int8jit-worker", daemon=True).start()

    def _loop(self):
        while True:
            self._go.acquire()
            call, chunk = self._job
            try:
                call(chunk)
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                self._error = exc
            self._job = None
            self._done.release()

    def start(self, call, chunk):
        self._job = (call, chunk)
        self._go.release()

    def join(self):
        self._done.acquire()
        error, self._error = self._error, None
        if error is not None:
            raise error


def _forget_after_fork() -> None:
    """A forked child has none of the parent's threads: its parked workers are not
    there to wake (a child that ran a parallel call waited for them forever)."""
    global _idle_lock
    _idle.clear()
    _idle_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def _take_workers(n: int) -> list:
    with _idle_lock:
        taken = [_idle.pop() for _ in range(min(n, len(_idle)))]
    return taken + [_Worker() for _ in range(n - len(taken))]


ENV_THREADS = "INT8JIT_NUM_THREADS"
_CORES_TTL_S = 1.0
_cores_seen = (0, -_CORES_TTL_S)  # (count, time.monotonic() of the look-up)


def usable_cores() -> int:
    """The CPUs this process may run on, looked up again at most once a second (a system
    call: 0.5-1 us, a quarter of a two-thread call's hand-off; every one-off GEMM call
    asks for its default threads)."""
    global _cores_seen
    count, when = _cores_seen
    now = time.monotonic()
    if now - when < _CORES_TTL_S:
        return count
    try:
        count = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        count = max(1, os.cpu_count() or 1)
    _cores_seen = (count, now)
    return count


def forget_cores() -> None:
    """Look the cores up again at the next call (after this process's affinity changed;
    a child process, which may be given other CPUs, forgets them itself)."""
    global _cores_seen
    _cores_seen = (0, -_CORES_TTL_S)


os.register_at_fork(after_in_child=forget_cores)


def default_threads() -> int:
    """``INT8JIT_NUM_THREADS`` if set, else the cores this process may run on."""
    return env_int(ENV_THREADS, 0, 1, "a positive integer") or usable_cores()


def resolve_threads(threads: int | None) -> int:
    """Validate a ``threads`` argument; ``None`` means the default."""
    if threads is None:
        return default_threads()
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads: expected a positive integer or None, got {threads!r}")
    return threads


def run_chunks(call: Callable, chunks: Sequence) -> None:
    """``call(chunk)`` for every chunk; the first runs on this thread, the rest on
    parked workers (one each; callers on several threads at once get their own)."""
    if len(chunks) == 1:
        call(chunks[0])
        return
    workers = _take_workers(len(chunks) - 1)
    for worker, chunk in zip(workers, chunks[1:]):
        worker.start(call, chunk)
    error = None
    try:
        call(chunks[0])
    except BaseException as exc:  # noqa: BLE001 - wait for the workers first
        error = exc
    for worker in workers:
        try:
            worker.join()
        except BaseException as exc:  # noqa: BLE001
            error = error or exc
    with _idle_lock:
        _idle.extend(workers)
    if error is not None:
        raise error


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
