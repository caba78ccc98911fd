"""Matmul and inner product: bit-exact against the numpy model of the whole pipeline.

The model (``primitives.reference``): the int32 sum exactly as the path computes it
(VPDPBUSD and the widening path exactly, VPMADDUBSW with its saturating pairs under
``faithful``), then ``output_pipeline``, the same f32 operations in the same order as
the generated code. A second test holds the model to the seed's formula in float64.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from primitives.attr import Attr, PostOps
from primitives.matmul import InnerProductDesc, MatmulDesc
from primitives.memory import Memory, desc
from primitives.reference import gemm_sum, output_pipeline, wrap_int32
from primitives.reorder import reorder_desc
from tests.conftest import assert_same_bits, faithful_model

SETTINGS = settings(max_examples=int(os.environ.get("INT8JIT_TEST_EXAMPLES", "25")), deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
ELTWISE = [("relu", 0.0, 0.0), ("relu", 0.25, 0.0), ("clip", -3.0, 40.0), ("linear", 0.5, 2.0), ("abs", 0, 0),
           ("tanh", 0, 0), ("logistic", 0, 0), ("gelu_erf", 0, 0), ("swish", 1.0, 0), ("round", 0, 0)]
NP = {"u8": np.uint8, "s8": np.int8, "s32": np.int32, "f32": np.float32}


def _rand(rng, dt, shape):
    lo, hi = {"u8": (0, 256), "s8": (-128, 128)}[dt]
    return rng.integers(lo, hi, shape).astype(NP[dt])


def model(src, wei, *, policy, isa, zp_src=0, s_src=None, s_wei=None, bias=None, post=(), old=None,
          s_dst=None, zp_dst=None, dst_dt="s32", plain=False):
    """The reference pipeline for a 2-D problem (src M x K, wei K x N)."""
    v = wrap_int32(gemm_sum(src, wei, zp_src, 0, faithful_model(policy, isa)))
    if plain:
        return v
    scale = None
    if s_src is not None or s_wei is not None:
        scale = np.float32(1 if s_src is None else s_src) * (np.float32([1]) if s_wei is None else s_wei)
    return output_pipeline(v, dst_dt=dst_dt, scale=scale, bias=bias, post_ops=post, dst_old=old, dst_scale=s_dst,
                           dst_zp=zp_dst)


@st.composite
def problems(draw):
    M, K, N = draw(st.integers(1, 40)), draw(st.integers(1, 90)), draw(st.integers(1, 70))
    post = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["eltwise", "sum", "binary"]))
        if kind == "eltwise":
            post.append(("eltwise",) + draw(st.sampled_from(ELTWISE)))
        elif kind == "sum" and not any(p[0] == "sum" for p in post):
            post.append(("sum", draw(st.sampled_from([1.0, 0.5, -2.0])), draw(st.integers(-5, 5))))
        elif kind == "binary":
            post.append(("binary", draw(st.sampled_from(["add", "mul", "max", "min", "sub", "div"])),
                         draw(st.sampled_from(["common", "col", "row", "full"]))))
    return dict(
        M=M, K=K, N=N, src_dt=draw(st.sampled_from(["u8", "s8"])), dst_dt=draw(st.sampled_from(list(NP))),
        s_src=draw(st.sampled_from([None, 0.5, 0.031])), wmask=draw(st.sampled_from([None, 0, 2])),
        bias=draw(st.sampled_from([None, "f32", "s32"])), zp_src=draw(st.sampled_from([None, 0, 3, -7])),
        zp_dst=draw(st.sampled_from([None, 0, 2])), s_dst=draw(st.sampled_from([None, 1.0, 7.5, -2.0, 0.0, 1e-45])),
        post=post, seed=draw(st.integers(0, 2**31)), policy=draw(st.sampled_from(["exact", "faithful"])),
        packed=draw(st.booleans()), weights=draw(st.sampled_from(["random", "random", "sparse"])))


def _run(p, isa):
    rng = np.random.default_rng(p["seed"])
    M, K, N, dst_dt = p["M"], p["K"], p["N"], p["dst_dt"]
    src = _rand(rng, p["src_dt"], (M, K))
    wei = _rand(rng, "s8", (K, N))
    if p.get("weights") == "sparse":  # |w| <= 64 but a few large ones: exact splits them into residual
        wei = rng.integers(-64, 65, (K, N)).astype(np.int8)  # cells (tests/test_gemm_split.py)
        large = rng.random((K, N)) < 0.02
        wei[large] = rng.choice(np.array([127, -128, 110], np.int8), int(large.sum()))
        if rng.integers(2):  # sources at the top of their range: the large pairs saturate VPMADDUBSW
            src[...] = 255 if p["src_dt"] == "u8" else 127
    scales, zps, args = {}, {}, {}
    if p["s_src"] is not None:
        scales["src"] = 0
        args["scales:src"] = np.float32([p["s_src"]])
    s_wei = None
    if p["wmask"] is not None:
        scales["weights"] = p["wmask"]
        s_wei = rng.uniform(0.001, 0.05, N if p["wmask"] else 1).astype(np.float32)
        args["scales:weights"] = s_wei
    if p["s_dst"] is not None:
        scales["dst"] = 0
        args["scales:dst"] = np.float32([p["s_dst"]])
    if p["zp_src"] is not None:
        zps["src"] = 0
        args["zero_points:src"] = np.int32([p["zp_src"]])
    zp_dst = None
    if p["zp_dst"] is not None:
        zps["dst"] = p["zp_dst"]
        zp_dst = rng.integers(-4, 5, N if p["zp_dst"] else 1).astype(np.int32)
        args["zero_points:dst"] = zp_dst
    po, model_post = PostOps(), []
    for i, e in enumerate(p["post"]):
        if e[0] == "eltwise":
            po.eltwise(*e[1:])
            model_post.append(e)
        elif e[0] == "sum":
            po.sum(e[1], e[2])
            model_post.append(("sum", e[1], e[2]))
        else:
            dims = {"common": (1, 1), "col": (1, N), "row": (M, 1), "full": (M, N)}[e[2]]
            po.binary(e[1], desc(dims, "f32", "ab"))
            src1 = rng.uniform(-3, 3, dims).astype(np.float32)
            src1[src1 == 0] = 1
            args[f"post_op:{i}:src_1"] = src1
            model_post.append(("binary", e[1], src1))
    attr = Attr(scales=scales, zero_points=zps, post_ops=po, policy=p["policy"])
    bias = None
    bias_md = None
    if p["bias"] is not None:
        bias = (rng.uniform(-50, 50, N) if p["bias"] == "f32" else rng.integers(-500, 500, N)).astype(NP[p["bias"]])
        bias_md = desc((N,), p["bias"], "a")
        args["bias"] = bias
    layout = p.get("layout", "ab")  # plain weights' tag: ab (rows of N) or ba (columns of K)
    pd = MatmulDesc(desc((M, K), p["src_dt"], "ab"), desc((K, N), "s8", "any" if p["packed"] else layout),
                    desc((M, N), dst_dt, "ab"), bias_md, attr=attr, isa=isa, threads=1 + p["seed"] % 2)
    if p["packed"]:
        wmem = Memory(pd.weights_desc())
        reorder_desc(desc((K, N), "s8", "ab"), pd.weights_desc()).create().execute({"src": wei, "dst": wmem})
        args["weights"] = wmem
    else:
        args["weights"] = wei if layout == "ab" else np.asfortranarray(wei)
    old = (rng.integers(-100, 100, (M, N)) if dst_dt != "u8" else rng.integers(0, 255, (M, N))).astype(NP[dst_dt])
    dst = old.copy()
    args.update(src=src, dst=dst)
    prim = pd.create()
    prim.execute(args)
    # Again on new arrays of the same layouts (the replay moved to them where it can,
    # Replay.moves; else the full path): the same result, the first call's dst untouched.
    again = {k: v if isinstance(v, Memory) else v.copy(order="K") for k, v in args.items()}
    again["dst"] = old.copy()
    first = dst.copy()
    prim.execute(again)
    np.testing.assert_array_equal(again["dst"], first)
    np.testing.assert_array_equal(dst, first)
    plain = dst_dt == "s32" and not scales and not model_post and bias is None and p["zp_dst"] is None
    want = model(src, wei, policy=p["policy"], isa=isa, zp_src=p["zp_src"] or 0, s_src=p["s_src"], s_wei=s_wei,
                 bias=None if bias is None else bias.astype(np.float32), post=model_post, old=old,
                 s_dst=p["s_dst"], zp_dst=None if zp_dst is None else zp_dst.astype(np.float32), dst_dt=dst_dt,
                 plain=plain)
    return dst, want


@SETTINGS
@given(p=problems())
def test_matmul_matches_model(isa_path, p):
    dst, want = _run(p, isa_path)
    assert_same_bits(dst, want)


@SETTINGS
@given(p=problems(), m=st.integers(1, 4), layout=st.sampled_from(["ab", "ba"]))
def test_in_place_matmul_matches_model(isa_path, p, m, layout):
    """Runtime weights as rows of N (tag ab) or columns of K (ba) times 1-4 rows: on VNNI
    paths the kernels that read them in place (tests/test_gemv.py), with every attribute
    of the pipeline."""
    p.update(M=m, packed=False, layout=layout)
    dst, want = _run(p, isa_path)
    assert_same_bits(dst, want)


@SETTINGS
@given(p=problems(), k=st.integers(16, 140), n=st.sampled_from([2048, 4096]))
def test_chunked_in_place_matmul_matches_model(isa_path, p, k, n):
    """One row times runtime weights whose rows alias in the caches (N = 2048, 4096):
    read in place in chunks of K (gemv_driver.ChunkedRows: s32 partial sums, then the
    output stage adding them), with every attribute of the pipeline."""
    p.update(M=1, K=k, N=n, packed=False, layout="ab")
    dst, want = _run(p, isa_path)
    assert_same_bits(dst, want)


@st.composite
def wide_problems(draw):
    """``problems`` at up to 150 rows, K of 800 and 200 columns: several column tiles and
    row blocks a thread, K past the unrolled loop many times, the threads' splits."""
    p = draw(problems())
    p.update(M=draw(st.integers(1, 150)), K=draw(st.integers(1, 800)), N=draw(st.integers(1, 200)))
    return p


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(p=wide_problems())
def test_wide_matmul_matches_model(isa_path, p):
    dst, want = _run(p, isa_path)
    assert_same_bits(dst, want)


