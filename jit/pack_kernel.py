"""B packed for the VNNI paths in machine code: runtime weights at memory speed.

A VNNI kernel reads B (K x N s8, row-major) as ``[tile][group][column of the tile][4]``:
the four bytes of a K group of one column as one dword (``gemm_pack.pack_b``). numpy
builds that with strided byte copies (a 768 x 768 B: about 0.3 ms, 0.55 with the
saturation proof, which VNNI does not need); a matmul whose weights change from call to
call (attention's K and V) paid it on every call. This kernel does it in one pass, eight
columns at a time::

    for each block of 16 K groups (64 rows, which stay in L2 while it is swept):
        for each chunk of 8 columns:
            for each K group (4 rows) of the block:
                4 x VMOVQ (8 bytes of each row), VPUNPCKLBW x 2, VPUNPCKLWD/HWD: the 8
                columns' dwords, in order; one 32-byte store at (tile, group, column)
                their sums: VPMADDUBSW by ones (s16 pairs, no saturation), VPMADDWD by ones
            the chunk's 8 column sums (int32) added to the block's before

(A column of chunks walked down all of K, as a first version did, read a 4096-wide B
at 1.1 GB/s: its rows 4096 bytes apart all fell in the same cache sets.)

It reads whole groups and chunks only (K a multiple of 4, N of 8; :class:`VnniPacker`
pads a copy of B where they are not) and writes nothing past the chunks (the output's
padding columns stay as they were: zero). AVX2 only, so every path has it.

Example::

    >>> import numpy as np
    >>> from jit.dot import fast_path
    >>> b = np.arange(-60, 60, dtype=np.int8).reshape(8, 15)
    >>> packed = pack_vnni(b, fast_path("avx512_core_vnni"), 1)
    >>> from primitives.gemm_pack import pack_b
    >>> bool((packed.data == pack_b(b, fast_path("avx512_core_vnni"), 1, (0, 0)).data).all())
    True
    >>> packed.colsum[:3].tolist()
    [-60, -52, -44]
"""
from __future__ import annotations

ARGS_CDEF = """
struct i8j_pack_args {
    void *src; void *dst; void *colsum;
    int64_t ldb; int64_t groups; int64_t chunks; int64_t tile_bytes; int64_t tile_stride;
    int64_t left; int64_t block;  /* the kernel's own: groups left, and in this block */
};
"""
SIGNATURE = "void (*)(struct i8j_pack_args *)"
FIELDS = ("src", "dst", "colsum", "ldb", "groups", "chunks", "tile_bytes", "tile_stride", "left", "block")
ISA = "avx2"
CHUNK = 8  # columns a pass
BLOCK = 16  # K groups a sweep over the columns


def args_offsets() -> dict[str, int]:
    from runtime.ffi import declare, struct_offsets

    declare(ARGS_CDEF, (SIGNATURE, "struct i8j_pack_args *"))
    return struct_offsets(ARGS_CDEF, "struct i8j_pack_args", FIELDS)


def pack_kernel():
    """The VNNI B-packing kernel (generated once, then from the caches)."""
    from jit import cache

    args_offsets()  # declares the struct for callers
    return cache.get_kernel(("pack_b_vnni", ISA), generate)


def pack_vnni(b_kn, path, nr: int):
    """``b_kn`` (K x N s8, any strides) packed for the VNNI ``path`` with tiles of ``nr``
    vectors: a ``PackedB`` equal to ``gemm_pack.pack_b``'s, column sums included, without
    the saturation proof (VNNI needs none: ``safe_pairs`` and ``total_pairs`` are None)."""
    return VnniPacker(*b_kn.shape, path, nr)(b_kn)


