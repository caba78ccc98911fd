"""B packed from rows of N bytes (K x N row-major: a matmul's ``ab`` weights, attention's
values): whole vectors of each row a load, the layout made by two unpack stages.

One template for 512-bit and 256-bit registers (``Width``) and for both layouts a
kernel reads: the VNNI one (a column's 4 K bytes a dword; VPMADDUBSW reads it too) and
the widening path's (``widen``: the dword's two pairs as s16, in two rows of the
group)::

    for each block of 4 K groups (2 where rows are 4096 * n bytes apart: its rows span
    few pages and their lines fit the L1 sets), for each chunk of a
    vector's columns (64 / 32; the last one masked: past N loads as zero):
        for each K group of the block (the last group's missing 1-3 rows zero):
            r0..r3 = the group's rows, a vector of each
            VPERMD each row: lane L's dwords become the row's dwords L, L+k, L+2k, L+3k
                (k: the lanes of 128 bits: 4, or 2)
            VPUNPCKL/HBW(r0, r1), (r2, r3): byte pairs; VPUNPCKL/HWD of those: in lane
                L, the groups of columns 4L..4L+3 of each quarter: after the VPERMD the
                four results are the chunk's four quarters (16 / 8 columns) in order
            widened: each quarter sign-extended (VPMOVSXBW) and split by pair into its
                two rows (VSHUFPS and VPERMQ; 512-bit: VPERMI2D and VPERMT2D)
            each stored at its quarter's place in the tiles, and summed

The column sums: VPDPBUSD by u8 ones, or VPMADDUBSW and VPMADDWD by ones (pairs of
|sum| <= 256: no saturation); widened, VPMADDWD by ones. Where a quarter lands is read
from a table (``quarters``: byte offsets in the item's packed B), so any tile width in
quarters works; a last chunk's quarters past the packed columns point at its last real
quarter, stored before it (they hold zeros): nothing is written outside the packed B,
and B needs no padded copy (256-bit: dword masks, so N % 4 == 0; else the packer pads).

The AVX2 kernels these replaced read 8-16 bytes of each row a pass and spent 5
shuffles a 32-byte group: about 19 GB/s on a Zen 4 wherever B sat.
"""
from __future__ import annotations

from dataclasses import dataclass

BLOCK = 4  # K groups a sweep over the chunks (512-bit on a Zen 4: 4 gave 37-44 GB/s, 16 30-38)
# ... but 2 where rows are a multiple of 4096 bytes apart: a sweep's 16 rows (and the lines
# the hardware fetches next to them) then share one set of L1 (Zen 4, 1024 x 4096: 17.7 ->
# 29 GB/s; 2048 x 1000 and 4096 x 1024 lose 5-7% at 2, so only there).
ALIASED_BLOCK = 2


def block_groups(ldb: int) -> int:
    """The K groups of a sweep over the chunks, for rows ``ldb`` bytes apart."""
    return ALIASED_BLOCK if ldb % 4096 == 0 else BLOCK


@dataclass(frozen=True)
class Width:
    """A kernel's register width: 512 (AVX-512BW, byte masks) or 256 (AVX2, dword masks)."""

    bits: int

    @property
    def lanes(self) -> int:  # dwords a vector: the columns of one stored row
        return self.bits // 32

    @property
    def chunk(self) -> int:  # columns a pass of the rows kernel: a vector of each row
        return self.bits // 8

    @property
    def isa(self) -> str:
        return "avx512_core" if self.bits == 512 else "avx2"

    def v(self, i: int):
        from jit import asm

        return getattr(asm, f"{'zmm' if self.bits == 512 else 'ymm'}{i}")

    def zero(self, x) -> None:
        from jit import asm

        (asm.VPXORD if self.bits == 512 else asm.VPXOR)(x, x, x)

    def move(self, dst, src) -> None:
        """A whole-vector load or store."""
        from jit import asm

        (asm.VMOVDQU32 if self.bits == 512 else asm.VMOVDQU)(dst, src)

    def store(self, dst, src, stream: bool) -> None:
        """A packed vector stored; ``stream`` (512-bit only): VMOVNTDQ, a whole aligned
        line written past the caches (:func:`jit.pack_kernel.streams`)."""
        from jit import asm

        if stream:
            asm.VMOVNTDQ(dst, src)
        else:
            self.move(dst, src)