@pytest.mark.parametrize("dst_dt", list(NP))
def test_whole_column_tiles_match_model(isa_path, dst_dt):
    """N = 48 is whole column tiles on every path: the kernel made for it has no masked
    tail (plain loads of the old dst for the sum, of the binary operands, plain stores),
    and computes the same as the model."""
    from primitives.matmul import MatmulDesc as Desc

    post = [("sum", 0.5, 3), ("binary", "add", "col"), ("eltwise", "relu", 0.0, 0.0), ("binary", "mul", "full")]
    for policy, seed in (("exact", 1), ("faithful", 2)):
        p = dict(M=7, K=37, N=48, src_dt="u8", dst_dt=dst_dt, s_src=0.5, wmask=2, bias="f32", zp_src=3, zp_dst=2,
                 s_dst=7.5, post=post, seed=seed, policy=policy, packed=True)
        dst, want = _run(p, isa_path)
        assert_same_bits(dst, want)
    pd = Desc(desc((7, 37), "u8", "ab"), desc((37, 48), "s8", "any"), desc((7, 48), dst_dt, "ab"), isa=isa_path)
    assert pd._kernel_for(pd.fast).meta["kspec"].n_tail is False


def test_seed_example_every_path(isa_path):
    """The seeds' saturation example: exact everywhere; faithful saturates on VPMADDUBSW."""
    src = np.array([[255, 255, 0, 0]], np.uint8)
    wei = np.array([[127], [127], [0], [0]], np.int8)
    out = {}
    for policy in ("exact", "faithful"):
        pd = MatmulDesc(desc((1, 4), "u8", "ab"), desc((4, 1), "s8", "ab"), desc((1, 1), "s32", "ab"),
                        attr=Attr(policy=policy), isa=isa_path)
        dst = np.zeros((1, 1), np.int32)
        pd.create().execute({"src": src, "weights": wei, "dst": dst})
        out[policy] = int(dst[0, 0])
        assert pd.impl_info()["exact"] == (policy == "exact" or isa_path.endswith("vnni"))
    assert out["exact"] == 64770
    assert out["faithful"] == (64770 if isa_path.endswith("vnni") else 32767)


