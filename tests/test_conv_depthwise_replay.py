"""Repeated depthwise executions: the replay of the last call (DepthwiseConv.execute's
first route) must give what the full path gives, and must not be taken when anything it
set up from changed (arrays, their shapes, dtypes or writability, the values of scales,
zero points, bias and plain weights, a re-packed weights Memory, the verbose setting)."""
from __future__ import annotations

import numpy as np
import pytest

from primitives.attr import Attr, PostOps
from primitives.conv_depthwise import DepthwiseConvDesc
from primitives.conv_ref import depthwise_ref
from primitives.memory import Memory, desc
from primitives.reorder import reorder_desc
from tests.conftest import assert_same_bits, check_dst_changed_in_place, in_threads, set_in_place


def _layer(c=37, hw=9, stride=1, threads=1, packed=True, binary=False, zp=0, isa=None, user=False):
    """A MobileNet-like layer (u8 src, per-channel scales, bias, relu, dst scale) and its args."""
    rng = np.random.default_rng(c * 7 + hw + stride)
    po = PostOps().eltwise("relu")
    oh = (hw + 2 - 3) // stride + 1
    n = 2
    if binary:
        po = po.binary("add", desc((n, 1, oh, oh), "f32", "abcd"))
    zps = {"src": 0} if zp else {}
    attr = Attr(scales={"src": 0, "weights": 1, "dst": 0}, zero_points=zps,
                scratchpad_mode="user" if user else "library").set_post_ops(po)
    pd = DepthwiseConvDesc(desc((n, c, hw, hw), "u8", "nhwc"), desc((c, 1, 1, 3, 3), "s8", "any" if packed else
                                                                   "goihw"),
                           desc((n, c, oh, oh), "u8", "nhwc"), desc((c,), "f32", "a"), strides=(stride, stride),
                           padding_l=(1, 1), padding_r=(1, 1), attr=attr, isa=isa, threads=threads)
    w = rng.integers(-128, 128, (c, 1, 1, 3, 3)).astype(np.int8)
    if packed:
        wmem = Memory(pd.weights_desc())
        reorder_desc(desc(w.shape, "s8", "goihw"), pd.weights_desc()).create().execute({"src": w, "dst": wmem})
    else:
        wmem = w
    args = {"src": rng.integers(0, 256, (n, hw, hw, c)).astype(np.uint8), "weights": wmem,
            "bias": rng.normal(0, 30, c).astype(np.float32), "dst": np.zeros((n, oh, oh, c), np.uint8),
            "scales:src": np.float32([0.5]), "scales:weights": rng.uniform(0.001, 0.02, c).astype(np.float32),
            "scales:dst": np.float32([0.75])}
    if binary:
        args["post_op:1:src_1"] = rng.normal(0, 5, (n, 1, oh, oh)).astype(np.float32)
    if zp:
        args["zero_points:src"] = np.int32([zp])
    if user:
        args["scratchpad"] = np.zeros(pd.scratchpad_desc().nbytes, np.uint8)
    return pd.create(), args, w


def _model(args, w, stride=1):
    ss, ws, ds = args["scales:src"][0], args["scales:weights"], args["scales:dst"][0]
    zp = int(args["zero_points:src"][0]) if "zero_points:src" in args else 0
    post = [("eltwise", "relu", 0.0, 0.0)]
    if "post_op:1:src_1" in args:
        post.append(("binary", "add", args["post_op:1:src_1"].reshape(-1, 1)))
    return depthwise_ref(args["src"], w, zp_src=zp, strides=(stride, stride), padding_l=(1, 1), padding_r=(1, 1),
                         dst_dt="u8", scale=np.float32(ss) * ws, bias=args["bias"], post_ops=post, dst_scale=ds)


def _fresh(p, args) -> np.ndarray:
    """The full path's result, on copies of every argument (the argument set's replay
    forgotten first: it could move to the copies, Replay.moves)."""
    copy = {k: (v if isinstance(v, Memory) else v.copy()) for k, v in args.items()}
    p._set_local(copy).replay = None
    p.execute(copy)
    return copy["dst"]


