"""Reorder: JIT kernels bit-exact against the numpy reference on every executable ISA path.

The reference (``primitives.reorder_ref``) is written from seed 001's formulas:
``dst = saturate(rne((f32(src) - zp_src) * scale_src / scale_dst + zp_dst))`` in f32.
Both the generated code and the numpy path perform the same f32 operations in the same
order (a true division, not a reciprocal), so results are compared bit for bit.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from primitives.attr import DST, SRC, Attr, PostOps, scales, zero_points
from primitives.memory import Memory, desc, packed_desc
from primitives.reorder import ReorderDesc, dequantize, quantize, reorder_desc
from primitives.reorder_ref import NUMPY_TYPES, reorder_ref
from jit.reorder_kernel import code_isa
from runtime.isa import effective_isa
from tests.conftest import executable_isas, needs_a_path

EXAMPLES = int(os.environ.get("INT8JIT_TEST_EXAMPLES", "25"))
JIT_PAIRS = [("f32", "u8"), ("f32", "s8"), ("u8", "f32"), ("s8", "f32"), ("s32", "f32"), ("s8", "u8"),
             ("u8", "s8"), ("f32", "s32"), ("s32", "s8"), ("f32", "f32"), ("u8", "u8")]
NUMPY_PAIRS = [("f32", "bf16"), ("bf16", "f32"), ("bf16", "s8"), ("s32", "s32")]
INT = ("u8", "s8", "s32")
SPECIAL_F32 = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 127.5, 128.5, -128.5, 255.5, 254.5, 0.0, -0.0,
                        np.nan, np.inf, -np.inf, 1e10, -1e10, 2147483520.0, 2147483648.0, -2147483904.0,
                        1e-40], np.float32)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def random_values(rng, dt: str, shape) -> np.ndarray:
    if dt == "bf16":
        return (random_values(rng, "f32", shape).view(np.uint32) >> 16).astype(np.uint16)
    if dt == "f32":
        x = (rng.standard_normal(shape) * rng.choice([1.0, 100.0, 1e6], shape)).astype(np.float32)
        halves = (rng.integers(-300, 300, shape) + 0.5).astype(np.float32)
        x = np.where(rng.random(shape) < 0.3, halves, x)
        specials = rng.choice(SPECIAL_F32, shape)
        return np.where(rng.random(shape) < 0.1, specials, x).astype(np.float32)
    info = np.iinfo(NUMPY_TYPES[dt])
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(NUMPY_TYPES[dt])


def run(pd: ReorderDesc, src_logical: np.ndarray, values: dict) -> np.ndarray:
    """Execute ``pd`` on a logical-order source; returns the logical-order destination."""
    src = Memory(pd.src_desc())
    src.logical()[...] = src_logical
    dst = Memory(pd.dst_desc())
    pd.create().execute({SRC: src, DST: dst, **values})
    return dst.logical()


def attr_and_values(rng, dims, masks: dict):
    """An Attr for {(kind, arg): mask} with random values (scales may make exact ties)."""
    attr, values, ref = Attr(), {}, {}
    for (kind, arg), mask in masks.items():
        count = int(np.prod([d for i, d in enumerate(dims) if mask >> i & 1] or [1]))
        if kind == "scales":
            attr.set_scales_mask(arg, mask)
            v = np.where(rng.random(count) < 0.5, rng.choice([0.25, 0.5, 1.0, 2.0, 4.0], count),
                         rng.uniform(0.01, 10.0, count) * rng.choice([1, -1], count)).astype(np.float32)
            values[scales(arg)] = v
            ref[f"{arg}_scale"], ref[f"{arg}_scale_mask"] = v, mask
        else:
            attr.set_zero_points_mask(arg, mask)
            v = rng.integers(-300, 300, count).astype(np.int32)
            values[zero_points(arg)] = v
            ref[f"{arg}_zp"], ref[f"{arg}_zp_mask"] = v, mask
    return attr, values, ref


# ----------------------------------------------------------------------------- property test

@st.composite
def problems(draw):
    nd = draw(st.integers(1, 4))
    dims = [draw(st.integers(1, 6)) for _ in range(nd - 1)] + [draw(st.integers(1, 70))]
    perm = draw(st.permutations(range(nd)))
    dperm = perm if draw(st.integers(0, 3)) else draw(st.permutations(range(nd)))  # mostly the same order
    sdt, ddt = draw(st.sampled_from(JIT_PAIRS + NUMPY_PAIRS))
    masks = {}
    for kind, arg, dt in (("scales", SRC, sdt), ("scales", DST, ddt), ("zero_points", SRC, sdt),
                          ("zero_points", DST, ddt)):
        if kind == "zero_points" and dt not in INT:
            continue
        if draw(st.booleans()):
            masks[(kind, arg)] = draw(st.integers(0, 2 ** nd - 1))
    tag = "".join(chr(97 + i) for i in perm)
    dtag = "".join(chr(97 + i) for i in dperm)
    return tuple(dims), tag, dtag, sdt, ddt, masks, draw(st.integers(0, 2 ** 32 - 1))


@pytest.mark.parametrize("isa", executable_isas())
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_matches_reference_bit_exact(isa, problem):
    dims, tag, dtag, sdt, ddt, masks, seed = problem
    rng = np.random.default_rng(seed)
    attr, values, ref_kw = attr_and_values(rng, dims, masks)
    pd = ReorderDesc(desc(dims, sdt, tag), desc(dims, ddt, dtag), attr, isa=isa)
    src = random_values(rng, sdt, dims)
    got = run(pd, src, values)
    want = reorder_ref(src, sdt, ddt, **ref_kw)
    assert np.array_equal(bits(got), bits(want)), (pd.impl_info(), src, got, want)


@pytest.mark.parametrize("isa", executable_isas())
def test_every_mask_position_runs_the_kernel(isa):
    """Masks of outer dims (per row) or of the inner block (per element) take the JIT path."""
    rng = np.random.default_rng(1)
    dims = (3, 4, 5, 37)
    for tag, arg_mask in (("abcd", 1), ("abcd", 2 | 1), ("abcd", 8), ("abcd", 4 | 8), ("acdb", 2),
                          ("acdb", 2 | 8), ("abcd", 0)):
        attr, values, ref_kw = attr_and_values(rng, dims, {("scales", DST): arg_mask, ("zero_points", DST): 0,
                                                          ("scales", SRC): 0})
        pd = ReorderDesc(desc(dims, "f32", tag), desc(dims, "u8", tag), attr, isa=isa)
        assert pd.impl_info()["impl"].startswith("jit:"), pd.impl_info()
        src = random_values(rng, "f32", dims)
        assert np.array_equal(run(pd, src, values), reorder_ref(src, "f32", "u8", **ref_kw))


def test_mixed_mask_falls_back_to_numpy_with_the_same_bits():
    rng = np.random.default_rng(2)
    dims = (4, 3, 33)
    # dst scales per (dim 0, innermost) need rows holding dim 0; src scales per dim 0 need rows without it
    attr, values, ref_kw = attr_and_values(rng, dims, {("scales", DST): 0b101, ("scales", SRC): 0b001})
    pd = ReorderDesc(desc(dims, "f32", "abc"), desc(dims, "s8", "abc"), attr)
    info = pd.impl_info()
    assert info["impl"] == "numpy:convert" and "mix" in info["reason"]
    src = random_values(rng, "f32", dims)
    assert np.array_equal(run(pd, src, values), reorder_ref(src, "f32", "s8", **ref_kw))


# ----------------------------------------------------------------------------- rounding, saturation

@pytest.mark.parametrize("isa", executable_isas())
@pytest.mark.parametrize("impl,stag,dtag", [("jit", "ab", "ab"), ("numpy", "ab", "ba")])
def test_ties_round_to_nearest_even(isa, impl, stag, dtag):
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 126.5, -127.5, 0.49999997, 100.5, 101.5], np.float32)
    want = {"s8": [0, 2, 2, 0, -2, -2, 4, 126, -128, 0, 100, 102],
            "u8": [0, 2, 2, 0, 0, 0, 4, 126, 0, 0, 100, 102],
            "s32": [0, 2, 2, 0, -2, -2, 4, 126, -128, 0, 100, 102]}
    src = np.stack([x, x])
    for dt, expected in want.items():
        pd = ReorderDesc(desc(src.shape, "f32", stag), desc(src.shape, dt, dtag), isa=isa)
        assert pd.impl_info()["impl"].startswith(impl)
        got = run(pd, src, {})
        assert got[0].tolist() == expected and got[1].tolist() == expected, dt


@pytest.mark.parametrize("isa", executable_isas())
@pytest.mark.parametrize("impl,stag,dtag", [("jit", "ab", "ab"), ("numpy", "ab", "ba")])
def test_saturation_at_both_ends_and_nan(isa, impl, stag, dtag):
    x = np.array([-1e30, -np.inf, -129.0, -128.6, 255.4, 255.6, 256.0, 1e30, np.inf, np.nan,
                  2147483520.0, 2147483648.0, -2147483904.0], np.float32)
    want = {"s8": [-128, -128, -128, -128, 127, 127, 127, 127, 127, 0, 127, 127, -128],
            "u8": [0, 0, 0, 0, 255, 255, 255, 255, 255, 0, 255, 255, 0],
            "s32": [-2 ** 31, -2 ** 31, -129, -129, 255, 256, 256, 2147483520, 2147483520, 0, 2147483520,
                    2147483520, -2 ** 31]}
    src = np.stack([x, x])
    for dt, expected in want.items():
        pd = ReorderDesc(desc(src.shape, "f32", stag), desc(src.shape, dt, dtag), isa=isa)
        assert pd.impl_info()["impl"].startswith(impl)
        assert run(pd, src, {})[1].tolist() == expected, dt
    # f32 destination: no rounding, no saturation; NaN stays NaN
    attr = Attr(scales={DST: 0})
    pd = ReorderDesc(desc(src.shape, "f32", stag), desc(src.shape, "f32", dtag), attr, isa=isa)
    got = run(pd, src, {scales(DST): np.float32(2.0)})
    assert np.array_equal(got, src / np.float32(2.0), equal_nan=True)


@pytest.mark.parametrize("isa", executable_isas())
def test_dequantize_and_zero_points(isa):
    q = np.arange(-128, 128, dtype=np.int8).reshape(2, 128)
    attr = Attr(scales={SRC: 0}, zero_points={SRC: 0})
    pd = ReorderDesc(desc(q.shape, "s8", "ab"), desc(q.shape, "f32", "ab"), attr, isa=isa)
    got = run(pd, q, {scales(SRC): [0.1], zero_points(SRC): [-3]})
    assert pd.impl_info()["impl"].startswith("jit:")
    assert np.array_equal(got, (q.astype(np.float32) + np.float32(3)) * np.float32(0.1))
    s32 = np.array([[2 ** 31 - 1, -2 ** 31, 16777217, 3]], np.int32)  # s32 -> f32 rounds to nearest even
    pd = ReorderDesc(desc(s32.shape, "s32", "ab"), desc(s32.shape, "f32", "ab"), isa=isa)
    assert run(pd, s32, {}).tolist() == [[2.0 ** 31, -2.0 ** 31, 16777216.0, 3.0]]


@pytest.mark.parametrize("isa", executable_isas())
def test_s8_u8_both_ways(isa):
    s = np.arange(-128, 128, dtype=np.int8).reshape(1, 256)
    u = run(ReorderDesc(desc(s.shape, "s8", "ab"), desc(s.shape, "u8", "ab"), isa=isa), s, {})
    assert np.array_equal(u, np.clip(s, 0, 127).astype(np.uint8))
    attr = Attr(zero_points={SRC: 0, DST: 0})
    pd = ReorderDesc(desc(s.shape, "s8", "ab"), desc(s.shape, "u8", "ab"), attr, isa=isa)
    u = run(pd, s, {zero_points(SRC): [0], zero_points(DST): [128]})  # the +128 shift
    assert np.array_equal(u, (s.astype(np.int16) + 128).astype(np.uint8))
    back = run(ReorderDesc(desc(s.shape, "u8", "ab"), desc(s.shape, "s8", "ab"), attr, isa=isa), u,
               {zero_points(SRC): [128], zero_points(DST): [0]})
    assert np.array_equal(back, s)


# ----------------------------------------------------------------------------- formats and bf16

@pytest.mark.parametrize("dims,stag,dtag", [((2, 3, 4, 5), "nchw", "nhwc"), ((2, 3, 4, 5), "nhwc", "nchw"),
                                            ((6, 3, 2, 5), "oihw", "hwio"), ((7, 9), "ab", "ba"),
                                            ((3, 4, 5), "abc", "cab")])
@pytest.mark.parametrize("dt", ["f32", "s8", "s32", "bf16"])
def test_format_changes_are_exact(dims, stag, dtag, dt):
    rng = np.random.default_rng(3)
    info = np.iinfo(np.int32)
    src = rng.integers(info.min, info.max, dims).astype(np.int32).view(np.float32) if dt == "f32" else \
        rng.integers(0, 2 ** 16, dims).astype(np.uint16) if dt == "bf16" else random_values(rng, dt, dims)
    pd = ReorderDesc(desc(dims, dt, stag), desc(dims, dt, dtag))
    assert pd.impl_info()["impl"] == "numpy:transpose" and pd.impl_info()["isa"] == "any"
    srcm = Memory(pd.src_desc())
    srcm.logical()[...] = src
    dst = Memory(pd.dst_desc())
    pd.create().execute({SRC: srcm, DST: dst})
    assert np.array_equal(bits(dst.logical()), bits(src))  # NaN payloads included
    assert np.array_equal(dst.array, np.transpose(src, pd.dst_desc().perm))


@pytest.mark.parametrize("isa", executable_isas())
def test_type_and_format_change_together(isa):
    rng = np.random.default_rng(4)
    dims = (2, 8, 3, 5)
    src = random_values(rng, "f32", dims)
    attr, values, ref_kw = attr_and_values(rng, dims, {("scales", DST): 2, ("zero_points", DST): 0})
    pd = ReorderDesc(desc(dims, "f32", "nchw"), desc(dims, "u8", "nhwc"), attr, isa=isa)
    assert pd.impl_info()["impl"] == "numpy:convert" and pd.impl_info()["isa"] == "any"
    assert np.array_equal(run(pd, src, values), reorder_ref(src, "f32", "u8", **ref_kw))


def test_f32_bf16_round_to_nearest_even():
    x = np.array([[1.0, 1.00390625, 1.01171875, 3.0e38, -2.5, np.nan, np.inf, 1.0 + 2 ** -8 + 2 ** -20]],
                 np.float32)
    pd = ReorderDesc(desc(x.shape, "f32", "ab"), desc(x.shape, "bf16", "ab"))
    b = run(pd, x, {})
    assert [hex(v) for v in b[0, :5]] == ["0x3f80", "0x3f80", "0x3f82", "0x7f62", "0xc020"]
    assert b[0, 5] & 0x7FC0 == 0x7FC0 and b[0, 6] == 0x7F80 and b[0, 7] == 0x3F81
    back = run(ReorderDesc(desc(x.shape, "bf16", "ab"), desc(x.shape, "f32", "ab")), b, {})
    assert back[0, :3].tolist() == [1.0, 1.0, 1.015625] and back[0, 4] == -2.5
    assert np.array_equal(bits(back), bits((b.astype(np.uint32) << 16).view(np.float32)))


# ----------------------------------------------------------------------------- tails, threads, guard pages

@pytest.mark.parametrize("isa", executable_isas())
@pytest.mark.parametrize("sdt,ddt", [("f32", "u8"), ("s8", "f32"), ("s32", "f32"), ("f32", "s8")])
def test_tails_stay_inside_the_buffers(isa, sdt, ddt, guarded):
    """Source and destination end right before a PROT_NONE page: a read or write past them faults."""
    rng = np.random.default_rng(5)
    attr = Attr(scales={DST: 2} if ddt != "f32" else {SRC: 2})
    arg = DST if ddt != "f32" else SRC
    for n in list(range(1, 35)) + [63, 64, 65, 127, 129]:
        src = guarded(2 * n, NUMPY_TYPES[sdt], "end")
        src[...] = random_values(rng, sdt, (2 * n,))
        dst = guarded(2 * n, NUMPY_TYPES[ddt], "end")
        scale = rng.uniform(0.5, 2, n).astype(np.float32)
        pd = ReorderDesc(desc((2, n), sdt, "ab"), desc((2, n), ddt, "ab"), attr, isa=isa)
        pd.create().execute({SRC: src, DST: dst, scales(arg): scale})
        want = reorder_ref(src.reshape(2, n), sdt, ddt, **{f"{arg}_scale": scale, f"{arg}_scale_mask": 2})
        assert np.array_equal(bits(dst), bits(want).reshape(-1)), n


@needs_a_path  # (where none runs, the reorder takes its numpy model)
@pytest.mark.parametrize("dims,mask", [((3, 70001), 2), ((1, 200003), 0), ((5, 40000), 1)])
def test_thread_chunks_cover_everything_once(dims, mask):
    rng = np.random.default_rng(6)
    src = random_values(rng, "f32", dims)
    attr, values, ref_kw = attr_and_values(rng, dims, {("scales", DST): mask, ("zero_points", DST): 0})
    pd = ReorderDesc(desc(dims, "f32", "ab"), desc(dims, "s8", "ab"), attr, threads=4)
    assert pd.impl_info()["impl"].startswith("jit:")
    assert np.array_equal(run(pd, src, values), reorder_ref(src, "f32", "s8", **ref_kw))


# ----------------------------------------------------------------------------- packed weights

class FakeLayout:
    """A layout record the way a matmul owner writes one: hashable, with pack()."""

    def __init__(self):
        self.calls = []

    def pack(self, src_logical, dst_memory):
        self.calls.append(src_logical.copy())
        dst_memory.data[...] = np.ascontiguousarray(src_logical.T).reshape(-1).view(np.uint8)
        dst_memory.payload = {"colsum": src_logical.astype(np.int32).sum(axis=0)}


def test_packed_destination_is_filled_by_its_layout():
    rng = np.random.default_rng(7)
    w = rng.standard_normal((6, 10)).astype(np.float32)
    scale = rng.uniform(0.01, 0.03, 10).astype(np.float32)
    layout = FakeLayout()
    dst_md = packed_desc((6, 10), "s8", layout, 60)
    pd = ReorderDesc(desc((6, 10), "f32", "ab"), dst_md, Attr(scales={DST: 2}))
    assert pd.impl_info()["impl"].endswith("+pack")
    dst = Memory(dst_md)
    pd.create().execute({SRC: w, DST: dst, scales(DST): scale})
    q = reorder_ref(w, "f32", "s8", dst_scale=scale, dst_scale_mask=2)
    assert len(layout.calls) == 1 and layout.calls[0].dtype == np.int8
    assert np.array_equal(layout.calls[0], q)
    assert np.array_equal(dst.data.view(np.int8), q.T.reshape(-1))
    assert np.array_equal(dst.payload["colsum"], q.astype(np.int32).sum(axis=0))
    # s8 source without attributes: the logical source itself is handed over
    s8 = rng.integers(-128, 128, (6, 10)).astype(np.int8)
    ReorderDesc(desc((6, 10), "s8", "ba"), dst_md).create().execute({SRC: Memory(desc((6, 10), "s8", "ba"),
                                                                                 np.ascontiguousarray(s8.T)),
                                                                     DST: dst})
    assert np.array_equal(layout.calls[-1], s8)


# ----------------------------------------------------------------------------- numpy-style helpers

def test_quantize_dequantize_round_trip_per_channel():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    scale = (np.abs(x).max(axis=1) / 127).astype(np.float32)
    q = quantize(x, scale, dt="s8", axis=0)
    assert q.dtype == np.int8 and q.shape == x.shape
    assert np.array_equal(q, reorder_ref(x, "f32", "s8", dst_scale=scale, dst_scale_mask=1))
    back = dequantize(q, scale, axis=0)
    assert np.all(np.abs(back - x) <= scale[:, None] / 2 + 1e-7)
    qa = quantize(x, 0.05, zero_point=128, dt="u8")
    assert np.array_equal(qa, reorder_ref(x, "f32", "u8", dst_scale=[0.05], dst_zp=[128]))
    assert np.array_equal(dequantize(qa, 0.05, 128), (qa.astype(np.float32) - 128) * np.float32(0.05))
    assert quantize(np.float32(2.5), 1.0).shape == () and int(quantize(np.float32(2.5), 1.0)) == 2
    zp = np.arange(16, dtype=np.int32)
    assert np.array_equal(quantize(x, 0.1, zp, "u8", axis=-1),
                          reorder_ref(x, "f32", "u8", dst_scale=[0.1], dst_zp=zp, dst_zp_mask=2))


# ----------------------------------------------------------------------------- impl_info, ISA levels

def test_vnni_levels_share_their_base_code():
    isas = executable_isas()
    names = {isa: ReorderDesc(desc((4, 50), "f32", "ab"), desc((4, 50), "u8", "ab"), isa=isa).impl_info()
             for isa in isas}
    for isa, info in names.items():
        base = "avx512_core" if isa.startswith("avx512") else "avx2"
        assert info["impl"] == f"jit:{base}" and info["kernel"].endswith(base) and info["isa"] == isa


# ----------------------------------------------------------------------------- bad input

def test_bad_input_names_the_argument():
    f32, s8 = desc((4, 8), "f32", "ab"), desc((4, 8), "s8", "ab")
    pd = ReorderDesc(f32, s8, Attr(scales={DST: 1}))
    prim = pd.create()
    x, q = np.zeros((4, 8), np.float32), np.zeros((4, 8), np.int8)
    with pytest.raises(ValueError, match="scales:dst: got 8 values; expected 4"):
        prim.execute({SRC: x, DST: q, scales(DST): np.ones(8, np.float32)})
    with pytest.raises(ValueError, match="missing argument 'scales:dst'"):
        prim.execute({SRC: x, DST: q})
    with pytest.raises(ValueError, match="unexpected argument 'scales:src'"):
        prim.execute({SRC: x, DST: q, scales(DST): np.ones(4, np.float32), scales(SRC): [1.0]})
    with pytest.raises(ValueError, match="scales:dst: scale 0 is nan"):
        prim.execute({SRC: x, DST: q, scales(DST): np.full(4, np.nan, np.float32)})
    with pytest.raises(ValueError, match="^src:"):
        prim.execute({SRC: np.zeros((4, 9), np.float32), DST: q, scales(DST): np.ones(4)})
    with pytest.raises(TypeError, match="^dst:"):
        prim.execute({SRC: x, DST: np.zeros((4, 8), np.uint8), scales(DST): np.ones(4)})
    with pytest.raises(ValueError, match="missing argument 'dst'"):
        prim.execute({SRC: x})
    with pytest.raises(ValueError, match="zero_points:src.*integer types"):
        ReorderDesc(f32, s8, Attr(zero_points={SRC: 0}))
    with pytest.raises(ValueError, match="zero_points:dst.*integer types"):
        ReorderDesc(s8, f32, Attr(zero_points={DST: 0}))
    with pytest.raises(ValueError, match="scales:dst.*mask 4"):
        ReorderDesc(f32, s8, Attr(scales={DST: 4}))
    with pytest.raises(ValueError, match="dst_desc: dims"):
        ReorderDesc(f32, desc((4, 9), "s8", "ab"))
    with pytest.raises(ValueError, match="dst_desc: .*'any'"):
        ReorderDesc(f32, desc((4, 8), "s8"))
    with pytest.raises(ValueError, match="post_ops"):
        ReorderDesc(f32, s8, Attr(post_ops=PostOps().eltwise("relu")))
    with pytest.raises(ValueError, match="weights"):
        ReorderDesc(f32, s8, Attr(scales={"weights": 0}))
    with pytest.raises(TypeError, match="src_desc"):
        ReorderDesc((4, 8), s8)
    with pytest.raises(ValueError, match="isa"):
        ReorderDesc(f32, s8, isa="sse4")
    zp = ReorderDesc(s8, f32, Attr(zero_points={SRC: 0})).create()
    with pytest.raises(ValueError, match="zero_points:src: zero point 0"):
        zp.execute({SRC: q, DST: x, zero_points(SRC): np.array([2 ** 40])})
    with pytest.raises(TypeError, match="zero_points:src.*integer"):
        zp.execute({SRC: q, DST: x, zero_points(SRC): [0.5]})
    with pytest.raises(ValueError, match="dst: the array is read-only"):
        ro = np.zeros((4, 8), np.int8)
        ro.flags.writeable = False
        prim.execute({SRC: x, DST: ro, scales(DST): np.ones(4)})
    with pytest.raises(ValueError, match="scale: got 3 values without axis"):
        quantize(x, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="axis"):
        quantize(x, [1.0] * 4, axis=2)
    with pytest.raises(ValueError, match="scale: got 3 values; expected 4"):
        quantize(x, [1.0, 2.0, 3.0], axis=0)
    with pytest.raises(ValueError, match="dt"):
        quantize(x, 1.0, dt="f32")
    with pytest.raises(TypeError, match="q: expected dtype"):
        dequantize(x, 1.0)
    assert reorder_desc(f32, s8).impl_info()["impl"] == "jit:" + code_isa(effective_isa())
    assert pd.scratchpad_desc().dims == (0,)


def test_primitive_cache_and_concurrent_execution():
    """An identical descriptor gives the same primitive; one primitive runs on several threads at once."""
    from concurrent.futures import ThreadPoolExecutor

    md_src, md_dst = desc((8, 300), "f32", "ab"), desc((8, 300), "u8", "ab")
    attr = Attr(scales={DST: 2}, zero_points={DST: 0})
    prim = ReorderDesc(md_src, md_dst, attr).create()
    assert ReorderDesc(md_src, md_dst, attr).create() is prim
    rng = np.random.default_rng(9)
    jobs = []
    for _ in range(8):
        x = random_values(rng, "f32", (8, 300))
        s = rng.uniform(0.1, 2, 300).astype(np.float32)
        z = rng.integers(0, 255, 1).astype(np.int32)
        jobs.append((x, s, z, np.zeros((8, 300), np.uint8)))

    def one(job):
        x, s, z, out = job
        prim.execute({SRC: x, DST: out, scales(DST): s, zero_points(DST): z})

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, jobs))
    for x, s, z, out in jobs:
        assert np.array_equal(out, reorder_ref(x, "f32", "u8", dst_scale=s, dst_scale_mask=2, dst_zp=z))


def test_quantize_takes_any_dense_or_strided_array():
    rng = np.random.default_rng(10)
    base = rng.standard_normal((3, 4, 5)).astype(np.float32)
    for x in (base.transpose(0, 2, 1), base[:, ::2, :], base.T):
        q = quantize(x, [0.1, 0.2, 0.3], 3, "s8", axis=0) if x.shape[0] == 3 else quantize(x, 0.1, 3, "s8")
        ref_kw = dict(dst_scale=[0.1, 0.2, 0.3], dst_scale_mask=1) if x.shape[0] == 3 else dict(dst_scale=[0.1])
        assert q.shape == x.shape
        assert np.array_equal(q, reorder_ref(np.ascontiguousarray(x), "f32", "s8", dst_zp=[3], **ref_kw))


def test_empty_arrays_are_checked_and_converted_to_empty():
    """An empty batch quantizes to an empty array of the type, as numpy would; the scales,
    zero points and type are still checked against its dims."""
    q = quantize(np.zeros((0, 3), np.float32), [0.5, 0.25, 1.0], [1, 2, 3], "s8", axis=1)
    assert q.shape == (0, 3) and q.dtype == np.int8
    x = dequantize(np.zeros((4, 0), np.int32), 0.5)
    assert x.shape == (4, 0) and x.dtype == np.float32
    with pytest.raises(ValueError, match="^scale: got 2 values; expected 3"):
        quantize(np.zeros((0, 3), np.float32), [0.5, 0.25], axis=1)
    with pytest.raises(ValueError, match="^dt: "):
        quantize(np.zeros(0, np.float32), 1.0, dt="u4")
    with pytest.raises(TypeError, match="^q: "):
        dequantize(np.zeros(0, np.float32), 1.0)


def test_quantize_calls_keep_their_setup(monkeypatch):
    """quantize/dequantize keep each call signature's primitive (per thread): calls like an
    earlier one (new values, new scale and zero-point values, new arrays) build no
    descriptor and stay exact; a strided source, copied at every call, and a new
    signature build theirs."""
    from primitives import reorder

    rng = np.random.default_rng(12)
    shapes = [(5, 7, 9), (3, 5, 9)]
    for shape in shapes:  # (the first call of each signature sets up)
        quantize(np.zeros(shape, np.float32), np.ones(9, np.float32), 1, "s8", axis=2)
        dequantize(np.zeros(shape, np.uint8), 0.5, 3)
        quantize(np.zeros((9, 7, 5), np.float32).transpose(2, 1, 0), 0.5)
    built = []
    real = reorder.ReorderDesc
    monkeypatch.setattr(reorder, "ReorderDesc", lambda *a, **k: built.append(1) or real(*a, **k))
    for _ in range(3):
        for shape in shapes:
            x = rng.normal(0, 20, shape).astype(np.float32)
            s, zp = rng.uniform(0.05, 0.5, 9).astype(np.float32), int(rng.integers(-20, 20))
            q = quantize(x, s, zp, "s8", axis=2)
            assert np.array_equal(q, reorder_ref(x, "f32", "s8", dst_scale=s, dst_scale_mask=4, dst_zp=[zp]))
            u = rng.integers(0, 256, shape).astype(np.uint8)
            assert np.array_equal(dequantize(u, 0.25, 7), reorder_ref(u, "u8", "f32", src_scale=[0.25], src_zp=[7]))
        t = rng.normal(0, 20, (9, 7, 5)).astype(np.float32).transpose(2, 1, 0)  # dense, another dim order
        assert np.array_equal(quantize(t, 0.5), reorder_ref(np.ascontiguousarray(t), "f32", "u8", dst_scale=[0.5]))
    assert not built
    strided = rng.normal(0, 20, (5, 14, 9)).astype(np.float32)[:, ::2]
    for _ in range(2):
        assert np.array_equal(quantize(strided, 0.5), reorder_ref(np.ascontiguousarray(strided), "f32", "u8",
                                                                   dst_scale=[0.5]))
    assert len(built) == 2  # (copied at every call: the general route)
    with pytest.raises(ValueError, match="^scale: got 5 values; expected 9"):
        quantize(np.zeros((5, 7, 9), np.float32), np.ones(5, np.float32), axis=2)
