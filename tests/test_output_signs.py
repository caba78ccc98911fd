"""The output stage's lower clamp: emitted only where the conversion does not already do it.

``jit.output.needs_lower_clamp`` drops the f32 clamp to the dst type's minimum for s32
(VCVTPS2DQ's -2^31), s8 on AVX-512 (VPMOVSDB) and u8/s8 on AVX2 (the packs saturate),
and for u8 on AVX-512 after relu when the kernel may assume a dst scale > 0 and dst
zero points >= 0. The primitives check those values at each execution and switch to
the kernel with the clamp for any others. These tests run the extremes (NaN, +-inf,
values past -2^31) and the sign switches through every primitive, bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest

from jit.dot import Path
from jit.output import (BinaryOp, EltwiseOp, OutputSpec, SumOp, assume_dst_params_nonneg, for_dst_params,
                        needs_lower_clamp)
from primitives.attr import Attr, PostOps
from primitives.conv import ConvolutionDesc
from primitives.conv_ref import conv_sum, depthwise_ref
from primitives.matmul import MatmulDesc
from primitives.memory import desc
from primitives.reference import gemm_sum, output_pipeline

RELU = EltwiseOp("relu")
AVX512 = Path("avx512_core_vnni", "vnni", 512)
AVX2 = Path("avx2", "maddubsw", 256)


def _spec(dst_dt="u8", post=(RELU,), **kw):
    return OutputSpec(float_mode=True, scale="col", post_ops=tuple(post), dst_dt=dst_dt, **kw)


@pytest.mark.parametrize("path,spec,needed", [
    (AVX512, _spec("s32", ()), False),
    (AVX512, _spec("f32", ()), False),
    (AVX512, _spec("s8", ()), False),
    (AVX2, _spec("u8", ()), False),
    (AVX2, _spec("s8", ()), False),
    (AVX512, _spec("u8", ()), True),
    (AVX512, _spec("u8"), False),
    (AVX512, _spec("u8", (EltwiseOp("relu", 0.5),)), True),
    (AVX512, _spec("u8", (RELU, EltwiseOp("linear", 2.0, -1.0))), True),
    (AVX512, _spec("u8", (RELU, EltwiseOp("round"))), False),
    (AVX512, _spec("u8", (EltwiseOp("tanh"), EltwiseOp("clip", 0.0, 6.0))), False),
    (AVX512, _spec("u8", (EltwiseOp("clip", -1.0, 6.0),)), True),
    # min(beta, max(alpha, x)) is beta where beta < alpha (the attributes refuse that; the spec need not)
    (AVX512, _spec("u8", (EltwiseOp("clip", 0.0, -1.0),)), True),
    (AVX512, _spec("u8", (RELU, SumOp("u8"))), True),
    (AVX512, _spec("u8", (RELU, BinaryOp("add", "col"))), True),
    (AVX512, _spec("u8", dst_scale=True), True),
    (AVX512, _spec("u8", dst_zp="common"), True),
    (AVX512, _spec("u8", dst_scale=True, dst_zp="col", dst_params_nonneg=True), False),
])
def test_needs_lower_clamp(path, spec, needed):
    assert needs_lower_clamp(path, spec) is needed


def test_assumption_only_where_it_saves_the_clamp():
    assert assume_dst_params_nonneg(_spec("u8", dst_scale=True)).dst_params_nonneg
    assert assume_dst_params_nonneg(_spec("u8", dst_zp="common")).dst_params_nonneg
    for spec in (_spec("u8"), _spec("s8", dst_scale=True), _spec("u8", (), dst_scale=True),
                 _spec("u8", (RELU, BinaryOp("mul", "common")), dst_scale=True)):
        assert assume_dst_params_nonneg(spec) is spec
    spec = assume_dst_params_nonneg(_spec("u8", dst_scale=True, dst_zp="col"))
    assert for_dst_params(spec, 0.5, np.int32([0, 3])) is spec
    assert for_dst_params(spec, 0.5, None) is spec
    for inv, zp in ((-0.5, None), (0.0, None), (float("nan"), None), (0.5, np.int32([2, -1]))):
        assert not for_dst_params(spec, inv, zp).dst_params_nonneg


def _extreme_src(rng, m, k):
    return rng.integers(0, 256, (m, k)).astype(np.uint8)


@pytest.mark.parametrize("dst_dt", ["u8", "s8", "s32"])
@pytest.mark.parametrize("post", ["huge", "nan"])
def test_extremes_saturate_like_the_model(isa_path, dst_dt, post):
    """Values far below the type (past -2^31, -inf) and NaN: the model's f32 clamp, with
    or without the emitted lower half."""
    rng = np.random.default_rng(5)
    M, K, N = 7, 37, 45
    src, wei = _extreme_src(rng, M, K), rng.integers(-128, 128, (K, N)).astype(np.int8)
    if post == "huge":  # linear: 1e35 * v gives +-inf past |v| > 3.4e3, values past 2^31 before
        ops, model_ops = PostOps().eltwise("linear", 1e35, 0.0), [("eltwise", "linear", 1e35, 0.0)]
        scale = np.float32([1e-3])
    else:  # sqrt of the negative sums: NaN
        ops, model_ops = PostOps().eltwise("sqrt"), [("eltwise", "sqrt", 0.0, 0.0)]
        scale = np.float32([1.0])
    attr = Attr(scales={"src": 0}).set_post_ops(ops)
    pd = MatmulDesc(desc((M, K), "u8", "ab"), desc((K, N), "s8", "ab"), desc((M, N), dst_dt, "ab"), attr=attr,
                    isa=isa_path)
    dst = np.zeros((M, N), {"u8": np.uint8, "s8": np.int8, "s32": np.int32}[dst_dt])
    pd.create().execute({"src": src, "weights": wei, "dst": dst, "scales:src": scale})
    want = output_pipeline(gemm_sum(src, wei, 0, 0, False), dst_dt=dst_dt, scale=scale, post_ops=model_ops)
    with np.errstate(invalid="ignore"):
        assert (np.isnan(np.sqrt(np.float32(gemm_sum(src, wei, 0, 0, False)))).any()) or post != "nan"
    np.testing.assert_array_equal(dst, want)


# (dst scale, dst zero point) in the order one primitive sees them: the first and the
# last two run the assuming kernel (a 0 scale's inverse is +inf), the others the kernel
# with the clamp (-0's inverse is -inf).
SIGNS = [(0.25, 3), (-0.5, 3), (0.25, -6), (-0.0, 1), (0.0, 2), (0.25, 0)]


def _check_signs(run, model):
    for s_dst, zp_dst in SIGNS:
        got = run(np.float32([s_dst]), np.int32([zp_dst]))
        with np.errstate(divide="ignore", invalid="ignore"):  # 1/0, 0 * inf: as the kernel computes them
            want = model(np.float32(s_dst), np.float32(zp_dst))
        np.testing.assert_array_equal(got, want, err_msg=f"dst scale {s_dst}, dst zero point {zp_dst}")


def test_matmul_dst_signs(isa_path):
    rng = np.random.default_rng(1)
    M, K, N = 13, 70, 40
    src, wei = _extreme_src(rng, M, K), rng.integers(-128, 128, (K, N)).astype(np.int8)
    s_wei = rng.uniform(0.001, 0.02, N).astype(np.float32)
    attr = Attr(scales={"weights": 2, "dst": 0}, zero_points={"dst": 0}).set_post_ops(PostOps().eltwise("relu"))
    pd = MatmulDesc(desc((M, K), "u8", "ab"), desc((K, N), "s8", "ab"), desc((M, N), "u8", "ab"), attr=attr,
                    isa=isa_path)
    assert pd.output.dst_params_nonneg
    prim, dst = pd.create(), np.zeros((M, N), np.uint8)

    def run(s, z):
        prim.execute({"src": src, "weights": wei, "dst": dst, "scales:weights": s_wei, "scales:dst": s,
                      "zero_points:dst": z})
        return dst.copy()

    sums = gemm_sum(src, wei, 0, 0, False)
    _check_signs(run, lambda s, z: output_pipeline(sums, dst_dt="u8", scale=s_wei, post_ops=[("eltwise", "relu", 0, 0)],
                                                   dst_scale=s, dst_zp=z))


@pytest.mark.parametrize("ker,groups", [(1, 1), (3, 1), (3, 24)])
def test_conv_dst_signs(isa_path, ker, groups):
    """1x1 (one GEMM over the pixels), 3x3 (rows) and depthwise (groups == channels)."""
    rng = np.random.default_rng(2)
    N, C, H, W, OC = 1, 24, 9, 8, 24
    pad = ker // 2
    x = rng.integers(0, 256, (N, H, W, C)).astype(np.uint8)
    wshape = (groups, OC // groups, C // groups, ker, ker) if groups > 1 else (OC, C, ker, ker)
    w = rng.integers(-128, 128, wshape).astype(np.int8)
    bias = rng.uniform(-500, 500, OC).astype(np.float32)
    attr = Attr(scales={"src": 0, "dst": 0}, zero_points={"dst": 0}).set_post_ops(PostOps().eltwise("relu"))
    pd = ConvolutionDesc(desc((N, C, H, W), "u8", "nhwc"), desc(wshape, "s8", "goihw" if groups > 1 else "oihw"),
                         desc((N, OC, H, W), "u8", "nhwc"), desc((OC,), "f32", "a"), padding_l=(pad, pad),
                         padding_r=(pad, pad), attr=attr, isa=isa_path)
    assert pd.output.dst_params_nonneg
    prim, dst = pd.create(), np.zeros((N, H, W, OC), np.uint8)
    s_src = np.float32([0.01])

    def run(s, z):
        prim.execute({"src": x, "weights": w, "bias": bias, "dst": dst, "scales:src": s_src, "scales:dst": s,
                      "zero_points:dst": z})
        return dst.copy()

    relu = [("eltwise", "relu", 0, 0)]
    if groups > 1:
        def model(s, z):
            return depthwise_ref(x, w, padding_l=(pad, pad), padding_r=(pad, pad), dst_dt="u8", scale=s_src[0],
                                 bias=bias, post_ops=relu, dst_scale=s, dst_zp=z).reshape(dst.shape)
    else:
        sums = np.moveaxis(conv_sum(np.moveaxis(x, -1, 1), w, (1, 1), (pad, pad), (pad, pad), (0, 0)), 1, -1)

        def model(s, z):
            return output_pipeline(sums.reshape(-1, OC), dst_dt="u8", scale=s_src[0], bias=bias, post_ops=relu,
                                   dst_scale=s, dst_zp=z).reshape(dst.shape)
    _check_signs(run, model)
