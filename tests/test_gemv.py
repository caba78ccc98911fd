"""jit.gemv_kernel: a few rows of A times runtime weights read in place (columns of K
contiguous bytes), and the matmuls and inner products that run it instead of packing.

The kernel is held to the exact int32 product (VPDPBUSD cannot saturate; the s8 and
zero-point compensation are the column sums it adds itself) over random shapes, column
strides, sources, zero points and thread counts; to memory bounds by guard pages; and the
primitives that choose it to the whole pipeline's model (tests/test_matmul.py's).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jit.dot import fast_path, path_for
from jit.gemv_kernel import GemvSpec, gemv_kernel, rows_max, takes
from jit.output import OutputSpec
from primitives.attr import Attr, PostOps
from primitives.gemm_driver import OutputArgs
from primitives.gemv_driver import IN_PLACE_ROWS, GemvPlan
from primitives.matmul import InnerProductDesc, MatmulDesc
from primitives.memory import desc
from primitives.reference import gemm_sum, output_pipeline, wrap_int32
from tests.conftest import EMULATE, faithful_model, skip_reason

# The kernels' paths, (isa, step): the VNNI ones, the widening ones (exact without VNNI)
# and the VPMADDUBSW ones (faithful). Skipped where the CPU lacks the ISA, but under
# INT8JIT_TEST_EMULATE (tests/conftest.py: an ``isa`` the CPU lacks runs emulated).
PATHS = [pytest.param(isa, kind, id=f"{isa}:{kind}" if kind else isa,
                      marks=[pytest.mark.skip(reason=skip_reason(isa))] if skip_reason(isa) and not EMULATE else [])
         for isa, kind in (("avx512_core_vnni", None), ("avx2_vnni", None), ("avx512_core", "widen"),
                           ("avx2", "widen"), ("avx512_core", "maddubsw"), ("avx2", "maddubsw"))]


def _path(name: str, kind: str | None = None):
    """``name``'s path: ``isa`` (its fast path, or its ``kind``) or ``isa:kind``."""
    if ":" in name:
        name, kind = name.split(":")
    return path_for(name, kind)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def gemv_case(rng, isa: str, M: int, N: int, K: int, src_dt: str, zp: int, gap: int, layout: str = "columns"):
    """A, the weights as N columns of K bytes ``K + gap`` apart (or K rows of N bytes
    ``N + gap`` apart), the exact int32 product and the kernel's output: (got, want)."""
    s8 = src_dt == "s8"
    a = rng.integers(-128 if s8 else 0, 128 if s8 else 256, (M, K)).astype(np.int8 if s8 else np.uint8)
    if layout == "columns":
        w = rng.integers(-128, 128, (N, K + gap)).astype(np.int8)[:, :K].T
    else:
        w = rng.integers(-128, 128, (K, N + gap)).astype(np.int8)[:, :N]
    path = _path(isa)
    comp = zp != 0 or s8 and path.kind != "widen"  # (a widened s8 source needs no shift)
    kernel = gemv_kernel(path, s8, comp, OutputSpec(col_comp=False), layout, M)
    c = np.zeros((M, N), np.int32)
    threads = 1 + int(rng.integers(0, 3))
    ldw = w.strides[1] if layout == "columns" else w.strides[0]
    plan = GemvPlan(kernel, M, N, K, K, ldw, 4 * N, OutputArgs(col_comp=None), threads)
    plan.run(a, w, c, zp)
    # (VPMADDUBSW: the saturating pairs of the packed path's model; the others exact)
    want = wrap_int32(gemm_sum(a, np.ascontiguousarray(w), zp, 0, path.kind == "maddubsw"))
    return c, want


@pytest.mark.parametrize("isa,kind", PATHS)
@SETTINGS
@given(M=st.integers(1, 5), N=st.integers(1, 70), K=st.integers(1, 300), src_dt=st.sampled_from(["u8", "s8"]),
       zp=st.sampled_from([0, 0, 3, -7, 300]), gap=st.sampled_from([0, 5]), seed=st.integers(0, 2**31))
