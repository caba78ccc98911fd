"""B packed in machine code: runtime weights at memory speed.

A VNNI kernel reads B (K x N s8) as ``[tile][group][column of the tile][4]``: the four
bytes of a K group of one column as one dword (``gemm_pack.pack_b``). numpy builds that
with strided copies (a 768 x 768 B: about 0.3 ms, 0.55 with the saturation proof, which
VNNI does not need); a matmul whose weights change from call to call (attention's K and
V) paid it on every call. Two kernels do it in one pass, AVX2 code (every path has it),
each thread a range of tiles, a batch's items one after another in one call::

    rows of N bytes (K x N row-major), 8 columns a pass (16 where the tiles are whole 16s):
        for each block of 16 K groups (64 rows, in L2 while it is swept):
            for each chunk of columns, for each K group of the block:
                VMOVQ (VMOVDQU) of 4 rows, VPUNPCKLBW (and HBW), VPUNPCKLWD/HWD: the
                columns' dwords in order, 32-byte stores at (tile, group, column);
                their sums: VPMADDUBSW by ones (s16 pairs, no saturation), VPMADDWD by ones
            the chunk's column sums (int32) added to the blocks' before
    columns of K bytes (an inner product's OC x K rows, a matmul's ba weights):
        for each chunk of 8 columns, for each 4 K groups (16 bytes of each column):
            a 4 x 4 dword transpose of each half (VPUNPCK*DQ, VPUNPCK*QDQ), VINSERTI128:
            the 4 groups' 32-byte rows, stored and summed as above

(A first rows kernel walked each chunk down all of K: a 4096-wide B at 1.1 GB/s, its
rows 4096 bytes apart all in the same cache sets.)

The VPMADDUBSW path reads the same layout (under ``faithful`` its weights need no
proof either). The widening path's layout (``widen``, exact on AVX2 and AVX-512BW
whatever the weights) holds each group as two rows of dwords, a column's first and
second K pairs as s16: the same kernels, each group's dwords sign-extended (VPMOVSXBW)
and split by pair (VSHUFPS, VPERMQ) before the stores, summed by VPMADDWD by ones.

They read whole groups and chunks only (:class:`VnniPacker` pads a copy of B where its
K or N is not so) and write nothing past the chunks (the packed padding columns stay as
they were: zero).

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
    int64_t items; int64_t src_item; int64_t dst_item; int64_t sums_item;  /* a batch's strides */
    /* the kernel's own: groups left, in this block; items left; this item's B, bytes, sums */
    int64_t left; int64_t block; int64_t items_left; void *item_src; void *item_dst; void *item_sums;
    /* jit.pack512's: each 16 columns' byte offset in the packed B; the byte mask of the
       rows kernel's last chunk (of the columns kernel's last block); K % 4 (rows: its
       groups are K // 4); the columns kernel's blocks of 16 groups, its last block's groups,
       its last quarter's columns */
    void *quarters; int64_t last_mask; int64_t k_rem; int64_t blocks; int64_t last_groups; int64_t last_columns;
    void *block_src; int64_t block_off;  /* the rows kernel's own: the block's first row, its groups' offset */
};
"""
SIGNATURE = "void (*)(struct i8j_pack_args *)"
FIELDS = ("src", "dst", "colsum", "ldb", "groups", "chunks", "tile_bytes", "tile_stride", "items", "src_item",
          "dst_item", "sums_item", "left", "block", "items_left", "item_src", "item_dst", "item_sums", "quarters",
          "last_mask", "k_rem", "blocks", "last_groups", "last_columns", "block_src", "block_off")
ISA = "avx2"
CHUNK = 8  # columns a pass
WIDE = 16  # columns a pass of the rows kernel where tiles are whole 16s of columns
BLOCK = 16  # K groups a sweep over the columns
QUAD = 4  # K groups a step of the columns kernel (16 bytes of a column)
CHUNK512, QUARTER512 = 64, 16  # jit.pack512's columns a pass of the rows kernel, and of a stored row


def args_offsets() -> dict[str, int]:
    from runtime.ffi import declare, struct_offsets

    declare(ARGS_CDEF, (SIGNATURE, "struct i8j_pack_args *"))
    return struct_offsets(ARGS_CDEF, "struct i8j_pack_args", FIELDS)


