"""Packing of B (weights) for the GEMM microkernel, and what is computed with it.

The kernel reads B as tiles of ``nr`` vectors of ``lanes`` columns, with each column's
K values in groups of four consecutive bytes (``[tile][k group][vector][lane][4]``), or,
for the exact widening path, as s16 pairs (``[tile][k group][pair][vector][lane][2]``).
Packing pads N to whole tiles and K to whole groups with zeros, so the kernel never
needs a mask to read B, and it yields the column sums the compensation needs and the
overflow proof of the VPMADDUBSW path.

Exact weights with a few unsafe pairs (trained weights: most pairs are small or of
opposite signs) are split for the VPMADDUBSW kernel instead of widened: each unsafe
pair's second weight is cut so the pair sums to 128 in magnitude (safe), and what was
cut goes to a residual table of cells, one per (K group of 4, vector of a tile) holding
an unsafe pair, which the kernel adds after its K loop as one more VPMADDUBSW step each
(:func:`residual_tables`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jit.dot import Path
from primitives.memory import aligned_zeros


@dataclass(frozen=True)
class PackedB:
    """B in the kernel's layout plus what was learned while packing it."""

    data: np.ndarray  # aligned bytes
    n: int
    k: int
    tile_n: int
    tiles: int
    tile_stride: int  # bytes per tile
    colsum: np.ndarray  # int64, per column (length tiles * tile_n, zero padded)
    # (column, k pair) pairs proven not to saturate VPMADDUBSW, of all; None where not
    # checked (packed for VNNI, which cannot saturate, by jit.pack_kernel)
    safe_pairs: int | None
    total_pairs: int | None
    # A batch-reduce B (convolution) of equal K runs: int64 column sums per run and window
    # column in it (runs x kw x colsum's length), for rows that read part of the window.
    run_colsum: np.ndarray | None = None
    # Split weights (pack_b's ``residual``): per tile, the byte offset of its cells in
    # res_entries and their count per vector (int64, tiles x (1 + nr)); the cells
    # (a residual_entry each); how many there are.
    res_head: np.ndarray | None = None
    res_entries: np.ndarray | None = None
    cells: int = 0


def residual_entry(lanes: int) -> np.dtype:
    """One residual cell: per lane (column) the four s8 weights the kernel's VPMADDUBSW
    multiplies a dword of A by, then where that dword starts (bytes into an A row),
    padded to two vectors, so the weights load from one aligned vector. Of each pair of
    bytes at most one weight is not zero (a cut pair's second one, at most 128 in
    magnitude), so the s16 sums cannot saturate."""
    return np.dtype({"names": ["r", "koff"], "formats": [("i1", (lanes, 4)), "<i8"],
                     "offsets": [0, 4 * lanes], "itemsize": 8 * lanes})


