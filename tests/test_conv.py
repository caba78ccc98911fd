"""Convolution: bit-exact against the numpy model (im2col + the GEMM model + the output pipeline)."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from primitives.attr import Attr, PostOps
from primitives.conv import ConvolutionDesc
from primitives.conv_ref import conv_sum
from primitives.memory import Memory, desc
from primitives.reference import output_pipeline
from runtime.ffi import ffi
from runtime.isa import LADDER
from primitives.reorder import reorder_desc
from tests.conftest import assert_same_bits, faithful_model, in_threads

SETTINGS = settings(max_examples=int(os.environ.get("INT8JIT_TEST_EXAMPLES", "25")), deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
NP = {"u8": np.uint8, "s8": np.int8, "s32": np.int32, "f32": np.float32}
TAGS = {3: ("nwc", "ncw"), 4: ("nhwc", "nchw"), 5: ("ndhwc", "ncdhw")}


def _rand(rng, dt, shape):
    lo, hi = {"u8": (0, 256), "s8": (-128, 128)}[dt]
    return rng.integers(lo, hi, shape).astype(NP[dt])


def _physical(x, tag):
    """The logical (N, C, ...) array laid out as ``tag``."""
    return np.ascontiguousarray(np.moveaxis(x, 1, -1)) if tag in ("nwc", "nhwc", "ndhwc") else x


def _to_rows(v):
    """(N, C, *S) -> (pixels, C)."""
    return np.moveaxis(v, 1, -1).reshape(-1, v.shape[1])


def _out_size(size, ker, strides, dil, pad_l, pad_r) -> tuple:
    """The output's spatial dims (oneDNN's convention: dilation 0 is dense)."""
    return tuple((s + a + b - ((k - 1) * (d + 1) + 1)) // t + 1
                 for s, k, t, d, a, b in zip(size, ker, strides, dil, pad_l, pad_r))


@st.composite
def problems(draw):
    sp = draw(st.sampled_from([1, 2, 2, 2, 3]))
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    icg, ocg = draw(st.integers(1, 12)), draw(st.integers(1, 40))
    ker = tuple(draw(st.integers(1, 3)) for _ in range(sp))
    dil = tuple(draw(st.integers(0, 1)) for _ in range(sp))
    pad_l = tuple(draw(st.integers(0, 3)) for _ in range(sp))  # (3: wider than some windows)
    pad_r = tuple(draw(st.integers(0, 3)) for _ in range(sp))
    strides = tuple(draw(st.integers(1, 2)) for _ in range(sp))
    size = []
    for i in range(sp):
        extent = (ker[i] - 1) * (dil[i] + 1) + 1
        size.append(draw(st.integers(max(1, extent - pad_l[i] - pad_r[i]), 9 if sp < 3 else 5)))
    post = []
    if draw(st.booleans()):
        post.append(("eltwise", "relu", 0.0, 0.0))
    if draw(st.booleans()):
        post.append(("sum", draw(st.sampled_from([1.0, 0.5])), draw(st.integers(-3, 3))))
    if draw(st.booleans()):
        post.append(("binary", draw(st.sampled_from(["add", "mul"])), draw(st.sampled_from(["common", "col",
                                                                                             "full"]))))
    return dict(sp=sp, groups=groups, icg=icg, ocg=ocg, ker=ker, dil=dil, pad_l=pad_l, pad_r=pad_r,
                strides=strides, size=tuple(size), n=draw(st.integers(1, 2)),
                src_dt=draw(st.sampled_from(["u8", "s8"])), dst_dt=draw(st.sampled_from(list(NP))),
                zp_src=draw(st.sampled_from([None, 0, 5])), wscale=draw(st.sampled_from([None, 0, "oc"])),
                s_src=draw(st.sampled_from([None, 0.25])), zp_dst=draw(st.sampled_from([None, 3, -2])),
                bias=draw(st.booleans()), post=post, layout=draw(st.integers(0, 1)),
                policy=draw(st.sampled_from(["exact", "faithful", "halve_weights"])),
                packed=draw(st.booleans()), seed=draw(st.integers(0, 2**31)),
                weights=draw(st.sampled_from(["random", "random", "sparse"])))


def run_case(p, isa):
    rng = np.random.default_rng(p["seed"])
    sp, G, icg, ocg = p["sp"], p["groups"], p["icg"], p["ocg"]
    IC, OC, N = G * icg, G * ocg, p["n"]
    x = _rand(rng, p["src_dt"], (N, IC) + p["size"])
    wshape = ((G, ocg, icg) if G > 1 else (OC, IC)) + p["ker"]
    w = _rand(rng, "s8", wshape)
    if p.get("weights") == "sparse":  # |w| <= 64 but a few large values: exact splits them into
        w = rng.integers(-64, 65, wshape).astype(np.int8)  # residual cells (tests/test_gemm_split.py)
        large = rng.random(wshape) < rng.choice([0.003, 0.02])
        w[large] = rng.choice(np.array([127, -128, 110], np.int8), int(large.sum()))
        if rng.integers(2):  # sources at the top of their range: the large pairs saturate VPMADDUBSW
            x[...] = 255 if p["src_dt"] == "u8" else 127
    out = _out_size(p["size"], p["ker"], p["strides"], p["dil"], p["pad_l"], p["pad_r"])
    tag = TAGS[sp + 2][p["layout"]]
    wtag = "abcdefg"[:len(wshape)]
    scales_, zps, args = {}, {}, {}
    s_src = p["s_src"]
    if s_src is not None:
        scales_["src"] = 0
        args["scales:src"] = np.float32([s_src])
    s_w = None
    if p["wscale"] is not None:
        per_oc = p["wscale"] == "oc"
        scales_["weights"] = (3 if G > 1 else 1) if per_oc else 0
        s_w = rng.uniform(0.01, 0.1, OC if per_oc else 1).astype(np.float32)
        args["scales:weights"] = s_w
    if p["zp_src"] is not None:
        zps["src"] = 0
        args["zero_points:src"] = np.int32([p["zp_src"]])
    zp_dst = None
    if p["zp_dst"] is not None:
        zps["dst"] = 0
        zp_dst = np.int32([p["zp_dst"]])
        args["zero_points:dst"] = zp_dst
    dst_dims = (N, OC) + out
    po, model_post = PostOps(), []
    for i, e in enumerate(p["post"]):
        if e[0] == "eltwise":
            po.eltwise(*e[1:])
            model_post.append(e)
        elif e[0] == "sum":
            po.sum(e[1], e[2])
            model_post.append(e)
        else:
            dims = {"common": (1,) * len(dst_dims), "col": (1, OC) + (1,) * sp, "full": dst_dims}[e[2]]
            po.binary(e[1], desc(dims, "f32", "abcdefg"[:len(dims)]))
            src1 = rng.uniform(-2, 2, dims).astype(np.float32)
            args[f"post_op:{i}:src_1"] = src1
            model_post.append(("binary", e[1], _to_rows(np.broadcast_to(src1, dst_dims))))
    attr = Attr(scales=scales_, zero_points=zps, post_ops=po, policy=p["policy"])
    bias = rng.uniform(-20, 20, OC).astype(np.float32) if p["bias"] else None
    if bias is not None:
        args["bias"] = bias
    pd = ConvolutionDesc(desc((N, IC) + p["size"], p["src_dt"], tag), desc(wshape, "s8", "any" if p["packed"]
                                                                             else wtag),
                         desc(dst_dims, p["dst_dt"], tag), None if bias is None else desc((OC,), "f32", "a"),
                         strides=p["strides"], padding_l=p["pad_l"], padding_r=p["pad_r"], dilation=p["dil"],
                         attr=attr, isa=isa, threads=1 + p["seed"] % 2)
    if p["packed"]:
        wmem = Memory(pd.weights_desc())
        reorder_desc(desc(wshape, "s8", wtag), pd.weights_desc()).create().execute({"src": w, "dst": wmem})
        args["weights"] = wmem
    else:
        args["weights"] = w
    lo, hi = {"u8": (0, 255), "s8": (-100, 100), "s32": (-100, 100), "f32": (-100, 100)}[p["dst_dt"]]
    old = rng.integers(lo, hi, dst_dims).astype(NP[p["dst_dt"]])
    dst = _physical(old, tag).copy()
    args.update(src=_physical(x, tag), dst=dst)
    prim = pd.create()
    prim.execute(args)
    # Again on new arrays of the same layouts (the replay moved to them where it can,
    # Replay.moves; else the full path): the same result, the first call's dst untouched.
    again = {k: v if isinstance(v, Memory) else v.copy(order="K") for k, v in args.items()}
    again["dst"] = _physical(old, tag).copy()
    first = dst.copy()
    prim.execute(again)
    np.testing.assert_array_equal(again["dst"], first)
    np.testing.assert_array_equal(dst, first)
    got = np.moveaxis(dst, -1, 1) if p["layout"] == 0 else dst  # layout 0 is channels-last
    # The depthwise kernel (groups == IC == OC) is exact under every policy.
    exact_impl = type(pd).__name__ == "DepthwiseConvDesc"
    halve = p["policy"] == "halve_weights" and not isa.endswith("vnni") and not exact_impl
    faithful = p["policy"] == "faithful" and faithful_model("faithful", isa) and not exact_impl
    v = conv_sum(x, w, p["strides"], p["pad_l"], p["pad_r"], p["dil"], p["zp_src"] or 0, faithful=faithful,
                 halve=halve)
    plain = (p["dst_dt"] == "s32" and not scales_ and not model_post and bias is None and zp_dst is None
             and not halve)
    rows = _to_rows(v)
    if plain:
        want = rows
    else:
        scale = None
        if s_src is not None or s_w is not None or halve:
            s = np.float32(1 if s_src is None else s_src) * (np.float32(2) if halve else np.float32(1))
            scale = s * (np.ones(1, np.float32) if s_w is None else np.repeat(s_w, OC // s_w.size))
        want = output_pipeline(rows, dst_dt=p["dst_dt"], scale=scale, bias=bias, post_ops=model_post,
                               dst_old=_to_rows(old), dst_zp=None if zp_dst is None else zp_dst.astype(np.float32))
    want = np.moveaxis(want.reshape((N,) + out + (OC,)), -1, 1)
    return got, want


@SETTINGS
@given(p=problems())
def test_conv_matches_model(isa_path, p):
    got, want = run_case(p, isa_path)
    assert_same_bits(got, want)


@st.composite
def wide_problems(draw):
    """2-D layers with tens to hundreds of channels, against caches drawn from a few cores'
    (the budgets primitives.conv plans with): where B tiles outgrow L1 or L2, so conv_tile
    trades vectors for rows, the source is read in place with edge strips or copied, and
    threads sweep their images by column-tile chunks. ``problems`` keeps channels small."""
    k = draw(st.sampled_from([1, 3, 3]))
    stride = draw(st.integers(1, 2))
    dil = draw(st.sampled_from([0, 0, 1])) if k == 3 else 0
    pad_l, pad_r = ((draw(st.integers(0, 1 + dil)), draw(st.integers(0, 1 + dil))) if k == 3 else (0, 0))
    size = draw(st.integers(max(1, (k - 1) * (dil + 1) + 1 - pad_l - pad_r), 14))
    post = [("eltwise", "relu", 0.0, 0.0)] if draw(st.booleans()) else []
    if draw(st.booleans()):
        post.append(("sum", 0.5, draw(st.integers(-3, 3))))
    if draw(st.booleans()):  # (a full operand makes the strips' edge columns one-row blocks)
        post.append(("binary", draw(st.sampled_from(["add", "mul"])), draw(st.sampled_from(["col", "full"]))))
    # (channels a multiple of 4 half the time: the edge strips need them)
    icg = draw(st.one_of(st.integers(40, 200), st.integers(10, 50).map(lambda q: 4 * q)))
    return dict(sp=2, groups=draw(st.sampled_from([1, 1, 1, 2])), icg=icg,
                ocg=draw(st.integers(8, 150)), ker=(k, k), dil=(dil, dil), pad_l=(pad_l, pad_l), pad_r=(pad_r, pad_r),
                strides=(stride, stride), size=(size, size), n=draw(st.integers(1, 3)),
                src_dt=draw(st.sampled_from(["u8", "s8"])), dst_dt=draw(st.sampled_from(list(NP))),
                zp_src=draw(st.sampled_from([None, 5])), wscale=draw(st.sampled_from([None, "oc"])), s_src=0.05,
                zp_dst=draw(st.sampled_from([None, 2])), bias=draw(st.booleans()), post=post,
                layout=draw(st.sampled_from([0, 0, 1])),
                policy=draw(st.sampled_from(["exact", "exact", "faithful", "halve_weights"])),
                packed=draw(st.booleans()), seed=draw(st.integers(0, 2**31)),
                weights=draw(st.sampled_from(["random", "sparse", "sparse"])),
                caches=draw(st.sampled_from([(32 << 10, 512 << 10), (48 << 10, 2 << 20), (32 << 10, 1 << 20),
                                             (16 << 10, 256 << 10)])))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(p=wide_problems())
def test_wide_conv_matches_model(isa_path, p):
    import primitives.conv_blocking as blocking
    from runtime.caches import DataCaches

    saved = blocking.L1_BUDGET, blocking.L2_BUDGET
    blocking.L1_BUDGET, blocking.L2_BUDGET = blocking.cache_budgets(
        DataCaches(l1d=p["caches"][0], l2=p["caches"][1], source="test"))
    try:
        got, want = run_case(p, isa_path)
    finally:
        blocking.L1_BUDGET, blocking.L2_BUDGET = saved
    assert_same_bits(got, want)


def test_resnet_3x3_block(isa_path):
    """A ResNet-style 3x3 layer (64 -> 64 at 14x14, pad 1) with u8 output, per-OC scales,
    bias, sum and relu: the shape class the benchmark runs, checked bit for bit."""
    p = dict(sp=2, groups=1, icg=64, ocg=64, ker=(3, 3), dil=(0, 0), pad_l=(1, 1), pad_r=(1, 1), strides=(1, 1),
             size=(14, 14), n=1, src_dt="u8", dst_dt="u8", zp_src=None, wscale="oc", s_src=0.05, zp_dst=None,
             bias=True, post=[("sum", 1.0, 0), ("eltwise", "relu", 0.0, 0.0)], layout=0, policy="exact",
             packed=True, seed=7)
    got, want = run_case(p, isa_path)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("chunked", [False, True])
def test_short_rows_and_l2_order(isa_path, chunked, monkeypatch):
    """Output rows of 5 pixels whose weights tile does not stay in L1 (96 channels x 3x3):
    conv_tile may trade vectors for rows (up to 9-row blocks); and with ``chunked`` the
    thread sweeps its two images once per column tile (the L2 order), bit for bit."""
    import primitives.conv_blocking as blocking

    if chunked:
        monkeypatch.setattr(blocking, "L2_BUDGET", 1)  # one chunk per column tile
    p = dict(sp=2, groups=1, icg=96, ocg=72, ker=(3, 3), dil=(0, 0), pad_l=(1, 1), pad_r=(1, 1), strides=(1, 1),
             size=(5, 5), n=2, src_dt="s8" if chunked else "u8", dst_dt="s8", zp_src=3, wscale="oc", s_src=0.05, zp_dst=2,
             bias=True, post=[("sum", 0.5, 1), ("binary", "add", "col"), ("eltwise", "relu", 0.0, 0.0)], layout=0,
             policy="faithful" if chunked else "exact", packed=True, seed=4)
    got, want = run_case(p, isa_path)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("n", [3, 5])
def test_edge_strips_two_threads_split_inside_an_image(isa_path, n, strips_always):
    """Edge strips with two threads and an odd batch: the work items (each image's inside
    columns, then its edge columns) split between the threads inside an image, so one
    thread's edge column reads a strip whose rows the other thread's inside item copies.
    Each thread now fills the strips of every item it takes first; before, the edge
    column read the strip unfilled (on this project's Zen 3 host, ResNet-50's res2 3x3 at
    batch 3 on two threads: one edge column of an image wrong). The same split with the
    edge columns in place (no strips, more and shorter items)."""
    from primitives.conv import ConvolutionDesc as Desc

    pd = Desc(desc((n, 64, 12, 12), "u8", "nhwc"), desc((24, 64, 3, 3), "s8", "any"),
              desc((n, 24, 12, 12), "s32", "nhwc"), padding_l=(1, 1), padding_r=(1, 1), isa=isa_path, threads=2)
    assert pd._strips is not None
    p = dict(sp=2, groups=1, icg=64, ocg=24, ker=(3, 3), dil=(0, 0), pad_l=(1, 1), pad_r=(1, 1), strides=(1, 1),
             size=(12, 12), n=n, src_dt="u8", dst_dt="s32", zp_src=None, wscale=None, s_src=None, zp_dst=None,
             bias=False, post=[], layout=0, policy="exact", packed=True, seed=9)  # odd seed: two threads
    got, want = run_case(p, isa_path)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("packed", [True, False])
def test_exact_widening_where_conv_tile_would_narrow(isa_path, packed):
    """96 -> 72 channels, 3x3 on 7x7 rows, exact, full-range weights: on AVX2 the widening
    kernel's B (twice the bytes) outgrows L1 where VPMADDUBSW's does not, and conv_tile
    alone gave it one vector to VPMADDUBSW's two. The packed weights then had 72 padded
    columns where the compensation had 80, and the first execution raised. Every kernel
    of a layout now has its fast path's width; bit for bit."""
    p = dict(sp=2, groups=1, icg=96, ocg=72, ker=(3, 3), dil=(0, 0), pad_l=(1, 1), pad_r=(1, 1), strides=(1, 1),
             size=(7, 7), n=1, src_dt="u8", dst_dt="s32", zp_src=5, wscale=None, s_src=None, zp_dst=None,
             bias=False, post=[], layout=0, policy="exact", packed=packed, seed=6)
    got, want = run_case(p, isa_path)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("isa", LADDER)
