"""B packed with 512-bit registers, from rows of N bytes or columns of K: whole lines a load.

The AVX2 kernels of ``jit.pack_kernel`` read 8-16 bytes of each row a pass and spend
5 shuffles a 32-byte group: about 19-24 GB/s on a Zen 4 wherever B sits, 105 us for a
2048 x 1000 B against a 290 us product. On a 512-bit path these kernels read whole
64-byte lines and write whole 16-column dword rows of the VNNI layout (VPMADDUBSW
reads it too)::

    rows of N (K x N row-major; a matmul's ab weights, attention's values):
    for each block of 4 K groups (its rows span few pages), for each chunk of 64 columns
    (the last one masked: bytes past N load as zero):
        for each K group of the block (the last group's missing 1-3 rows zero):
            r0..r3 = the group's rows, 64 bytes each
            VPERMD each row: lane L's dwords become the row's dwords L, 4+L, 8+L, 12+L
            VPUNPCKL/HBW(r0, r1), (r2, r3): byte pairs; VPUNPCKL/HWD of those: in lane
                L, the 4-byte groups of columns 4L..4L+3 (+16, +32, +48): after the
                VPERMD the four results are columns 0-15, 16-31, 32-47, 48-63 in order
            each stored at its 16 columns' place in the tiles, and summed
    columns of K (N x K row-major; an inner product's OC x K, a matmul's ba, keys):
    for each quarter of 16 columns (the missing ones of the last: zero vectors),
    for each block of 16 K groups (64 bytes of each column; the last one masked):
        the 16 x 16 dword transpose (VPUNPCKL/HDQ, VPUNPCKL/HQDQ, two VSHUFI64X2
        stages): the block's 16 group rows of the quarter, stored (the last block's
        groups past K not) and summed

The column sums: VPDPBUSD by u8 ones, or without VNNI VPMADDUBSW and VPMADDWD by
ones (pairs of |sum| <= 256: no saturation). Where a 16-column quarter lands is read
from a table (``quarters``: byte offsets in the item's packed B), so any tile width in
16s works. A rows chunk's quarters past the packed columns point at its last real
quarter, stored before it (they hold zeros: the masked columns): nothing is written
outside the packed B, and no padded copy of B is needed.
"""
from __future__ import annotations

CHUNK = 64  # columns a pass of the rows kernel: a zmm of each row
QUARTER = 16  # columns of one stored dword row (a zmm): a pass of the columns kernel
BLOCK = 4  # K groups a sweep over the rows kernel's chunks (4: 37-44 GB/s on a Zen 4; 16: 30-38)
COLUMN_BLOCK = 16  # K groups a step of the columns kernel (a zmm of each column)
ISA = "avx512_core"  # VNNI sums need avx512_core_vnni


