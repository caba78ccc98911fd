"""B packed in machine code: runtime weights at memory speed.

A GEMM kernel reads B (K x N s8) as ``[tile][group][column of the tile][4]``: the four
bytes of a K group of one column as one dword (``gemm_pack.pack_b``; the widening path's
layout holds each group as two rows, a column's first and second K pairs as s16). numpy
builds that with strided copies (a 768 x 768 B: about 0.3 ms, 0.55 with the saturation
proof, which VNNI does not need); a matmul whose weights change from call to call
(attention's K and V) paid it on every call. :class:`VnniPacker` packs in one pass,
each thread a range of columns, a batch's items one after another in one call, with
the kernels of ``jit.pack_rows`` (B as rows of N bytes, K x N row-major) and
``jit.pack_columns`` (columns of K bytes: an inner product's OC x K rows, a matmul's
``ba`` weights), into the VNNI layout (VPMADDUBSW reads it too) or the widening one:
512-bit code on the 512-bit paths, 256-bit AVX2 code elsewhere (every path has AVX2).

They read B in place where they can (512-bit: byte masks; 256-bit: dword masks, so
rows need N % 4 == 0 and columns K % 4 == 0, else the packer pads a copy) and write
nothing past the packed B (its padding columns stay as they were: zero).

A packed B too big to stay in the caches (:func:`streams`: 8 MB and more, or a quarter
of L3 where that is more, on the 512-bit kernels) is stored with VMOVNTDQ: its lines are not read before they are
written, and it does not evict B itself (a 64 x 4096 x 4096 GEMM given B at the call, on
a Zen 4: 333-343 -> 357-368 GOPS, one thread).

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

from jit.pack_rows import BLOCK, Width, block_groups, quarter_offsets
from runtime.ffi import address_of, pointer_to, unowned

ARGS_CDEF = """
struct i8j_pack_args {
    void *src; void *dst; void *colsum;
    int64_t ldb; int64_t groups; int64_t chunks; int64_t tile_bytes;  /* a group's row of a tile */
    int64_t items; int64_t src_item; int64_t dst_item; int64_t sums_item;  /* a batch's strides */
    /* the kernel's own: groups left, in this block; items left; this item's B, bytes, sums */
    int64_t left; int64_t block; int64_t items_left; void *item_src; void *item_dst; void *item_sums;
    /* each quarter's (a stored row's columns) byte offset in the packed B; the last chunk's
       byte mask (512-bit rows; columns: the last block's); K % 4 (rows: groups is K // 4);
       the columns kernel's blocks of groups and its last block's groups; the columns of
       the last chunk (256-bit rows) or quarter (columns) */
    void *quarters; int64_t last_mask; int64_t k_rem; int64_t blocks; int64_t last_groups; int64_t last_columns;
    /* the rows kernel's own: the block's first row, its groups' offset, the chunk's sums */
    void *block_src; int64_t block_off; void *sums_at;
    int64_t block_max;  /* the rows kernel's K groups a sweep (jit.pack_rows.block_groups) */
};
"""
SIGNATURE = "void (*)(struct i8j_pack_args *)"
FIELDS = ("src", "dst", "colsum", "ldb", "groups", "chunks", "tile_bytes", "items", "src_item",
          "dst_item", "sums_item", "left", "block", "items_left", "item_src", "item_dst", "item_sums", "quarters",
          "last_mask", "k_rem", "blocks", "last_groups", "last_columns", "block_src", "block_off", "sums_at",
          "block_max")
STREAM_BYTES = 8 << 20  # a packed B this big (at least) is stored past the caches (stream_bytes)


def args_offsets() -> dict[str, int]:
    from runtime.ffi import declare, struct_offsets

    declare(ARGS_CDEF, (SIGNATURE, "struct i8j_pack_args *"))
    return struct_offsets(ARGS_CDEF, "struct i8j_pack_args", FIELDS)


args_offsets()  # (at import: a creation parses no C, see runtime.ffi.declare)


def pack_kernel(columns: bool, bits: int, widen: bool = False, vnni: bool = False, stream: bool = False):
    """The kernel packing B from rows of N (or ``columns`` of K) with ``bits``-bit code,
    into the VNNI layout or the widening one, its sums by VPDPBUSD where ``vnni``
    (512-bit only), its packed bytes stored past the caches where ``stream`` (512-bit
    only: :func:`streams`); generated once, then from the caches."""
    from jit import cache

    if stream and bits != 512:
        raise ValueError("stream: streaming stores are the 512-bit kernels' (a whole line a store)")
    return cache.get_kernel(kernel_key(columns, bits, widen, vnni, stream),
                            lambda: generate(columns, bits, widen, vnni, stream))


def kernel_key(columns: bool, bits: int, widen: bool = False, vnni: bool = False, stream: bool = False) -> tuple:
    """(name, ISA) of a packing kernel: the cache key and what dump-asm lists."""
    name = "pack_b_" + ("widen" if widen else "vnni") + ("_columns" if columns else "_rows") + str(bits)
    name += ("_madd" if bits == 512 and not (vnni or widen) else "") + ("_nt" if stream else "")
    return name, Width(bits).isa + ("_vnni" if vnni else "")


def packer_kernel(path, columns: bool, nbytes: int = 0):
    """The kernel :class:`VnniPacker` runs for ``path``'s layout from rows of N (or
    ``columns`` of K) into ``nbytes`` of packed B: 512-bit code for a 512-bit path where
    the CPU has AVX-512 (rows 2048 x 1000 on a Zen 4: the AVX2 kernels' 105 us -> 55),
    else 256-bit; streaming stores where :func:`streams`. A primitive that will pack
    runtime weights asks for it at creation."""
    from runtime.isa import cpu_supports

    widen = path.kind == "widen"
    bits = 512 if path.lanes == 16 and cpu_supports("avx512_core") else 256
    return pack_kernel(columns, bits, widen, path.kind == "vnni" and bits == 512, streams(bits, nbytes)), Width(bits)


def packed_bytes(k: int, n: int, path, nr: int, items: int = 1) -> int:
    """The bytes of ``items`` K x N weights packed for ``path`` in tiles of ``nr`` vectors
    (the widening layout: s16, twice the VNNI one's)."""
    tile_n = nr * path.lanes
    return items * -(-n // tile_n) * tile_n * -(-k // 4) * 4 * (2 if path.kind == "widen" else 1)


def stream_bytes() -> int:
    """The packed B from which the packing kernels stream (:func:`streams`): 8 MB
    (``STREAM_BYTES``), a quarter of this Zen 4's 32 MB L3, or a quarter of a bigger L3
    (one that may hold the packed B for the product; not measured)."""
    from runtime.caches import data_caches

    return max(STREAM_BYTES, data_caches().l3 // 4)


def streams(bits: int, nbytes: int) -> bool:
    """Whether a packing kernel stores ``nbytes`` of packed B past the caches (VMOVNTDQ):
    512-bit code (a store is a whole line), from :func:`stream_bytes`.

    Zen 4 (L2 1 MB a core, L3 32 MB), GEMMs given B at the call, GOPS with regular /
    streaming stores, one thread / two: 16 MB of B (64 x 4096 x 4096, 32 x 8192 x 2048)
    333-343 / 357-368 and 241-256 / 286-293, two threads 648-663 / 682 and 506-519 /
    527-555; 8 MB (64 x 4096 x 2048) 331 / 373, 667 / 700. Below, two threads lost (6 MB,
    64 x 3072 x 2048: 779-800 / 708-718; 2 MB, 32 x 1000 x 2048: 744 / 522), the product
    reading from memory what it had found in the caches. Measured on this CPU only."""
    return bits == 512 and nbytes >= stream_bytes()


def all_kernel_keys() -> list:
    """(columns, bits, widen, vnni, stream) of every packing kernel VnniPacker may run."""
    return [(columns, bits, widen, vnni, stream) for columns in (False, True)
            for bits, widen, vnni in ((256, False, False), (256, True, False), (512, False, True), (512, False, False),
                                      (512, True, False))
            for stream in ((False, True) if bits == 512 else (False,))]


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
    pointing at one B. One kernel call packs every item. ``stream`` (tests): streaming
    stores, or not, whatever the size; None: as :func:`streams` decides.

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
                 columns: bool = False, stream: bool | None = None) -> None:
        import numpy as np

        from primitives.gemm_pack import PackedB
        from primitives.memory import aligned_zeros
        from runtime.pool import CallPlan
        from runtime.threads import split

        if path.kind not in ("vnni", "maddubsw", "widen"):  # pragma: no cover - Path's kinds are these
            raise ValueError(f"path: {path.kind}; VnniPacker packs for the vnni, maddubsw and widen paths")
        self.k, self.n, self.items, self.columns = k, n, items, columns
        tile_n = nr * path.lanes
        tiles, groups = -(-n // tile_n), -(-k // 4)
        size = packed_bytes(k, n, path, nr)  # (widened: two s16 pairs a group, twice the bytes)
        # (the Kernel held, not only its function: its code stays mapped while a replay
        # or a bound call may still pack with this packer)
        self._code, w = packer_kernel(path, columns, items * size if stream is None else stream_bytes() * stream)
        self._w = w
        self._unit_n = w.lanes if columns else w.chunk  # columns a pass: a quarter, or a chunk
        units = -(-n // self._unit_n)
        # What the kernel reads in place: 256-bit loads are dword-masked (rows: N, columns:
        # K in whole dwords); else a copy padded so.
        self._whole = (n, k if w.bits == 512 else groups * 4) if columns else (k, n if w.bits == 512 else -(-n // 4) * 4)
        self._padded = None  # that copy, where B is not so
        data = aligned_zeros(items * size).reshape(items, size)  # (padding columns: zero, never written)
        # The kernels' sums (int32; PackedB's are int64), whole passes' (their padding included)
        self._sums = np.zeros((items, max(units * self._unit_n, tiles * tile_n)), np.int32)
        self._colsums = np.zeros((items, tiles * tile_n), np.int64)
        self.packs = [PackedB(data[i], n, k, tile_n, tiles, size // tiles, self._colsums[i], None, None)
                      for i in range(items)]
        self.packed = self.packs[0]
        if not (k and n):
            self._code = None
        self._quarters = np.array(quarter_offsets(n, tile_n, size // tiles, w.lanes, self._unit_n), np.int64)
        self._geometry = dict(groups=k // 4 if not columns else groups, k_rem=0 if columns else k % 4,
                              tile_bytes=4 * tile_n, dst_item=size,
                              sums_item=4 * self._sums.shape[1])
        self._data = data
        self._where = None  # (the address, not the array: the caller's arrays are its own to keep)
        self._guarded = False  # (guard_entries: a guard may have moved the calls since _where)
        # Threads take ranges of whole passes (of every item: their columns, packed bytes
        # and sums) or, with fewer tiles than threads, ranges of a batch's items
        # (attention's heads: 64 columns, one tile, 12 items).
        by_items = tiles < threads <= items
        ranges = [((i0, i1), (0, units)) for i0, i1 in split(items, threads)] if by_items else \
            [((0, items), t) for t in split(units, threads)]
        self._units = units
        self._parts = self._make_parts(ranges)  # (first item, first column, struct)
        self._item_parts = None  # one an item, for item_call()
        self._calls = CallPlan([[(self._code.function, args)] for *_, args in self._parts]) if self._parts else None
        self._copy_from = None  # the last call's array, where a padded copy of it was packed

    def _make_parts(self, ranges) -> list:
        """(first item, first column, struct) of a call per ((i0, i1), (t0, t1)): items
        [i0, i1), passes [t0, t1)."""
        from runtime.ffi import ffi

        parts, g, unit_n = [], self._geometry, self._unit_n
        width = self._whole[0] if self.columns else self._whole[1]  # the columns the kernel reads
        for (i0, i1), (t0, t1) in ranges if self._code is not None else ():
            c0, c1 = t0 * unit_n, min(width, t1 * unit_n)  # columns
            chunks = -(-(c1 - c0) // unit_n)
            args = ffi.new("struct i8j_pack_args *", dict(g, chunks=chunks, items=i1 - i0, block_max=BLOCK))
            args.colsum = pointer_to(self._sums) + 4 * (i0 * self._sums.shape[1] + c0)
            args.dst = pointer_to(self._data) + i0 * g["dst_item"]  # (+ each quarter's offset)
            args.quarters = pointer_to(self._quarters) + 8 * (c0 // self._w.lanes)
            args.last_columns = c1 - c0 - unit_n * (chunks - 1)
            if self.columns:  # (blocks of a vector of each column: lanes groups)
                args.blocks = -(-g["groups"] // self._w.lanes)
                args.last_groups = g["groups"] - self._w.lanes * (args.blocks - 1)
                args.last_mask = _low_bits(self.k % (4 * self._w.lanes))
            else:
                args.last_mask = _low_bits((c1 - c0) % unit_n)
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
        batch = b.ndim == 3
        if b.shape != ((self.items,) if batch else ()) + (self.k, self.n) or not batch and self.items != 1:
            raise ValueError(f"weights: expected {self.items} x {self.k} x {self.n} (items x K x N), got {b.shape}")
        # The kernel's view: rows of N bytes (K x N), or of K bytes (N x K: columns),
        # whole groups and chunks, rows in order; else a copy that is.
        src = (b if batch else b[None]).swapaxes(1, 2) if self.columns else (b if batch else b[None])
        rows, width = src.shape[1], src.shape[2]
        whole = self._whole
        self._copy_from = None
        if (rows, width) != whole or src.strides[2] != 1 or src.strides[1] < width \
                or self.items > 1 and src.strides[0] < src.strides[1] * rows:
            if self._padded is None:
                import numpy as np

                self._padded = np.zeros((self.items,) + whole, np.int8)
            self._copy_from = unowned(src)  # (refresh copies it again: an array, not the caller's)
            self._padded[:, :rows, :width] = src
            src = self._padded
        where = (address_of(src), src.strides)  # (a new view of the same bytes each call: the same)
        if where != self._where or self._guarded:
            self._where = where
            for parts in (self._parts, self._item_parts or ()):
                self._point_parts(parts)

    def mover(self):
        """:meth:`point` for a replay moved to new arrays: a function ``(b, base, view)``
        that points the calls at the caller's array ``b``, laid out as the one the last
        :meth:`point` took a view of, that view starting at ``base`` (a cdata pointer);
        ``view(b)`` makes the view, as :meth:`point` takes it. Where that was the last
        thing to point the calls and they read no padded copy, each struct's address is
        written from a table (``jit.repoint``), without the view or :meth:`point`'s
        checks; else ``point(view(b))`` runs."""
        from jit.repoint import repointer

        state = [self._where, False, None]  # (the _where it left, the _item_parts it took, their writer)

        def move(b, base, view) -> None:
            where = self._where
            if where is not state[0] or where is None or self._copy_from is not None:
                self.point(view(b))
                state[0] = self._where
                return
            if state[1] is not self._item_parts:
                state[1:] = self._item_parts, repointer(self._source_entries(0, 0), 1)
            state[2](base)
            self._where = state[0] = (base, where[1])
        return move

    def guard_entries(self, base: int, shift: int) -> list | None:
        """The fields that point the calls at B, as ``primitives.replay.pointing`` takes
        them: (struct, field, ``base``, offset), the view the last :meth:`point` took
        starting ``shift`` bytes past the array ``base`` names. None where the calls read a
        padded copy (which only :meth:`point` makes again), or nothing was pointed yet.
        From then on :meth:`point` points every call (a guard writes them without it)."""
        if self._where is None or self._copy_from is not None:
            return None
        self._guarded = True
        return self._source_entries(base, shift)

    def _source_entries(self, base: int, shift: int) -> list:
        """(struct, "src", ``base``, offset) of every call, the offsets past the view the
        last :meth:`point` took, plus ``shift``."""
        strides = self._where[1]
        return [(args, "src", base, shift + self._src_offset(i0, c0, strides))
                for parts in (self._parts, self._item_parts or ()) for i0, c0, args in parts]

    def _src_offset(self, i0: int, c0: int, strides: tuple) -> int:
        """Where a call starting at item ``i0``, column ``c0`` reads, past the first byte of
        the view (of ``strides``) the calls point at (a part's columns: its rows, when
        they are columns)."""
        return i0 * (strides[0] if self.items > 1 else 0) + (c0 * strides[1] if self.columns else c0)

    def _point_parts(self, parts) -> None:
        base, strides = self._where
        item = strides[0] if self.items > 1 else 0
        block = block_groups(strides[1])
        for i0, c0, args in parts:
            args.src = base + self._src_offset(i0, c0, strides)
            args.ldb, args.src_item, args.block_max = strides[1], item, block

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

    def column_sums(self):
        """The int32 column sums the packing calls write (the first item's, padded columns
        included): :meth:`thread_calls`' calls write them, and nothing copies them on to
        :attr:`packed`'s ``colsum``."""
        return self._sums[0]

    def thread_calls(self) -> list:
        """Per thread, ``(first column, (function, struct))``: the call that packs its
        range of columns at the array :meth:`point` last took. For a plan whose threads
        each read only the columns they packed (one hand-off, not two); it leaves
        :attr:`packed`'s ``colsum`` as it was: for products that read none."""
        return [(c0, (self._code.function, args)) for _, c0, args in self._parts] if self._code else []

    def pack(self) -> None:
        """Pack the array :meth:`point` last took (its values now), column sums included."""
        self._pack()

    def _pack(self) -> None:
        if self._calls is not None:
            self._calls.run()
        self._colsums[...] = self._sums[:, :self._colsums.shape[1]]


def _low_bits(count: int) -> int:
    """A byte mask of ``count`` bytes (int64: all ones where ``count`` is 0, a whole line)."""
    return (1 << count) - 1 if count else -1


def generate(columns: bool, bits: int, widen: bool = False, vnni: bool = False, stream: bool = False):
    """Generate a packing kernel's code (PeachPy); see :func:`pack_kernel`."""
    from jit import asm
    from jit.build import generate as build
    from jit.pack_columns import emit_columns
    from jit.pack_rows import emit_rows

    argument = asm.Argument(asm.ptr(asm.uint8_t), "args")
    name, isa = kernel_key(columns, bits, widen, vnni, stream)
    emit = emit_columns if columns else emit_rows
    return build(name, isa, SIGNATURE, (argument,),
                 lambda: emit(argument, args_offsets(), Width(bits), widen, vnni, stream))