@pytest.mark.parametrize("sb,wb", [(3, 1), (3, 3), (1, 3)])
@pytest.mark.parametrize("K", [37, 3])
def test_batched_matmul(isa_path, sb, wb, K):
    """A batch of 3: src's and weights' batch dims each 3 or 1 (broadcast, as oneDNN's),
    runtime and packed weights, K under 4 (the padded source) too, twice (a replay)."""
    rng = np.random.default_rng(1)
    B, M, N = 3, 5, 20
    src = _rand(rng, "u8", (sb, M, K))
    wei = _rand(rng, "s8", (wb, K, N))
    src1 = rng.uniform(-1, 1, (B, M, N)).astype(np.float32)
    attr = Attr(scales={"weights": 4}).set_post_ops(PostOps().binary("add", desc((B, M, N), "f32", "abc")))
    for tag in ("abc",) + (("any",) if wb == 1 else ()):
        pd = MatmulDesc(desc((sb, M, K), "u8", "abc"), desc((wb, K, N), "s8", tag), desc((B, M, N), "f32", "abc"),
                        attr=attr, isa=isa_path)
        weights = wei
        if tag == "any":
            weights = Memory(pd.weights_desc())
            reorder_desc(desc((wb, K, N), "s8", "abc"), pd.weights_desc()).create().execute(
                {"src": wei, "dst": weights})
        s_wei = rng.uniform(0.01, 0.1, N).astype(np.float32)
        dst = np.zeros((B, M, N), np.float32)
        prim = pd.create()
        for _ in range(2):
            dst[...] = 0
            prim.execute({"src": src, "weights": weights, "dst": dst, "scales:weights": s_wei,
                          "post_op:0:src_1": src1})
            for b in range(B):
                want = model(src[b % sb], wei[b % wb], policy="exact", isa=isa_path, s_wei=s_wei,
                             post=[("binary", "add", src1[b])], dst_dt="f32")
                np.testing.assert_array_equal(dst[b], want)


