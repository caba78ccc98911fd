"""Zero-volume problems, taken where oneDNN 3.2 takes them (measured through cffi).

oneDNN accepts a 0 in a matmul's dims, an inner product's or a convolution's batch,
and a pooling's batch or channels, and runs such a primitive as a no-op ("ref:any"); it
refuses a 0 in an inner product's K or OC and in a convolution's channels. int8jit
takes the same ones: the descriptor checks everything it checks for any other problem
(types, tags, attributes, post-op operands), ``execute`` checks the arguments as
always, and nothing is written. One difference, by choice: a matmul with K = 0 and a
non-empty dst computes the output stage of 0 (tests/test_matmul.py); oneDNN's leaves
dst as it was.
"""
from __future__ import annotations

import numpy as np
import pytest

from primitives.attr import Attr, PostOps
from primitives.conv import ConvolutionDesc
from primitives.matmul import InnerProductDesc, MatmulDesc
from primitives.memory import Memory, desc
from primitives.pooling import PoolingDesc, pool2d
from primitives.reorder import ReorderDesc, dequantize, quantize, reorder_desc


def _attr(weights_mask: int, dst_zp_mask: int, binary_dims) -> Attr:
    po = PostOps().sum(0.5).binary("add", desc(binary_dims, "f32", "abcd"[:len(binary_dims)])).eltwise("relu")
    return Attr(scales={"src": 0, "weights": weights_mask}, zero_points={"src": 0, "dst": dst_zp_mask}, post_ops=po)


def _no_op(pd, args: dict, dst: np.ndarray) -> None:
    """``pd`` is zero-volume: it asks for no scratchpad, runs (its dst has no element to
    write: that nothing is written where oneDNN writes nothing is test_onednn_prim's
    peer test), and still names a wrong argument."""
    info = pd.impl_info()
    assert info["impl"] == "zero_volume" and "zero volume" in info["decision"]
    assert info["isa"] == "any" and "isa=any" in repr(pd)  # no machine code runs
    assert pd.scratchpad_desc().size == 0 and dst.size == 0
    prim = pd.create()
    prim.execute(args)
    prim.bind(dict(args))()
    for name, value in args.items():
        if isinstance(value, np.ndarray) and not name.startswith(("scales", "zero_points")):
            wrong = np.zeros(tuple(d + 1 for d in value.shape), value.dtype)
            with pytest.raises(ValueError, match=f"^{name}: "):
                prim.execute({**args, name: wrong})
    with pytest.raises(ValueError, match="^args: missing argument 'src'"):
        prim.execute({k: v for k, v in args.items() if k != "src"})


@pytest.mark.parametrize("batch, M, K, N", [(None, 0, 5, 3), (None, 4, 5, 0), (None, 0, 0, 0), (0, 3, 5, 4),
                                            (2, 0, 7, 9)])
def test_matmul_of_zero_volume_is_a_checked_no_op(batch, M, K, N):
    lead = () if batch is None else (batch,)
    tag = "abc"[:len(lead) + 2]
    ones = (1,) * len(lead)
    attr = _attr(1 << (len(lead) + 1), 1 << (len(lead) + 1), ones + (1, N))
    pd = MatmulDesc(desc(lead + (M, K), "u8", tag), desc(ones + (K, N), "s8", "any"),
                    desc(lead + (M, N), "u8", tag), desc((N,), "f32", "a"), attr=attr)
    # There is nothing to pack: 'any' is the row-major layout, as oneDNN's zero-volume matmul reports it.
    assert pd.weights_desc() == desc(ones + (K, N), "s8", tag)
    dst = np.full(lead + (M, N), 7, np.uint8)
    args = {"src": np.zeros(lead + (M, K), np.uint8), "weights": np.zeros(pd.weights_desc().dims, np.int8),
            "dst": dst, "bias": np.zeros(N, np.float32), "scales:src": np.float32([0.5]),
            "scales:weights": np.ones(N, np.float32), "zero_points:src": np.int32([3]),
            "zero_points:dst": np.zeros(N, np.int32), "post_op:1:src_1": np.zeros(ones + (1, N), np.float32)}
    _no_op(pd, args, dst)
    with pytest.raises(ValueError, match=f"^scales:weights: got 1 values?; expected {N}"):
        pd.create().execute({**args, "scales:weights": np.float32([1])})
    with pytest.raises(ValueError, match="^attr scales:weights"):  # the attributes are checked as ever
        MatmulDesc(desc((M, K), "u8", "ab"), desc((K, N), "s8", "ab"), desc((M, N), "u8", "ab"),
                   attr=Attr(scales={"weights": 1}))


