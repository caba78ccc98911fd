"""primitives.memory and primitives.attr: descriptors, no-copy memories, bf16, masks, post-ops."""
from __future__ import annotations

import gc
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primitives import attr as A
from primitives import memory as M
from primitives.attr import (DST, SRC, WEIGHTS, Attr, Binary, Eltwise, PostOps, Sum, check_mask,
                             check_scales, check_zero_points, expected_count)
from primitives.memory import (Memory, MemoryDesc, as_memory, bf16_to_f32, desc, f32_to_bf16,
                               packed_desc)

FEW = settings(max_examples=30, deadline=None)


# ----------------------------------------------------------------------------- data types

def test_data_types_round_trip():
    for dt in M.DATA_TYPES:
        assert M.data_type_of(M.numpy_dtype(dt)) == dt
    assert M.numpy_dtype("bf16") == np.uint16


def test_unknown_dtype_names_argument():
    with pytest.raises(ValueError, match=r"dt: unknown data type 's16'.*u8, s8, s32, f32, bf16"):
        desc((2,), "s16")
    with pytest.raises(ValueError, match="dtype: numpy float64"):
        M.data_type_of(np.float64)


def test_bf16_rounding_known_values():
    x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -2.5, np.inf, -np.inf, 3.4e38], np.float32)
    bits = f32_to_bf16(x)
    # 1+2^-8 is a tie between 1 and 1+2^-7: ties go to the even mantissa (1.0);
    # 1+3*2^-8 ties between 1+2^-7 (odd) and 1+2^-6 (even): up.
    assert bf16_to_f32(bits).tolist()[:4] == [1.0, 1.0, 1.0 + 2 ** -6, -2.5]
    assert bits[4] == 0x7F80 and bits[5] == 0xFF80
    assert np.isinf(bf16_to_f32(bits)[6])  # above bf16's largest finite value
    nan = f32_to_bf16(np.array([np.nan], np.float32))
    assert np.isnan(bf16_to_f32(nan)).all()


@FEW
@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=20))
def test_bf16_is_nearest(values):
    x = np.array(values, np.float32)
    r = bf16_to_f32(f32_to_bf16(x)).astype(np.float64)
    bits = f32_to_bf16(x).astype(np.int64)
    # Neighbours one bf16 ulp away (same sign) are never strictly closer.
    for step in (-1, 1):
        nb = ((bits + step) & 0xFFFF).astype(np.uint16)
        with np.errstate(invalid="ignore"):  # a neighbour may be a NaN pattern
            other = bf16_to_f32(nb).astype(np.float64)
        finite = np.isfinite(other) & np.isfinite(r)
        assert np.all(np.abs(r - x)[finite] <= np.abs(other - x)[finite])


# ----------------------------------------------------------------------------- descriptors

@pytest.mark.parametrize("alias, letters, ndims", [
    ("x", "a", 1), ("nc", "ab", 2), ("cn", "ba", 2), ("oi", "ab", 2), ("io", "ba", 2),
    ("ncw", "abc", 3), ("nwc", "acb", 3), ("nchw", "abcd", 4), ("nhwc", "acdb", 4),
    ("oihw", "abcd", 4), ("hwio", "cdba", 4), ("ohwi", "acdb", 4), ("ncdhw", "abcde", 5),
    ("ndhwc", "acdeb", 5), ("goihw", "abcde", 5), ("abc", "abc", 3), ("bac", "bac", 3),
])
def test_tag_aliases(alias, letters, ndims):
    md = desc(tuple(range(2, 2 + ndims)), "u8", alias)
    assert md.tag == letters and md.is_plain and not md.is_any


def test_nhwc_shape_and_strides():
    md = desc((2, 3, 4, 5), "s32", "nhwc")
    assert md.perm == (0, 2, 3, 1)
    assert md.physical_shape == (2, 4, 5, 3)
    assert md.strides == (60, 1, 15, 3)
    assert md.nbytes == 2 * 3 * 4 * 5 * 4 and md.size == 120