@pytest.mark.parametrize("wb", [1, 3])
def test_batched_binary_operands_broadcast(isa_path, wb):
    """A binary post-op operand of a batched matmul, each dim dst's or 1 (oneDNN's
    broadcast): one value, a row of columns, a column of rows or a full matrix, for every
    batch item or one per item (those of one value or one per column per item make the
    batch a GEMM per item), on one GEMM of all rows (wb = 1) and one per item."""
    rng = np.random.default_rng(5)
    B, M, K, N = 3, 5, 12, 20
    src = _rand(rng, "u8", (B, M, K))
    wei = _rand(rng, "s8", (wb, K, N))
    for dims in [(1, 1, 1), (B, 1, 1), (1, 1, N), (B, 1, N), (1, M, 1), (B, M, 1), (1, M, N), (B, M, N)]:
        src1 = rng.uniform(-2, 2, dims).astype(np.float32)
        attr = Attr().set_post_ops(PostOps().binary("mul", desc(dims, "f32", "abc")))
        pd = MatmulDesc(desc((B, M, K), "u8", "abc"), desc((wb, K, N), "s8", "abc"), desc((B, M, N), "f32", "abc"),
                        attr=attr, isa=isa_path)
        assert pd.flat() == (wb == 1 and (dims[0] == 1 or dims[1] > 1))
        dst = np.zeros((B, M, N), np.float32)
        pd.create().execute({"src": src, "weights": wei, "dst": dst, "post_op:0:src_1": src1})
        for b in range(B):
            operand = np.broadcast_to(src1[b % dims[0]], (M, N))
            want = model(src[b], wei[b % wb], policy="exact", isa=isa_path, post=[("binary", "mul", operand)],
                         dst_dt="f32")
            np.testing.assert_array_equal(dst[b], want, err_msg=str(dims))


