"""What a primitive keeps of a call's arrays: nothing. A replay holds the caller's arrays
weakly and its set-up keeps arrays over their memory that do not keep them alive
(runtime.ffi.unowned), so an array the caller lets go is freed at once, whatever route
its call took (set up, replayed, moved to new arrays); and a call on new arrays that
the allocator puts where freed ones were gives the full path's result."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from primitives.attr import Attr
from primitives.conv import ConvolutionDesc
from primitives.gemm import Gemm, gemm, gemm_s8s8s32, gemm_u8s8s32
from primitives.matmul import InnerProductDesc
from primitives.memory import Memory, desc
from primitives.pooling import PoolingDesc, pool2d
from primitives.reorder import ReorderDesc, dequantize, quantize, reorder_desc
from runtime.ffi import unowned
from tests.test_replay import _MOVE_CASES, _conv, _fresh, _matmul_case, _new_arrays

_RNG = np.random.default_rng(31)


def _pooling(tag: str):
    p = PoolingDesc("pooling_max", desc((2, 5, 7, 6), "u8", tag), desc((2, 5, 4, 3), "u8", tag), 2, 3, 1, 1).create()
    shapes = ((2, 7, 6, 5), (2, 4, 3, 5)) if tag == "nhwc" else ((2, 5, 7, 6), (2, 5, 4, 3))
    return p, lambda: {"src": _RNG.integers(0, 256, shapes[0]).astype(np.uint8), "dst": np.zeros(shapes[1], np.uint8)}


def _reorder(case: str):
    shape = (6, 40, 33)
    if case == "quantize":
        pd = ReorderDesc(desc(shape, "f32", "abc"), desc(shape, "s8", "abc"), attr=Attr(scales={"dst": 4}))
        return pd.create(), lambda: {"src": _RNG.normal(0, 50, shape).astype(np.float32),
                                     "dst": np.zeros(shape, np.int8), "scales:dst": np.full(33, 0.5, np.float32)}
    pd = ReorderDesc(desc(shape, "s8", "abc"), desc(shape, "s8", "cab"))
    return pd.create(), lambda: {"src": _RNG.integers(-128, 128, shape).astype(np.int8),
                                 "dst": np.zeros(pd.dst_desc().physical_shape, np.int8)}


def _depthwise(stride: int):
    hw, oh = 14, 14 // stride
    pd = ConvolutionDesc(desc((1, 32, hw, hw), "u8", "nhwc"), desc((32, 1, 1, 3, 3), "s8", "any"),
                         desc((1, 32, oh, oh), "u8", "nhwc"), desc((32,), "f32", "a"), strides=(stride, stride),
                         padding_l=(1, 1), padding_r=(1 - (stride - 1), 1 - (stride - 1)),
                         attr=Attr(scales={"weights": 1}))
    w = Memory(pd.weights_desc())
    reorder_desc(desc((32, 1, 1, 3, 3), "s8", "goihw"), pd.weights_desc()).create().execute(
        {"src": _RNG.integers(-128, 128, (32, 1, 1, 3, 3)).astype(np.int8), "dst": w})
    return pd.create(), lambda: {"src": _RNG.integers(0, 256, (1, hw, hw, 32)).astype(np.uint8), "weights": w,
                                 "bias": _RNG.normal(0, 9, 32).astype(np.float32),
                                 "dst": np.zeros((1, oh, oh, 32), np.uint8),
                                 "scales:weights": np.full(32, 0.01, np.float32)}


def _gemm_args(m: int, n: int, k: int, a_type: str = "u8") -> dict:
    return {"A": _RNG.integers(0, 100, (m, k)).astype(np.uint8 if a_type == "u8" else np.int8),
            "B": _RNG.integers(-128, 128, (k, n)).astype(np.int8), "C": np.zeros((m, n), np.int32),
            "co": np.arange(n, dtype=np.int32)}


def _one_off(m: int, n: int, k: int, a_type: str = "u8"):
    function = gemm_u8s8s32 if a_type == "u8" else gemm_s8s8s32

    def call(a: dict) -> None:  # (offsets per column, a zero point: the in-place rows' fix too)
        function("N", "N", "R", m, n, k, 1.0, a["A"], k, 3, a["B"], n, 2, 0.0, a["C"], n, a["co"])
    return call, lambda: _gemm_args(m, n, k, a_type)


def _moving(made: tuple):
    """(primitive, new args()) of test_replay's (primitive, args): new arrays of the same
    layouts at each call (the same user scratchpad)."""
    p, args = made
    if p.pd.scratchpad_desc().nbytes and p.pd._attr().scratchpad_mode == "user":
        args.setdefault("scratchpad", np.zeros(p.pd.scratchpad_desc().nbytes, np.uint8))
    return p, lambda: _new_arrays(args, int(_RNG.integers(99)))


def _plain_weights_conv():
    """A convolution given plain weights (oihw) at every call: packed when they change."""
    pd = ConvolutionDesc(desc((1, 8, 6, 6), "u8", "nhwc"), desc((16, 8, 3, 3), "s8", "oihw"),
                         desc((1, 16, 6, 6), "s32", "nhwc"), padding_l=(1, 1), padding_r=(1, 1))
    return pd.create(), lambda: {"src": _RNG.integers(0, 256, (1, 6, 6, 8)).astype(np.uint8),
                                 "weights": _RNG.integers(-128, 128, (16, 8, 3, 3)).astype(np.int8),
                                 "dst": np.zeros((1, 6, 6, 16), np.int32)}


def _primitive(make):
    p, new = make()
    return p.execute, new


_ROUTES = {  # name -> () -> (call(args), new args())
    **{case: (lambda case=case: _primitive(lambda: _moving(_MOVE_CASES[case][0](1)))) for case in _MOVE_CASES},
    "conv, user scratchpad": lambda: _primitive(lambda: _moving(_conv(ic=16, pad=1, user=True))),
    "matmul, user scratchpad, weights packed per call": lambda: _primitive(
        lambda: _moving(_matmul_case(9, True, 1, user=True))),
    "conv, plain weights": lambda: _primitive(_plain_weights_conv),
    "pooling nhwc": lambda: _primitive(lambda: _pooling("nhwc")),
    "pooling nchw (transposed)": lambda: _primitive(lambda: _pooling("nchw")),
    "reorder quantize": lambda: _primitive(lambda: _reorder("quantize")),
    "reorder transpose": lambda: _primitive(lambda: _reorder("transpose")),
    "depthwise": lambda: _primitive(lambda: _depthwise(1)),
    "depthwise, stride 2": lambda: _primitive(lambda: _depthwise(2)),
    "gemm one-off, packed": lambda: _one_off(64, 48, 40),
    "gemm one-off, s8 A shifted": lambda: _one_off(64, 48, 40, "s8"),
    "gemm one-off, rows read in place": lambda: _one_off(3, 64, 256),
    "gemm one-off, K of 3": lambda: _one_off(5, 7, 3),
    "Gemm, constant B": lambda: (lambda g: (lambda a: g.execute(a["A"], a["C"], ao=1),
                                            lambda: _gemm_args(30, 40, 50)))(
        Gemm(30, 40, 50, B=_RNG.integers(-128, 128, (50, 40)).astype(np.int8))),
    "gemm()": lambda: (lambda a: a.__setitem__("C", gemm(a["A"], a["B"], ao=2)), lambda: _gemm_args(9, 10, 11)),
    "pool2d": lambda: (lambda a: a.__setitem__("y", pool2d(a["x"], 3, 2, 1)),
                       lambda: {"x": _RNG.integers(0, 256, (1, 9, 9, 16)).astype(np.uint8)}),
    "quantize": lambda: (lambda a: a.__setitem__("y", quantize(a["x"], 0.5, 3, "u8")),
                         lambda: {"x": _RNG.normal(0, 9, (33, 17)).astype(np.float32)}),
    "dequantize": lambda: (lambda a: a.__setitem__("y", dequantize(a["x"], 0.5, 3)),
                           lambda: {"x": _RNG.integers(0, 256, (33, 17)).astype(np.uint8)}),
}


def _refs(*calls: dict) -> dict:
    return {f"{i}:{name}": weakref.ref(v) for i, args in enumerate(calls) for name, v in args.items()
            if isinstance(v, np.ndarray) and name != "scratchpad"}  # (a user scratchpad: held as given)


@pytest.mark.parametrize("route", list(_ROUTES))
def test_arrays_are_freed_when_the_caller_drops_them(route):
    """Set up, replayed, moved to new arrays (or set up again): once the caller drops its
    arrays, none is alive, the by-value ones (scales, bias) included; a user scratchpad
    is held as given."""
    call, new = _ROUTES[route]()
    first, second = new(), new()
    call(first)
    call(first)  # (replayed)
    call(second)  # (moved, or set up again)
    refs = _refs(first, second)
    del first, second
    gc.collect()
    assert [name for name, ref in refs.items() if ref() is not None] == []


@pytest.mark.parametrize("case", ["conv 3x3, source rows copied", "matmul, packed weights", "depthwise"])
def test_bound_calls_hold_their_arrays_until_dropped(case):
    """A bound call runs on its arrays with no test, so it holds them; dropped, they go."""
    call, new = _ROUTES[case]()
    args = new()
    p = call.__self__
    bound = p.bind(args)
    refs = _refs(args)
    del args
    gc.collect()
    assert all(ref() is not None for ref in refs.values())
    bound()
    del bound
    gc.collect()
    assert [name for name, ref in refs.items() if ref() is not None] == []


@pytest.mark.parametrize("case", list(_MOVE_CASES))
def test_new_objects_where_dead_ones_were(case):
    """Every call new array objects, the last call's dead, over two sets of buffers in
    turn (0, 0, 1, 0, 1): new objects at a dead one's address, as the allocator gives
    them, and back at an address left for another (what set-ups that compare addresses,
    the row copies' source or the runtime weights' packer, must see through); new values
    each time, set up and moved in turn. Every result is the full path's on copies."""
    make, _ = _MOVE_CASES[case]
    p, args = make(1)
    buffers = [args, _new_arrays(args, 60)]
    del args
    for i, which in enumerate((0, 0, 1, 0, 1)):
        values = _new_arrays(buffers[which], 70 + i)
        call = {k: (v if isinstance(v, Memory) else v[...]) for k, v in buffers[which].items()}  # (new objects)
        for k, v in values.items():
            if not isinstance(v, Memory):
                call[k][...] = v
        want = _fresh(p, call)
        call["dst"][...] = 0
        if i % 2:
            p._forget_replays()  # (set up again; else the replay moves from _fresh's copies)
        p.execute(call)
        np.testing.assert_array_equal(call["dst"], want, err_msg=f"call {i} on buffers {which}")
        del call  # (its objects die: the next call's are new ones over the same bytes)