def pack_kernel(columns: bool = False, wide: bool = False, widen: bool = False):
    """The B-packing kernel, from rows of N bytes (16 columns a pass where ``wide``, else
    8) or from columns of K bytes, into the VNNI layout (four bytes of a column's K group
    in a dword) or, ``widen``, the widening path's (its two pairs as s16, a dword each, in
    two rows of the group); generated once, then from the caches."""
    from jit import cache

    args_offsets()  # declares the struct for callers
    name = kernel_name(columns, wide, widen)
    return cache.get_kernel((name, ISA), lambda: generate(columns, wide and not columns, widen))


def kernel_name(columns: bool = False, wide: bool = False, widen: bool = False) -> str:
    return "pack_b_" + ("widen" if widen else "vnni") + ("_columns" if columns else "_wide" if wide else "")


def vnni_packs(b) -> bool:
    """Whether the kernels pack ``b`` (K x N, or items x K x N): on this CPU (AVX2 code),
    from rows of N bytes or columns of K (an inner product's OC x K rows)."""
    from runtime.isa import cpu_supports

    return 1 in b.strides[-2:] and cpu_supports("avx2")


def pack_vnni(b_kn, path, nr: int):
    """``b_kn`` (K x N s8, rows or columns of bytes) packed for the VNNI ``path`` with
    tiles of ``nr`` vectors: a ``PackedB`` equal to ``gemm_pack.pack_b``'s, column sums
    included, without the saturation proof (VNNI needs none: ``safe_pairs`` and
    ``total_pairs`` are None)."""
    return VnniPacker(*b_kn.shape, path, nr, columns=b_kn.strides[-1] != 1)(b_kn)


