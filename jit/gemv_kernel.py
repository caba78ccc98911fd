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

Example::

    >>> import numpy as np
    >>> spec = GemvSpec(fast_path("avx512_core_vnni"), s8_src=False, comp=False,
    ...                 output=OutputSpec(col_comp=False))
    >>> generate(spec).name
    'gemv_u8s8s32_avx512_core_vnni'
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from jit.dot import Path, emit_bytes, fast_path, vector_register
from jit.output import OUTPUT_FIELDS, OutputContext, OutputSpec, args_cdef_fields, emit_output

ARGS_CDEF = """
struct i8j_gemv_args {
    void *a; int64_t lda;                 /* u8 or s8 rows */
    void *w; int64_t ldw;                 /* s8 columns of K bytes, ldw bytes apart */
    void *c; int64_t ldc;                 /* dst rows */
    int64_t m; int64_t n;
    int64_t k_bytes;                      /* K in whole vectors, bytes */
    int64_t k_tail;                       /* K mod the vector bytes (0: no tail) */
    uint64_t tail_bytes;                  /* AVX-512: the tail's byte mask */
    int32_t tail_dwords[8];               /* AVX2: the tail's dword mask (-1 valid, 0 not) */
    int32_t ao; int32_t pad;              /* the compensation's factor (zero point, + 128 for s8) */
    void *a_cur; void *c_cur; void *w_cur; int64_t m_left;  /* the kernel's own */
    %s
};
""" % args_cdef_fields()
SIGNATURE = "void (*)(struct i8j_gemv_args *)"
FIELDS = ("a", "lda", "w", "ldw", "c", "ldc", "m", "n", "k_bytes", "k_tail", "tail_bytes", "tail_dwords", "ao",
          "a_cur", "c_cur", "w_cur", "m_left") + OUTPUT_FIELDS
HALF = 8  # columns a K loop carries


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

    def __post_init__(self):
        if self.path.kind != "vnni":
            raise ValueError(f"path: {self.path.name}; the in-place kernel runs VPDPBUSD (vnni) paths only")
        if self.output.col_comp or self.output.row_comp:
            raise ValueError("output: col_comp and row_comp off (the kernel subtracts its own compensation)")

    @property
    def lanes(self) -> int:
        """Columns a block (one output vector)."""
        return self.path.lanes

    @property
    def name(self) -> str:
        src = "s8" if self.s8_src else "u8"
        comp = "_comp" if self.comp else ""
        return f"gemv_{src}s8{self.output.dst_dt}_{self.path.isa}{comp}"


def takes(path: Path, k: int) -> bool:
    """Whether the kernel of ``path`` runs a K of ``k`` (AVX2: whole dwords, see above)."""
    return path.kind == "vnni" and (path.bits == 512 or k % 4 == 0)


def gemv_kernel(path: Path, s8_src: bool, comp: bool, output: OutputSpec):
    """The kernel from the caches (generated on a miss), its spec in ``meta["spec"]``."""
    from jit import cache

    args_offsets()  # declares the struct for callers
    spec = GemvSpec(path, s8_src, comp, replace(output, col_comp=False))
    kernel = cache.get_kernel(("gemv", spec), lambda: generate(spec))
    kernel.meta["gemv"] = spec
    return kernel


def generate(spec: GemvSpec):
    """Generate the kernel's code (PeachPy); see :func:`gemv_kernel`."""
    from jit import asm
    from jit.build import generate as build

    argument = asm.Argument(asm.ptr(asm.uint8_t), "args")
    return build(spec.name, spec.path.isa, SIGNATURE, (argument,), lambda: _emit(spec, argument),
                 meta={"spec": repr(spec)})


def _emit(spec: GemvSpec, argument) -> None:
    from jit import asm
    from jit.asm import (ADD, CMP, DEC, JG, JNZ, JZ, LABEL, MOV, NEG, SHL, SHR, TEST, XOR, Label, rax, rbp, rbx,
                         rcx, rdi, rdx, rsi, r8, r9, r10, r11, r12, r13, r14, r15)

    path = spec.path
    off = args_offsets()
    A = lambda f: [rdi + off[f]]  # noqa: E731
    wide = path.bits == 512
    vb, lanes = path.vector_bytes, path.lanes
    V = lambda i: vector_register(path, i)  # noqa: E731
    halves = lanes // HALF
    # Vector registers: the 8 accumulators, the sums (AVX-512 with compensation), the
    # A bytes, a weight vector, ones / 0x80, the tail's dword mask, the first half's result.
    acc = [V(j) for j in range(HALF)]
    sums_in_loop = spec.comp and wide
    sums = [V(HALF + j) for j in range(HALF)] if sums_in_loop else None
    nxt = 2 * HALF if sums_in_loop else HALF
    x, w, ones, c80, dmask, first = (V(nxt + i) for i in range(6))
    ptrs = [rax, rbx, rcx, rdx, r8, r9, r10, r11]  # the 8 columns of a half
    tail_k = asm.KRegister(physical_id=2)  # (the output stage's masks are k1..)
    load = asm.VMOVDQU8 if wide else asm.VMOVDQU

    def ymm(v):
        return v.as_ymm if wide else v

    asm.LOAD.ARGUMENT(rdi, argument)
    done = Label()
    for field in ("m", "n"):
        CMP(asm.qword[A(field)[0]], 0)
        JZ(done)
    if spec.comp:
        MOV(rax.as_dword, 0x01010101)
        asm.VMOVD(ones.as_xmm, rax.as_dword)
        asm.VPBROADCASTD(ones, ones.as_xmm)
    if spec.s8_src:
        emit_bytes(path, c80, 0x80, rax)
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
        MOV(rsi, A("k_bytes"))
        for p in ptrs:
            ADD(p, rsi)
        MOV(r12, A("a_cur"))
        ADD(r12, rsi)
        NEG(rsi)

    def source(tail: bool) -> None:
        """x = the A row's next vector (masked in the tail), as u8."""
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
        for j, p in enumerate(ptrs):
            if tail and wide:
                load(w(tail_k.z), [p])
            elif tail:
                asm.VPMASKMOVD(w, dmask, [p])
            else:
                load(w, [p + rsi * 1])
            asm.VPDPBUSD(targets[j], operand, w, vex=path.vex)
            if sums_in_loop and targets is acc:
                asm.VPDPBUSD(sums[j], ones, w, vex=path.vex)

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
        ADD(rsi, vb)
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
        asm.VPBROADCASTD(x, asm.dword[A("ao")[0]])
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
    free = [V(i) for i in range(path.registers) if i != result.physical_id]
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


__all__ = ["GemvSpec", "gemv_kernel", "generate", "takes", "fast_path"]
