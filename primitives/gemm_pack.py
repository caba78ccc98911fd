"""Packing of B (weights) for the GEMM microkernel, and what is computed with it.

The kernel reads B as tiles of ``nr`` vectors of ``lanes`` columns, with each column's
K values in groups of four consecutive bytes (``[tile][k group][vector][lane][4]``), or,
for the exact widening path, as s16 pairs (``[tile][k group][pair][vector][lane][2]``).
Packing pads N to whole tiles and K to whole groups with zeros, so the kernel never
needs a mask to read B, and it yields the column sums the compensation needs and the
overflow proof of the VPMADDUBSW path.
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

    @property
    def all_safe(self) -> bool:
        return self.safe_pairs == self.total_pairs


def saturation_proof(b_kn: np.ndarray) -> tuple[int, int]:
    """How many (column, k pair) pairs satisfy ``255 * (|w0| + |w1|) <= 32767``.

    A pair that does can never saturate VPMADDUBSW's s16 sum, whatever the u8 source;
    pairs are k = 2j, 2j+1 as the kernels form them.
    """
    k = b_kn.shape[0]
    w = np.abs(b_kn).view(np.uint8)  # |-128| wraps to -128, whose byte reads 128 unsigned
    pair = w[0::2].astype(np.uint16)
    pair[: k // 2] += w[1::2]
    # 255 * pair <= 32767 exactly when pair <= 128
    return int(np.count_nonzero(pair <= 32767 // 255)), int(pair.size)


def pack_b(b_kn: np.ndarray, path: Path, nr: int, proof: tuple[int, int] | None = None) -> PackedB:
    """Pack the logical K x N s8 matrix ``b_kn`` for ``path`` with tiles of ``nr`` vectors.

    ``proof``: ``saturation_proof(b_kn)`` where the caller has it already (it decided the
    path with it); computed here otherwise."""
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
    colsum[:n] = b_kn.sum(axis=0, dtype=np.int32 if k < 1 << 24 else np.int64)  # |sum| <= 128 K
    safe, total = saturation_proof(b_kn) if proof is None else proof
    return PackedB(data, n, k, tile_n, tiles, data.nbytes // tiles, colsum, safe, total)
