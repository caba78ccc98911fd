"""Exact at the VPMADDUBSW rate: weights split into safe pairs plus residual cells.

Under ``exact`` on a level without VNNI, weights whose unsafe pairs (one sign, magnitudes
summing to 129 or more) are few are split (``primitives.gemm_pack.cut_pairs``): each
such pair's second weight is cut so the pair is safe, and the cut goes to a residual
cell (K group of 4 x vector of a tile) that the kernel adds after its K loop as one
more VPMADDUBSW step (at most one weight per byte pair: it cannot saturate). Trained weights are like this (a few large values); full-range random ones widen.

* The split: the safe part has no unsafe pair, safe part plus the residual table is the
  weights, every unsafe pair is in a cell, no cell reads past an A row or can saturate
  (property-based, extreme values included).
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
from primitives.gemm_pack import (cell_share, cut_pairs, residual_entry, residual_tables, saturation_proof,
                                  unsafe_pairs)
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
    # weights given as rows of columns (an inner product's) take another code path: the same
    columns = np.ascontiguousarray(b.T).T
    by_columns = unsafe_pairs(columns)
    assert np.array_equal(by_columns, unsafe) and cell_share(by_columns, lanes) == cell_share(unsafe, lanes)
    other = cut_pairs(columns, by_columns)
    cuts = cut_pairs(b, unsafe)
    assert sorted(zip(other.p, other.n, other.kept, other.rest)) == sorted(zip(cuts.p, cuts.n, cuts.kept, cuts.rest))
    assert (2 * cuts.p + 1 < k).all()  # an odd K's last pair has no second weight to cut
    safe = b.copy()
    safe[2 * cuts.p + 1, cuts.n] = cuts.kept  # (a pair's first weight stays whole)
    assert saturation_proof(safe) == (unsafe.size, unsafe.size)
    rest = np.zeros(unsafe.shape, np.int32)
    rest[cuts.p, cuts.n] = cuts.rest
    whole = safe.astype(np.int32)
    whole[1::2] += rest[: k // 2]
    assert np.array_equal(whole, b)
    assert cell_share(unsafe, lanes)[0] == len({(p // 2, c // lanes) for p, c in zip(cuts.p, cuts.n)})

    head, data_bytes = residual_tables(cuts, k, n, lanes, nr)
    entries = data_bytes[: int(head[:, 1:].sum()) * residual_entry(lanes).itemsize].view(residual_entry(lanes))
    tiles = -(-n // (lanes * nr))
    assert head.shape == (tiles, 1 + nr)
    # Each cell's bytes, put back at the K of the A byte they multiply: the rest of every
    # cut pair, once, at its second weight, and nothing else.
    rebuilt = np.zeros((k, tiles * nr * lanes), np.int32)
    at = 0
    for t in range(tiles):
        assert head[t, 0] == at * entries.itemsize  # a tile's cells follow the tile before
        for v in range(nr):
            for e in entries[at: at + head[t, 1 + v]]:
                koff, r = int(e["koff"]), e["r"].astype(np.int32)  # (lanes, 4)
                assert koff >= 0 and (koff + 4 <= k or (k < 4 and koff == 0))  # never past the row (K >= 4)
                for pair in (r[:, 0:2], r[:, 2:4]):  # a VPMADDUBSW pair: one weight, <= 128
                    assert not (pair[:, 0].astype(bool) & pair[:, 1].astype(bool)).any()
                    assert (np.abs(pair).sum(axis=1) <= 128).all()
                cols = slice((t * nr + v) * lanes, (t * nr + v + 1) * lanes)
                for j in range(4):
                    if r[:, j].any():
                        assert not rebuilt[koff + j, cols].any()  # one cell per group and vector
                        rebuilt[koff + j, cols] = r[:, j]
            at += head[t, 1 + v]
    assert at == len(entries)
    want = np.zeros_like(rebuilt)
    want[1::2, :n] = rest[: k // 2]
    assert np.array_equal(rebuilt, want)
    groups = np.zeros((-(-k // 4), tiles * nr * lanes), bool)
    for j in range(unsafe.shape[0]):  # pair j is in group j // 2
        groups[j // 2, :n] |= unsafe[j]
    assert groups.reshape(len(groups), -1, lanes).any(axis=2).sum() == len(entries)  # a cell per such group


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
            assert info["exact"] is True  # the results are, whichever path
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
    """32 K groups x the vectors of N columns; the unsafe pairs in cells of their own."""
    from jit.dot import fast_path

    lanes = fast_path(isa).lanes
    K, N = 128, 2 * lanes
    cells = 2 * (K // 4)
    allowed = int(SPLIT_MAX_SHARE * cells)
    for unsafe, kind in ((0, "maddubsw"), (1, "maddubsw"), (allowed, "maddubsw"), (allowed + 1, "widen")):
        b = np.zeros((K, N), np.int8)
        for c in range(unsafe):  # group c % 32 of vector c // 32
            b[4 * (c % 32): 4 * (c % 32) + 2, (c // 32) * lanes] = 100
        choice = decide(isa, "exact", b)
        assert choice.path.kind == kind, choice.reason
        assert choice.residual == (kind == "maddubsw")
        assert decide(isa, "faithful", b).residual is False
        # The caller's proof and pairs decide alike; a proof of all pairs safe needs no pairs.
        pairs = unsafe_pairs(b)
        assert decide(isa, "exact", b, proof=saturation_proof(b, pairs), unsafe=pairs) == choice
        if not unsafe:
            assert decide(isa, "exact", None, N, proof=saturation_proof(b)) == choice


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
        assert pd.impl_info()["exact"] is True
        if not isa.endswith("vnni"):
            assert any("_cells_" in k for k in prim.impl_info()["kernels_run"])
            assert wmem.payload[1].residual and wmem.payload[0].cells > 0


@pytest.mark.parametrize("isa", ["avx2", "avx512_core"])
@pytest.mark.parametrize("s8_src", [False, True])
def test_cell_code_disassembles(isa, s8_src):
    """The cells' loop on any CPU: the cell's weights loaded once, then per row a dword of
    A broadcast, (s8: offset to u8), multiplied by them (VPMADDUBSW, VPMADDWD by ones)
    and added, in each block."""
    import iced_x86

    from jit.disasm import decode
    from jit.dot import fast_path
    from jit.gemm_kernel import choose_tile
    from jit.output import OutputSpec
    from primitives.gemm_driver import kernel_of

    spec = choose_tile(fast_path(isa), s8_src, OutputSpec(col_comp=True), 2, rows=(13,), residual=True)
    code = list(decode(kernel_of(spec).code()))
    M, R = iced_x86.Mnemonic, iced_x86.Register
    vb = spec.path.vector_bytes
    # A cell starts by reading its A offset (the qword after its weights' vector)
    starts = [i for i, ins in enumerate(code) if ins.mnemonic == M.MOV and ins.op1_kind == iced_x86.OpKind.MEMORY
              and ins.memory_base == R.RBX and ins.memory_displacement == vb]
    assert len(starts) == spec.nr * 2  # each vector, in the full block and the tail block of 13 % mr rows
    step = [M.VPBROADCASTD] + ([M.VPXORD if isa.startswith("avx512") else M.VPXOR] if s8_src else []) \
        + [M.VPMADDUBSW, M.VPMADDWD, M.VPADDD]
    for n, start in enumerate(starts):
        load = code[start - 1]  # the cell's weights, one vector load before
        assert load.op1_kind == iced_x86.OpKind.MEMORY and load.memory_base == R.RBX and load.memory_displacement == 0
        end = next(i for i in range(start, len(code)) if code[i].mnemonic == M.DEC)
        names = [ins.mnemonic for ins in code[start:end]]
        rows = spec.mr if n < spec.nr else 13 % spec.mr
        at = [i for i in range(len(names)) if names[i: i + len(step)] == step]
        assert len(at) == rows and names.count(M.VPMADDUBSW) == rows


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("shape", [
    # (IC, OC, H, W, K, stride, pad, groups, dilation, src)
    (64, 64, 14, 14, 3, 1, 1, 1, 0, "u8"),  # edges read in place, windows cut at the padding
    (32, 48, 11, 7, 3, 2, 1, 1, 0, "s8"),
    (16, 40, 10, 10, 5, 1, 2, 1, 0, "u8"),
    (24, 32, 12, 12, 3, 1, 1, 2, 0, "u8"),  # groups: a residual table per group
    (32, 32, 12, 12, 3, 1, 1, 1, 1, "s8"),  # dilated: a run per position
    (256, 64, 8, 8, 1, 1, 0, 1, 0, "u8"),  # 1x1: one GEMM over every pixel
    (3, 64, 30, 30, 7, 2, 3, 1, 0, "u8"),  # the stem: 3 channels padded to 4
])
def test_split_convolution_is_exact(isa, shape):
    """A convolution's calls read parts of B (rows at the top and bottom skip window rows,
    edge columns window columns): each call adds the cells of the part it reads, at the
    A offsets of its layout."""
    from primitives.attr import Attr
    from primitives.conv import ConvolutionDesc
    from primitives.conv_ref import conv_sum
    from primitives.memory import Memory, desc
    from primitives.reorder import reorder_desc

    IC, OC, H, W, k, stride, pad, G, dil, src_dt = shape
    rng = np.random.default_rng(list(shape[:-1]))
    wshape = ((G, OC // G, IC // G) if G > 1 else (OC, IC)) + (k, k)
    w = np.ascontiguousarray(sparse_weights(rng, int(np.prod(wshape)) // OC, OC, 0.002).T).reshape(wshape)
    w[..., 0:2, 0, 0] = 127  # an unsafe pair (channels 0 and 1 of a position) in every column
    x = np.full((2, IC, H, W), 255 if src_dt == "u8" else 127, np.uint8 if src_dt == "u8" else np.int8)
    want = conv_sum(x, w, (stride, stride), (pad, pad), (pad, pad), (dil, dil))
    OH, OW = want.shape[2:]
    for threads in (1, 2):
        pd = ConvolutionDesc(desc(x.shape, src_dt, "nhwc"), desc(wshape, "s8", "any"),
                             desc((2, OC, OH, OW), "s32", "nhwc"), strides=(stride, stride), padding_l=(pad, pad),
                             padding_r=(pad, pad), dilation=(dil, dil), attr=Attr(policy="exact"), isa=isa,
                             threads=threads)
        wmem = Memory(pd.weights_desc())
        reorder_desc(desc(wshape, "s8", "abcde"[:len(wshape)]), pd.weights_desc()).create().execute(
            {"src": w, "dst": wmem})
        dst = np.zeros((2, OH, OW, OC), np.int32)
        prim = pd.create()
        prim.execute({"src": np.ascontiguousarray(np.moveaxis(x, 1, -1)), "weights": wmem, "dst": dst})
        np.testing.assert_array_equal(np.moveaxis(dst, -1, 1), want)
        if not isa.endswith("vnni"):
            assert all("_cells_" in name for name in prim.impl_info()["kernels_run"])
            assert all(packed.cells for packed, _ in wmem.payload)
    if not isa.endswith("vnni"):  # the unsplit weights saturate on these sources: the cells matter
        assert not np.array_equal(conv_sum(x, w, (stride, stride), (pad, pad), (pad, pad), (dil, dil),
                                           faithful=True), want)
