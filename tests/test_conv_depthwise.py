"""Depthwise convolution: bit-exact against the numpy model on every executable ISA path.

The model (``primitives.conv_ref.depthwise_ref``): the exact sums
``sum (x - zp_src) * w`` in int64 over the valid taps (padding contributes nothing),
wrapped to int32, then ``primitives.reference.output_pipeline`` on the (pixels x
channels) matrix: the same f32 operations in the same order as the generated output
stage, so every dst type is compared bit for bit. The kernel's arithmetic is exact on
every ISA, so the overflow policies all give this result.

Kernel generation (PeachPy) dominates a cold run, so the property test draws its
attribute structure from a few profiles (each is one kernel per ISA path) while shapes,
strides, dilations, paddings and every value are drawn freely.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from primitives.attr import Attr, PostOps
from primitives.conv_depthwise import DepthwiseConvDesc
from primitives.conv_ref import conv_sum, depthwise_ref, depthwise_sums
from primitives.memory import Memory, desc
from primitives.reorder import reorder_desc
from tests.conftest import assert_same_bits

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
NP = {"u8": np.uint8, "s8": np.int8, "s32": np.int32, "f32": np.float32}

# Attribute profiles: src type, src zp, weights scale mask (None: no scale), src scale,
# bias type, post-ops (kind, alg, arg), dst scale, dst zp mask, dst type.
PROFILES = {
    "plain_s32": dict(src="u8", zp=False, wmask=None, s_src=False, bias=None, post=(), s_dst=False, zp_dst=None,
                      dst="s32"),
    "mobilenet_u8": dict(src="s8", zp=True, wmask=1, s_src=True, bias="f32", post=(("eltwise", "relu", 0.0, 0.0),),
                         s_dst=False, zp_dst=0, dst="u8"),
    "resblock_s8": dict(src="u8", zp=True, wmask=0, s_src=False, bias="s32",
                        post=(("sum", 0.5, 2), ("binary", "add", "full"), ("binary", "mul", "col")), s_dst=True,
                        zp_dst=2, dst="s8"),
    # u8 without zero point: the broadcast VPDPBUSD ("dot") blocks on avx512_core_vnni
    "u8_fused": dict(src="u8", zp=False, wmask=1, s_src=True, bias="f32",
                     post=(("eltwise", "relu", 0.0, 0.0), ("binary", "add", "full"), ("binary", "min", "row")),
                     s_dst=True, zp_dst=2, dst="u8"),
    "float_out": dict(src="s8", zp=False, wmask=3, s_src=True, bias=None,
                      post=(("eltwise", "tanh", 0.0, 0.0), ("binary", "max", "common"), ("binary", "sub", "row")),
                      s_dst=False, zp_dst=None, dst="f32"),
}


def _rand(rng, dt, shape):
    lo, hi = {"u8": (0, 256), "s8": (-128, 128)}[dt]
    return rng.integers(lo, hi, shape).astype(NP[dt])


@st.composite
def problems(draw):
    k = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    dil = (draw(st.integers(0, 1)), draw(st.integers(0, 1)))
    pl = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    pr = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    # spatial 1..16, at least the window's extent within the padded input
    hw = []
    for d in range(2):
        extent = (k[d] - 1) * (dil[d] + 1) + 1
        hw.append(draw(st.integers(max(1, extent - pl[d] - pr[d]), 16)))
    return dict(N=draw(st.integers(1, 4)), C=draw(st.integers(1, 100)), H=hw[0], W=hw[1], k=k, dil=dil, pl=pl,
                pr=pr, strides=(draw(st.integers(1, 2)), draw(st.integers(1, 2))),
                profile=draw(st.sampled_from(sorted(PROFILES))), zp=draw(st.integers(-20, 300)),
                seed=draw(st.integers(0, 2**31)), threads=draw(st.integers(1, 2)),
                policy=draw(st.sampled_from(["exact", "faithful", "halve_weights"])))


def run_case(p, isa, weights_tag="goihw", zp_value=None):
    """Build, run, and return (dst, model) for problem ``p`` on ``isa``."""
    prof = PROFILES[p["profile"]]
    rng = np.random.default_rng(p["seed"])
    N, C, H, W = p["N"], p["C"], p["H"], p["W"]
    KH, KW = p["k"]
    x = _rand(rng, prof["src"], (N, H, W, C))
    w = _rand(rng, "s8", (C, 1, 1, KH, KW))
    sums = depthwise_sums(x, w, 0, p["strides"], p["pl"], p["pr"], p["dil"])
    OH, OW = sums.shape[1:3]
    scales, zps, args, model = {}, {}, {}, {}
    zp_src = 0
    if prof["zp"]:
        zps["src"] = 0
        zp_src = p["zp"] if zp_value is None else zp_value
        args["zero_points:src"] = np.int32([zp_src])
    s_src = s_wei = None
    if prof["s_src"]:
        scales["src"] = 0
        s_src = np.float32(rng.uniform(0.01, 0.1))
        args["scales:src"] = np.float32([s_src])
    if prof["wmask"] is not None:
        scales["weights"] = prof["wmask"]
        s_wei = rng.uniform(0.001, 0.05, C if prof["wmask"] else 1).astype(np.float32)
        args["scales:weights"] = s_wei
    if s_src is not None or s_wei is not None:
        model["scale"] = np.float32(1 if s_src is None else s_src) * (np.float32([1]) if s_wei is None else s_wei)
    if prof["s_dst"]:
        scales["dst"] = 0
        args["scales:dst"] = np.float32([rng.uniform(0.5, 4)])
        model["dst_scale"] = args["scales:dst"][0]
    if prof["zp_dst"] is not None:
        zps["dst"] = prof["zp_dst"]
        zp_dst = rng.integers(-4, 5, C if prof["zp_dst"] else 1).astype(np.int32)
        args["zero_points:dst"] = zp_dst
        model["dst_zp"] = zp_dst.astype(np.float32)
    po, post = PostOps(), []
    for i, e in enumerate(prof["post"]):
        if e[0] == "eltwise":
            po.eltwise(*e[1:])
            post.append(e)
        elif e[0] == "sum":
            po.sum(e[1], e[2])
            post.append(e)
        else:
            dims = {"common": (1, 1, 1, 1), "col": (1, C, 1, 1), "row": (N, 1, OH, OW), "full": (N, C, OH, OW)}[e[2]]
            po.binary(e[1], desc(dims, "f32", "nhwc"))
            src1 = rng.uniform(-3, 3, (dims[0], dims[2], dims[3], dims[1])).astype(np.float32)  # nhwc
            args[f"post_op:{i}:src_1"] = src1
            post.append(("binary", e[1], src1.reshape(-1, dims[1]) if e[2] in ("full", "row") else
                         src1.reshape(1, -1)))
    model["post_ops"] = post
    bias_md = None
    if prof["bias"] is not None:
        bias = (rng.uniform(-50, 50, C) if prof["bias"] == "f32" else rng.integers(-500, 500, C)).astype(
            NP[prof["bias"]])
        bias_md = desc((C,), prof["bias"], "a")
        args["bias"] = bias
        model["bias"] = bias.astype(np.float32)
    dst_dt = prof["dst"]
    attr = Attr(scales=scales, zero_points=zps, post_ops=po, policy=p["policy"])
    pd = DepthwiseConvDesc(desc((N, C, H, W), prof["src"], "nhwc"), desc((C, 1, 1, KH, KW), "s8", weights_tag),
                           desc((N, C, OH, OW), dst_dt, "any"), bias_md, strides=p["strides"], padding_l=p["pl"],
                           padding_r=p["pr"], dilation=p["dil"], attr=attr, isa=isa, threads=p["threads"])
    if weights_tag == "any":
        wmem = Memory(pd.weights_desc())
        reorder_desc(desc((C, 1, 1, KH, KW), "s8", "goihw"), pd.weights_desc()).create().execute(
            {"src": w, "dst": wmem})
        args["weights"] = wmem
    else:
        args["weights"] = w
    old = (rng.integers(-100, 100, (N, OH, OW, C)) if dst_dt != "u8" else rng.integers(0, 255, (N, OH, OW, C)))
    dst = old.astype(NP[dst_dt])
    model["dst_old"] = dst.copy()
    args.update(src=x, dst=dst)
    pd.create().execute(args)
    plain = p["profile"] == "plain_s32"
    want = depthwise_ref(x, w, zp_src=zp_src, strides=p["strides"], padding_l=p["pl"], padding_r=p["pr"],
                         dilation=p["dil"], dst_dt=dst_dt, plain=plain, **({} if plain else model))
    return dst, want, pd


@SETTINGS
@given(p=problems())
def test_matches_model(isa_path, p):
    dst, want, _ = run_case(p, isa_path)
    assert_same_bits(dst, want)


BASE = dict(N=1, C=37, H=9, W=11, k=(3, 3), dil=(0, 0), pl=(1, 1), pr=(1, 1), strides=(1, 1), zp=0, seed=1,
            threads=1, policy="exact")


@settings(max_examples=40, deadline=None)
@given(p=problems())
def test_model_agrees_with_the_grouped_convolution_model(p):
    """The depthwise model (vectorised over channels, taps skipped outside the image) and
    conv_ref.conv_sum (im2col per group, the padding holding the zero point): two ways to
    the same exact sums."""
    rng = np.random.default_rng(p["seed"])
    x = _rand(rng, PROFILES[p["profile"]]["src"], (p["N"], p["H"], p["W"], p["C"]))
    w = _rand(rng, "s8", (p["C"], 1, 1) + p["k"])
    info = np.iinfo(x.dtype)  # conv_sum pads with the zero point in the source's type
    zp = int(np.clip(p["zp"] if x.dtype == np.uint8 else p["zp"] - 140, info.min, info.max))
    got = depthwise_sums(x, w, zp, p["strides"], p["pl"], p["pr"], p["dil"])
    want = conv_sum(np.moveaxis(x, -1, 1), w, p["strides"], p["pl"], p["pr"], p["dil"], zp)
    np.testing.assert_array_equal(got, np.moveaxis(want, 1, -1))


@pytest.mark.parametrize("zp", [-32512, 32640, 32641, 40000, -70000, 2**31 - 1, -2**31])
def test_far_source_zero_points(isa_path, zp):
    """Zero points beyond s16 reach of x - zp take the VPMULLD route; still exact (mod 2^32)."""
    p = dict(BASE, profile="resblock_s8", C=21, pl=(2, 0), pr=(0, 2))
    dst, want, _ = run_case(p, isa_path, zp_value=zp)
    np.testing.assert_array_equal(dst, want)


def test_s32_sums_exact_extremes(isa_path):
    """255 * -128 and -128 * -128 over a 5x5 window under the faithful policy: the plain
    s32 result is the exact sum (no VPMADDUBSW saturation on any path)."""
    for src_dt, value in (("u8", 255), ("s8", -128)):
        C = 33
        x = np.full((1, 6, 7, C), value, NP[src_dt])
        w = np.full((C, 1, 1, 5, 5), -128, np.int8)
        w[::2] = 127
        pd = DepthwiseConvDesc(desc((1, C, 6, 7), src_dt, "nhwc"), desc((C, 1, 1, 5, 5), "s8", "goihw"),
                               desc((1, C, 4, 5), "s32", "nhwc"), padding_l=(1, 1), padding_r=(1, 1),
                               attr=Attr(policy="faithful"), isa=isa_path)
        y = np.zeros((1, 4, 5, C), np.int32)
        pd.create().execute({"src": x, "weights": w, "dst": y})
        want = depthwise_sums(x, w, 0, (1, 1), (1, 1), (1, 1), (0, 0))
        np.testing.assert_array_equal(y, want)
        assert want.min() < -32768 * 4  # far beyond s16
    assert pd.impl_info()["exact"] is True


def test_packed_weights_and_layouts(isa_path):
    """Weights through reorder into the packed layout (tag any), or in another plain tag,
    or 4-D (C, 1, KH, KW): the same result as goihw."""
    p = dict(BASE, profile="resblock_s8", C=45, k=(3, 2), pl=(0, 1), pr=(2, 0), strides=(2, 1), dil=(1, 0))
    ref, want, _ = run_case(p, isa_path)
    np.testing.assert_array_equal(ref, want)
    packed, want2, pd = run_case(p, isa_path, weights_tag="any")
    assert pd.weights_desc().is_packed
    np.testing.assert_array_equal(packed, want2)
    rng = np.random.default_rng(3)
    C, KH, KW = 19, 3, 3
    x = _rand(rng, "u8", (2, 5, 6, C))
    w = _rand(rng, "s8", (C, 1, 1, KH, KW))
    want = depthwise_sums(x, w, 0, (1, 1), (1, 1), (1, 1), (0, 0))
    for md, arr in ((desc((C, 1, 1, KH, KW), "s8", "abdec"), np.ascontiguousarray(w.transpose(0, 1, 3, 4, 2))),
                    (desc((C, 1, KH, KW), "s8", "hwio"), np.ascontiguousarray(w[:, 0].transpose(2, 3, 1, 0)))):
        pd = DepthwiseConvDesc(desc((2, C, 5, 6), "u8", "any"), md, desc((2, C, 5, 6), "s32", "nhwc"),
                               padding_l=(1, 1), padding_r=(1, 1), isa=isa_path)
        y = np.zeros((2, 5, 6, C), np.int32)
        pd.create().execute({"src": x, "weights": arr, "dst": y})
        np.testing.assert_array_equal(y, want)


def test_zero_point_routes_share_one_primitive(isa_path):
    """A u8 source whose zero point changes between calls: 0 (the dot kernel on
    avx512_core_vnni, reading the second weights section), s16 and s32 reach (widening
    kernels, first section), and 0 again; plain and packed weights; every result exact."""
    rng = np.random.default_rng(11)
    N, C, H, W = 1, 50, 7, 19
    x = _rand(rng, "u8", (N, H, W, C))
    w = _rand(rng, "s8", (C, 1, 1, 3, 3))
    attr = Attr(zero_points={"src": 0}, scales={"weights": 1}, post_ops=PostOps().eltwise("relu"))
    prims = []
    for tag in ("any", "goihw"):
        pd = DepthwiseConvDesc(desc((N, C, H, W), "u8", "nhwc"), desc((C, 1, 1, 3, 3), "s8", tag),
                               desc((N, C, H, W), "f32", "nhwc"), padding_l=(1, 1), padding_r=(1, 1), attr=attr,
                               isa=isa_path)
        weights = w
        if tag == "any":
            weights = Memory(pd.weights_desc())
            reorder_desc(desc((C, 1, 1, 3, 3), "s8", "goihw"), pd.weights_desc()).create().execute(
                {"src": w, "dst": weights})
        prims.append((pd.create(), weights))
    scale = rng.uniform(0.01, 0.1, C).astype(np.float32)
    for zp in (0, 7, 0, 40000, 0):
        want = depthwise_ref(x, w, zp_src=zp, padding_l=(1, 1), padding_r=(1, 1), dst_dt="f32", scale=scale,
                             post_ops=[("eltwise", "relu", 0.0, 0.0)])
        for prim, weights in prims:
            y = np.zeros((N, H, W, C), np.float32)
            prim.execute({"src": x, "weights": weights, "dst": y, "zero_points:src": np.int32([zp]),
                          "scales:weights": scale})
            np.testing.assert_array_equal(y.view(np.int32), want.view(np.int32))


def test_kernels_cached_by_structure_not_size():
    """Channels, image sizes and KH are run-time values: one kernel serves them all; the
    window along W (KW, stride, dilation) and the block size shape the code."""
    from jit import cache

    def pd(c, h, w, kh, kw, stride=1):
        return DepthwiseConvDesc(desc((1, c, h, w), "u8", "nhwc"), desc((c, 1, 1, kh, kw), "s8", "goihw"),
                                 desc((1, c, (h - kh) // stride + 1, (w - kw) // stride + 1), "s32", "nhwc"),
                                 strides=(stride, stride))

    same = [pd(c, h, 16, kh, 3) for c, h, kh in ((8, 9, 3), (100, 12, 5), (33, 8, 1))]
    assert len({p.spec.pixels for p in same}) == 1
    kernels = {id(cache.get_kernel(("depthwise", p.spec), lambda: None)) for p in same}
    assert len(kernels) == 1
    other = [pd(8, 9, 16, 3, 5), pd(8, 9, 17, 3, 3, stride=2)]
    assert len({p.spec for p in same[:1] + other}) == 3


def test_threads_and_user_scratchpad(isa_path):
    """Two threads per call, and one primitive run from two threads at once with their own
    user scratchpads (the mobilenet_u8 profile's attributes): every result equals the model."""
    from concurrent.futures import ThreadPoolExecutor

    C, H, W = 40, 16, 13
    attr = Attr(scales={"src": 0, "weights": 1}, zero_points={"src": 0, "dst": 0}, scratchpad_mode="user",
                post_ops=PostOps().eltwise("relu"))
    pd = DepthwiseConvDesc(desc((2, C, H, W), "s8", "nhwc"), desc((C, 1, 1, 3, 3), "s8", "goihw"),
                           desc((2, C, H, W), "u8", "nhwc"), desc((C,), "f32", "a"), padding_l=(1, 1),
                           padding_r=(1, 1), attr=attr, isa=isa_path, threads=2)
    assert pd.scratchpad_desc().nbytes > 0
    prim = pd.create()

    def job(seed):
        r = np.random.default_rng(seed)
        x, w = _rand(r, "s8", (2, H, W, C)), _rand(r, "s8", (C, 1, 1, 3, 3))
        s, b = r.uniform(0.001, 0.01, C).astype(np.float32), r.uniform(-9, 9, C).astype(np.float32)
        zp, zp_dst = int(r.integers(-128, 128)), int(r.integers(0, 9))
        y = np.zeros((2, H, W, C), np.uint8)
        pad = np.zeros(pd.scratchpad_desc().nbytes, np.uint8)
        for _ in range(5):
            prim.execute({"src": x, "weights": w, "dst": y, "bias": b, "scales:src": np.float32([0.5]),
                          "scales:weights": s, "zero_points:src": np.int32([zp]),
                          "zero_points:dst": np.int32([zp_dst]), "scratchpad": pad})
        want = depthwise_ref(x, w, zp_src=zp, padding_l=(1, 1), padding_r=(1, 1), dst_dt="u8",
                             scale=np.float32(0.5) * s, bias=b, post_ops=[("eltwise", "relu", 0.0, 0.0)],
                             dst_zp=np.float32(zp_dst))
        return np.array_equal(y, want)

    with ThreadPoolExecutor(2) as pool:
        assert all(pool.map(job, range(4)))


@pytest.mark.parametrize("where", ["end", "start"])
def test_guard_pages(isa_path, guarded, where):
    """src, dst, plain weights, bias and binary operands against a PROT_NONE page, with
    every kind of channel tail (the resblock_s8 and plain_s32 profiles' kernels): any
    access past a buffer faults."""
    rng = np.random.default_rng(7)
    N, H, W, K, OH, OW = 1, 5, 4, 3, 5, 4
    for C in (1, 3, 7, 8, 13, 16, 17, 31, 40, 49):
        for plain in (False, True):
            dst_dt = "s32" if plain else "s8"
            x = guarded(N * H * W * C, np.uint8, where).reshape(N, H, W, C)
            x[:] = _rand(rng, "u8", x.shape)
            w = guarded(C * K * K, np.int8, where).reshape(C, 1, 1, K, K)
            w[:] = _rand(rng, "s8", w.shape)
            y = guarded(N * OH * OW * C, NP[dst_dt], where).reshape(N, OH, OW, C)
            y[:] = 3
            args = {"src": x, "weights": w, "dst": y}
            kw = {}
            if not plain:
                b = guarded(C, np.int32, where)
                b[:] = rng.integers(-50, 50, C)
                full = guarded(N * OH * OW * C, np.float32, where).reshape(N, OH, OW, C)
                full[:] = rng.uniform(-2, 2, full.shape)
                col = guarded(C, np.float32, where).reshape(1, 1, 1, C)
                col[:] = 0.5
                zp_dst = guarded(C, np.int32, where)
                zp_dst[:] = rng.integers(-3, 3, C)
                po = PostOps().sum(0.5, 2).binary("add", desc((N, C, OH, OW), "f32", "nhwc")).binary(
                    "mul", desc((1, C, 1, 1), "f32", "nhwc"))
                kw = dict(bias_md=desc((C,), "s32", "a"), attr=Attr(scales={"weights": 0, "dst": 0},
                                                                      zero_points={"src": 0, "dst": 2}, post_ops=po))
                args.update({"bias": b, "scales:weights": np.float32([0.25]), "scales:dst": np.float32([1.5]),
                             "zero_points:src": np.int32([5]), "zero_points:dst": zp_dst, "post_op:1:src_1": full,
                             "post_op:2:src_1": col})
            pd = DepthwiseConvDesc(desc((N, C, H, W), "u8", "nhwc"), desc((C, 1, 1, K, K), "s8", "goihw"),
                                   desc((N, C, OH, OW), dst_dt, "nhwc"), padding_l=(1, 1), padding_r=(1, 1),
                                   isa=isa_path, threads=1, **kw)
            old = y.copy()
            pd.create().execute(args)
            if plain:
                want = depthwise_ref(x, w, padding_l=(1, 1), padding_r=(1, 1), plain=True)
            else:
                want = depthwise_ref(x, w, zp_src=5, padding_l=(1, 1), padding_r=(1, 1), dst_dt=dst_dt,
                                     scale=np.float32(0.25), bias=b.astype(np.float32), dst_old=old,
                                     post_ops=[("sum", 0.5, 2), ("binary", "add", full.reshape(-1, C)),
                                               ("binary", "mul", col.reshape(1, C))], dst_scale=np.float32(1.5),
                                     dst_zp=zp_dst.astype(np.float32))
            np.testing.assert_array_equal(y, want)


def _descs():
    return desc((1, 8, 6, 6), "u8", "nhwc"), desc((8, 1, 1, 3, 3), "s8", "goihw"), desc((1, 8, 4, 4), "u8", "nhwc")


@pytest.mark.parametrize("bad, arg", [
    ("groups", "weights"), ("window", "weights"), ("negative_padding", "padding_l"), ("layout", "src"),
    ("dst_dims", "dst"), ("wei_scale_mask", "scales:weights"), ("wei_zp", "zero_points:weights"),
    ("binary_dims", "post_ops"), ("binary_layout", "post_ops"), ("src_dt", "src"), ("strides", "strides"),
    ("dilation", "dilation"), ("bias", "bias"), ("scale_count", "scales:weights"), ("packed_payload", "weights"),
])
def test_bad_input(bad, arg):
    src, wei, dst = _descs()
    kw = {}
    if bad == "groups":
        wei = desc((4, 2, 1, 3, 3), "s8", "goihw")
    elif bad == "window":
        src, dst = desc((1, 8, 2, 6), "u8", "nhwc"), desc((1, 8, 1, 4), "u8", "nhwc")
    elif bad == "negative_padding":
        kw["padding_l"] = (-1, 0)
    elif bad == "layout":
        src = desc((1, 8, 6, 6), "u8", "nchw")
    elif bad == "dst_dims":
        dst = desc((1, 8, 5, 4), "u8", "nhwc")
    elif bad == "wei_scale_mask":
        kw["attr"] = Attr(scales={"weights": 4})
    elif bad == "wei_zp":
        kw["attr"] = Attr(zero_points={"weights": 0})
    elif bad == "binary_dims":
        kw["attr"] = Attr(post_ops=PostOps().binary("add", desc((1, 8, 4, 1), "f32", "nhwc")))
    elif bad == "binary_layout":
        kw["attr"] = Attr(post_ops=PostOps().binary("add", desc((1, 8, 4, 4), "f32", "nchw")))
    elif bad == "src_dt":
        src = desc((1, 8, 6, 6), "f32", "nhwc")
    elif bad == "strides":
        kw["strides"] = (0, 1)
    elif bad == "dilation":
        kw["dilation"] = (-1, 0)
    elif bad == "bias":
        kw["bias_md"] = desc((7,), "f32", "a")
    if bad == "scale_count":
        pd = DepthwiseConvDesc(src, wei, dst, attr=Attr(scales={"weights": 1}))
        with pytest.raises(ValueError, match=arg):
            pd.create().execute({"src": np.zeros((1, 6, 6, 8), np.uint8), "weights": np.zeros((8, 1, 1, 3, 3), np.int8),
                                 "dst": np.zeros((1, 4, 4, 8), np.uint8), "scales:weights": np.ones(3, np.float32)})
        return
    if bad == "packed_payload":
        pd = DepthwiseConvDesc(src, desc((8, 1, 1, 3, 3), "s8", "any"), dst)
        with pytest.raises(ValueError, match=arg):
            pd.create().execute({"src": np.zeros((1, 6, 6, 8), np.uint8), "weights": Memory(pd.weights_desc()),
                                 "dst": np.zeros((1, 4, 4, 8), np.uint8)})
        return
    with pytest.raises(ValueError, match=arg):
        DepthwiseConvDesc(src, wei, dst, **kw)


@pytest.mark.parametrize("strides", [0, (), (0, 1), (1,)])
def test_convolution_desc_refuses_bad_strides_for_depthwise_layers_too(strides):
    """ConvolutionDesc tries the depthwise kernel first with the general path's defaults;
    a falsy bad value (0, ()) had been taken as "not given" there, and run at stride 1."""
    from primitives.conv import ConvolutionDesc

    src, wei, dst = _descs()
    with pytest.raises(ValueError, match=r"^strides: expected 2 integers >= 1"):
        ConvolutionDesc(src, wei, dst, strides=strides)


@pytest.mark.parametrize("padding_l,padding_r,out", [(1, 0, 5), (1, (0, 0), 5), ((1, 1), None, 6), (None, None, 4)])
def test_convolution_desc_takes_depthwise_paddings_as_the_general_path_does(padding_l, padding_r, out):
    """An int padding (or padding_r left out: padding_l's) reaches the depthwise kernel as
    the general path reads it (padding_r=0 had been replaced by padding_l there)."""
    from primitives.conv import ConvolutionDesc

    src, wei, _ = _descs()
    pd = ConvolutionDesc(src, wei, desc((1, 8, out, out), "u8", "nhwc"), padding_l=padding_l, padding_r=padding_r)
    assert pd.impl_info()["impl"].startswith("depthwise:")


def test_impl_info_and_policies():
    src, wei, dst = _descs()
    for policy in ("exact", "faithful", "halve_weights"):
        info = DepthwiseConvDesc(src, wei, dst, attr=Attr(policy=policy)).impl_info()
        assert info["exact"] is True and info["impl"].startswith("depthwise:") and info["kind"] == "convolution"


def test_verbose_exec_lines_follow_the_environment(monkeypatch, capsys):
    """The fast path reads INT8JIT_VERBOSE its own way (primitives.conv_depthwise._verbose_exec):
    setting, clearing and setting it again between calls turns exec lines on and off."""
    src, wei, dst = _descs()
    prim = DepthwiseConvDesc(src, wei, dst).create()
    args = {"src": np.ones((1, 6, 6, 8), np.uint8), "weights": np.ones((8, 1, 1, 3, 3), np.int8),
            "dst": np.zeros((1, 4, 4, 8), np.uint8)}
    lines = []
    for value in ("exec", None, "exec", "0"):
        if value is None:
            monkeypatch.delenv("INT8JIT_VERBOSE", raising=False)
        else:
            monkeypatch.setenv("INT8JIT_VERBOSE", value)
        prim.execute(args)
        lines.append(capsys.readouterr().err.count("int8jit_verbose,exec,"))
    assert lines == [1, 0, 1, 0]
    np.testing.assert_array_equal(args["dst"], 9)


@pytest.mark.parametrize("tag", ["abdc", "dcba", "bcda", "cdab", "acdb", "abcd"])
def test_per_pixel_binary_operand_in_any_tag(tag):
    """A per-pixel (N, 1, OH, OW) binary operand whose pixels are not in dst's order (W
    outer to H) goes to the general convolution, which reads any tag; it had been read
    as if in dst's order by the depthwise kernel."""
    from primitives.conv import ConvolutionDesc

    N, C, H, W = 1, 4, 2, 3
    pd = ConvolutionDesc(desc((N, C, H, W), "u8", "nhwc"), desc((C, 1, 1, 1, 1), "s8", "goihw"),
                         desc((N, C, H, W), "f32", "nhwc"),
                         attr=Attr(post_ops=PostOps().binary("add", desc((N, 1, H, W), "f32", tag))))
    in_pixel_order = tag.index("c") < tag.index("d")
    assert (type(pd).__name__ == "DepthwiseConvDesc") == in_pixel_order
    logical = np.arange(N * H * W, dtype=np.float32).reshape(N, 1, H, W)
    dst = np.zeros((N, H, W, C), np.float32)
    pd.create().execute({"src": np.zeros((N, H, W, C), np.uint8), "weights": np.zeros((C, 1, 1, 1, 1), np.int8),
                         "dst": dst, "post_op:0:src_1": np.ascontiguousarray(
                             logical.transpose([ord(c) - ord("a") for c in tag]))})
    np.testing.assert_array_equal(dst, np.broadcast_to(logical.transpose(0, 2, 3, 1), dst.shape))
