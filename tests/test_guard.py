"""jit.guard: a replay's test of a call's arrays and its move to them, in one kernel call.

Its model is a few lines of Python (:func:`_model`): each checked item an exact ndarray
with the recorded dtype object, shape and strides, writable where it must be, holding the
recorded bytes where its values count; no pair of extents overlapping (numpy's
``may_share_memory``, which compares bounds); then, and only then, each field its item's
data plus an offset. The property test holds the kernel to it over random layouts and
candidates (other shapes, strides, dtypes, subclasses, read-only arrays, objects that are
no arrays, changed values, overlapping outputs), with the values compared and the fields
flush against guard pages. Then the replays that use it: a matmul's guard moves it to new
arrays with no Python test, and leaves what it cannot take to the Python routes.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jit.guard import Guard, extent, layout_ok
from primitives.memory import Memory
from runtime.ffi import ffi, pointer_to
from tests.conftest import GuardedBuffer

DTYPES = (np.uint8, np.int8, np.int32, np.float32, np.int64)


def test_this_cpython_has_guards():
    """On CPython's standard build the layout is confirmed (elsewhere replays test in
    Python, and this is no failure)."""
    if sys.implementation.name != "cpython" or hasattr(sys, "gettotalrefcount"):
        pytest.skip("not CPython's standard build: no guards, by design")
    assert layout_ok()


def _layout(rng, dtype):
    """An array of ``dtype`` of a random layout: 0-3 dims of 0-5, then a transpose, a
    step, a reversal or none; sometimes read-only."""
    shape = tuple(int(n) for n in rng.integers(0, 6, int(rng.integers(0, 4))))
    base = np.zeros(tuple(2 * n + 1 for n in shape), dtype)
    a = base[tuple(slice(0, n) for n in shape) + (Ellipsis,)]  # (0-d: an array, not a scalar)
    if a.ndim and rng.random() < 0.3:
        a = base[tuple(slice(0, 2 * n, 2) for n in shape)]
    if a.ndim > 1 and rng.random() < 0.3:
        a = a.transpose(rng.permutation(a.ndim))
    if a.ndim and rng.random() < 0.2:
        a = a[::-1]
    if rng.random() < 0.5:
        a = np.ascontiguousarray(a)
    return a


class _Sub(np.ndarray):
    pass


def _placed(like, buffer, at: int):
    """An array laid out as ``like`` (shape, dtype, strides) in ``buffer``, its extent
    starting at byte ``at``."""
    lo = (extent(like) or (0, 0))[0]
    return np.ndarray(like.shape, like.dtype, buffer=buffer, offset=at - lo, strides=like.strides)


def _span(like) -> int:
    lo, hi = extent(like) or (0, 0)
    return hi - lo


def _candidate(rng, like, buffer=None, at=0):
    """Something a call might pass where ``like`` was: mostly an array laid out alike (in
    ``buffer`` at ``at``, else in a buffer of its own; its values random or the same),
    else one that differs in one way, or no array."""
    others = ["shape", "strides", "dtype", "byte order", "subclass", "read-only", "list", "none", "memory"]
    kind = rng.choice(["alike", "same values"] + others, p=[0.6, 0.1] + [0.3 / len(others)] * len(others))
    if buffer is None:
        buffer, at = np.zeros(_span(like) + 64, np.uint8), int(rng.integers(0, 64))
    new = _placed(like, buffer, at)
    new[...] = like if kind == "same values" else rng.integers(0, 100, like.shape).astype(like.dtype)
    if kind == "shape":
        return np.zeros(like.shape + (1,), like.dtype)
    if kind == "strides":
        other = np.asfortranarray(new) if new.flags.c_contiguous else np.ascontiguousarray(new)
        return other if other.strides != like.strides else np.zeros(like.shape + (1,), like.dtype)
    if kind == "dtype":
        return new.astype(np.float64)
    if kind == "byte order" and like.dtype.itemsize > 1:
        return new.astype(like.dtype.newbyteorder())
    if kind == "subclass":
        return new.view(_Sub)
    if kind == "read-only":
        new.flags.writeable = False
    if kind == "list":
        return new.tolist()
    if kind == "none":
        return None
    if kind == "memory":
        return Memory.__new__(Memory)
    return new


def _model(checks, items, pairs) -> bool:
    for pos, like, writable, value in checks:
        c = items[pos]
        if type(c) is not np.ndarray or c.dtype is not like.dtype or c.shape != like.shape \
                or c.strides != like.strides or writable and not c.flags.writeable \
                or value is not None and c.tobytes() != value:
            return False
    for sides in pairs:
        a, b = ((items[pos] if pos is not None else array) for pos, array in sides)
        if np.may_share_memory(a, b):
            return False
    return True


@settings(max_examples=500, deadline=None)
@given(count=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_the_guard_computes_its_model(count, seed):
    """Random layouts and candidates, one to four items (the first an output that must
    not overlap the others, one held array beside them): the kernel's answer is the
    model's; the fields are written where it says yes and left alone where it says no."""
    if not layout_ok():
        pytest.skip("no guards in this process")
    rng = np.random.default_rng(seed)
    likes = [_layout(rng, DTYPES[int(rng.integers(len(DTYPES)))]) for _ in range(count)]
    checks = []
    for pos, like in enumerate(likes):
        by_value = like.flags.c_contiguous and rng.random() < 0.3
        checks.append((pos, like, pos == 0 and rng.random() < 0.7, like.tobytes() if by_value else None))
    items = [_candidate(rng, like) for like in likes]
    if count > 1 and rng.random() < 0.3:  # the output and the second item in one buffer: they may overlap
        shared = np.zeros(_span(likes[0]) + _span(likes[1]) + 64, np.uint8)
        items[:2] = (_candidate(rng, like, shared, int(rng.integers(0, shared.size - _span(like) + 1)))
                     for like in likes[:2])
    held = np.zeros(5, np.int32)
    if rng.random() < 0.1 and type(items[0]) is np.ndarray and items[0].base is not None:
        held = items[0].base  # (the output's buffer, as a held array: they overlap unless it is empty)
    pairs = [((0, likes[0]), (i, likes[i])) for i in range(1, count)] + [((0, likes[0]), (None, held))]
    fields = GuardedBuffer(count, np.int64, "end")
    try:
        fields.array[:] = -1
        offsets = rng.integers(-1000, 1000, count)
        guard = Guard(count, checks, pairs,
                      [(ffi.cast("char *", pointer_to(fields.array)) + 8 * i, i, int(offsets[i])) for i in range(count)],
                      keep=fields)
        want = _model(checks, items, [((0, None), (i, None)) for i in range(1, count)] + [((0, None), (None, held))]
                      if all(type(x) is np.ndarray for x in items) else [])
        assert guard(tuple(items)) == want
        if want:
            np.testing.assert_array_equal(fields.array, [x.ctypes.data + int(o) for x, o in zip(items, offsets)])
        else:
            assert (fields.array == -1).all()
    finally:
        fields.close()