def test_gemv_equals_the_exact_product(isa, kind, M, N, K, src_dt, zp, gap, seed):
    """Every output of the kernel is the exact int32 sum of (A - zp) * W over K: any K
    (whole vectors, a masked tail, K below one vector; AVX2 whole dwords), any N (a
    partial last block of 16 or 8 columns, an AVX-512 block's second half absent), column
    strides beyond K, u8 or s8 sources, zero points (the compensation), 1-3 threads; on
    the VNNI paths and the widening ones (s16 pairs by VPMADDWD, half a vector a step)."""
    if not takes(_path(isa, kind), K):
        K = -(-K // 4) * 4
    got, want = gemv_case(np.random.default_rng(seed), f"{isa}:{kind or 'vnni'}", M, N, K, src_dt, zp, gap)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("isa,kind", PATHS)
@SETTINGS
@given(M=st.integers(1, 4), N=st.integers(1, 200), K=st.integers(1, 40), src_dt=st.sampled_from(["u8", "s8"]),
       zp=st.sampled_from([0, 0, 3, -7, 300]), gap=st.sampled_from([0, 5]), seed=st.integers(0, 2**31))
def test_rows_gemv_equals_the_exact_product(isa, kind, M, N, K, src_dt, zp, gap, seed):
    """The rows kernel (weights as K rows of N bytes): exact for the rows it holds, any K
    (groups of 4 rows, then the last 1-3 with the others zero and A's last bytes read one
    by one), any N (the last block masked; AVX2 whole dwords), row strides beyond N; the
    VNNI kernels and the widening ones (the rows' pairs as s16)."""
    path = _path(isa, kind)
    comp = zp != 0 or src_dt == "s8" and path.kind != "widen"
    M = min(M, rows_max(path, comp, OutputSpec(col_comp=False)))
    if M == 0:
        return  # (AVX2's 16 registers hold no row beside the compensation's: packed, see below)
    if path.bits == 256:
        N = -(-N // 4) * 4
    got, want = gemv_case(np.random.default_rng(seed), f"{isa}:{kind or 'vnni'}", M, N, K, src_dt, zp, gap, "rows")
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("isa,kind", PATHS)
@pytest.mark.parametrize("layout", ["columns", "rows"])
@pytest.mark.parametrize("K,N", [(64, 16), (100, 21), (36, 8), (7, 3), (5, 68)])
def test_reads_only_its_buffers(guarded, isa, kind, layout, K, N):
    """A's last row and the weights' end against guard pages (columns: the last
    column's K tail masked, a partial block's missing columns read as the last one;
    rows: the last row's block masked past N, A's last K % 4 bytes read one by one), and
    dst's last row too: no read or write past them; every exact path."""
    path = _path(isa, kind)
    M = 2
    if not takes(path, K, N if layout == "rows" else None, M):
        pytest.skip(f"{isa}: the 256-bit kernels take K and N in whole dwords (the others are packed)")
    rng = np.random.default_rng(K)
    a = guarded(M * K, np.uint8, "end").reshape(M, K)
    a[...] = rng.integers(0, 256, (M, K))
    raw = guarded(N * K, np.int8, "end")
    raw[...] = rng.integers(-128, 128, N * K)
    w = raw.reshape(N, K).T if layout == "columns" else raw.reshape(K, N)
    c = guarded(M * N, np.int8, "end").reshape(M, N)
    kernel = gemv_kernel(path, False, False, OutputSpec(col_comp=False, float_mode=True, dst_dt="s8"), layout, M)
    GemvPlan(kernel, M, N, K, K, K if layout == "columns" else N, N, OutputArgs(col_comp=None), 1).run(a, w, c)
    want = gemm_sum(a, np.ascontiguousarray(w), 0, 0, path.kind == "maddubsw")
    np.testing.assert_array_equal(c, np.clip(want, -128, 127))


def test_spec_refuses_what_it_cannot_do():
    plain = OutputSpec(col_comp=False)
    with pytest.raises(ValueError, match="^layout: expected 'columns' or 'rows', got 'tiles'"):
        GemvSpec(fast_path("avx2"), False, False, plain, "tiles")
    for output, layout, rows in ((OutputSpec(), "columns", 1), (OutputSpec(), "rows", 2),
                                 (OutputSpec(col_comp=False, row_comp=True), "rows", 1)):
        with pytest.raises(ValueError, match="^output: row_comp off, col_comp only for one row of the rows kernel"):
            GemvSpec(fast_path("avx512_core_vnni"), False, False, output, layout, rows)
    assert GemvSpec(fast_path("avx512_core_vnni"), False, False, OutputSpec(), "rows", 1).name.endswith("_partial")
    with pytest.raises(ValueError, match="^rows: the rows kernel of avx2_vnni:vnni holds 1..0 rows of A, not 1"):
        GemvSpec(fast_path("avx2_vnni"), True, True, plain, "rows", 1)
    zmm, ymm = fast_path("avx512_core_vnni"), fast_path("avx2_vnni")
    assert takes(zmm, 7) and not takes(ymm, 7) and takes(ymm, 8) and takes(fast_path("avx512_core"), 7)
    assert rows_max(zmm, True, plain) == 4 and rows_max(ymm, False, plain) == 2 and rows_max(ymm, True, plain) == 0
    assert takes(zmm, 7, 9, 4, True) and takes(ymm, 7, 12, 2) and not takes(ymm, 7, 10, 2)


def _ip(isa, M, K, N, src_dt="u8", zp=None, dst_dt="s32"):
    attr = Attr(zero_points={"src": 0} if zp is not None else None)
    return InnerProductDesc(desc((M, K), src_dt, "ab"), desc((N, K), "s8", "ab"), desc((M, N), dst_dt, "ab"),
                            attr=attr, isa=isa)


@pytest.mark.parametrize("src_dt,zp", [("u8", None), ("u8", 3), ("s8", None), ("s8", -2)])
def test_inner_product_reads_runtime_weights_in_place(isa_path, src_dt, zp, monkeypatch):
    """An inner product at batch 1-4 with plain weights: on a VNNI path the in-place
    kernel runs (impl_info says so; nothing is packed); a call with new values in the
    same arrays replays without a set-up, and bind() repeats it; the results are exact
    (on every path: elsewhere the weights are packed per call, widened)."""
    rng = np.random.default_rng(7)
    lo = -128 if src_dt == "s8" else 0
    for M, K, N in ((1, 2048 // 16, 1000 // 16), (3, 68, 19), (IN_PLACE_ROWS, 16, 40)):
        pd = _ip(isa_path, M, K, N, src_dt, zp)
        assert "runtime_weights" in pd.impl_info()  # (widened without VNNI)
        prim = pd.create()
        x = rng.integers(lo, lo + 256, (M, K)).astype(np.int8 if src_dt == "s8" else np.uint8)
        w = rng.integers(-128, 128, (N, K)).astype(np.int8)
        y = np.zeros((M, N), np.int32)
        args = {"src": x, "weights": w, "dst": y}
        if zp is not None:
            args["zero_points:src"] = np.int32([zp])
        with monkeypatch.context() as packs:  # (a context: the emulation's patches stay)
            packs.setattr(type(prim), "_weights", lambda *_: pytest.fail("weights packed"))
            prim.execute(args)
            np.testing.assert_array_equal(y, (x.astype(np.int64) - (zp or 0)) @ w.T.astype(np.int64))
            run = prim.bind(args)
            for _ in range(2):
                x[...] = rng.integers(lo, lo + 256, x.shape)
                w[...] = rng.integers(-128, 128, w.shape)
                with monkeypatch.context() as m:
                    m.setattr(prim, "_execute", lambda *_: pytest.fail("_execute ran: the replay was not taken"))
                    prim.execute(args)
                    np.testing.assert_array_equal(y, (x.astype(np.int64) - (zp or 0)) @ w.T.astype(np.int64))
                    y[...] = 0
                    run()
                np.testing.assert_array_equal(y, (x.astype(np.int64) - (zp or 0)) @ w.T.astype(np.int64))


def _mm(isa, M, K, N, tag, src_dt="u8"):
    return MatmulDesc(desc((M, K), src_dt, "ab"), desc((K, N), "s8", tag), desc((M, N), "s32", "ab"), isa=isa)


def test_what_still_packs(isa_path):
    """Weights packed once through any, more rows than the kernels take, and on AVX2
    (16 registers, dword masks) a K or N that is no multiple of 4, and rows kernels whose
    rows (or compensation) do not fit: no in-place kernel. (faithful without VNNI: in
    place, by VPMADDUBSW; exact: widened.)"""
    vnni, wide = isa_path.endswith("vnni"), isa_path.startswith("avx512")
    in_place = lambda pd: "runtime_weights" in pd.impl_info()  # noqa: E731
    assert not in_place(_ip(isa_path, IN_PLACE_ROWS + 1, 64, 16)) and not in_place(_mm(isa_path, 5, 64, 16, "ab"))
    packed = _ip(isa_path, 1, 64, 16)
    assert not in_place(InnerProductDesc(packed.src_desc(), desc((16, 64), "s8", "any"), packed.dst_desc(),
                                         isa=isa_path))
    faithful = InnerProductDesc(packed.src_desc(), packed.weights_desc(), packed.dst_desc(),
                                attr=Attr(policy="faithful"), isa=isa_path)
    assert in_place(faithful) and ("_widen" in faithful.impl_info()["runtime_weights"]) is False
    assert in_place(_ip(isa_path, 1, 64, 16)) and in_place(_ip(isa_path, 1, 66, 16)) is wide
    assert in_place(_mm(isa_path, 2, 66, 16, "ab")) and in_place(_mm(isa_path, 2, 64, 18, "ab")) is wide
    ymm_vnni = isa_path == "avx2_vnni"  # (2 rows, and none beside an s8 source's compensation)
    assert in_place(_mm(isa_path, 1, 64, 16, "ab", "s8")) is not ymm_vnni
    assert in_place(_mm(isa_path, 3, 64, 16, "ab")) is not ymm_vnni
    kernel = _mm(isa_path, 1, 64, 16, "ab").impl_info()["runtime_weights"]
    assert "gemv_rows1_" in kernel and ("_widen" in kernel) is not vnni


def test_one_row_walks_aliasing_rows_in_chunks(isa_path):
    """A matmul of one row by weights' rows 4096 bytes apart (decode's 4096 x 4096, here
    K = 203): in place in chunks of K, its scratchpad holding their partial sums; a batch
    of 3 items with weights of their own (one plan each, the partial sums shared in turn),
    new values replayed and through bind(); a u8 dst after scales, bias and relu."""
    rng = np.random.default_rng(13)
    items, K, N = 3, 203, 4096
    attr = Attr(scales={"weights": 4}, zero_points={"src": 0}).set_post_ops(PostOps().eltwise("relu"))
    pd = MatmulDesc(desc((items, 1, K), "u8", "abc"), desc((items, K, N), "s8", "abc"),
                    desc((items, 1, N), "u8", "abc"), desc((1, 1, N), "f32", "abc"), attr=attr, isa=isa_path)
    kernel = pd.impl_info().get("runtime_weights", "")
    chunked = takes(_path(pd.isa) if pd.isa.endswith("vnni") else path_for(pd.isa, "widen"), K, N, 1, True,
                    pd.output)
    assert kernel.endswith("_partial") is chunked, kernel
    prim = pd.create()
    x = rng.integers(0, 256, (items, 1, K)).astype(np.uint8)
    w = rng.integers(-128, 128, (items, K, N)).astype(np.int8)
    scale, bias = rng.uniform(1e-4, 1e-3, N).astype(np.float32), rng.uniform(-20, 20, (1, 1, N)).astype(np.float32)
    y = np.zeros((items, 1, N), np.uint8)
    args = {"src": x, "weights": w, "dst": y, "scales:weights": scale, "bias": bias, "zero_points:src": np.int32([5])}

    def want():
        return np.stack([output_pipeline(wrap_int32(gemm_sum(x[i], w[i], 5, 0, False)), dst_dt="u8", scale=scale,
                                         bias=bias[0], post_ops=[("eltwise", "relu", 0.0, 0.0)])
                         for i in range(items)])
    prim.execute(args)
    np.testing.assert_array_equal(y, want())
    run = prim.bind(args)
    for _ in range(2):
        x[...] = rng.integers(0, 256, x.shape)
        w[...] = rng.integers(-128, 128, w.shape)
        prim.execute(args)
        np.testing.assert_array_equal(y, want())
        y[...] = 0
        run()
        np.testing.assert_array_equal(y, want())


def test_batched_attention_scores(isa_path):
    """Attention at decode: one query row per head times that head's keys, given as a
    ``acb`` (items x K x N, K contiguous: the keys' rows) batch of runtime weights; every
    head its own weights, in place, in one call, s8 query, exact; then a replay with new
    keys."""
    rng = np.random.default_rng(11)
    heads, d, seq = 12, 64, 77
    q = rng.integers(-128, 128, (heads, 1, d)).astype(np.int8)
    keys = rng.integers(-128, 128, (heads, seq, d)).astype(np.int8)
    pd = MatmulDesc(desc((heads, 1, d), "s8", "abc"), desc((heads, d, seq), "s8", "acb"),
                    desc((heads, 1, seq), "s32", "abc"), isa=isa_path)
    assert "runtime_weights" in pd.impl_info()  # (on every path: widened without VNNI)
    prim = pd.create()
    scores = np.zeros((heads, 1, seq), np.int32)
    args = {"src": q, "weights": keys.transpose(0, 2, 1), "dst": scores}
    for _ in range(2):
        prim.execute(args)
        np.testing.assert_array_equal(scores, q.astype(np.int64) @ keys.transpose(0, 2, 1).astype(np.int64))
        keys[...] = rng.integers(-128, 128, keys.shape)
    # every head in one call of the in-place kernel (its items loop), replayed as it is
    assert sum(s.items for s in prim._replay_for(args).run.plan.structs) == heads


def test_batched_attention_values(isa_path):
    """Attention's second product at decode: each head's probabilities (one u8 row, 2
    rows for two queries) times that head's values, ``abc`` (items x K x N: rows of N),
    read in place by the rows kernel where its rows fit (AVX2 VNNI: u8 without a zero
    point, N % 4 == 0), with per-column scales and a u8 dst; then new values replayed."""
    rng = np.random.default_rng(12)
    heads, seq, d = 12, 77, 64
    for rows in (1, 2):
        probs = rng.integers(0, 256, (heads, rows, seq)).astype(np.uint8)
        values = rng.integers(-128, 128, (heads, seq, d)).astype(np.int8)
        attr = Attr(scales={"weights": 4})
        pd = MatmulDesc(desc((heads, rows, seq), "u8", "abc"), desc((heads, seq, d), "s8", "abc"),
                        desc((heads, rows, d), "u8", "abc"), attr=attr, isa=isa_path)
        assert "gemv_rows" in pd.impl_info()["runtime_weights"]
        prim = pd.create()
        out = np.zeros((heads, rows, d), np.uint8)
        scale = np.full(d, 1 / 2048, np.float32)
        args = {"src": probs, "weights": values, "dst": out, "scales:weights": scale}
        for _ in range(2):
            prim.execute(args)
            for h in range(heads):
                exact = wrap_int32(gemm_sum(probs[h], values[h], 0, 0, False))
                want = output_pipeline(exact, dst_dt="u8", scale=scale)
                np.testing.assert_array_equal(out[h], want)
            values[...] = rng.integers(-128, 128, values.shape)
        assert prim._replay_for(args) is not None


@pytest.mark.parametrize("M,src_dt,zp", [(16, "u8", None), (1, "s8", 3), (2, "u8", 5)])
def test_batch_items_spread_over_threads(isa_path, M, src_dt, zp, monkeypatch):
    """A batch of 12 items with runtime weights on two threads: items that need nothing
    of each other (packed without a compensation, or read in place) run whole on one
    thread each, dealt in turn, with a binary operand per item; exact, and replayed with
    new values as one hand-off. (M = 2 with a zero point: packed on AVX2 VNNI, whose rows
    kernel has no room for the compensation: per item on both threads.)"""
    rng = np.random.default_rng(M)
    B, K, N = 12, 40, 24
    lo = -128 if src_dt == "s8" else 0
    src = rng.integers(lo, lo + 256, (B, M, K)).astype(np.int8 if src_dt == "s8" else np.uint8)
    wei = rng.integers(-128, 128, (B, K, N)).astype(np.int8)
    add = rng.uniform(-3, 3, (B, 1, N)).astype(np.float32)
    attr = Attr(zero_points={"src": 0} if zp is not None else None, post_ops=PostOps().binary(
        "add", desc((B, 1, N), "f32", "abc")))
    pd = MatmulDesc(desc((B, M, K), src_dt, "abc"), desc((B, K, N), "s8", "abc"), desc((B, M, N), "f32", "abc"),
                    attr=attr, isa=isa_path, threads=2)
    prim = pd.create()
    dst = np.zeros((B, M, N), np.float32)
    args = {"src": src, "weights": wei, "dst": dst, "post_op:0:src_1": add}
    if zp is not None:
        args["zero_points:src"] = np.int32([zp])
    saturating = faithful_model("exact", isa_path)
    for step in range(3):
        with monkeypatch.context() as m:  # (a context: the emulation's patches stay)
            if step:
                wei[...] = rng.integers(-128, 128, wei.shape)
                m.setattr(prim, "_execute", lambda *_: pytest.fail("_execute ran: the replay was not taken"))
            prim.execute(args)
        for b in range(B):
            exact = wrap_int32(gemm_sum(src[b], wei[b], zp or 0, 0, saturating))
            want = output_pipeline(exact, dst_dt="f32", post_ops=[("binary", "add", add[b])])
            np.testing.assert_array_equal(dst[b], want, err_msg=f"{step} {b}")
    run = prim._replay_for(args).run
    if zp is None or "runtime_weights" in pd.impl_info():  # spread: one plan of two threads
        assert run.joined.threads == 2 and all(p.calls.threads == 1 for p in run.plans)


@pytest.mark.parametrize("isa,kind", PATHS)
@pytest.mark.parametrize("layout", ["columns", "rows"])
@pytest.mark.parametrize("items,threads", [(3, 1), (5, 2), (2, 3)])
def test_items_in_one_call(isa, kind, layout, items, threads):
    """A batch's items in one call of the kernel (its items loop: A, the weights and dst
    advanced by their strides), by ranges of items (items >= threads) or of columns
    (fewer): every item's product exact (or the saturating model's)."""
    path = _path(isa, kind)
    M, K, N = 2, 36, 40
    comp = True  # (a zero point)
    if not takes(path, K, N if layout == "rows" else None, M, comp):
        pytest.skip(f"{isa}: the rows kernel has no room for {M} rows beside the compensation")
    rng = np.random.default_rng(items + threads)
    a = rng.integers(-128, 128, (items, M, K + 3)).astype(np.int8)[:, :, :K]  # (rows K + 3 apart)
    if layout == "columns":
        w = rng.integers(-128, 128, (items, N, K)).astype(np.int8).transpose(0, 2, 1)
        ldw = w.strides[2]
    else:
        w = rng.integers(-128, 128, (items, K, N + 5)).astype(np.int8)[:, :, :N]
        ldw = w.strides[1]
    c = np.zeros((items, M, N), np.int32)
    kernel = gemv_kernel(path, True, comp, OutputSpec(col_comp=False), layout, M)
    plan = GemvPlan(kernel, M, N, K, a.strides[1], ldw, 4 * N, OutputArgs(col_comp=None), threads, items,
                    (a.strides[0], w.strides[0], c.strides[0]))
    plan.run(a, w, c, -3)
    for i in range(items):
        want = wrap_int32(gemm_sum(a[i], np.ascontiguousarray(w[i]), -3, 0, path.kind == "maddubsw"))
        np.testing.assert_array_equal(c[i], want, err_msg=str(i))
