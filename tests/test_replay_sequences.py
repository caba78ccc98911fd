"""Random sequences of calls: whatever a caller does between executions (new array
objects over the same memory, new arrays, values changed in place, arrays freed and
their addresses reused, two argument sets in turn, a call from another thread, a bound
call, a source inside a bigger buffer, an array wrapped in a Memory, another user
scratchpad), each result is
what a primitive that kept nothing computes, and no call writes into another argument
set's dst.

The replays (``primitives.replay.Replay``) make execute a state machine: per thread, the
last replay and one per argument set, each either matched, moved to new arrays or set up
again. The tests of ``test_replay`` and ``test_held_arrays`` walk the routes one at a
time; here hypothesis draws the order. The oracle is a second primitive of the same
descriptor (made with the primitive cache off), run on the full path on copies of the
arguments before each call under test.
"""
from __future__ import annotations

import gc
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from primitives import primitive_cache
from primitives.memory import Memory
from tests.conftest import in_threads
from tests.test_held_arrays import _depthwise, _plain_weights_conv, _pooling, _reorder
from tests.test_replay import _MOVE_CASES, _conv, _matmul_case, _new_arrays

SETTINGS = settings(max_examples=int(os.environ.get("INT8JIT_TEST_EXAMPLES", "25")), deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _made(make):
    """(primitive, args) of a test_held_arrays maker: (primitive, new args())."""
    p, new = make()
    return p, new()


def _depthwise_user():
    """A depthwise layer on a user scratchpad (its own fast path, structs per thread)."""
    from primitives.attr import Attr
    from primitives.conv import ConvolutionDesc
    from primitives.memory import desc
    from primitives.reorder import reorder_desc

    rng = np.random.default_rng(5)
    pd = ConvolutionDesc(desc((1, 32, 9, 9), "u8", "nhwc"), desc((32, 1, 1, 3, 3), "s8", "any"),
                         desc((1, 32, 9, 9), "u8", "nhwc"), desc((32,), "f32", "a"), padding_l=(1, 1),
                         padding_r=(1, 1), attr=Attr(scales={"weights": 1}, zero_points={"src": 0},
                                                     scratchpad_mode="user"))
    w = Memory(pd.weights_desc())
    reorder_desc(desc((32, 1, 1, 3, 3), "s8", "goihw"), pd.weights_desc()).create().execute(
        {"src": rng.integers(-128, 128, (32, 1, 1, 3, 3)).astype(np.int8), "dst": w})
    return _user((pd.create(), {"src": rng.integers(0, 256, (1, 9, 9, 32)).astype(np.uint8), "weights": w,
                                "bias": rng.normal(0, 9, 32).astype(np.float32),
                                "dst": np.zeros((1, 9, 9, 32), np.uint8),
                                "scales:weights": np.full(32, 0.01, np.float32),
                                "zero_points:src": np.int32([3])}))


def _user(made):
    p, args = made
    args["scratchpad"] = np.zeros(p.pd.scratchpad_desc().nbytes, np.uint8)
    return p, args


CASES = {  # name -> () -> (primitive, args)
    **{name: (lambda make=make: make(1)) for name, (make, _) in _MOVE_CASES.items()},
    "conv 3x3, two threads": lambda: _conv(ic=16, pad=1, threads=2),
    "matmul, packed per call, two threads": lambda: _matmul_case(9, True, 2),
    "conv, user scratchpad": lambda: _user(_conv(ic=16, pad=1, user=True)),
    "matmul, user scratchpad, packed per call": lambda: _user(_matmul_case(9, True, 1, user=True)),
    "conv, plain weights": lambda: _made(_plain_weights_conv),
    "depthwise": lambda: _made(lambda: _depthwise(1)),
    "depthwise, stride 2": lambda: _made(lambda: _depthwise(2)),
    "depthwise, user scratchpad, source zero point": _depthwise_user,
    "pooling nhwc": lambda: _made(lambda: _pooling("nhwc")),
    "pooling nchw": lambda: _made(lambda: _pooling("nchw")),
    "reorder quantize": lambda: _made(lambda: _reorder("quantize")),
    "reorder transpose": lambda: _made(lambda: _reorder("transpose")),
}

_CACHE: dict = {}  # case -> (primitive, args), made once: hypothesis runs many examples
_ORACLES: dict = {}  # case -> the second primitive
_SPARE: dict = {}  # case -> a second user scratchpad

OPS = ("call", "call", "switch sets", "new objects, same memory", "new arrays", "an input changed in place",
       "buffers freed and reused", "call from another thread", "bound call", "in a bigger buffer",
       "wrapped in a Memory", "unwrapped", "another user scratchpad")


def _new_set(args: dict, seed: int) -> dict:
    """test_replay's new arrays (new source, runtime weights and operand values, a zeroed
    dst, equal copies of the rest), with a float source (a quantizing reorder's) too."""
    if _array(args["src"]).dtype.kind != "f":
        return _new_arrays(args, seed)
    new = _new_arrays({k: v for k, v in args.items() if k != "src"}, seed)
    src = _array(args["src"])
    new["src"] = np.random.default_rng(seed).normal(0, 50, src.shape).astype(src.dtype)
    return new


def _oracle(p):
    """A primitive of ``p``'s descriptor that shares nothing with it."""
    primitive_cache.set_capacity(0)
    try:
        other = p.pd.create()
    finally:
        primitive_cache.set_capacity(None)
    assert other is not p
    return other


def _array(value):
    return value.array if isinstance(value, Memory) else value


def _expected(oracle, args):
    """The full path's dst on copies of ``args`` (or the exception it raises)."""
    copy = {k: (v if isinstance(v, Memory) or k == "scratchpad" else v.copy(order="K")) for k, v in args.items()}
    oracle._forget_replays()
    try:
        oracle.execute(copy)
    except (ValueError, TypeError) as exc:
        return exc
    return _array(copy["dst"]).copy()


def _by_value(name: str) -> bool:
    return name.startswith(("scales:", "zero_points:")) or name == "bias"


def _changed(args: dict, rng, by_value: bool = True) -> None:
    """One input's values changed in place: the source, runtime weights, a binary
    operand, or (``by_value``) a value the set-up read (a scale, a zero point, the bias)."""
    names = [k for k, v in args.items() if k not in ("dst", "scratchpad") and isinstance(_array(v), np.ndarray)
             and not (isinstance(v, Memory) and v.desc.is_packed) and (by_value or not _by_value(k))]
    name = names[int(rng.integers(len(names)))]
    a = _array(args[name])
    if name.startswith("zero_points:"):  # (within every source type's range)
        a[...] = rng.integers(0, 10, a.shape)
    elif a.dtype.kind == "f":
        a[...] = a * np.float32(rng.choice([0.5, 2.0])) + np.float32(rng.normal(0, 3))
    else:
        info = np.iinfo(a.dtype)
        a[...] = rng.integers(max(info.min, -128), min(info.max, 255) + 1, a.shape)


def _bigger(value, rng):
    """The same values in a new array of the same strides inside a bigger buffer (rows
    before and after it), or None where the array is no C-contiguous ndarray."""
    if type(value) is not np.ndarray or not value.flags.c_contiguous or value.ndim == 0:
        return None
    pad = int(rng.integers(1, 3))
    buffer = np.zeros((value.shape[0] + 2 * pad,) + value.shape[1:], value.dtype)
    inner = buffer[pad:pad + value.shape[0]]
    inner[...] = value
    return inner


def _reused(args: dict) -> dict:
    """New arrays with the same values, allocated right after ``args``' arrays are freed
    (the allocator tends to give their addresses back). The caller drops its references."""
    keep = {k: v for k, v in args.items() if isinstance(v, Memory) or k == "scratchpad"}
    values = {k: v.copy(order="K") for k, v in args.items() if k not in keep}
    args.clear()
    gc.collect()
    new = dict(keep)
    for k, v in values.items():
        new[k] = np.empty_like(v)
        new[k][...] = v
    return new


@pytest.mark.parametrize("case", list(CASES))
@SETTINGS
@given(ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=10), seed=st.integers(0, 2**16))
# (found by the search: on a user scratchpad another thread's set-up left this thread's
# replay pointing at that thread's arrays, in the convolution and the matmul)
@example(ops=["call", "switch sets", "call from another thread", "switch sets"], seed=0)
@example(ops=["call", "new arrays", "call from another thread", "call", "bound call"], seed=1)
def test_any_sequence_of_calls_gives_the_full_paths_results(case, ops, seed):
    if case not in _CACHE:
        _CACHE[case] = CASES[case]()
        _ORACLES[case] = _oracle(_CACHE[case][0])
    (p, first), oracle = _CACHE[case], _ORACLES[case]
    rng = np.random.default_rng(seed)
    p._forget_replays()  # (each example from the same start: hypothesis replays a failure alone)
    sets = [_new_set(first, seed), _new_set(first, seed + 1)]
    now = 0
    for step, op in enumerate(ops + ["call"]):
        args = sets[now]
        if op == "switch sets":
            now = 1 - now
        elif op == "new objects, same memory":
            sets[now] = {k: (v if isinstance(v, Memory) else v[...]) for k, v in args.items()}
        elif op == "new arrays":
            sets[now] = _new_set(args, seed + 10 + step)
        elif op == "an input changed in place":
            _changed(args, rng)
        elif op == "buffers freed and reused":
            del args
            sets[now] = _reused(sets[now])
        elif op == "in a bigger buffer":
            name = "src" if rng.integers(2) else "dst"
            inner = _bigger(args[name], rng)
            if inner is not None:
                sets[now] = dict(args, **{name: inner})
        elif op == "wrapped in a Memory":
            name = "src" if rng.integers(2) else "dst"
            value = args[name]
            if type(value) is np.ndarray:
                md = p.pd.src_desc() if name == "src" else p.pd.dst_desc()
                try:
                    sets[now] = dict(args, **{name: Memory(md, value)})
                except (ValueError, TypeError):
                    pass  # (a view this descriptor does not describe)
        elif op == "another user scratchpad":  # (of two, or a new one; the other set may use either)
            if "scratchpad" in args:
                spare = _SPARE.setdefault(case, np.zeros_like(args["scratchpad"]))
                sets[now] = dict(args, scratchpad=spare if args["scratchpad"] is not spare and rng.integers(2)
                                 else np.zeros_like(spare))
        elif op == "unwrapped":
            sets[now] = {k: (v.array if isinstance(v, Memory) and not v.desc.is_packed else v)
                         for k, v in args.items()}
        else:
            _checked_call(p, oracle, sets, now, op, rng, f"step {step} ({op}) of {ops}")


