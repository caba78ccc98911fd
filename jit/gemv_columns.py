"""The in-place kernel for weights given as columns of K contiguous bytes (an inner
product's OC x K, a matmul's ``ba``): see ``jit.gemv_kernel``."""
from __future__ import annotations

from jit.dot import emit_bytes, emit_ones_s16, emit_step, vector_register
from jit.gemv_kernel import HALF, GemvSpec, args_offsets, begin_items, end_of_block
from jit.output import OutputContext, emit_output


def emit_columns(spec: GemvSpec, argument) -> None:
    """The columns kernel's code (PeachPy, inside ``jit.build.generate``)."""
    from jit import asm
    from jit.asm import (ADD, CMP, DEC, JNZ, JZ, LABEL, MOV, NEG, SHL, SHR, TEST, XOR, Label, rax, rbp, rbx,
                         rcx, rdi, rdx, rsi, r8, r9, r10, r11, r12, r13, r14, r15)

    path = spec.path
    off = args_offsets()
    A = lambda f: [rdi + off[f]]  # noqa: E731
    wide, widen = path.bits == 512, path.kind == "widen"
    lanes = path.lanes
    V = lambda i: vector_register(path, i)  # noqa: E731
    halves = lanes // HALF
    # Vector registers: the 8 accumulators, the sums (AVX-512 with compensation), the
    # A bytes, a weight vector, ones / 0x80, the tail's dword mask, the first half's result
    # (VPMADDUBSW: its product and s16 ones too).
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
    item = begin_items(A)  # (r13: columns left, from the block's first; r14: its first * 4)

    def columns(which: int) -> None:
        """Half ``which``'s 8 column pointers, each past the whole vectors of K; a column
        past the block's end reads the one before it. A's row in r12, rsi = -(K's whole
        bytes)."""
        MOV(rbp, A("ldw"))
        MOV(rax, A("w_cur"))
        if which:
            MOV(rsi, rbp)
            SHL(rsi, 3)
            ADD(rax, rsi)
        for j in range(1, HALF):
            MOV(ptrs[j], ptrs[j - 1])
            ADD(ptrs[j], rbp)
            CMP(r13, HALF * which + j)  # column j of the half is past the end: the one before
            asm.CMOVBE(ptrs[j], ptrs[j - 1])
        MOV(rsi, A("k_main"))
        for p in ptrs:
            ADD(p, rsi)
        MOV(r12, A("a_cur"))
        ADD(r12, rsi)
        NEG(rsi)

    def fetch(reg, base, tail: bool, extend=None) -> None:
        """reg = the next vector of K bytes at ``base`` (+ rsi; the tail masked past K),
        or with ``extend`` the next half vector, extended to s16."""
        into = half(reg) if extend else reg
        if tail and wide:
            load(into(tail_k.z), [base])
        elif tail:
            asm.VPMASKMOVD(into, dmask.as_xmm if extend else dmask, [base])
        elif extend:
            extend(reg, (asm.yword if wide else asm.oword)[base + rsi * 1])
            return
        else:
            load(reg, [base + rsi * 1])
        if extend:
            extend(reg, into)

    def source(tail: bool) -> None:
        """x = the A row's next vector (masked in the tail), as u8; widened, its next
        half vector as s16 (zero- or sign-extended: an s8 source needs no shift)."""
        if widen:
            fetch(x, r12, tail, asm.VPMOVSXBW if spec.s8_src else asm.VPMOVZXBW)
            return
        fetch(x, r12, tail)
        if spec.s8_src:
            asm.VPXOR(x, x, c80) if not wide else asm.VPXORD(x, x, c80)
            if tail:  # the bytes past K back to zero (they were 0x80 after the xor)
                asm.VMOVDQU8(x(tail_k.z), x) if wide else asm.VPAND(x, x, dmask)

    def steps(targets, operand, tail: bool) -> None:
        """targets[j] += dot(operand, column j's next vector); with the AVX-512 sums."""
        twice = sums_in_loop and targets is acc  # (the loaded vector is read twice)
        for j, p in enumerate(ptrs):
            if widen:  # the column's next half vector as s16, pairs times pairs (VPMADDWD)
                fetch(w, p, tail, asm.VPMOVSXBW)
                if twice:  # (dmask: AVX-512 has no use for it)
                    asm.VPMADDWD(dmask, ones, w)
                    asm.VPADDD(sums[j], sums[j], dmask)
                asm.VPMADDWD(w, operand, w)
                asm.VPADDD(targets[j], targets[j], w)
                continue
            fetch(w, p, tail)
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

    def half_result(which: int):
        """Half ``which``'s 8 columns of the row: a ymm of their (compensated) products."""
        columns(which)
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
    for cur, start in (("a_cur", "a_base"), ("c_cur", "c_base"), ("m_left", "m")):
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
    end_of_block(A, block, item, done, lanes)