@pytest.mark.parametrize("threads", [1, 2])
def test_items_dealt_to_threads_with_shared_weights(isa_path, threads):
    """Runtime weights shared by every item (a batch of 1) and an operand per item, which
    makes the batch a GEMM per item; on two threads items go whole to each. Each item
    needs its own plan: one plan for all had every item's calls run on the last item's
    arrays (the others never written, or a crash). Repeated, and on new arrays."""
    rng = np.random.default_rng(threads)
    B, M, K, N = 4, 5, 8, 16
    for dims in [(B, 1, 1), (B, 1, N)]:
        pd = MatmulDesc(desc((B, M, K), "u8", "abc"), desc((1, K, N), "s8", "abc"), desc((B, M, N), "f32", "abc"),
                        attr=Attr().set_post_ops(PostOps().binary("mul", desc(dims, "f32", "abc"))),
                        isa=isa_path, threads=threads)
        p = pd.create()
        for _ in range(3):
            src, wei = _rand(rng, "u8", (B, M, K)), _rand(rng, "s8", (1, K, N))
            src1 = rng.uniform(-2, 2, dims).astype(np.float32)
            dst = np.zeros((B, M, N), np.float32)
            for _ in range(2):
                p.execute({"src": src, "weights": wei, "dst": dst, "post_op:0:src_1": src1})
                want = np.matmul(src.astype(np.int64), wei.astype(np.int64)).astype(np.float32) * src1
                np.testing.assert_array_equal(dst, want, err_msg=str(dims))
                src[...], wei[...] = _rand(rng, "u8", (B, M, K)), _rand(rng, "s8", (1, K, N))


@pytest.mark.parametrize("dims,tag", [((6, 20), "ba"), ((3, 6, 20), "acb"), ((3, 6, 20), "bac")])
def test_binary_operands_in_any_plain_tag(dims, tag):
    """A binary operand's tag says how its bytes lie; the kernel reads row-major, so any
    other tag is read through its logical view (copied), as a Memory or as an array of
    the logical shape (both had been read as if row-major)."""
    rng = np.random.default_rng(len(tag))
    src_d, wei_d = dims[:-1] + (12,), dims[:-2] + (12, dims[-1])
    src, wei = _rand(rng, "u8", src_d), _rand(rng, "s8", wei_d)
    src1 = rng.uniform(-2, 2, dims).astype(np.float32)
    plain = "ab" if len(dims) == 2 else "abc"
    pd = MatmulDesc(desc(src_d, "u8", plain), desc(wei_d, "s8", plain), desc(dims, "f32", plain),
                    attr=Attr().set_post_ops(PostOps().binary("add", desc(dims, "f32", tag))))
    p = pd.create()
    want = np.matmul(src.astype(np.int64), wei.astype(np.int64)).astype(np.float32) + src1
    memory = Memory(desc(dims, "f32", tag))
    memory.logical()[...] = src1
    for operand in (memory, memory.logical()):
        for _ in range(2):
            dst = np.zeros(dims, np.float32)
            p.execute({"src": src, "weights": wei, "dst": dst, "post_op:0:src_1": operand})
            np.testing.assert_array_equal(dst, want)


def test_weights_packed_for_another_primitive_are_refused_saying_how():
    """Packed weights of another layout (here another policy's) print alike as
    descriptors; the error names the two layouts instead."""
    made = {}
    for policy in ("exact", "faithful"):
        made[policy] = MatmulDesc(desc((3, 16), "u8", "ab"), desc((16, 40), "s8", "any"), desc((3, 40), "s32", "ab"),
                                  attr=Attr(policy=policy), isa="avx2")
    packed = Memory(made["exact"].weights_desc())
    reorder_desc(desc((16, 40), "s8", "ab"), made["exact"].weights_desc()).create().execute(
        {"src": np.ones((16, 40), np.int8), "dst": packed})
    with pytest.raises(ValueError, match=r"^weights: memory is packed as .*policy='exact'.*; this primitive reads "
                                         r".*policy='faithful'.*reorder the weights into its weights_desc"):
        made["faithful"].create().execute({"src": np.ones((3, 16), np.uint8), "weights": packed,
                                           "dst": np.zeros((3, 40), np.int32)})


