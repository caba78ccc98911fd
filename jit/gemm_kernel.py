"""The int8 GEMM microkernel template: one PeachPy generator for every ISA path.

A kernel computes ``C[m, n] = output_stage(sum_k A'[m, k] * B[k, n])`` for a chunk of
rows and column tiles, with the whole loop nest inside the generated code::

    for each column tile (nr vectors = nr*lanes columns, packed B of the whole K):
      [for each of `outer` blocks of m rows (A and C advanced by their outer strides):]
        for each block of mr rows (then one block of the remaining 1..mr-1 rows):
            acc[mr][nr] = 0
          [for each position p (A rows offset by pos_off[p]; B runs on, then skips b_pos_skip bytes):]
            for each group of 4 K values:          B tile in registers, A broadcast
                acc[i][v] += dot(A[i, k:k+4], B[k:k+4, tile v])
                (unrolled by ``unroll_k`` groups, then one group at a time; with
                ``prefetch_next`` one line of the next tile's B per group goes to L2,
                the line rotating per row block; with ``prefetch_ahead`` the group's
                lines that many bytes on go to L1; a short block on a VNNI path
                spreads the unrolled groups over sets of accumulators, added up
                after the loop: ``accumulator_sets``)
            last group when K % 4 != 0:          A read as the row's last dword, shifted
          [for each residual cell (K group, vector v) of the tile:]
                acc[i][v] += dot(A[i, k:k+4], the cell's bytes)   one more VPMADDUBSW step
            output stage (jit.output): compensation, scales, bias, post-ops, masked store

The bracketed loops exist in kernels whose spec asks for them: ``positions`` makes the
kernel a batch-reduce GEMM (a convolution sums over kernel positions, each an offset
into the same source rows), ``outer`` walks a convolution's output rows and
``residual`` adds, after the K loop, the cells that split weights left out of B
(``primitives.gemm_pack``: exact results at the VPMADDUBSW rate for weights with few
pairs that could saturate). ``cuts`` (a convolution's rows read from its zero-padded copy)
replaces the row loop by the output row's blocks in order, a cut block's K loop split
into segments, each of the rows that read it (the pixels at the row's ends leave out
their window columns in the side padding).

A' is A for u8 sources and A + 128 (bytes xor 0x80) for s8 sources. B is packed by
``primitives.gemm_pack`` into the layout ``[tile][k group][vector][lane][4 bytes]``
(``widen``: ``[tile][k group][pair][vector][lane][2 s16]``), zero padded in K and N, so B
loads never need masks. M, N, K, leading dimensions and pointers are run-time values
in the argument struct: one kernel serves every shape, unless its spec names the row
remainders and K lengths it will see (``tails``, ``k_rest``, ``k_tail``): a primitive
that knows its shape leaves out the tail blocks and K loops it never runs, which are
most of the code and of its generation time (:meth:`GemmKernelSpec.check_call` holds
each call to that).
"""
from __future__ import annotations

from dataclasses import dataclass

from jit.dot import Path, emit_bytes, emit_ones_s16, emit_step, vector_constant, vector_register
from jit.output import (OUTPUT_FIELDS, OutputContext, OutputSpec, args_cdef_fields, emit_output,
                        output_registers_needed)

ARGS_CDEF = """
struct i8j_gemm_args {
    void *a; int64_t lda;                 /* u8 or s8, rows lda bytes apart */
    void *b; int64_t b_tile_stride;       /* packed s8 (or s16) tiles */
    void *c; int64_t ldc;                 /* dst, rows ldc bytes apart */
    int64_t m; int64_t n;
    int64_t k_groups; int64_t k_tail_back; int64_t k_tail_shift;
    /* batch-reduce over positions (spec.positions): A offsets added per position, and
       B bytes skipped after each (a window cut at the padding reads part of each run) */
    int64_t *pos_off; int64_t *pos_end; int64_t *pos_cur; int64_t b_pos_skip;
    /* outer loop (spec.outer): `outer` blocks of m rows, A and dst advanced by strides */
    int64_t outer; int64_t a_outer_stride; int64_t c_outer_stride;
    /* residual cells (spec.residual): per tile its cells' byte offset in res_entries
       and their count per vector (1 + nr int64), the call's first tile first */
    void *res_head; void *res_entries;
    int64_t outer_left; void *a_cur; void *c_cur; int64_t m_left; void *res_cur;  /* the kernel's own scratch */
    %s                                    /* the output stage's (jit.output) */
};
""" % args_cdef_fields()
SIGNATURE = "void (*)(struct i8j_gemm_args *)"
FIELDS = ("a", "lda", "b", "b_tile_stride", "c", "ldc", "m", "n", "k_groups", "k_tail_back",
          "k_tail_shift", "pos_off", "pos_end", "pos_cur", "b_pos_skip", "outer", "a_outer_stride", "c_outer_stride",
          "res_head", "res_entries", "outer_left", "a_cur", "c_cur", "m_left", "res_cur") + OUTPUT_FIELDS
