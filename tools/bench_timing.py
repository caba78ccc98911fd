"""How every ``int8jit-bench`` command times: interleaved windows, the host's steal,
pinning, and the machine it runs on (its ISA paths and register-only peak).

The machine is shared and its clock moves by 20-40% within seconds, so the sides of a
comparison (int8jit, oneDNN, PyTorch, the peak loop) are never timed one after the other:
each gets one window (about 5 ms of back-to-back calls) per round, in turn, and a figure
is its best window, the least disturbed one.

>>> from tools.bench_timing import measure_calls
>>> out = measure_calls({"sum": lambda: sum(range(100))}, min_time=0.0, window_s=1e-4, min_rounds=3)
>>> best, median = out["sum"]
>>> 0 < best <= median
True
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from runtime.threads import forget_cores

REPO_ROOT = Path(__file__).resolve().parent.parent
WINDOW_S = 0.005  # one timed window of back-to-back calls


class Unavailable(RuntimeError):
    """A side of a comparison that cannot run here (its column says why)."""


# ------------------------------------------------------------------ windows

def timed_calls(call, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    return time.perf_counter() - t0


def in_turn(calls):
    """One call that makes ``calls`` one after another (a chain of layers)."""
    def chain():
        for call in calls:
            call()
    return chain


class Series:
    """Windows of one side of one variant: per-call seconds of each window."""

    def __init__(self, timed, first_call_s: float, remote: bool = False, window_s: float = WINDOW_S):
        self.timed, self.remote = timed, remote
        self.n = max(1, int(window_s / max(first_call_s, 1e-7)))
        self.windows: list[float] = []
        self.total = 0.0

    def window(self) -> None:
        s = self.timed(self.n)
        self.total += s
        self.windows.append(s / self.n)

    @property
    def best(self):
        return min(self.windows) if self.windows else None

    @property
    def median(self):
        return statistics.median(self.windows) if self.windows else None

    @property
    def noise(self):
        return self.median / self.best - 1.0 if self.windows else None

    @classmethod
    def local(cls, call, window_s: float = WINDOW_S) -> "Series":
        """The series of a call in this process (one warm-up call, one to calibrate)."""
        timed = local_timed(call)
        return cls(timed, first_call_s(timed), window_s=window_s)


# libgomp's idle workers spin (GOMP_SPINCOUNT, PAUSE loops) after oneDNN's last call; with
# 2+ threads they would steal a core from int8jit's next window. With the count below they
# sleep within about a millisecond, so the pause is kept that short: on a VM whose host
# slows a vCPU that has idled for tens of ms (a Zen 3 here), 30 ms made int8jit's two-thread windows start on a
# slowed vCPU (ResNet-50 rows 0.51-0.93 at up to 233% noise, against 0.89-1.03 at 5-15%
# with 3 ms, two runs each; oneDNN's own rows no slower).
SETTLE_S = 0.003
# libgomp's default spin (300,000 PAUSE loops) outlasted SETTLE_S here: in interleaved
# windows on two cores, oneDNN's and PyTorch's idle workers took a core from int8jit's
# next window (two-thread rows at 0.3-0.7x that ran 0.9-1.3x without it). This count
# keeps a side's workers awake between its own back-to-back calls (microseconds apart)
# and asleep within about a millisecond of its window's end. A user's setting stays.
GOMP_SPINCOUNT = "10000"


def measure_interleaved(series: list[Series], min_time: float, min_rounds: int, peak=None,
                        settle: float = 0.0) -> None:
    """Rounds of one window per series (oneDNN's first), then the peak loop's window."""
    series = sorted(series, key=lambda s: not s.remote)
    rounds = 0
    while rounds < min_rounds or min(s.total for s in series) < min_time:
        for i, s in enumerate(series):
            if settle and i and series[i - 1].remote and not s.remote:
                time.sleep(settle)
            s.window()
        if peak is not None:
            if settle and series[-1].remote:
                time.sleep(settle)
            peak.window()
        rounds += 1
        if rounds >= 1000:
            break


def measure_calls(calls: dict, min_time: float, window_s: float = WINDOW_S, min_rounds: int = 5,
                  peers: tuple = (), settle: float = 0.0) -> dict:
    """{name: (best, median) seconds per call} of this process's ``calls``, timed in
    interleaved windows of about ``window_s`` (each at least ``min_time`` s in all).
    ``peers``: the names of calls with OpenMP workers (oneDNN), timed first in a round
    and followed by a ``settle`` pause (:data:`SETTLE_S` for rows of several threads)."""
    series = {name: Series.local(call, window_s) for name, call in calls.items()}
    for name in peers:
        if name in series:
            series[name].remote = True
    measure_interleaved(list(series.values()), min_time, min_rounds, settle=settle)
    return {name: (s.best, s.median) for name, s in series.items()}


def local_timed(call):
    """``timed(n)``: seconds of ``n`` back-to-back calls of ``call``."""
    return lambda n: timed_calls(call, n)


def first_call_s(timed) -> float:
    timed(1)  # warm-up
    return timed(1)


# ------------------------------------------------------------------ the host

def host_steal_counters(cpus=None) -> tuple[int, int] | None:
    """(steal, total) jiffies of ``cpus`` (default: all) from /proc/stat, None where the
    kernel does not say. On a virtual machine, steal is the time the hypervisor ran
    something else while a vCPU wanted to run: a row timed under heavy steal measures the
    host's other tenants as much as the code (here, at times, 20-60% of both vCPUs)."""
    try:
        with open("/proc/stat") as f:
            lines = [line.split() for line in f if line.startswith("cpu")]
    except OSError:
        return None
    wanted = {f"cpu{c}" for c in cpus} if cpus is not None else {"cpu"}
    steal = total = 0
    for fields in lines:
        if fields[0] in wanted and len(fields) > 8:
            values = [int(v) for v in fields[1:9]]  # user .. steal (guest time is inside user)
            steal += values[7]
            total += sum(values)
    return (steal, total) if total else None


def steal_fraction(before, after) -> float | None:
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def measure_with_steal(series, min_time, min_rounds, peak, threads) -> float | None:
    """:func:`measure_interleaved` (with the settle pause of rows of several threads);
    returns the host's steal over the rounds on the cores this process may use."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    before = host_steal_counters(cpus)
    measure_interleaved(series, min_time, min_rounds, peak, SETTLE_S if threads > 1 else 0.0)
    return steal_fraction(before, host_steal_counters(cpus))


def pin(nthreads: int):
    """Pin this process, and so the oneDNN child started next, to its first ``nthreads``
    allowed CPUs; returns the mask to restore (None: nothing pinned).

    On a shared host the cores are not alike: a neighbour's load lands on one core and
    not the other. Unpinned, the two sides of a single-thread row could run on different
    cores, and their ratio moved by up to 0.3 between runs; on one core it moves by a few
    percent.
    """
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if nthreads >= len(allowed):
        return None
    os.sched_setaffinity(0, allowed[:nthreads])
    forget_cores()  # (int8jit looks its cores up at most once a second)
    return allowed


def unpin(allowed) -> None:
    if allowed is not None:
        os.sched_setaffinity(0, allowed)
        forget_cores()


# ------------------------------------------------------------------ the machine

def cpu_brand() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"


def supported_isas() -> list[str]:
    """The ISA paths this CPU executes (runtime.isa's probe)."""
    from runtime.isa import supported

    return list(supported())


def best_isa() -> str:
    isas = supported_isas()
    return isas[-1] if isas else "avx2"


def peak_loop(isa: str, path: str | None = None):
    """(the register-only loop kernel of ``path`` on ``isa``, ops per iteration)."""
    from jit.dot import path_for
    from jit.peak import ops_per_iteration, peak_kernel
    from runtime.isa import cpu_supports

    if not cpu_supports(isa):
        raise Unavailable(f"this CPU cannot run the {isa} peak loop")
    return peak_kernel(isa, path), ops_per_iteration(path_for(isa, path))


def peak_callable(isa: str, path: str | None, iterations: int = 2000):
    """(a callable running ``iterations`` of the register-only loop, ops per call)."""
    kernel, per_iteration = peak_loop(isa, path)
    return (lambda: kernel.function(iterations)), iterations * per_iteration  # the closure holds the kernel


class Peak:
    """The path's register-only loop (:mod:`jit.peak`), timed in short windows between
    the problems' windows; the best window so far is the machine's single-core peak."""

    WINDOW_S = 0.002

    def __init__(self, isa: str, path: str | None = None):
        self.kernel, self.per_iteration = peak_loop(isa, path)  # held: self.fn is its bare function pointer
        self.fn = self.kernel.function
        self.fn(1000)
        n = 1000
        while True:  # calibrate one window
            t0 = time.perf_counter()
            self.fn(n)
            dt = time.perf_counter() - t0
            if dt > self.WINDOW_S / 4:
                break
            n *= 4
        self.n = max(1, int(n * self.WINDOW_S / dt))
        self.best = 0.0
        for _ in range(5):
            self.window()

    def window(self) -> None:
        t0 = time.perf_counter()
        self.fn(self.n)
        self.best = max(self.best, self.n * self.per_iteration / (time.perf_counter() - t0) / 1e9)


def make_peak(isa: str):
    try:
        return Peak(isa)
    except Exception as exc:
        print(f"  (peak of {isa} unavailable: {exc})", file=sys.stderr)
        return None