def _refuse_setup(p, m):
    def refuse(*_a, **_k):
        raise AssertionError("the full path ran: the replay was not taken")
    m.setattr(p, "_run", refuse)


@pytest.mark.parametrize("threads,packed,binary,zp,stride", [(1, True, False, 0, 1), (2, True, True, 0, 2),
                                                             (1, False, False, 9, 1), (2, False, True, 300, 1)])
def test_replay_follows_in_place_changes(threads, packed, binary, zp, stride, monkeypatch):
    from primitives import conv_depthwise, primitive_cache

    with monkeypatch.context() as m:  # small layers take one thread: split this one anyway
        m.setattr(conv_depthwise, "_MIN_MACS_PER_THREAD", 1)
        primitive_cache.clear()
        p, args, w = _layer(threads=threads, packed=packed, binary=binary, zp=zp, stride=stride)
        primitive_cache.clear()
    assert len(p._chunks) == threads
    p.execute(args)
    np.testing.assert_array_equal(args["dst"], _model(args, w, stride))
    assert p._set_local(args).replay is not None
    rng = np.random.default_rng(5)
    args["src"][...] = rng.integers(0, 256, args["src"].shape)
    if binary:
        args["post_op:1:src_1"][...] = rng.normal(0, 5, args["post_op:1:src_1"].shape)
    first = args["dst"].copy()
    with monkeypatch.context() as m:
        _refuse_setup(p, m)
        p.execute(args)  # new source values, same arrays: the replay, nothing else
        p.execute(dict(args))  # another dict holding the same objects: the replay too
    assert not np.array_equal(args["dst"], first)
    np.testing.assert_array_equal(args["dst"], _model(args, w, stride))
    np.testing.assert_array_equal(args["dst"], _fresh(p, args))
    # Values the set-up read changed in place: set up again, and the new values count.
    changes = [("bias", 40.0), ("scales:weights", 0.5), ("scales:dst", 0.5), ("scales:src", 0.25)]
    if zp:
        changes.append(("zero_points:src", 7))
    for name, change in changes:
        p.execute(args)
        before = args["dst"].copy()
        args[name] += (args[name] * change).astype(args[name].dtype) if name.startswith("scales") else change
        p.execute(args)
        np.testing.assert_array_equal(args["dst"], _model(args, w, stride), err_msg=name)
        assert not np.array_equal(args["dst"], before), name
    if not packed:  # plain weights are packed from their bytes: changed in place, packed again
        p.execute(args)
        args["weights"][:5] = -args["weights"][:5] // 2
        p.execute(args)
        np.testing.assert_array_equal(args["dst"], _model(args, args["weights"], stride))


@pytest.mark.parametrize("threads,packed,binary", [(1, True, False), (2, True, True), (1, False, True),
                                                   (2, False, False)])
def test_new_arrays_move_the_replay(threads, packed, binary, monkeypatch):
    """New arrays of the same layouts at every call (a new source and dst, equal copies of
    the rest, plain weights included): the replay is pointed at them, with no set-up;
    every result is the model's, and the last call's dst is left alone."""
    from primitives import conv_depthwise, primitive_cache

    with monkeypatch.context() as m:
        m.setattr(conv_depthwise, "_MIN_MACS_PER_THREAD", 1)
        primitive_cache.clear()
        p, args, w = _layer(threads=threads, packed=packed, binary=binary)
        primitive_cache.clear()
    p.execute(args)
    rng = np.random.default_rng(8)
    last = args
    for _ in range(3):
        new = {k: v if isinstance(v, Memory) else v.copy() for k, v in args.items()}
        new["src"] = rng.integers(0, 256, args["src"].shape).astype(np.uint8)
        new["dst"] = np.zeros_like(args["dst"])
        if binary:
            new["post_op:1:src_1"] = rng.normal(0, 5, args["post_op:1:src_1"].shape).astype(np.float32)
        before = last["dst"].copy()
        with monkeypatch.context() as m:
            _refuse_setup(p, m)
            p.execute(new)
        np.testing.assert_array_equal(new["dst"], _model(new, w))
        np.testing.assert_array_equal(last["dst"], before)
        last = new
    p.execute(dict(last, **{"scales:dst": np.float32([0.5])}))  # other values: the full path
    np.testing.assert_array_equal(last["dst"], _model(dict(last, **{"scales:dst": np.float32([0.5])}), w))