def _checked_call(p, oracle, sets, now, op, rng, where):
    args = sets[now]
    if op == "bound call":
        run = p.bind(args)
        # (it runs on whatever the arrays then hold, but keeps the scales, zero points and
        # bias it was bound with)
        _changed(args, rng, by_value=False)
    dst = _array(args["dst"])
    dst[...] = np.asarray(rng.integers(0, 100, dst.shape)).astype(dst.dtype)  # (stale values must not survive)
    other = _array(sets[1 - now]["dst"]).copy()
    want = _expected(oracle, args)
    if isinstance(want, Exception):
        with pytest.raises(type(want)):
            p.execute(args)
        return
    if op == "bound call":
        run()
        del run
    elif op == "call from another thread":
        failed = in_threads(p.execute, [(args,)])
        assert not failed, f"{where}: {failed[0]!r}"
    else:
        p.execute(args)
    np.testing.assert_array_equal(dst, want, err_msg=where)
    np.testing.assert_array_equal(_array(sets[1 - now]["dst"]), other, err_msg=f"{where}: the other set's dst")



# -- oneDNN's GEMM calls (gemm_u8s8s32, gemm_s8s8s32): their own replays (Gemm.execute) --
GEMM_CASES = {  # name -> (M, N, K, A's type, offsetc, threads, route)
    "B packed, offsets per column": (64, 48, 40, "u8", "R", 1, "call"),
    "s8 A shifted, offsets per row": (64, 48, 40, "s8", "C", 1, "call"),
    "rows of A read in place": (3, 64, 256, "u8", "F", 1, "call"),
    "one row, K in chunks": (1, 2048, 64, "u8", "R", 1, "call"),
    "K of 3": (5, 7, 3, "s8", "F", 1, "call"),
    "two threads": (64, 96, 64, "u8", "R", 2, "call"),
    "Gemm, B at each call": (64, 48, 40, "u8", "R", 1, "Gemm"),
    "Gemm, B at each call, rows in place, s8": (2, 64, 100, "s8", "C", 1, "Gemm"),
    "Gemm, B at creation": (30, 40, 50, "s8", "F", 1, "Gemm with B"),
}
GEMM_OPS = ("call", "call", "switch sets", "new arrays", "A changed in place", "B changed in place",
            "co changed in place", "other offsets", "beta 0 or 1", "rows with gaps", "buffers freed and reused",
            "call from another thread")


