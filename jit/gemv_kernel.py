"""A few rows times weights read in place: the small-M kernels for runtime weights.

A GEMM kernel reads B packed (``gemm_pack``); weights given at every call (an inner
product's OC x K rows, a matmul's weights: attention's keys and values at decode) must
then be packed at every call, and with one or two rows of A the packing is most of the
call (1 x 2048 -> 1000: 155 us against oneDNN's 32, which reads the rows in place).
These kernels read them where they are, in either layout, for 1-4 rows of A.

**Columns of K** (``layout="columns"``, ``jit.gemv_columns``): each output column is a
dot product of an A row with one weight column, K contiguous, ``ldw`` bytes between
columns::

    for each block of ``lanes`` columns (16 on AVX-512, 8 on AVX2), for each row of A:
        for each half of 8 columns (AVX-512: two):
            acc[j] = 0 (a vector per column j)       sums[j] = 0 (with compensation)
            for each vector of K bytes (widened: half a vector), then the rest (masked):
                x = A row bytes (s8: xor 0x80, to u8 = A + 128; widened: extended to s16)
                acc[j] += step(x, column j's bytes)      sums[j] += step(ones, ...)
            acc[j] -= ao * sums[j]      (ao: the source zero point, + 128 for s8; wraps)
            the 8 vectors added across their lanes (VPUNPCK*DQ/QDQ + VPADDD, then the
            128-bit halves): one vector of the 8 columns' sums
        output stage (jit.output) on the block's columns: scales, bias, post-ops, store

A partial last block reads its last valid column again in place of the missing ones
(their lanes are masked off at the store), so no load leaves the weights. The K tail
is a masked load: byte masks on AVX-512; on AVX2 (VPMASKMOVD) dword masks, so that
path takes K % 4 == 0 only (a caller packs the others). The compensation's column sums
come from the same loads (AVX-512: in the K loop) or from a second pass over the
block's columns (AVX2, whose 16 registers do not hold both sets).

**Rows of N** (``layout="rows"``, ``jit.gemv_rows``: a matmul's ``ab`` weights, K x N,
``ldw`` bytes between rows): the four rows of a K group interleaved in registers, as the
packing kernel stores them, and every row of A (``rows``: the code holds them all) takes
them at once::

    for each block of a vector of each row's bytes (widened: half a vector, extended):
        for each group of 4 rows of the weights (then the last 1-3, the rest zero):
            4 loads (masked past N), VPUNPCKL/HBW then VPUNPCKL/HWD: 4 vectors whose
            dwords are 4 columns' 4 K values (per 128 bits: columns 0-3, 4-7, 8-11,
            12-15; widened: VPUNPCKL/HWD, 2 vectors of each column's pairs of rows)
            acc[i][g] += step(A row i's 4 bytes broadcast, vector g); sums[g] likewise by ones
        acc[i][g] -= ao * sums[g]; the 128-bit blocks put back in column order
        output stage on the rows x 4 (widened: 2) vectors

AVX2 reads the block's last partial dword of a row with VPMASKMOVD, so that path takes
N % 4 == 0 only.

Both loop over a batch's items (``items``; A, the weights and dst advanced by their
strides): attention's heads at decode in one call.

The step is the path's (``jit.dot``): VPDPBUSD, exact; VPMADDUBSW (``faithful`` without
VNNI: A's bytes pair with the weights' as they do in the packed layout, (k, k+1) for
even k, so the saturation is the packed kernels'); or widened (``exact`` without VNNI:
A and the weights sign- or zero-extended to s16, VPMADDWD; an s8 source is taken as it
is, so ``ao`` is the zero point alone).

Example::

    >>> import numpy as np
    >>> spec = GemvSpec(fast_path("avx512_core_vnni"), s8_src=False, comp=False,
    ...                 output=OutputSpec(col_comp=False))
    >>> generate(spec).name
    'gemv_u8s8s32_avx512_core_vnni'
    >>> generate(replace(spec, layout="rows", rows=2)).name
    'gemv_rows2_u8s8s32_avx512_core_vnni'
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from jit.dot import Path, fast_path
from jit.output import OUTPUT_FIELDS, OutputSpec, args_cdef_fields, output_registers_needed

ARGS_CDEF = """
struct i8j_gemv_args {
    void *a; int64_t lda;                 /* u8 or s8 rows */
    void *w; int64_t ldw;                 /* s8 columns of K bytes (or rows of N), ldw bytes apart */
    void *c; int64_t ldc;                 /* dst rows */
    int64_t m; int64_t n;
    int64_t k_main;                       /* columns: K's whole steps (spec.k_step), bytes; rows: K groups of 4 */
    int64_t k_tail;                       /* columns: K mod spec.k_step; rows: K mod 4 (0: none) */
    uint64_t tail_bytes;                  /* AVX-512: the tail's byte mask */
    int32_t tail_dwords[8];               /* AVX2: the tail's dword mask (-1 valid, 0 not) */
    int32_t ao; int32_t pad;              /* the compensation's factor (zero point, + 128: shifts_s8) */
    int64_t items;                        /* a batch's items, one after another (1: one product) */
    int64_t a_item; int64_t w_item; int64_t c_item;  /* their strides, bytes */
    void *a_cur; void *c_cur; void *w_cur; int64_t m_left;  /* the kernel's own */
    int64_t items_left; void *a_base; void *w_base; void *c_base;  /* the kernel's own: this item's */
    %s
};
""" % args_cdef_fields()
SIGNATURE = "void (*)(struct i8j_gemv_args *)"
FIELDS = ("a", "lda", "w", "ldw", "c", "ldc", "m", "n", "k_main", "k_tail", "tail_bytes", "tail_dwords", "ao",
          "items", "a_item", "w_item", "c_item", "a_cur", "c_cur", "w_cur", "m_left", "items_left", "a_base",
          "w_base", "c_base") + OUTPUT_FIELDS
HALF = 8  # columns a K loop of the columns kernel carries
# The steps (jit.dot): VPDPBUSD, VPMADDUBSW (faithful: saturating as the packed path's),
# and the widening one (exact without VNNI).
STEPS = ("vnni", "maddubsw", "widen")
MAX_ROWS = 4  # rows of A the rows kernel holds


def args_offsets() -> dict[str, int]:
    from runtime.ffi import declare, struct_offsets

    declare(ARGS_CDEF, (SIGNATURE, "struct i8j_gemv_args *"))
    return struct_offsets(ARGS_CDEF, "struct i8j_gemv_args", FIELDS)


@dataclass(frozen=True)
class GemvSpec:
    """What shapes the code (the cache key): the path (its step), the source's type,
    whether the column sums are subtracted (``comp``: a zero point, or an s8 source but
    where widened), the output stage (whose ``col_comp`` is off: the kernel subtracts its
    own), the layout and the rows kernel's rows."""

    path: Path
    s8_src: bool
    comp: bool
    output: OutputSpec
    layout: str = "columns"  # "columns" (K contiguous per column) or "rows" (N contiguous per row)
    rows: int = 1  # the rows kernel's rows of A (every call's m); the columns kernel loops over any m

    def __post_init__(self):
        if self.path.kind not in STEPS:  # pragma: no cover - Path's kinds are these
            raise ValueError(f"path: {self.path.name}; the in-place kernels run {', '.join(STEPS)}")
        # (the kernel subtracts its own compensation; col_comp, on one row of the rows
        # kernel, adds the s32 sum of K's earlier chunks: see gemv_driver.ChunkedRows)
        if self.output.row_comp or self.output.col_comp and (self.layout, self.rows) != ("rows", 1):
            raise ValueError("output: row_comp off, col_comp only for one row of the rows kernel")
        if self.layout not in ("columns", "rows"):
            raise ValueError(f"layout: expected 'columns' or 'rows', got {self.layout!r}")
        most = rows_max(self.path, self.comp, self.output)
        if self.layout == "rows" and not 1 <= self.rows <= most:
            raise ValueError(f"rows: the rows kernel of {self.path.name} holds 1..{most} rows of A, not {self.rows}")
        # (the columns kernel's stage has all but its result and 3-4 constants)
        kept = 4 + (self.path.kind == "maddubsw")
        if self.layout == "columns" and output_registers_needed(self.path, self.output, 1) > self.path.registers - kept:
            raise ValueError("output: the stage needs more registers than the columns kernel leaves it")

    @property
    def k_step(self) -> int:
        """Bytes of K a step of the K loop takes: a vector of A's bytes (VPDPBUSD), half of
        one (widened to s16), or a group of 4 rows (the rows kernel)."""
        if self.layout == "rows":
            return 4
        return self.path.vector_bytes // (2 if self.path.kind == "widen" else 1)

    @property
    def lanes(self) -> int:
        """Columns a block: one output vector (columns), or four (rows; widened two)."""
        return self.path.lanes * (row_vectors(self.path) if self.layout == "rows" else 1)

    @property
    def name(self) -> str:
        src = "s8" if self.s8_src else "u8"
        comp = "_comp" if self.comp else ""
        rows = f"rows{self.rows}_" if self.layout == "rows" else ""
        widen = "_widen" if self.path.kind == "widen" else ""
        partial = "_partial" if self.output.col_comp else ""
        acc = "_acc" if self.output.accumulate else ""  # (dst += the sums)
        return f"gemv_{rows}{src}s8{self.output.dst_dt}_{self.path.isa}{widen}{comp}{acc}{partial}"


