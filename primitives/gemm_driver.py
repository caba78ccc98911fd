"""Calling a GEMM microkernel: the per-thread argument structs of one problem, built once.

GEMM, matmul and inner product all run ``jit.gemm_kernel`` kernels over a packed B.
This module turns (kernel, packed B, shape, the output stage's operands) into a
:class:`Plan`: one argument struct per thread chunk, with every pointer but A's and the
dst's filled in. Executing a plan sets those two and makes one kernel call per chunk.

The output stage's operands (:class:`OutputArgs`) say how each array is indexed, so a
chunk that covers columns ``[c0, c1)`` or rows ``[r0, r1)`` points at its own part.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jit.gemm_kernel import ARGS_CDEF, SIGNATURE, k_split
from jit.output import MAX_POST_OPS
from runtime.ffi import declare, ffi, pointer_to
from runtime.pool import CallPlan
from runtime.threads import split

declare(ARGS_CDEF, (SIGNATURE, "struct i8j_gemm_args *"))
SMALL_WORK = 1 << 20  # below this many multiply-adds one thread is faster than two


@dataclass
class Operand:
    """An array the output stage reads, and how it is indexed.

    ``index``: "common" (one value), "col" (one per column), "row" (one per row) or
    "full" (rows ``ld`` bytes apart, one value per column).
    """

    array: np.ndarray
    index: str
    ld: int = 0


@dataclass
class OutputArgs:
    """The run-time values of the output stage (jit.output)."""

    col_comp: np.ndarray | None  # s32 per column, padded to whole tiles (None: the stage reads none)
    row_comp: np.ndarray | None = None  # s32 per row
    scale: Operand | None = None
    bias: Operand | None = None
    dst_zp: Operand | None = None
    dst_scale_inv: float = 1.0  # primitives.reference.dst_scale_inverse
    po_scale: list = field(default_factory=list)  # per post-op index (sum)
    po_zp: list = field(default_factory=list)
    po_src: dict = field(default_factory=dict)  # post-op index -> Operand (binary)


@dataclass(frozen=True)
class Plan:
    kernel: object
    structs: list
    offsets: list  # per struct: (A byte offset, dst byte offset)
    chunks: list  # per struct: (first column, first row)
    keep: tuple  # arrays the structs point into
    calls: CallPlan  # one kernel call per struct, a thread each


def _offset(operand: Operand, c0: int, r0: int) -> int:
    if operand.index == "col":
        return 4 * c0
    if operand.index == "row":
        return 4 * r0
    if operand.index == "full":
        return r0 * operand.ld + 4 * c0
    return 0


def _at(array, offset_bytes=0):
    return ffi.NULL if array is None else pointer_to(array) + offset_bytes


def new_args(kspec, packed, K: int, lda: int, ldc_bytes: int, out: OutputArgs, c0: int, c1: int, r0: int,
             r1: int, cells: tuple | None = None):
    """A struct for a call of the kernel of ``kspec`` on columns [c0, c1) and rows
    [r0, r1): everything but A and dst.

    ``K`` is the K of one position (a GEMM has one); the kernel's optional position
    and outer loops are off (one position at offset 0, one block of rows). ``cells``:
    the residual tables (head, entries) the call reads, where not ``packed``'s own (a
    convolution's call that reads part of the window: ``gemm_pack.residual_part``).
    """
    kspec.check_call(r1 - r0, K, c1 - c0)
    s = ffi.new("struct i8j_gemm_args *")
    k_groups, rem = k_split(K)
    s.lda, s.ldc, s.b_tile_stride = lda, ldc_bytes, packed.tile_stride
    s.k_groups, s.k_tail_back = k_groups, (4 - rem) if rem else 0
    s.k_tail_shift = (4 - rem) * 8 if rem else 0
    s.m, s.n = r1 - r0, c1 - c0
    s.outer = 1
    s.b = _at(packed.data, (c0 // packed.tile_n) * packed.tile_stride)
    if kspec.residual:  # the cells of the call's first tile on
        head, entries = cells or (packed.res_head, packed.res_entries)
        if head is None or head.shape[1] != 1 + kspec.nr:
            raise RuntimeError(f"internal: {kspec.name} reads residual cells that these packed weights lack")
        s.res_head = _at(head, (c0 // packed.tile_n) * head.strides[0])
        s.res_entries = _at(entries)
    set_output_args(s, out, c0, r0)
    return s


def set_output_args(s, out: OutputArgs, c0: int, r0: int) -> None:
    """The output stage's fields of a kernel's struct ``s`` (``jit.output.args_cdef_fields``)
    for a chunk whose first column is ``c0`` and first row ``r0``."""
    s.col_comp = _at(out.col_comp, 4 * c0)
    s.row_comp = _at(out.row_comp, 4 * r0)
    for name in ("scale", "bias", "dst_zp"):
        operand = getattr(out, name)
        setattr(s, name, ffi.NULL if operand is None else _at(operand.array, _offset(operand, c0, r0)))
    s.dst_scale_inv = out.dst_scale_inv
    for i in range(MAX_POST_OPS):
        s.po_scale[i] = out.po_scale[i] if i < len(out.po_scale) else 1.0
        s.po_zp[i] = out.po_zp[i] if i < len(out.po_zp) else 0.0
        operand = out.po_src.get(i)
        s.po_src[i] = ffi.NULL if operand is None else _at(operand.array, _offset(operand, c0, r0))
        s.po_ld[i] = 0 if operand is None else operand.ld


def kernel_of(kspec):
    """The GEMM kernel of ``kspec`` from the kernel cache (generated on a miss), with its
    spec in ``meta["kspec"]`` for the drivers."""
    from jit import cache
    from jit.gemm_kernel import generate

    kernel = cache.get_kernel(("gemm", kspec), lambda: generate(kspec))
    kernel.meta["kspec"] = kspec
    return kernel


def prefetch_ahead_bytes() -> int:
    """How far ahead of the K loop a kernel that prefetches B ahead (few rows a thread,
    a convolution's big weight tiles) fetches it: 4096 bytes, or 0 (no prefetch) on AMD.

    Emerald Rapids: 4096 beat 1024, 2048 and 8192 (and none). Zen 4, one thread, every
    path: none beat every distance; its hardware prefetchers keep up with B's one stream,
    and the extra loads only cost (inner product 1x1000x2048 0.82 -> 0.99 of oneDNN,
    1x4096x4096 0.78 -> 0.93, 8x4096x4096 1.01 -> 1.07; ResNet-50's 3x3 layers within 1%).
    """
    from runtime.cpu import cpu_info

    return 0 if cpu_info().vendor in _AMD else 4096


_AMD = ("AuthenticAMD", "HygonGenuine")


def shifts_s8_a_once(path) -> bool:
    """Whether a GEMM of an s8 A and several column tiles shifts A to u8 once per call
    (numpy, into a buffer of its plan) and runs the u8 kernel, rather than the s8 kernel
    xoring each broadcast of A with 0x80: everywhere but on AMD's VNNI path.

    Emerald Rapids, VNNI and AVX2: the shift gained 6-19%. Zen 4 (one-off and packed
    ``Gemm``, 256^3 to 1024^3, 64x1024x1024, 3136x64x576): on the VNNI path the xor runs
    beside VPDPBUSD at no cost, and the shift lost up to 7% on one thread and up to 25%
    on two (the other core reads the shifted copy from this one's cache); on ``avx2`` it
    gained 2-6% on one thread, on ``avx512_core`` nothing either way."""
    from runtime.cpu import cpu_info

    return path.kind != "vnni" or cpu_info().vendor not in _AMD


def thread_chunks(kspec, M: int, N: int, K: int, threads: int) -> list:
    """How an ``M x N x K`` product splits between threads: (c0, c1, r0, r1) each.

    Threads take ranges of column tiles, or rows in whole blocks when there are fewer
    tiles than threads (so only the last chunk has a row remainder).
    """
    tile_n = kspec.tile_n
    tiles = -(-N // tile_n)
    threads = 1 if M * N * K < SMALL_WORK else threads
    if tiles >= threads or M < 2 * kspec.mr:
        return [(b * tile_n, min(N, e * tile_n), 0, M) for b, e in split(tiles, threads)]
    return [(0, N, b, e) for b, e in split(M, threads, kspec.mr)]


def tuned_spec(kspec, M: int, N: int, K: int, threads: int):
    """``kspec`` with the B prefetch that suits the rows a thread runs: the next column
    tile into L2, or the current one ahead of the K loop into L1, or neither.

    Measured (avx512_core_vnni, one thread): with a few dozen to a few hundred rows per
    thread, each column tile's B comes from L3 at the first row block, and fetching it
    during the previous tile's row blocks gains 4-10% (64x4096x4096); with fewer rows the
    extra stream competes with B's own (M=8: -15%), and prefetching B ahead of the K loop
    gains 2-6% instead (M=4 N=K=4096, M=32 2048->1000; on Intel: see
    :func:`prefetch_ahead_bytes`); with many it only costs slots. A primitive that knows
    its shape asks for this spec when it is created, so the kernel it generates is the
    one that runs.
    """
    from dataclasses import replace

    rows = max(r1 - r0 for _, _, r0, r1 in thread_chunks(kspec, M, N, K, threads))
    nxt = 8 * kspec.mr <= rows <= 48 * kspec.mr
    ahead = prefetch_ahead_bytes() if rows < 8 * kspec.mr else 0
    return replace(kspec, prefetch_next=nxt, prefetch_ahead=ahead)


def make_plan(kernel, packed, M: int, N: int, K: int, lda: int, ldc_bytes: int, out: OutputArgs,
              threads: int) -> Plan:
    """The per-thread structs for an ``M x N x K`` product (A rows ``lda`` bytes apart).

    The kernel may be swapped for its variant with the B prefetch of this shape
    (:func:`tuned_spec`; none where its primitive asked for that one at creation): the
    plan's ``kernel`` is the one that runs.
    """
    kspec = kernel.meta["kspec"]
    dst_bytes = kspec.output.dst_bytes
    tuned = tuned_spec(kspec, M, N, K, threads)
    if tuned != kspec:
        kernel = kernel_of(tuned)
    chunks = thread_chunks(tuned, M, N, K, threads)
    structs, offsets, firsts = [], [], []
    for c0, c1, r0, r1 in chunks:
        structs.append(new_args(kernel.meta["kspec"], packed, K, lda, ldc_bytes, out, c0, c1, r0, r1))
        offsets.append((r0 * lda, r0 * ldc_bytes + c0 * dst_bytes))
        firsts.append((c0, r0))
    keep = (packed, out)  # the structs hold raw addresses into these
    return Plan(kernel, structs, offsets, firsts, keep, CallPlan([[(kernel.function, s)] for s in structs]))


def point(plan: Plan, a: np.ndarray, dst: np.ndarray, a_offset: int = 0, dst_offset: int = 0) -> None:
    """The plan's structs at A and the dst (at the given byte offsets)."""
    a_ptr, c_ptr = pointer_to(a) + a_offset, pointer_to(dst) + dst_offset
    for s, (a_off, c_off) in zip(plan.structs, plan.offsets):
        s.a = a_ptr + a_off
        s.c = c_ptr + c_off


def run(plan: Plan, a: np.ndarray, dst: np.ndarray, a_offset: int = 0, dst_offset: int = 0) -> None:
    """One kernel call per chunk, with A and the dst at the given byte offsets."""
    point(plan, a, dst, a_offset, dst_offset)
    plan.calls.run()


def refresh(written: dict, name: str, key, write) -> None:
    """Call ``write()`` unless ``written`` records that its buffer already holds the values
    of ``key`` (the per-column vectors a plan points at: a network calls a layer with the
    same scales every time). ``key`` None: always write."""
    if key is None or written.get(name) != key:
        write()
        written[name] = key


class GemmKernels:
    """Mixin of the primitives that run GEMM kernels chosen per execution: the kernels
    (``pd._kernel_for(choice)``), kept per path, and impl_info() naming those that ran."""

    def _kernel(self, choice, output=None):
        """``output``: the stage to run, where not the descriptor's (``primitives.pipeline.dst_stage``)."""
        kernels = self.__dict__.setdefault("_kernels", {})
        key = (choice.path, choice.nr, choice.residual, output)
        if key not in kernels:
            kernels[key] = self.pd._kernel_for(choice, output)
        return kernels[key]

    def impl_info(self) -> dict:
        """The descriptor's choice, plus the kernels executions actually ran: on a non-VNNI
        ISA the exact policy picks the fast or the widening kernel once the weights are known."""
        ran = [k.meta["kspec"].name for k in self.__dict__.get("_kernels", {}).values()]
        return dict(self.pd.impl_info(), **({"kernels_run": ran} if ran else {}))
