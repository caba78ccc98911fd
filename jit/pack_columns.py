"""B packed from columns of K bytes (N x K row-major: an inner product's OC x K, a
matmul's ``ba`` weights, attention's keys): a dword transpose of a vector of each column.

One template for 512-bit and 256-bit registers (``jit.pack_rows.Width``) and both
layouts (VNNI, or ``widen``: each group's two pairs as s16, in two rows)::

    for each quarter of columns (16 / 8; the last one's missing columns: zero vectors),
    for each block of 16 / 8 K groups (a vector of each column; the last one masked):
        the 16 x 16 (8 x 8) dword transpose: VPUNPCKL/HDQ, VPUNPCKL/HQDQ, then the
        128-bit blocks (two VSHUFI64X2 stages; VPERM2I128): the block's group rows of the
        quarter, stored (the last block's groups past K not) and summed

The sums, the quarters' table and the item loop are ``jit.pack_rows``'. 256-bit loads
are dword-masked: K % 4 == 0, else the packer pads K.
"""
from __future__ import annotations

from jit.pack_rows import Width, load_pick, next_item, start, sum_step, widen_pairs


def emit_columns(argument, offsets: dict, w: Width, widen: bool, vnni: bool, stream: bool = False) -> None:
    """The columns kernel's body (``offsets``: the args struct's field offsets; ``stream``:
    the packed bytes stored past the caches, ``Width.store``)."""
    from peachpy.literal import Constant
    from peachpy.name import Name

    from jit import asm
    from jit.asm import (ADD, CMP, DEC, JBE, JE, JMP, JNE, JNZ, LABEL, LEA, MOV, Label, rax, rbp, rbx, rcx, rdi, rdx,
                         rsi, r8, r9, r10, r11, r12, r13, r14, r15)

    A = lambda f: [rdi + offsets[f]]  # noqa: E731
    n = w.lanes  # columns a quarter, groups a block
    v = [w.v(i) for i in range(n)]  # column j's groups of the block
    spare = [w.v(n + i) for i in range(2)]
    acc = [w.v(n + 2 + i) for i in range(4 if w.bits == 512 else 1)]
    ones8, ones16, dmask = (w.v(n + 2 + len(acc) + i) for i in range(3))
    pick = (w.v(n + 5 + len(acc)), w.v(n + 6 + len(acc))) if widen and w.bits == 512 else None
    kmask = asm.k1
    bases = (rax, rbx, rcx, rdx)[: n // 4]  # columns 0, 4, 8, 12 of the quarter
    columns = [address for b in bases for address in ([b], [b + r10 * 1], [b + r10 * 2], [b + r11 * 1])]
    rows = [[rbp], [rbp + r12 * 1], [rbp + r12 * 2], [rbp + r13 * 1]]  # four rows of the tiles' groups
    asm.LOAD.ARGUMENT(rdi, argument)
    done, item, chunk, block, whole_k, partial, loaded, partial_stores, stored = (Label() for _ in range(9))
    start(A, ones8, ones16, vnni, done)
    if pick:
        load_pick(w, *pick)
    LEA(r13, [r12 + r12 * 2])  # 3 rows
    LABEL(item)
    MOV(rsi, A("item_src"))  # the quarter's first column
    MOV(r14, A("item_sums"))  # its sums
    MOV(r15, A("quarters"))  # its offset in the packed B
    MOV(r8, A("chunks"))
    LABEL(chunk)
    MOV(r9, A("blocks"))
    MOV(A("left"), r9)
    MOV(r9.as_dword, n)  # the quarter's columns: all, but in the part's last
    CMP(r8, 1)
    asm.CMOVE(r9, A("last_columns"))
    MOV(rbp, A("item_dst"))
    ADD(rbp, [r15])
    MOV(rax, rsi)
    for prev, base in zip(bases, bases[1:]):
        LEA(base, [prev + r10 * 4])
    for a in acc:
        w.zero(a)
    LABEL(block)  # a vector of each column, but in the last block
    if w.bits == 512:
        asm.KXNORQ(kmask, kmask, kmask)
        CMP(asm.qword[A("left")[0]], 1)
        JNE(whole_k)
        asm.KMOVQ(kmask, A("last_mask"))
    else:
        MOV(r11.as_dword, n)
        CMP(asm.qword[A("left")[0]], 1)
        JNE(whole_k)
        MOV(r11, A("last_groups"))
    LABEL(whole_k)
    if w.bits == 256:  # (r11, 3 ldb, lent for the mask)
        asm.VMOVD(dmask.as_xmm, r11.as_dword)
        asm.VPBROADCASTD(dmask, dmask.as_xmm)
        asm.VPCMPGTD(dmask, dmask, Constant._uint32xN(Name(prename="pack_columns_iota"), n, *range(n)))
        LEA(r11, [r10 + r10 * 2])

    def load(x, address) -> None:
        if w.bits == 512:
            asm.VMOVDQU8(x(kmask.z), address)
        else:
            asm.VPMASKMOVD(x, dmask, address)

    CMP(r9, n)
    JNE(partial)
    if w.bits == 256:  # (masked loads only where needed: VPMASKMOVD costs more than a load)
        CMP(asm.qword[A("left")[0]], 1)
        JE(partial)
    for x, address in zip(v, columns):
        load(x, address) if w.bits == 512 else asm.VMOVDQU(x, address)
    JMP(loaded)
    LABEL(partial)  # the last quarter's columns, then zeros (256-bit: or the last block)
    zeros = [Label() for _ in range(n)]
    for j, (x, address) in enumerate(zip(v, columns)):
        if j:
            CMP(r9, j)
            JBE(zeros[j])
        load(x, address)
    JMP(loaded)
    for j in range(1, n):
        LABEL(zeros[j])
        w.zero(v[j])
    LABEL(loaded)
    out, free = (transpose16 if w.bits == 512 else transpose8)(v, spare)  # group g's row of the quarter
    per_row = 2 if widen else 1  # a group's rows in the tiles

    def store_group(g: int, x) -> None:
        """Group g's row ``x`` stored (widened: its two rows, summed here: ``x`` is spent)."""
        if widen:
            first, second = widen_pairs(x, *free, pick)
            w.store(rows[(2 * g) % 4], first, stream)
            w.store(rows[(2 * g + 1) % 4], second, stream)
            for t in (first, second):
                asm.VPMADDWD(t, t, ones16)
                asm.VPADDD(acc[0], acc[0], t)
        else:
            w.store(rows[g % 4], x, stream)
        if (g + 1) * per_row % 4 == 0:
            LEA(rbp, [rbp + r12 * 4])

    CMP(asm.qword[A("left")[0]], 1)
    JE(partial_stores)
    for g, x in enumerate(out):
        store_group(g, x)
    JMP(stored)
    LABEL(partial_stores)  # the last block: its groups only (the others are zero)
    for g, x in enumerate(out):
        if g:
            CMP(asm.qword[A("last_groups")[0]], g)
            JBE(stored)
        store_group(g, x)
    LABEL(stored)
    if not widen:
        for g, x in enumerate(out):
            sum_step(acc[g % len(acc)], x, ones8, ones16, free[0], vnni)
    for base in bases:
        ADD(base, 4 * n)
    DEC(asm.qword[A("left")[0]])
    JNZ(block)
    for a in acc[1:]:
        asm.VPADDD(acc[0], acc[0], a)
    w.move([r14], acc[0])
    ADD(r14, 4 * n)
    LEA(rsi, [rsi + r10 * 8])
    if n == 16:
        LEA(rsi, [rsi + r10 * 8])
    ADD(r15, 8)
    DEC(r8)
    JNZ(chunk)
    next_item(A, item, done, stream)


def _pairs_of_columns(v: list, free: list) -> tuple:
    """Stage 1 and 2 of a dword transpose (in place and in ``free``): ``quads[q][m]``, in
    128-bit lane L, group 4L+m of columns 4q..4q+3."""
    from jit import asm

    def new():
        return free.pop(0)

    lo, hi = [], []
    for p in range(len(v) // 2):  # column pairs: in lane L, (2p, 2p+1) x groups 4L, 4L+1 | 4L+2, 4L+3
        a, b = v[2 * p], v[2 * p + 1]
        t = new()
        asm.VPUNPCKLDQ(t, a, b)
        asm.VPUNPCKHDQ(a, a, b)
        free.append(b)
        lo.append(t)
        hi.append(a)
    quads = [[None] * 4 for _ in range(len(v) // 4)]
    for q in range(len(quads)):
        for m0, (x, y) in ((0, (lo[2 * q], lo[2 * q + 1])), (2, (hi[2 * q], hi[2 * q + 1]))):
            t = new()
            asm.VPUNPCKLQDQ(t, x, y)
            asm.VPUNPCKHQDQ(x, x, y)
            free.append(y)
            quads[q][m0], quads[q][m0 + 1] = t, x
    return quads


def transpose8(v: list, spare: list) -> tuple:
    """The 8 x 8 dword transpose of ymm ``v`` (row j: column j's 8 K groups): (the 8
    rows of the result, row g group g of the 8 columns; the 2 registers left free)."""
    from jit import asm

    free = list(spare)
    quads = _pairs_of_columns(v, free)
    out = [None] * 8
    for m in range(4):  # the 128-bit halves: columns 0-3 from quad 0, 4-7 from quad 1
        a, b = quads[0][m], quads[1][m]
        t = free.pop(0)
        asm.VPERM2I128(t, a, b, 0x20)  # group m
        asm.VPERM2I128(a, a, b, 0x31)  # group 4 + m
        free.append(b)
        out[m], out[4 + m] = t, a
    return out, free


def transpose16(v: list, spare: list) -> tuple:
    """The 16 x 16 dword transpose of zmm ``v``: as :func:`transpose8`."""
    from jit import asm

    free = list(spare)
    quads = _pairs_of_columns(v, free)
    out = [None] * 16
    for m in range(4):  # lanes: a 4 x 4 transpose of the quads' 128-bit blocks
        a, b, c, d = (quads[q][m] for q in range(4))
        p = free.pop(0)
        asm.VSHUFI64X2(p, a, b, 0x44)  # a0 a1 b0 b1
        asm.VSHUFI64X2(b, a, b, 0xEE)  # a2 a3 b2 b3
        free.append(a)
        r = free.pop(0)
        asm.VSHUFI64X2(r, c, d, 0x44)  # c0 c1 d0 d1
        asm.VSHUFI64X2(d, c, d, 0xEE)  # c2 c3 d2 d3
        free.append(c)
        for first, (x, y) in ((0, (p, r)), (8, (b, d))):
            t = free.pop(0)
            asm.VSHUFI64X2(t, x, y, 0x88)  # x0 x2 y0 y2: group first + m
            asm.VSHUFI64X2(x, x, y, 0xDD)  # x1 x3 y1 y3: group first + 4 + m
            free.append(y)
            out[first + m], out[first + 4 + m] = t, x
    return out, free