def test_inner_product_takes_a_zero_batch_only():
    pd = InnerProductDesc(desc((0, 8, 3, 3), "s8", "nhwc"), desc((5, 8, 3, 3), "s8", "any"),
                          desc((0, 5), "f32", "ab"), attr=Attr(scales={"weights": 1}))
    assert pd.weights_desc().dims == (5, 8, 3, 3) and not pd.weights_desc().is_packed
    dst = np.zeros((0, 5), np.float32)
    _no_op(pd, {"src": np.zeros((0, 3, 3, 8), np.int8), "weights": np.zeros((5, 8, 3, 3), np.int8), "dst": dst,
                "scales:weights": np.ones(5, np.float32)}, dst)
    for src_dims, w_dims, dst_dims, where in (((2, 0), (5, 0), (2, 5), r"weights: dimension 1 is 0"),
                                              ((2, 8), (0, 8), (2, 0), r"weights: dimension 0 is 0"),
                                              ((2, 8, 0), (5, 8, 0), (2, 5), r"weights: dimension 2 is 0")):
        with pytest.raises(ValueError, match=f"^{where} .*inner_product takes a 0 only in the batch"):
            InnerProductDesc(desc(src_dims, "u8"), desc(w_dims, "s8"), desc(dst_dims, "s32"))


@pytest.mark.parametrize("IC, OC, groups, tag", [(4, 8, 1, "nhwc"), (8, 8, 8, "nchw"), (6, 4, 2, "nhwc"),
                                                 (3, 64, 1, "nchw")])