def rows_max(path: Path, comp: bool, output: OutputSpec) -> int:
    """Rows of A the rows kernel of ``path`` holds (4 accumulators each) beside its
    loop's registers (4 weight vectors, 2 temporaries, A's broadcast, AVX2's dword mask;
    with compensation the sums, ones and 0x80) and the output stage's (with ones and
    0x80 kept for the next block)."""
    nv, widen, madd = row_vectors(path), path.kind == "widen", path.kind == "maddubsw"
    kept = ((1 if widen else 2) if comp else 0) + madd  # ones (and 0x80); VPMADDUBSW's s16 ones
    loop = 4 + 2 + 1 + 2 * widen + 2 * madd + (path.bits == 256) + (nv + kept if comp else 0)
    stage = output_registers_needed(path, replace(output, col_comp=False), nv) + kept
    return max(0, min(MAX_ROWS, (path.registers - max(loop, stage)) // nv))


def shifts_s8(path: Path) -> bool:
    """Whether the kernels of ``path`` read an s8 source as u8 (A + 128, the 128 taken off
    with the column sums): VPDPBUSD and VPMADDUBSW do; widened, A is sign-extended as it
    is, and only a zero point needs the sums."""
    return path.kind != "widen"


def row_vectors(path: Path) -> int:
    """Output vectors a block of the rows kernel: 4 (VPDPBUSD: a vector of each row's
    bytes), or 2 (widened: half of one, sign-extended)."""
    return 2 if path.kind == "widen" else 4


def takes(path: Path, k: int, n: int | None = None, rows: int = 1, comp: bool = False,
          output: OutputSpec | None = None) -> bool:
    """Whether an in-place kernel of ``path`` runs this product: columns of K (``n``
    None) for any K on AVX-512, whole dwords on AVX2; rows of N for as many ``rows`` as
    the kernel holds, any N on AVX-512, whole dwords on AVX2."""
    if path.kind not in STEPS:
        return False
    if n is None:
        return path.bits == 512 or k % 4 == 0
    return (path.bits == 512 or n % 4 == 0) and rows <= rows_max(path, comp, output or OutputSpec(col_comp=False))


def gemv_kernel(path: Path, s8_src: bool, comp: bool, output: OutputSpec, layout: str = "columns", rows: int = 1,
                partial: bool = False):
    """The kernel from the caches (generated on a miss), its spec in ``meta["gemv"]``;
    ``partial``: its output stage first adds an s32 vector per column (one row of the rows
    kernel: the sum of K's earlier chunks)."""
    from jit import cache

    spec = GemvSpec(path, s8_src, comp, replace(output, col_comp=partial), layout, rows if layout == "rows" else 1)
    kernel = cache.get_kernel(("gemv", spec), lambda: generate(spec))
    kernel.meta["gemv"] = spec
    return kernel


def begin_items(A):
    """Both kernels' start of a batch's items (``A``: an args field): the first item's A,
    weights and dst, then, at the label returned (each item's start), w_cur, r13 (the
    columns left) and r14 (the block's first column * 4) at its first block."""
    from jit import asm

    for base, start in (("a_base", "a"), ("w_base", "w"), ("c_base", "c"), ("items_left", "items")):
        asm.MOV(asm.rax, A(start))
        asm.MOV(A(base), asm.rax)
    item = asm.Label()
    asm.LABEL(item)
    asm.MOV(asm.rax, A("w_base"))
    asm.MOV(A("w_cur"), asm.rax)
    asm.MOV(asm.r13, A("n"))
    asm.XOR(asm.r14.as_dword, asm.r14.as_dword)
    return item


def end_of_block(A, next_block, item, done, columns: int) -> None:
    """Both kernels' end of a column block (their w_cur already past it): r14 and r13
    past its ``columns``, the next block while any is left; then the next item's A,
    weights and dst, the next item while any is left; then the return."""
    from jit import asm

    asm.ADD(asm.r14, 4 * columns)
    asm.SUB(asm.r13, columns)
    asm.JG(next_block)
    for base, stride in (("a_base", "a_item"), ("w_base", "w_item"), ("c_base", "c_item")):
        asm.MOV(asm.rax, A(stride))
        asm.ADD(A(base), asm.rax)
    asm.DEC(asm.qword[A("items_left")[0]])
    asm.JNZ(item)
    asm.LABEL(done)
    asm.VZEROUPPER()
    asm.RETURN()


def generate(spec: GemvSpec):
    """Generate the kernel's code (PeachPy); see :func:`gemv_kernel`."""
    from jit import asm
    from jit.build import generate as build

    from jit.gemv_columns import emit_columns
    from jit.gemv_rows import emit_rows

    argument = asm.Argument(asm.ptr(asm.uint8_t), "args")
    emit = emit_rows if spec.layout == "rows" else emit_columns
    return build(spec.name, spec.path.isa, SIGNATURE, (argument,), lambda: emit(spec, argument),
                 meta={"spec": repr(spec)})


__all__ = ["GemvSpec", "gemv_kernel", "generate", "rows_max", "shifts_s8", "takes", "fast_path"]