def test_layout_kernels_share_one_tile_width(isa):
    """Every kernel a layout can take (both, under exact without VNNI) has one column tile
    width, on every ISA path (generated or not): the compensation, the padded columns and
    the threads' column splits are laid out once for all. Before, AVX-512's res5 proj
    (1024 -> 2048, 1x1/2 at 14x14) got a VPMADDUBSW tile of 3 vectors and a widening tile
    of 2, and AVX2's 96 -> 72 3x3 at 7x7 two and one."""
    from dataclasses import replace

    from primitives.conv import ConvolutionDesc as Desc

    shapes = [(96, 72, 7, 3, 1), (1024, 2048, 14, 1, 2), (128, 136, 7, 3, 1), (512, 512, 7, 3, 1), (64, 64, 56, 3, 1)]
    for ic, oc, size, k, s in shapes:
        out = (size + 2 * (k // 2) - k) // s + 1
        pd = Desc(desc((1, ic, size, size), "u8", "nhwc"), desc((oc, ic, k, k), "s8", "any"),
                  desc((1, oc, out, out), "u8", "nhwc"), strides=(s, s), padding_l=(k // 2,) * 2,
                  padding_r=(k // 2,) * 2, attr=Attr(policy="exact"))
        choices = replace(pd._layout, isa=isa).candidates()
        assert len({c.nr for c in choices}) == 1, (isa, ic, oc, size, k, choices)
        if not isa.endswith("vnni"):
            assert [c.path.kind for c in choices] == ["maddubsw", "widen"]


@pytest.mark.parametrize("ker,layout,copy", [(1, 0, False), (3, 0, False), (3, 0, True), (3, 1, True)])
def test_threads_split_columns(isa_path, ker, layout, copy, monkeypatch):
    """Two threads and one image whose weights outweigh it: the threads take column tiles
    (every pixel each), flat (1x1) and row by row (3x3, 7 output rows: its weights made
    to outgrow L2's share, as res5's do), bit for bit. 3x3 reads its edges in place or
    from strips, or (``copy``) from the padded copy: each thread copies the rows into a
    copy of its own, or, from a channels-first source, all read one copy made before."""
    import primitives.conv_blocking as blocking
    from primitives import conv
    from primitives.conv import ConvolutionDesc as Desc

    if copy:
        monkeypatch.setattr(conv.Geometry, "strips", lambda self: None)  # the padded copy, not the strips
    else:  # in place (edges or strips), whatever this core's caches make them cost against the copy
        monkeypatch.setattr(conv, "strips_pay", lambda *args: True)
    if ker == 3:
        monkeypatch.setattr(blocking, "L2_BUDGET", 50 << 10)
    pad = ker // 2
    p = dict(sp=2, groups=1, icg=64, ocg=100, ker=(ker, ker), dil=(0, 0), pad_l=(pad, pad), pad_r=(pad, pad),
             strides=(1, 1), size=(7, 7), n=1, src_dt="u8", dst_dt="u8", zp_src=None, wscale="oc", s_src=0.05,
             zp_dst=None, bias=True, post=[("eltwise", "relu", 0.0, 0.0)], layout=layout, policy="exact", packed=True,
             seed=5)  # odd seed: two threads
    got, want = run_case(p, isa_path)
    np.testing.assert_array_equal(got, want)
    tag = "nchw" if layout else "nhwc"
    pd = Desc(desc((1, 64, 7, 7), "u8", tag), desc((100, 64, ker, ker), "s8", "any"),
              desc((1, 100, 7, 7), "u8", "nhwc"), padding_l=(pad, pad), padding_r=(pad, pad), isa=isa_path,
              threads=2)
    assert pd._split_columns()
    # each thread reads the padded copy it filled; from channels-first, the one copy
    assert pd._copies() == (2 if copy and not layout else 1)
    assert (pd.impl_info()["source"] == "padded copy in the scratchpad") is copy


@pytest.mark.parametrize("tag", ["nhwc", "nchw"])
def test_split_columns_copies_fit_a_user_scratchpad(isa_path, guarded, monkeypatch, tag):
    """The threads' own padded copies (column split, two threads) lie inside the size
    scratchpad_desc() reports: a user scratchpad of exactly that size, its last byte
    against a guard page, bit for bit. A channels-first source is copied once, before
    the threads' lists, and its scratchpad holds that one copy."""
    import primitives.conv_blocking as blocking
    from primitives import conv

    monkeypatch.setattr(blocking, "L2_BUDGET", 30 << 10)  # weights 57.6 KB outgrow L2's share
    monkeypatch.setattr(conv.Geometry, "strips", lambda self: None)  # the padded copy, not the strips
    rng = np.random.default_rng(12)
    x = rng.integers(0, 256, (1, 7, 7, 64)).astype(np.uint8)
    w = rng.integers(-128, 128, (100, 64, 3, 3)).astype(np.int8)
    pd = ConvolutionDesc(desc((1, 64, 7, 7), "u8", tag), desc(w.shape, "s8", "oihw"),
                         desc((1, 100, 7, 7), "u8", "nhwc"), padding_l=(1, 1), padding_r=(1, 1),
                         attr=Attr(scales={"src": 0}, scratchpad_mode="user"), isa=isa_path, threads=2)
    assert pd._copies() == (2 if tag == "nhwc" else 1)
    pad = guarded(pd.scratchpad_desc().nbytes, np.uint8, "end")
    dst = np.zeros((1, 7, 7, 100), np.uint8)
    src = x if tag == "nhwc" else np.ascontiguousarray(np.moveaxis(x, -1, 1))
    prim = pd.create()
    for _ in range(2):  # the second call replays
        dst[...] = 0
        prim.execute({"src": src, "weights": w, "dst": dst, "scales:src": np.float32([0.01]), "scratchpad": pad})
        v = conv_sum(np.moveaxis(x, -1, 1), w, (1, 1), (1, 1), (1, 1), (0, 0))
        want = output_pipeline(_to_rows(v), dst_dt="u8", scale=np.float32([0.01]))
        np.testing.assert_array_equal(dst.reshape(-1, 100), want)


@pytest.mark.parametrize("dims", [(1, 1, 5, 6), (2, 1, 1, 1), (2, 12, 1, 1), (1, 12, 5, 6), (2, 1, 5, 6),
                                  (1, 1, 1, 6)])
@pytest.mark.parametrize("groups", [1, 3])
def test_binary_operand_broadcasts(isa_path, dims, groups):
    """A binary post-op operand whose dims are each dst's or 1 (oneDNN's broadcast), not
    just one value, one per channel or a full one: broadcast to a full operand at each
    call, bit for bit, called twice with new values in it."""
    rng = np.random.default_rng(sum(dims) + groups)
    N, IC, OC, H, W = 2, 6, 12, 5, 6
    x = rng.integers(0, 256, (N, H, W, IC)).astype(np.uint8)
    w = rng.integers(-128, 128, (OC, IC // groups, 3, 3)).astype(np.int8)
    wd = (groups, OC // groups, IC // groups, 3, 3) if groups > 1 else w.shape
    attr = Attr(scales={"src": 0}).set_post_ops(PostOps().binary("add", desc(dims, "f32", "abcd")))
    pd = ConvolutionDesc(desc((N, IC, H, W), "u8", "nhwc"), desc(wd, "s8", "any"), desc((N, OC, H, W), "f32", "nhwc"),
                         padding_l=(1, 1), padding_r=(1, 1), attr=attr, isa=isa_path)
    wmem = Memory(pd.weights_desc())
    reorder_desc(desc(wd, "s8", "abcde"[:len(wd)]), pd.weights_desc()).create().execute(
        {"src": w.reshape(wd), "dst": wmem})
    prim = pd.create()
    v = np.concatenate([conv_sum(np.moveaxis(x[..., g * (IC // groups):(g + 1) * (IC // groups)], -1, 1),
                                 w[g * (OC // groups):(g + 1) * (OC // groups)], (1, 1), (1, 1), (1, 1), (0, 0))
                        for g in range(groups)], axis=1)
    for _ in range(2):
        src1 = rng.uniform(-50, 50, dims).astype(np.float32)
        y = np.zeros((N, H, W, OC), np.float32)
        prim.execute({"src": x, "weights": wmem, "dst": y, "scales:src": np.float32([0.5]), "post_op:0:src_1": src1})
        full = _to_rows(np.broadcast_to(src1, (N, OC, H, W)))
        want = output_pipeline(_to_rows(v), dst_dt="f32", scale=np.float32([0.5]), post_ops=[("binary", "add", full)])
        np.testing.assert_array_equal(y.reshape(-1, OC), want)


@pytest.mark.parametrize("icg", [3, 5])
def test_stem_channels_unpadded(isa_path, icg):
    """A stem-like layer (7x7/2, pad 3, 3 or 5 channels): on VNNI paths the source copy
    keeps its channels unpadded and each window row is one K run of 21 or 35 bytes (a
    K tail per run), bit for bit, with a source zero point at the borders."""
    p = dict(sp=2, groups=1, icg=icg, ocg=20, ker=(7, 7), dil=(0, 0), pad_l=(3, 3), pad_r=(3, 2), strides=(2, 2),
             size=(11, 12), n=2, src_dt="u8", dst_dt="s32", zp_src=9, wscale=None, s_src=None, zp_dst=None,
             bias=False, post=[], layout=icg % 2, policy="exact", packed=icg == 3, seed=6)
    got, want = run_case(p, isa_path)
    np.testing.assert_array_equal(got, want)
    pd = ConvolutionDesc(desc((1, icg, 11, 12), "u8", "nhwc"), desc((20, icg, 7, 7), "s8", "any"),
                         desc((1, 20, 6, 6), "s32", "nhwc"), strides=(2, 2), padding_l=(3, 3), padding_r=(3, 2),
                         isa=isa_path)
    assert pd.geometry.tight == isa_path.endswith("vnni")


@pytest.fixture
def caches_of(monkeypatch):
    """``caches_of(l1d, l2)``: the convolution's blocking budgets for a core with those
    caches, whatever this machine has (the model's picks depend on them)."""
    import primitives.conv_blocking as blocking
    from runtime.caches import DataCaches

    def pretend(l1d: int, l2: int) -> None:
        l1_budget, l2_budget = blocking.cache_budgets(DataCaches(l1d=l1d, l2=l2, source="test"))
        monkeypatch.setattr(blocking, "L1_BUDGET", l1_budget)
        monkeypatch.setattr(blocking, "L2_BUDGET", l2_budget)
    return pretend


EMERALD_RAPIDS = (48 << 10, 2 << 20)  # the caches the model was tuned and these picks measured on
ZEN4 = (32 << 10, 1 << 20)


def test_conv_tile_model(caches_of):
    """The tile model's picks on ResNet-50's 3x3 layers (AVX-512 VNNI): 4 vectors where B
    stays in L1 or rows are long, 7-row blocks of 2 vectors at 7 pixels with 512 channels.
    With a Zen 4 core's 32 KB of L1, res2's 37 KB column tile of B streams from L2, and
    shorter blocks of 4 rows take it."""
    from primitives.conv import Geometry
    from primitives.conv_blocking import conv_tile
    from primitives.gemm import fast_path

    def tile(c, width, isa="avx512_core_vnni"):
        g = Geometry(1, 1, c, c, (1, width, width), (1, 3, 3), (1, width, width), (1, 1, 1), (0, 0, 0),
                     (0, 1, 1), (0, 1, 1))
        return conv_tile(fast_path(isa), g)
    caches_of(*EMERALD_RAPIDS)
    assert tile(64, 56) == (6, 4)
    assert tile(256, 14) == (5, 4)
    assert tile(512, 7) == (7, 2)
    assert tile(512, 7, "avx2") == (5, 2)  # 16 registers: GEMM's own tile width
    caches_of(*ZEN4)
    assert tile(64, 56) == (4, 4)
    assert tile(256, 14) == (5, 4) and tile(512, 7) == (7, 2)


def test_flat_tile_rows_fit_the_pixel_count(caches_of):
    """A 1x1 layer's block height follows its pixel count: res5's 49 pixels as 9 x 5 + 4
    rather than 8 x 6 + 1; thousands of pixels keep the tallest block."""
    from primitives.conv import Geometry
    from primitives.conv_blocking import flat_tile_rows
    from primitives.gemm import fast_path

    caches_of(*EMERALD_RAPIDS)
    path = fast_path("avx512_core_vnni")
    g = Geometry(1, 1, 2048, 512, (1, 7, 7), (1, 1, 1), (1, 7, 7), (1, 1, 1), (0, 0, 0), (0, 0, 0), (0, 0, 0))
    assert g.flat
    assert flat_tile_rows(path, g, 4, (49,)) == 5
    assert flat_tile_rows(path, g, 4, (3136,)) == 6
    assert flat_tile_rows(path, g, 4, (48,)) == 6


def test_source_zero_point_at_borders(isa_path):
    """Source zero point with padding: the window's padded part contributes exactly 0."""
    rng = np.random.default_rng(8)
    x = rng.integers(0, 256, (1, 8, 5, 5)).astype(np.uint8)
    w = rng.integers(-128, 128, (4, 8, 3, 3)).astype(np.int8)
    zp = 77
    pd = ConvolutionDesc(desc(x.shape, "u8", "nchw"), desc(w.shape, "s8", "oihw"), desc((1, 4, 5, 5), "s32", "nchw"),
                         padding_l=(1, 1), padding_r=(1, 1), attr=Attr(zero_points={"src": 0}), isa=isa_path)
    dst = np.zeros((1, 4, 5, 5), np.int32)
    pd.create().execute({"src": x, "weights": w, "dst": dst, "zero_points:src": np.int32([zp])})
    xf = np.pad(x.astype(np.int64) - zp, [(0, 0), (0, 0), (1, 1), (1, 1)])  # padding is 0 after the shift
    want = np.zeros((1, 4, 5, 5), np.int64)
    for i in range(5):
        for j in range(5):
            want[0, :, i, j] = np.einsum("chw,ochw->o", xf[0, :, i:i + 3, j:j + 3], w.astype(np.int64))
    np.testing.assert_array_equal(dst, want)


def test_halve_weights_reported_inexact():
    pd = ConvolutionDesc(desc((1, 8, 4, 4), "u8", "nhwc"), desc((8, 8, 1, 1), "s8", "oihw"),
                         desc((1, 8, 4, 4), "s32", "nhwc"), attr=Attr(policy="halve_weights"), isa="avx2")
    assert pd.impl_info()["exact"] is False
    assert "halve" in pd.impl_info()["decision"]


@pytest.mark.parametrize("case", ["groups", "window", "negative_pad", "layout", "dst_dims", "zp_range"])
def test_bad_input(case):
    src, wei, dst = desc((1, 6, 5, 5), "u8", "nhwc"), desc((4, 6, 3, 3), "s8", "oihw"), desc((1, 4, 3, 3), "u8",
                                                                                           "nhwc")
    if case == "groups":
        with pytest.raises(ValueError, match="weights"):
            ConvolutionDesc(src, desc((4, 2, 4, 3, 3), "s8", "goihw"), dst)
    elif case == "window":
        with pytest.raises(ValueError, match="window"):
            ConvolutionDesc(src, desc((4, 6, 7, 7), "s8", "oihw"), dst)
    elif case == "negative_pad":
        with pytest.raises(ValueError, match="padding_l"):
            ConvolutionDesc(src, wei, dst, padding_l=(-1, 0))
    elif case == "layout":
        with pytest.raises(ValueError, match="src"):
            ConvolutionDesc(desc((1, 6, 5, 5), "u8", "acbd"), wei, dst)
    elif case == "dst_dims":
        with pytest.raises(ValueError, match="dst"):
            ConvolutionDesc(src, wei, desc((1, 4, 5, 5), "u8", "nhwc"))
    else:  # (a zero point that the padding cannot hold in the source's type)
        pd = ConvolutionDesc(src, wei, desc((1, 4, 5, 5), "u8", "nhwc"), padding_l=(1, 1),
                             attr=Attr(zero_points={"src": 0}))
        with pytest.raises(ValueError, match="zero_points:src"):
            pd.create().execute({"src": np.zeros((1, 5, 5, 6), np.uint8), "weights": np.zeros((4, 6, 3, 3), np.int8),
                                 "dst": np.zeros((1, 5, 5, 4), np.uint8), "zero_points:src": np.int32([300])})


@pytest.mark.parametrize("tag,ic,groups", [("nhwc", 8, 1), ("nchw", 8, 1), ("nhwc", 6, 1), ("nhwc", 8, 2)])
def test_source_zero_points_outside_the_type_without_padding(isa_path, tag, ic, groups):
    """A zero point outside the source's type (oneDNN's are s32) with no spatial padding:
    the source read in place or copied (channels first, channels padded to 4, groups),
    exact either way; the copy's padded channels meet weights of 0, so their fill may be
    any value (it had been refused as if it padded pixels)."""
    rng = np.random.default_rng(ic + groups)
    wshape = (groups, 4, ic // groups, 3, 3) if groups > 1 else (4, ic, 3, 3)
    pd = ConvolutionDesc(desc((1, ic, 5, 5), "u8", tag), desc(wshape, "s8", "any"),
                         desc((1, 4 * groups if groups > 1 else 4, 3, 3), "s32", tag),
                         attr=Attr(zero_points={"src": 0}), isa=isa_path)
    w = rng.integers(-128, 128, wshape).astype(np.int8)
    packed = Memory(pd.weights_desc())
    reorder_desc(desc(wshape, "s8", "goihw" if groups > 1 else "oihw"), pd.weights_desc()).create().execute(
        {"src": w, "dst": packed})
    x = rng.integers(0, 256, (1, ic, 5, 5)).astype(np.uint8)
    prim = pd.create()
    for zp in (300, -7, 2**20):
        y = np.zeros(pd.dst_desc().physical_shape, np.int32)
        prim.execute({"src": _physical(x, tag), "weights": packed, "dst": y, "zero_points:src": np.int32([zp])})
        want = conv_sum(x.astype(np.int64) - zp, w, (1, 1), (0, 0), (0, 0), (0, 0))
        np.testing.assert_array_equal(y, _physical(want.astype(np.int32), tag))


def test_guard_pages(isa_path, guarded):
    rng = np.random.default_rng(9)
    for where in ("end", "start"):
        for ic, k, pad in ((8, 1, 0), (3, 3, 1), (16, 3, 0)):
            x = guarded(2 * 5 * 6 * ic, np.uint8, where).reshape(2, 5, 6, ic)
            x[:] = rng.integers(0, 256, x.shape)
            o = 5 + 2 * pad - k + 1, 6 + 2 * pad - k + 1
            dst = guarded(2 * o[0] * o[1] * 9, np.uint8, where).reshape(2, o[0], o[1], 9)
            w = rng.integers(-128, 128, (9, ic, k, k)).astype(np.int8)
            pd = ConvolutionDesc(desc((2, ic, 5, 6), "u8", "nhwc"), desc(w.shape, "s8", "oihw"),
                                 desc((2, 9) + o, "u8", "nhwc"), padding_l=(pad, pad), padding_r=(pad, pad),
                                 attr=Attr(scales={"src": 0}), isa=isa_path)
            pd.create().execute({"src": x, "weights": w, "dst": dst, "scales:src": np.float32([0.01])})
            v = conv_sum(np.moveaxis(x, -1, 1), w, (1, 1), (pad, pad), (pad, pad), (0, 0))
            want = output_pipeline(_to_rows(v), dst_dt="u8", scale=np.float32([0.01]))
            np.testing.assert_array_equal(dst.reshape(-1, 9), want)


def test_big_weight_tiles_prefetch_b_ahead(isa_path, monkeypatch):
    """A column tile of B more than twice L1's share (256 channels x 3x3 on AVX-512; AVX2
    narrows its tiles instead) is prefetched ahead of the K loop; a small one (32
    channels) is not; both bit for bit. (The distance Intel gets, on any CPU: AMD gets
    none.)"""
    import primitives.conv_blocking as blocking
    from primitives import gemm_driver
    from primitives.conv import ConvolutionDesc as Desc

    monkeypatch.setattr(gemm_driver, "prefetch_ahead_bytes", lambda: 4096)

    for icg, big in ((256, True), (32, False)):
        p = dict(sp=2, groups=1, icg=icg, ocg=40, ker=(3, 3), dil=(0, 0), pad_l=(1, 1), pad_r=(1, 1),
                 strides=(1, 1), size=(5, 6), n=1, src_dt="u8", dst_dt="u8", zp_src=None, wscale="oc", s_src=0.05,
                 zp_dst=None, bias=True, post=[("eltwise", "relu", 0.0, 0.0)], layout=0, policy="exact", packed=True,
                 seed=11)
        got, ref = run_case(p, isa_path)
        np.testing.assert_array_equal(got, ref)
        pd = Desc(desc((1, icg, 5, 6), "u8", "nhwc"), desc((40, icg, 3, 3), "s8", "any"),
                  desc((1, 40, 5, 6), "u8", "nhwc"), padding_l=(1, 1), padding_r=(1, 1), isa=isa_path)
        kspec = pd._kernel_for(pd.fast).meta["kspec"]
        want = blocking.b_tile_bytes(kspec.path, pd.geometry, kspec.nr) > 2 * blocking.L1_BUDGET
        assert bool(kspec.prefetch_ahead) is want and (want or not big or kspec.path.bits == 256)


@pytest.mark.parametrize("n,threads", [(1, 2), (3, 2), (2, 1), (4, 2)])
@pytest.mark.parametrize("groups", [3, 1])
def test_threads_copy_their_source_rows(isa_path, n, threads, groups):
    """Whole-pixel 2-D sources that are not read in place (groups; one group of 3
    channels a pixel, on VNNI paths): each thread copies the padded rows its items read
    (halo rows twice); a second call on the same arrays, with new source values, copies
    again. With at least as many images as threads and one group, each thread copies its
    images, one after the other, into one padded image of the buffer: its own (a thread
    that reads its images once per group needs each where its copy left it)."""
    from primitives.conv import ConvolutionDesc as Desc

    C = 12 if groups > 1 else 3
    if groups == 1 and not isa_path.endswith("vnni"):
        pytest.skip("3 channels a pixel are whole pixels (unpadded to 4) on VNNI paths only")
    rng = np.random.default_rng(n)
    H, W, OC = 9, 7, 24
    wshape = (groups, OC // groups, C // groups, 3, 3)
    pd = Desc(desc((n, C, H, W), "u8", "nhwc"), desc(wshape, "s8", "abcde"),
              desc((n, OC, H - 3, W), "s32", "nhwc"), strides=(1, 1), padding_l=(0, 1), padding_r=(1, 1),
              dilation=(1, 0), isa=isa_path, threads=threads)
    assert pd._strips is None
    prim = pd.create()
    x = rng.integers(0, 256, (n, H, W, C)).astype(np.uint8)
    w = rng.integers(-128, 128, wshape).astype(np.int8)
    y = np.zeros((n, H - 3, W, OC), np.int32)  # H: dilated window of 5, padding 0 and 1
    for _ in range(2):
        prim.execute({"src": x, "weights": w, "dst": y})
        want = conv_sum(np.moveaxis(x, -1, 1), w if groups > 1 else w[0], (1, 1), (0, 1), (1, 1), (1, 0))
        np.testing.assert_array_equal(y, np.moveaxis(want, 1, -1))
        x[...] = rng.integers(0, 256, x.shape)
    plan = list(prim._plans.values())[-1]
    rows_src = plan["keep"][-1]  # the source the row copies read (None: no row copies)
    copies = [arg for calls in plan["calls"]._keep for fn, arg in calls if hasattr(arg, "rows")]
    image = pd.geometry.padded[1] * pd.geometry.padded[2] * C  # bytes of one padded image
    slots = {(int(ffi.cast("intptr_t", c.dst)) - first) // image
             for first in [min(int(ffi.cast("intptr_t", c.dst)) for c in copies)] for c in copies}
    assert rows_src is not None and len(slots) == (n if groups > 1 else threads if n >= threads else 1)


def test_depth_padding_keeps_the_copy_before_the_threads(isa_path):
    """A 3-D source of depth 1 padded in depth (found by hypothesis): the threads' row
    copies assume one unpadded depth plane, so this one is copied before them."""
    p = dict(sp=3, groups=1, icg=4, ocg=1, ker=(1, 1, 1), dil=(0, 0, 0), pad_l=(0, 0, 0), pad_r=(1, 0, 0),
             strides=(1, 1, 1), size=(1, 1, 2), n=2, src_dt="u8", dst_dt="u8", zp_src=None, wscale=None, s_src=None,
             zp_dst=None, bias=False, post=[], layout=0, policy="exact", packed=False, seed=0)
    got, want = run_case(p, isa_path)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("where", ["end", "start"])
def test_row_copies_stay_inside_the_source(isa_path, guarded, where):
    """The threads' row copies read the source flush against a PROT_NONE page (rows of 7
    pixels x 12 channels in 3 groups: 84 bytes, a 32-byte piece overlapping the last)."""
    from primitives.conv import ConvolutionDesc as Desc

    rng = np.random.default_rng(3)
    n, G, C, H, W, OC = 2, 3, 12, 6, 7, 9
    pd = Desc(desc((n, C, H, W), "u8", "nhwc"), desc((G, OC // G, C // G, 3, 3), "s8", "abcde"),
              desc((n, OC, H, W), "s32", "nhwc"), padding_l=(1, 1), padding_r=(1, 1), isa=isa_path, threads=2)
    assert pd._strips is None and pd.impl_info()["source"] == "padded copy in the scratchpad"
    x = guarded(n * H * W * C, np.uint8, where).reshape(n, H, W, C)
    x[...] = rng.integers(0, 256, x.shape)
    w = rng.integers(-128, 128, (G, OC // G, C // G, 3, 3)).astype(np.int8)
    y = np.zeros((n, H, W, OC), np.int32)
    pd.create().execute({"src": x, "weights": w, "dst": y})
    want = conv_sum(np.moveaxis(np.array(x), -1, 1), w, (1, 1), (1, 1), (1, 1), (0, 0))
    np.testing.assert_array_equal(y, np.moveaxis(want, 1, -1))


@pytest.mark.parametrize("src_dt,zp,policy", [("u8", None, "exact"), ("u8", 3, "exact"), ("s8", None, "exact"),
                                               ("s8", 5, "exact"), ("u8", 3, "faithful")])
@pytest.mark.parametrize("threads", [1, 2])
def test_rows_in_the_padding_skip_their_window_rows(isa_path, src_dt, zp, policy, threads):
    """Output rows whose window reaches into the top or bottom padding skip those window
    rows' K runs (and their B). A u8 source without a zero point pads with zeros; an s8
    source or a zero point pads with values the column compensation takes away, so rows
    that skip take a compensation of the runs they read. Not where the padding's
    products may saturate (faithful on VPMADDUBSW paths, with a compensation). Either way
    the results are exact (stride 2, dilation 1 in H and 2 padding rows at the top;
    weights in [-64, 64] for faithful, which then cannot saturate)."""
    from primitives.conv import ConvolutionDesc as Desc

    rng = np.random.default_rng(7)
    C, H, W, OC = 8, 9, 6, 20
    kw = dict(strides=(2, 1), padding_l=(2, 1), padding_r=(1, 1), dilation=(1, 0))
    attr = Attr(zero_points={"src": 0} if zp is not None else None, policy=policy)
    OH = (H + 3 - 5) // 2 + 1
    pd = Desc(desc((2, C, H, W), src_dt, "nhwc"), desc((OC, C, 3, 3), "s8", "any"),
              desc((2, OC, OH, W), "s32", "nhwc"), attr=attr, isa=isa_path, threads=threads, **kw)
    w_lo, w_hi = (-64, 65) if policy == "faithful" else (-128, 128)
    w = rng.integers(w_lo, w_hi, (OC, C, 3, 3)).astype(np.int8)
    packed = Memory(pd.weights_desc())
    reorder_desc(desc(w.shape, "s8", "oihw"), pd.weights_desc()).create().execute({"src": w, "dst": packed})
    lo, hi = (0, 256) if src_dt == "u8" else (-128, 128)
    x = rng.integers(lo, hi, (2, H, W, C)).astype(np.uint8 if src_dt == "u8" else np.int8)
    y = np.zeros((2, OH, W, OC), np.int32)
    args = {"src": x, "weights": packed, "dst": y}
    if zp is not None:
        args["zero_points:src"] = np.int32([zp])
    prim = pd.create()
    for z in ([zp, zp - 1] if zp is not None else [None]):  # a new zero point: new compensations
        if z is not None:
            args["zero_points:src"] = np.int32([z])
        prim.execute(args)
        xz = np.moveaxis(x.astype(np.int32) - (z or 0), -1, 1)
        want = conv_sum(xz, w, (2, 1), (2, 1), (1, 1), (1, 0))
        np.testing.assert_array_equal(y, np.moveaxis(want, 1, -1))
    runs = pd.geometry.runs[0]
    spans = {int(s.pos_end - s.pos_off) for s, *_ in list(prim._plans.values())[-1]["items"]}
    assert max(spans) == runs
    saturating = policy == "faithful" and pd.fast.path.kind == "maddubsw"
    assert (min(spans) < runs) == (not saturating)


CUT_CASES = [  # (size, ker, strides, pad_l, pad_r, channels): rows read from the padded copy, edge pixels cut
    ((7, 7), (3, 3), (1, 1), (1, 1), (1, 1), 8),  # ResNet's 3x3 at 7x7: one block a row, both ends cut
    ((5, 14), (3, 3), (1, 1), (1, 1), (1, 1), 4),  # 14 wide: a cut first block and a cut last one
    ((4, 31), (3, 3), (2, 2), (1, 1), (1, 1), 12),  # 16 wide: uncut blocks between the cut ones
    ((3, 40), (3, 3), (1, 1), (1, 1), (1, 1), 8),  # 40 wide: a loop of uncut blocks
    ((9, 9), (7, 7), (2, 2), (3, 3), (3, 3), 4),  # the stem's window: two cut pixels a side
    ((4, 5), (1, 3), (1, 1), (0, 2), (0, 3), 8),  # windows wholly in the padding: pixels that read nothing
    ((4, 4), (2, 2), (1, 1), (0, 3), (0, 0), 4),  # left padding wider than the window (its cut had run past it)
    ((5, 9), (3, 2), (1, 2), (1, 5), (0, 4), 8),  # strided, both sides wider than the window
    ((6,), (5,), (1,), (4,), (2,), 16),  # 1-D
    ((3, 4, 7), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), 8),  # 3-D: every (kd, kh) run cut alike
    ((4, 3, 9), (2, 1, 5), (2, 1, 2), (0, 0, 2), (1, 0, 3), 4),  # 3-D, strided, padded behind in depth
]


@pytest.mark.parametrize("case", range(len(CUT_CASES)))
def test_copied_rows_cut_their_edge_pixels(isa_path, case, monkeypatch):
    """Rows read from a zero-padded copy (a u8 source without a zero point) leave out their
    edge pixels' products with the side padding in the same register block as the other
    pixels (GemmKernelSpec.cuts: each cut block's K loop in segments of the rows that read
    them). Exact with a bias, scales and a full binary operand (read by row index across
    the blocks), one and two threads, batch 1 and 2; a zero point or an s8 source, whose
    padding is not zero, reads every pixel's whole window."""
    import primitives.conv as conv

    monkeypatch.setattr(conv.Geometry, "strips", lambda self: None)  # the padded copy, not the strips
    size, ker, strides, pad_l, pad_r, c = CUT_CASES[case]
    sp = len(size)
    for seed, (src_dt, zp, post, n, dst_dt) in enumerate([
            ("u8", None, [], 1, "s32"), ("u8", None, [("binary", "add", "full")], 2, "u8"),
            ("u8", None, [("sum", 0.5, 2)], 2, "s8"), ("u8", 3, [], 1, "s32"), ("s8", None, [], 2, "s32")]):
        p = dict(sp=sp, groups=1, icg=c, ocg=20, ker=ker, dil=(0,) * sp, pad_l=pad_l, pad_r=pad_r, strides=strides,
                 size=size, n=n, src_dt=src_dt, dst_dt=dst_dt, zp_src=zp, wscale="oc" if post else None,
                 s_src=None, zp_dst=None, bias=bool(seed % 2), post=post, layout=0, policy="exact",
                 packed=bool(seed % 2), seed=10 * case + seed)
        got, want = run_case(p, isa_path)
        np.testing.assert_array_equal(got, want)
        out = _out_size(size, ker, strides, (0,) * sp, pad_l, pad_r)
        pd = ConvolutionDesc(desc((n, c) + size, src_dt, TAGS[sp + 2][0]), desc((4, c) + ker, "s8", "any"),
                             desc((n, 4) + out, "s32", TAGS[sp + 2][0]), strides=strides, padding_l=pad_l,
                             padding_r=pad_r, attr=Attr(zero_points={"src": 0} if zp is not None else None),
                             isa=isa_path)
        cut = src_dt == "u8" and zp is None
        assert pd.impl_info()["kernel"].endswith("_cut") is cut
        assert ("cut" in pd.impl_info()) is cut and pd.impl_info()["source"] == "padded copy in the scratchpad"
        if cut:
            assert [w for w, _, _ in pd._cuts[2]] == [w for w in range(out[-1])
                                                        if pd.geometry.column_window(w) != (0, ker[-1])]


STRIP_CASES = [  # (size, ker, strides, dilation, pad_l, pad_r): left/right edge columns, windows
    ((6, 7), (3, 3), (1, 1), (0, 0), (1, 1), (1, 1)),  # ResNet's 3x3: one edge column a side
    ((7, 9), (3, 3), (2, 2), (0, 0), (1, 1), (1, 1)),  # 3x3/2
    ((5, 14), (3, 5), (1, 2), (0, 1), (2, 3), (1, 5)),  # dilated 5 wide, strided: two edge columns a side
    ((4, 6), (2, 3), (1, 1), (1, 0), (0, 2), (1, 0)),  # left padding 2: an edge window wholly in it
    ((9, 3), (3, 3), (1, 1), (0, 0), (0, 1), (0, 0)),  # 3 columns wide: one edge column, one inside
    ((5, 4), (3, 1), (1, 1), (0, 0), (1, 0), (2, 0)),  # padded at the top and bottom only: no strips
]


@pytest.fixture(params=["edges in place", "strips"])
def strips_always(monkeypatch, request):
    """Edge strips wherever Geometry.strips allows them, whatever conv_blocking.strips_pay says;
    their edge columns read in place where Geometry.edge_windows allows it, or always
    from the strips."""
    import primitives.conv as conv

    monkeypatch.setattr(conv, "strips_pay", lambda *args: True)
    monkeypatch.setattr(conv, "edges_pay", lambda *args: True)
    if request.param == "strips":
        monkeypatch.setattr(conv.Geometry, "edge_windows", lambda self: None)
    return request.param


@pytest.mark.parametrize("case", range(len(STRIP_CASES)))
def test_edge_strips_read_the_source_in_place(isa_path, case, strips_always):
    """A padded NHWC source of one group and 4k channels is read in place: the columns
    whose window stays inside the source's width directly; the edge columns in place too,
    their windows cut at the side padding (Geometry.edge_windows: the kernel skips the
    padded window columns of each run in A and B), or from narrow padded strips
    (Geometry.strips), which the threads fill with the source's edge rows.
    Exact with every attribute the pipeline takes there (zero points, s8, a full binary
    operand, whose rows the edge columns walk OW pixels apart, sum), one and two threads,
    batch 1 and 2, packed weights or plain."""
    size, ker, strides, dil, pad_l, pad_r = STRIP_CASES[case]
    for seed, (src_dt, zp, post, n) in enumerate([("u8", None, [], 1), ("u8", 5, [("binary", "add", "full")], 2),
                                                  ("s8", None, [("sum", 0.5, 2)], 2),
                                                  ("s8", -3, [("eltwise", "relu", 0.0, 0.0)], 1)]):
        p = dict(sp=2, groups=1, icg=8, ocg=20, ker=ker, dil=dil, pad_l=pad_l, pad_r=pad_r, strides=strides,
                 size=size, n=n, src_dt=src_dt, dst_dt="s32" if not post else "s8", zp_src=zp, wscale="oc",
                 s_src=None, zp_dst=None, bias=bool(seed % 2), post=post, layout=0, policy="exact",
                 packed=bool(seed % 2), seed=100 * case + seed)
        got, want = run_case(p, isa_path)
        np.testing.assert_array_equal(got, want)
    from primitives.conv import ConvolutionDesc as Desc

    pd = Desc(desc((1, 8) + size, "u8", "nhwc"), desc((4, 8) + ker, "s8", "oihw"),
              desc((1, 4) + got.shape[2:], "s32", "nhwc"), strides=strides, padding_l=pad_l, padding_r=pad_r,
              dilation=dil, isa=isa_path)
    left, right, wl, wr = pd._strips
    assert pd.impl_info()["source"].startswith("direct, the edge columns")
    if pd._edges:  # no scratchpad for the source at all
        assert strips_always == "edges in place" and pd._pad_bytes == 0
        assert [w for w, _, _ in pd._edges] == list(range(left)) + list(range(pd.geometry.out[2] - right,
                                                                            pd.geometry.out[2]))
    else:  # the strips only, not the padded image
        assert strips_always == "strips" or not pd.geometry.edge_windows()  # W dilated, or no edge columns
        assert pd._pad_bytes == pd.geometry.padded[1] * (wl + wr) * 8


@pytest.mark.parametrize("where", ["end", "start"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("weights", ["uniform", "split"])
def test_edge_strips_stay_inside_the_source(isa_path, guarded, where, threads, strips_always, weights):
    """Read in place, the source flush against a PROT_NONE page: the columns inside read
    only source rows inside (rows at the top and bottom skip window rows in the
    padding), and the strips' copies only the source's edge rows. ``split``: small
    weights with unsafe pairs at the window's first and last positions (the exact
    path's residual cells on VPMADDUBSW ISAs, read at the offsets of each call's part
    of the window)."""
    from primitives.conv import ConvolutionDesc as Desc

    rng = np.random.default_rng(4)
    for size, ker, strides, dil, pad_l, pad_r in STRIP_CASES:
        n, C, OC = 2, 12, 8
        out = _out_size(size, ker, strides, dil, pad_l, pad_r)
        pd = Desc(desc((n, C) + size, "u8", "nhwc"), desc((OC, C) + ker, "s8", "oihw"),
                  desc((n, OC) + out, "s32", "nhwc"), strides=strides, padding_l=pad_l, padding_r=pad_r,
                  dilation=dil, attr=Attr(zero_points={"src": 0}), isa=isa_path, threads=threads)
        assert pd._strips is not None
        x = guarded(n * size[0] * size[1] * C, np.uint8, where).reshape((n,) + size + (C,))
        x[...] = rng.integers(0, 256, x.shape)
        w = rng.integers(-128, 128, (OC, C) + ker).astype(np.int8)
        if weights == "split":
            w = rng.integers(-20, 21, (OC, C) + ker).astype(np.int8)
            w[:, 0:2, 0, 0] = w[:, C - 2:, -1, -1] = 127
        y = np.zeros((n,) + out + (OC,), np.int32)
        prim = pd.create()
        prim.execute({"src": x, "weights": w, "dst": y, "zero_points:src": np.int32([7])})
        want = conv_sum(np.moveaxis(np.array(x), -1, 1), w, strides, pad_l, pad_r, dil, 7)
        np.testing.assert_array_equal(y, np.moveaxis(want, 1, -1))
        if weights == "split" and not isa_path.endswith("vnni"):
            assert any("_cells_" in name for name in prim.impl_info()["kernels_run"])


@pytest.fixture
def resnet_3x3(monkeypatch):
    """``resnet_3x3(c, size, stride, isa, n=1, threads=1, policy="exact")``: the
    descriptor of a ResNet-50-style 3x3 layer (c -> c channels, pad 1, NHWC u8) on any
    ISA path, whatever this CPU runs: creation only (its kernels are generated, none
    runs), for the tests of the model's picks."""
    from primitives.conv import ConvolutionDesc as Desc
    from runtime import isa as isa_mod

    monkeypatch.setattr(isa_mod, "supported", lambda: isa_mod.LADDER)

    def make(c: int, size: int, stride: int, isa: str, n: int = 1, threads: int = 1, policy: str = "exact"):
        out = (size - 1) // stride + 1
        return Desc(desc((n, c, size, size), "u8", "nhwc"), desc((c, c, 3, 3), "s8", "any"),
                    desc((n, c, out, out), "u8", "nhwc"), strides=(stride, stride), padding_l=(1, 1),
                    padding_r=(1, 1), attr=Attr(policy=policy), isa=isa, threads=threads)
    return make


def test_edge_strips_where_they_pay(caches_of, resnet_3x3):
    """ResNet-50's 3x3 layers on AVX-512 VNNI (conv_blocking.strips_pay, edges_pay), with the
    caches the rule was measured on: res2's (64 channels: a column tile's B stays in L1,
    so the strips' extra row blocks cost little) and res3's 3x3/2 (its 56x56 source
    costs more to copy than its one edge column's blocks read of B again) read the source
    in place, res2's edge columns too; the others copy it."""
    caches_of(*EMERALD_RAPIDS)
    for c, size, stride, want in ((64, 56, 1, True), (128, 28, 1, False), (256, 14, 1, False), (512, 7, 1, False),
                                  (128, 56, 2, True), (256, 28, 2, False), (512, 14, 2, False)):
        for n, threads in ((1, 1), (8, 2)):
            pd = resnet_3x3(c, size, stride, "avx512_core_vnni", n, threads)
            assert (pd._strips is not None) is want, (c, stride, n, threads)


def test_edge_columns_on_emerald_rapids(caches_of, resnet_3x3):
    """The rule on Emerald Rapids' caches, where it was measured (conv_blocking.edges_pay): without
    VNNI, ResNet-50's seven 3x3 layers all read their edge columns in place (they gained
    1-8% under both policies); with VNNI, where a block costs as much whatever its
    height, res2 3x3 does on both widths (+4-6.5%) and res5 3x3 on ymm (+24%: its 7-pixel
    rows, 5 + 2 in blocks of 5, become one block of 5 and the edge columns' blocks down
    the rows); the others copy or take the strips (res5 3x3/2's edges lost 5-8% on zmm)."""
    caches_of(*EMERALD_RAPIDS)
    layers = ((64, 56, 1), (128, 56, 2), (128, 28, 1), (256, 28, 2), (256, 14, 1), (512, 14, 2), (512, 7, 1))
    want = {"avx512_core": set(layers), "avx512_core_vnni": {(64, 56, 1)},
            "avx2_vnni": {(64, 56, 1), (512, 7, 1)}}
    for layer in layers:
        for isa, policy in (("avx512_core", "faithful"), ("avx512_core", "exact"), ("avx512_core_vnni", "exact"),
                            ("avx2_vnni", "exact")):
            pd = resnet_3x3(*layer, isa, policy=policy)
            assert (pd._edges is not None) is (layer in want[isa]), (layer, isa, policy)


def test_edge_strips_on_avx2_zen3(caches_of, resnet_3x3):
    """The rules on AVX2 with a Zen 3 core's caches (32 KB L1, 512 KB L2), where the picks
    were measured (conv_blocking.edges_pay, strips_pay): the 3x3 layers read their source in place,
    the edge columns too (their windows cut at the padding). Under exact the VPMADDUBSW
    kernel decides (trained weights take it, split into residual cells): for res5 3x3
    the edges are 7% faster there; the widening kernel, which full-range weights take,
    ran 1-7% slower with them (res4 3x3/2: 0-2%) than with the copy it had before."""
    caches_of(32 << 10, 512 << 10)
    for c, size, stride, policy, want in ((64, 56, 1, "exact", "edges"), (512, 7, 1, "exact", "edges"),
                                          (256, 14, 1, "exact", "edges"), (256, 28, 2, "exact", "edges"),
                                          (512, 14, 2, "exact", "edges"),
                                          (512, 7, 1, "faithful", "edges"), (128, 56, 2, "faithful", "edges")):
        for n in (1, 8):
            pd = resnet_3x3(c, size, stride, "avx2", n, policy=policy)
            got = "edges" if pd._edges else "strips" if pd._strips else "copy"
            assert got == want, (c, size, stride, policy, n)


def test_plain_weights_from_several_threads():
    """Threads calling one convolution with plain weights, each its own: a replay's test
    of the weights compares them with the bytes its own call packed. It had read the
    primitive's latest entry, which another thread may have just replaced, and then ran
    one thread's packs on the other's weights (wrong results in about half the runs)."""
    pd = ConvolutionDesc(desc((1, 8, 6, 6), "u8", "nhwc"), desc((16, 8, 3, 3), "s8", "oihw"),
                         desc((1, 16, 6, 6), "s32", "nhwc"), padding_l=(1, 1), padding_r=(1, 1), threads=1)
    conv = pd.create()
    rng = np.random.default_rng(3)
    weights = [rng.integers(-128, 128, (16, 8, 3, 3), dtype=np.int8) for _ in range(2)]
    xs = [rng.integers(0, 256, (1, 6, 6, 8), dtype=np.uint8) for _ in range(3)]
    want = {(i, j): conv_sum(x.transpose(0, 3, 1, 2), w, (1, 1), (1, 1), (1, 1), (0, 0)).transpose(0, 2, 3, 1)
            for i, w in enumerate(weights) for j, x in enumerate(xs)}  # (the loop checks fast: more races)
    bad = []

    def work(seed):
        pick = np.random.default_rng(seed)
        for it in range(3000):
            i, j = int(pick.integers(2)), int(pick.integers(3))
            y = np.zeros((1, 6, 6, 16), np.int32)
            conv.execute({"src": xs[j].copy(), "weights": weights[i], "dst": y})
            if not np.array_equal(y, want[i, j]):
                bad.append((seed, it))
                return
    errors = in_threads(work, [(10,), (11,)])
    assert not errors and not bad, (errors, bad)