def test_convolution_takes_a_zero_batch_only(IC, OC, groups, tag):
    """A batch of 0 (depthwise shapes included: they take the general descriptor's no-op)."""
    w = (groups, OC // groups, IC // groups, 3, 3) if groups > 1 else (OC, IC, 3, 3)
    mask = 3 if groups > 1 else 1
    attr = _attr(mask, 2, (1, OC, 1, 1))
    pd = ConvolutionDesc(desc((0, IC, 6, 5), "u8", tag), desc(w, "s8", "any"), desc((0, OC, 6, 5), "s8", tag),
                         desc((OC,), "s32", "a"), padding_l=(1, 1), attr=attr)
    assert pd.weights_desc().dims == w and not pd.weights_desc().is_packed
    dst = np.zeros(pd.dst_desc().physical_shape, np.int8)
    _no_op(pd, {"src": np.zeros(pd.src_desc().physical_shape, np.uint8), "weights": np.zeros(w, np.int8),
                "dst": dst, "bias": np.zeros(OC, np.int32), "scales:src": np.float32([1]),
                "scales:weights": np.ones(OC, np.float32), "zero_points:src": np.int32([2]),
                "zero_points:dst": np.zeros(OC, np.int32), "post_op:1:src_1": np.zeros((1, OC, 1, 1), np.float32)},
           dst)


@pytest.mark.parametrize("src, weights, dst, match", [
    ((1, 0, 5, 5), (8, 0, 3, 3), (1, 8, 3, 3), r"^src: dimension 1 is 0 .*convolution takes a 0 only in the batch"),
    ((1, 4, 0, 5), (8, 4, 1, 1), (1, 8, 0, 5), r"^src: dimension 2 is 0"),
    ((1, 4, 5, 5), (0, 4, 3, 3), (1, 0, 3, 3), r"^weights: dimension 0 is 0"),
    ((1, 4, 5, 5), (8, 4, 0, 3), (1, 8, 5, 3), r"^weights: dimension 2 is 0"),
])
def test_convolution_refuses_other_zeros(src, weights, dst, match):
    with pytest.raises(ValueError, match=match):
        ConvolutionDesc(desc(src, "u8", "nhwc"), desc(weights, "s8", "any"), desc(dst, "u8", "nhwc"))


@pytest.mark.parametrize("dims, tag", [((0, 16, 7, 7), "nhwc"), ((2, 0, 7, 7), "nchw"), ((0, 5, 9), "nwc")])
def test_pooling_takes_a_zero_batch_or_channels(dims, tag):
    sp = len(dims) - 2
    out = dims[:2] + (3,) * sp
    pd = PoolingDesc("avg_exclude_padding", desc(dims, "s8", tag), desc(out, "s32", "any"), (3,) * sp, (3,) * sp,
                     (1,) * sp, (1,) * sp)
    dst = np.zeros(pd.dst_desc().physical_shape, np.int32)
    _no_op(pd, {"src": np.zeros(pd.src_desc().physical_shape, np.int8), "dst": dst}, dst)
    with pytest.raises(ValueError, match=r"^src_desc: dimension 2 is 0 .*pooling takes a 0 only in the batch and "):
        PoolingDesc("max", desc((1, 3, 0, 4), "u8", "nhwc"), desc((1, 3, 1, 2), "u8", "nhwc"), 2, 2, 1, 1)
    with pytest.raises(ValueError, match="^kernel: window 10"):  # the window is checked as ever
        PoolingDesc("max", desc(dims, "s8", tag), desc(out, "s8", "any"), 1, 10, 0, 0)


def test_helpers_of_empty_arrays_build_zero_volume_primitives():
    """quantize, dequantize and pool2d of an empty batch: the zero-volume primitive, no kernel."""
    q = quantize(np.zeros((0, 3), np.float32), [0.5, 0.25, 1.0], [1, 2, 3], "s8", axis=1)
    assert q.shape == (0, 3) and q.dtype == np.int8
    x = dequantize(np.zeros((4, 0), np.int32), np.ones(0, np.float32), axis=1)
    assert x.shape == (4, 0) and x.dtype == np.float32
    y = pool2d(np.zeros((0, 5, 7, 3), np.uint8), 2)
    assert y.shape == (0, 2, 3, 3) and y.dtype == np.uint8


def test_reorder_of_zero_volume_checks_its_attributes():
    attr = Attr(scales={"dst": 2}, zero_points={"dst": 1})
    pd = ReorderDesc(desc((3, 0, 2), "f32", "abc"), desc((3, 0, 2), "u8", "cab"), attr)
    dst = np.zeros((2, 3, 0), np.uint8)
    _no_op(pd, {"src": np.zeros((3, 0, 2), np.float32), "dst": dst, "scales:dst": np.ones(0, np.float32),
                "zero_points:dst": np.zeros(3, np.int32)}, dst)
    with pytest.raises(ValueError, match="^scales:dst: got 1"):
        pd.create().execute({"src": np.zeros((3, 0, 2), np.float32), "dst": dst, "scales:dst": np.float32([1]),
                             "zero_points:dst": np.zeros(3, np.int32)})
    with pytest.raises(ValueError, match="^dst_desc: dims"):
        reorder_desc(desc((3, 0), "f32", "ab"), desc((0, 3), "u8", "ab"))


def test_zero_volume_weights_reorder_into_the_descriptor():
    """The weights of a zero-volume matmul reorder into its (plain) weights_desc and run."""
    pd = MatmulDesc(desc((5, 0), "u8", "ab"), desc((0, 4), "s8", "any"), desc((5, 4), "s32", "ab"))
    wmem = Memory(pd.weights_desc())
    reorder_desc(desc((0, 4), "s8", "ab"), pd.weights_desc()).create().execute(
        {"src": np.zeros((0, 4), np.int8), "dst": wmem})
    dst = np.full((5, 4), 9, np.int32)
    pd.create().execute({"src": np.zeros((5, 0), np.uint8), "weights": wmem, "dst": dst})
    assert (dst == 0).all()  # K = 0 and a non-empty dst: the output stage of 0


def test_depthwise_descriptor_refuses_zeros():
    """DepthwiseConvDesc (ConvolutionDesc's fast case) takes no 0; ConvolutionDesc runs a
    depthwise batch of 0 as its no-op (above)."""
    from primitives.conv_depthwise import DepthwiseConvDesc

    with pytest.raises(ValueError, match=r"^src: dimension 0 is 0 .*ConvolutionDesc takes a batch of 0"):
        DepthwiseConvDesc(desc((0, 8, 5, 5), "u8", "nhwc"), desc((8, 1, 1, 3, 3), "s8", "any"),
                          desc((0, 8, 3, 3), "u8", "nhwc"))


def test_k_zero_logs_one_line_a_step(monkeypatch, capsys):
    """A K = 0 matmul or GEMM runs a K = 1 one of its own; INT8JIT_VERBOSE logs the
    user's creation and call, one line each (the inner one had logged its own too)."""
    from primitives import primitive_cache, verbose
    from primitives.gemm import gemm_u8s8s32

    primitive_cache.clear()
    monkeypatch.setenv(verbose.ENV, "dispatch")
    pd = MatmulDesc(desc((2, 0), "u8", "ab"), desc((0, 3), "s8", "ab"), desc((2, 3), "s32", "ab"))
    pd.create().execute({"src": np.zeros((2, 0), np.uint8), "weights": np.zeros((0, 3), np.int8),
                         "dst": np.zeros((2, 3), np.int32)})
    C = np.ones((2, 3), np.int32)
    gemm_u8s8s32("N", "N", "F", 2, 3, 0, 1.0, np.zeros((2, 1), np.uint8), 1, 0, np.zeros((1, 3), np.int8), 3, 0,
                 1.0, C, 3, np.int32([5]))
    assert C.tolist() == [[6] * 3] * 2
    lines = [line.split(",") for line in capsys.readouterr().err.splitlines() if line.startswith("int8jit_verbose")]
    steps = [(f[1], f[2], f[5]) for f in lines if f[1] != "dispatch"]
    assert [s[:2] for s in steps] == [("create", "matmul"), ("exec", "matmul"),
                                      ("create", "gemm_u8s8s32"), ("exec", "gemm_u8s8s32")], lines
    assert "2x0" in steps[0][2] and "2x0" in steps[2][2], steps