def test_batched_matmul_batch_dims_must_broadcast_to_dst():
    def make(sb, wb, db):
        return MatmulDesc(desc((sb, 4, 8), "u8", "abc"), desc((wb, 8, 5), "s8", "abc"), desc((db, 4, 5), "s32", "abc"))
    with pytest.raises(ValueError, match=r"^src: batch dim 2 is neither dst's \(3\) nor 1"):
        make(2, 3, 3)
    with pytest.raises(ValueError, match=r"^weights: batch dim 2 is neither dst's \(3\) nor 1"):
        make(3, 2, 3)
    with pytest.raises(ValueError, match=r"^dst: batch dim 3; src's and weights' \(1 and 1\) broadcast to 1"):
        make(1, 1, 3)
    assert make(1, 3, 3).impl_info()["shape"][0] == 3


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_inner_product_matches_matmul(isa_path, layout):
    rng = np.random.default_rng(2)
    N, C, H, W, OC = 3, 5, 3, 2, 17
    x = _rand(rng, "u8", (N, C, H, W))
    w = _rand(rng, "s8", (OC, C, H, W))
    phys = x if layout == "nchw" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    pd = InnerProductDesc(desc((N, C, H, W), "u8", layout), desc((OC, C, H, W), "s8", "any"),
                          desc((N, OC), "s32", "nc"), isa=isa_path)
    wmem = Memory(pd.weights_desc())
    reorder_desc(desc((OC, C, H, W), "s8", "oihw"), pd.weights_desc()).create().execute({"src": w, "dst": wmem})
    dst = np.zeros((N, OC), np.int32)
    pd.create().execute({"src": phys, "weights": wmem, "dst": dst})
    want = x.reshape(N, -1).astype(np.int64) @ w.reshape(OC, -1).T.astype(np.int64)
    np.testing.assert_array_equal(dst, want)


def test_per_channel_quantization_workflow(isa_path):
    """Seed 001's workflow on an inner product: quantize weights per OC through reorder,
    run with u8 output, dequantize, compare with the f32 computation."""
    from primitives.reorder import dequantize, quantize

    rng = np.random.default_rng(3)
    N, IC, OC = 8, 64, 24
    x = rng.uniform(0, 4, (N, IC)).astype(np.float32)
    w = rng.normal(0, 1, (OC, IC)).astype(np.float32)
    b = rng.normal(0, 1, OC).astype(np.float32)
    ref = np.maximum(x @ w.T + b, 0)
    s_x, s_w = np.float32(4 / 255), (np.abs(w).max(axis=1) / 127).astype(np.float32)
    s_d = np.float32(ref.max() / 255)
    xq = quantize(x, s_x, dt="u8")
    wq = quantize(w, s_w, dt="s8", axis=0)
    attr = Attr(scales={"src": 0, "weights": 1, "dst": 0}).set_post_ops(PostOps().eltwise("relu"))
    pd = InnerProductDesc(desc((N, IC), "u8", "nc"), desc((OC, IC), "s8", "oi"), desc((N, OC), "u8", "nc"),
                          desc((OC,), "f32", "a"), attr=attr, isa=isa_path)
    dst = np.zeros((N, OC), np.uint8)
    pd.create().execute({"src": xq, "weights": wq, "bias": b, "dst": dst, "scales:src": np.float32([s_x]),
                         "scales:weights": s_w, "scales:dst": np.float32([s_d])})
    got = dequantize(dst, s_d)
    # Quantization error: half a step of the output plus the input/weight rounding.
    bound = s_d / 2 + (np.abs(x).sum(axis=1)[:, None] * s_w[None, :] / 2 + s_x / 2 * np.abs(w).sum(axis=1)[None, :])
    assert np.all(np.abs(got - ref) <= bound + 1e-4)


def test_u8_output_against_formula():
    """The model against the seed's formula in float64: equal except within an ulp of a
    rounding boundary (x.5 after scaling), where f32 and f64 can round differently."""
    rng = np.random.default_rng(4)
    v = rng.integers(-2**20, 2**20, (200, 200)).astype(np.int32)
    s = rng.uniform(1e-4, 1e-3, 200).astype(np.float32)
    got = output_pipeline(v, dst_dt="u8", scale=s, dst_zp=np.float32(128))
    exact = np.clip(np.rint(v.astype(np.float64) * s.astype(np.float64) + 128), 0, 255)
    differ = got != exact
    frac = np.abs(np.abs(v * s.astype(np.float64)) % 1 - 0.5)
    assert np.all(frac[differ] < 1e-4)  # every difference sits on a tie
    assert differ.sum() <= 0.001 * differ.size