def unsafe_pairs(b_kn: np.ndarray) -> np.ndarray:
    """Which (k pair, column) pairs can saturate VPMADDUBSW's s16 sum: (ceil(K/2), N) bool.

    Pairs are k = 2j, 2j+1 as the kernels form them. With u8 sources up to 255 a pair of
    one sign reaches 255 * (|w0| + |w1|), over 32767 once |w0| + |w1| >= 129; a pair of
    opposite signs stays within 255 * 128 = 32640 in magnitude, whatever its values.
    Weights given as rows of columns (an inner product's OC x K: ``b_kn`` a transposed
    view) are read a column's pairs at a time, and the result is such a view too.
    """
    k = b_kn.shape[0]
    if b_kn.T.flags.c_contiguous:  # [column][k]: a pair is one little-endian int16
        cols = b_kn.T
        if k % 2:
            cols = np.concatenate([cols, np.zeros((cols.shape[0], 1), np.int8)], axis=1)
        both = cols.view(np.int16)
        w0, w1 = (both << 8) >> 8, both >> 8  # the low byte (k = 2j) and the high one, sign-extended
        return (((w0 ^ w1) >= 0) & (np.abs(w0 + w1) > 128)).T
    w0 = b_kn[0::2].astype(np.int16)
    w1 = np.zeros_like(w0)
    w1[: k // 2] = b_kn[1::2]
    return ((w0 ^ w1) >= 0) & (np.abs(w0 + w1) > 128)  # same sign bit, so |w0 + w1| = |w0| + |w1|


def saturation_proof(b_kn: np.ndarray, unsafe: np.ndarray | None = None) -> tuple[int, int]:
    """(pairs proven never to saturate VPMADDUBSW, all pairs): see :func:`unsafe_pairs`."""
    unsafe = unsafe_pairs(b_kn) if unsafe is None else unsafe
    return int(unsafe.size - np.count_nonzero(unsafe)), int(unsafe.size)


@dataclass(frozen=True)
class Cuts:
    """The unsafe pairs of a K x N s8 matrix and how they are split: pair ``p`` (k = 2p,
    2p+1) of column ``n`` keeps w0 and takes ``kept`` as its second weight, so its
    magnitudes sum to 128; ``rest`` (w1 minus that, at most 128 in magnitude) goes to a
    residual cell."""

    p: np.ndarray
    n: np.ndarray
    kept: np.ndarray  # int8
    rest: np.ndarray  # int16


def cut_pairs(b_kn: np.ndarray, unsafe: np.ndarray) -> Cuts:
    """The split of ``b_kn``'s unsafe pairs (:func:`unsafe_pairs`): a sparse list, so that
    weights with few of them cost little more to pack than weights with none."""
    # (an unsafe pair has both weights: a last odd k's pair is safe; flatnonzero is ten
    # times faster than a 2-D nonzero)
    if unsafe.T.flags.c_contiguous:
        n, p = np.divmod(np.flatnonzero(unsafe.T), unsafe.shape[0])
    else:
        p, n = np.divmod(np.flatnonzero(unsafe), unsafe.shape[1])
    w0 = b_kn[2 * p, n].astype(np.int16)
    w1 = b_kn[2 * p + 1, n].astype(np.int16)
    kept = np.where(w1 < 0, np.abs(w0) - 128, 128 - np.abs(w0))
    return Cuts(p, n, kept.astype(np.int8), (w1 - kept).astype(np.int16))


def cell_share(unsafe: np.ndarray, lanes: int) -> tuple[int, float]:
    """(residual cells, their share of all (K group, vector of ``lanes`` columns) cells)
    that splitting the weights of ``unsafe`` (:func:`unsafe_pairs`) would make."""
    pairs, n = unsafe.shape
    vectors, groups = -(-n // lanes), -(-pairs // 2)
    if unsafe.T.flags.c_contiguous:  # [column][pair]: OR the pairs of a group, then the lanes of a vector
        cols = np.zeros((vectors * lanes, 2 * groups), bool)
        cols[:n, :pairs] = unsafe.T
        group = cols.view(np.uint16).reshape(vectors, lanes, groups) != 0
        cells = int(np.count_nonzero(group.any(axis=1)))
    else:  # [pair][column]: OR the pairs of a group, then a vector's lanes as whole 8-byte words
        group = np.zeros((groups, vectors * lanes), bool)
        group[:, :n] = unsafe[0::2]
        group[: pairs // 2, :n] |= unsafe[1::2]
        cells = int(np.count_nonzero(group.view(np.uint64).reshape(groups, vectors, lanes // 8).any(axis=2)))
    return cells, cells / (groups * vectors)


def residual_tables(cuts: Cuts, k: int, n: int, lanes: int, nr: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's residual cells in the order it reads them (tile, vector, K group), and
    per tile the byte offset of its first cell and its cell count per vector.

    A cell of group g reads A's dword at 4g, its weights at bytes 1 and 3 (the second
    weights of the group's pairs). The last group of a K that is not a multiple of 4 (and
    at least 4) reads the row's last dword instead, at K - 4, so it never reads past the
    row; only its first pair can be cut (the second lacks its second weight), its weight
    then at byte 5 - K % 4."""
    tiles = -(-n // (nr * lanes))
    group, vector = cuts.p // 2, cuts.n // lanes
    # cells ordered by (vector, group): a tile's vectors are consecutive, so this is (tile, v, group)
    keys, cell = np.unique(vector * (-(-k // 4)) + group, return_inverse=True)
    cell_vector, cell_group = np.divmod(keys, -(-k // 4))
    entries = np.zeros(len(keys), residual_entry(lanes))
    shifted = (4 * cell_group + 4 > k) & (k >= 4)
    entries["koff"] = np.where(shifted, k - 4, 4 * cell_group)
    byte = np.where(shifted[cell], 5 - k % 4, 1 + 2 * (cuts.p % 2))  # the pair's second weight
    entries["r"][cell, cuts.n % lanes, byte] = cuts.rest
    return _tables(np.bincount(cell_vector, minlength=tiles * nr)[: tiles * nr].reshape(tiles, nr), entries)


def _tables(counts: np.ndarray, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's residual tables from the cells in reading order and their count per
    (tile, vector): per tile the byte offset of its first cell and those counts (int64,
    tiles x (1 + nr)), and the cells' bytes in an aligned buffer."""
    head = np.zeros((counts.shape[0], 1 + counts.shape[1]), np.int64)
    head[:, 1:] = counts
    head[1:, 0] = np.cumsum(counts.sum(axis=1))[:-1] * entries.itemsize
    data = aligned_zeros(max(entries.nbytes, entries.itemsize))  # never empty: a pointer to pass
    data[: entries.nbytes] = entries.view(np.uint8)
    return head, data


def pack_b(b_kn: np.ndarray, path: Path, nr: int, proof: tuple[int, int] | None = None,
           unsafe: np.ndarray | None = None, residual: bool = False) -> PackedB:
    """Pack the logical K x N s8 matrix ``b_kn`` for ``path`` with tiles of ``nr`` vectors.

    ``proof``: ``saturation_proof(b_kn)`` where the caller has it already (it decided the
    path with it); computed here otherwise. ``residual``: split the unsafe pairs
    (``unsafe``: :func:`unsafe_pairs`, where the caller has it) into the residual tables
    a VPMADDUBSW kernel with ``residual`` reads (the tables are empty when every pair is
    safe)."""
    k, n = b_kn.shape
    lanes = path.lanes
    tile_n = nr * lanes
    tiles = -(-n // tile_n)
    groups = -(-k // 4)
    # A group of 4 bytes (or a pair of s16) moves as one int32, so the transpose into
    # tiles moves a quarter of the elements a byte transpose would. B given as rows of
    # columns (an inner product's OC x K weights: b_kn a transposed view) has its groups
    # in place; K x N rows are interleaved into groups first, by four strided copies.
    # Either way the units come out as [tile][group][unit of the group][v][lane]; a
    # group is one int32 unit (four bytes) or, widened, two (two pairs of s16).
    # (A 1024 x 1024 B, the proof and column sums included: K x N 1.8-1.9 ms, widened
    # 1.9-2.8, instead of 7.2-8.8 and 11-11.4 through a byte transpose.)
    n_pad, widen = tiles * tile_n, path.kind == "widen"
    dt, per_group = (np.int16, 2) if widen else (np.int8, 1)
    if b_kn.T.flags.c_contiguous:  # [column][k]: [tile][v][lane][group][unit]
        cols = np.zeros((n_pad, groups * 4), dt)
        cols[:n, :k] = b_kn.T
        units = cols.view(np.int32).reshape(tiles, nr, lanes, groups, per_group).transpose(0, 3, 4, 1, 2)
    else:  # k = 4 group + e: [group][column][e], i.e. [group][tile][v][lane][unit]
        rows = np.zeros((groups, n_pad, 4), dt)
        for e in range(4):
            part = b_kn[e::4]
            rows[: len(part), :n, e] = part
        units = rows.view(np.int32).reshape(groups, tiles, nr, lanes, per_group).transpose(1, 0, 4, 2, 3)
    data = aligned_zeros(4 * units.size)
    data.view(np.int32).reshape(units.shape)[...] = units  # one copy, into the aligned buffer
    res_head = res_entries = None
    cells = 0
    if residual:  # the cut pairs' second weights, patched into the packed bytes; the rest to cells
        unsafe = unsafe_pairs(b_kn) if unsafe is None else unsafe
        cuts = cut_pairs(b_kn, unsafe)
        kk, col = 2 * cuts.p + 1, cuts.n
        tile, v, lane = col // tile_n, col % tile_n // lanes, col % lanes
        data[(((tile * groups + kk // 4) * nr + v) * lanes + lane) * 4 + kk % 4] = cuts.kept.view(np.uint8)
        res_head, res_entries = residual_tables(cuts, k, n, lanes, nr)
        cells = int(res_head[:, 1:].sum())
    colsum = np.zeros(n_pad, np.int64)
    colsum[:n] = b_kn.sum(axis=0, dtype=np.int32 if k < 1 << 24 else np.int64)  # |sum| <= 128 K
    safe, total = saturation_proof(b_kn, unsafe) if proof is None else proof
    return PackedB(data, n, k, tile_n, tiles, data.nbytes // tiles, colsum, safe, total,
                   res_head=res_head, res_entries=res_entries, cells=cells)


def residual_part(packed: PackedB, nr: int, run_k: int, offsets: np.ndarray, runs: tuple[int, int],
                  ks: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The residual tables of a batch-reduce call that reads part of B (a convolution's
    row or edge column whose window is cut at the padding): the cells of K runs
    ``runs[0]..runs[1]-1`` (each ``run_k`` rows of B) at run offsets ``ks[0]..ks[1]-1``,
    each cell's K offset made its A offset from the call's A base: the run's entry of
    ``offsets`` (the kernel's positions table) plus its offset past ``ks[0]``. (A
    convolution's runs are whole K groups on the VPMADDUBSW path: no cell is shifted.)"""
    lanes = packed.tile_n // nr
    entry = residual_entry(lanes)
    cells = packed.res_entries[: packed.cells * entry.itemsize].view(entry)
    counts = packed.res_head[:, 1:].reshape(-1)
    vector = np.repeat(np.arange(counts.size), counts)  # tile * nr + v of each cell
    run, k_in = np.divmod(cells["koff"], run_k)
    keep = (run >= runs[0]) & (run < runs[1]) & (k_in >= ks[0]) & (k_in < ks[1])
    part = cells[keep]  # a copy, in the same (tile, vector, k) order
    part["koff"] = offsets[run[keep]] + k_in[keep] - ks[0]
    return _tables(np.bincount(vector[keep], minlength=counts.size).reshape(-1, nr), part)
