"""Parallel kernel calls without Python on the workers: a team of threads parked in
machine code (``jit.pool_kernel``).

A :class:`CallPlan` holds, per thread, a list of ``fn(arg)`` kernel calls (built once
per primitive plan). ``plan.run()`` is one cffi call: it posts each worker its list,
runs the first list on the calling thread and waits for the others, GIL released
throughout. Workers poll for about 0.1 ms after a job (so a network's next layer finds
them awake) and then sleep in ``futex`` until the next post.

Callers on several Python threads at once get separate teams. Example::

    >>> from runtime.pool import CallPlan
    >>> CallPlan([[], []]).run()    # two threads, nothing to call
"""
from __future__ import annotations

import os
import threading

from jit import pool_kernel as pk
from runtime.env import env_int, env_switch
from runtime.execmem import map_pages
from runtime.ffi import declare, ffi
from runtime.threads import usable_cores

declare(pk.CDEF, (pk.WORKER_SIGNATURE, pk.FORK_JOIN_SIGNATURE, "struct i8j_slot", "struct i8j_slot *",
                  "struct i8j_slot *[]", "struct i8j_job[]", "struct i8j_call[]", "void (*)(void *)"))
# INT8JIT_SPIN_POOL=0 (or off, false, no): run the lists on runtime.threads' parked Python
# workers instead (a lock hand-off each way; no polling, for machines with more threads than cores).
ENABLED = env_switch("INT8JIT_SPIN_POOL", True)
WORKER_SPINS = 2000  # PAUSEs a worker polls after a job before sleeping (~0.1 ms on Intel, 0.05 on Zen 3)
# INT8JIT_POOL_SPINS overrides it (like OpenMP's KMP_BLOCKTIME / GOMP_SPINCOUNT): on a VM
# whose host slows a vCPU that has been idle for a while, workers that poll through the
# gaps between calls keep two-thread calls at full speed, at the cost of a busy core.
SPINS_ENV = "INT8JIT_POOL_SPINS"
JOIN_SPINS = 2000  # PAUSEs the caller polls for a worker before sleeping

_lock = threading.Lock()
_kernels: tuple | None = None  # (worker loop, fork_join): mapped once, never unmapped
_free: dict[int, list] = {}  # team size -> free teams
_single_runner = None  # fork_join, for one-thread lists (prepare_single_runs)
_single_probed = False


def _load() -> tuple:
    global _kernels
    with _lock:
        if _kernels is None:
            from jit import cache

            for field, offset in (("state", pk.STATE), ("parked", pk.PARKED), ("waiting", pk.WAITING),
                                  ("claim", pk.CLAIM), ("calls", pk.CALLS), ("ncalls", pk.NCALLS),
                                  ("spins", pk.SPINS), ("claimed", pk.CLAIMED)):
                assert ffi.offsetof("struct i8j_slot", field) == offset, field
            # Held here (jit.cache.clear_memory() only forgets kernels) and kept mapped even
            # at exit: a worker never leaves this code, and may still be polling when the
            # interpreter shuts down (weakref.finalize would unmap the code under it).
            _kernels = tuple(cache.get_kernel(("pool", name), generate).keep()
                             for name, generate in (("worker", pk.generate_worker),
                                                    ("fork_join", pk.generate_fork_join)))
    return _kernels


def prepare_single_runs() -> None:
    """Called at a primitive's creation: the pool's ``fork_join``, which also runs a
    one-thread list of calls in one cffi call, where getting it costs nothing (mapped
    already, or from the disk cache: 0.2 ms once a process). Never generated here (17 ms
    cold): without it, one-thread lists run call by call from Python."""
    global _single_runner, _single_probed
    if _single_runner is not None or _single_probed:
        return
    with _lock:
        if _kernels is not None:
            _single_runner = _kernels[1].function
            return
        from jit import cache

        kernel = cache.cached_kernel(("pool", "fork_join"))
        _single_probed = True
        if kernel is not None:
            _single_runner = kernel.keep().function


def worker_spins() -> int:
    """PAUSEs a new team's workers poll after a job: ``INT8JIT_POOL_SPINS`` or WORKER_SPINS."""
    return env_int(SPINS_ENV, WORKER_SPINS, 1, "a whole number of PAUSEs from 1 (each about 25-50 ns)", 2**62)


