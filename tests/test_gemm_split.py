"""Exact at the VPMADDUBSW rate: weights split into safe pairs plus residual cells.

Under ``exact`` on a level without VNNI, weights whose unsafe pairs (one sign, magnitudes
summing to 129 or more) are few are split (``primitives.gemm_pack.split_weights``): each
such pair's second weight is cut so the pair is safe, and the cut goes to a residual
cell (k pair x vector of a tile) that the kernel adds after its K loop with VPMADDWD on
s16. Trained weights are like this (a few large values); full-range random ones widen.

* The split: the safe part has no unsafe pair, safe part plus the residual table is the
  weights, every unsafe pair is in a cell (property-based, extreme values included).
* The kernel: bit-exact against the integer product on every executable path, with
  sources that saturate VPMADDUBSW on the unsplit weights (the faithful model differs
  there, so the cells are what makes the result right), over tails of M, N and K, s8
  and u8 sources, offsets and two threads (a chunk starting at a later tile).
* The decision: split up to ``SPLIT_MAX_SHARE`` of the cells, widened beyond.
* matmul and inner product with packed (``any``) weights, through a reorder.
* The paths this CPU cannot run: the kernel is generated and disassembled.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primitives import reference
from primitives.gemm import SPLIT_MAX_SHARE, Gemm, decide
from primitives.gemm_pack import residual_entry, residual_tables, saturation_proof, split_weights, unsafe_pairs
from tests.conftest import isa_params


def sparse_weights(rng, K: int, N: int, rate: float = 0.004) -> np.ndarray:
    """|w| <= 64 (every pair safe) with a few large values: some pairs become unsafe."""
    b = rng.integers(-64, 65, (K, N)).astype(np.int8)
    large = rng.random((K, N)) < rate
    b[large] = rng.choice(np.array([127, -128, 126, -120, 100], np.int8), int(large.sum()))
    return b


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.sampled_from([(8, 1), (8, 2), (16, 4)]), st.data())
def test_split_parts_sum_to_the_weights(k, n, tile, data):
    lanes, nr = tile
    values = st.sampled_from([-128, -127, -100, -65, -64, -1, 0, 1, 63, 64, 65, 100, 127])
    b = np.array(data.draw(st.lists(values, min_size=k * n, max_size=k * n)), np.int8).reshape(k, n)
    unsafe = unsafe_pairs(b)
    safe, rest = split_weights(b, unsafe)
    assert saturation_proof(safe) == (unsafe.size, unsafe.size)
    assert np.array_equal(safe[0::2], b[0::2])  # a pair's first weight stays whole
    whole = safe.astype(np.int32)
    whole[1::2] += rest[: k // 2]
    assert np.array_equal(whole, b)
    assert not rest[k // 2:].any()  # an odd K's last pair has no second weight to cut

    head, data_bytes = residual_tables(unsafe, rest, lanes, nr)
    entries = data_bytes[: int(head[:, 1:].sum()) * residual_entry(lanes).itemsize].view(residual_entry(lanes))
    tiles = -(-n // (lanes * nr))
    assert head.shape == (tiles, 1 + nr)
    rebuilt = np.zeros((unsafe.shape[0], tiles * nr * lanes), np.int32)
    at = 0
    for t in range(tiles):
        assert head[t, 0] == at * entries.itemsize  # a tile's cells follow the tile before
        for v in range(nr):
            for e in entries[at: at + head[t, 1 + v]]:
                assert e["koff"] % 2 == 0 and not e["r"][0::2].any()
                cols = slice((t * nr + v) * lanes, (t * nr + v + 1) * lanes)
                assert not rebuilt[e["koff"] // 2, cols].any()  # one cell per pair and vector
                rebuilt[e["koff"] // 2, cols] = e["r"][1::2]
            at += head[t, 1 + v]
    assert at == len(entries)
    assert np.array_equal(rebuilt[:, :n], rest)
    padded = np.zeros_like(rebuilt, bool)
    padded[:, :n] = unsafe
    cell_of = padded.reshape(len(rebuilt), -1, lanes).any(axis=2)
    assert cell_of.sum() == len(entries)  # a cell for each vector holding an unsafe pair, no more


def _sources(rng, a_type, M, K, saturate):
    lo, hi, dt = (0, 256, np.uint8) if a_type == "u8" else (-128, 128, np.int8)
    if saturate:
        return np.full((M, K), hi - 1, dt)
    return rng.integers(lo, hi, (M, K)).astype(dt)


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("a_type", ["u8", "s8"])
@pytest.mark.parametrize("M,N,K,threads", [(1, 40, 64, 1), (13, 47, 75, 1), (67, 130, 75, 1), (6, 300, 33, 2),
                                           (100, 200, 256, 2), (5, 16, 46, 1)])
def test_split_gemm_is_exact(isa, a_type, M, N, K, threads):
    rng = np.random.default_rng([M, N, K])
    B = sparse_weights(rng, K, N)
    B[0:2, 0] = (127, 127)  # at least one unsafe pair, in the first cell
    B[K - 2 - K % 2: K - K % 2, N - 1] = (-128, -128)  # and one in the last
    for saturate in (True, False):
        A = _sources(rng, a_type, M, K, saturate)
        for ao in (0, 5):
            g = Gemm(M, N, K, a_type=a_type, B=B, policy="exact", isa=isa, threads=threads)
            C = np.zeros((M, N), np.int32)
            g.execute(A, C, ao=ao)
            want = ((A.astype(np.int64) - ao) @ B.astype(np.int64)).astype(np.int32)
            np.testing.assert_array_equal(C, want)
            info = g.impl_info()
            if isa.endswith("vnni"):
                assert info["path"] == "vnni"
                continue
            assert info["path"] == "maddubsw" and info["cells"] > 0, info["decision"]
            assert "residual cells" in info["decision"] and all("_cells_" in k for k in info["kernels"])
            if saturate and ao == 0:  # the unsplit weights would saturate here: the cells matter
                faithful = reference.gemm("N", "N", "F", M, N, K, 1.0, A, K, 0, B, N, 0, 0.0,
                                          np.zeros((M, N), np.int32), N, np.zeros(1, np.int32), faithful=True)
                assert not np.array_equal(faithful, want)


@pytest.mark.parametrize("isa", ["avx2", "avx512_core"])
def test_split_up_to_the_share_then_widen(isa):
    """32 k pairs x the vectors of N columns; the unsafe pairs in cells of their own."""
    from jit.dot import fast_path

    lanes = fast_path(isa).lanes
    K, N = 64, 2 * lanes
    cells = 2 * (K // 2)
    allowed = int(SPLIT_MAX_SHARE * cells)
    for unsafe, kind in ((0, "maddubsw"), (1, "maddubsw"), (allowed, "maddubsw"), (allowed + 1, "widen")):
        b = np.zeros((K, N), np.int8)
        for c in range(unsafe):  # pair c % 32 of vector c // 32
            b[2 * (c % 32): 2 * (c % 32) + 2, (c // 32) * lanes] = 100
        choice = decide(isa, "exact", b, split=True)
        assert choice.path.kind == kind, choice.reason
        assert choice.residual == (kind == "maddubsw")
        assert decide(isa, "exact", b).residual is False  # convolution: no cells
        assert decide(isa, "faithful", b, split=True).residual is False


@pytest.mark.parametrize("isa", isa_params())
def test_split_matmul_and_inner_product_with_packed_weights(isa):
    from primitives.attr import Attr
    from primitives.matmul import InnerProductDesc, MatmulDesc
    from primitives.memory import Memory, desc
    from primitives.reorder import reorder_desc

    rng = np.random.default_rng(3)
    M, K, N = 9, 83, 70
    wei = sparse_weights(rng, K, N)
    wei[10:12, 3] = (-128, -100)
    src = _sources(rng, "u8", M, K, True)
    want = (src.astype(np.int64) @ wei.astype(np.int64)).astype(np.int32)
    attr = Attr(policy="exact")
    mm = MatmulDesc(desc((M, K), "u8", "ab"), desc((K, N), "s8", "any"), desc((M, N), "s32", "ab"), attr=attr,
                    isa=isa)
    ip = InnerProductDesc(desc((M, K), "u8", "ab"), desc((N, K), "s8", "any"), desc((M, N), "s32", "ab"),
                          attr=attr, isa=isa)
    for pd, logical, tag in ((mm, wei, "ab"), (ip, np.ascontiguousarray(wei.T), "ab")):
        wmem = Memory(pd.weights_desc())
        reorder_desc(desc(logical.shape, "s8", tag), pd.weights_desc()).create().execute({"src": logical,
                                                                                           "dst": wmem})
        dst = np.zeros((M, N), np.int32)
        prim = pd.create()
        prim.execute({"src": src, "weights": wmem, "dst": dst})
        np.testing.assert_array_equal(dst, want)
        if not isa.endswith("vnni"):
            assert any("_cells_" in k for k in prim.impl_info()["kernels_run"])
            assert wmem.payload[1].residual and wmem.payload[0].cells > 0


@pytest.mark.parametrize("isa", ["avx2", "avx512_core"])
@pytest.mark.parametrize("s8_src", [False, True])
def test_cell_code_disassembles(isa, s8_src):
    """The cells' loop on any CPU: per row a word of A broadcast, (s8: offset to u8),
    widened by VPSHUFB, multiplied by the cell's s16 pairs and added, in each block."""
    import iced_x86

    from jit.disasm import decode
    from jit.dot import fast_path
    from jit.gemm_kernel import choose_tile
    from jit.output import OutputSpec
    from primitives.gemm_driver import kernel_of

    spec = choose_tile(fast_path(isa), s8_src, OutputSpec(col_comp=True), 2, rows=(13,), residual=True)
    names = [ins.mnemonic for ins in decode(kernel_of(spec).code())]
    M = iced_x86.Mnemonic
    rows = spec.mr + 13 % spec.mr  # the full block and the tail block
    assert names.count(M.VPBROADCASTW) == spec.nr * rows
    assert names.count(M.VPMADDWD) >= spec.nr * rows  # (the K loop's VPMADDWD by ones too)
    i = names.index(M.VPBROADCASTW)
    want = [M.VPBROADCASTW] + ([M.VPXORD if isa.startswith("avx512") else M.VPXOR] if s8_src else []) \
        + [M.VPSHUFB, M.VPMADDWD, M.VPADDD]
    assert names[i: i + len(want)] == want