def quarter_offsets(columns: int, tile_n: int, tile_stride: int, quarter: int, chunk: int) -> list[int]:
    """Byte offsets in a packed B (tiles of ``tile_n`` columns, ``tile_stride`` bytes apart;
    a group's row of a tile is ``4 tile_n`` bytes) of each ``quarter`` of columns of whole
    ``chunk``s covering ``columns``; quarters past the tiles repeat the last quarter
    inside them (the kernels store them first, then the real one over them)."""
    tiles = -(-columns // tile_n)
    inside = tiles * tile_n // quarter
    quarters = -(-columns // chunk) * (chunk // quarter)
    offsets = []
    for q in range(quarters):
        column = min(q, inside - 1) * quarter
        offsets.append(column // tile_n * tile_stride + column % tile_n * 4)
    return offsets


def perm_dwords(w: Width) -> list[int]:
    """VPERMD's index: lane L's dword m takes the row's dword m * (128-bit lanes) + L."""
    blocks = w.bits // 128
    return [(p % 4) * blocks + p // 4 for p in range(w.lanes)]


def emit_rows(argument, offsets: dict, w: Width, widen: bool, vnni: bool, stream: bool = False) -> None:
    """The rows kernel's body (``offsets``: the args struct's field offsets,
    ``jit.pack_kernel``; ``vnni``: the sums by VPDPBUSD; ``stream``: the packed bytes
    stored past the caches, :meth:`Width.store`)."""
    from peachpy.literal import Constant
    from peachpy.name import Name

    from jit import asm
    from jit.asm import (ADD, CMP, DEC, IMUL, JB, JNE, JNZ, JZ, LABEL, LEA, MOV, SUB, TEST, Label, rax, rbp, rbx, rcx,
                         rdi, rdx, rsi, r8, r9, r10, r11, r12, r13, r14, r15)

    A = lambda f: [rdi + offsets[f]]  # noqa: E731
    rows, pairs, acc = [w.v(i) for i in range(4)], [w.v(4 + i) for i in range(4)], [w.v(8 + i) for i in range(4)]
    ones8, ones16, perm, dmask = w.v(12), w.v(13), w.v(14), w.v(15)
    kmask = asm.k1
    quarters = (rdx, r15, r14, r13)  # quarters 3, 2, 1, 0 of the chunk: stored in this order
    group_rows = 2 if widen else 1  # a group's rows in the tiles
    asm.LOAD.ARGUMENT(rdi, argument)
    done, item, block, chunk, added, summed, tail_done = (Label() for _ in range(7))
    start(A, ones8, ones16, vnni, done)
    name = f"pack_rows_perm{w.bits}"
    w.move(perm, Constant._uint32xN(Name(prename=name), w.lanes, *perm_dwords(w)))
    pick = (w.v(16), w.v(17)) if widen and w.bits == 512 else None
    if pick:
        load_pick(w, *pick)

    def load(r, address) -> None:
        if w.bits == 512:
            asm.VMOVDQU8(r(kmask.z), address)
        else:
            asm.VPMASKMOVD(r, dmask, address)

    def process() -> None:
        """The group in ``rows``: permuted, interleaved, stored at [quarter + rbp] (widened:
        the second pairs at [quarter + rbx], rbx = rbp + a row), summed."""
        for r in rows:
            asm.VPERMD(r, perm, r)
        out = interleave_rows(rows, pairs[0], pairs[1])  # (after the VPERMD: quarters 0-3 in order)
        for j, base in zip((3, 2, 1, 0), quarters):  # (last first: see the module)
            if widen:
                first, second = widen_pairs(out[j], pairs[2], pairs[3], pick)
                w.store([base + rbp * 1], first, stream)
                w.store([base + rbx * 1], second, stream)
                for x in (first, second):
                    asm.VPMADDWD(x, x, ones16)
                    asm.VPADDD(acc[j], acc[j], x)
            else:
                w.store([base + rbp * 1], out[j], stream)
        if not widen:
            for j in range(4):
                sum_step(acc[j], out[j], ones8, ones16, pairs[2], vnni)

    LABEL(item)
    MOV(rax, A("item_src"))
    MOV(A("block_src"), rax)
    MOV(asm.qword[A("block_off")[0]], 0)
    MOV(rax, A("groups"))
    MOV(A("left"), rax)
    # Blocks of BLOCK groups, each for every chunk: a block's rows span few pages (a
    # chunk walked down a 4096-wide B whole: a page a row, 5.6 GB/s).
    LABEL(block)
    MOV(r9, A("left"))
    MOV(rax, A("block_max"))  # (block_groups(ldb))
    CMP(r9, rax)
    asm.CMOVA(r9, rax)
    MOV(A("block"), r9)  # this block's groups
    SUB(A("left"), r9)
    MOV(rsi, A("block_src"))  # the chunk's first column, the block's first row
    MOV(rax, A("item_sums"))
    MOV(A("sums_at"), rax)  # the chunk's sums
    MOV(rcx, A("quarters"))  # the chunk's quarters' offsets
    MOV(r8, A("chunks"))
    LABEL(chunk)
    MOV(rbx, A("sums_at"))
    if w.bits == 512:  # every column, but in the last chunk
        asm.KXNORQ(kmask, kmask, kmask)
        whole = Label()
        CMP(r8, 1)
        JNE(whole)
        asm.KMOVQ(kmask, A("last_mask"))
        LABEL(whole)
    else:
        MOV(rax.as_dword, w.chunk)
        CMP(r8, 1)
        asm.CMOVE(rax, A("last_columns"))
        asm.SHR(rax.as_dword, 2)  # (whole dwords: N % 4 == 0)
        asm.VMOVD(dmask.as_xmm, rax.as_dword)
        asm.VPBROADCASTD(dmask, dmask.as_xmm)
        asm.VPCMPGTD(dmask, dmask, Constant._uint32xN(Name(prename="pack_rows_iota"), w.lanes, *range(w.lanes)))
    CMP(asm.qword[A("block_off")[0]], 0)  # the first block's sums start at zero, the others add
    JNE(added)
    for a in acc:
        w.zero(a)
    asm.JMP(summed)
    LABEL(added)
    for j, a in enumerate(acc):
        w.move(a, [rbx + 4 * w.lanes * j])
    LABEL(summed)
    MOV(rax, A("item_dst"))
    for j, base in enumerate(reversed(quarters)):
        MOV(base, rax)
        ADD(base, [rcx + 8 * j])
    MOV(rax, rsi)
    MOV(rbp, A("block_off"))  # the group's row in the tiles
    MOV(r9, A("block"))

    def groups(masked: bool) -> None:
        """The block's groups, then (after the last block) the K % 4 rows: row 0, then 1
        and 2 where they exist, the rest zero."""
        group, tail, go = Label(), Label(), Label()
        read = load if masked else w.move
        TEST(r9, r9)
        JZ(tail)
        LABEL(group)
        for r, address in zip(rows, ([rax], [rax + r10 * 1], [rax + r10 * 2], [rax + r11 * 1])):
            read(r, address)
        if widen:
            LEA(rbx, [rbp + r12 * 1])
        process()
        LEA(rax, [rax + r10 * 4])
        LEA(rbp, [rbp + r12 * group_rows])
        DEC(r9)
        JNZ(group)
        LABEL(tail)
        CMP(asm.qword[A("left")[0]], 0)
        JNE(tail_done)
        MOV(r9, A("k_rem"))
        TEST(r9, r9)
        JZ(tail_done)
        for r in rows[1:]:
            w.zero(r)
        read(rows[0], [rax])
        CMP(r9, 2)
        JB(go)
        read(rows[1], [rax + r10 * 1])
        CMP(r9, 3)
        JB(go)
        read(rows[2], [rax + r10 * 2])
        LABEL(go)
        if widen:
            LEA(rbx, [rbp + r12 * 1])
        process()  # (the missing rows zero: VPERMD of zero is zero)

    if w.bits == 256:  # the last chunk's loads masked (VPMASKMOVD costs more than a load)
        last = Label()
        CMP(r8, 1)
        asm.JE(last)
        groups(masked=False)
        asm.JMP(tail_done)
        LABEL(last)
    groups(masked=True)
    LABEL(tail_done)
    MOV(rbx, A("sums_at"))
    for j in range(4):
        w.move([rbx + 4 * w.lanes * j], acc[j])
    ADD(asm.qword[A("sums_at")[0]], 4 * w.chunk)
    ADD(rsi, w.chunk)
    ADD(rcx, 8 * 4)
    DEC(r8)
    JNZ(chunk)
    MOV(r9, A("block"))  # past the block: its rows, its groups' rows in the tiles
    LEA(rax, [r10 * 4])
    IMUL(rax, r9)
    ADD(A("block_src"), rax)
    LEA(rax, [r12 * group_rows])
    IMUL(rax, r9)
    ADD(A("block_off"), rax)
    CMP(asm.qword[A("left")[0]], 0)
    JNZ(block)
    next_item(A, item, done, stream)


def interleave_rows(r: list, t0, t1) -> list:
    """Four rows of a K group, a vector of bytes each in ``r``, interleaved in place and in
    ``t0``, ``t1`` (VPUNPCKL/HBW of rows (0, 1) and (2, 3), then VPUNPCKL/HWD of those):
    per 128 bits, the dwords of columns 0-3, 4-7, 8-11, 12-15 (a column's 4 K bytes
    each), in the registers :func:`interleaved` names, in that order."""
    from jit import asm

    asm.VPUNPCKLBW(t0, r[0], r[1])  # per 128 bits: (row 0, row 1) byte pairs of columns 0-7
    asm.VPUNPCKHBW(r[0], r[0], r[1])  # columns 8-15
    asm.VPUNPCKLBW(t1, r[2], r[3])
    asm.VPUNPCKHBW(r[2], r[2], r[3])
    asm.VPUNPCKLWD(r[1], t0, t1)  # columns 0-3: their 4 rows' bytes in a dword each
    asm.VPUNPCKHWD(t0, t0, t1)  # columns 4-7
    asm.VPUNPCKLWD(r[3], r[0], r[2])  # 8-11
    asm.VPUNPCKHWD(r[0], r[0], r[2])  # 12-15
    return interleaved(r, t0)


def interleaved(r: list, t0) -> list:
    """Where :func:`interleave_rows` leaves columns 0-3, 4-7, 8-11, 12-15 of each 128 bits."""
    return [r[1], t0, r[3], r[0]]


def widen_pairs(x, t0, t1, pick: tuple | None = None) -> tuple:
    """A dword row ``x`` (a column's 4 K bytes a dword) widened: (the first pairs' row,
    the second pairs'), each column's pair as two s16 in a dword; in ``t0`` and ``x``
    (``t1`` clobbered). 512-bit: ``pick`` holds the even and odd dword indexes of two
    tables (:func:`load_pick`)."""
    from jit import asm

    if pick is not None:  # zmm: columns 0-7 and 8-15 widened, each pair picked from both
        even, odd = pick
        asm.VEXTRACTI64X4(t1.as_ymm, x, 1)
        asm.VPMOVSXBW(t1, t1.as_ymm)  # columns 8-15: a dword a pair
        asm.VPMOVSXBW(x, x.as_ymm)  # columns 0-7
        asm.VMOVDQA64(t0, even)
        asm.VPERMI2D(t0, x, t1)  # the first pairs, columns 0-15
        asm.VPERMT2D(x, odd, t1)  # the second pairs
        return t0, x
    asm.VEXTRACTI128(t1.as_xmm, x, 1)
    asm.VPMOVSXBW(t1, t1.as_xmm)  # columns 4-7: per 128 bits, two columns' (pair 0, pair 1)
    asm.VPMOVSXBW(x, x.as_xmm)  # columns 0-3
    asm.VSHUFPS(t0, x, t1, 0x88)  # the first pairs: columns 0 1 4 5 | 2 3 6 7
    asm.VSHUFPS(x, x, t1, 0xDD)  # the second pairs
    asm.VPERMQ(t0, t0, 0xD8)  # 0-7
    asm.VPERMQ(x, x, 0xD8)
    return t0, x


def load_pick(w: Width, even, odd) -> None:
    """The 512-bit widening's indexes (:func:`widen_pairs`): the even dwords of two
    tables, then the odd ones."""
    from peachpy.literal import Constant
    from peachpy.name import Name

    for register, first, name in ((even, 0, "pack_pick_even"), (odd, 1, "pack_pick_odd")):
        w.move(register, Constant._uint32xN(Name(prename=name), w.lanes, *range(first, 2 * w.lanes, 2)))


def start(A, ones8, ones16, vnni: bool, done) -> None:
    """Both kernels' start: nothing to do without chunks; the ones vectors; r10 ldb,
    r11 3 ldb, r12 a group's row of a tile; the first item's B, packed bytes and sums."""
    from jit import asm
    from jit.asm import CMP, JZ, LEA, MOV, rax, r10, r11, r12

    CMP(asm.qword[A("chunks")[0]], 0)
    JZ(done)
    for vector, value in ((ones8, 0x01010101), (ones16, 0x00010001)):  # u8 ones, s16 ones
        MOV(rax.as_dword, value)
        asm.VMOVD(vector.as_xmm, rax.as_dword)
        asm.VPBROADCASTD(vector, vector.as_xmm)
    MOV(r10, A("ldb"))
    LEA(r11, [r10 + r10 * 2])  # 3 rows (columns)
    MOV(r12, A("tile_bytes"))
    for counter, first in (("items_left", "items"), ("item_src", "src"), ("item_dst", "dst"),
                           ("item_sums", "colsum")):
        MOV(rax, A(first))
        MOV(A(counter), rax)


def sum_step(acc, x, ones8, ones16, tmp, vnni: bool) -> None:
    """acc += the column sums of the dword row ``x`` (a column's 4 bytes a dword)."""
    from jit import asm
    from jit.vnni import VPDPBUSD

    if vnni:
        VPDPBUSD(acc, ones8, x)
    else:  # (u8 ones x s8: pairs of |sum| <= 256, no saturation)
        asm.VPMADDUBSW(tmp, ones8, x)
        asm.VPMADDWD(tmp, tmp, ones16)
        asm.VPADDD(acc, acc, tmp)


def next_item(A, item, done, stream: bool) -> None:
    """Both kernels' end of an item: the next one's B, packed bytes and sums, or return
    (after streaming stores, an SFENCE: they are weakly ordered, and another thread's
    product reads them after the hand-off)."""
    from jit import asm
    from jit.asm import ADD, JNZ, LABEL, MOV, rax

    for pointer, stride in (("item_src", "src_item"), ("item_dst", "dst_item"), ("item_sums", "sums_item")):
        MOV(rax, A(stride))
        ADD(A(pointer), rax)
    asm.DEC(asm.qword[A("items_left")[0]])
    JNZ(item)
    LABEL(done)
    if stream:
        asm.SFENCE()
    asm.VZEROUPPER()
    asm.RETURN()