def test_each_single_difference_is_refused():
    """For layouts of 1-4 dims (transposed, stepped, reversed), an array alike passes and
    each one thing changed fails: a dim, a stride, the dtype, the byte order, the type, the
    writability of an output, a value read at set-up."""
    if not layout_ok():
        pytest.skip("no guards in this process")
    x = np.arange(2 * 3 * 4 * 5, dtype=np.int32).reshape(2, 3, 4, 5)
    for like in (x, x[0], x[0, 0], x[0, 0, 0], x.transpose(3, 1, 0, 2), x[:, ::2], x[..., ::-1], x[1:, :, 1:3]):
        value = like.tobytes() if like.flags.c_contiguous else None
        guard = Guard(1, [(0, like, True, value)], [], [])
        new = _placed(like, np.zeros(_span(like) + 64, np.uint8), 16)
        new[...] = like
        assert guard((new,))
        for axis in range(like.ndim):
            shape, strides = list(like.shape), list(like.strides)
            shape[axis] += 1
            assert not guard((np.zeros(shape, like.dtype),))
            strides[axis] += 4
            other = np.ndarray(like.shape, like.dtype, buffer=np.zeros(_span(like) * 2 + 256, np.uint8),
                               offset=128 - (extent(like) or (0, 0))[0], strides=strides)
            other[...] = like
            assert not guard((other,)), (like.strides, strides)
        for wrong in (new.astype(np.int64), new.astype(">i4"), new.view(_Sub)):
            assert not guard((wrong,))
        frozen = new.view()
        frozen.flags.writeable = False
        assert not guard((frozen,))
        if value is not None:
            new.reshape(-1)[-1] += 1
            assert not guard((new,))


