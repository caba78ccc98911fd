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
    safe_pairs: int  # (column, k pair) pairs proven not to saturate VPMADDUBSW
    total_pairs: int
    # A batch-reduce B (convolution) of equal K runs: int64 column sums per run and window
    # column in it (runs x kw x colsum's length), for rows that read part of the window.
    run_colsum: np.ndarray | None = None
    # Split weights (pack_b's ``residual``): per tile, the byte offset of its cells in
    # res_entries and their count per vector (int64, tiles x (1 + nr)); the cells
    # (RESIDUAL_ENTRY each); how many there are.
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
    """
    k = b_kn.shape[0]
    w0 = b_kn[0::2].astype(np.int16)
    w1 = np.zeros_like(w0)
    w1[: k // 2] = b_kn[1::2]
    return ((w0 ^ w1) >= 0) & (np.abs(w0 + w1) > 128)  # same sign bit, so |w0 + w1| = |w0| + |w1|


def saturation_proof(b_kn: np.ndarray, unsafe: np.ndarray | None = None) -> tuple[int, int]:
    """(pairs proven never to saturate VPMADDUBSW, all pairs): see :func:`unsafe_pairs`."""
    unsafe = unsafe_pairs(b_kn) if unsafe is None else unsafe
    return int(unsafe.size - np.count_nonzero(unsafe)), int(unsafe.size)


def unsafe_cells(unsafe: np.ndarray, lanes: int, nr: int) -> np.ndarray:
    """Cells (tile, vector, K group of 4) holding an unsafe pair: (tiles, nr, groups) bool."""
    pairs, n = unsafe.shape
    tile_n = nr * lanes
    tiles = -(-n // tile_n)
    padded = np.zeros((-(-pairs // 2) * 2, tiles * tile_n), bool)
    padded[:pairs, :n] = unsafe
    return padded.reshape(-1, 2, tiles, nr, lanes).any(axis=(1, 4)).transpose(1, 2, 0)


def split_weights(b_kn: np.ndarray, unsafe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(weights whose every pair is safe, the s16 rest of each pair's second weight).

    An unsafe pair keeps w0 and takes sign * (128 - |w0|) as its second weight, so its
    magnitudes sum to 128; the rest, w1 minus that, is at most 127 in magnitude.
    """
    k = b_kn.shape[0]
    safe = np.array(b_kn, np.int8)  # a copy, in K x N order
    rest = np.zeros(unsafe.shape, np.int16)
    cut = unsafe[: k // 2]
    if cut.any():
        w0 = b_kn[0:2 * (k // 2):2].astype(np.int16)[cut]
        w1 = b_kn[1::2].astype(np.int16)[cut]
        kept = np.where(w1 < 0, np.abs(w0) - 128, 128 - np.abs(w0))
        rest[: k // 2][cut] = w1 - kept
        odd = safe[1::2]
        odd[cut] = kept
    return safe, rest


def residual_tables(unsafe: np.ndarray, rest: np.ndarray, k: int, lanes: int,
                    nr: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's residual cells in the order it reads them (tile, vector, K group), and
    per tile the byte offset of its first cell and its cell count per vector.

    A cell of group g reads A's dword at 4g, its weights at bytes 1 and 3 (the second
    weights of the group's pairs). The last group of a K that is not a multiple of 4 (and
    at least 4) reads the row's last dword instead, at K - 4, so it never reads past the
    row; only its first pair can be cut (the second lacks its second weight), its weight
    then at byte 5 - K % 4."""
    cells = unsafe_cells(unsafe, lanes, nr)
    tiles = cells.shape[0]
    t, v, g = np.nonzero(cells)
    entries = np.zeros(len(t), residual_entry(lanes))
    pairs, n = rest.shape
    padded = np.zeros((-(-pairs // 2) * 2, tiles * nr * lanes), np.int16)
    padded[:pairs, :n] = rest
    cols = (t * nr + v)[:, None] * lanes + np.arange(lanes)
    first, second = padded[2 * g[:, None], cols], padded[2 * g[:, None] + 1, cols]
    shifted = (4 * g + 4 > k) & (k >= 4)
    entries["koff"] = np.where(shifted, k - 4, 4 * g)
    r = entries["r"]
    r[~shifted, :, 1], r[~shifted, :, 3] = first[~shifted], second[~shifted]
    if shifted.any():
        r[shifted, :, 5 - k % 4] = first[shifted]
    head = np.zeros((tiles, 1 + nr), np.int64)
    head[:, 1:] = np.bincount(t * nr + v, minlength=tiles * nr).reshape(tiles, nr)
    head[1:, 0] = np.cumsum(head[:, 1:].sum(axis=1))[:-1] * entries.itemsize
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
    original, res_head, res_entries, cells = b_kn, None, None, 0
    if residual:
        unsafe = unsafe_pairs(b_kn) if unsafe is None else unsafe
        b_kn, rest = split_weights(b_kn, unsafe)
        res_head, res_entries = residual_tables(unsafe, rest, b_kn.shape[0], path.lanes, nr)
        cells = int(res_head[:, 1:].sum())
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
    colsum = np.zeros(n_pad, np.int64)
    colsum[:n] = original.sum(axis=0, dtype=np.int32 if k < 1 << 24 else np.int64)  # |sum| <= 128 K
    safe, total = saturation_proof(original, unsafe) if proof is None else proof
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
    head = np.zeros_like(packed.res_head)
    head[:, 1:] = np.bincount(vector[keep], minlength=counts.size).reshape(-1, nr)
    head[1:, 0] = np.cumsum(head[:, 1:].sum(axis=1))[:-1] * entry.itemsize
    data = aligned_zeros(max(part.nbytes, entry.itemsize))
    data[: part.nbytes] = part.view(np.uint8)
    return head, data