MAX_MR = 9  # three A/C row bases of three rows each
DEFAULT_MR = 6  # the tallest tile a GEMM asks for (nr = 4 fits 6 rows on AVX-512)
# Accumulators a VPDPBUSD K loop keeps in flight to run at its rate: its latency (5
# cycles on Intel's cores) times two a cycle. A shorter block waits on its chains.
VNNI_CHAINS = 10


@dataclass(frozen=True)
class GemmKernelSpec:
    """Everything that shapes the generated code (the cache key, with the version)."""

    path: Path
    mr: int
    nr: int
    s8_src: bool
    output: OutputSpec
    positions: bool = False  # batch-reduce: sum over positions, A offset per position (convolution)
    outer: bool = False  # an outer loop over blocks of m rows with their own A/dst strides
    unroll_k: int = 1  # K groups per iteration of the K loop
    prefetch_next: bool = False  # prefetch the next column tile's B into L2 while on this one
    # Prefetch B this many bytes ahead of the K loop into L1 (0: off): with few rows a
    # tile's B is read about once, from L3, and the hardware's own prefetch falls behind.
    prefetch_ahead: int = 0
    # Remainders (m % mr) that get a block of their own; None: all of 1..mr-1. A call
    # with any other remainder is refused (check_call). A primitive that knows its row
    # counts asks for those alone: the tail blocks are most of the code.
    tails: tuple | None = None
    # The K loop's code for K group counts that are not a multiple of unroll_k (a loop of
    # single groups), and for K % 4 != 0 (the shifted last group); off: such calls are refused.
    k_rest: bool = True
    k_tail: bool = True
    # The output stage's code for a last column tile narrower than tile_n (masked loads
    # and stores); off: every call's column count is a multiple of tile_n.
    n_tail: bool = True
    # Residual cells of split weights added after the K loop (VPMADDUBSW GEMMs only).
    residual: bool = False
    # Row cuts of a convolution's output row read from the zero-padded copy: ``(width,
    # groups, ((pixel, first group, end group), ...))``. Every call's m is ``width`` and its
    # K runs are ``groups`` K groups; the listed pixels read only their groups' range of
    # each run (the rest is the side padding: zero bytes, whose products are 0), so the
    # row's blocks are emitted in order (uncut ones in a loop), each cut block's K loop in
    # segments of the rows that read them. (): no cuts.
    cuts: tuple = ()

    def __post_init__(self):
        if self.residual and self.path.kind != "maddubsw":
            raise ValueError("residual: only a VPMADDUBSW kernel reads cells")
        if self.unroll_k < 1:
            raise ValueError(f"unroll_k: expected >= 1, got {self.unroll_k}")
        if not 1 <= self.mr <= MAX_MR:
            raise ValueError(f"mr: expected 1..{MAX_MR}, got {self.mr}")
        if self.nr < 1 or self.nr > 7:
            raise ValueError(f"nr: expected 1..7, got {self.nr}")
        if self.vector_registers_needed() > self.path.registers:
            raise ValueError(
                f"tile {self.mr}x{self.nr} needs {self.vector_registers_needed()} vector registers; "
                f"{self.path.name} has {self.path.registers}"
            )
        if self.cuts and (not self.positions or self.k_tail):
            raise ValueError("cuts: only a batch-reduce kernel without a K tail")
        spare = self.path.registers - self.mr * self.nr
        if output_registers_needed(self.path, self.output, self.nr, self.n_tail) > spare:
            raise ValueError(f"tile {self.mr}x{self.nr}: the output stage needs more than the {spare} free registers")

    def check_call(self, m: int, K: int, n: int) -> None:
        """Raise unless the kernel has the code a call of ``m`` rows, ``K`` bytes per
        position and ``n`` columns runs (a driver's bug otherwise: rows, K or columns left
        out without a word)."""
        if n % self.tile_n and not self.n_tail:
            raise RuntimeError(f"internal: {self.name} has no partial column tile for {n} columns")
        groups, rem = k_split(K)
        if self.tails is not None and m % self.mr not in self.tails + (0,):
            raise RuntimeError(f"internal: {self.name} has no block for {m} % {self.mr} rows (tails {self.tails})")
        if not self.cuts and ((groups % self.unroll_k and not self.k_rest) or (rem and not self.k_tail)):
            raise RuntimeError(f"internal: {self.name} has no K loop for K={K} "
                               f"(k_rest={self.k_rest}, k_tail={self.k_tail})")
        if self.cuts and (m, groups, rem) != (self.cuts[0], self.cuts[1], 0):
            raise RuntimeError(f"internal: {self.name} is cut for rows of {self.cuts[0]} and runs of "
                               f"{self.cuts[1]} K groups, not m={m}, K={K}")

    @property
    def tile_n(self) -> int:
        return self.nr * self.path.lanes

    @property
    def b_vectors_per_group(self) -> int:
        return self.nr * (2 if self.path.kind == "widen" else 1)

    @property
    def b_group_bytes(self) -> int:
        return self.b_vectors_per_group * self.path.vector_bytes

    def vector_registers_needed(self) -> int:
        return loop_registers(self.path, self.mr, self.nr, self.s8_src)

    @property
    def name(self) -> str:
        src = "s8" if self.s8_src else "u8"
        kind = "brgemm" if self.positions else "gemm"
        cells = "_cells" if self.residual else ""
        cut = "_cut" if self.cuts else ""
        return f"{kind}_{src}s8{self.output.dst_dt}_{self.path.isa}_{self.path.kind}{cells}_{self.mr}x{self.nr}{cut}"