def test_descs_are_hashable_and_normalised():
    a = desc([np.int64(2), 3], np.int8, "nc")
    b = MemoryDesc((2, 3), "s8", "ab")
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1


@pytest.mark.parametrize("dims, dt, tag, match", [
    ((2, -1), "s8", "ab", r"dims: dimension 1 is -1; expected a non-negative integer"),
    ((2, 2.5), "s8", "ab", r"dims: dimension 1 is 2.5"),
    ((), "s8", "ab", r"dims: expected a non-empty tuple"),
    ((2, 3), "s8", "abc", r"tag: 'abc' describes 3 dimensions but the tensor has 2"),
    ((2, 3), "s8", "nchw", r"tag: 'nchw' \(= 'abcd'\) describes 4 dimensions"),
    ((2, 3), "s8", "aa", r"tag: 'aa' is not a format tag"),
    ((2, 3), "s8", "ac", r"tag: 'ac' is not a format tag"),
    ((2, 3), "s8", "packed", r"tag: 'packed' descriptors come from an implementation"),
])
def test_bad_desc_names_argument(dims, dt, tag, match):
    with pytest.raises(ValueError, match=match):
        desc(dims, dt, tag)


def test_any_and_packed_descs():
    md = desc((4, 5), "s8")
    assert md.is_any and md.size == 20
    with pytest.raises(ValueError, match="'any' descriptor has no size"):
        md.nbytes
    with pytest.raises(ValueError, match="md: cannot make memory.*'any'"):
        Memory(md)
    p = packed_desc((4, 5), "s8", ("vnni4", 16), 128)
    assert p.is_packed and p.nbytes == 128 and p.physical_shape == (128,)
    assert p == packed_desc((4, 5), "s8", ("vnni4", 16), 128) != packed_desc((4, 5), "s8", ("other",), 128)
    with pytest.raises(ValueError, match="has no memory order"):
        p.strides
    with pytest.raises(ValueError, match="layout: a 'packed' descriptor needs"):
        MemoryDesc((4, 5), "s8", "packed")
    with pytest.raises(TypeError, match="layout: expected a hashable record"):
        packed_desc((4, 5), "s8", [1, 2], 8)
    assert M.bytes_desc(0).nbytes == 0 and M.bytes_desc(100).dims == (100,)


@st.composite
def plain_descs(draw):
    ndims = draw(st.integers(1, 5))
    dims = tuple(draw(st.lists(st.integers(1, 5), min_size=ndims, max_size=ndims)))
    perm = draw(st.permutations(range(ndims)))
    dt = draw(st.sampled_from(M.DATA_TYPES))
    return desc(dims, dt, M.tag_of_perm(perm))


@FEW
@given(plain_descs())
def test_strides_match_numpy_transpose(md):
    """A descriptor's strides are those of the logical view numpy gives of the memory."""
    mem = Memory(md)
    logical = mem.logical()
    assert logical.shape == md.dims
    item = md.itemsize
    assert all(s * item == ls or d == 1 for s, ls, d in zip(md.strides, logical.strides, md.dims))
    assert md.nbytes == math.prod(md.dims) * item == mem.nbytes
    assert tuple(md.dims[i] for i in md.perm) == md.physical_shape == mem.array.shape
    # Element (i0, i1, ...) lives at sum(i_k * stride_k) in the flat buffer.
    mem.data[:] = np.arange(md.size).astype(mem.data.dtype)
    idx = tuple(d - 1 for d in md.dims)
    flat = sum(i * s for i, s in zip(idx, md.strides))
    assert mem.logical()[idx] == mem.data[flat]


# ----------------------------------------------------------------------------- memory