def test_values_are_compared_to_the_last_byte_and_no_further():
    """A value read at set-up, flush against a guard page after it, then before it: every
    byte counts (a change in the last one is seen), and none past them is read."""
    if not layout_ok():
        pytest.skip("no guards in this process")
    for n in (1, 7, 8, 13, 64, 1001):
        like = np.arange(n, dtype=np.uint8)
        for where in ("end", "start"):
            buffer = GuardedBuffer(n, np.uint8, where)
            try:
                guard = Guard(1, [(0, like, False, like.tobytes())], [], [])
                buffer.array[:] = like
                assert guard((buffer.array,))
                buffer.array[-1] ^= 1
                assert not guard((buffer.array,))
                buffer.array[-1] ^= 1
                buffer.array[0] ^= 1
                assert not guard((buffer.array,))
            finally:
                buffer.close()


def test_extents_are_numpys_bounds():
    bounds = getattr(getattr(np.lib, "array_utils", np), "byte_bounds")
    x = np.zeros((4, 6), np.int32)
    for a in (x, x.T, x[::2, 1::3], x[::-1], x[:, ::-2].T, x[:0]):
        span = extent(a)
        if a.size == 0:
            assert span is None
        else:
            assert (a.ctypes.data + span[0], a.ctypes.data + span[1]) == tuple(bounds(a))


def test_bad_tables_are_refused():
    if not layout_ok():
        pytest.skip("no guards in this process")
    x = np.zeros(4, np.int32)
    field = ffi.new("int64_t[1]")
    with pytest.raises(ValueError, match="position 2"):
        Guard(2, [(2, x, False, None)], [], [])
    with pytest.raises(ValueError, match="dense"):
        Guard(1, [(0, x[::2], False, x[::2].tobytes())], [], [])
    with pytest.raises(ValueError, match="points: position 1"):
        Guard(2, [(0, x, False, None)], [], [(ffi.addressof(field, 0), 1, 0)])
    with pytest.raises(ValueError, match="pairs: position 1"):
        Guard(2, [(0, x, False, None)], [((0, x), (1, x))], [])


# -- the replays ------------------------------------------------------------------------


def _decode(threads=1):
    from tests.test_replay import _batched_case

    return _batched_case(1, 0, threads, "acb")


def _new(args, rng):
    new = {}
    for k, v in args.items():
        fresh = np.empty_like(v)  # (the same memory order: a view's too)
        fresh[...] = rng.integers(-100, 100, v.shape) if k != "dst" else 0
        new[k] = fresh
    return new


def _want(p, args):
    from tests.test_replay_sequences import _expected, _oracle

    return _expected(_oracle(p), args)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_matmul_replay_moves_by_its_guard_alone(threads, monkeypatch):
    """12 heads' decode shape (weights read in place, the keys' view): after the first
    call the replay has a guard; calls with new arrays run on them with neither Python
    route (matches' record, moves) nor a set-up, and give the full path's results."""
    if not layout_ok():
        pytest.skip("no guards in this process")
    from primitives.replay import Replay

    p, args = _decode(threads)
    p.execute(args)
    replay = p._replay_for(args)
    assert replay._guard is None  # (built where a Python route first takes a call)
    p.execute(args)
    assert replay._guard is not None
    rng = np.random.default_rng(3)
    calls = [_new(args, rng) for _ in range(3)]
    wants = [_want(p, c) for c in calls]
    monkeypatch.setattr(Replay, "moves", lambda self, a: pytest.fail("a Python move"))
    monkeypatch.setattr(type(p), "_full", lambda *a, **k: pytest.fail("a set-up"))
    for _ in range(2):
        for c, want in zip(calls, wants):
            c["dst"][...] = 0
            p.execute(c)
            np.testing.assert_array_equal(c["dst"], want)