def loop_registers(path: Path, mr: int, nr: int, s8_src: bool = False) -> int:
    """Vector registers the K loop of an ``mr`` x ``nr`` tile holds: the accumulators, a
    K group of B, the A broadcast, the xor 0x80 of an s8 source, and the path's helpers
    (VPMADDUBSW: the s16 ones and a product; widening: the second A pair and a product)."""
    b_vectors = nr * (2 if path.kind == "widen" else 1)
    helpers = 2 if path.kind in ("maddubsw", "widen") else 0
    return mr * nr + b_vectors + 1 + (1 if s8_src else 0) + helpers


def accumulator_sets(path: Path, mr: int, rows: int, nr: int, unroll_k: int) -> int:
    """Sets of accumulators the unrolled K loop of a ``rows``-row block (a tile of ``mr``)
    spreads its groups over: on VNNI paths a short block (the tail of 7-pixel rows in
    blocks of 5 + 2) has too few VPDPBUSD chains to hide the instruction's latency, and
    the tile's accumulators of the rows it lacks are free to hold more; the sets are
    added together before the output stage. (The VPMADDUBSW step's chain is a VPADDD.)
    Not timed: no VNNI CPU was at hand. By conv_tile's model a block of 2 rows of 2
    vectors took VPDPBUSD's 5 cycles a K group and takes 2.5 with two sets, so 7-pixel
    rows as 5 + 2 would run 7.5 cycles a group instead of 10; the model itself still
    counts the 5-cycle floor for every block.

    >>> from jit.dot import fast_path
    >>> [accumulator_sets(fast_path("avx2_vnni"), 5, rows, 2, 4) for rows in (5, 3, 2, 1)]
    [1, 1, 2, 4]
    """
    if path.kind != "vnni" or unroll_k < 2:
        return 1
    return max(1, min(mr // rows, unroll_k, -(-VNNI_CHAINS // (rows * nr))))


def tallest_tile(path: Path, nr: int, s8_src: bool = False) -> int:
    """The most rows (at most MAX_MR) whose K loop fits the registers with ``nr`` vectors
    (choose_tile may take fewer: the output stage needs its own)."""
    return max((mr for mr in range(1, MAX_MR + 1) if loop_registers(path, mr, nr, s8_src) <= path.registers),
               default=0)


def k_split(K: int) -> tuple[int, int]:
    """K bytes as the kernel runs them: (whole groups of 4, bytes left in a last group).

    >>> k_split(7), k_split(768), k_split(2)
    ((1, 3), (192, 0), (1, 0))

    K < 4 runs one whole group: its A rows and B are zero padded to 4 bytes.
    """
    return (K // 4, K % 4) if K >= 4 else (1, 0)


def choose_tile(path: Path, s8_src: bool, output: OutputSpec, nr: int, mr: int = DEFAULT_MR, *,
                positions: bool = False, outer: bool = False, unroll_k: int = 4,
                prefetch_next: bool = False, rows: tuple | None = None,
                ks: tuple | None = None, ns: tuple | None = None, residual: bool = False,
                cuts: tuple = ()) -> GemmKernelSpec:
    """The tallest tile of ``nr`` vectors (at most ``mr`` rows) whose registers fit.

    ``rows``: the row counts (m) the kernel will be called with, when known; only their
    remainders get tail blocks (see ``GemmKernelSpec.tails``), and the tile is no taller
    than the largest. ``ks``: likewise the K
    lengths (per position), when known: the K loops those never run are left out.
    ``ns``: the column counts, when known: none that ends inside a tile, no tail code.
    ``cuts``: see ``GemmKernelSpec.cuts`` (its blocks and K segments are all emitted as
    such: no tail blocks, no K loop of single groups, no K tail).
    """
    if rows:  # no block taller than the most rows a call has (an M of 1-5: one block of M)
        mr = min(mr, max(rows))
    splits = [k_split(k) for k in ks or ()]
    k_rest = ks is None or any(groups % unroll_k for groups, _ in splits)
    k_tail = ks is None or any(rem for _, rem in splits)
    n_tail = ns is None or any(n % (nr * path.lanes) for n in ns)
    if cuts:
        rows, k_rest, k_tail = None, False, False
    for height in range(mr, 0, -1):
        tails = None if rows is None else tuple(sorted({r % height for r in rows} - {0}))
        try:
            return GemmKernelSpec(path, height, nr, s8_src, output, positions, outer, unroll_k=unroll_k,
                                  prefetch_next=prefetch_next, tails=tails, k_rest=k_rest, k_tail=k_tail,
                                  n_tail=n_tail, residual=residual, cuts=cuts)
        except ValueError:
            continue
    raise ValueError(f"no tile of {nr} vectors fits {path.name}")


def args_offsets() -> dict[str, int]:
    """Byte offsets of the argument struct's fields."""
    from runtime.ffi import struct_offsets

    return struct_offsets(ARGS_CDEF, "struct i8j_gemm_args", FIELDS)


def generate(spec: GemmKernelSpec):
    """Generate the kernel's code (slow: PeachPy); see ``jit.cache.get_kernel``."""
    from jit import asm
    from jit.build import generate as build

    argument = asm.Argument(asm.ptr(asm.uint8_t), "args")
    return build(spec.name, spec.path.isa, SIGNATURE, (argument,), lambda: _emit(spec, argument),
                 meta={"spec": repr(spec), "tile": (spec.mr, spec.nr)})


def _emit(spec: GemmKernelSpec, argument) -> None:
    from jit import asm
    from jit.asm import (JB, JE, JG, JMP, JZ, LABEL, LEA, MOV, SHRX, SUB, ADD, CMP, DEC, IMUL, TEST,
                         XOR, Label, rax, rbp, rbx, rcx, rdi, rdx, rsi, r8, r9, r10, r11, r12, r13,
                         r14, r15)

    path, mr, nr = spec.path, spec.mr, spec.nr
    off = args_offsets()
    vb = path.vector_bytes
    V = lambda i: vector_register(path, i)  # noqa: E731

    # Vector registers: accumulators first, then B, then the step's helpers.
    acc = [[V(i * nr + v) for v in range(nr)] for i in range(mr)]
    nxt = mr * nr
    breg = [V(nxt + j) for j in range(spec.b_vectors_per_group)]
    nxt += spec.b_vectors_per_group
    areg = V(nxt); nxt += 1  # noqa: E702
    xor80 = ones = tmp = a01 = None
    if spec.s8_src:
        xor80 = V(nxt); nxt += 1  # noqa: E702
    if path.kind == "maddubsw":
        ones, tmp = V(nxt), V(nxt + 1); nxt += 2  # noqa: E702
    elif path.kind == "widen":
        a01, tmp = V(nxt), V(nxt + 1); nxt += 2  # noqa: E702
        ctrl01 = vector_constant(path, [0x80018000], "widen_pair01")
        ctrl23 = vector_constant(path, [0x80038002], "widen_pair23")
        # The shuffle controls in spare registers, loaded per row block (the output stage
        # uses every register but the accumulators): a VPSHUFB that reads its control
        # from memory costs a load each time (Zen 3, one spare on the 4x2 tile: +1-4%).
        held = [V(nxt + i) for i in range(min(2, path.registers - nxt))]
        ctrl_regs = list(zip(held, (ctrl01, ctrl23)))  # (register, constant) to load
        controls = held + [ctrl01, ctrl23][len(held):]  # what the two VPSHUFBs read
        nxt += len(held)
    vxor = asm.VPXORD if path.bits == 512 else asm.VPXOR
    vload = asm.VMOVDQU32 if path.bits == 512 else asm.VMOVDQU

    # GPRs. args: rdi. Tile loop: rsi B tile, r13 columns left, r14 tile column*4.
    # Row loop: rax A block, r10 C block, r8 lda, r11 ldc, r15 row*4 (rows left in the
    # args struct). K loop: rbx B cursor, rdx/rcx/r12 A cursors of rows 0-2/3-5/6-8,
    # r9 counter; in the output stage rcx/r12 are C bases of rows 3-5/6-8.
    args = rdi
    asm.LOAD.ARGUMENT(args, argument)
    MOV(rsi, [args + off["b"]])
    MOV(r13, [args + off["n"]])
    XOR(r14.as_dword, r14.as_dword)
    if spec.residual:
        MOV(rbp, [args + off["res_head"]])
        MOV([args + off["res_cur"]], rbp)

    def row_address(bases, stride, i):
        """Row ``i``: its group's base (rows 0-2, 3-5, 6-8) plus 0, 1 or 2 strides."""
        base, j = bases[i // 3], i % 3
        return base + 0 if j == 0 else base + stride * j

    def a_row(i):
        return row_address((rdx, rcx, r12), r8, i)

    def c_row(i):
        return row_address((r10, rcx, r12), r11, i)

    def row_bases(first, stride, rows: int) -> None:
        # rcx = first + 3 strides (rows 3-5), r12 = first + 6 strides (rows 6-8)
        if rows > 3:
            LEA(rcx, [stride + stride * 2])
            if rows > 6:
                LEA(r12, [first + rcx * 2])
            ADD(rcx, first)

    def k_group(rows: int, tail: bool, u: int = 0, sets: int = 1, active=None) -> None:
        # u: which group of an unrolled iteration (B and A displacements, no pointer bumps);
        # it adds into accumulator set u % sets (accumulator_sets: rows s*rows.. of acc);
        # active: the rows that read this group (all unless given: spec.cuts)
        first = (u % sets) * rows
        for j, b in enumerate(breg):
            vload(b, [rbx + u * spec.b_group_bytes + j * vb])
        if next_lines and not tail:  # rbp: tile stride + this row block's line of the group
            asm.PREFETCHT1([rbx + rbp * 1 + u * spec.b_group_bytes])
        if spec.prefetch_ahead and not tail:  # the lines of the group prefetch_ahead bytes on
            for line in range(-(-spec.b_group_bytes // 64)):
                asm.PREFETCHT0([rbx + spec.prefetch_ahead + u * spec.b_group_bytes + 64 * line])
        for i in range(rows) if active is None else active:
            if tail:  # the row's last dword, shifted so only the K % 4 valid bytes remain
                MOV(rbp.as_dword, [a_row(i)])
                SHRX(rbp.as_dword, rbp.as_dword, r9.as_dword)
                asm.VMOVD(areg.as_xmm, rbp.as_dword)
                asm.VPBROADCASTD(areg, areg.as_xmm)
            else:
                asm.VPBROADCASTD(areg, asm.dword[a_row(i) + 4 * u])
            if xor80 is not None:
                vxor(areg, areg, xor80)
            if path.kind == "widen":
                asm.VPSHUFB(a01, areg, controls[0])
                asm.VPSHUFB(areg, areg, controls[1])
                for v in range(nr):
                    emit_step(path, acc[first + i][v], a01, breg[v], tmp)
                    emit_step(path, acc[first + i][v], areg, breg[nr + v], tmp)
            else:
                for v in range(nr):
                    emit_step(path, acc[first + i][v], areg, breg[v], tmp, ones)

    # Next tile's B into L2: one cache line per K group, the line rotating with the row
    # block, so a tile of B streams in from L3 over the row blocks of the tile before it.
    group_lines = spec.b_group_bytes // 64
    next_lines = spec.prefetch_next and group_lines & (group_lines - 1) == 0
    row_shift = 2 + ((mr & -mr).bit_length() - 1)  # row*4 >> row_shift: odd multiple of the block index

    def residual_cells(rows: int) -> None:
        # r9: the tile's head (cells' offset, count per vector), rbx: the cell, rbp: cells
        # left for the vector. A cell is one more K group step of one vector: its weights
        # (gemm_pack.residual_entry: a vector, then the A offset) times A's dword
        # broadcast per row (one weight per byte pair: no saturation).
        weights = breg[0]  # B's registers are free after the K loop
        MOV(r9, [args + off["res_cur"]])
        MOV(rbx, [r9])
        ADD(rbx, [args + off["res_entries"]])
        for v in range(nr):
            cell, done = Label(), Label()
            MOV(rbp, [r9 + 8 * (v + 1)])
            TEST(rbp, rbp)
            JZ(done)
            LABEL(cell)
            vload(weights, [rbx])
            MOV(rdx, [rbx + vb])
            ADD(rdx, rax)
            row_bases(rdx, r8, rows)
            for i in range(rows):
                asm.VPBROADCASTD(areg, asm.dword[a_row(i)])
                if xor80 is not None:
                    vxor(areg, areg, xor80)
                emit_step(path, acc[i][v], areg, weights, tmp, ones)
            ADD(rbx, 2 * vb)
            DEC(rbp)
            asm.JNZ(cell)
            LABEL(done)

    def row_block(rows: int, ranges=None) -> None:
        # ranges: each row's (first, end) K groups of a run (spec.cuts), or None: all.
        # Constants are set per block: the output stage reuses their registers.
        if ones is not None:
            emit_ones_s16(path, ones, rbp)
        if path.kind == "widen":
            for reg, constant in ctrl_regs:
                vload(reg, constant)
        if xor80 is not None:
            emit_bytes(path, xor80, 0x80, rbp)
        sets = accumulator_sets(path, mr, rows, nr, spec.unroll_k)
        for i in range(sets * rows):
            for v in range(nr):
                vxor(acc[i][v], acc[i][v], acc[i][v])
        MOV(rbx, rsi)
        if spec.positions:
            # Batch-reduce: for each position, A rows start at the block's rows + offset;
            # B runs on through the positions' K groups in packed order.
            pos_loop = Label()
            MOV(rbp, [args + off["pos_off"]])
            MOV([args + off["pos_cur"]], rbp)
            LABEL(pos_loop)
            MOV(rbp, [args + off["pos_cur"]])
            MOV(rdx, [rbp])
            ADD(rdx, rax)
            ADD(rbp, 8)
            MOV([args + off["pos_cur"]], rbp)
        else:
            MOV(rdx, rax)
        row_bases(rdx, r8, rows)
        k_loop, k_tail, k_done = Label(), Label(), Label()
        MOV(r9, [args + off["k_groups"]])
        if next_lines:
            MOV(rbp, r15)
            asm.SHR(rbp, row_shift)
            asm.AND(rbp, group_lines - 1)
            asm.SHL(rbp, 6)
            ADD(rbp, [args + off["b_tile_stride"]])

        def advance(groups: int) -> None:
            ADD(rbx, groups * spec.b_group_bytes)
            ADD(rdx, 4 * groups)
            if rows > 3:
                ADD(rcx, 4 * groups)
            if rows > 6:
                ADD(r12, 4 * groups)

        unroll = spec.unroll_k
        if ranges is not None:  # a K loop per segment of the run, of the rows that read it
            bounds = sorted({0, spec.cuts[1]} | {b for r in ranges for b in r})
            for s0, s1 in zip(bounds, bounds[1:]):
                active = [i for i, (lo, hi) in enumerate(ranges) if lo <= s0 and s1 <= hi]
                if not active:  # no row reads it: B and A move past it
                    advance(s1 - s0)
                    continue
                wide, rest = divmod(s1 - s0, unroll)
                if wide:
                    seg_loop = Label()
                    MOV(r9, wide)
                    LABEL(seg_loop)
                    for u in range(unroll):
                        k_group(rows, tail=False, u=u, sets=sets, active=active)
                    advance(unroll)
                    DEC(r9)
                    asm.JNZ(seg_loop)
                for u in range(rest):
                    k_group(rows, tail=False, u=u, sets=sets, active=active)
                if rest:
                    advance(rest)
        elif unroll > 1:  # whole unrolled iterations, then one group at a time
            k_wide, k_rest = Label(), Label()
            SUB(r9, unroll)
            JB(k_rest)
            LABEL(k_wide)
            for u in range(unroll):
                k_group(rows, tail=False, u=u, sets=sets)
            advance(unroll)
            SUB(r9, unroll)
            asm.JAE(k_wide)
            LABEL(k_rest)
        if ranges is None and (unroll == 1 or spec.k_rest):
            if unroll > 1:
                ADD(r9, unroll)
            TEST(r9, r9)
            JZ(k_tail)
            LABEL(k_loop)
            k_group(rows, tail=False)
            advance(1)
            DEC(r9)
            asm.JNZ(k_loop)
        LABEL(k_tail)
        if spec.k_tail:
            MOV(r9, [args + off["k_tail_back"]])
            TEST(r9, r9)
            JZ(k_done)
            SUB(rdx, r9)
            if rows > 3:
                SUB(rcx, r9)
            if rows > 6:
                SUB(r12, r9)
            MOV(r9, [args + off["k_tail_shift"]])
            k_group(rows, tail=True)
            if spec.positions:  # the next position's B follows the tail group
                ADD(rbx, spec.b_group_bytes)
        LABEL(k_done)
        if spec.positions:
            ADD(rbx, [args + off["b_pos_skip"]])  # B of the run's part this call leaves out
            MOV(rbp, [args + off["pos_cur"]])
            CMP(rbp, [args + off["pos_end"]])
            JB(pos_loop)
        for i in range(rows, sets * rows):  # the other sets into the first
            for v in range(nr):
                asm.VPADDD(acc[i % rows][v], acc[i % rows][v], acc[i][v])
        if spec.residual:
            residual_cells(rows)
        row_bases(r10, r11, rows)
        free = [V(j) for j in range(mr * nr, path.registers)]  # all but the accumulators
        ctx = OutputContext(path=path, spec=spec.output, args=args, offsets=off, col_bytes=r14,
                            row_bytes=r15, n_left=r13, c_row=c_row, free_vectors=free,
                            free_gprs=[rbp, rbx, r9, rdx], n_tail=spec.n_tail)
        emit_output(ctx, acc, rows, nr)

    tile_loop, tile_next = Label(), Label()
    outer_loop, outer_next = Label(), Label()
    LABEL(tile_loop)
    MOV(rax, [args + off["a"]])
    MOV(r8, [args + off["lda"]])
    MOV(r10, [args + off["c"]])
    if spec.output.dst_bytes == 4:
        ADD(r10, r14)
    else:  # r14 counts columns * 4; the dst has one byte per column
        MOV(rbp, r14)
        asm.SHR(rbp, 2)
        ADD(r10, rbp)
    MOV(r11, [args + off["ldc"]])
    XOR(r15.as_dword, r15.as_dword)

    def past_block(rows: int, move: bool = True) -> None:
        # r15 past the block's rows; with move, A and C on to the next block's first row
        if move:
            IMUL(rbp, r8, rows)
            ADD(rax, rbp)
            IMUL(rbp, r11, rows)
            ADD(r10, rbp)
        ADD(r15, 4 * rows)

    if spec.outer:
        # Blocks of m rows whose A and dst starts are strides apart (a convolution's
        # output rows); r15 keeps counting rows across blocks for row-indexed operands.
        MOV([args + off["a_cur"]], rax)
        MOV([args + off["c_cur"]], r10)
        MOV(rbp, [args + off["outer"]])
        MOV([args + off["outer_left"]], rbp)
        LABEL(outer_loop)
        MOV(rax, [args + off["a_cur"]])
        MOV(r10, [args + off["c_cur"]])
    if spec.cuts:  # the output row's blocks in order, each with its rows' cuts
        width, groups, pixels = spec.cuts
        cut = {p: (lo, hi) for p, lo, hi in pixels}
        blocks = []  # (rows, each row's K groups (first, end), how many such blocks in a row)
        for b0 in range(0, width, mr):
            rows = min(mr, width - b0)
            # (an uncut block too runs its K loop as one segment: spec.k_rest is off)
            ranges = [cut.get(b0 + i, (0, groups)) for i in range(rows)]
            if blocks and blocks[-1][:2] == (rows, ranges):  # the same code again: a loop
                blocks[-1] = (rows, ranges, blocks[-1][2] + 1)
            else:
                blocks.append((rows, ranges, 1))
        for j, (rows, ranges, count) in enumerate(blocks):
            if count > 1:  # (m_left counts them)
                again = Label()
                MOV(asm.qword[args + off["m_left"]], count)
                LABEL(again)
            row_block(rows, ranges)
            past_block(rows, move=j + 1 < len(blocks) or count > 1)
            if count > 1:
                DEC(asm.qword[args + off["m_left"]])
                asm.JNZ(again)
    else:
        MOV(rbp, [args + off["m"]])
        MOV([args + off["m_left"]], rbp)
        m_left = asm.qword[args + off["m_left"]]
        row_loop, row_tail = Label(), Label()
        LABEL(row_loop)
        CMP(m_left, mr)
        JB(row_tail)
        row_block(mr)
        past_block(mr)
        SUB(m_left, mr)
        JMP(row_loop)

        LABEL(row_tail)
        tails = {rows: Label() for rows in range(1, mr) if spec.tails is None or rows in spec.tails}
        for rows, label in tails.items():
            CMP(m_left, rows)
            JE(label)
        JMP(outer_next)  # no rows left (check_call refuses remainders without a block)
        for rows, label in tails.items():
            LABEL(label)
            row_block(rows)
            past_block(rows, move=False)
            JMP(outer_next)

    LABEL(outer_next)
    if spec.outer:
        MOV(rbp, [args + off["a_outer_stride"]])
        ADD([args + off["a_cur"]], rbp)
        MOV(rbp, [args + off["c_outer_stride"]])
        ADD([args + off["c_cur"]], rbp)
        DEC(asm.qword[args + off["outer_left"]])
        asm.JNZ(outer_loop)
    LABEL(tile_next)
    if spec.residual:
        ADD(asm.qword[args + off["res_cur"]], 8 * (1 + nr))
    ADD(rsi, [args + off["b_tile_stride"]])
    ADD(r14, spec.tile_n * 4)
    SUB(r13, spec.tile_n)
    JG(tile_loop)
    asm.RETURN()