def test_memory_wraps_without_copy():
    md = desc((3, 4), "s8", "ba")
    phys = np.zeros((4, 3), np.int8)
    assert np.shares_memory(Memory(md, phys).array, phys)
    flat = np.zeros(12, np.int8)
    assert np.shares_memory(Memory(md, flat).array, flat)
    logical = np.zeros((4, 3), np.int8).T  # logical shape (3, 4) laid out as 'ba'
    m = Memory(md, logical)
    assert np.shares_memory(m.array, logical) and m.logical().shape == (3, 4)
    m.logical()[2, 1] = 7
    assert logical[2, 1] == 7


def test_memory_allocates_aligned_zeros():
    for dt in M.DATA_TYPES:
        m = Memory(desc((5, 7), dt, "ab"))
        assert m.address % 64 == 0 and not m.array.any() and m.array.dtype == M.numpy_dtype(dt)
    p = Memory(packed_desc((4, 5), "s8", ("x",), 96), payload="comp")
    assert p.array.dtype == np.uint8 and p.array.shape == (96,) and p.payload == "comp"
    with pytest.raises(ValueError, match="packed and has no logical view"):
        p.logical()


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping that holds ``address`` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize("nbytes", [(1 << 20) - 1, 1 << 20, (3 << 20) + 5])
def test_large_buffers_start_on_huge_pages(nbytes):
    """Buffers from 1 MiB (packed weights, scratchpads) start on a 2 MiB boundary of a
    mapping advised to take transparent huge pages; smaller ones come from numpy."""
    a = M.aligned_zeros(nbytes, np.uint8)
    assert a.shape == (nbytes,) and a.ctypes.data % 64 == 0 and not a.any() and a.flags.writeable
    huge = nbytes >= 1 << 20
    assert a.ctypes.data % M.HUGE_PAGE == 0 or not huge
    view = a[-8:].view(np.int64)
    del a
    gc.collect()
    view[0] = -1  # the view keeps the mapping alive
    assert view[0] == -1
    if huge and os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
        assert "hg" in _vm_flags(view.ctypes.data)


def test_huge_page_advice_refused_falls_back(monkeypatch):
    """A kernel that refuses the advice (built without transparent huge pages: EINVAL)
    still gets its zeroed, aligned buffer, on small pages."""
    import mmap

    monkeypatch.setattr(mmap, "MADV_HUGEPAGE", 0x7FFF)  # no such advice: madvise fails
    a = M.huge_page_zeros(3 << 20)
    assert a.ctypes.data % M.HUGE_PAGE == 0 and a.nbytes == 3 << 20 and not a.any()
    a[-1] = 1
    if os.path.exists("/proc/self/smaps"):
        assert "hg" not in _vm_flags(a.ctypes.data)


def test_packed_weights_start_on_a_huge_page():
    """The fc's 2 MB of packed weights (the case that measured the placement luck)."""
    from jit.dot import fast_path
    from primitives.gemm_pack import pack_b

    packed = pack_b(np.ones((2048, 1000), np.int8), fast_path("avx512_core_vnni"), 4)
    assert packed.data.nbytes == 2048 * 1024 and packed.data.ctypes.data % M.HUGE_PAGE == 0


def test_memory_bad_arrays_name_argument():
    md = desc((3, 4), "u8", "ab")
    with pytest.raises(TypeError, match=r"src: expected dtype uint8 \(u8\), got int8"):
        Memory(md, np.zeros((3, 4), np.int8), name="src")
    with pytest.raises(ValueError, match=r"src: got shape \(4, 3\).*expected a C-contiguous array of shape \(3, 4\)"):
        as_memory(np.zeros((4, 3), np.uint8), "src", md)
    with pytest.raises(ValueError, match=r"dst: got shape \(3, 4\) with byte strides"):
        as_memory(np.zeros((3, 8), np.uint8)[:, ::2], "dst", md)
    with pytest.raises(TypeError, match="weights: expected a Memory or a numpy array, got list"):
        as_memory([1, 2], "weights")
    with pytest.raises(TypeError, match="src: numpy float64 has no int8jit data type"):
        as_memory(np.zeros(3), "src")
    with pytest.raises(ValueError, match=r"bias: memory is s32:a:4; expected f32:a:4"):
        as_memory(Memory(desc(4, "s32", "a")), "bias", desc(4, "f32", "a"))
    with pytest.raises(ValueError, match="src: the array is not dense"):
        as_memory(np.zeros((4, 6), np.uint8)[:, :3], "src")