def test_user_scratchpad_shared_by_layers_replays(monkeypatch):
    """Depthwise layers of two shapes sharing one user scratchpad (the per-channel vectors
    go there), called in turn: each replays, writing its vectors back first, on the same
    arrays and on new ones; every result is the model's."""
    made = [_layer(c=37, user=True), _layer(c=24, hw=11, stride=2, zp=9, user=True)]
    shared = np.zeros(max(p.pd.scratchpad_desc().nbytes for p, _, _ in made), np.uint8)
    for p, args, w in made:
        args["scratchpad"] = shared[:p.pd.scratchpad_desc().nbytes]
        p.execute(args)
    rng = np.random.default_rng(4)
    for round_ in range(4):
        for (p, args, w), stride in zip(made, (1, 2)):
            call = args if round_ % 2 == 0 else dict(args, src=rng.integers(0, 256, args["src"].shape).astype(np.uint8),
                                                     dst=np.zeros_like(args["dst"]))
            with monkeypatch.context() as m:
                _refuse_setup(p, m)
                p.execute(call)
            np.testing.assert_array_equal(call["dst"], _model(call, w, stride), err_msg=f"round {round_}")
    with pytest.raises(ValueError, match="^scratchpad: buffer of 8 bytes"):
        made[0][0].execute(dict(made[0][1], scratchpad=np.zeros(8, np.uint8)))


def test_replay_not_taken_when_arrays_change():
    p, args, w = _layer()
    p.execute(args)
    # Another dst array of the same shape: the full path, and its own result.
    other = dict(args, dst=np.zeros_like(args["dst"]))
    p.execute(other)
    np.testing.assert_array_equal(other["dst"], args["dst"])
    p.execute(args)  # back to the first dst: it is written again
    args["dst"][...] = 0
    p.execute(args)
    np.testing.assert_array_equal(args["dst"], other["dst"])
    # A dst (or src) reshaped, retyped or made read-only in place is checked again, and refused.
    check_dst_changed_in_place(lambda: p.execute(args), args["dst"])
    c = args["dst"].shape[-1]
    set_in_place(args["src"], "dtype", np.int8)
    with pytest.raises(TypeError, match="src"):
        p.execute(args)
    set_in_place(args["src"], "dtype", np.uint8)
    p.execute(args)
    set_in_place(args["bias"], "shape", (1, c))
    with pytest.raises(ValueError, match="bias"):
        p.execute(args)
    set_in_place(args["bias"], "shape", (c,))
    # A missing or extra argument: named, as on the first call.
    p.execute(args)
    with pytest.raises(ValueError, match="bias"):
        p.execute({k: v for k, v in args.items() if k != "bias"})
    p.execute(args)
    with pytest.raises(ValueError, match="unexpected"):
        p.execute(dict(args, extra=args["bias"]))
    # Weights re-packed into the same Memory by another reorder: the new weights count.
    p.execute(args)
    before = args["dst"].copy()
    wmem = args["weights"]
    ones = np.ones(w.shape, np.int8)
    reorder_desc(desc(w.shape, "s8", "goihw"), wmem.desc).create().execute({"src": ones, "dst": wmem})
    p.execute(args)
    assert not np.array_equal(args["dst"], before)
    np.testing.assert_array_equal(args["dst"], _model(args, ones))
    # src and dst overlapping is refused before the replay could start.
    p.execute(args)
    bad = dict(args, dst=args["src"][:, : args["dst"].shape[1], : args["dst"].shape[2]])
    with pytest.raises(ValueError):
        p.execute(bad)


