"""The convolution's blocking model: the register block its rows take, whether its
edge columns read the source in place (through strips, or with their windows cut at the
padding) or from the padded copy, and the cache budgets those follow.

Each rule counts cycles per K group of a row block (two dot products and two loads a
cycle, L2 feeding about 32 bytes a cycle) and was checked against measurements, given in
its docstring: ``conv_tile`` and ``flat_tile_rows`` (block heights and widths),
``strips_pay`` and ``edges_pay`` (the source's edge columns), ``column_chunks`` (how
much of B a thread sweeps at a time).

>>> from runtime.caches import DataCaches
>>> cache_budgets(DataCaches(l1d=48 << 10, l2=2 << 20, source="example"))
(40960, 1048576)
"""

from __future__ import annotations

import math
from itertools import groupby
from typing import TYPE_CHECKING

from jit.dot import Path
from jit.gemm_kernel import DEFAULT_MR, MAX_MR, loop_registers, tallest_tile
from primitives.gemm import tile_vectors
from runtime.caches import data_caches

if TYPE_CHECKING:
    from primitives.conv_geometry import Geometry


def cache_budgets(caches) -> tuple[int, int]:
    """(bytes of a column tile's B that stay in L1 across row blocks, bytes of packed B a
    thread keeps in L2 over its images) for a core's ``runtime.caches.DataCaches``: 5/6
    of L1 data, half of L2 (tuned on 48 KB and 2 MB)."""
    l1 = caches.l1d * 5 // 6
    return l1, max(caches.l2 // 2, l1)


L1_BUDGET, L2_BUDGET = cache_budgets(data_caches())  # tests patch these for other cores' caches


def column_chunks(packed, items: int, threads: int) -> int:
    """How many chunks of column tiles a thread with several items sweeps them in: each
    chunk's B stays in L2 (ResNet-50's 512-channel 3x3 weights are 2.4 MB), rather than
    all of B streaming from memory again for each image."""
    return 1 if items <= threads else max(1, -(-packed.data.nbytes // L2_BUDGET))


def b_tile_bytes(path: Path, g: Geometry, nr: int) -> int:
    """Bytes of a column tile's B: all of K for nr vectors."""
    return g.b_rows * (2 if path.kind == "widen" else 1) * nr * path.lanes


def _streams_b(path: Path, g: Geometry, nr: int) -> bool:
    """Whether a column tile's B outgrows L1, so each row block reads it from L2 again."""
    return b_tile_bytes(path, g, nr) > L1_BUDGET


def _block_cycles(path: Path, g: Geometry, r: int, n: int) -> float:
    """conv_tile's model: cycles of one K group of an r-row block of n vectors."""
    l2 = n * path.vector_bytes / 32 if _streams_b(path, g, n) else 0.0
    return max(r * n / 2, (r + n) / 2, 5.0, l2)


def _rows_cycles(path: Path, g: Geometry, width: int, r: int, n: int, block=None) -> float:
    """The model's cycles of ``width`` rows as blocks of ``r`` and one block of the rest
    (each ``block(path, g, rows, n)``: _block_cycles unless given)."""
    block = block or _block_cycles
    full, rest = divmod(width, r)
    return full * block(path, g, r, n) + (block(path, g, rest, n) if rest else 0.0)


def conv_tile(path: Path, g: Geometry, nr: int | None = None) -> tuple:
    """The register block (rows, vectors) for ``g``'s output rows on ``path``: at most
    GEMM's ``tile_vectors`` (exactly ``nr`` vectors, where given).

    Each output row runs as blocks of ``mr`` rows and one block of the rest, over
    ceil(ocg / (nr * lanes)) column tiles. Model (Intel AVX-512 cores: two dot products
    and two loads a cycle, L2 feeding about 32 bytes a cycle), per K group of a block
    of r rows: max(r * nr / 2, (r + nr) / 2, 5 (the latency each accumulator waits),
    nr vectors of B / 32 bytes when the tile's B does not stay in L1) cycles; the
    cheapest (rows, vectors) within 3% of the best wins, wider first, then taller.
    Measured here (one thread): 7x7 rows with 512 channels, 7x2 or 7x3 rather than 4+3
    rows of 4x4, +4-9% (B streams from L2 at each block); 14 wide: 5+5+4 rows of 4x4;
    56: 6 x 9 + 2.
    """
    width, widest = g.out[2], tile_vectors(path, g.ocg)
    if g.flat:  # (the height is flat_tile_rows' to choose, from the rows of each thread)
        return DEFAULT_MR, widest if nr is None else nr
    if nr is None:  # narrower tiles only to spare L2
        widths = range(widest, 0, -1) if _streams_b(path, g, widest) else (widest,)
    else:
        widths = (nr,)
    costs = {}
    for n in widths:
        tiles = -(-g.ocg // (n * path.lanes))
        # The full width: no taller than its K loop fits (choose_tile trims further where
        # the output stage needs more); a narrower one must fit with an s8 source and 2
        # registers for the output stage.
        top = min(DEFAULT_MR, tallest_tile(path, n)) if n == widest else MAX_MR
        for r in range(1, min(top, width) + 1):
            if n < widest and loop_registers(path, r, n, s8_src=True) > path.registers - 2:
                break
            costs[(n, r)] = tiles * _rows_cycles(path, g, width, r, n)
    best = min(costs.values())
    n, r = max(key for key, cost in costs.items() if cost <= 1.03 * best)
    return r, n


def strips_pay(path: Path, g: Geometry, strips: tuple, splits: list) -> bool:
    """Whether reading a padded source in place with edge strips (``Geometry.strips``:
    the columns inside as shorter rows, each edge column down the rows of ``splits``)
    beats the padded copy, which reads and writes each source byte once per call.

    The strips take more, shorter row blocks. Where a column tile's B stays in L1,
    conv_tile's model decides: the strips' blocks must cost no more cycles than the
    whole rows'. Where B streams from L2, each extra block reads its tile's B again:
    the strips must read less extra B than twice the bytes the copy moves.
    Measured, one thread, the same layer both ways interleaved in one process (batch 1
    and 8): res2 3x3 (B in L1) +1.5-4% (+3-6% on two threads); res3 3x3/2 (401 KB of
    source an image against 737 KB of extra B) +3-4%; and where the rule says copy,
    res4 3x3/2 (200 KB against 1.8 MB) -0-2%, res5 3x3/2 -2-5%, res3 3x3 -3-5%, res4
    3x3 -1-8%, res5 3x3 -13-15%. A source that fits L1 is copied: its copy costs next
    to nothing, and fewer blocks did not make up for the strips (Zen 3, AVX2, res5 3x3
    at batch 1, fresh processes alternating: the copy 8-17% faster under exact, where 5-row
    blocks made the strips 11 blocks against the copy's 14; -2 to +10% under faithful).
    """
    r, n = conv_tile(path, g)
    left, right = strips[:2]
    width, rows = g.out[2], g.out[1]
    edge_rows = [h1 - h0 for h0, h1 in splits]  # an edge column's rows, item by item
    if not _streams_b(path, g, n):
        edges = (left + right) * sum(_rows_cycles(path, g, m, r, n) for m in edge_rows)
        inside = rows * _rows_cycles(path, g, width - left - right, r, n)
        return inside + edges <= rows * _rows_cycles(path, g, width, r, n)
    if math.prod(g.src) * g.icg <= L1_BUDGET:
        return False
    extra = (rows * -(-(width - left - right) // r) + (left + right) * sum(-(-m // r) for m in edge_rows)
             - rows * -(-width // r))  # row blocks an image
    tiles = -(-g.ocg // (n * path.lanes))
    return extra * tiles * b_tile_bytes(path, g, n) < 2 * math.prod(g.src) * g.icg


# Cycles of one row's step on one B vector (a K group of 4 bytes) on the non-VNNI paths,
# where the step's instructions run at the rate of the ports they share: the VPMADDUBSW
# step's three and the widening step's two three a cycle on 256-bit vectors (Intel's
# three vector ALU ports; on Zen 3 the rate of its two multiplies alone, as its peak
# loop ran), two a cycle on 512-bit ones (Intel's ports 0 and 5). Calibrated by
# edges_pay's measurements, not timed per instruction. (VNNI: edges_pay counts blocks.)
_STEP_CYCLES = {("maddubsw", 32): 1.0, ("maddubsw", 64): 1.5, ("widen", 32): 2 / 3, ("widen", 64): 1.0}


def _part_cycles(path: Path, g: Geometry, r: int, n: int) -> float:
    """edges_pay's model on the non-VNNI paths: cycles of one K group of an r-row block of
    n vectors: its steps at _STEP_CYCLES (the widening path's two B vectors per vector),
    its r + n loads at two a cycle, its B from L2 where the tile outgrows L1; no floor of
    5 cycles (VPDPBUSD's latency): an accumulator here waits on one VPADDD."""
    b_vectors = n * (2 if path.kind == "widen" else 1)
    l2 = b_vectors * path.vector_bytes / 32 if _streams_b(path, g, n) else 0.0
    return max(r * b_vectors * _STEP_CYCLES[path.kind, path.vector_bytes], (r + b_vectors) / 2, l2)


def edges_pay(path: Path, g: Geometry, edges: tuple, splits: list, nr: int) -> bool:
    """Whether the edge columns read in place, their windows cut at the side padding
    (``Geometry.edge_windows``), beat the padded copy on ``path``'s kernel of ``nr``
    vectors.

    Model: per row block, _part_cycles times the share of the window's K it reads. The
    edges do less work (ResNet-50's 3x3 at 7x7: 361 of 441 window pixels, as oneDNN's
    own kernels skip them; with the copy, 399) in more, shorter blocks: the whole rows'
    blocks of conv_tile's height, against the inside columns' and each edge column's
    classes of rows (one call each). A short block pays where its loads or its B from
    L2 outweigh its steps. Measured, one thread, batch 1, interleaved in one process,
    the seven 3x3 layers of ResNet-50 (edges against the copy):
    - Zen 3, AVX2: VPMADDUBSW +0.5-7% (res5 3x3 +7%); the widening kernel res4 3x3 +4%,
      three layers 0%, and where the model refuses, res5 3x3 -7% (its 4-row blocks: 5
      columns inside take two, as 7 do) and res4 3x3/2 -4%; res5 3x3/2 -3% in one run,
      +1% in another (taken).
    - Emerald Rapids, AVX-512 without VNNI: all seven gain, VPMADDUBSW +2-8%, the
      widening kernel +1-5%.
    - Emerald Rapids, VNNI: res2 3x3 +4% on zmm and +6.5% on ymm (the strips +1.5-5%),
      res5 3x3 on ymm +24% (its 7-pixel rows in blocks of 5 + 2 become one block of 5,
      the edge columns a block of 5 down the rows); where the model refuses, res5 3x3 on
      zmm -20% (7x2 blocks: one block a row either way), res4 3x3 -6-9%, res5 3x3/2
      -5-8% on zmm and -10% on ymm, res3 3x3/2 +1-3.5% on zmm (the strips, taken, +3%).
      There a block costs as much whatever its height (VPDPBUSD's latency and the B it
      reads again; the floor of conv_tile's model was not enough: it took res5 3x3/2's
      one edge column as 2% cheaper), so the model counts whole blocks: the edges must
      take fewer than the copy, each weighed by the share of K it reads.
    """
    r = conv_tile(path, g, nr)[0]

    def whole(path: Path, g: Geometry, rows: int, n: int) -> float:  # VNNI: any height costs a whole block
        return _block_cycles(path, g, r, n)

    part = whole if path.kind == "vnni" else _part_cycles
    width, runs = g.out[2], g.runs[0]
    parts = [g.window_runs(h) for h in range(g.out[1])]
    share = sum(hi - lo for lo, hi in parts) / runs  # whole rows' worth of the window
    def blocks(rows: int) -> float:  # cycles of a K group of ``rows`` rows in blocks of r
        return _rows_cycles(path, g, rows, r, nr, part)

    cycles = share * blocks(width - len(edges))
    for _, kw0, kw1 in edges:
        for h0, h1 in splits:  # a call per run of rows that read the same window rows
            for (lo, hi), rows in groupby(parts[h0:h1]):
                cycles += (hi - lo) / runs * (kw1 - kw0) / g.run_kw * blocks(len(list(rows)))
    return cycles <= share * blocks(width)


def flat_tile_rows(path: Path, g: Geometry, nr: int, rows: tuple) -> int:
    """The block height for a 1x1 convolution run as one GEMM over ``rows`` pixels a
    thread: the one whose blocks cost least on the longest part (conv_tile's model;
    GEMM's own height unless another is more than 1% cheaper). Thousands of rows cost the
    same at any height from 3; res5's 49 pixels (batch 1) run as 9 x 5 + 4 rather than
    8 x 6 + 1 (the model: 3% fewer cycles; measured, one thread, 2048->512 and 512->2048
    interleaved with oneDNN: best of 20 windows +1-2% in 4 of 5 runs, -1% in one).
    """
    cost = {r: max(_rows_cycles(path, g, m, r, nr) for m in rows) for r in range(DEFAULT_MR, 0, -1)}
    best = min(cost, key=cost.get)
    return DEFAULT_MR if cost[DEFAULT_MR] <= 1.01 * cost[best] else best
