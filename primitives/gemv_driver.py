"""Calling the in-place kernels (``jit.gemv_kernel``): a few rows of A times weights
given at every call as columns of K bytes or rows of N, unpacked.

:class:`GemvPlan` holds one argument struct per thread (a range of whole column blocks,
or of a batch's items), made once; :meth:`GemvPlan.run` points them at this call's A,
weights and dst and makes one kernel call per thread.

Example::

    >>> import numpy as np
    >>> from jit.dot import fast_path
    >>> from jit.gemv_kernel import gemv_kernel
    >>> from jit.output import OutputSpec
    >>> from primitives.gemm_driver import OutputArgs
    >>> from runtime.isa import cpu_supports
    >>> a = np.arange(6, dtype=np.uint8).reshape(1, 6)
    >>> w_nk = np.ones((3, 6), np.int8)  # 3 columns of K = 6 bytes (w_nk.T: the K x N view)
    >>> c = np.zeros((1, 3), np.int32)
    >>> if cpu_supports("avx512_core_vnni"):
    ...     kernel = gemv_kernel(fast_path("avx512_core_vnni"), False, False, OutputSpec(col_comp=False))
    ...     GemvPlan(kernel, 1, 3, 6, 6, 6, 12, OutputArgs(col_comp=None), 1).run(a, w_nk.T, c)
    ...     assert c.tolist() == [[15, 15, 15]]
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jit.gemv_kernel import ARGS_CDEF, SIGNATURE, shifts_s8, takes
from primitives.gemm_driver import SMALL_WORK, OutputArgs, set_output_args
from runtime.ffi import declare, ffi, pointer_to
from runtime.pool import CallPlan
from runtime.threads import split

# (at import: cffi parses a struct's text the first time, 2-3 ms, which a first creation
# from the disk cache would otherwise pay)
declare(ARGS_CDEF, (SIGNATURE, "struct i8j_gemv_args *"))

# Rows of A up to which reading the weights in place beats packing them (the columns
# kernel reads every weight column again for each row, from L1/L2; the rows kernel holds
# at most 4): docs/performance.md.
IN_PLACE_ROWS = 4
# The rows kernel walks K down a block of 64 bytes of every weight row. Rows a multiple
# of 2048 bytes apart fall into a few cache sets, which the walk overflows: on the Zen 4,
# 1 x K x N with N = 2048, 4096, 8192 ran at 0.6-0.9 of packing B at every call (even at
# K = 128), where N = 1024, 1280, 1536, 3072 ran 1.3-2.4 times faster than packing.
ALIASING_ROW_BYTES = 2048


# One row of A times weights' rows that alias, or span 8 MB or more (a walk down all of
# K then touches more pages than the TLB holds): K in chunks of CHUNK_ROWS rows, each
# chunk's product added into an s32 sum (the rows kernel's batch loop, its items' dst
# the same). On the Zen 4, one / two threads, a GEMM of 1 x 4096 x 4096: 0.51 / 0.29
# ms, against 1.90 / 0.95 packing B and 2.4 / 1.1 walking all of K (chunks of 16 rows:
# 0.78 / 0.44); 1 x 4000 x 4000 0.45 / 0.25 against 1.39 / 0.79 walking all of K. Below
# 8 MB walking all of K ran as fast or faster (1 x 1000 x 4096: 103 / 62 us, in chunks
# 116 / 82). A GEMM of two rows walks a row at a time (2 x 4096 x 4096: 0.96 / 0.54 ms
# against 2.1 / 1.0 packed); 3-4 rows in chunks of 16 gained on one thread and lost on
# two: they walk all of K, but a row at a time in chunks over 8 MB of aliasing rows
# (primitives.gemm's _in_place).
CHUNK_ROWS = 8
CHUNKED_BYTES = 8 << 20


def rows_alias(k: int, ldw: int) -> bool:
    """Whether the rows kernel's walk down K rows ``ldw`` bytes apart overflows the cache
    sets they share (see ALIASING_ROW_BYTES; a walk of up to 15 rows does not)."""
    return k >= 2 * CHUNK_ROWS and ldw % ALIASING_ROW_BYTES == 0


def partial_columns(n: int) -> int:
    """The length of a :class:`ChunkedRows` partial sums' vector for ``n`` columns: whole
    64-column vectors (the output stage reads whole vectors)."""
    return -(-n // 64) * 64


def walks_in_chunks(k: int, ldw: int) -> bool:
    """Whether the rows kernel reads weights of K = ``k`` rows ``ldw`` bytes apart in
    chunks of K (see CHUNK_ROWS)."""
    return rows_alias(k, ldw) or k >= 2 * CHUNK_ROWS and k * ldw >= CHUNKED_BYTES


def runs_in_place(path, rows: int, k: int, n: int | None = None, comp: bool = False, output=None) -> bool:
    """Whether a product of ``rows`` rows with weights of K = ``k`` runs in place: given
    as columns of contiguous K bytes (``n`` None: an OC x K inner product's, a ``ba``
    matmul's), or as rows of ``n`` contiguous bytes (an ``ab`` matmul's; not where they
    alias in the caches: then packed, or, for one row, read in chunks: ChunkedRows)."""
    if n is not None and rows_alias(k, n):
        return False
    return rows <= IN_PLACE_ROWS and takes(path, k, n, rows, comp, output)


def reads_in_place(w_kn: np.ndarray, layout: str) -> bool:
    """Whether the K x N view ``w_kn`` holds its bytes as the ``layout`` kernel reads
    them: each column's K bytes contiguous ("columns"), or each row's N ("rows")."""
    axis = 0 if layout == "columns" else 1
    return w_kn.shape[axis] == 1 or w_kn.strides[axis] == 1


class GemvPlan:
    """The per-thread structs of an ``M x N x K`` product (A rows ``lda`` bytes apart,
    the weights' columns, or rows, ``ldw`` apart as the kernel's layout says, dst rows
    ``ldc_bytes`` apart), made once; or of ``items`` such products, A, the weights and
    dst ``strides`` (bytes) apart from one to the next, which one call runs one after
    another (a batch without a binary post-op: its operands' rows would be the item's).
    Threads take ranges of the items where there are as many and each has its own dst,
    else ranges of columns (items that add into one dst: a K split into chunks)."""

    def __init__(self, kernel, M: int, N: int, K: int, lda: int, ldw: int, ldc_bytes: int, out: OutputArgs,
                 threads: int, items: int = 1, strides: tuple = (0, 0, 0), work: int | None = None) -> None:
        spec = kernel.meta["gemv"]
        self.kernel, self.out = kernel, out
        lanes, rows = spec.lanes, spec.layout == "rows"
        if rows and M != spec.rows or not takes(spec.path, K, N if rows else None, M, spec.comp, spec.output) \
                or items < 1:  # (the kernel's batch loop runs at least once)
            raise RuntimeError(f"internal: {spec.name} does not run M={M}, N={N}, K={K}")
        step = spec.k_step
        whole, tail = (K // 4, K % 4) if rows else (K // step * step, K % step)
        blocks = -(-N // lanes)
        # (``work``: the multiply-adds of the product this plan is a piece of, whose
        # pieces must split their columns alike: one thread's calls then wait for no other's)
        threads = 1 if (work or items * M * N * K) < SMALL_WORK else threads
        dst_bytes = spec.output.dst_bytes
        a_item, w_item, c_item = strides
        parts = [((i0, i1), (0, blocks)) for i0, i1 in split(items, threads)] if items >= threads and c_item else \
            [((0, items), b) for b in split(blocks, threads)]
        self.structs, self.offsets, self.chunks = [], [], []
        for (i0, i1), (b0, b1) in parts:
            c0, c1 = b0 * lanes, min(N, b1 * lanes)
            s = ffi.new("struct i8j_gemv_args *")
            s.lda, s.ldw, s.ldc, s.m, s.n = lda, ldw, ldc_bytes, M, c1 - c0
            s.items, s.a_item, s.w_item, s.c_item = i1 - i0, a_item, w_item, c_item
            s.k_main, s.k_tail, s.tail_bytes = whole, tail, (1 << tail) - 1
            for i in range(8):
                s.tail_dwords[i] = -1 if 4 * i < tail else 0
            set_output_args(s, out, c0, 0)
            self.structs.append(s)
            self.offsets.append((i0 * a_item, i0 * w_item + (c0 if rows else c0 * ldw), i0 * c_item + c0 * dst_bytes))
            self.chunks.append((c0, 0))
        self.calls = CallPlan([[(kernel.function, s)] for s in self.structs])

    def point(self, a: np.ndarray, w: np.ndarray, dst: np.ndarray, zp: int = 0, at: tuple = (0, 0),
              dst_at: int = 0) -> None:
        """The structs at this call's arrays (``w``: its first byte is the first column's
        first; ``at``: bytes past a's and w's first, ``dst_at`` past dst's) and source zero
        point ``zp``: the kernel subtracts ``ao`` times each column's sum, ``ao`` the zero
        point (+ 128 for an s8 source read as u8: ``shifts_s8``)."""
        spec = self.kernel.meta["gemv"]
        ao = zp + (128 if spec.s8_src and shifts_s8(spec.path) else 0)
        a_ptr, w_ptr, c_ptr = pointer_to(a) + at[0], pointer_to(w) + at[1], pointer_to(dst) + dst_at
        ao = (ao + 2**31) % 2**32 - 2**31  # (wraps, as the kernel's sums do)
        for s, (a_off, w_off, c_off) in zip(self.structs, self.offsets):
            s.a, s.w, s.c, s.ao = a_ptr + a_off, w_ptr + w_off, c_ptr + c_off, ao

    def fields(self) -> list:
        """(struct, A's, the weights' and the dst's offsets) of each struct: where
        :meth:`point` with ``at`` and ``dst_at`` of 0 points them, past the arrays' first
        bytes (for a replay moved to new arrays of the same layout, which keeps ``zp``)."""
        return [(s,) + offsets for s, offsets in zip(self.structs, self.offsets)]

    def run(self, a: np.ndarray, w: np.ndarray, dst: np.ndarray, zp: int = 0) -> None:
        """:meth:`point`, then one kernel call per thread."""
        self.point(a, w, dst, zp)
        self.calls.run()


def chunk_kernels(path, s8_src: bool, comp: bool, output) -> tuple:
    """The three rows kernels of one row walking K in chunks (:class:`ChunkedRows`): the
    first chunk's s32 store, the middle chunks' s32 sum, the last chunk's ``output``
    stage adding the partial sums."""
    from jit.gemv_kernel import gemv_kernel
    from jit.output import OutputSpec

    sums = (OutputSpec(col_comp=False), OutputSpec(col_comp=False, accumulate=True))
    return tuple(gemv_kernel(path, s8_src, comp, spec, "rows", 1) for spec in sums) + \
        (gemv_kernel(path, s8_src, comp, output, "rows", 1, partial=True),)


class ChunkedRows:
    """One row of A times weights given as K rows of N bytes, K in chunks of
    :data:`CHUNK_ROWS` (:func:`walks_in_chunks`), threads taking ranges of columns:

        partial  = row . chunk 0                      (``first``: an s32 store)
        partial += row . chunk i, 0 < i < n - 1       (``middle``: one call, its batch loop)
        dst      = stage(row . the rest + partial)    (``last``: the output stage, whose
                                                       col_comp adds ``partial``)

    ``partial`` is an int32 vector of the padded columns (the stage reads whole vectors),
    which each thread writes and reads in its own columns only. The kernels' plans split
    their columns alike (one ``work``), so the calls of one thread never wait for
    another's. The interface of :class:`GemvPlan` (``structs`` and ``chunks``: the last
    call's, whose output stage they feed; ``kernel``: its kernel)."""

    def __init__(self, kernels: tuple, N: int, K: int, ldw: int, ldc_bytes: int, out: OutputArgs, threads: int,
                 partial: np.ndarray) -> None:
        first, middle, last = kernels
        n = K // CHUNK_ROWS
        if n < 2 or partial.dtype != np.int32 or partial.size < partial_columns(N):
            raise RuntimeError(f"internal: {K} rows in chunks of {CHUNK_ROWS}, or the partial sums' buffer")
        ch, work = CHUNK_ROWS, N * K
        rest = K - (n - 1) * ch
        s32 = OutputArgs(col_comp=None)
        self.pieces = [(GemvPlan(first, 1, N, ch, ch, ldw, 4 * N, s32, threads, work=work), 0, partial)]
        if n > 2:
            self.pieces.append((GemvPlan(middle, 1, N, ch, ch, ldw, 4 * N, s32, threads, n - 2, (ch, ch * ldw, 0),
                                         work=work), ch, partial))
        final = GemvPlan(last, 1, N, rest, rest, ldw, ldc_bytes, dataclasses.replace(out, col_comp=partial),
                         threads, work=work)
        self.pieces.append((final, (n - 1) * ch, None))
        self.ldw = ldw
        self.kernel, self.structs, self.chunks = last, final.structs, final.chunks
        self.calls = CallPlan.joined([plan.calls for plan, _, _ in self.pieces])

    def point(self, a: np.ndarray, w: np.ndarray, dst: np.ndarray, zp: int = 0, at: tuple = (0, 0),
              dst_at: int = 0) -> None:
        """Every call's struct at this call's arrays (as :meth:`GemvPlan.point`)."""
        for plan, k0, into in self.pieces:
            plan.point(a, w, dst if into is None else into, zp, (at[0] + k0, at[1] + k0 * self.ldw),
                       dst_at if into is None else 0)

    def run(self, a: np.ndarray, w: np.ndarray, dst: np.ndarray, zp: int = 0) -> None:
        """:meth:`point`, then the calls, one hand-off."""
        self.point(a, w, dst, zp)
        self.calls.run()