def test_what_the_guard_refuses_takes_the_python_routes():
    """An output over the source, a read-only dst, a list, an array of another dtype or
    strides: the guard says no, and execute does what it did without guards (raises as
    the full path does, or runs on a copy)."""
    if not layout_ok():
        pytest.skip("no guards in this process")
    p, args = _decode()
    p.execute(args)
    p.execute(args)
    assert p._replay_for(args)._guard is not None
    rng = np.random.default_rng(4)
    over = _new(args, rng)
    shared = np.zeros(_span(args["weights"]) + 64, np.uint8)  # (the weights and the dst over one buffer)
    over["weights"], over["dst"] = _placed(args["weights"], shared, 0), _placed(args["dst"], shared, 64)
    with pytest.raises(ValueError, match="overlap"):
        p.execute(over)
    frozen = _new(args, rng)
    frozen["dst"].flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        p.execute(frozen)
    listed = _new(args, rng)
    listed["src"] = listed["src"].tolist()
    with pytest.raises((TypeError, ValueError)):
        p.execute(listed)
    for change in ("dtype", "strides"):
        other = _new(args, rng)
        if change == "dtype":
            other["src"] = other["src"].astype(np.int8)
        else:
            other["src"] = np.asfortranarray(other["src"])
        want = _want(p, other)
        if isinstance(want, Exception):
            with pytest.raises(type(want)):
                p.execute(other)
        else:
            p.execute(other)
            np.testing.assert_array_equal(other["dst"], want)
    c = _new(args, rng)  # (and the guard serves again)
    want = _want(p, c)
    p.execute(c)
    np.testing.assert_array_equal(c["dst"], want)


def test_without_guards_replays_test_in_python(monkeypatch):
    """Where this process has no guards (another Python), replays are made without
    them and move in Python, with the same results."""
    import primitives.replay as replay_module

    monkeypatch.setattr(replay_module, "layout_ok", lambda: False)
    p, args = _decode()
    p._forget_replays()
    p.execute(args)
    p.execute(args)
    assert p._replay_for(args)._guard is None
    rng = np.random.default_rng(5)
    for _ in range(3):
        c = _new(args, rng)
        want = _want(p, c)
        p.execute(c)
        np.testing.assert_array_equal(c["dst"], want)


def test_a_guard_is_built_by_the_first_call_a_python_route_takes(monkeypatch):
    """A set-up builds no guard; the next call that a Python route takes (the same arrays,
    or new ones laid out alike) builds it. A caller whose scales change at every call sets
    up at every call and never builds one (about 50 us a set-up otherwise)."""
    if not layout_ok():
        pytest.skip("no guards in this process")
    import primitives.replay as replay_module

    built = []
    guarded = replay_module._guarded
    monkeypatch.setattr(replay_module, "_guarded", lambda *a: built.append(1) or guarded(*a))
    from tests.test_replay import _matmul_case

    p, args = _matmul_case(2, False, 1)  # (weights packed once; scales and bias read by value)
    for step in range(4):  # (a by-value argument new at every call: a set-up each time)
        p.execute(dict(args, **{"scales:src": np.float32([0.5 + step])}))
        assert not built and p._replay_for(args)._guard is None
    p.execute(args)  # (the scales as before the loop: a set-up again)
    assert not built
    rng = np.random.default_rng(8)

    def new_arrays():
        return dict(args, src=rng.integers(0, 256, args["src"].shape).astype(np.uint8), dst=np.zeros_like(args["dst"]))
    moved = new_arrays()
    want = _want(p, moved)
    p.execute(moved)  # (new arrays laid out alike: moved in Python, then the guard built)
    np.testing.assert_array_equal(moved["dst"], want)
    assert built == [1] and p._replay_for(moved)._guard is not None
    again = new_arrays()
    want = _want(p, again)
    monkeypatch.setattr(replay_module.Replay, "moves", lambda self, a: pytest.fail("a Python move"))
    p.execute(again)
    np.testing.assert_array_equal(again["dst"], want)
    assert built == [1]