def test_as_memory_infers_tags_and_accepts_memory():
    x = np.zeros((2, 3, 4), np.float32).transpose(0, 2, 1)
    m = as_memory(x, "src")
    assert m.desc.tag == "acb" and m.desc.dims == (2, 4, 3) and np.shares_memory(m.array, x)
    assert as_memory(m, "src", m.desc) is m
    assert as_memory(m, "src", desc((2, 4, 3), "f32")) is m  # 'any': dims and type must agree
    # (1, n) in 'ab' and 'ba' are the same bytes.
    row = Memory(desc((1, 5), "s8", "ba"))
    assert as_memory(row, "src", desc((1, 5), "s8", "ab")) is row
    assert as_memory(np.float32(0.5), "scales:src").desc.dims == (1,)


# ----------------------------------------------------------------------------- masks

@st.composite
def dims_and_mask(draw):
    dims = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=5)))
    mask = draw(st.integers(0, 2 ** len(dims) - 1))
    return dims, mask


@FEW
@given(dims_and_mask())
def test_expected_count_is_product_of_masked_dims(dm):
    dims, mask = dm
    want = 1
    for i, d in enumerate(dims):
        if mask & (1 << i):
            want *= d
    assert expected_count(mask, dims) == want
    # The count equals the size of the tensor reduced (broadcast) over the unmasked dims.
    shape = [d if mask >> i & 1 else 1 for i, d in enumerate(dims)]
    assert expected_count(mask, dims) == np.zeros(shape).size
    vals = check_scales("scales:src", np.full(want, 0.5, np.float64), mask, dims)
    assert vals.dtype == np.float32 and vals.flags.c_contiguous and vals.size == want
    with pytest.raises(ValueError, match=rf"scales:src: got {want + 1} values; expected {want} for mask {mask}"):
        check_scales("scales:src", np.ones(want + 1), mask, dims)


@FEW
@given(st.integers(1, 6), st.integers(-5, 300))
def test_check_mask_bounds(ndims, mask):
    if 0 <= mask < 2 ** ndims:
        assert check_mask("m", mask, ndims) == mask
    else:
        with pytest.raises(ValueError, match="m: mask"):
            check_mask("m", mask, ndims)


def test_check_scales_and_zero_points_errors():
    assert check_scales("s", 2.0, 0, (3, 4)).tolist() == [2.0]
    f32 = np.ones(4, np.float32)
    assert np.shares_memory(check_scales("s", f32, 2, (3, 4)), f32)  # no copy of a fitting array
    with pytest.raises(ValueError, match="s: scale 1 is inf, not a finite f32"):
        check_scales("s", [1.0, np.inf, 1.0], 1, (3, 4))
    with pytest.raises(TypeError, match="s: expected numbers"):
        check_scales("s", ["a"], 0, (3,))
    with pytest.raises(TypeError, match="s: expected an integer mask"):
        check_scales("s", [1.0], True, (3,))
    assert check_zero_points("z", [1, -2, 3], 1, (3, 4)).dtype == np.int32
    with pytest.raises(TypeError, match=r"z: expected integer \(s32\) zero points, got dtype float64"):
        check_zero_points("z", [1.0], 0, (3,))
    with pytest.raises(ValueError, match=r"z: zero point 0 is 300; expected an integer in \[0, 255\]"):
        check_zero_points("z", [300], 0, (3,), lo=0, hi=255)
    with pytest.raises(ValueError, match=r"z: got 2 values; expected 1 for mask 0 on dims \(3,\) \(one for the whole"):
        check_zero_points("z", [1, 2], 0, (3,))