def perm_dwords() -> list[int]:
    """VPERMD's index: lane L's dword m takes the row's dword 4m + L."""
    return [4 * (p % 4) + p // 4 for p in range(16)]


def quarter_offsets(columns: int, tile_n: int, tile_stride: int) -> list[int]:
    """Byte offsets in a packed B (tiles of ``tile_n`` columns, ``tile_stride`` bytes apart;
    a group's row of a tile is ``4 tile_n`` bytes) of each 16-column quarter of whole
    64-column chunks covering ``columns``; quarters past the tiles repeat the last
    quarter inside them (the kernel stores them first, then the real one over them)."""
    tiles = -(-columns // tile_n)
    inside = tiles * tile_n // QUARTER
    quarters = -(-columns // CHUNK) * (CHUNK // QUARTER)
    offsets = []
    for q in range(quarters):
        column = min(q, inside - 1) * QUARTER
        offsets.append(column // tile_n * tile_stride + column % tile_n * 4)
    return offsets


def emit_rows(argument, offsets: dict, vnni: bool) -> None:
    """The rows kernel's body (``offsets``: the args struct's field offsets,
    ``jit.pack_kernel``; ``vnni``: the column sums by VPDPBUSD, else VPMADDUBSW and VPMADDWD)."""
    from peachpy.literal import Constant
    from peachpy.name import Name

    from jit import asm
    from jit.asm import (ADD, CMP, DEC, IMUL, JB, JNE, JNZ, JZ, LABEL, LEA, MOV, SUB, TEST, Label, rax, rbp, rbx, rcx,
                         rdi, rdx, rsi, r8, r9, r10, r11, r12, r13, r14, r15)
    from jit.vnni import VPDPBUSD

    A = lambda f: [rdi + offsets[f]]  # noqa: E731
    z = [getattr(asm, f"zmm{i}") for i in range(32)]
    rows, pairs, acc = z[0:4], z[4:8], z[16:20]
    ones8, ones16, perm, tmp = z[20], z[21], z[22], z[23]
    kmask = asm.k1
    asm.LOAD.ARGUMENT(rdi, argument)
    done, item, block, chunk, whole, added, summed, group, tail, go, tail_done = (Label() for _ in range(11))
    _start(A, ones8, ones16, vnni, done)
    asm.VMOVDQU32(perm, Constant._uint32xN(Name(prename="pack512_perm"), 16, *perm_dwords()))

    def process() -> None:
        """The group in ``rows``: permuted, interleaved, stored at [quarter + rbp], summed."""
        for r in rows:
            asm.VPERMD(r, perm, r)
        asm.VPUNPCKLBW(pairs[0], rows[0], rows[1])
        asm.VPUNPCKHBW(pairs[1], rows[0], rows[1])
        asm.VPUNPCKLBW(pairs[2], rows[2], rows[3])
        asm.VPUNPCKHBW(pairs[3], rows[2], rows[3])
        asm.VPUNPCKLWD(rows[0], pairs[0], pairs[2])  # columns 0-15
        asm.VPUNPCKHWD(rows[1], pairs[0], pairs[2])  # 16-31
        asm.VPUNPCKLWD(rows[2], pairs[1], pairs[3])  # 32-47
        asm.VPUNPCKHWD(rows[3], pairs[1], pairs[3])  # 48-63
        for j, base in ((3, rdx), (2, r15), (1, r14), (0, r13)):  # (last first: see the module)
            asm.VMOVDQU64([base + rbp * 1], rows[j])
        for j in range(4):
            _sum(acc[j], rows[j], ones8, ones16, tmp, vnni)

    def load(r, address) -> None:
        asm.VMOVDQU8(r(kmask.z), address)

    LABEL(item)
    MOV(rax, A("item_src"))
    MOV(A("block_src"), rax)
    MOV(asm.qword[A("block_off")[0]], 0)
    MOV(rax, A("groups"))
    MOV(A("left"), rax)
    # Blocks of BLOCK groups, each for every chunk: a block's rows span few pages (a
    # column of chunks walked down a 4096-wide B whole: a page a row, 5.6 GB/s).
    LABEL(block)
    MOV(r9, A("left"))
    MOV(rax, BLOCK)
    CMP(r9, rax)
    asm.CMOVA(r9, rax)
    MOV(A("block"), r9)  # this block's groups
    SUB(A("left"), r9)
    MOV(rsi, A("block_src"))  # the chunk's first column, the block's first row
    MOV(rbx, A("item_sums"))  # the chunk's sums
    MOV(rcx, A("quarters"))  # the chunk's quarters' offsets
    MOV(r8, A("chunks"))
    LABEL(chunk)
    asm.KXNORQ(kmask, kmask, kmask)  # every column, but in the last chunk
    CMP(r8, 1)
    JNE(whole)
    asm.KMOVQ(kmask, A("last_mask"))
    LABEL(whole)
    CMP(asm.qword[A("block_off")[0]], 0)  # the first block's sums start at zero, the others add
    JNE(added)
    for a in acc:
        asm.VPXORD(a, a, a)
    asm.JMP(summed)
    LABEL(added)
    for j, a in enumerate(acc):
        asm.VMOVDQU32(a, [rbx + 64 * j])
    LABEL(summed)
    MOV(rdx, A("item_dst"))
    for j, base in ((0, r13), (1, r14), (2, r15)):
        MOV(base, rdx)
        ADD(base, [rcx + 8 * j])
    ADD(rdx, [rcx + 24])
    MOV(rax, rsi)
    MOV(rbp, A("block_off"))  # the group's row in the tiles
    MOV(r9, A("block"))
    TEST(r9, r9)
    JZ(tail)
    LABEL(group)
    for r, address in zip(rows, ([rax], [rax + r10 * 1], [rax + r10 * 2], [rax + r11 * 1])):
        load(r, address)
    process()
    LEA(rax, [rax + r10 * 4])
    ADD(rbp, r12)
    DEC(r9)
    JNZ(group)
    LABEL(tail)  # after the last block, K % 4 rows: row 0, then 1 and 2 where they exist
    CMP(asm.qword[A("left")[0]], 0)
    JNE(tail_done)
    MOV(r9, A("k_rem"))
    TEST(r9, r9)
    JZ(tail_done)
    for r in rows[1:]:
        asm.VPXORD(r, r, r)
    load(rows[0], [rax])
    CMP(r9, 2)
    JB(go)
    load(rows[1], [rax + r10 * 1])
    CMP(r9, 3)
    JB(go)
    load(rows[2], [rax + r10 * 2])
    LABEL(go)
    process()  # (the missing rows zero: VPERMD of zero is zero)
    LABEL(tail_done)
    for j in range(4):
        asm.VMOVDQU32([rbx + 64 * j], acc[j])
    ADD(rbx, 4 * CHUNK)
    ADD(rsi, CHUNK)
    ADD(rcx, 8 * (CHUNK // QUARTER))
    DEC(r8)
    JNZ(chunk)
    MOV(r9, A("block"))  # past the block: its rows, its groups' rows in the tiles
    LEA(rax, [r10 * 4])
    IMUL(rax, r9)
    ADD(A("block_src"), rax)
    MOV(rax, r12)
    IMUL(rax, r9)
    ADD(A("block_off"), rax)
    CMP(asm.qword[A("left")[0]], 0)
    JNZ(block)
    _next_item(A, item, done)


def _start(A, ones8, ones16, vnni: bool, done) -> None:
    """Both kernels' start: nothing to do without chunks; the ones vectors; r10 ldb,
    r11 3 ldb, r12 a group's row of a tile; the first item's B, packed bytes and sums."""
    from jit import asm
    from jit.asm import CMP, JZ, LEA, MOV, rax, r10, r11, r12

    CMP(asm.qword[A("chunks")[0]], 0)
    JZ(done)
    MOV(rax.as_dword, 0x01010101)  # u8 ones, then s16 ones
    asm.VPBROADCASTD(ones8, rax.as_dword)
    if not vnni:
        MOV(rax.as_dword, 0x00010001)
        asm.VPBROADCASTD(ones16, rax.as_dword)
    MOV(r10, A("ldb"))
    LEA(r11, [r10 + r10 * 2])  # 3 rows (columns)
    MOV(r12, A("tile_bytes"))
    for counter, start in (("items_left", "items"), ("item_src", "src"), ("item_dst", "dst"),
                           ("item_sums", "colsum")):
        MOV(rax, A(start))
        MOV(A(counter), rax)


def _sum(acc, x, ones8, ones16, tmp, vnni: bool) -> None:
    """acc += the column sums of the dword row ``x`` (a column's 4 bytes a dword)."""
    from jit import asm
    from jit.vnni import VPDPBUSD

    if vnni:
        VPDPBUSD(acc, ones8, x)
    else:  # (u8 ones x s8: pairs of |sum| <= 256, no saturation)
        asm.VPMADDUBSW(tmp, ones8, x)
        asm.VPMADDWD(tmp, tmp, ones16)
        asm.VPADDD(acc, acc, tmp)


def _next_item(A, item, done) -> None:
    """Both kernels' end of an item: the next one's B, packed bytes and sums, or return."""
    from jit import asm
    from jit.asm import ADD, JNZ, LABEL, MOV, rax

    for pointer, stride in (("item_src", "src_item"), ("item_dst", "dst_item"), ("item_sums", "sums_item")):
        MOV(rax, A(stride))
        ADD(A(pointer), rax)
    asm.DEC(asm.qword[A("items_left")[0]])
    JNZ(item)
    LABEL(done)
    asm.VZEROUPPER()
    asm.RETURN()


def emit_columns(argument, offsets: dict, vnni: bool) -> None:
    """The columns kernel's body (as :func:`emit_rows`)."""
    from jit import asm
    from jit.asm import (ADD, CMP, DEC, JBE, JE, JMP, JNE, JNZ, LABEL, LEA, MOV, Label, rax, rbp, rbx, rcx, rdi, rdx,
                         rsi, r8, r9, r10, r11, r12, r13, r14, r15)

    A = lambda f: [rdi + offsets[f]]  # noqa: E731
    z = [getattr(asm, f"zmm{i}") for i in range(32)]
    acc, ones8, ones16, tmp = z[24:28], z[28], z[29], z[30]
    kmask = asm.k1
    bases = (rax, rbx, rcx, rdx)  # columns 0, 4, 8, 12 of the quarter
    columns = [address for b in bases for address in ([b], [b + r10 * 1], [b + r10 * 2], [b + r11 * 1])]
    rows = [[rbp], [rbp + r12 * 1], [rbp + r12 * 2], [rbp + r13 * 1]]  # a quad of groups' rows in the tiles
    asm.LOAD.ARGUMENT(rdi, argument)
    done, item, chunk, block, whole_k, partial, loaded, partial_stores, stored = (Label() for _ in range(9))
    _start(A, ones8, ones16, vnni, done)
    LEA(r13, [r12 + r12 * 2])  # 3 groups' rows
    LABEL(item)
    MOV(rsi, A("item_src"))  # the quarter's first column
    MOV(r14, A("item_sums"))  # its sums
    MOV(r15, A("quarters"))  # its offset in the packed B
    MOV(r8, A("chunks"))
    LABEL(chunk)
    MOV(r9, A("blocks"))
    MOV(A("left"), r9)
    MOV(r9.as_dword, QUARTER)  # the quarter's columns: 16, but in the part's last
    CMP(r8, 1)
    asm.CMOVE(r9, A("last_columns"))
    MOV(rbp, A("item_dst"))
    ADD(rbp, [r15])
    MOV(rax, rsi)
    for prev, base in zip(bases, bases[1:]):
        LEA(base, [prev + r10 * 4])
    for a in acc:
        asm.VPXORD(a, a, a)
    LABEL(block)
    asm.KXNORQ(kmask, kmask, kmask)  # 64 bytes of each column, but in the last block
    CMP(asm.qword[A("left")[0]], 1)
    JNE(whole_k)
    asm.KMOVQ(kmask, A("last_mask"))
    LABEL(whole_k)
    v = z[:QUARTER]  # column j's 16 groups
    CMP(r9, QUARTER)
    JNE(partial)
    for x, address in zip(v, columns):
        asm.VMOVDQU8(x(kmask.z), address)
    JMP(loaded)
    LABEL(partial)  # the last quarter's columns, then zeros
    zeros = [Label() for _ in range(QUARTER)]
    for j, (x, address) in enumerate(zip(v, columns)):
        if j:
            CMP(r9, j)
            JBE(zeros[j])
        asm.VMOVDQU8(x(kmask.z), address)
    JMP(loaded)
    for j in range(1, QUARTER):
        LABEL(zeros[j])
        asm.VPXORD(v[j], v[j], v[j])
    LABEL(loaded)
    out = _transpose16(v, z[16:24])  # group g's row of the 16 columns
    CMP(asm.qword[A("left")[0]], 1)
    JE(partial_stores)
    for g, x in enumerate(out):
        asm.VMOVDQU64(rows[g % 4], x)
        if g % 4 == 3:
            LEA(rbp, [rbp + r12 * 4])
    JMP(stored)
    LABEL(partial_stores)  # the last block: its groups only
    for g, x in enumerate(out):
        if g:
            CMP(asm.qword[A("last_groups")[0]], g)
            JBE(stored)
        asm.VMOVDQU64(rows[g % 4], x)
        if g % 4 == 3:
            LEA(rbp, [rbp + r12 * 4])
    LABEL(stored)
    for g, x in enumerate(out):
        _sum(acc[g % 4], x, ones8, ones16, tmp, vnni)
    for base in bases:
        ADD(base, 4 * COLUMN_BLOCK)
    DEC(asm.qword[A("left")[0]])
    JNZ(block)
    asm.VPADDD(acc[0], acc[0], acc[1])
    asm.VPADDD(acc[2], acc[2], acc[3])
    asm.VPADDD(acc[0], acc[0], acc[2])
    asm.VMOVDQU32([r14], acc[0])
    ADD(r14, 4 * QUARTER)
    LEA(rsi, [rsi + r10 * 8])
    LEA(rsi, [rsi + r10 * 8])
    ADD(r15, 8)
    DEC(r8)
    JNZ(chunk)
    _next_item(A, item, done)


def _transpose16(v: list, spare: list) -> list:
    """The 16 x 16 dword transpose of ``v`` (row j: column j's 16 K groups) in place and
    in ``spare`` (2 needed): the 16 rows of the result (row g: group g of the 16 columns),
    in whichever registers they end in."""
    from jit import asm

    free = list(spare)

    def new():
        return free.pop(0)

    lo, hi = [], []
    for p in range(8):  # dwords of column pairs: in lane L, (2p, 2p+1) x groups 4L, 4L+1 | 4L+2, 4L+3
        a, b = v[2 * p], v[2 * p + 1]
        t = new()
        asm.VPUNPCKLDQ(t, a, b)
        asm.VPUNPCKHDQ(a, a, b)
        free.append(b)
        lo.append(t)
        hi.append(a)
    quads = [[None] * 4 for _ in range(4)]  # [q][m]: in lane L, group 4L+m of columns 4q..4q+3
    for q in range(4):
        for m0, (x, y) in ((0, (lo[2 * q], lo[2 * q + 1])), (2, (hi[2 * q], hi[2 * q + 1]))):
            t = new()
            asm.VPUNPCKLQDQ(t, x, y)
            asm.VPUNPCKHQDQ(x, x, y)
            free.append(y)
            quads[q][m0], quads[q][m0 + 1] = t, x
    out = [None] * 16
    for m in range(4):  # lanes: a 4 x 4 transpose of the quads' 128-bit blocks
        a, b, c, d = (quads[q][m] for q in range(4))
        p = new()
        asm.VSHUFI64X2(p, a, b, 0x44)  # a0 a1 b0 b1
        asm.VSHUFI64X2(b, a, b, 0xEE)  # a2 a3 b2 b3
        free.append(a)
        r = new()
        asm.VSHUFI64X2(r, c, d, 0x44)  # c0 c1 d0 d1
        asm.VSHUFI64X2(d, c, d, 0xEE)  # c2 c3 d2 d3
        free.append(c)
        for first, (x, y) in ((0, (p, r)), (8, (b, d))):
            t = new()
            asm.VSHUFI64X2(t, x, y, 0x88)  # x0 x2 y0 y2: group first + m
            asm.VSHUFI64X2(x, x, y, 0xDD)  # x1 x3 y1 y3: group first + 4 + m
            free.append(y)
            out[first + m], out[first + 4 + m] = t, x
    return out


def kernel_name(columns: bool, vnni: bool) -> str:
    return "pack_b_vnni_" + ("columns512" if columns else "rows512") + ("" if vnni else "_madd")


def cache_key(columns: bool, vnni: bool) -> tuple:
    return kernel_name(columns, vnni), ISA + ("_vnni" if vnni else "")


def pack512_kernel(columns: bool, vnni: bool):
    """The rows (or columns) kernel, its sums by VPDPBUSD where ``vnni``; generated once,
    then from the caches."""
    from jit import cache
    from jit.pack_kernel import args_offsets

    args_offsets()  # declares the struct for callers
    return cache.get_kernel(cache_key(columns, vnni), lambda: generate(columns, vnni))


def generate(columns: bool, vnni: bool):
    """Generate the kernel's code (PeachPy); see :func:`pack512_kernel`."""
    from jit import asm
    from jit.build import generate as build
    from jit.pack_kernel import SIGNATURE, args_offsets

    argument = asm.Argument(asm.ptr(asm.uint8_t), "args")
    emit = emit_columns if columns else emit_rows
    return build(kernel_name(columns, vnni), cache_key(columns, vnni)[1], SIGNATURE, (argument,),
                 lambda: emit(argument, args_offsets(), vnni))