class VnniPacker:
    """Packs K x N s8 weights into the same ``PackedB`` (its buffers made once) on every
    call: runtime weights, whose kernel calls then keep pointing at one B.

    >>> import numpy as np
    >>> from jit.dot import fast_path
    >>> pack = VnniPacker(4, 8, fast_path("avx2_vnni"), 1)
    >>> first = pack(np.ones((4, 8), np.int8))
    >>> again = pack(np.full((4, 8), 2, np.int8))
    >>> again is first, first.colsum.tolist()
    (True, [8, 8, 8, 8, 8, 8, 8, 8])
    """

    def __init__(self, k: int, n: int, path, nr: int) -> None:
        import numpy as np

        from primitives.gemm_pack import PackedB
        from primitives.memory import aligned_zeros
        from runtime.ffi import ffi, pointer_to

        if path.kind != "vnni":
            raise ValueError(f"path: {path.kind}; VnniPacker packs for VPDPBUSD (vnni) paths only")
        self.k, self.n = k, n
        tile_n = nr * path.lanes
        tiles, groups = -(-n // tile_n), -(-k // 4)
        self._n8 = -(-n // CHUNK) * CHUNK
        self._padded = None  # a copy of B in whole groups and chunks, where B is not so
        data = aligned_zeros(tiles * tile_n * groups * 4)  # (padding columns: zero, never written)
        self._sums = np.zeros(tiles * tile_n, np.int32)
        self.packed = PackedB(data, n, k, tile_n, tiles, data.nbytes // tiles, np.zeros(tiles * tile_n, np.int64),
                              None, None)
        # (the Kernel held, not only its function: its code stays mapped while a replay
        # or a bound call may still pack with this packer)
        self._code = pack_kernel() if groups and n else None
        self._kernel = self._code.function if self._code is not None else None
        self._args = ffi.new("struct i8j_pack_args *", dict(groups=groups, chunks=self._n8 // CHUNK,
                                                            tile_bytes=4 * tile_n, tile_stride=4 * tile_n * groups))
        self._args.dst, self._args.colsum = pointer_to(data), pointer_to(self._sums)
        self._src = None  # the array s.src points into (kept alive with it)

    def __call__(self, b_kn):
        """Pack ``b_kn`` (its values now) into :attr:`packed`, which it returns."""
        import numpy as np

        from runtime.ffi import pointer_to

        if b_kn.shape != (self.k, self.n):
            raise ValueError(f"weights: expected K x N = {(self.k, self.n)}, got {b_kn.shape}")
        src = b_kn
        if self.k % 4 or self.n % CHUNK or src.strides[1] != 1 or src.strides[0] < self._n8:
            if self._padded is None:
                self._padded = np.zeros((-(-self.k // 4) * 4, self._n8), np.int8)
            src = self._padded
            src[:self.k, :self.n] = b_kn
        if src is not self._src:
            self._args.src, self._args.ldb, self._src = pointer_to(src), src.strides[0], src
        if self._kernel is not None:
            self._sums[...] = 0  # (the kernel adds each block's sums)
            self._kernel(self._args)
        self.packed.colsum[:self._sums.size] = self._sums
        return self.packed


def generate():
    """Generate the kernel's code (PeachPy); see :func:`pack_kernel`."""
    from jit import asm
    from jit.build import generate as build

    argument = asm.Argument(asm.ptr(asm.uint8_t), "args")
    return build("pack_b_vnni", ISA, SIGNATURE, (argument,), lambda: _emit(argument))


def _emit(argument) -> None:
    from jit import asm
    from jit.asm import (ADD, CMP, DEC, IMUL, JNZ, JZ, LABEL, LEA, MOV, SUB, TEST, XOR, Label, rax, rbp, rbx, rcx,
                         rdi, rdx, rsi, r8, r9, r10, r11, r12, r13, r14, r15)

    off = args_offsets()
    A = lambda f: [rdi + off[f]]  # noqa: E731
    x = [asm.xmm1, asm.xmm2, asm.xmm3, asm.xmm4]
    y1, y2, acc, ones8, ones16 = asm.ymm1, asm.ymm2, asm.ymm0, asm.ymm5, asm.ymm6
    asm.LOAD.ARGUMENT(rdi, argument)
    done, block, chunk, group, next_tile = Label(), Label(), Label(), Label(), Label()
    MOV(rax, A("groups"))
    MOV(A("left"), rax)
    TEST(rax, rax)
    JZ(done)
    CMP(asm.qword[rdi + off["chunks"]], 0)
    JZ(done)
    MOV(rax.as_dword, 0x01010101)  # u8 ones (VPMADDUBSW's unsigned operand), then s16 ones
    asm.VMOVD(ones8.as_xmm, rax.as_dword)
    asm.VPBROADCASTD(ones8, ones8.as_xmm)
    MOV(rax.as_dword, 0x00010001)
    asm.VMOVD(ones16.as_xmm, rax.as_dword)
    asm.VPBROADCASTD(ones16, ones16.as_xmm)
    MOV(rdx, A("src"))  # the block's first row
    XOR(rbp.as_dword, rbp.as_dword)  # the block's first group, in bytes of a tile's groups
    MOV(r10, A("ldb"))
    LEA(r11, [r10 + r10 * 2])  # 3 rows
    MOV(r12, A("tile_bytes"))  # bytes of one group of a tile: a column's dword each
    MOV(r15, A("tile_stride"))
    # Blocks of BLOCK groups, each swept chunk by chunk: the block's rows stay in L2
    # between chunks (a column of a 4096-wide B walked whole: every row a set conflict).
    LABEL(block)
    MOV(r9, A("left"))
    MOV(rcx, BLOCK)
    CMP(r9, rcx)
    asm.CMOVA(r9, rcx)
    MOV(A("block"), r9)  # this block's groups
    SUB(A("left"), r9)
    MOV(rsi, rdx)  # the chunk's first column, the block's first row
    MOV(r14, A("dst"))  # the chunk's tile
    XOR(r13.as_dword, r13.as_dword)  # the chunk's byte offset in its tile's groups
    MOV(rbx, A("colsum"))  # the chunk's sums
    MOV(r8, A("chunks"))
    LABEL(chunk)
    asm.VPXOR(acc, acc, acc)
    MOV(rax, rsi)
    LEA(rcx, [r14 + r13 * 1])
    ADD(rcx, rbp)
    MOV(r9, A("block"))
    LABEL(group)
    asm.VMOVQ(x[0], asm.qword[rax])
    asm.VMOVQ(x[1], asm.qword[rax + r10 * 1])
    asm.VMOVQ(x[2], asm.qword[rax + r10 * 2])
    asm.VMOVQ(x[3], asm.qword[rax + r11 * 1])
    asm.VPUNPCKLBW(x[0], x[0], x[1])  # r0[c] r1[c], c = 0..7
    asm.VPUNPCKLBW(x[2], x[2], x[3])  # r2[c] r3[c]
    asm.VPUNPCKHWD(x[1], x[0], x[2])  # columns 4..7: r0 r1 r2 r3 each
    asm.VPUNPCKLWD(x[0], x[0], x[2])  # columns 0..3
    asm.VINSERTI128(y1, y1, x[1], 1)
    asm.VMOVDQU([rcx], y1)
    asm.VPMADDUBSW(y2, ones8, y1)  # 1 * w pairs: s16, |sum| <= 256
    asm.VPMADDWD(y2, y2, ones16)
    asm.VPADDD(acc, acc, y2)
    LEA(rax, [rax + r10 * 4])
    ADD(rcx, r12)
    DEC(r9)
    JNZ(group)
    asm.VPADDD(acc, acc, [rbx])  # (the sums start at zero: pack_vnni's)
    asm.VMOVDQU([rbx], acc)
    ADD(rbx, 4 * CHUNK)
    ADD(rsi, CHUNK)
    ADD(r13, 4 * CHUNK)
    CMP(r13, r12)
    asm.JB(next_tile)
    XOR(r13.as_dword, r13.as_dword)  # the tile is done: the next one's groups
    ADD(r14, r15)
    LABEL(next_tile)
    DEC(r8)
    JNZ(chunk)
    MOV(r9, A("block"))  # past the block: its rows, its groups
    LEA(rax, [r10 * 4])
    IMUL(rax, r9)
    ADD(rdx, rax)
    MOV(rax, r12)
    IMUL(rax, r9)
    ADD(rbp, rax)
    CMP(asm.qword[rdi + off["left"]], 0)
    JNZ(block)
    LABEL(done)
    asm.VZEROUPPER()
    asm.RETURN()