# ----------------------------------------------------------------------------- post-ops and attr

def test_post_ops_builders_and_keys():
    src1 = desc((1, 8), "f32", "ab")
    po = PostOps().eltwise("relu", 0.1).sum(0.5, 3, "u8").binary("mul", src1)
    assert [e.kind for e in po] == ["eltwise", "sum", "binary"] and len(po) == 3
    assert po.entries[1] == Sum(0.5, 3, "u8")
    assert po.key() == PostOps(po.entries).key() and hash(po.key())
    assert po.binary_args() == {A.post_op_src1(2): src1}
    assert A.post_op_src1(2) == "post_op:2:src_1"
    assert A.scales(WEIGHTS) == "scales:weights" and A.zero_points(DST) == "zero_points:dst"


@pytest.mark.parametrize("make, exc, match", [
    (lambda: Eltwise("gelu"), ValueError, r"alg: unknown eltwise algorithm 'gelu'; expected one of 'relu'"),
    (lambda: Eltwise("relu", float("nan")), ValueError, "alpha: expected a finite number, got nan"),
    (lambda: Eltwise("linear", 1.0, float("inf")), ValueError, "beta: expected a finite number"),
    (lambda: Eltwise("relu", "1"), TypeError, "alpha: expected a real number, got str"),
    (lambda: Eltwise("clip", 6.0, 0.0), ValueError, "alpha: clip's lower bound alpha=6.0 is above"),
    (lambda: Sum(float("inf")), ValueError, "scale: expected a finite number"),
    (lambda: Sum(1.0, 2 ** 31), ValueError, r"zero_point: expected an integer in \[-2147483648, 2147483647\]"),
    (lambda: Sum(1.0, 1.5), ValueError, "zero_point: expected an integer"),
    (lambda: Sum(1.0, 0, "s16"), ValueError, "dt: unknown data type 's16'"),
    (lambda: Binary("pow", desc(1, "f32", "a")), ValueError, "alg: unknown binary algorithm 'pow'"),
    (lambda: Binary("add", np.zeros(3)), TypeError, "src1: expected a MemoryDesc, got ndarray"),
    (lambda: Binary("add", desc(3, "f32")), ValueError, "src1: expected a plain layout"),
    (lambda: PostOps([Eltwise("relu"), "sum"]), TypeError, r"post_ops\[1\]: expected Eltwise, Sum or Binary"),
])
def test_bad_post_ops_name_argument(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_post_ops_validate_against_dst():
    dst = desc((4, 8), "u8", "ab")
    PostOps().binary("add", desc((1, 8), "f32", "ab")).validate(dst)
    with pytest.raises(ValueError, match=r"post_ops\[0\]: binary src1 dims \(4, 2\) do not broadcast"):
        PostOps().binary("add", desc((4, 2), "f32", "ab")).validate(dst)
    with pytest.raises(ValueError, match=r"post_ops\[1\]: matmul cannot do eltwise 'exp'"):
        PostOps().eltwise("relu").eltwise("exp").validate(dst, "matmul", eltwise_algs=("relu",))
    with pytest.raises(ValueError, match=r"post_ops\[0\]: sum data type 's32' has 4 bytes but dst is 'u8'"):
        PostOps().sum(dt="s32").validate(dst)
    with pytest.raises(ValueError, match=r"post_ops\[1\]: matmul supports at most 1 sum"):
        PostOps().sum().sum().validate(dst, "matmul")


def test_attr_defaults_setters_and_key():
    a = Attr()
    assert (a.scratchpad_mode, a.fpmath_mode, a.policy) == ("library", "strict", "exact") and a.is_default()
    assert a.set_scales_mask(WEIGHTS, 2).set_zero_points_mask(SRC, 0) is a
    a.set_post_ops(PostOps().eltwise("relu")).set_scratchpad_mode("user").set_fpmath_mode("bf16")
    a.set_policy("halve_weights")
    b = Attr(scales={WEIGHTS: 2}, zero_points={SRC: 0}, post_ops=[Eltwise("relu")], scratchpad_mode="user",
             fpmath_mode="bf16", policy="halve_weights")
    assert a == b and a.key() == b.key() and hash(a.key())
    c = a.copy()
    c.set_scales_mask(WEIGHTS, None)
    assert a.scales_mask(WEIGHTS) == 2 and c.scales_mask(WEIGHTS) is None and a.key() != c.key()
    assert "scales:weights:2" in a.verbose_str() and "policy:halve_weights" in a.verbose_str()
    # The attr copies a PostOps given to it: later appends to the builder do not leak in.
    po = PostOps()
    d = Attr(post_ops=po)
    po.eltwise("relu")
    assert len(d.post_ops) == 0


@pytest.mark.parametrize("call, exc, match", [
    (lambda a: a.set_scales_mask("bias2", 0), ValueError, "scales: unknown argument 'bias2'"),
    (lambda a: a.set_scales_mask(SRC, -1), ValueError, "scales:src: mask -1 is negative"),
    (lambda a: a.set_zero_points_mask(DST, 1.0), TypeError, "zero_points:dst: expected an integer mask"),
    (lambda a: a.set_scratchpad_mode("usr"), ValueError, "scratchpad_mode: unknown scratchpad mode 'usr'"),
    (lambda a: a.set_fpmath_mode("f64"), ValueError, "fpmath_mode: unknown fpmath mode 'f64'"),
    (lambda a: a.set_policy("fast"), ValueError, "policy: unknown policy 'fast'"),
    (lambda a: a.set_post_ops("relu"), TypeError, "post_ops: expected PostOps"),
])
def test_bad_attr_names_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call(Attr())


def test_attr_validate_for_a_primitive():
    descs = {SRC: desc((4, 16), "u8", "ab"), WEIGHTS: desc((16, 8), "s8", "ab"), DST: desc((4, 8), "s8", "ab")}
    Attr(scales={SRC: 0, WEIGHTS: 2, DST: 0}, zero_points={SRC: 0, DST: 0}).validate(descs, "matmul")
    with pytest.raises(ValueError, match="attr zero_points:weights: matmul takes no zero points for 'weights'"):
        Attr(zero_points={WEIGHTS: 0}).validate(descs, "matmul")
    with pytest.raises(ValueError, match="attr scales:weights: mask 4 sets bit 2 but the tensor has 2 dimensions"):
        Attr(scales={WEIGHTS: 4}).validate(descs, "matmul")
    with pytest.raises(ValueError, match=r"attr zero_points:src: matmul supports masks \(0,\) for 'src', got 2"):
        Attr(zero_points={SRC: 2}).validate(descs, "matmul", zero_points_masks={SRC: (0,)})
    with pytest.raises(ValueError, match=r"post_ops\[0\]: matmul cannot do binary 'div'"):
        Attr(post_ops=PostOps().binary("div", desc((4, 8), "f32", "ab"))).validate(
            descs, "matmul", binary_algs=("add",))
    assert Attr(scales={WEIGHTS: 2}, zero_points={DST: 0}).exec_args(descs) == {
        "scales:weights": 8, "zero_points:dst": 1}


@pytest.mark.parametrize("dims", [(2 ** 40, 2 ** 40), (2 ** 31, 2 ** 31)])
def test_memory_too_large_to_allocate_names_its_descriptor(dims):
    """A Memory whose zeroed storage cannot be allocated raises MemoryError naming the
    descriptor and the bytes (it had been numpy's OverflowError or mmap's OSError)."""
    with pytest.raises(MemoryError, match=r"md: u8:ab:\d+x\d+ needs \d+ bytes, which could not be allocated"):
        Memory(desc(dims, "u8", "ab"))