def _gemm_set(M, N, K, a_type, offsetc, rng, gaps=False) -> dict:
    """Arrays (A, B, C with leading dimensions, wider than their rows where ``gaps``), co,
    offsets and beta of one call."""
    lda, ldb, ldc = (K + 5, N + 3, N + 7) if gaps else (K, N, N)
    A = np.zeros((M, lda), np.uint8 if a_type == "u8" else np.int8)
    A[:, :K] = rng.integers(0, 100, (M, K)) if a_type == "u8" else rng.integers(-100, 100, (M, K))
    B = np.zeros((K, ldb), np.int8)
    B[:, :N] = rng.integers(-128, 128, (K, N))
    C = np.zeros((M, ldc), np.int32)
    C[:, :N] = rng.integers(-1000, 1000, (M, N))
    co = rng.integers(-50, 50, {"F": 1, "C": M, "R": N}[offsetc]).astype(np.int32)
    return {"A": A, "B": B, "C": C, "co": co, "ao": int(rng.integers(0, 9)), "bo": int(rng.integers(-3, 4)),
            "beta": float(rng.integers(2)), "ld": (lda, ldb, ldc)}


def _gemm_want(s, M, N, K, offsetc) -> np.ndarray:
    """C after the call, in int64 (the values stay far from int32's limits)."""
    a = s["A"][:, :K].astype(np.int64) - s["ao"]
    b = s["B"][:, :N].astype(np.int64) - s["bo"]
    co = s["co"].astype(np.int64)
    co = co.reshape(-1, 1) if offsetc == "C" else co
    return a @ b + s["beta"] * s["C"][:, :N] + co


