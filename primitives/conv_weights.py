"""The packed weights a convolution asks for: :class:`ConvWeightsLayout`.

K ordered (kd, kh, kw, ic) per group, each position's channels padded to 4 (or each run
of KW positions, on the tight layout), packed for the GEMM kernel the weights take, with
the column sums appended as oneDNN's reorder appends its compensation, and the sums per
(run, kw) that rows and edge columns reading part of a window take theirs from.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from primitives.conv_blocking import conv_tile
from primitives.conv_geometry import Geometry
from primitives.gemm import Choice, candidates, decide, fast_path, pack_weights
from primitives.memory import Memory


@dataclass(frozen=True)
class ConvWeightsLayout:
    """The packed weights a convolution asks for (a ``packed`` desc's record).

    Per group: B of ``geometry.b_rows`` x ocg in the GEMM kernel's packed layout, K ordered
    (kd, kh, kw, ic) with each position's channels padded to ``icgp`` (or, ``tight``, each
    run of KW positions padded to 4), plus its column sums appended (the compensation
    oneDNN's reorder appends).
    """

    isa: str
    policy: str
    geometry: Geometry
    grouped: bool  # logical weights carry a leading groups dim

    def nbytes(self) -> int:
        g = self.geometry
        choice = self.decide("faithful")
        tile_n = choice.nr * choice.path.lanes
        tiles = -(-g.ocg // tile_n)
        per_group = tiles * tile_n * g.b_rows * (1 if choice.path.kind == "vnni" else 2) + 4 * tiles * tile_n
        return g.groups * per_group

    def b_kn(self, logical: np.ndarray, group: int) -> np.ndarray:
        g = self.geometry
        w = logical[group] if self.grouped else logical  # (ocg, icg, *spatial)
        w = w.reshape((g.ocg, g.icg) + g.ker)
        w = np.moveaxis(w, 1, -1)  # (ocg, kd, kh, kw, icg)
        kp = g.k_per_position
        if kp != g.icg:
            w = np.concatenate([w, np.zeros(w.shape[:-1] + (kp - g.icg,), np.int8)], axis=-1)
        count, k = g.runs
        w = w.reshape(g.ocg, count, k)
        if k % 4:  # (tight) each run's K padded to 4 with zero weights
            w = np.concatenate([w, np.zeros((g.ocg, count, -k % 4), np.int8)], axis=-1)
        return np.ascontiguousarray(w.reshape(g.ocg, -1).T)

    def tile_vectors(self) -> int:
        """The column tile width, in vectors, of every kernel this layout can take: the
        fast path's that conv_tile picks for these rows. One width for all, as the
        compensation, the padded columns and the threads' column splits assume (a
        widening kernel narrower than the fast path's broke them)."""
        return conv_tile(fast_path(self.isa), self.geometry)[1]

    def decide(self, policy: str) -> Choice:
        """GEMM's path decision before the weights are known, with the tile width this
        convolution's rows want (``pack_all`` decides with them, as a matmul's packing)."""
        return decide(self.isa, policy, None, self.geometry.ocg, nr=self.tile_vectors())

    def candidates(self) -> list[Choice]:
        """Every decision the weights can lead to under this layout's policy
        (``gemm.candidates``; halve_weights packs for the fast path), with this
        convolution's tile width; the first is the one without weights."""
        policy = "faithful" if self.policy == "halve_weights" else self.policy
        nr = self.tile_vectors()
        return [replace(c, nr=nr) for c in candidates(self.isa, policy, self.geometry.ocg)]

    def pack_all(self, logical: np.ndarray) -> list:
        out = []
        for group in range(self.geometry.groups):
            b = self.b_kn(logical, group)
            if self.policy == "halve_weights" and not self.decide("faithful").path.kind == "vnni":
                # oneDNN's non-VNNI convolution: weights * 0.5, rounded to nearest even;
                # 255 * (64 + 64) <= 32767, so VPMADDUBSW can no longer saturate.
                b = np.rint(b.astype(np.float32) * np.float32(0.5)).astype(np.int8)
                policy = "faithful"
            else:
                policy = "exact" if self.policy == "halve_weights" else self.policy
            packed, choice = pack_weights(b, self.isa, policy, nr=self.tile_vectors(), proof=False)
            # Column sums per window column of each run, for rows and edge columns that
            # read part of the window (the kw of a run: its first KW * k_per_position rows)
            g = self.geometry
            runs, kp = g.runs[0], g.k_per_position
            per_run = b.astype(np.int64).reshape(runs, -1, b.shape[1])[:, :g.run_kw * kp]
            run_colsum = np.zeros((runs, g.run_kw, packed.colsum.size), np.int64)
            run_colsum[:, :, :b.shape[1]] = per_run.reshape(runs, g.run_kw, kp, b.shape[1]).sum(axis=2)
            out.append((replace(packed, run_colsum=run_colsum), choice))
        return out

    def pack(self, src_logical: np.ndarray, dst: Memory) -> None:
        """Pack the logical s8 weights into ``dst`` and attach the per-group packs as payload."""
        if src_logical.dtype != np.int8:
            raise ValueError(f"weights: expected s8 values to pack, got {src_logical.dtype}")
        packs = self.pack_all(src_logical)
        buf = dst.array.reshape(-1).view(np.uint8)
        at, payload = 0, []
        for packed, choice in packs:
            size = packed.data.nbytes
            buf[at:at + size] = packed.data
            view = buf[at:at + size]
            comp = buf[at + size: at + size + 4 * packed.colsum.size].view(np.int32)
            comp[:] = packed.colsum.astype(np.int32)
            at += size + 4 * packed.colsum.size
            payload.append((replace(packed, data=view), choice))
        dst.payload = payload