def test_replay_prints_verbose_lines_when_asked(monkeypatch, capsys):
    p, args, _ = _layer()
    p.execute(args)
    p.execute(args)
    assert "int8jit_verbose" not in capsys.readouterr().err
    monkeypatch.setenv("INT8JIT_VERBOSE", "exec")
    p.execute(args)
    assert "int8jit_verbose,exec" in capsys.readouterr().err
    monkeypatch.delenv("INT8JIT_VERBOSE")
    p.execute(args)
    p.execute(args)
    assert "int8jit_verbose" not in capsys.readouterr().err


def test_replay_per_thread():
    """Two threads calling one primitive with their own arrays: each its own replay and structs."""

    p, args, w = _layer(c=48, hw=12)
    other = {k: (v if isinstance(v, Memory) else v.copy()) for k, v in args.items()}
    other["src"][...] = 255 - other["src"]

    def work(a):
        for _ in range(50):
            a["dst"][...] = 0
            p.execute(a)
            np.testing.assert_array_equal(a["dst"], _model(a, w))

    errors = in_threads(work, [(args,), (other,)])
    assert not errors, errors[0]



@pytest.mark.parametrize("profile", ["resblock_s8", "u8_fused", "float_out", "mobilenet_u8"])
def test_two_chunks_every_profile(isa_path, profile, monkeypatch):
    """Two thread chunks (split forced on a small layer): binary operands (common, per
    channel, per pixel, full), sum, zero points, on every ISA path, equal to the model.
    (The per-pixel and full operands were offset by the chunk's first pixel twice before.)"""
    from tests import test_conv_depthwise as base

    from primitives import conv_depthwise, primitive_cache

    monkeypatch.setattr(conv_depthwise, "_MIN_MACS_PER_THREAD", 1)
    primitive_cache.clear()
    try:
        for n, stride in ((2, (1, 1)), (1, (2, 1))):
            p = dict(base.BASE, profile=profile, N=n, threads=2, C=37, strides=stride)
            dst, want, _ = base.run_case(p, isa_path)
            assert_same_bits(dst, want)
    finally:
        primitive_cache.clear()


def test_layers_of_one_shape_each_replay(monkeypatch):
    """Depthwise layers of one shape share the primitive and call it in turn: each keeps
    its own structs and replay (the kernel call alone), bit for bit."""
    layers = []
    for i in range(3):
        p, args, w = _layer(threads=1, packed=True, binary=False, zp=None, stride=1)
        args["src"] = np.random.default_rng(50 + i).integers(0, 256, args["src"].shape).astype(np.uint8)
        args["dst"] = np.zeros_like(args["dst"])
        layers.append((p, args, w))
    p = layers[0][0]
    assert all(q is p for q, _, _ in layers)
    for _, args, _ in layers:
        p.execute(args)
    with monkeypatch.context() as m:
        m.setattr(p, "_run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("set up again")))
        for _ in range(2):
            for _, args, w in layers:
                args["dst"][...] = 0
                p.execute(args)
                np.testing.assert_array_equal(args["dst"], _model(args, w, 1))


@pytest.mark.parametrize("c,hw,stride,chunks", [(576, 14, 2, 2), (32, 14, 2, 1), (960, 7, 1, 2)])
def test_two_threads_from_two_hundred_thousand_macs(isa_path, c, hw, stride, chunks):
    """A layer takes a second thread from about 200K multiply-adds (MobileNet-v2's
    576@14/2, 254K: 10.4 -> 8-9 us on a Zen 4); a smaller one (32@14/2, 14K) stays on one."""
    from primitives import primitive_cache

    out = (hw + 2 - 3) // stride + 1
    primitive_cache.clear()
    try:
        pd = DepthwiseConvDesc(desc((1, c, hw, hw), "u8", "nhwc"), desc((c, 1, 1, 3, 3), "s8", "any"),
                               desc((1, c, out, out), "u8", "nhwc"), strides=(stride, stride), padding_l=(1, 1),
                               padding_r=(1, 1), isa=isa_path, threads=2)
        assert len(pd.create()._chunks) == chunks
    finally:
        primitive_cache.clear()
