"""B packed from rows of N bytes with 512-bit registers: whole cache lines a load.

The AVX2 kernels of ``jit.pack_kernel`` read 8-16 bytes of each row a pass and spend
5 shuffles a 32-byte group: about 19 GB/s on a Zen 4 wherever B sits, 105 us for a
2048 x 1000 B against a 290 us product. On a 512-bit path this kernel reads 64 columns
of four rows (a K group) as four whole lines and makes the four 16-column dword rows of
the VNNI layout with 12 shuffles::

    for each chunk of 64 columns (the last one masked: bytes past N load as zero):
        for each K group (its 1-3 row tail: the missing rows are zero):
            r0..r3 = the group's rows, 64 bytes each
            VPERMD each row: lane L's dwords become the row's dwords L, 4+L, 8+L, 12+L
            VPUNPCKL/HBW(r0, r1), (r2, r3): byte pairs; VPUNPCKL/HWD of those: in lane
                L, the 4-byte groups of columns 4L..4L+3 (+16, +32, +48): after the
                VPERMD the four results are columns 0-15, 16-31, 32-47, 48-63 in order
            each stored at its 16 columns' place in the tiles, their sums taken
                (VPDPBUSD by u8 ones; without VNNI VPMADDUBSW and VPMADDWD by ones)
        the chunk's four column sums stored (int32)

Where a 16-column quarter of a chunk lands is read from a table (``quarters``: byte
offsets in the item's packed B) so any tile width in 16s works. A last chunk's
quarters past the packed columns point at its last real quarter, stored before it
(they hold zeros: the masked columns): nothing is written outside the packed B.
Each line of B is read once, so the chunk walks down K with no blocking; the tiles'
rows it writes are consecutive for a 64-column tile.
"""
from __future__ import annotations

CHUNK = 64  # columns a pass: a zmm of each row
QUARTER = 16  # columns of one stored dword row (a zmm)
BLOCK = 4  # K groups a sweep over the chunks (4: 37-44 GB/s on a Zen 4; 16: 30-38)
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


def emit(argument, offsets: dict, vnni: bool) -> None:
    """The kernel's body (``offsets``: the args struct's field offsets, ``jit.pack_kernel``;
    ``vnni``: the column sums by VPDPBUSD, else VPMADDUBSW and VPMADDWD)."""
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
    CMP(asm.qword[A("chunks")[0]], 0)
    JZ(done)
    MOV(rax.as_dword, 0x01010101)  # u8 ones, then s16 ones
    asm.VPBROADCASTD(ones8, rax.as_dword)
    if not vnni:
        MOV(rax.as_dword, 0x00010001)
        asm.VPBROADCASTD(ones16, rax.as_dword)
    asm.VMOVDQU32(perm, Constant._uint32xN(Name(prename="pack512_perm"), 16, *perm_dwords()))
    MOV(r10, A("ldb"))
    LEA(r11, [r10 + r10 * 2])  # 3 rows
    MOV(r12, A("tile_bytes"))  # a group's row of a tile
    for counter, start in (("items_left", "items"), ("item_src", "src"), ("item_dst", "dst"),
                           ("item_sums", "colsum")):
        MOV(rax, A(start))
        MOV(A(counter), rax)

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
            if vnni:
                VPDPBUSD(acc[j], ones8, rows[j])
            else:  # (u8 ones x s8: pairs of |sum| <= 256, no saturation)
                asm.VPMADDUBSW(tmp, ones8, rows[j])
                asm.VPMADDWD(tmp, tmp, ones16)
                asm.VPADDD(acc[j], acc[j], tmp)

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
    for pointer, stride in (("item_src", "src_item"), ("item_dst", "dst_item"), ("item_sums", "sums_item")):
        MOV(rax, A(stride))
        ADD(A(pointer), rax)
    DEC(asm.qword[A("items_left")[0]])
    JNZ(item)
    LABEL(done)
    asm.VZEROUPPER()
    asm.RETURN()


def kernel_name(vnni: bool) -> str:
    return "pack_b_vnni_rows512" + ("" if vnni else "_madd")


def rows512_kernel(vnni: bool):
    """The kernel (sums by VPDPBUSD where ``vnni``), generated once, then from the caches."""
    from jit import cache
    from jit.pack_kernel import args_offsets

    args_offsets()  # declares the struct for callers
    return cache.get_kernel(cache_key(vnni), lambda: generate(vnni))


def cache_key(vnni: bool) -> tuple:
    return kernel_name(vnni), ISA + ("_vnni" if vnni else "")


def generate(vnni: bool):
    """Generate the kernel's code (PeachPy); see :func:`rows512_kernel`."""
    from jit import asm
    from jit.build import generate as build
    from jit.pack_kernel import SIGNATURE, args_offsets

    argument = asm.Argument(asm.ptr(asm.uint8_t), "args")
    isa = ISA + ("_vnni" if vnni else "")
    return build(kernel_name(vnni), isa, SIGNATURE, (argument,), lambda: emit(argument, args_offsets(), vnni))
