"""Int8 pooling: bit-exact against primitives.pooling_ref on every executable ISA path.

Hypothesis draws shapes (channels 1..130, so every tail width of both vector sizes
and the big/small channel blocks; 1-D, 2-D and 3-D; spatial 1..20 (3-D: 1..7); kernels
1..5 (3-D: 1..3); strides 1..3; asymmetric padding), both layouts, u8/s8 and every
algorithm and destination type. Hand-made cases
pin the documented rounding (ties to even) and the padding rules independently of the
reference; guard pages prove no byte outside src or dst is touched; bad input raises
before any kernel runs. Nothing here is timed.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from primitives.attr import Attr, PostOps
from primitives.memory import Memory, desc
from primitives.pooling import ALGS, NCHW_TRANSPOSE_MIN_C, PoolingDesc, pool2d, pooling_desc
from primitives.pooling_ref import out_size, pooling_ref
from tests.conftest import in_threads

EXAMPLES = int(os.environ.get("INT8JIT_TEST_EXAMPLES", "30"))
DTYPES = {"u8": np.uint8, "s8": np.int8}


def random_src(rng, shape, dt):
    info = np.iinfo(DTYPES[dt])
    return rng.integers(info.min, info.max + 1, shape, dtype=DTYPES[dt])


def run_case(isa, dt, alg, layout, n, c, spatial, kernel, strides, pl, pr, dst_dt=None, threads=1, seed=0):
    """Pool random data with the primitive and the reference; return both (layout order)."""
    rng = np.random.default_rng(seed)
    nd = len(spatial)
    last = layout in ("nhwc", "nwc", "ndhwc")
    x_last = random_src(rng, (n,) + tuple(spatial) + (c,), dt)
    outs = tuple(out_size(spatial[d], kernel[d], strides[d], pl[d], pr[d]) for d in range(nd))
    want = pooling_ref(x_last, alg, kernel, strides, pl, pr, dst_dt)
    to_first = (0, nd + 1) + tuple(range(1, nd + 1))
    x = x_last if last else np.ascontiguousarray(x_last.transpose(to_first))
    if not last:
        want = want.transpose(to_first)
    dst_dt = dst_dt or dt
    pd = pooling_desc(alg, desc((n, c) + tuple(spatial), dt, layout), desc((n, c) + outs, dst_dt, "any"),
                      strides, kernel, pl, pr, isa=isa, threads=threads)
    y = Memory(pd.dst_desc())
    prim = pd.create()
    prim.execute({"src": x, "dst": y})
    # Again on new arrays of the same layouts (the replay moved to them where it can,
    # Replay.moves): the same result, the first call's dst untouched.
    again = np.zeros_like(y.array)
    first = y.array.copy()
    prim.execute({"src": x.copy(), "dst": again})
    np.testing.assert_array_equal(again, first)
    np.testing.assert_array_equal(y.array, first)
    return y.array, want


def valid_geometry(i, k, s, pl, pr):
    return k <= i + pl + pr and pl < k and (out_size(i, k, s, pl, pr) - 1) * s - pl < i


@st.composite
def cases(draw):
    nd = draw(st.sampled_from((2, 2, 2, 1, 3, 3)))
    spatial, kernel, strides, pl, pr = [], [], [], [], []
    for _ in range(nd):
        i = draw(st.integers(1, 20 if nd < 3 else 7))
        k = draw(st.integers(1, 5 if nd < 3 else 3))
        s = draw(st.integers(1, 3))
        a = draw(st.integers(0, k - 1))
        b = draw(st.integers(0, k - 1))
        assume(valid_geometry(i, k, s, a, b))
        spatial.append(i); kernel.append(k); strides.append(s); pl.append(a); pr.append(b)  # noqa: E702
    alg = draw(st.sampled_from(ALGS))
    dt = draw(st.sampled_from(("u8", "s8")))
    dst_dt = None if alg == "max" else draw(st.sampled_from((None, None, "s32", "f32")))
    layout = draw(st.sampled_from({1: ("nwc", "ncw"), 2: ("nhwc", "nchw"), 3: ("ndhwc", "ncdhw")}[nd]))
    c = draw(st.one_of(st.integers(1, 130), st.sampled_from((1, 3, 8, 16, 31, 64, 65, 129))))
    n = draw(st.integers(1, 2))
    return dict(dt=dt, alg=alg, layout=layout, n=n, c=c, spatial=tuple(spatial), kernel=tuple(kernel),
                strides=tuple(strides), pl=tuple(pl), pr=tuple(pr), dst_dt=dst_dt,
                threads=draw(st.sampled_from((1, 1, 2))), seed=draw(st.integers(0, 2**16)))


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.filter_too_much])
@given(case=cases())
def test_property_matches_reference(isa_path, case):
    got, want = run_case(isa_path, **case)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("dt", ("u8", "s8"))
def test_every_channel_tail(isa_path, alg, dt):
    """Channel counts that hit every block and tail width of ymm and zmm, deterministically."""
    for c in (1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65, 127, 128, 129, 192, 255, 256,
              257, 300):
        got, want = run_case(isa_path, dt, alg, "nhwc", 1, c, (5, 6), (3, 2), (2, 1), (1, 0), (1, 1), seed=c)
        np.testing.assert_array_equal(got, want, err_msg=f"C={c}")


@pytest.mark.parametrize("dst_dt", ("s32", "f32"))
def test_avg_wide_destinations(isa_path, dst_dt):
    for alg in ALGS[1:]:
        for dt in ("u8", "s8"):
            got, want = run_case(isa_path, dt, alg, "nhwc", 2, 37, (7, 9), (3, 3), (2, 2), (1, 1), (1, 1), dst_dt)
            np.testing.assert_array_equal(got, want)


def test_rounding_ties_to_even(isa_path):
    """Averages of two values: .5 goes to the even neighbour (VCVTPS2DQ), in u8 and s8."""
    pairs_u8 = [(1, 2, 2), (2, 3, 2), (0, 1, 0), (254, 255, 254), (253, 254, 254), (0, 0, 0)]
    x = np.array([[[[a, b] for a, b, _ in pairs_u8]]], np.uint8).transpose(0, 1, 3, 2)  # (1, 1, 2, C)
    y = pool2d(x, (1, 2), alg="avg_include_padding", isa=isa_path)
    assert y.reshape(-1).tolist() == [r for _, _, r in pairs_u8]
    pairs_s8 = [(-1, -2, -2), (-2, -3, -2), (-128, -127, -128), (127, 126, 126), (-1, 0, 0), (-1, 2, 0)]
    x = np.array([[[[a, b] for a, b, _ in pairs_s8]]], np.int8).transpose(0, 1, 3, 2)
    y = pool2d(x, (1, 2), alg="avg_exclude_padding", isa=isa_path)
    assert y.reshape(-1).tolist() == [r for _, _, r in pairs_s8]
    # f32 destination keeps the quotient; s32 rounds it
    y = pool2d(x, (1, 2), alg="avg_exclude_padding", dst_dt="f32", isa=isa_path)
    assert y.reshape(-1).tolist() == [-1.5, -2.5, -127.5, 126.5, -0.5, 0.5]


def test_padding_rules(isa_path):
    """Max ignores padding (all-negative s8 stays negative); avg modes differ in the divisor."""
    x = np.full((1, 3, 3, 5), -100, np.int8)
    y = pool2d(x, 3, stride=1, padding=1, alg="max", isa=isa_path)
    assert np.all(y == -100)
    x = np.full((1, 3, 3, 5), 90, np.uint8)
    inc = pool2d(x, 3, stride=1, padding=1, alg="avg_include_padding", isa=isa_path)[0, :, :, 0]
    exc = pool2d(x, 3, stride=1, padding=1, alg="avg_exclude_padding", isa=isa_path)[0, :, :, 0]
    assert np.all(exc == 90)
    # corners: 4 valid of 9 -> 40; edges: 6 of 9 -> 60; centre 90
    assert inc.tolist() == [[40, 60, 40], [60, 90, 60], [40, 60, 40]]


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("layout", ("ndhwc", "ncdhw"))
def test_3d_windows(isa_path, alg, layout):
    """3-D windows, deterministically: depth padding on both sides, depth strides, the
    unrolled 3x3 slices and the run-time loops, channel tails of both vector sizes."""
    cases = [((5, 6, 7), (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1)),
             ((4, 5, 5), (2, 3, 2), (1, 2, 1), (1, 0, 1), (0, 2, 0)),
             ((7, 3, 4), (3, 1, 2), (3, 1, 1), (2, 0, 0), (2, 0, 1)),
             ((3, 4, 4), (1, 2, 2), (2, 2, 2), (0, 0, 0), (0, 0, 0))]   # one slice deep, stride 2
    for i, (spatial, kernel, strides, pl, pr) in enumerate(cases):
        for c in (5, 64, 70):
            dst_dt = None if alg == "max" else (None, "s32", "f32")[i % 3]
            got, want = run_case(isa_path, "s8" if c % 2 else "u8", alg, layout, 2, c, spatial, kernel, strides,
                                 pl, pr, dst_dt, seed=c + i)
            np.testing.assert_array_equal(got, want, err_msg=f"{spatial} {kernel} {strides} {pl} {pr} C={c}")


def test_3d_kernel_choice():
    """A 3-D window runs the depth loop's kernel; one slice deep, stride 1 and no depth
    padding is the 2-D kernel over N*D images (the same kernel object)."""
    def pd(src, dst, strides, kernel, pad):
        return PoolingDesc("avg_include_padding", desc(src, "u8", "ndhwc"), desc(dst, "u8", "ndhwc"), strides,
                           kernel, pad, pad)

    deep = pd((1, 8, 4, 6, 6), (1, 8, 2, 3, 3), 2, 2, 0)
    assert deep.spec.d3 and "_3d_" in deep.impl_info()["kernel"]
    flat = pd((2, 8, 4, 6, 6), (2, 8, 4, 3, 3), (1, 2, 2), (1, 3, 3), (0, 1, 1))
    two_d = PoolingDesc("avg_include_padding", desc((8, 8, 6, 6), "u8", "nhwc"), desc((8, 8, 3, 3), "u8", "nhwc"),
                        2, 3, 1, 1)
    assert not flat.spec.d3 and flat.create().kernel is two_d.create().kernel
    got = Memory(flat.dst_desc())
    x = np.random.default_rng(0).integers(0, 256, (2, 4, 6, 6, 8), dtype=np.uint8)
    flat.create().execute({"src": x, "dst": got})
    np.testing.assert_array_equal(got.array, pooling_ref(x, "avg_include_padding", (1, 3, 3), (1, 2, 2),
                                                         (0, 1, 1), (0, 1, 1)))
    strided = pd((1, 8, 5, 6, 6), (1, 8, 3, 3, 3), (2, 2, 2), (1, 2, 2), 0)  # slices skipped: the depth loop
    assert strided.spec.d3


def test_kernels_cached_by_structure():
    """Different sizes reuse one kernel: the key holds no size, only an unrolled 2 or 3 window."""
    def pd(src, dst, strides, kernel):
        return PoolingDesc("max", desc(src, "u8", "nhwc"), desc(dst, "u8", "nhwc"), strides, kernel, 0, 0)

    a = pd((1, 5, 7, 7), (1, 5, 3, 3), 2, 3)
    b = pd((2, 70, 9, 4), (2, 70, 7, 1), (1, 2), 3)
    assert a.create().kernel is b.create().kernel
    assert "pool_max_u8u8_kh3_kw3" in a.impl_info()["kernel"]
    c = pd((1, 5, 7, 7), (1, 5, 4, 3), (1, 1), (4, 5))
    d = pd((3, 9, 8, 6), (3, 9, 4, 1), (1, 2), (5, 6))
    assert c.create().kernel is d.create().kernel
    assert c.spec.kw == 0 and c.spec.kh == 0


def test_threads_agree(isa_path):
    outs = [run_case(isa_path, "s8", "avg_exclude_padding", "nhwc", 3, 19, (13, 11), (3, 3), (2, 2), (1, 1),
                     (1, 1), threads=t, seed=5)[0] for t in (1, 2, 3, 7)]
    for o in outs[1:]:
        np.testing.assert_array_equal(outs[0], o)
    # 3-D: chunks that start inside an image's output slices (od, oh) and cross images
    for t in (2, 3, 7):
        got, want = run_case(isa_path, "u8", "avg_exclude_padding", "ndhwc", 2, 19, (5, 4, 6), (3, 2, 3),
                             (2, 1, 2), (1, 1, 1), (1, 0, 1), threads=t, seed=t)
        np.testing.assert_array_equal(got, want, err_msg=f"threads={t}")


@pytest.mark.parametrize("c", (NCHW_TRANSPOSE_MIN_C - 1, NCHW_TRANSPOSE_MIN_C))
def test_nchw_routes(c):
    pd = PoolingDesc("max", desc((2, c, 6, 6), "u8", "nchw"), desc((2, c, 3, 3), "u8", "nchw"), 2, 2, 0, 0)
    assert pd.impl_info()["layout_route"] == ("nchw_as_c1" if c < NCHW_TRANSPOSE_MIN_C else "nchw_transpose")
    got, want = run_case(None, "u8", "max", "nchw", 2, c, (6, 6), (2, 2), (2, 2), (0, 0), (0, 0))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("c", (1, 13, 64, 70))
@pytest.mark.parametrize("spatial", ((7, 5), (4, 7, 5)))
def test_guard_pages(isa_path, guarded, alg, c, spatial):
    """src and dst flush against PROT_NONE pages, after and before: no stray access."""
    rng = np.random.default_rng(c)
    n, k, s, p, nd = 2, 3, 2, 1, len(spatial)
    outs = tuple(out_size(i, k, s, p, p) for i in spatial)
    x = random_src(rng, (n,) + spatial + (c,), "s8")
    want = pooling_ref(x, alg, (k,) * nd, (s,) * nd, (p,) * nd, (p,) * nd)
    tag = "nhwc" if nd == 2 else "ndhwc"
    pd = pooling_desc(alg, desc((n, c) + spatial, "s8", tag), desc((n, c) + outs, "s8", tag), s, k, p, p,
                      isa=isa_path, threads=1)
    prim = pd.create()
    for where in ("end", "start"):
        src = guarded(x.size, np.int8, where)
        src[:] = x.reshape(-1)
        dst = guarded(want.size, np.int8, where)
        dst[:] = 0
        prim.execute({"src": src.reshape(x.shape), "dst": dst.reshape(want.shape)})
        np.testing.assert_array_equal(dst.reshape(want.shape), want)


@pytest.mark.parametrize("dt,fill", [("u8", 255), ("s8", -128), ("s8", 127)])
@pytest.mark.parametrize("dst_dt", ("s32", "f32"))
def test_avg_sums_at_the_s16_limit(isa_path, dt, fill, dst_dt):
    """Average windows of the most pixels whose sums fit s16 lanes (AVX-512's s16_sums:
    257 for u8, 256 for s8), all at the extreme value, and one pixel more (s32 sums):
    exact. 1-D windows along W; 45 channels: one 32-channel piece and a tail."""
    from jit.pooling_kernel import S16_WINDOW

    c = 45
    for k in (S16_WINDOW[dt], S16_WINDOW[dt] + 1):
        x = np.full((1, k + 1, c), fill, DTYPES[dt])
        x[0, 0] = 0  # the two windows differ
        pd = pooling_desc("avg_include_padding", desc((1, c, k + 1), dt, "nwc"), desc((1, c, 2), dst_dt, "nwc"),
                          1, k, 0, 0, isa=isa_path, threads=1)
        y = Memory(pd.dst_desc())
        pd.create().execute({"src": x, "dst": y})
        np.testing.assert_array_equal(y.array, pooling_ref(x, "avg_include_padding", (k,), (1,), (0,), (0,), dst_dt))
        wide = pd.spec.path.bits == 512
        assert pd.spec.s16_sums is (wide and k == S16_WINDOW[dt])


@pytest.mark.parametrize("dt,fill", [("u8", 255), ("s8", -128)])
def test_3d_avg_sums_in_s16(isa_path, dt, fill):
    """A 3-D window's pixels (depth included) decide the s16 sums: 4x8x8 = 256 pixels at the
    extreme value fit s16 lanes (AVX-512), 5x8x8 = 320 take s32 sums; both exact."""
    c = 40
    for kd in (4, 5):
        x = np.full((1, kd, 8, 9, c), fill, DTYPES[dt])
        x[0, 0, 0, 0] = 0
        pd = pooling_desc("avg_include_padding", desc((1, c, kd, 8, 9), dt, "ndhwc"),
                          desc((1, c, 1, 1, 2), "s32", "ndhwc"), 1, (kd, 8, 8), 0, 0, isa=isa_path, threads=1)
        y = Memory(pd.dst_desc())
        pd.create().execute({"src": x, "dst": y})
        want = pooling_ref(x, "avg_include_padding", (kd, 8, 8), (1, 1, 1), (0,) * 3, (0,) * 3, "s32")
        np.testing.assert_array_equal(y.array, want)
        assert pd.spec.s16_sums is (pd.spec.path.bits == 512 and kd == 4)


# ---------------------------------------------------------------------- bad input

def _pd(**kw):
    args = dict(alg="max", src_desc=desc((1, 4, 6, 6), "u8", "nhwc"), dst_desc=desc((1, 4, 3, 3), "u8", "nhwc"),
                strides=2, kernel=2, padding_l=0, padding_r=0)
    args.update(kw)
    return PoolingDesc(**args)


@pytest.mark.parametrize("kw, name", [
    (dict(alg="avg"), "alg"),
    (dict(kernel=(7, 7), dst_desc=desc((1, 4, 1, 1), "u8", "nhwc")), "kernel"),
    (dict(kernel=0), "kernel"),
    (dict(strides=0), "strides"),
    (dict(strides=(1, 2, 3)), "strides"),
    (dict(padding_l=-1), "padding_l"),
    (dict(padding_r=(0, -2)), "padding_r"),
    (dict(padding_l=2, dst_desc=desc((1, 4, 4, 4), "u8", "nhwc")), "padding_l"),
    (dict(kernel=3, strides=1, padding_r=3, dst_desc=desc((1, 4, 7, 7), "u8", "nhwc")), "padding_r"),
    (dict(dst_desc=desc((1, 4, 3, 4), "u8", "nhwc")), "dst_desc"),
    (dict(dst_desc=desc((1, 4, 3, 3), "s8", "nhwc")), "dst_desc"),
    (dict(dst_desc=desc((1, 4, 3, 3), "s32", "nhwc")), "dst_desc"),
    (dict(dst_desc=desc((1, 4, 3, 3), "u8", "nchw")), "dst_desc"),
    (dict(src_desc=desc((1, 4, 6, 6), "f32", "nhwc")), "src_desc"),
    (dict(src_desc=desc((1, 4, 6, 6), "u8", "any")), "src_desc"),
    (dict(src_desc=desc((1, 4, 6, 6), "u8", "abdc")), "src_desc"),
    (dict(src_desc=desc((1, 4), "u8", "ab")), "src_desc"),
    (dict(src_desc=desc((1, 4, 6, 6, 6), "u8", "ndhwc")), "dst_desc"),  # 3-D: the pooled shape is 3x3x3
    (dict(src_desc="nhwc"), "src_desc"),
    (dict(isa="sse4"), "isa"),
    (dict(attr=Attr(scales={"src": 0})), "attr"),
    (dict(attr=Attr(zero_points={"dst": 0})), "attr"),
    (dict(attr=Attr().set_post_ops(PostOps().eltwise("relu"))), "attr"),
    (dict(attr={"scales": {}}), "attr"),
])
def test_bad_descriptor(kw, name):
    with pytest.raises((ValueError, TypeError), match=rf"^{name}\b"):
        _pd(**kw)


def test_bad_execute_arguments():
    prim = _pd().create()
    x = np.zeros((1, 6, 6, 4), np.uint8)
    y = np.zeros((1, 3, 3, 4), np.uint8)
    prim.execute({"src": x, "dst": y})
    with pytest.raises(ValueError, match="^args"):
        prim.execute({"src": x})
    with pytest.raises(ValueError, match="^args"):
        prim.execute({"src": x, "dst": y, "weights": x})
    with pytest.raises(TypeError, match="^src"):
        prim.execute({"src": x.view(np.int8), "dst": y})
    with pytest.raises(ValueError, match="^src"):
        prim.execute({"src": np.zeros((1, 6, 6, 5), np.uint8), "dst": y})
    with pytest.raises(ValueError, match="^dst"):
        prim.execute({"src": x, "dst": np.zeros((1, 3, 4, 4), np.uint8)})
    ro = y.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="^dst"):
        prim.execute({"src": x, "dst": ro})
    big = np.zeros(200, np.uint8)
    with pytest.raises(ValueError, match="^dst: overlaps"):
        prim.execute({"src": big[:144].reshape(1, 6, 6, 4), "dst": big[100:136].reshape(1, 3, 3, 4)})
    with pytest.raises(ValueError, match="^scratchpad"):
        prim.execute({"src": x, "dst": y, "scratchpad": np.zeros(16, np.uint8)})


def test_base_class_contract():
    """Through primitives.base: Memory arguments, the primitive cache, queries, verbose lines."""
    pd = _pd()
    prim = pd.create()
    assert _pd().create() is prim  # identical descriptor: the cached primitive
    assert pd.scratchpad_desc().dims == (0,)
    assert pd.query("dst") == desc((1, 4, 3, 3), "u8", "nhwc")
    x = np.arange(144, dtype=np.uint8).reshape(1, 6, 6, 4)
    y = Memory(pd.dst_desc())
    prim.execute({"src": Memory(pd.src_desc(), x), "dst": y})
    np.testing.assert_array_equal(y.array, pooling_ref(x, "max", (2, 2), (2, 2), (0, 0), (0, 0)))
    logical = x.transpose(0, 3, 1, 2)  # logical (N, C, H, W) view of the NHWC bytes
    y2 = np.zeros((1, 3, 3, 4), np.uint8)
    prim.execute({"src": logical, "dst": y2})
    np.testing.assert_array_equal(y2, y.array)


def test_pool2d_of_an_empty_batch():
    """No images (or no channels): an empty result of the pooled shape, the window still checked."""
    assert pool2d(np.zeros((0, 5, 7, 3), np.uint8), 2).shape == (0, 2, 3, 3)
    y = pool2d(np.zeros((2, 0, 5, 5), np.int8), 3, stride=1, padding=1, alg="avg_include_padding",
               layout="nchw", dst_dt="s32")
    assert y.shape == (2, 0, 5, 5) and y.dtype == np.int32
    with pytest.raises(ValueError, match="^kernel"):
        pool2d(np.zeros((0, 4, 4, 3), np.uint8), 7)


def test_bad_pool2d_arguments():
    x = np.zeros((1, 4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match="^kernel"):
        pool2d(x, 7)
    with pytest.raises(ValueError, match="^layout"):
        pool2d(x, 2, layout="chwn")
    with pytest.raises(TypeError, match="^x"):
        pool2d(x.astype(np.float32), 2)
    with pytest.raises(ValueError, match="^x"):
        pool2d(x[0], 2)
    with pytest.raises(ValueError, match="^padding"):
        pool2d(x, 2, padding=-1)
    with pytest.raises(ValueError, match="^stride"):
        pool2d(x, 2, stride=0)


def test_pool2d_takes_lists_at_a_threads_first_call():
    """A list argument cannot key a kept set-up; the first call of a thread (an empty
    table of them) had failed on it with a bare TypeError, later ones worked."""
    x = np.arange(2 * 6 * 6 * 4).astype(np.uint8).reshape(2, 6, 6, 4)
    want = pooling_ref(x, "max", (3, 3), (3, 3), (0, 0), (0, 0))
    got = []
    errors = in_threads(lambda: got.append(pool2d(x, [3, 3])), [()])  # (a fresh thread: no kept set-ups)
    if errors:  # (raised here: where no ISA path runs, conftest skips on NoIsaPathError)
        raise errors[0]
    assert len(got) == 1 and np.array_equal(got[0], want)


def test_pool2d_calls_keep_their_setup(monkeypatch):
    """pool2d keeps each call signature's primitive (per thread): calls like an earlier one
    (new values, new arrays, a non-contiguous view) build no descriptor and stay exact; its
    arguments are still checked on a new signature."""
    from primitives import pooling

    rng = np.random.default_rng(13)
    pool2d(np.zeros((2, 9, 8, 5), np.uint8), 3, 2, 1, alg="avg_exclude_padding")
    pool2d(np.zeros((2, 5, 9, 8), np.int8), (2, 3), layout="nchw")
    built = []
    real = pooling.PoolingDesc
    monkeypatch.setattr(pooling, "PoolingDesc", lambda *a, **k: built.append(1) or real(*a, **k))
    for _ in range(3):
        x = rng.integers(0, 256, (2, 9, 8, 5)).astype(np.uint8)
        want = pooling_ref(x, "avg_exclude_padding", (3, 3), (2, 2), (1, 1), (1, 1))
        assert np.array_equal(pool2d(x, 3, 2, 1, alg="avg_exclude_padding"), want)
        big = rng.integers(-128, 128, (2, 5, 9, 16)).astype(np.int8)
        view = big[..., ::2]  # (copied to a dense array: the same signature)
        want = np.moveaxis(pooling_ref(np.moveaxis(view, 1, -1), "max", (2, 3), (2, 3), (0, 0), (0, 0)), -1, 1)
        assert np.array_equal(pool2d(view, (2, 3), layout="nchw"), want)
    assert not built
    with pytest.raises(ValueError, match="^kernel"):  # (a new signature: checked, refused)
        pool2d(np.zeros((2, 9, 8, 5), np.uint8), 11)


@pytest.mark.parametrize("dt, side, ok", [("u8", 2901, True), ("u8", 2902, False), ("s8", 4096, True),
                                          ("s8", 4097, False)])
def test_average_window_whose_sum_could_leave_s32_is_refused(dt, side, ok):
    """The average's sum is exact s32: a window of more than (2^31 - 1) / 255 u8 pixels (or
    2^31 / 128 s8 ones) could wrap it, and is refused by name (it had given 3000x3000 of 250 an
    average of -227); max pooling takes any window."""
    src = desc((1, 1, side, side), dt, "nhwc")
    dst = desc((1, 1, 1, 1), dt, "nhwc")
    PoolingDesc("max", src, dst, 1, side, 0, 0)
    if ok:
        PoolingDesc("avg_include_padding", src, dst, 1, side, 0, 0)
    else:
        with pytest.raises(ValueError, match=f"kernel: an average over {side * side} pixels of {dt} can leave s32"):
            PoolingDesc("avg_exclude_padding", src, dst, 1, side, 0, 0)


def test_pool2d_refuses_a_float_window_after_an_int_one():
    """pool2d keeps the set-up of a call's signature; a float window or padding equal to an
    earlier call's int one is refused as in a fresh process (it had been taken as that call)."""
    x = np.zeros((1, 6, 6, 8), np.uint8)
    pool2d(x, 2)
    pool2d(x, 2, padding=0)
    with pytest.raises(ValueError, match="kernel: expected 2 integer"):
        pool2d(x, 2.0)
    with pytest.raises(ValueError, match="padding: expected an integer"):
        pool2d(x, 2, padding=0.0)
