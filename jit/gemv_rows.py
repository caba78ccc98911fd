"""The in-place kernel for weights given as rows of N contiguous bytes (a matmul's
``ab``): see ``jit.gemv_kernel``."""
from __future__ import annotations

from jit.dot import emit_bytes, emit_ones_s16, emit_step, vector_constant, vector_register
from jit.gemv_kernel import GemvSpec, args_offsets, begin_items, end_of_block, row_vectors
from jit.output import OutputContext, emit_output
from jit.pack_rows import interleave_rows, interleaved


def emit_rows(spec: GemvSpec, argument) -> None:
    """The rows kernel's code (PeachPy, inside ``jit.build.generate``): every row of A at
    once, blocks of 4 (widened: 2) vectors of columns."""
    from jit import asm
    from jit.asm import (ADD, CMP, DEC, JE, JNZ, JZ, LABEL, LEA, MOV, SHL, SHR, TEST, XOR, Label, rax, rbp,
                         rbx, rcx, rdi, rdx, rsi, r8, r9, r10, r11, r12, r13, r14, r15)

    path, rows = spec.path, spec.rows
    off = args_offsets()
    A = lambda f: [rdi + off[f]]  # noqa: E731
    wide, widen = path.bits == 512, path.kind == "widen"
    nv = row_vectors(path)  # output vectors a block
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
    XOR(r15.as_dword, r15.as_dword)  # the block's first row * 4: every block has all rows
    item = begin_items(A)  # (r13: columns left, from the block's first; r14: its first * 4)

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
        interleave_rows(r, t0, t1)  # (the packing kernel's shuffles)

    columns = lambda: interleaved(r, t0)  # noqa: E731 (the group's vectors, in column order per 128 bits)
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
    MOV(r8, A("a_base"))
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
    MOV(r12, A("c_base"))
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
    end_of_block(A, blk, item, done, block)
