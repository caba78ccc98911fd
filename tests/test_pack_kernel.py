"""jit.pack_kernel: B packed for the VNNI paths in machine code, and the runtime weights
of matmul and inner product that it packs at every call (and every replay)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jit.dot import fast_path, path_for
from jit.pack_kernel import VnniPacker
from primitives.attr import Attr
from primitives.gemm_pack import pack_b
from primitives.matmul import InnerProductDesc, MatmulDesc
from primitives.memory import desc
from primitives.reference import gemm_sum, wrap_int32
from tests.conftest import faithful_model

# Every path's layout (the kernels are AVX2 code: any CPU here runs them): the VNNI one,
# which VPMADDUBSW reads too, and the widening one.
PATHS = [("avx512_core_vnni", None), ("avx512_core", None), ("avx2_vnni", None), ("avx2", None), ("avx2", "widen"),
         ("avx512_core", "widen")]


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 90), n=st.integers(1, 150), nr=st.integers(1, 4), isa=st.sampled_from(PATHS),
       layout=st.sampled_from(["kn", "nk", "strided", "aliased"]), items=st.sampled_from([0, 1, 3]),
       threads=st.sampled_from([1, 2, 3]), stream=st.booleans(), seed=st.integers(0, 2**31))
def test_pack_equals_numpy(k, n, nr, isa, layout, items, threads, stream, seed):
    """Every byte of the packed B and every column sum equal gemm_pack.pack_b's, in the
    VNNI layout (which VPMADDUBSW reads too) and the widening path's, for any
    K (groups padded with zeros; more than a block of 16 groups too), any N (the last
    chunk's and tile's padding columns zero), B row-major, transposed (an inner
    product's OC x K) or with gaps between rows (4096 bytes apart too: fewer groups a
    sweep, jit.pack_rows.block_groups), one matrix or a batch of them (items:
    0 = a 2-D B) in one call, by 1-3 threads (ranges of tiles); packed twice into one
    packer with new values; with streaming stores (512-bit kernels) and without."""
    path = path_for(*isa)
    rng = np.random.default_rng(seed)
    packer = VnniPacker(k, n, path, nr, max(items, 1), threads, columns=layout == "nk", stream=stream)
    for _ in range(2):
        b = rng.integers(-128, 128, (max(items, 1), k, n)).astype(np.int8)
        view = {"kn": b, "nk": np.ascontiguousarray(b.transpose(0, 2, 1)).transpose(0, 2, 1),
                "strided": np.pad(b, ((0, 0), (0, 0), (0, 5)))[:, :, :n],
                "aliased": np.pad(b, ((0, 0), (0, 0), (0, 4096 - n)))[:, :, :n]}[layout]
        got = packer(view) if items else [packer(view[0])]
        for i, pack in enumerate(got):
            want = pack_b(b[i], path, nr, (0, 0))
            assert np.array_equal(pack.data, want.data) and np.array_equal(pack.colsum, want.colsum), i
            assert (pack.tiles, pack.tile_n, pack.tile_stride) == (want.tiles, want.tile_n, want.tile_stride)
            assert pack.safe_pairs is None  # not checked: VNNI cannot saturate


@pytest.mark.parametrize("columns", [False, True])
@pytest.mark.parametrize("threads,items", [(2, 5), (3, 3), (2, 12)])
def test_threads_split_items_where_tiles_are_too_few(columns, threads, items):
    """One tile (N = 40 in tiles of 64) and a batch: the threads take ranges of the items
    (attention's heads), every item packed as pack_b packs it."""
    path = fast_path("avx512_core_vnni")
    rng = np.random.default_rng(items)
    b = rng.integers(-128, 128, (items, 20, 40)).astype(np.int8)
    view = np.ascontiguousarray(b.transpose(0, 2, 1)).transpose(0, 2, 1) if columns else b
    packer = VnniPacker(20, 40, path, 4, items, threads, columns=columns)
    assert len(packer._parts) == threads and {i0 for i0, _, _ in packer._parts} != {0}
    for i, pack in enumerate(packer(view)):
        want = pack_b(b[i], path, 4, (0, 0))
        assert np.array_equal(pack.data, want.data) and np.array_equal(pack.colsum, want.colsum), i


@pytest.mark.parametrize("columns", [False, True])
def test_reads_and_writes_only_its_buffers(guarded, columns):
    """B whole groups and chunks (rows of N bytes, or columns of K), its last byte
    against a guard page, and the packed bytes against one (tiles exactly as wide as N):
    no read or write past them."""
    from runtime.ffi import pointer_to

    path = fast_path("avx512_core_vnni")
    k, n = 32, 64  # one tile of 4 x 16 columns, 8 chunks of 8, 8 groups (2 quads)
    raw = guarded(k * n, np.int8, "end")
    raw[...] = np.random.default_rng(1).integers(-128, 128, k * n)
    b = raw.reshape(n, k).T if columns else raw.reshape(k, n)
    packer = VnniPacker(k, n, path, 4, columns=columns)
    out = guarded(packer.packed.data.size, np.uint8, "end")
    packer._parts[0][2].dst = pointer_to(out)  # the kernel's output, flush against the page
    packer(b)
    assert packer._padded is None  # read in place
    assert np.array_equal(out, pack_b(np.ascontiguousarray(b), path, 4, (0, 0)).data)


_GUARDED = [(512, layout, k, n, nr) for layout in ("vnni", "widen")
            for k, n, nr in ((30, 40, 3), (7, 100, 1), (3, 64, 4), (64, 129, 2), (130, 17, 1))] + \
    [(256, layout, k, n, nr) for layout in ("vnni", "widen") for k, n, nr in ((28, 40, 2), (8, 100, 1), (64, 132, 3),
                                                                             (4, 8, 1), (36, 20, 4))]


@pytest.mark.parametrize("columns", [False, True])
@pytest.mark.parametrize("bits,layout,k,n,nr,stream", [g + (False,) for g in _GUARDED] +
                         [g + (True,) for g in _GUARDED if g[0] == 512])
def test_kernels_read_and_write_only_their_buffers(guarded, columns, bits, layout, k, n, nr, stream):
    """The packing kernels (jit.pack_rows, jit.pack_columns) on B flush against a guard
    page (rows: the last chunk's masked loads; columns: the last block's), writing a
    packed B flush against another (rows: the last chunk's quarters past the tiles
    stored at the last real one; columns: the last block's groups only): every byte and
    sum as pack_b's, no padded copy. 512-bit: K % 4 rows, K % 64 bytes and N % 64 (16)
    columns included, with streaming stores too (VMOVNTDQ: each an aligned line, or it
    faults); 256-bit (dword masks: K and N in whole dwords), the VNNI layout and the
    widening one."""
    from jit.dot import widening_path
    from runtime.ffi import pointer_to
    from runtime.isa import cpu_supports

    if bits == 512 and not cpu_supports("avx512_core"):
        pytest.skip("CPU lacks AVX-512 (the 512-bit packing kernel)")
    if bits == 512:
        path = widening_path("avx512_core") if layout == "widen" else \
            fast_path("avx512_core_vnni" if cpu_supports("avx512_core_vnni") else "avx512_core")
    else:
        path = widening_path("avx2") if layout == "widen" else fast_path("avx2")
    raw = guarded(k * n, np.int8, "end")
    raw[...] = np.random.default_rng(k).integers(-128, 128, k * n)
    b = raw.reshape(n, k).T if columns else raw.reshape(k, n)
    packer = VnniPacker(k, n, path, nr, columns=columns, stream=stream)
    assert packer._w.bits == bits and packer._code.name.endswith("_nt") == stream
    out = guarded(packer.packed.data.size, np.uint8, "end")
    packer._parts[0][2].dst = pointer_to(out)
    packer(b)
    assert packer._padded is None  # read in place
    want = pack_b(np.ascontiguousarray(b), path, nr, (0, 0))
    assert np.array_equal(out, want.data) and np.array_equal(packer.packed.colsum, want.colsum)


@pytest.mark.parametrize("columns", [False, True])
@pytest.mark.parametrize("isa", [("avx512_core_vnni", None), ("avx2", "widen")])
def test_item_calls_pack_one_item_each(columns, isa):
    """item_call(i): a call that packs item i alone (every column), on whatever thread a
    plan puts it, at the array point() took, and again at new values after refresh()
    (a padded copy: K not whole groups)."""
    path = path_for(*isa)
    rng = np.random.default_rng(7)
    items, k, n = 5, 21, 70
    packer = VnniPacker(k, n, path, 2, items, 2, columns=columns)
    b = rng.integers(-128, 128, (items, k, n)).astype(np.int8)
    view = np.ascontiguousarray(b.transpose(0, 2, 1)).transpose(0, 2, 1) if columns else b
    packer.point(view)
    for _ in range(2):
        for i in (3, 0, 4, 1, 2):
            fn, args = packer.item_call(i)
            fn(args)
        for i, pack in enumerate(packer.packs):
            assert np.array_equal(pack.data, pack_b(b[i], path, 2, (0, 0)).data), i
        view[...] = b[...] = rng.integers(-128, 128, b.shape)
        packer.refresh()


@pytest.mark.parametrize("columns", [False, True])
def test_a_big_packed_b_streams(columns, monkeypatch):
    """From 8 MB of packed B, or a quarter of L3 where that is more
    (jit.pack_kernel.stream_bytes), the 512-bit kernels store it past the caches, below
    they do not; the 256-bit kernels never do; bit for bit either way (here with the
    threshold at 8 MB whatever this CPU's L3)."""
    from jit import pack_kernel
    from jit.pack_kernel import STREAM_BYTES, packed_bytes, stream_bytes, streams
    from runtime import caches
    from runtime.isa import cpu_supports

    for l3, want in ((0, STREAM_BYTES), (32 << 20, STREAM_BYTES), (96 << 20, 24 << 20)):
        monkeypatch.setattr(caches, "data_caches", lambda l3=l3: caches.DataCaches(48 << 10, 2 << 20, "test", l3))
        assert stream_bytes() == want
        assert streams(512, want) and not streams(512, want - 1) and not streams(256, 1 << 40)
    monkeypatch.setattr(pack_kernel, "stream_bytes", lambda: STREAM_BYTES)
    path = fast_path("avx512_core_vnni")
    k, n = 2048, 4096
    assert packed_bytes(k, n, path, 4) == STREAM_BYTES
    rng = np.random.default_rng(5)
    b = rng.integers(-128, 128, (n, k) if columns else (k, n)).astype(np.int8)
    view = b.T if columns else b
    big, small = VnniPacker(k, n, path, 4, columns=columns), VnniPacker(k, n - 64, path, 4, columns=columns)
    bits = 512 if cpu_supports("avx512_core") else 256
    assert big._code.name.endswith("_nt") == (bits == 512) and not small._code.name.endswith("_nt")
    for packer, weights in ((big, view), (small, view[:, :n - 64])):
        want = pack_b(np.ascontiguousarray(weights), path, 4, (0, 0))
        got = packer(weights)
        assert np.array_equal(got.data, want.data) and np.array_equal(got.colsum, want.colsum)


def test_the_packer_refuses_a_wrong_shape():
    with pytest.raises(ValueError, match=r"^weights: expected 1 x 4 x 8 \(items x K x N\), got \(8, 4\)"):
        VnniPacker(4, 8, fast_path("avx2_vnni"), 1)(np.zeros((8, 4), np.int8))


def _policy(isa_path) -> str:
    """The policy under which runtime weights are packed in machine code on ``isa_path``:
    any on VNNI paths, ``faithful`` elsewhere (under ``exact`` the values decide)."""
    return "exact" if isa_path.endswith("vnni") else "faithful"


@pytest.mark.parametrize("src_dt,zp", [("u8", None), ("u8", 3), ("s8", None)])
@pytest.mark.parametrize("shape", [(3, 5, 37, 20), (1, 6, 3, 9), (2, 64, 128, 64), (4, 7, 64, 40)])
def test_runtime_weights_replay_packs_the_new_values(isa_path, shape, src_dt, zp, monkeypatch):
    """A batched matmul with runtime weights (an item each; more rows than the in-place
    kernels take) called again with new values in the same arrays: the replay packs them
    again (and, for an s8 source or a zero point, their compensation per item; without,
    every item's calls in one plan), bit for bit, without a set-up. On VNNI paths, and
    under faithful on the others (the saturating model)."""
    B, M, K, N = shape
    rng = np.random.default_rng(K)
    lo = -128 if src_dt == "s8" else 0
    src = rng.integers(lo, lo + 256, (B, M, K)).astype(np.int8 if src_dt == "s8" else np.uint8)
    wei = rng.integers(-128, 128, (B, K, N)).astype(np.int8)
    attr = Attr(zero_points={"src": 0} if zp is not None else None, policy=_policy(isa_path))
    pd = MatmulDesc(desc((B, M, K), src_dt, "abc"), desc((B, K, N), "s8", "abc"), desc((B, M, N), "s32", "abc"),
                    attr=attr, isa=isa_path)
    prim = pd.create()
    dst = np.zeros((B, M, N), np.int32)
    args = {"src": src, "weights": wei, "dst": dst}
    if zp is not None:
        args["zero_points:src"] = np.int32([zp])
    prim.execute(args)
    assert prim._replay_for(args) is not None
    for step in range(3):
        wei[...] = rng.integers(-128, 128, wei.shape)
        src[...] = rng.integers(lo, lo + 256, src.shape)
        with monkeypatch.context() as m:
            m.setattr(prim, "_execute", lambda *_: pytest.fail("_execute ran: the replay was not taken"))
            prim.execute(args)
        saturating = faithful_model(_policy(isa_path), isa_path)
        for b in range(B):
            np.testing.assert_array_equal(dst[b], wrap_int32(gemm_sum(src[b], wei[b], zp or 0, 0, saturating)),
                                          err_msg=str(step))


def test_inner_product_runtime_weights(isa_path):
    """An inner product's runtime weights (OC x K rows: B as columns of K bytes, the
    columns kernel's) packed per call, a K that is no multiple of 4, and one of 16 (more
    rows than the in-place kernel takes: tests/test_gemv.py); under faithful on non-VNNI
    paths."""
    from jit.pack_kernel import vnni_packs

    assert vnni_packs(np.zeros((5, 7), np.int8).T) and not vnni_packs(np.zeros((5, 7), np.int8)[:, ::2])
    rng = np.random.default_rng(3)
    saturating = faithful_model(_policy(isa_path), isa_path)
    for n, c, oc in ((5, 13, 19), (6, 64, 40)):
        pd = InnerProductDesc(desc((n, c), "u8", "ab"), desc((oc, c), "s8", "ab"), desc((n, oc), "s32", "ab"),
                              attr=Attr(policy=_policy(isa_path)), isa=isa_path)
        prim = pd.create()
        for _ in range(2):
            x = rng.integers(0, 256, (n, c)).astype(np.uint8)
            w = rng.integers(-128, 128, (oc, c)).astype(np.int8)
            y = np.zeros((n, oc), np.int32)
            prim.execute({"src": x, "weights": w, "dst": y})
            np.testing.assert_array_equal(y, wrap_int32(gemm_sum(x, w.T, 0, 0, saturating)))


# ---------------------------------------------------------------------- jit.column_term

@settings(max_examples=60, deadline=None)
@given(vectors=st.integers(0, 40), mul=st.integers(-383, 0), seed=st.integers(0, 2**32 - 1))
def test_column_term_equals_numpy(vectors, mul, seed):
    """dst = mul * sums + add over whole 8-column vectors, int32 wrapping, as numpy's
    int64 result taken modulo 2^32; the three buffers against guard pages (after the last
    column, then before the first: the kernel touches nothing else)."""
    from jit.column_term import column_term_kernel
    from runtime.ffi import ffi, pointer_to
    from tests.conftest import GuardedBuffer

    n = 8 * vectors
    rng = np.random.default_rng(seed)
    values = [rng.integers(-2**31, 2**31, n).astype(np.int32) for _ in range(2)]
    want = wrap_int32(mul * values[0].astype(np.int64) + values[1])
    kernel = column_term_kernel()
    for where in ("end", "start"):
        buffers = [GuardedBuffer(n, np.int32, where) for _ in range(3)]
        try:
            sums, add, dst = (b.array for b in buffers)
            sums[:], add[:] = values
            dst[:] = 0
            args = ffi.new("struct i8j_colterm_args *", dict(n=n, mul=mul))
            args.sums, args.add, args.dst = (pointer_to(x) for x in (sums, add, dst))
            kernel.function(args)
            np.testing.assert_array_equal(dst, want)
        finally:
            for b in buffers:
                b.close()