class _Team:
    """``size`` worker threads, each looping in the machine code on its own slot."""

    def __init__(self, size: int):
        spins = worker_spins()  # (checked before any thread starts)
        worker, _ = _load()
        # The slots live in a mapping that is never unmapped: at exit the interpreter
        # frees its objects while a worker may still poll its slot. (Teams are reused; a
        # process makes one per concurrent caller and team size.)
        nbytes = size * ffi.sizeof("struct i8j_slot")
        first = ffi.cast("struct i8j_slot *", map_pages(nbytes, "the thread pool's slots"))
        self.slots = [first + i for i in range(size)]
        self.pointers = ffi.new("struct i8j_slot *[]", self.slots)
        for slot in self.slots:
            slot.spins = spins
            threading.Thread(target=worker.function, args=(slot,), name="int8jit-pool", daemon=True).start()


def _free_teams(size: int) -> list:
    """The free teams of ``size`` workers. A plan takes one with ``list.pop`` and gives it
    back with ``append``, both atomic: no lock on the call's path (a lock each way and the
    look-up cost 1 us of a two-thread call's 2-3 us of hand-off)."""
    with _lock:
        return _free.setdefault(size, [])


def _forget_after_fork() -> None:  # a child process has none of the parent's threads
    global _lock
    _lock = threading.Lock()
    for teams in _free.values():  # emptied in place: plans hold these lists
        teams.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


class CallPlan:
    """Per thread, a list of ``(fn, arg)``: cffi kernel function pointers taking one
    pointer argument, and that argument (kept alive by the plan)."""

    def __init__(self, per_thread: list):
        per_thread = [list(calls) for calls in per_thread] or [[]]
        self.threads = len(per_thread)
        self._keep = per_thread
        self._lists = []
        self.jobs = ffi.new("struct i8j_job[]", self.threads)
        for i, calls in enumerate(per_thread):
            array = ffi.new("struct i8j_call[]", max(1, len(calls)))
            for j, (fn, arg) in enumerate(calls):
                array[j].fn = ffi.cast("void (*)(void *)", fn)
                array[j].arg = ffi.cast("void *", arg)
            self._lists.append(array)
            self.jobs[i].calls = array
            self.jobs[i].ncalls = len(calls)
        self._single = per_thread[0]
        self._fork_join = self._teams = None  # looked up at the first spinning run

    @classmethod
    def joined(cls, plans: list) -> "CallPlan":
        """One plan that runs ``plans`` one after another on each thread (each thread's
        lists concatenated): one hand-off instead of one a plan. For plans whose calls
        on one thread do not wait for another thread's calls of an earlier plan (a
        batch's items: each writes its own dst)."""
        threads = max(plan.threads for plan in plans)
        return cls([[call for plan in plans if t < plan.threads for call in plan._keep[t]] for t in range(threads)])

    @classmethod
    def spread(cls, plans: list, threads: int, first: list | None = None) -> "CallPlan":
        """One plan that deals one-thread ``plans`` to ``threads`` threads, whole plans in
        turn (a batch's items, each on one thread: one hand-off, and none of the splits
        of a small item between threads). The plans must not depend on each other;
        ``first``: per plan, calls that run on its thread before it (its weights' packing)."""
        if any(plan.threads != 1 for plan in plans):
            raise ValueError("plans: spread takes one-thread plans")
        lists = [(first[i] if first else []) + plan._keep[0] for i, plan in enumerate(plans)]
        return cls([[call for calls in lists[t::threads] for call in calls] for t in range(threads)])

    def run(self) -> None:
        """Every list's calls, the first on this thread; returns when all are done."""
        if self.threads == 1:
            runner = _single_runner or _kernels and _kernels[1].function
            if len(self._single) > 1 and runner:  # one cffi call for the list (12 calls: 1.9 -> 0.5 us)
                runner(ffi.NULL, self.jobs, 1, 0)
                return
            for fn, arg in self._single:
                fn(arg)
            return
        if not ENABLED or self.threads > usable_cores():  # polling threads would wait for each other's core
            from runtime.threads import run_chunks

            run_chunks(_call_list, self._keep)
            return
        if self._fork_join is None:  # (the pool's code is never unmapped)
            self._fork_join, self._teams = _load()[1].function, _free_teams(self.threads - 1)
        teams = self._teams
        try:
            team = teams.pop()
        except IndexError:  # none free: the first call, or other Python threads hold them
            team = _Team(self.threads - 1)
        try:
            self._fork_join(team.pointers, self.jobs, self.threads, JOIN_SPINS)
        finally:
            teams.append(team)


def _call_list(calls) -> None:
    for fn, arg in calls:
        fn(arg)
