"""A few rows times weights read in place: the small-M kernel for runtime weights.

A GEMM kernel reads B packed (``gemm_pack``); weights given at every call (an inner
product's OC x K rows, a matmul's ``ba`` weights: attention's K at decode) must then be
packed at every call, and with one or two rows of A the packing is most of the call
(1 x 2048 -> 1000: 155 us against oneDNN's 32, which reads the rows in place). This
kernel reads them where they are: each output column is a dot product of an A row
with one weight column, K contiguous, ``ldw`` bytes between columns::

    for each block of ``lanes`` columns (16 on AVX-512, 8 on AVX2), for each row of A:
        for each half of 8 columns (AVX-512: two):
            acc[j] = 0 (a vector per column j)       sums[j] = 0 (with compensation)
            for each vector of K bytes, then the last K % vector bytes (masked):
                x = A row bytes (s8: xor 0x80, to u8 = A + 128)
                acc[j] += VPDPBUSD(x, column j's bytes)   sums[j] += VPDPBUSD(ones, ...)
            acc[j] -= ao * sums[j]      (ao: the source zero point, + 128 for s8; wraps)
            the 8 vectors added across their lanes (VPUNPCK*DQ/QDQ + VPADDD, then the
            128-bit halves): one vector of the 8 columns' sums
        output stage (jit.output) on the block's columns: scales, bias, post-ops, store

A partial last block reads its last valid column again in place of the missing ones
(their lanes are masked off at the store), so no load leaves the weights. The K tail
is a masked load: byte masks on AVX-512; on AVX2 (VPMASKMOVD) dword masks, so that
path takes K % 4 == 0 only (a caller packs the others). The compensation's column sums
come from the same loads (AVX-512: in the K loop) or from a second pass over the
block's columns (AVX2, whose 16 registers do not hold both sets); it is exact, as the
whole product is (VPDPBUSD does not saturate).

The step is the path's (``jit.dot``): VPDPBUSD; VPMADDUBSW (``faithful`` without VNNI:
A's bytes pair with the weights' as they do in the packed layout, (k, k+1) for even k,
so the saturation is the packed kernels'); or widened (``exact`` without VNNI: A and the
weights sign- or zero-extended to s16, VPMADDWD, half a vector of K a step).

**Rows of N** (``layout="rows"``: a matmul's ``ab`` weights, K x N, ``ldw`` bytes
between rows): the four rows of a K group interleaved in registers, as the packing
kernel stores them, and every row of A (``rows``, 1-4: the code holds them all) takes
them at once::

    for each block of 4 vectors of columns (64 on AVX-512, 32 on AVX2):
        for each group of 4 rows of the weights (then the last 1-3, the rest zero):
            4 loads (masked past N), VPUNPCKL/HBW then VPUNPCKL/HWD: 4 vectors whose
            dwords are 4 columns' 4 K values (per 128 bits: columns 0-3, 4-7, 8-11, 12-15)
            acc[i][g] += VPDPBUSD(A row i's 4 bytes broadcast, vector g); sums[g] likewise by ones
        acc[i][g] -= ao * sums[g]; the 128-bit blocks put back in column order
        output stage on the rows x 4 vectors

AVX2 reads the block's last partial dword of a row with VPMASKMOVD, so that path takes
N % 4 == 0 only.

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

from jit.dot import Path, emit_bytes, emit_ones_s16, emit_step, fast_path, vector_constant, vector_register
from jit.output import (OUTPUT_FIELDS, OutputContext, OutputSpec, args_cdef_fields, emit_output,
                        output_registers_needed)

ARGS_CDEF = """
struct i8j_gemv_args {
    void *a; int64_t lda;                 /* u8 or s8 rows */
    void *w; int64_t ldw;                 /* s8 columns of K bytes, ldw bytes apart */
    void *c; int64_t ldc;                 /* dst rows */
    int64_t m; int64_t n;
    int64_t k_main;                       /* columns: K's whole vectors, bytes; rows: K groups of 4 */
    int64_t k_tail;                       /* columns: K mod the vector bytes; rows: K mod 4 (0: none) */
    uint64_t tail_bytes;                  /* AVX-512: the tail's byte mask */
    int32_t tail_dwords[8];               /* AVX2: the tail's dword mask (-1 valid, 0 not) */
    int32_t ao; int32_t pad;              /* the compensation's factor (zero point, + 128 for s8) */
    void *a_cur; void *c_cur; void *w_cur; int64_t m_left;  /* the kernel's own */
    %s
};
""" % args_cdef_fields()
SIGNATURE = "void (*)(struct i8j_gemv_args *)"
FIELDS = ("a", "lda", "w", "ldw", "c", "ldc", "m", "n", "k_main", "k_tail", "tail_bytes", "tail_dwords", "ao",
          "a_cur", "c_cur", "w_cur", "m_left") + OUTPUT_FIELDS
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
    """What shapes the code (the cache key): the path (a VNNI one), the source's type,
    whether the column sums are subtracted (``comp``: an s8 source or a zero point) and
    the output stage (whose ``col_comp`` is off: the kernel adds its own)."""

    path: Path
    s8_src: bool
    comp: bool
    output: OutputSpec
    layout: str = "columns"  # "columns" (K contiguous per column) or "rows" (N contiguous per row)
    rows: int = 1  # the rows kernel's rows of A (every call's m); the columns kernel loops over any m

    def __post_init__(self):
        if self.path.kind not in STEPS:  # pragma: no cover - Path's kinds are these
            raise ValueError(f"path: {self.path.name}; the in-place kernels run {', '.join(STEPS)}")
        if self.output.col_comp or self.output.row_comp:
            raise ValueError("output: col_comp and row_comp off (the kernel subtracts its own compensation)")
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
        return self.path.lanes * (_row_vectors(self.path) if self.layout == "rows" else 1)

    @property
    def name(self) -> str:
        src = "s8" if self.s8_src else "u8"
        comp = "_comp" if self.comp else ""
        rows = f"rows{self.rows}_" if self.layout == "rows" else ""
        widen = "_widen" if self.path.kind == "widen" else ""
        return f"gemv_{rows}{src}s8{self.output.dst_dt}_{self.path.isa}{widen}{comp}"


def rows_max(path: Path, comp: bool, output: OutputSpec) -> int:
    """Rows of A the rows kernel of ``path`` holds (4 accumulators each) beside its
    loop's registers (4 weight vectors, 2 temporaries, A's broadcast, AVX2's dword mask;
    with compensation the sums, ones and 0x80) and the output stage's (with ones and
    0x80 kept for the next block)."""
    nv, widen, madd = _row_vectors(path), path.kind == "widen", path.kind == "maddubsw"
    kept = ((1 if widen else 2) if comp else 0) + madd  # ones (and 0x80); VPMADDUBSW's s16 ones
    loop = 4 + 2 + 1 + 2 * widen + 2 * madd + (path.bits == 256) + (nv + kept if comp else 0)
    stage = output_registers_needed(path, replace(output, col_comp=False), nv) + kept
    return max(0, min(MAX_ROWS, (path.registers - max(loop, stage)) // nv))


def _row_vectors(path: Path) -> int:
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


def gemv_kernel(path: Path, s8_src: bool, comp: bool, output: OutputSpec, layout: str = "columns", rows: int = 1):
    """The kernel from the caches (generated on a miss), its spec in ``meta["gemv"]``."""
    from jit import cache

    args_offsets()  # declares the struct for callers
    spec = GemvSpec(path, s8_src, comp, replace(output, col_comp=False), layout, rows if layout == "rows" else 1)
    kernel = cache.get_kernel(("gemv", spec), lambda: generate(spec))
    kernel.meta["gemv"] = spec
    return kernel


def generate(spec: GemvSpec):
    """Generate the kernel's code (PeachPy); see :func:`gemv_kernel`."""
    from jit import asm
    from jit.build import generate as build

    argument = asm.Argument(asm.ptr(asm.uint8_t), "args")
    emit = _emit_rows if spec.layout == "rows" else _emit
    return build(spec.name, spec.path.isa, SIGNATURE, (argument,), lambda: emit(spec, argument),
                 meta={"spec": repr(spec)})


