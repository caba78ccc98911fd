"""Matmul with runtime dims (``RUNTIME_DIM`` in src's and dst's M, and a 3-D matmul's
batch), as oneDNN's matmul takes ``DNNL_RUNTIME_DIM_VAL``: one descriptor and primitive
serve every M. Each call must equal, bit for bit, the matmul made for its dims (which
test_matmul holds to the numpy model), on every ISA path; the weights reorder once into
the runtime descriptor's ``weights_desc()``. Runtime dims anywhere else are refused,
naming the argument."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from primitives.attr import Attr, PostOps
from primitives.conv import ConvolutionDesc
from primitives.matmul import InnerProductDesc, MatmulDesc
from primitives.memory import RUNTIME_DIM, Memory, desc
from primitives.pooling import PoolingDesc
from primitives.reorder import reorder_desc

R = RUNTIME_DIM
SETTINGS = settings(max_examples=int(os.environ.get("INT8JIT_TEST_EXAMPLES", "25")), deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _packed(pd, w: np.ndarray) -> Memory:
    wm = Memory(pd.weights_desc())
    reorder_desc(desc(w.shape, "s8", "ab" if w.ndim == 2 else "abc"), pd.weights_desc()).create().execute(
        {"src": w, "dst": wm})
    return wm


@st.composite
def _problems(draw):
    K, N = draw(st.integers(1, 70)), draw(st.integers(1, 70))
    ms = draw(st.lists(st.integers(0, 40), min_size=2, max_size=5))
    src_dt, dst_dt = draw(st.sampled_from(["u8", "s8"])), draw(st.sampled_from(["u8", "s8", "s32", "f32"]))
    fused = draw(st.booleans())
    packed = draw(st.booleans())
    return K, N, ms, src_dt, dst_dt, fused, packed, draw(st.integers(0, 2 ** 31))


@SETTINGS
@given(p=_problems())
def test_each_call_equals_the_matmul_of_its_dims(isa_path, p):
    K, N, ms, src_dt, dst_dt, fused, packed, seed = p
    rng = np.random.default_rng(seed)
    attr = Attr(scales={"src": 0, "weights": 2, "dst": 0}, zero_points={"src": 0},
                post_ops=PostOps().eltwise("relu")) if fused else Attr()
    bias = desc((N,), "f32", "a") if fused else None
    wd = desc((K, N), "s8", "any" if packed else "ab")
    pd = MatmulDesc(desc((R, K), src_dt, "ab"), wd, desc((R, N), dst_dt, "ab"), bias, attr=attr, isa=isa_path)
    w = rng.integers(-128, 128, (K, N)).astype(np.int8)
    weights = _packed(pd, w) if packed else w
    prim = pd.create()
    info = np.iinfo(np.uint8 if src_dt == "u8" else np.int8)
    extra = {"bias": rng.normal(0, 50, N).astype(np.float32), "scales:src": np.float32([0.05]),
             "scales:weights": rng.uniform(0.01, 0.1, N).astype(np.float32), "scales:dst": np.float32([0.5]),
             "zero_points:src": np.int32([3])} if fused else {}
    dtype = {"u8": np.uint8, "s8": np.int8, "s32": np.int32, "f32": np.float32}[dst_dt]
    for M in ms:
        src = rng.integers(info.min, info.max + 1, (M, K)).astype(info.dtype)
        dst = np.full((M, N), 7, dtype)
        prim.execute({"src": src, "weights": weights, "dst": dst, **extra})
        fixed = MatmulDesc(desc((M, K), src_dt, "ab"), wd, desc((M, N), dst_dt, "ab"), bias, attr=attr,
                           isa=isa_path)
        want = np.full((M, N), 7, dtype)
        fixed.create().execute({"src": src, "weights": weights if M else w, "dst": want, **extra})
        assert dst.tobytes() == want.tobytes(), (M, K, N)


def test_batch_and_m_at_runtime(isa_path):
    """A 3-D matmul's batch and M, both runtime; weights of batch 1 broadcast; bound calls
    too, and each shape's matmul kept for the next call."""
    rng = np.random.default_rng(1)
    pd = MatmulDesc(desc((R, R, 24), "u8", "abc"), desc((1, 24, 20), "s8", "any"), desc((R, R, 20), "s32", "abc"),
                    isa=isa_path)
    w = rng.integers(-128, 128, (1, 24, 20)).astype(np.int8)
    wm = _packed(pd, w)
    prim = pd.create()
    for b, m in ((2, 3), (1, 1), (3, 17), (2, 3)):
        src = rng.integers(0, 256, (b, m, 24)).astype(np.uint8)
        dst = np.zeros((b, m, 20), np.int32)
        prim.execute({"src": src, "weights": wm, "dst": dst})
        np.testing.assert_array_equal(dst, src.astype(np.int64) @ w.astype(np.int64))
        dst[...] = 0
        prim.bind({"src": src, "weights": wm, "dst": dst})()
        np.testing.assert_array_equal(dst, src.astype(np.int64) @ w.astype(np.int64))
    assert sorted(prim._made) == [(1, 1), (2, 3), (3, 17)]
    info = prim.impl_info()
    assert info["runtime_dims"] == ["batch", "M"] and info["shape"][:2] == (R, R) and info["kernels_run"]