@pytest.mark.parametrize("case", list(GEMM_CASES))
@SETTINGS
@given(ops=st.lists(st.sampled_from(GEMM_OPS), min_size=1, max_size=10), seed=st.integers(0, 2**16))
def test_any_sequence_of_gemm_calls_gives_the_products(case, ops, seed):
    from primitives.gemm import Gemm, gemm_s8s8s32, gemm_u8s8s32

    M, N, K, a_type, offsetc, threads, route = GEMM_CASES[case]
    function = gemm_u8s8s32 if a_type == "u8" else gemm_s8s8s32
    objects: dict = {}  # (a Gemm takes its leading dimensions and beta, and B if given, at creation)

    def gemm_object(s):
        lda, ldb, ldc = s["ld"]
        with_b = route == "Gemm with B"
        key = (s["ld"], s["beta"], id(s["B"]) if with_b else None)
        if key not in objects:  # (B held with it: no later B takes its id)
            objects[key] = Gemm(M, N, K, a_type=a_type, offsetc=offsetc, lda=lda, ldb=ldb, ldc=ldc, beta=s["beta"],
                                threads=threads, **({"B": s["B"]} if with_b else {})), s["B"]
        return objects[key][0]
    rng = np.random.default_rng(seed)
    sets = [_gemm_set(M, N, K, a_type, offsetc, rng), _gemm_set(M, N, K, a_type, offsetc, rng)]
    now = 0
    for step, op in enumerate(ops + ["call"]):
        s = sets[now]
        if op == "switch sets":
            now = 1 - now
        elif op in ("new arrays", "rows with gaps"):
            sets[now] = _gemm_set(M, N, K, a_type, offsetc, rng, gaps=op == "rows with gaps")
        elif op == "A changed in place":
            s["A"][:, :K] = np.roll(s["A"][:, :K], 1, axis=1)
        elif op == "B changed in place" and route != "Gemm with B":  # (that Gemm packed B once)
            s["B"][:, :N] = -np.maximum(s["B"][:, :N], -127)
        elif op == "co changed in place":
            s["co"] += 3
        elif op == "other offsets":
            s["ao"], s["bo"] = int(rng.integers(0, 9)), int(rng.integers(-3, 4))
        elif op == "beta 0 or 1":
            s["beta"] = 1.0 - s["beta"]
        elif op == "buffers freed and reused":  # (s is sets[now]: _reused empties it, dropping the arrays)
            scalars = {k: s.pop(k) for k in [k for k, v in s.items() if not isinstance(v, np.ndarray)]}
            sets[now] = _reused(s)
            sets[now].update(scalars)
        else:
            s, other = sets[now], sets[1 - now]["C"].copy()
            want = s["C"].astype(np.int64)  # (the gaps between rows stay as they are)
            want[:, :N] = _gemm_want(s, M, N, K, offsetc)
            lda, ldb, ldc = s["ld"]

            def call():
                if route == "call":
                    function("N", "N", offsetc, M, N, K, 1.0, s["A"], lda, s["ao"], s["B"], ldb, s["bo"], s["beta"],
                             s["C"], ldc, s["co"], threads=threads)
                else:
                    gemm_object(s).execute(s["A"], s["C"], ao=s["ao"], bo=s["bo"], co=s["co"],
                                           **({"B": s["B"]} if route == "Gemm" else {}))
            if op == "call from another thread":
                failed = in_threads(call, [()])
                assert not failed, f"step {step}: {failed[0]!r}"
            else:
                call()
            where = f"step {step} ({op}) of {ops}"
            np.testing.assert_array_equal(s["C"], want, err_msg=where)
            np.testing.assert_array_equal(sets[1 - now]["C"], other, err_msg=f"{where}: the other set's C")