def _emit(spec: GemvSpec, argument) -> None:
    from jit import asm
    from jit.asm import (ADD, CMP, DEC, JG, JNZ, JZ, LABEL, MOV, NEG, SHL, SHR, TEST, XOR, Label, rax, rbp, rbx,
                         rcx, rdi, rdx, rsi, r8, r9, r10, r11, r12, r13, r14, r15)

    path = spec.path
    off = args_offsets()
    A = lambda f: [rdi + off[f]]  # noqa: E731
    wide, widen = path.bits == 512, path.kind == "widen"
    lanes = path.lanes
    V = lambda i: vector_register(path, i)  # noqa: E731
    halves = lanes // HALF
    # Vector registers: the 8 accumulators, the sums (AVX-512 with compensation), the
    # A bytes, a weight vector, ones / 0x80, the tail's dword mask, the first half's result.
    acc = [V(j) for j in range(HALF)]
    sums_in_loop = spec.comp and wide
    sums = [V(HALF + j) for j in range(HALF)] if sums_in_loop else None
    nxt = 2 * HALF if sums_in_loop else HALF
    x, w, ones, c80, dmask, first = (V(nxt + i) for i in range(6))
    madd = path.kind == "maddubsw"  # (its step's product and s16 ones)
    tmp, ones16 = (V(nxt + 6), V(nxt + 7)) if madd else (None, None)
    ptrs = [rax, rbx, rcx, rdx, r8, r9, r10, r11]  # the 8 columns of a half
    tail_k = asm.KRegister(physical_id=2)  # (the output stage's masks are k1..)
    load = asm.VMOVDQU8 if wide else asm.VMOVDQU

    def ymm(v):
        return v.as_ymm if wide else v

    def half(v):  # the low half of a vector register (what a widened step extends)
        return v.as_ymm if wide else v.as_xmm

    asm.LOAD.ARGUMENT(rdi, argument)
    done = Label()
    for field in ("m", "n"):
        CMP(asm.qword[A(field)[0]], 0)
        JZ(done)
    if spec.comp:  # u8 ones (VPDPBUSD's), or s16 ones (VPMADDWD's)
        MOV(rax.as_dword, 0x00010001 if widen else 0x01010101)
        asm.VMOVD(ones.as_xmm, rax.as_dword)
        asm.VPBROADCASTD(ones, ones.as_xmm)
    if spec.s8_src and not widen:
        emit_bytes(path, c80, 0x80, rax)
    if madd:
        emit_ones_s16(path, ones16, rax)
    if wide:
        asm.KMOVQ(tail_k, A("tail_bytes"))
    else:
        asm.VMOVDQU(dmask, A("tail_dwords"))
    MOV(rax, A("w"))
    MOV(A("w_cur"), rax)
    MOV(r13, A("n"))  # columns left, from the block's first
    XOR(r14.as_dword, r14.as_dword)  # the block's first column * 4 (the output stage's)

    def columns(half: int) -> None:
        """The half's 8 column pointers, each past the whole vectors of K; a column past
        the block's end reads the one before it. A's row in r12, rsi = -(K's whole bytes)."""
        MOV(rbp, A("ldw"))
        MOV(rax, A("w_cur"))
        if half:
            MOV(rsi, rbp)
            SHL(rsi, 3)
            ADD(rax, rsi)
        for j in range(1, HALF):
            MOV(ptrs[j], ptrs[j - 1])
            ADD(ptrs[j], rbp)
            CMP(r13, HALF * half + j)  # column j of the half is past the end: the one before
            asm.CMOVBE(ptrs[j], ptrs[j - 1])
        MOV(rsi, A("k_main"))
        for p in ptrs:
            ADD(p, rsi)
        MOV(r12, A("a_cur"))
        ADD(r12, rsi)
        NEG(rsi)

    def source(tail: bool) -> None:
        """x = the A row's next vector (masked in the tail), as u8; widened, its next
        half vector as s16 (zero- or sign-extended: an s8 source needs no shift)."""
        if widen:
            extend = asm.VPMOVSXBW if spec.s8_src else asm.VPMOVZXBW
            if tail and wide:
                load(half(x)(tail_k.z), [r12])
            elif tail:
                asm.VPMASKMOVD(half(x), dmask.as_xmm, [r12])
            extend(x, half(x) if tail else (asm.yword if wide else asm.oword)[r12 + rsi * 1])
            return
        if tail and wide:
            load(x(tail_k.z), [r12])
        elif tail:
            asm.VPMASKMOVD(x, dmask, [r12])
        else:
            load(x, [r12 + rsi * 1])
        if spec.s8_src:
            asm.VPXOR(x, x, c80) if not wide else asm.VPXORD(x, x, c80)
            if tail:  # the bytes past K back to zero (they were 0x80 after the xor)
                asm.VMOVDQU8(x(tail_k.z), x) if wide else asm.VPAND(x, x, dmask)

    def steps(targets, operand, tail: bool) -> None:
        """targets[j] += dot(operand, column j's next vector); with the AVX-512 sums."""
        twice = sums_in_loop and targets is acc  # (the loaded vector is read twice)
        for j, p in enumerate(ptrs):
            if widen:  # the column's next half vector as s16, pairs times pairs (VPMADDWD)
                if tail and wide:
                    load(half(w)(tail_k.z), [p])
                elif tail:
                    asm.VPMASKMOVD(half(w), dmask.as_xmm, [p])
                asm.VPMOVSXBW(w, half(w) if tail else (asm.yword if wide else asm.oword)[p + rsi * 1])
                if twice:  # (dmask: AVX-512 has no use for it)
                    asm.VPMADDWD(dmask, ones, w)
                    asm.VPADDD(sums[j], sums[j], dmask)
                asm.VPMADDWD(w, operand, w)
                asm.VPADDD(targets[j], targets[j], w)
                continue
            if tail and wide:
                load(w(tail_k.z), [p])
            elif tail:
                asm.VPMASKMOVD(w, dmask, [p])
            else:
                load(w, [p + rsi * 1])
            emit_step(path, targets[j], operand, w, tmp, ones16)
            if twice:
                emit_step(path, sums[j], ones, w, tmp, ones16)

    def k_pass(targets, with_source: bool) -> None:
        """The K loop and its tail into ``targets`` (A's bytes, or ones: the column sums)."""
        for t in targets + (sums if sums_in_loop and targets is acc else []):
            asm.VPXOR(ymm(t), ymm(t), ymm(t))  # (registers 0..15: VEX; a ymm write zeroes the rest)
        loop, tail, end = Label(), Label(), Label()
        MOV(rbp, rsi)  # (-K's whole bytes: restored for a second pass)
        TEST(rsi, rsi)
        JZ(tail)
        LABEL(loop)
        if with_source:
            source(tail=False)
        steps(targets, x if with_source else ones, tail=False)
        ADD(rsi, spec.k_step)
        JNZ(loop)
        LABEL(tail)
        CMP(asm.qword[A("k_tail")[0]], 0)
        JZ(end)
        if with_source:
            source(tail=True)
        steps(targets, x if with_source else ones, tail=True)
        LABEL(end)
        MOV(rsi, rbp)

    def across(regs, tmp):
        """The 8 vectors' lanes added: lane j of the result (a ymm) is the sum of regs[j]."""
        if wide:  # the 512-bit halves first
            for r in regs:
                asm.VEXTRACTI64X4(tmp.as_ymm, r, 1)
                asm.VPADDD(r.as_ymm, r.as_ymm, tmp.as_ymm)
        r = [ymm(v) for v in regs]
        t = ymm(tmp)
        for i in range(0, HALF, 2):  # per 128 bits: [a0+a2, b0+b2, a1+a3, b1+b3]
            asm.VPUNPCKLDQ(t, r[i], r[i + 1])
            asm.VPUNPCKHDQ(r[i], r[i], r[i + 1])
            asm.VPADDD(r[i], r[i], t)
        for i in (0, 4):  # per 128 bits: the four columns' sums
            asm.VPUNPCKLQDQ(t, r[i], r[i + 2])
            asm.VPUNPCKHQDQ(r[i], r[i], r[i + 2])
            asm.VPADDD(r[i], r[i], t)
        if wide:  # [cols 0-3 low, cols 4-7 low] + [cols 0-3 high, cols 4-7 high]
            asm.VSHUFI64X2(t, r[0], r[4], 0b00)
            asm.VSHUFI64X2(r[0], r[0], r[4], 0b11)
        else:
            asm.VINSERTI128(t, r[0], r[4].as_xmm, 1)
            asm.VPERM2I128(r[0], r[0], r[4], 0x31)
        asm.VPADDD(r[0], r[0], t)
        return regs[0]

    def half_result(half: int):
        """The half's 8 columns of the row: a ymm of their (compensated) products."""
        columns(half)
        k_pass(acc, with_source=True)
        if not spec.comp:
            return across(acc, x)
        asm.VPBROADCASTD(x, asm.dword[A("ao")[0]])  # (x: the next half reloads it)
        if sums_in_loop:  # acc -= ao * sums, lane by lane
            for a, s in zip(acc, sums):
                asm.VPMULLD(s, s, x)
                asm.VPSUBD(a, a, s)
            return across(acc, x)
        result = across(acc, w)  # (then the sums pass, over the 8 registers it freed)
        k_pass(acc[1:] + [first], with_source=False)
        total = across(acc[1:] + [first], w)
        asm.VPBROADCASTD(x, asm.dword[A("ao")[0]])
        asm.VPMULLD(total, total, x)
        asm.VPSUBD(result, result, total)
        return result

    block, row = Label(), Label()
    LABEL(block)
    for cur, start in (("a_cur", "a"), ("c_cur", "c"), ("m_left", "m")):
        MOV(rax, A(start))
        MOV(A(cur), rax)
    XOR(r15.as_dword, r15.as_dword)  # the row * 4 (the output stage's)
    LABEL(row)
    result = half_result(0)
    if halves == 2:
        asm.VMOVDQA64(first, result)
        skip = Label()
        asm.VPXORD(acc[0].as_ymm, acc[0].as_ymm, acc[0].as_ymm)
        CMP(r13, HALF)
        asm.JBE(skip)  # (no second half: zeros)
        half_result(1)  # (in acc[0], as the first half's was)
        LABEL(skip)
        asm.VINSERTI64X4(first, first, acc[0].as_ymm, 1)
        result = first
    MOV(rax, A("c_cur"))
    MOV(rbx, r14)
    if spec.output.dst_bytes == 1:
        SHR(rbx, 2)
    ADD(rax, rbx)
    # (the constants every row's K loop reads stay: the stage takes the other registers)
    kept = {result.physical_id} | {v.physical_id for v in (ones, c80, dmask, ones16) if v is not None}
    free = [V(i) for i in range(path.registers) if i not in kept]
    ctx = OutputContext(path=path, spec=spec.output, args=rdi, offsets=off, col_bytes=r14, row_bytes=r15,
                        n_left=r13, c_row=lambda i: rax, free_vectors=free, free_gprs=[rbx, rcx, rdx, r8])
    emit_output(ctx, [[result]], 1, 1)
    for cur, stride in (("a_cur", "lda"), ("c_cur", "ldc")):
        MOV(rax, A(stride))
        ADD(A(cur), rax)
    ADD(r15, 4)
    DEC(asm.qword[A("m_left")[0]])
    JNZ(row)
    MOV(rax, A("ldw"))
    SHL(rax, lanes.bit_length() - 1)
    ADD(A("w_cur"), rax)
    ADD(r14, 4 * lanes)
    asm.SUB(r13, lanes)
    JG(block)
    LABEL(done)
    asm.VZEROUPPER()
    asm.RETURN()