@pytest.mark.parametrize("bad", ["src_zp_mask", "wei_zp", "mask", "post_op", "scratchpad", "halve"])
def test_bad_input(bad):
    src, wei, dst = desc((4, 8), "u8", "ab"), desc((8, 5), "s8", "ab"), desc((4, 5), "u8", "ab")
    if bad == "src_zp_mask":
        with pytest.raises(ValueError, match="zero_points:src"):
            MatmulDesc(src, wei, dst, attr=Attr(zero_points={"src": 2}))
    elif bad == "wei_zp":
        with pytest.raises(ValueError, match="zero_points:weights"):
            MatmulDesc(src, wei, dst, attr=Attr(zero_points={"weights": 0}))
    elif bad == "mask":
        pd = MatmulDesc(src, wei, dst, attr=Attr(scales={"weights": 2}))
        with pytest.raises(ValueError, match="scales:weights"):
            pd.create().execute({"src": np.zeros((4, 8), np.uint8), "weights": np.zeros((8, 5), np.int8),
                                 "dst": np.zeros((4, 5), np.uint8), "scales:weights": np.ones(4, np.float32)})
    elif bad == "post_op":
        with pytest.raises(ValueError, match="post_ops"):
            MatmulDesc(src, wei, dst, attr=Attr(post_ops=PostOps().binary("add", desc((4, 5), "u8", "ab"))))
    elif bad == "scratchpad":
        pd = MatmulDesc(src, wei, dst, attr=Attr(scratchpad_mode="user"))
        assert pd.scratchpad_desc().nbytes > 0
        with pytest.raises(ValueError, match="scratchpad"):
            pd.create().execute({"src": np.zeros((4, 8), np.uint8), "weights": np.zeros((8, 5), np.int8),
                                 "dst": np.zeros((4, 5), np.uint8), "scratchpad": np.zeros(8, np.uint8)})
    else:
        with pytest.raises(ValueError, match="policy"):
            MatmulDesc(src, wei, dst, attr=Attr(policy="halve_weights"))