def test_no_rows_writes_nothing_and_checks_every_argument():
    """A call with M = 0 writes nothing and checks its arguments as a zero-volume matmul
    does, the weights against the runtime descriptor's packed layout."""
    pd = MatmulDesc(desc((R, 8), "u8", "ab"), desc((8, 4), "s8", "any"), desc((R, 4), "s32", "ab"))
    wm = _packed(pd, np.ones((8, 4), np.int8))
    prim = pd.create()
    good = {"src": np.zeros((0, 8), np.uint8), "weights": wm, "dst": np.zeros((0, 4), np.int32)}
    prim.execute(good)
    prim.bind(good)()
    read_only = np.zeros((0, 4), np.int32)
    read_only.flags.writeable = False
    for bad, message in (({"dst": np.zeros((1, 4), np.int32)}, "dst: got shape \\(1, 4\\)"),
                         ({"dst": read_only}, "dst: the array is read-only"),
                         ({"src": np.zeros((0, 9), np.uint8)}, "src: got shape \\(0, 9\\)"),
                         ({"weights": np.ones((8, 4), np.int8)}, "weights: expected dtype uint8 \\(packed"),
                         ({"weights": "no"}, "weights: expected a Memory or a numpy array"),
                         ({"bogus": 1}, "args: unexpected argument 'bogus'")):
        with pytest.raises((ValueError, TypeError), match=message):
            prim.execute({**good, **bad})


def test_verbose_lines(monkeypatch, capsys):
    """The runtime descriptor's create line shows its runtime dims as ``*`` (as oneDNN's
    does); each call's exec line its own dims; a shape's matmul made at its first call
    logs no create line of its own."""
    from primitives import verbose

    monkeypatch.setenv(verbose.ENV, "1")
    pd = MatmulDesc(desc((R, 8), "u8", "ab"), desc((8, 4), "s8", "ab"), desc((R, 4), "s32", "ab"))
    prim = pd.create()
    for m in (2, 5):
        prim.execute({"src": np.zeros((m, 8), np.uint8), "weights": np.ones((8, 4), np.int8),
                      "dst": np.zeros((m, 4), np.int32)})
    lines = [line.split(",") for line in capsys.readouterr().err.splitlines() if line.startswith("int8jit_verbose")]
    assert [f[1] for f in lines] == ["create", "exec", "exec"]
    assert "src:u8:ab:*x8" in lines[0][5] and "dst:s32:ab:*x4" in lines[0][5]
    assert "src:u8:ab:2x8" in lines[1][5] and "src:u8:ab:5x8" in lines[2][5]