__all__ = ["GemvSpec", "gemv_kernel", "generate", "rows_max", "takes", "fast_path"]


def _emit_rows(spec: GemvSpec, argument) -> None:
    """The rows kernel (see the module docstring): every row of A at once, blocks of 4
    vectors of columns."""
    from jit import asm
    from jit.asm import (ADD, CMP, DEC, JE, JG, JNZ, JZ, LABEL, LEA, MOV, SHL, SHR, TEST, XOR, Label, rax, rbp,
                         rbx, rcx, rdi, rdx, rsi, r8, r9, r10, r11, r12, r13, r14, r15)

    path, rows = spec.path, spec.rows
    off = args_offsets()
    A = lambda f: [rdi + off[f]]  # noqa: E731
    wide, widen = path.bits == 512, path.kind == "widen"
    nv = _row_vectors(path)  # output vectors a block
    block = spec.lanes  # columns a block: a vector of each weight row's bytes (widened: half)
    V = lambda i: vector_register(path, i)  # noqa: E731
    acc = [[V(nv * i + g) for g in range(nv)] for i in range(rows)]
    nxt = nv * rows
    r = [V(nxt + j) for j in range(4)]  # the group's 4 weight rows, then its column vectors
    t0, t1, x = V(nxt + 4), V(nxt + 5), V(nxt + 6)
    nxt += 7
    p1 = prod = ones16 = None
    if widen:  # A's second pair, and a product
        p1, prod, nxt = V(nxt), V(nxt + 1), nxt + 2
    elif path.kind == "maddubsw":  # the step's product and s16 ones
        prod, ones16, nxt = V(nxt), V(nxt + 1), nxt + 2
    dmask = None
    if not wide:
        dmask, nxt = V(nxt), nxt + 1
    c80 = sums = ones = None
    if spec.comp:
        sums, ones = [V(nxt + g) for g in range(nv)], V(nxt + nv)
        c80 = None if widen else V(nxt + nv + 1)
    xrows = [r8, r9, r10, r11][:rows]  # A's rows, at the group's 4 bytes
    kmask = asm.KRegister(physical_id=2)  # (the output stage's masks are k1..k4)

    def zero(v):
        (asm.VPXORD if wide else asm.VPXOR)(v, v, v)

    asm.LOAD.ARGUMENT(rdi, argument)
    done = Label()
    CMP(asm.qword[A("n")[0]], 0)
    JZ(done)
    if spec.comp:  # u8 ones (VPDPBUSD's), or s16 ones (VPMADDWD's)
        MOV(rax.as_dword, 0x00010001 if widen else 0x01010101)
        asm.VMOVD(ones.as_xmm, rax.as_dword)
        asm.VPBROADCASTD(ones, ones.as_xmm)
        if c80 is not None and spec.s8_src:
            emit_bytes(path, c80, 0x80, rax)
    if ones16 is not None:
        emit_ones_s16(path, ones16, rax)
    MOV(rax, A("w"))
    MOV(A("w_cur"), rax)
    MOV(r13, A("n"))  # columns left, from the block's first
    XOR(r14.as_dword, r14.as_dword)  # the block's first column * 4 (the output stage's)
    XOR(r15.as_dword, r15.as_dword)  # the block's first row * 4: every block has all rows

    def half(v):
        return v.as_ymm if wide else v.as_xmm

    def load(reg, address) -> None:
        """A row's block of weight bytes, zero past N (widened: sign-extended to s16)."""
        into = half(reg) if widen else reg
        if wide:
            asm.VMOVDQU8(into(kmask.z), address)
        else:
            asm.VPMASKMOVD(into, dmask.as_xmm if widen else dmask, address)
        if widen:
            asm.VPMOVSXBW(reg, into)

    def group() -> None:
        """The loaded rows r[0..3] interleaved into vectors of column dwords: 4 bytes of
        a column each, or (widened) its pair of rows 0, 1 or of rows 2, 3 as s16."""
        if widen:
            asm.VPUNPCKLWD(t0, r[0], r[1])  # per 128 bits: columns 0-3, rows (0, 1)
            asm.VPUNPCKHWD(r[0], r[0], r[1])  # columns 4-7
            asm.VPUNPCKLWD(t1, r[2], r[3])  # columns 0-3, rows (2, 3)
            asm.VPUNPCKHWD(r[2], r[2], r[3])
            return
        asm.VPUNPCKLBW(t0, r[0], r[1])  # per 128 bits: (row 0, row 1) byte pairs of columns 0-7
        asm.VPUNPCKHBW(r[0], r[0], r[1])  # columns 8-15
        asm.VPUNPCKLBW(t1, r[2], r[3])
        asm.VPUNPCKHBW(r[2], r[2], r[3])
        asm.VPUNPCKLWD(r[1], t0, t1)  # columns 0-3: their 4 rows' bytes in a dword each
        asm.VPUNPCKHWD(t0, t0, t1)  # columns 4-7
        asm.VPUNPCKLWD(r[3], r[0], r[2])  # 8-11
        asm.VPUNPCKHWD(r[0], r[0], r[2])  # 12-15

    columns = lambda: [r[1], t0, r[3], r[0]]  # noqa: E731 (the group's vectors, in column order per 128 bits)
    pairs = lambda: [(t0, t1), (r[0], r[2])]  # noqa: E731 (widened: columns 0-3, 4-7: rows 0-1, 2-3)

    def products(source) -> None:
        """acc[i][g] += dot(A row i's 4 bytes, vector g); ``source(i)`` fills x with them."""
        for i in range(rows):
            source(i)
            if widen:  # A's pairs as s16: (0, 1) in every dword of x, (2, 3) of p1
                (asm.VPMOVSXBW if spec.s8_src else asm.VPMOVZXBW)(x, half(x))
                asm.VPSHUFD(p1, x, 0x55)
                asm.VPSHUFD(x, x, 0x00)
                for a, (low, high) in zip(acc[i], pairs()):
                    for operand, v in ((x, low), (p1, high)):
                        asm.VPMADDWD(prod, operand, v)
                        asm.VPADDD(a, a, prod)
                continue
            if spec.s8_src:
                (asm.VPXORD if wide else asm.VPXOR)(x, x, c80)
            for a, v in zip(acc[i], columns()):
                emit_step(path, a, x, v, prod, ones16)
        if spec.comp and widen:
            for s, (low, high) in zip(sums, pairs()):
                for v in (low, high):
                    asm.VPMADDWD(prod, ones, v)
                    asm.VPADDD(s, s, prod)
        elif spec.comp:
            for s, v in zip(sums, columns()):
                emit_step(path, s, ones, v, prod, ones16)

    def whole_dword(i) -> None:
        asm.VPBROADCASTD(x, asm.dword[xrows[i]])

    def tail_bytes(i) -> None:
        """A row's last K % 4 bytes (rcx of them), no byte past them read; zeros above."""
        have = Label()
        asm.MOVZX(rax.as_dword, asm.byte[xrows[i]])
        for j in (1, 2):
            CMP(rcx, j)
            JE(have)
            asm.MOVZX(rbp.as_dword, asm.byte[xrows[i] + j])
            SHL(rbp.as_dword, 8 * j)
            asm.OR(rax.as_dword, rbp.as_dword)
        LABEL(have)
        asm.VMOVD(x.as_xmm, rax.as_dword)
        asm.VPBROADCASTD(x, x.as_xmm)

    blk, loop, tail, end = Label(), Label(), Label(), Label()
    LABEL(blk)
    MOV(rcx, block)  # this block's columns: a mask of min(n_left, block)
    CMP(r13, rcx)
    asm.CMOVB(rcx, r13)
    if wide:
        MOV(rax, -1)
        asm.BZHI(rax, rax, rcx)
        asm.KMOVQ(kmask, rax)
    else:
        SHR(rcx, 2)  # (whole dwords: N % 4 == 0)
        asm.VMOVD(dmask.as_xmm, rcx.as_dword)
        asm.VPBROADCASTD(dmask, dmask.as_xmm)
        asm.VPCMPGTD(dmask, dmask, vector_constant(path, range(path.lanes), "gemv_iota"))
    for row in acc:
        for a in row:
            zero(a)
    for s in sums or ():
        zero(s)
    MOV(rsi, A("w_cur"))
    MOV(rdx, A("ldw"))
    LEA(rbx, [rdx + rdx * 2])
    MOV(r8, A("a"))
    for i in range(1, rows):
        MOV(xrows[i], xrows[i - 1])
        ADD(xrows[i], A("lda"))
    MOV(rcx, A("k_main"))
    TEST(rcx, rcx)
    JZ(tail)
    LABEL(loop)
    for j, address in enumerate(([rsi], [rsi + rdx * 1], [rsi + rdx * 2], [rsi + rbx * 1])):
        load(r[j], address)
    group()
    products(whole_dword)
    LEA(rsi, [rsi + rdx * 4])
    for p in xrows:
        ADD(p, 4)
    DEC(rcx)
    JNZ(loop)
    LABEL(tail)  # the last 1-3 rows of the weights (rcx of them), the missing ones zero
    MOV(rcx, A("k_tail"))
    TEST(rcx, rcx)
    JZ(end)
    loaded = Label()
    for j in range(1, 4):
        zero(r[j])
    load(r[0], [rsi])
    for j, address in ((1, [rsi + rdx * 1]), (2, [rsi + rdx * 2])):
        CMP(rcx, j)
        JE(loaded)
        load(r[j], address)
    LABEL(loaded)
    group()
    products(tail_bytes)
    LABEL(end)
    if spec.comp:  # acc -= ao * sums, lane by lane
        asm.VPBROADCASTD(x, asm.dword[A("ao")[0]])
        for s in sums:
            asm.VPMULLD(s, s, x)
        for row in acc:
            for a, s in zip(row, sums):
                asm.VPSUBD(a, a, s)
    # The 128-bit blocks back in column order: block b of vector g holds columns
    # b*16 + 4g .. + 3 (widened: b*8 + 4g .. + 3), as the unpacks left them.
    outs = []
    for a in acc:
        if widen and wide:  # [a0.b0 a1.b0 a0.b1 a1.b1], [a0.b2 a1.b2 a0.b3 a1.b3]
            asm.VSHUFI64X2(r[0], a[0], a[1], 0x44)  # a0.b0 a0.b1 a1.b0 a1.b1
            asm.VSHUFI64X2(r[1], a[0], a[1], 0xEE)
            asm.VSHUFI64X2(a[0], r[0], r[0], 0xD8)
            asm.VSHUFI64X2(a[1], r[1], r[1], 0xD8)
            outs.append(list(a))
        elif widen:  # columns 0-7 are a0.low a1.low, 8-15 the highs
            asm.VPERM2I128(t0, a[0], a[1], 0x20)
            asm.VPERM2I128(a[1], a[0], a[1], 0x31)
            asm.VMOVDQA(a[0], t0)
            outs.append(list(a))
        elif wide:  # a 4 x 4 transpose of 128-bit blocks
            t = [r[0], r[1], r[2], r[3]]
            asm.VSHUFI64X2(t[0], a[0], a[1], 0x44)  # a0.b0 a0.b1 a1.b0 a1.b1
            asm.VSHUFI64X2(t[1], a[0], a[1], 0xEE)  # a0.b2 a0.b3 a1.b2 a1.b3
            asm.VSHUFI64X2(t[2], a[2], a[3], 0x44)
            asm.VSHUFI64X2(t[3], a[2], a[3], 0xEE)
            asm.VSHUFI64X2(a[0], t[0], t[2], 0x88)  # the b0s: columns 0-15
            asm.VSHUFI64X2(a[1], t[0], t[2], 0xDD)  # the b1s: 16-31
            asm.VSHUFI64X2(a[2], t[1], t[3], 0x88)
            asm.VSHUFI64X2(a[3], t[1], t[3], 0xDD)
            outs.append(list(a))
        else:  # columns 0-7 are a0.low a1.low; 8-15 a2.low a3.low; then the highs
            asm.VPERM2I128(t0, a[0], a[1], 0x20)
            asm.VPERM2I128(a[1], a[0], a[1], 0x31)
            asm.VMOVDQA(a[0], t0)
            asm.VPERM2I128(t0, a[2], a[3], 0x20)
            asm.VPERM2I128(a[3], a[2], a[3], 0x31)
            asm.VMOVDQA(a[2], t0)
            outs.append([a[0], a[2], a[1], a[3]])
    MOV(r12, A("c"))
    MOV(rax, r14)
    if spec.output.dst_bytes == 1:
        SHR(rax, 2)
    ADD(r12, rax)
    MOV(rbp, A("ldc"))
    LEA(r11, [rbp + rbp * 2])
    ADD(r11, r12)
    bases = [r12, r12 + rbp * 1, r12 + rbp * 2, r11]
    # (the constants every block's K loop reads stay: the stage takes the other registers)
    live = {v.physical_id for row in outs for v in row} | {v.physical_id for v in (ones, c80, ones16)
                                                           if v is not None}
    free = [V(i) for i in range(path.registers) if i not in live]
    ctx = OutputContext(path=path, spec=spec.output, args=rdi, offsets=off, col_bytes=r14, row_bytes=r15,
                        n_left=r13, c_row=lambda i: bases[i], free_vectors=free, free_gprs=[rax, rbx, rcx, rdx])
    emit_output(ctx, outs, rows, nv)
    ADD(asm.qword[A("w_cur")[0]], block)
    ADD(r14, 4 * block)
    asm.SUB(r13, block)
    JG(blk)
    LABEL(done)
    asm.VZEROUPPER()
    asm.RETURN()