@pytest.mark.parametrize("as_memory", [False, True])
def test_by_value_arguments_changed_in_place(as_memory):
    """A scale (and bias) changed in place between calls, given as an ndarray or inside a
    Memory: the same arrays and new ones both see the new values (a Memory's were missed
    by the test of a replay moved to new arrays)."""
    pd = InnerProductDesc(desc((2, 8), "u8", "ab"), desc((3, 8), "s8", "any"), desc((2, 3), "f32", "ab"),
                          desc((3,), "f32", "a"), attr=Attr(scales={"src": 0}))
    p = pd.create()
    w = Memory(pd.weights_desc())
    reorder_desc(desc((3, 8), "s8", "ab"), pd.weights_desc()).create().execute(
        {"src": np.ones((3, 8), np.int8), "dst": w})
    scale, bias = np.float32([1.0]), np.zeros(3, np.float32)
    args = {"src": np.ones((2, 8), np.uint8), "weights": w, "dst": np.zeros((2, 3), np.float32),
            "scales:src": Memory(desc((1,), "f32", "a"), scale) if as_memory else scale,
            "bias": Memory(desc((3,), "f32", "a"), bias) if as_memory else bias}
    for value in (1.0, 2.0, 3.0):
        scale[0], bias[:] = value, value
        for new in (False, True):
            if new:
                args = dict(args, src=np.ones((2, 8), np.uint8), dst=np.zeros((2, 3), np.float32))
            p.execute(args)
            np.testing.assert_array_equal(args["dst"], np.full((2, 3), 9 * value, np.float32),
                                          err_msg=f"scale {value}, new arrays: {new}")


def test_unowned_is_the_same_memory_and_keeps_nothing():
    """runtime.ffi.unowned: the array's elements in place (any strides, read-only kept
    read-only), and no reference to the array."""
    x = np.arange(60, dtype=np.int32).reshape(3, 4, 5)
    for view in (x, x.T, x[::-1, 1:, ::2], x[:, 2], x.reshape(-1)[::-7]):
        u = unowned(view)
        assert u.shape == view.shape and u.strides == view.strides and np.array_equal(u, view)
        assert np.shares_memory(u, x)
    unowned(x[1])[...] = -1
    assert (x[1] == -1).all()
    frozen = np.ones(4)
    frozen.flags.writeable = False
    assert not unowned(frozen).flags.writeable
    assert unowned(np.zeros((0, 3))).shape == (0, 3)
    ref = weakref.ref(x)
    u = unowned(x[::2])
    del x
    gc.collect()
    assert ref() is None