def test_a_user_scratchpad_has_no_guard():
    """A call on a user scratchpad keeps testing its claim in Python (Primitive._claim)."""
    from tests.test_replay import _matmul_case
    from tests.test_replay_sequences import _user

    p, args = _user(_matmul_case(2, True, 1, user=True))
    p.execute(args)
    p.execute(args)
    replay = p._replay_for(args)
    assert replay is not None and replay.valid is not None and replay._guard is None


def test_dump_asm_lists_the_guard_kernel():
    import io

    from tools.dump_asm import run

    out = io.StringIO()
    assert run(["guard"], out) == 0
    text = out.getvalue()
    assert "guard [avx2]" in text and "mov [r8],r9" in text and "movsxd" in text


def _moved_copy(args, rng):
    """New source and dst arrays (the source's values random), equal copies of the rest."""
    new = {}
    for k, v in args.items():
        if isinstance(v, Memory):
            new[k] = v
        else:
            new[k] = np.empty_like(v)
            new[k][...] = rng.integers(0, 256, v.shape) if k == "src" else 0 if k == "dst" else v
    return new


def test_a_set_up_after_a_guarded_move_points_every_read_again():
    """State a set-up keeps to skip re-pointing (a convolution's source rows, the packer's
    B) is left behind by a guard's move: a set-up with the first call's arrays after it
    points them again. (A convolution whose rows are copied from the source: its bias
    changed, so the call sets up again; a Gemm whose B comes at every call: its ao
    changed.)"""
    if not layout_ok():
        pytest.skip("no guards in this process")
    from primitives.gemm import Gemm
    from tests.test_replay import _conv

    rng = np.random.default_rng(6)
    p, first = _conv(ic=16, pad=1, threads=1)
    p.execute(first)
    p.execute(first)  # (replayed: its guard built)
    replay = p._replay_for(first)
    second = _moved_copy(first, rng)
    p.execute(second)  # (moved by the guard)
    assert replay._guard is not None and p._replay_for(second) is replay
    again = dict(first, bias=first["bias"] + np.float32(3))  # (by value: the full path, on first's arrays)
    want = _want(p, again)
    p.execute(again)
    np.testing.assert_array_equal(again["dst"], want)

    M, N, K = 8, 48, 64
    g = Gemm(M, N, K, threads=1)
    calls = [(rng.integers(0, 256, (M, K)).astype(np.uint8), rng.integers(-128, 128, (K, N)).astype(np.int8),
              np.zeros((M, N), np.int32)) for _ in range(2)]
    for A, B, C in calls[:1] + calls:  # (the first again: its guard built; then moved by it)
        g.execute(A, C, B=B)
    assert g._replay[1]._guard is not None
    A, B, C = calls[0]
    g.execute(A, C, B=B, ao=3)  # (another ao: the full path, on the first call's arrays)
    np.testing.assert_array_equal(C, (A.astype(np.int32) - 3) @ B.astype(np.int32))


@pytest.mark.parametrize("case", ["matmul, weights packed per call", "batched matmul, weights packed per call"])
def test_a_set_up_after_a_guarded_move_packs_the_first_weights_again(case):
    """The same for a matmul whose runtime weights are packed at every call (the packer's
    B; its replays forgotten, so the next call sets up on the first call's arrays)."""
    if not layout_ok():
        pytest.skip("no guards in this process")
    from tests.test_replay import _MOVE_CASES

    p, first = _MOVE_CASES[case][0](1)
    p.execute(first)
    p.execute(first)  # (replayed: its guard built)
    replay = p._replay_for(first)
    rng = np.random.default_rng(7)
    second = _moved_copy(first, rng)
    second["weights"][...] = rng.integers(-128, 128, first["weights"].shape)  # (runtime weights: not by value)
    want = _want(p, second)
    p.execute(second)  # (moved by the guard)
    np.testing.assert_array_equal(second["dst"], want)
    assert replay._guard is not None and p._replay_for(second) is replay
    want = _want(p, first)
    p._forget_replays()
    p.execute(first)
    np.testing.assert_array_equal(first["dst"], want)