class VnniPacker:
    """Packs K x N s8 weights (or ``items`` of them, a batch) into the same ``PackedB``
    buffers, made once, on every call: runtime weights, whose kernel calls then keep
    pointing at one B. One kernel call packs every item.

    >>> import numpy as np
    >>> from jit.dot import fast_path
    >>> pack = VnniPacker(4, 8, fast_path("avx2_vnni"), 1)
    >>> first = pack(np.ones((4, 8), np.int8))
    >>> again = pack(np.full((4, 8), 2, np.int8))
    >>> again is first, first.colsum.tolist()
    (True, [8, 8, 8, 8, 8, 8, 8, 8])
    >>> three = VnniPacker(4, 8, fast_path("avx2_vnni"), 1, items=3)
    >>> b = np.arange(3, dtype=np.int8).reshape(3, 1, 1) * np.ones((3, 4, 8), np.int8)
    >>> [int(p.colsum[0]) for p in three(b)]
    [0, 4, 8]
    """

    def __init__(self, k: int, n: int, path, nr: int, items: int = 1, threads: int = 1,
                 columns: bool = False) -> None:
        import numpy as np

        from primitives.gemm_pack import PackedB
        from primitives.memory import aligned_zeros
        from runtime.isa import cpu_supports
        from runtime.pool import CallPlan
        from runtime.threads import split

        if path.kind not in ("vnni", "maddubsw", "widen"):  # pragma: no cover - Path's kinds are these
            raise ValueError(f"path: {path.kind}; VnniPacker packs for the vnni, maddubsw and widen paths")
        self.k, self.n, self.items, self.columns = k, n, items, columns
        tile_n = nr * path.lanes
        tiles, groups = -(-n // tile_n), -(-k // 4)
        widen = path.kind == "widen"  # (two s16 pairs a group: twice the bytes)
        # A 512-bit path: whole lines a load (jit.pack512), no padded copy (on a Zen 4, rows
        # 2048 x 1000 105 -> 55 us, 768 x 3072 127 -> 61; columns ... ).
        wide512 = not widen and path.lanes == 16 and cpu_supports("avx512_core")
        self._wide512 = ("columns" if columns else "rows") if wide512 else None
        # (AVX2: 16 columns a pass where the tiles are whole 16s and N needs no copy it would
        # not need by 8: 4096 x 4096 6.0 -> 3.0 ms; 2048 x 1000 would copy B, 117 -> 170 us)
        wide = not columns and tile_n % WIDE == 0 and (n % WIDE == 0 or n % CHUNK != 0)
        self._width = (QUARTER512 if columns else CHUNK512) if wide512 else WIDE if wide else CHUNK  # columns a pass
        chunks = -(-n // self._width)
        self._n8 = n if wide512 else chunks * self._width
        self._padded = None  # a copy of B in whole groups and chunks, where B is not so
        size = tiles * tile_n * groups * 4 * (2 if widen else 1)
        data = aligned_zeros(items * size).reshape(items, size)  # (padding columns: zero, never written)
        # The kernels' sums, int32 (PackedB's are int64): the AVX2 kernels add each block's
        # to them; the 512-bit ones write whole chunks' (their padding included)
        self._sums = np.zeros((items, max(chunks * self._width, tiles * tile_n)), np.int32)
        self._colsums = np.zeros((items, tiles * tile_n), np.int64)
        self.packs = [PackedB(data[i], n, k, tile_n, tiles, size // tiles, self._colsums[i], None, None)
                      for i in range(items)]
        self.packed = self.packs[0]
        # (the Kernel held, not only its function: its code stays mapped while a replay
        # or a bound call may still pack with this packer)
        if not (k and n):
            self._code = None
        elif wide512:
            from jit.pack512 import pack512_kernel, quarter_offsets

            self._code = pack512_kernel(columns, path.kind == "vnni")
            self._quarters = np.array(quarter_offsets(n, tile_n, size // tiles), np.int64)
        else:
            self._code = pack_kernel(columns, wide, widen)
        self._k16 = -(-k // (4 * QUAD)) * 4 * QUAD  # (columns: K in whole quads of groups)
        # Threads take ranges of whole tiles (the 512-bit kernels' chunks of 64 or 16
        # columns) of every item (their columns, packed bytes and sums) or, with fewer than
        # threads, ranges of a batch's items (attention's heads: 64 columns, one tile, 12 items).
        self._units = chunks if wide512 else tiles
        self._unit_n = self._width if wide512 else tile_n
        self._geometry = dict(groups=groups, tile_bytes=4 * tile_n, tile_stride=size // tiles, dst_item=size,
                              sums_item=4 * self._sums.shape[1])
        self._data = data
        self._src = self._where = None  # the array the structs' src points into (kept alive with them)
        by_items = tiles < threads <= items
        ranges = [((i0, i1), (0, self._units)) for i0, i1 in split(items, threads)] if by_items else \
            [((0, items), t) for t in split(self._units, threads)]
        self._parts = self._make_parts(ranges)  # (first item, first column, struct)
        self._item_parts = None  # one an item, for item_call()
        self._calls = CallPlan([[(self._code.function, args)] for *_, args in self._parts]) if self._parts else None
        self._copy_from = None  # the last call's array, where a padded copy of it was packed

    def _make_parts(self, ranges) -> list:
        """(first item, first column, struct) of a call per ((i0, i1), (t0, t1)): items
        [i0, i1), units (tiles, or 512-bit chunks) [t0, t1)."""
        from runtime.ffi import ffi, pointer_to

        parts, data, g, unit_n = [], self._data, self._geometry, self._unit_n
        for (i0, i1), (t0, t1) in ranges if self._code is not None else ():
            c0, c1 = t0 * unit_n, min(self._n8, t1 * unit_n)  # columns
            args = ffi.new("struct i8j_pack_args *", dict(g, chunks=-(-(c1 - c0) // self._width), items=i1 - i0))
            args.colsum = pointer_to(self._sums) + 4 * (i0 * self._sums.shape[1] + c0)
            if self._wide512:
                args.dst = pointer_to(data) + i0 * g["dst_item"]  # (+ each quarter's offset)
                args.quarters = pointer_to(self._quarters) + 8 * (c0 // QUARTER512)
            if self._wide512 == "rows":
                args.groups, args.k_rem = self.k // 4, self.k % 4
                args.last_mask = _low_bits((c1 - c0) % CHUNK512)
            elif self._wide512 == "columns":  # (blocks of 16 groups: 64 bytes of a column)
                args.blocks = -(-self.k // (4 * QUARTER512))
                args.last_groups = g["groups"] - QUARTER512 * (args.blocks - 1)
                args.last_mask = _low_bits(self.k % (4 * QUARTER512))
                args.last_columns = c1 - c0 - QUARTER512 * (args.chunks - 1)
            else:
                args.dst = pointer_to(data) + i0 * g["dst_item"] + t0 * g["tile_stride"]
            parts.append((i0, c0, args))
        if self._where is not None:
            self._point_parts(parts)
        return parts

    def __call__(self, b):
        """Pack ``b`` (K x N, or items x K x N; its values now) into :attr:`packed` (or
        :attr:`packs`), which it returns."""
        self.point(b)
        self._pack()
        return self.packs if b.ndim == 3 else self.packed

    def point(self, b) -> None:
        """Point the calls at ``b`` (as :meth:`__call__` takes it), packing nothing: for
        :meth:`item_call`'s calls (a padded copy of ``b`` is made now, where one is needed)."""
        import numpy as np

        from runtime.ffi import pointer_to

        batch = b.ndim == 3
        if b.shape != ((self.items,) if batch else ()) + (self.k, self.n) or not batch and self.items != 1:
            raise ValueError(f"weights: expected {self.items} x {self.k} x {self.n} (items x K x N), got {b.shape}")
        # The kernel's view: rows of N bytes (K x N), or of K bytes (N x K: columns),
        # whole groups and chunks, rows in order; else a copy that is.
        src = (b if batch else b[None]).swapaxes(1, 2) if self.columns else (b if batch else b[None])
        rows, width = src.shape[1], src.shape[2]
        whole = (src.shape[1], src.shape[2]) if self._wide512 else (self._n8, self._k16) if self.columns else \
            (-(-self.k // 4) * 4, self._n8)
        self._copy_from = None
        if (rows, width) != whole or src.strides[2] != 1 or src.strides[1] < width \
                or self.items > 1 and src.strides[0] < src.strides[1] * rows:
            if self._padded is None:
                self._padded = np.zeros((self.items,) + whole, np.int8)
            self._copy_from = src
            self._padded[:, :rows, :width] = src
            src = self._padded
        where = (pointer_to(src), src.strides)  # (a new view of the same bytes each call: the same)
        if where != self._where:
            self._src, self._where = src, where
            for parts in (self._parts, self._item_parts or ()):
                self._point_parts(parts)

    def _point_parts(self, parts) -> None:
        base, strides = self._where
        item = strides[0] if self.items > 1 else 0
        for i0, c0, args in parts:  # (a part's columns: its rows, when they are columns)
            args.src = base + i0 * item + (c0 * strides[1] if self.columns else c0)
            args.ldb, args.src_item = strides[1], item

    def item_call(self, i: int) -> tuple:
        """``(function, struct)``: a call that packs item ``i`` alone, every column, at
        the array :meth:`point` (or a call) last took. For a plan that runs each item's
        packing on the thread that runs its product (a batch's items dealt to threads:
        one hand-off, not two). Its column sums are not kept (:attr:`packs`' stay as the
        last call that packed them made them): for products that read none."""
        if self._item_parts is None:
            self._item_parts = self._make_parts([((j, j + 1), (0, self._units)) for j in range(self.items)])
        return self._code.function, self._item_parts[i][2]

    def refresh(self) -> None:
        """The padded copy of the last call's array made again, where there is one (before
        :meth:`item_call`'s calls run again)."""
        if self._copy_from is not None:
            rows, width = self._copy_from.shape[1:]
            self._padded[:, :rows, :width] = self._copy_from

    def repeat(self) -> None:
        """Pack again the values the last call's array holds now (a replay's: no checks,
        the structs point at it already; a padded copy is refreshed first)."""
        self.refresh()
        self._pack()

    def _pack(self) -> None:
        if self._calls is not None:
            if not self._wide512:
                self._sums[...] = 0  # (the kernel adds each block's sums)
            self._calls.run()
        self._colsums[...] = self._sums[:, :self._colsums.shape[1]]


def _low_bits(count: int) -> int:
    """A byte mask of ``count`` bytes (int64: all ones where ``count`` is 0, a whole line)."""
    return (1 << count) - 1 if count else -1


def generate(columns: bool = False, wide: bool = False, widen: bool = False):
    """Generate the kernel's code (PeachPy); see :func:`pack_kernel`."""
    from jit import asm
    from jit.build import generate as build

    argument = asm.Argument(asm.ptr(asm.uint8_t), "args")
    name = kernel_name(columns, wide, widen)
    if columns:
        return build(name, ISA, SIGNATURE, (argument,), lambda: _emit_columns(argument, widen))
    return build(name, ISA, SIGNATURE, (argument,), lambda: _emit(argument, wide, widen))


def _store(out, address, acc, ones8, ones16, temps, unit_row, widen: bool) -> None:
    """Eight columns' group (``out``: a dword of 4 K bytes each) stored at ``address`` and
    added to their sums ``acc``. Widened: each column's two pairs as s16 (VPMOVSXBW), the
    first pairs' dwords at ``address``, the second pairs' ``unit_row`` (a GPR) bytes on,
    summed by VPMADDWD by ones; else the dwords as they are, summed by VPMADDUBSW and
    VPMADDWD by ones (s16 pairs of |sum| <= 256: no saturation). ``out`` and ``temps`` (two)
    are clobbered."""
    from jit import asm

    t0, t1 = temps
    if not widen:
        asm.VMOVDQU([address], out)
        asm.VPMADDUBSW(t0, ones8, out)
        asm.VPMADDWD(t0, t0, ones16)
        asm.VPADDD(acc, acc, t0)
        return
    asm.VEXTRACTI128(t1.as_xmm, out, 1)
    asm.VPMOVSXBW(t1, t1.as_xmm)  # columns 4-7: per 128 bits, two columns' (pair 0, pair 1)
    asm.VPMOVSXBW(t0, out.as_xmm)  # columns 0-3
    asm.VSHUFPS(out, t0, t1, 0x88)  # the first pairs: columns 0 1 4 5 | 2 3 6 7
    asm.VPERMQ(out, out, 0xD8)  # 0-7
    asm.VSHUFPS(t0, t0, t1, 0xDD)  # the second pairs
    asm.VPERMQ(t0, t0, 0xD8)
    asm.VMOVDQU([address], out)
    asm.VMOVDQU([address + unit_row * 1], t0)
    for pairs in (out, t0):
        asm.VPMADDWD(pairs, pairs, ones16)
        asm.VPADDD(acc, acc, pairs)


def _start(A, ones8, ones16, done) -> None:
    """Both kernels' start: nothing to do without groups or chunks; the ones vectors;
    the loop registers (r10 ldb, r11 3 ldb, r12 a tile's row of a group: a dword a
    column, of which a widened group has two; r15 a tile's bytes); the first item's B,
    packed bytes and sums (``A``: an args field)."""
    from jit import asm
    from jit.asm import CMP, JZ, LEA, MOV, rax, r10, r11, r12, r15

    for field in ("groups", "chunks"):
        CMP(asm.qword[A(field)[0]], 0)
        JZ(done)
    MOV(rax.as_dword, 0x01010101)  # u8 ones (VPMADDUBSW's unsigned operand), then s16 ones
    asm.VMOVD(ones8.as_xmm, rax.as_dword)
    asm.VPBROADCASTD(ones8, ones8.as_xmm)
    MOV(rax.as_dword, 0x00010001)
    asm.VMOVD(ones16.as_xmm, rax.as_dword)
    asm.VPBROADCASTD(ones16, ones16.as_xmm)
    MOV(r10, A("ldb"))
    LEA(r11, [r10 + r10 * 2])  # 3 rows
    MOV(r12, A("tile_bytes"))  # a row of a group of a tile: a column's dword each
    MOV(r15, A("tile_stride"))
    for counter, start in (("items_left", "items"), ("item_src", "src"), ("item_dst", "dst"),
                           ("item_sums", "colsum")):
        MOV(rax, A(start))
        MOV(A(counter), rax)


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


def _emit(argument, wide: bool = False, widen: bool = False) -> None:
    from jit import asm
    from jit.asm import (ADD, CMP, DEC, IMUL, JNZ, LABEL, LEA, MOV, SUB, XOR, Label, rax, rbp, rbx, rcx,
                         rdi, rdx, rsi, r8, r9, r10, r11, r12, r13, r14, r15)

    off = args_offsets()
    A = lambda f: [rdi + off[f]]  # noqa: E731
    x = [asm.xmm1, asm.xmm2, asm.xmm3, asm.xmm4]
    y1, y2, acc, ones8, ones16 = asm.ymm1, asm.ymm2, asm.ymm0, asm.ymm5, asm.ymm6
    asm.LOAD.ARGUMENT(rdi, argument)
    done, item, block, chunk, group, next_tile = Label(), Label(), Label(), Label(), Label(), Label()
    _start(A, ones8, ones16, done)
    LABEL(item)
    MOV(rdx, A("item_src"))  # the block's first row
    MOV(rax, A("groups"))
    MOV(A("left"), rax)
    XOR(rbp.as_dword, rbp.as_dword)  # the block's first group, in bytes of a tile's groups
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
    MOV(r14, A("item_dst"))  # the chunk's tile
    XOR(r13.as_dword, r13.as_dword)  # the chunk's byte offset in its tile's groups
    MOV(rbx, A("item_sums"))  # the chunk's sums
    MOV(r8, A("chunks"))
    LABEL(chunk)
    width = WIDE if wide else CHUNK
    accs = (acc, asm.ymm7) if wide else (acc,)
    for a in accs:
        asm.VPXOR(a, a, a)
    MOV(rax, rsi)
    LEA(rcx, [r14 + r13 * 1])
    ADD(rcx, rbp)
    MOV(r9, A("block"))
    LABEL(group)
    load = asm.VMOVDQU if wide else asm.VMOVQ  # 16 or 8 bytes of each row
    size = asm.oword if wide else asm.qword
    load(x[0], size[rax])
    load(x[1], size[rax + r10 * 1])
    load(x[2], size[rax + r10 * 2])
    load(x[3], size[rax + r11 * 1])
    if wide:  # columns 8..15 from the high bytes, into xmm8..9 as 0..7 into x[0], x[2]
        asm.VPUNPCKHBW(asm.xmm8, x[0], x[1])
        asm.VPUNPCKHBW(asm.xmm9, x[2], x[3])
    asm.VPUNPCKLBW(x[0], x[0], x[1])  # r0[c] r1[c], c = 0..7
    asm.VPUNPCKLBW(x[2], x[2], x[3])  # r2[c] r3[c]
    halves = [(x[0], x[2])] + ([(asm.xmm8, asm.xmm9)] if wide else [])
    for h, (lo, hi) in enumerate(halves):  # 8 columns each: their dwords in order, stored, summed
        out, tmp = (y1, asm.ymm10) if h == 0 else (asm.ymm11, asm.ymm12)
        asm.VPUNPCKHWD(tmp.as_xmm, lo, hi)  # columns 4..7 of the 8: r0 r1 r2 r3 each
        asm.VPUNPCKLWD(out.as_xmm, lo, hi)  # columns 0..3
        asm.VINSERTI128(out, out, tmp.as_xmm, 1)
        _store(out, rcx + 32 * h, accs[h], ones8, ones16, (y2, tmp), r12, widen)
    LEA(rax, [rax + r10 * 4])
    LEA(rcx, [rcx + r12 * 2]) if widen else ADD(rcx, r12)  # (widened: a group is two rows)
    DEC(r9)
    JNZ(group)
    for h, a in enumerate(accs):
        asm.VPADDD(a, a, [rbx + 32 * h])  # (the sums start at zero: VnniPacker's)
        asm.VMOVDQU([rbx + 32 * h], a)
    ADD(rbx, 4 * width)
    ADD(rsi, width)
    ADD(r13, 4 * width)
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
    LEA(rax, [r12 * 2]) if widen else MOV(rax, r12)
    IMUL(rax, r9)
    ADD(rbp, rax)
    CMP(asm.qword[rdi + off["left"]], 0)
    JNZ(block)
    _next_item(A, item, done)


def _emit_columns(argument, widen: bool = False) -> None:
    """B as columns of K bytes (``ldb`` apart): eight columns at a time, four K groups
    (16 bytes of each) a step, their dwords transposed (VPUNPCK*DQ, VINSERTI128) into
    the four groups' 32-byte rows of the eight columns."""
    from jit import asm
    from jit.asm import ADD, CMP, DEC, JNZ, JZ, LABEL, LEA, MOV, TEST, XOR, Label, rax, rbx, rcx, rdi, rdx, rsi, \
        r8, r9, r10, r11, r12, r13, r14, r15

    off = args_offsets()
    A = lambda f: [rdi + off[f]]  # noqa: E731
    ymm = [getattr(asm, f"ymm{i}") for i in range(16)]
    acc, ones8, ones16 = ymm[13], ymm[14], ymm[15]
    asm.LOAD.ARGUMENT(rdi, argument)
    done, item, chunk, quad, next_tile = Label(), Label(), Label(), Label(), Label()
    _start(A, ones8, ones16, done)
    LABEL(item)
    MOV(rsi, A("item_src"))  # the chunk's first column
    MOV(r14, A("item_dst"))  # the chunk's tile
    XOR(r13.as_dword, r13.as_dword)  # the chunk's byte offset in its tile's groups
    MOV(rbx, A("item_sums"))
    MOV(r8, A("chunks"))
    LABEL(chunk)
    asm.VPXOR(acc, acc, acc)
    MOV(rax, rsi)  # columns 0..3 of the chunk, then 4..7 at rdx
    LEA(rdx, [rsi + r10 * 4])
    LEA(rcx, [r14 + r13 * 1])
    MOV(r9, A("groups"))
    def four_groups(tail: bool) -> None:
        for half, base in ((0, rax), (4, rdx)):  # 16 bytes (4 groups) of 4 columns: a 4 x 4 dword transpose
            r = [ymm[half + i].as_xmm for i in range(4)]
            t = [ymm[8 + i].as_xmm for i in range(4)]
            asm.VMOVDQU(r[0], [base])
            asm.VMOVDQU(r[1], [base + r10 * 1])
            asm.VMOVDQU(r[2], [base + r10 * 2])
            asm.VMOVDQU(r[3], [base + r11 * 1])
            asm.VPUNPCKLDQ(t[0], r[0], r[1])  # c0g0 c1g0 c0g1 c1g1
            asm.VPUNPCKHDQ(t[1], r[0], r[1])  # c0g2 c1g2 c0g3 c1g3
            asm.VPUNPCKLDQ(t[2], r[2], r[3])
            asm.VPUNPCKHDQ(t[3], r[2], r[3])
            asm.VPUNPCKLQDQ(r[0], t[0], t[2])  # group 0 of the 4 columns
            asm.VPUNPCKHQDQ(r[1], t[0], t[2])  # group 1
            asm.VPUNPCKLQDQ(r[2], t[1], t[3])  # group 2
            asm.VPUNPCKHQDQ(r[3], t[1], t[3])  # group 3
        stored = Label()
        for g in range(QUAD):  # group g of the 8 columns: columns 0..3 low, 4..7 high
            if tail and g:  # (the last 1-3 groups: the rest of the row is the padded copy's zeros)
                CMP(r9, g + 1)
                asm.JB(stored)
            out = ymm[g]
            asm.VINSERTI128(out, out, ymm[4 + g].as_xmm, 1)
            _store(out, rcx, acc, ones8, ones16, (ymm[8], ymm[9]), r12, widen)
            LEA(rcx, [rcx + r12 * 2]) if widen else ADD(rcx, r12)
        LABEL(stored)

    quads_done = Label()
    CMP(r9, QUAD)
    asm.JB(quads_done)
    LABEL(quad)
    four_groups(tail=False)
    ADD(rax, 4 * QUAD)
    ADD(rdx, 4 * QUAD)
    asm.SUB(r9, QUAD)
    CMP(r9, QUAD)
    asm.JAE(quad)
    LABEL(quads_done)
    TEST(r9, r9)
    tail_done = Label()
    JZ(tail_done)
    four_groups(tail=True)
    LABEL(tail_done)
    asm.VMOVDQU([rbx], acc)
    ADD(rbx, 4 * CHUNK)
    LEA(rsi, [rsi + r10 * CHUNK])
    ADD(r13, 4 * CHUNK)
    CMP(r13, r12)
    asm.JB(next_tile)
    XOR(r13.as_dword, r13.as_dword)
    ADD(r14, r15)
    LABEL(next_tile)
    DEC(r8)
    JNZ(chunk)
    _next_item(A, item, done)