@pytest.mark.parametrize("make, message", [
    (lambda: MatmulDesc(desc((R, 8), "u8", "ab"), desc((8, 4), "s8", "any"), desc((3, 4), "s32", "ab")),
     r"dst: its runtime dims \(s32:ab:3x4\) are not src's"),
    (lambda: MatmulDesc(desc((3, R), "u8", "ab"), desc((8, 4), "s8", "any"), desc((3, 4), "s32", "ab")),
     "src: u8:ab:3x\\* has a runtime dim other than M"),
    (lambda: MatmulDesc(desc((R, 8), "u8", "ab"), desc((R, 4), "s8", "any"), desc((R, 4), "s32", "ab")),
     r"weights: dims \*x4 hold a runtime dim"),
    (lambda: MatmulDesc(desc((R, 2, 8), "u8", "abc"), desc((3, 8, 4), "s8", "abc"), desc((R, 2, 4), "s32", "abc")),
     "weights: batch 3 beside a runtime batch"),
    (lambda: MatmulDesc(desc((R, 8), "u8", "ab"), desc((8, 4), "s8", "any"), desc((R, 4), "s32", "ab"),
                        attr=Attr(scratchpad_mode="user")), "attr scratchpad_mode: 'user'"),
    (lambda: MatmulDesc(desc((R, 8), "u8", "ab"), desc((8, 4), "s8", "any"), desc((R, 4), "f32", "ab"),
                        attr=Attr(post_ops=PostOps().binary("add", desc((5, 4), "f32", "ab")))),
     "post_op:0:src_1: dims 5x4 beside runtime dims"),
    (lambda: Memory(desc((R, 8), "u8", "ab")), "md: cannot make memory for u8:ab:\\*x8"),
    (lambda: reorder_desc(desc((R, 8), "f32", "ab"), desc((R, 8), "u8", "ab")), "src_desc: dims \\*x8 hold a runtime"),
    (lambda: InnerProductDesc(desc((R, 8), "u8", "ab"), desc((4, 8), "s8", "any"), desc((R, 4), "s32", "ab")),
     "src: dims \\*x8 hold a runtime dim"),
    (lambda: ConvolutionDesc(desc((R, 8, 5, 5), "u8", "nhwc"), desc((8, 8, 3, 3), "s8", "any"),
                             desc((R, 8, 3, 3), "u8", "nhwc")), "src: dims \\*x8x5x5 hold a runtime dim"),
    (lambda: ConvolutionDesc(desc((R, 8, 5, 5), "u8", "nhwc"), desc((8, 1, 1, 3, 3), "s8", "any"),
                             desc((R, 8, 3, 3), "u8", "nhwc")), "src: dims \\*x8x5x5 hold a runtime dim"),
    (lambda: PoolingDesc("max", desc((R, 8, 5, 5), "u8", "nhwc"), desc((R, 8, 3, 3), "u8", "nhwc"), 1, 3, 0, 0),
     "src_desc: dims \\*x8x5x5 hold a runtime dim"),
])
def test_runtime_dims_elsewhere_are_refused_by_name(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_edges_a_hunt_found():
    """No rows with column-major plain weights (the stand-in zeros had been row-major);
    impl_info of a runtime matmul whose every shape is empty (N = 0); messages that show
    runtime dims as * (not the stand-in's 1); concrete() checks its values."""
    w = np.asfortranarray(np.ones((8, 4), np.int8))
    prim = MatmulDesc(desc((R, 8), "u8", "ab"), desc((8, 4), "s8", "ba"), desc((R, 4), "s32", "ab")).create()
    prim.execute({"src": np.zeros((0, 8), np.uint8), "weights": w, "dst": np.zeros((0, 4), np.int32)})
    empty = MatmulDesc(desc((R, 8), "u8", "ab"), desc((8, 0), "s8", "ab"), desc((R, 0), "s32", "ab"))
    assert empty.impl_info()["impl"] == "zero_volume" and empty.runs_isa() == "any" and "zero_volume" in repr(empty)
    with pytest.raises(ValueError, match=r"dst: expected dims \(\*, 4\) \(N from the weights\), got \*x5"):
        MatmulDesc(desc((R, 8), "u8", "ab"), desc((8, 4), "s8", "ab"), desc((R, 5), "s32", "ab"))
    with pytest.raises(ValueError, match=r"src: expected a row-major \(ab\) src, got u8:ba:\*x8"):
        MatmulDesc(desc((R, 8), "u8", "ba"), desc((8, 4), "s8", "ab"), desc((R, 4), "s32", "ab"))
    pd = MatmulDesc(desc((R, 8), "u8", "ab"), desc((8, 4), "s8", "ab"), desc((R, 4), "s32", "ab"))
    with pytest.raises(ValueError, match=r"values: expected 1 \(one per runtime dim\), got \(5, 6\)"):
        pd.concrete((5, 6))
    with pytest.raises(ValueError, match="concrete: this matmul has no runtime dims"):
        pd.concrete((5,)).concrete((5,))


def test_every_shape_runs_the_path_planned_at_creation():
    """A cap set after creation does not move the shapes met later to another path (their
    packed weights would not fit it, their plain ones would saturate where the descriptor
    said exact); dispatch lines are the descriptor's."""
    from runtime import isa as isa_mod

    pd = MatmulDesc(desc((R, 64), "u8", "ab"), desc((64, 32), "s8", "any"), desc((R, 32), "s32", "ab"),
                    attr=Attr(policy="faithful"))
    planned = pd.impl_info()["isa"]
    w = np.random.default_rng(0).integers(-128, 128, (64, 32)).astype(np.int8)
    wm, prim = _packed(pd, w), pd.create()
    try:
        isa_mod.set_max_isa("avx2")
        src, dst = np.full((7, 64), 255, np.uint8), np.zeros((7, 32), np.int32)
        prim.execute({"src": src, "weights": wm, "dst": dst})
    finally:
        isa_mod.set_max_isa(None)
    assert all(f"_{planned}_" in name for name in prim.impl_info()["kernels_run"]), prim.impl_info()
    if "vnni" in planned:
        np.testing.assert_array_equal(dst, src.astype(np.int64) @ w.astype(np.int64))


def test_dispatch_lines_and_hot_shapes_kept(monkeypatch, capsys):
    from primitives import verbose

    monkeypatch.setenv(verbose.ENV, "dispatch")
    pd = MatmulDesc(desc((R, 8), "u8", "ab"), desc((8, 4), "s8", "any"), desc((R, 4), "s32", "ab"), isa="avx2")
    kinds = [line.split(",")[1] for line in capsys.readouterr().err.splitlines()]
    assert kinds.count("dispatch") >= 2, kinds  # (the paths above avx2, and the kernel chosen)
    monkeypatch.delenv(verbose.ENV)
    prim, w = pd.create(), np.ones((8, 4), np.int8)
    wm = _packed(pd, w)
    made = []
    real = pd.concrete
    monkeypatch.setattr(pd, "concrete", lambda values: made.append(values) or real(values))
    for m in range(2, 45):  # (more shapes than kept; M = 1 at every other call)
        for rows in (1, m):
            prim.execute({"src": np.ones((rows, 8), np.uint8), "weights": wm, "dst": np.zeros((rows, 4), np.int32)})
    assert made.count((1,)) == 1 and len(prim._made) == 32
