"""The machine's int8 peak: a register-only loop of the dot-product step of each ISA path.

The loop body holds independent accumulator chains, each advanced by the path's
:func:`jit.dot.emit_step` (the same step every int8jit kernel uses; two at a time), with
its sources in registers: no load or store in the loop, so the loop runs at the rate
the execution ports allow. The benchmark driver reports kernels as a percentage of it.

Paths (``kind``): ``vnni`` (VPDPBUSD; zmm on avx512_core_vnni, VEX ymm on avx2_vnni),
``maddubsw`` (VPMADDUBSW + VPMADDWD + VPADDD; zmm on avx512_core, ymm on avx2) and
``widen`` (VPMADDWD + VPADDD, the exact path of avx512_core and avx2).

Counting: one multiply-add of an int8 pair counts as 2 operations (as GEMM's 2*M*N*K).

* VPDPBUSD zmm: 16 lanes x 4 u8*s8 products = 64 MACs = 128 ops (ymm: 32 MACs, 64 ops).
* VPMADDUBSW + VPMADDWD + VPADDD on zmm: 64 u8*s8 products = 128 ops (ymm: 64 ops);
  the VPMADDWD by ones and the VPADDD only finish the sum and count nothing extra.
* VPMADDWD + VPADDD (widen) on zmm: 16 lanes x 2 products of bytes widened to s16 =
  32 MACs = 64 ops (ymm: 32 ops).

Example::

    >>> from jit.peak import measure_peak
    >>> from runtime.isa import cpu_supports
    >>> measure_peak("avx2") > 0 if cpu_supports("avx2") else True
    True
"""
from __future__ import annotations

import time

from jit.dot import Path, emit_bytes, emit_ones_s16, emit_steps, path_for, vector_register
from runtime.isa import check_name, cpu_supports, REQUIRES

SIGNATURE = "void (*)(int64_t)"
UNROLL = 2  # steps per chain per loop iteration
PAIRED = 2  # steps emitted stage by stage (jit.dot.emit_steps)
DURATION_S = 0.05  # length of one timed run
REPEATS = 5  # timed runs; the best counts


def _layout(path: Path) -> tuple[int, int]:
    """(accumulator chains, rotating temporaries) so that every register is used once."""
    if path.kind == "vnni":
        return path.registers - 2, 0  # a, b
    return path.registers - 3 - 3, 3  # a, b, ones; three product temporaries


def ops_per_step(path: Path) -> int:
    """int8 operations (2 per multiply-add) of one step of the path."""
    macs = path.lanes * (2 if path.kind == "widen" else 4)
    return 2 * macs


def ops_per_iteration(path: Path) -> int:
    chains, _ = _layout(path)
    return chains * UNROLL * ops_per_step(path)


def _emit(path: Path, argument) -> None:
    from jit import asm

    chains, temps = _layout(path)
    V = lambda i: vector_register(path, i)  # noqa: E731
    acc = [V(i) for i in range(chains)]
    a, b = V(chains), V(chains + 1)
    ones = V(chains + 2) if path.kind != "vnni" else None
    tmps = [V(chains + 3 + i) for i in range(temps)]
    vxor = asm.VPXORD if path.bits == 512 else asm.VPXOR

    counter = asm.rdi
    asm.LOAD.ARGUMENT(counter, argument)
    emit_bytes(path, a, 0x01, asm.rax)
    emit_bytes(path, b, 0x01, asm.rax)
    if ones is not None:
        emit_ones_s16(path, ones, asm.rax)
    for r in acc:
        vxor(r, r, r)
    done, loop = asm.Label(), asm.Label()
    asm.TEST(counter, counter)
    asm.JLE(done)
    asm.LABEL(loop)
    n = 0
    for _ in range(UNROLL):
        # Two steps at a time, stage by stage: one after the other, the multiply pipes of a
        # Zen 3 sat idle now and then; paired, the VPMADDUBSW step ran 4% faster (as fast
        # as its two multiplies alone), the widening step 1% (one process, best of 7).
        for i in range(0, chains, PAIRED):
            steps = []
            for r in acc[i:i + PAIRED]:
                steps.append((r, b, tmps[n % temps] if temps else None))
                n += 1
            emit_steps(path, steps, a, ones)
    asm.DEC(counter)
    asm.JNZ(loop)
    asm.LABEL(done)
    asm.RETURN()


def _generate(path: Path):
    from jit import asm
    from jit.build import generate

    argument = asm.Argument(asm.int64_t, "iterations")
    chains, _ = _layout(path)
    return generate(f"peak_{path.isa}_{path.kind}", path.isa, SIGNATURE, (argument,),
                    lambda: _emit(path, argument),
                    meta={"path": path.name, "chains": chains, "unroll": UNROLL,
                          "ops_per_iteration": ops_per_iteration(path)})


def peak_kernel(isa: str, kind: str | None = None):
    """The peak loop of ``isa``/``kind`` as a :class:`runtime.kernel.Kernel` (cached).

    Generating and mapping it needs no CPU support; only calling it does.
    """
    from jit.cache import get_kernel

    path = path_for(isa, kind)
    chains, _ = _layout(path)
    return get_kernel(("peak", path, chains, UNROLL), lambda: _generate(path))


def measure_peak(isa: str, kind: str | None = None, *, duration: float | None = None,
                 repeats: int | None = None) -> float:
    """Single-thread int8 GOPS of the ``isa`` path ``kind`` (None: its fast path).

    The loop is calibrated to run about ``duration`` seconds (default
    :data:`DURATION_S`) and timed ``repeats`` times (default :data:`REPEATS`); the best
    run counts. Raises :class:`RuntimeError` where this CPU cannot execute ``isa``.
    """
    isa = check_name(isa)
    path = path_for(isa, kind)
    if not cpu_supports(isa):
        raise RuntimeError(f"{isa}: this CPU cannot execute the {path.name} peak loop "
                           f"(it needs {', '.join(f.upper() for f in REQUIRES[isa])})")
    duration = DURATION_S if duration is None else float(duration)
    repeats = REPEATS if repeats is None else max(1, int(repeats))
    fn = peak_kernel(isa, kind).function
    per_iteration = ops_per_iteration(path)

    fn(1000)  # warm up (and let the clock settle after AVX-512 starts)
    iterations, elapsed = 1000, 0.0
    while True:  # calibrate: grow until one run takes a measurable fraction of duration
        start = time.perf_counter()
        fn(iterations)
        elapsed = time.perf_counter() - start
        if elapsed >= duration / 4 or iterations >= 1 << 40:
            break
        iterations *= 4
    iterations = max(1, int(iterations * duration / max(elapsed, 1e-9)))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(iterations)
        best = min(best, time.perf_counter() - start)
    return iterations * per_iteration / best / 1e9
