"""A u8 source with a zero point on avx512_core_vnni: VPDPBUSD on the whole bytes, and each
pixel's accumulators start from -zp * (the sum of its valid taps' weights), one vector per
(valid kh range, valid kw range) class (``DepthwiseConv._comp_table``). Bit-exact against
the model on every ISA path: borders, rows and columns with no valid tap at all, dilation,
strides, channel tails (widened, zero point subtracted) and int32 wrapping."""
from __future__ import annotations

import numpy as np
import pytest

from primitives.attr import Attr
from primitives.conv_depthwise import DepthwiseConvDesc
from primitives.conv_ref import depthwise_ref
from primitives.memory import desc

@pytest.mark.parametrize("geo", [
    dict(C=16, H=7, W=9, k=(3, 3), s=(1, 1), d=(0, 0), pl=(1, 1), pr=(1, 1)),
    dict(C=47, H=5, W=13, k=(3, 3), s=(2, 2), d=(0, 0), pl=(1, 1), pr=(1, 1)),
    dict(C=64, H=4, W=6, k=(3, 5), s=(1, 3), d=(1, 0), pl=(4, 6), pr=(3, 5)),  # rows/columns in padding only
    dict(C=33, H=9, W=10, k=(5, 3), s=(3, 1), d=(0, 1), pl=(2, 2), pr=(0, 3)),
    dict(C=96, H=2, W=17, k=(1, 7), s=(1, 2), d=(0, 0), pl=(0, 3), pr=(0, 3)),
])
@pytest.mark.parametrize("zp", [1, 255, -7, 40000, 2**31 - 1, -2**31])
def test_dot_zero_point_compensation(isa_path, geo, zp, monkeypatch):
    from primitives import conv_depthwise, primitive_cache

    monkeypatch.setattr(conv_depthwise, "_MIN_MACS_PER_THREAD", 1)  # two chunks (images or rows)
    primitive_cache.clear()
    rng = np.random.default_rng(abs(zp) % 1000 + geo["C"])
    C, H, W, (KH, KW) = geo["C"], geo["H"], geo["W"], geo["k"]
    oh = (H + geo["pl"][0] + geo["pr"][0] - ((KH - 1) * (geo["d"][0] + 1) + 1)) // geo["s"][0] + 1
    ow = (W + geo["pl"][1] + geo["pr"][1] - ((KW - 1) * (geo["d"][1] + 1) + 1)) // geo["s"][1] + 1
    x = rng.integers(0, 256, (2, H, W, C)).astype(np.uint8)
    x[0, 0, 0] = 255
    w = rng.integers(-128, 128, (C, 1, 1, KH, KW)).astype(np.int8)
    w[:8] = -128
    pd = DepthwiseConvDesc(desc((2, C, H, W), "u8", "nhwc"), desc(w.shape, "s8", "goihw"),
                           desc((2, C, oh, ow), "s32", "nhwc"), strides=geo["s"], padding_l=geo["pl"],
                           padding_r=geo["pr"], dilation=geo["d"], attr=Attr(zero_points={"src": 0}), isa=isa_path,
                           threads=2)
    p = pd.create()
    primitive_cache.clear()
    assert len(p._chunks) == 2
    if isa_path == "avx512_core_vnni":
        assert p.pd.kernel_spec("s16").comp and p.pd.kernel_spec("s32").comp
    want = depthwise_ref(x, w, zp_src=zp, strides=geo["s"], padding_l=geo["pl"], padding_r=geo["pr"],
                         dilation=geo["d"], plain=True)
    for _ in range(2):  # the second call: the replay, with the same compensation
        y = np.zeros((2, oh, ow, C), np.int32)
        p.execute({"src": x, "weights": w, "dst": y, "zero_points:src": np.int32([zp])})
        np.testing.assert_array_equal(y, want)
    # Another zero point, then new weights in the same array: the compensation follows both.
    y = np.zeros((2, oh, ow, C), np.int32)
    p.execute({"src": x, "weights": w, "dst": y, "zero_points:src": np.int32([3])})
    np.testing.assert_array_equal(y, depthwise_ref(x, w, zp_src=3, strides=geo["s"], padding_l=geo["pl"],
                                                   padding_r=geo["pr"], dilation=geo["d"], plain=True))
    w[...] = -w // 3
    p.execute({"src": x, "weights": w, "dst": y, "zero_points:src": np.int32([3])})
    np.testing.assert_array_equal(y, depthwise_ref(x, w, zp_src=3, strides=geo["s"], padding_l=geo["pl"],
                                                   padding_r=geo["pr"], dilation=geo["d"], plain=True))