@pytest.mark.parametrize("M", [33, 2])
def test_user_scratchpad_two_threads(isa_path, M):
    """One primitive run from two threads at once, each with its own user scratchpad
    (M = 2: runtime weights read in place, tests/test_gemv.py)."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(5)
    K, N = 70, 45
    attr = Attr(scales={"weights": 2}, scratchpad_mode="user")
    pd = MatmulDesc(desc((M, K), "u8", "ab"), desc((K, N), "s8", "ab"), desc((M, N), "s8", "ab"), attr=attr,
                    isa=isa_path, threads=1)
    prim = pd.create()
    wei = _rand(rng, "s8", (K, N))

    def job(seed):
        r = np.random.default_rng(seed)
        src = _rand(r, "u8", (M, K))
        s = r.uniform(0.001, 0.01, N).astype(np.float32)
        dst = np.zeros((M, N), np.int8)
        pad = np.zeros(pd.scratchpad_desc().nbytes, np.uint8)
        for _ in range(20):
            prim.execute({"src": src, "weights": wei, "dst": dst, "scales:weights": s, "scratchpad": pad})
        return np.array_equal(dst, model(src, wei, policy="exact", isa=isa_path, s_wei=s, dst_dt="s8"))

    with ThreadPoolExecutor(2) as pool:
        assert all(pool.map(job, range(4)))


@pytest.mark.parametrize("dst_dt", ["u8", "s8", "s32", "f32"])
@pytest.mark.parametrize("where", ["end", "start"])
@pytest.mark.parametrize("weights", ["uniform", "split"])
def test_guard_pages(isa_path, guarded, dst_dt, where, weights):
    """Every tail width of a row, with src, weights, dst and binary operands against a
    PROT_NONE page (and runtime weights: uniform ones, read in place at 1-4 rows, in
    chunks of K at 1 x 21 x 2048): any access past a buffer faults. ``split``: small weights with an
    unsafe pair at the end of K (the exact path's residual cells on VPMADDUBSW ISAs:
    at K = 68/69 of 70 the cell reads A's last dword of a row)."""
    rng = np.random.default_rng(6)
    for M, K, N in ((3, 5, 17), (2, 1, 9), (7, 13, 3), (1, 70, 33), (1, 21, 2048)):  # (the last: K in chunks)
        src = guarded(M * K, np.uint8, where).reshape(M, K)
        src[:] = _rand(rng, "u8", (M, K))
        dst = guarded(M * N, NP[dst_dt], where).reshape(M, N)
        dst[:] = 1
        src1 = guarded(M * N, np.float32, where).reshape(M, N)
        src1[:] = rng.uniform(-2, 2, (M, N))
        col = guarded(N, np.float32, where).reshape(1, N)
        col[:] = 0.5
        po = PostOps().sum(0.5).binary("add", desc((M, N), "f32", "ab")).binary("mul", desc((1, N), "f32", "ab"))
        # (split: packed once through any, where the proof decides; runtime weights widen)
        pd = MatmulDesc(desc((M, K), "u8", "ab"), desc((K, N), "s8", "any" if weights == "split" else "ab"),
                        desc((M, N), dst_dt, "ab"), attr=Attr(scales={"src": 0}, post_ops=po), isa=isa_path)
        wei = _rand(rng, "s8", (K, N))
        if weights == "split":
            wei = rng.integers(-20, 21, (K, N)).astype(np.int8)
            if K >= 2:
                wei[2 * ((K - 2) // 2):][:2, N - 1] = 127
        wmem = guarded(K * N, np.int8, where).reshape(K, N)  # (runtime weights: read in place at 1-4 rows)
        wmem[:] = wei
        if weights == "split":
            wmem = Memory(pd.weights_desc())
            reorder_desc(desc((K, N), "s8", "ab"), pd.weights_desc()).create().execute({"src": wei, "dst": wmem})
        old = dst.copy()
        prim = pd.create()
        prim.execute({"src": src, "weights": wmem, "dst": dst, "scales:src": np.float32([0.01]),
                      "post_op:1:src_1": src1, "post_op:2:src_1": col})
        want = model(src, wei, policy="exact", isa=isa_path, s_src=0.01, old=old, dst_dt=dst_dt,
                     post=[("sum", 0.5, 0), ("binary", "add", src1), ("binary", "mul", col)])
        np.testing.assert_array_equal(dst, want)
        if weights == "uniform" and N == 2048:
            assert prim.impl_info()["runtime_weights"].endswith("_partial")
        if weights == "split" and K >= 2 and not isa_path.endswith("vnni"):
            assert any("_cells_" in name for name in prim.impl_info()["kernels_run"])


@st.composite
def zero_k_problems(draw):
    """``problems`` with K = 0 (threads, policies, packed weights and attributes as drawn)."""
    p = draw(problems())
    p.update(K=0)
    return p


@SETTINGS
@given(p=zero_k_problems())
def test_zero_k_matmul_matches_model(isa_path, p):
    """K = 0: no product, so dst is the output stage of 0 (scales, bias, post-ops with the
    old dst and the binary operands, dst scale and zero point), as numpy's matmul gives
    zeros; oneDNN's matmul writes nothing (measured: 3.2 leaves dst as it was)."""
    dst, want = _run(p, isa_path)
    assert_same_bits(dst, want)


@pytest.mark.parametrize("dims, tag", [((2, 1, 3), "cab"), ((2, 1, 3), "cba"), ((2, 1, 3), "bca"),
                                       ((2, 1, 1), "cba"), ((2, 2, 1), "cab"), ((2, 2, 3), "acb"),
                                       ((1, 2, 1), "cba"), ((2, 1, 3), "abc")])
def test_batched_binary_operand_in_any_tag(dims, tag):
    """A batched matmul's binary operand in a tag other than row-major, per item or not,
    read in logical order at every call: new arrays at each call (the replay moved to
    them), then the same arrays with new values. A per-item operand with N outer to the
    batch had been read as row-major at every call; a moved call read the operand's
    memory-order array (wrong values, or a reshape error)."""
    B, M, K, N = 2, 2, 4, 3
    perm = [ord(c) - ord("a") for c in tag]
    for weights_batch in (1, B):
        pd = MatmulDesc(desc((B, M, K), "u8", "abc"), desc((weights_batch, K, N), "s8", "abc"),
                        desc((B, M, N), "f32", "abc"),
                        attr=Attr(post_ops=PostOps().binary("add", desc(dims, "f32", tag))))
        prim = pd.create()
        src, w = np.ones((B, M, K), np.uint8), np.ones((weights_batch, K, N), np.int8)
        same = None
        for call in range(5):
            logical = (np.arange(np.prod(dims), dtype=np.float32) + 10 * call).reshape(dims)
            if call < 3 or same is None:
                same = np.ascontiguousarray(logical.transpose(perm))
                dst = np.zeros((B, M, N), np.float32)
            else:  # (the same arrays, the operand's values changed in place)
                same[...] = logical.transpose(perm)
            prim.execute({"src": src, "weights": w, "dst": dst, "post_op:0:src_1": same})
            np.testing.assert_array_equal(dst, K + np.broadcast_to(logical, (B, M, N)), err_msg=f"call {call}")
