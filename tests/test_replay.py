"""Repeated executions: the replay of the last call (primitives.replay.Replay) must give
what the full path gives, and must not be taken when anything it set up from changed."""
from __future__ import annotations

import numpy as np
import pytest

from primitives.attr import Attr, PostOps, post_op_src1
from primitives.conv import ConvolutionDesc
from primitives.matmul import InnerProductDesc, MatmulDesc
from primitives.memory import Memory, desc
from primitives.reorder import reorder_desc
from tests.conftest import check_dst_changed_in_place


def _conv(ic=3, pad=1, k=3, oc=24, user=False, bias_shift=0.0, threads=None, dst_tag="nhwc", src_tag="nhwc",
          binary=None, isa=None):
    """A small stem-like layer (ic=3: channels padded through the word copy) with the whole
    pipeline (``binary``: an add post-op's operand kind, "col" or "full", after the relu)."""
    rng = np.random.default_rng(ic * 10 + pad)
    po = PostOps().eltwise("relu")
    hw = 9
    out = hw + 2 * pad - k + 1
    if binary:
        # (a full operand channels last, as the kernel reads it: not copied, so replayed)
        po.binary("add", desc((1, oc, 1, 1), "f32", "abcd") if binary == "col" else
                  desc((1, oc, out, out), "f32", "acdb"))
    attr = Attr(scales={"weights": 1, "dst": 0}, zero_points={"src": 0},
                scratchpad_mode="user" if user else "library").set_post_ops(po)
    pd = ConvolutionDesc(desc((1, ic, hw, hw), "u8", src_tag), desc((oc, ic, k, k), "s8", "any"),
                         desc((1, oc, out, out), "u8", dst_tag), desc((oc,), "f32", "a"),
                         padding_l=(pad, pad), attr=attr, threads=threads, isa=isa)
    w = Memory(pd.weights_desc())
    reorder_desc(desc((oc, ic, k, k), "s8", "oihw"), pd.weights_desc()).create().execute(
        {"src": rng.integers(-128, 128, (oc, ic, k, k)).astype(np.int8), "dst": w})
    args = {"src": rng.integers(0, 256, (1, hw, hw, ic) if src_tag == "nhwc" else (1, ic, hw, hw)).astype(np.uint8),
            "weights": w,
            "bias": (rng.normal(0, 50, oc) + bias_shift).astype(np.float32),
            "dst": np.zeros((1, out, out, oc) if dst_tag == "nhwc" else (1, oc, out, out), np.uint8),
            "scales:weights": rng.uniform(0.5, 2, oc).astype(np.float32) / (ic * k * k * 40),
            "scales:dst": np.float32([0.25]), "zero_points:src": np.int32([7])}
    if user:
        args["scratchpad"] = np.zeros(pd.scratchpad_desc().nbytes, np.uint8)
    if binary:
        args["post_op:1:src_1"] = rng.normal(0, 20, (1, oc, 1, 1) if binary == "col" else
                                             (1, out, out, oc)).astype(np.float32)
    return pd.create(), args


def _fresh(p, args) -> np.ndarray:
    """The full path's result, on copies of every argument (this thread's replays
    forgotten first: one could move to the copies, Replay.moves)."""
    copy = {k: (v if isinstance(v, Memory) else v.copy(order="K")) for k, v in args.items()}
    p._forget_replays()
    p.execute(copy)
    return copy["dst"]


def _no_setup(p, monkeypatch):
    def refuse(*_):
        raise AssertionError("_execute ran: the replay was not taken")
    monkeypatch.setattr(p, "_execute", refuse)


@pytest.mark.parametrize("ic,pad", [(3, 1), (2, 1), (6, 1), (8, 0), (16, 2)])
def test_conv_replay_follows_in_place_changes(ic, pad, monkeypatch):
    p, args = _conv(ic, pad)
    p.execute(args)
    first = args["dst"].copy()
    assert p._replay_for(args) is not None
    args["src"][...] = np.random.default_rng(1).integers(0, 256, args["src"].shape)
    with monkeypatch.context() as m:
        _no_setup(p, m)
        p.execute(args)  # new source values, same arrays: the replay
    assert not np.array_equal(args["dst"], first)
    np.testing.assert_array_equal(args["dst"], _fresh(p, args))
    # Values the set-up read (bias, scales, zero points) changed in place: set up again.
    for name, change in (("bias", 40.0), ("scales:weights", 0.25), ("scales:dst", 0.5), ("zero_points:src", 3)):
        p.execute(args)
        before = args["dst"].copy()
        args[name] += (args[name] * change).astype(np.float32) if name.startswith("scales") else change
        p.execute(args)
        np.testing.assert_array_equal(args["dst"], _fresh(p, args), err_msg=name)
        assert not np.array_equal(args["dst"], before), name


def test_replay_not_taken_when_arrays_change(monkeypatch):
    p, args = _conv()
    p.execute(args)
    # Another dst array of the same shape: the full path, and its own result.
    other = dict(args, dst=np.zeros_like(args["dst"]))
    p.execute(other)
    np.testing.assert_array_equal(other["dst"], args["dst"])
    # A dst reshaped or made read-only in place is checked again, and refused.
    p.execute(args)
    check_dst_changed_in_place(lambda: p.execute(args), args["dst"])
    # Weights re-packed into the same Memory by another reorder: the new weights count.
    p.execute(args)
    before = args["dst"].copy()
    w = args["weights"]
    reorder_desc(desc(w.desc.dims, "s8", "oihw"), w.desc).create().execute(
        {"src": np.ones(w.desc.dims, np.int8), "dst": w})
    p.execute(args)
    assert not np.array_equal(args["dst"], before)
    np.testing.assert_array_equal(args["dst"], _fresh(p, args))


def test_shared_user_scratchpad():
    """Two layers sharing one user scratchpad (as a network does) must not see each
    other's per-column values or padded borders: nothing is kept in it between calls."""
    p1, a1 = _conv(user=True)
    p2, a2 = _conv(user=True, bias_shift=500.0)
    a2["zero_points:src"] = np.int32([200])
    expect1, expect2 = _fresh(p1, dict(a1, scratchpad=a1["scratchpad"].copy())), None
    shared = np.zeros(max(p1.pd.scratchpad_desc().nbytes, p2.pd.scratchpad_desc().nbytes), np.uint8)
    a1["scratchpad"] = a2["scratchpad"] = shared
    p2.execute(a2)
    expect2 = a2["dst"].copy()
    for _ in range(2):
        p1.execute(a1)
        np.testing.assert_array_equal(a1["dst"], expect1)
        p2.execute(a2)
        np.testing.assert_array_equal(a2["dst"], expect2)


@pytest.mark.parametrize("k", [2, 64])
def test_inner_product_replay(k, monkeypatch):
    rng = np.random.default_rng(k)
    m, n = 5, 40
    attr = Attr(scales={"src": 0, "weights": 1, "dst": 0}).set_post_ops(PostOps().eltwise("relu"))
    pd = InnerProductDesc(desc((m, k), "u8", "ab"), desc((n, k), "s8", "any"), desc((m, n), "s8", "ab"),
                          desc((n,), "f32", "a"), attr=attr)
    p = pd.create()
    w = Memory(pd.weights_desc())
    reorder_desc(desc((n, k), "s8", "ab"), pd.weights_desc()).create().execute(
        {"src": rng.integers(-128, 128, (n, k)).astype(np.int8), "dst": w})
    args = {"src": rng.integers(0, 256, (m, k)).astype(np.uint8), "weights": w,
            "bias": rng.normal(0, 20, n).astype(np.float32), "dst": np.zeros((m, n), np.int8),
            "scales:src": np.float32([0.5]), "scales:weights": rng.uniform(0.5, 2, n).astype(np.float32) / (k * 30),
            "scales:dst": np.float32([0.5])}
    p.execute(args)
    args["src"][...] = rng.integers(0, 256, (m, k))
    with monkeypatch.context() as mp:
        _no_setup(p, mp)
        p.execute(args)
    np.testing.assert_array_equal(args["dst"], _fresh(p, args))
    args["bias"] += np.float32(30)
    p.execute(args)
    np.testing.assert_array_equal(args["dst"], _fresh(p, args))


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("src_tag,w_tag", [("nhwc", "oihw"), ("nchw", "ohwi")])
def test_inner_product_runtime_weights_copied_are_read_at_every_call(src_tag, w_tag, batch):
    """Plain weights in another order than the source's are copied into it at each call
    (the K x N view cannot be a view). Repeating the call must copy them again: the
    weights changed in place, new weights arrays (one past the first's buffer, where
    moving by the first call's offset would read unmapped memory), and a bound call."""
    rng = np.random.default_rng(batch)
    n, c, h, w_, oc = batch, 8, 3, 3, 24
    pd = InnerProductDesc(desc((n, c, h, w_), "u8", src_tag), desc((oc, c, h, w_), "s8", w_tag),
                          desc((n, oc), "s32", "ab"))
    p = pd.create()
    x = rng.integers(0, 256, (n, c, h, w_)).astype(np.uint8)
    x_user = np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if src_tag == "nhwc" else x
    order = (0, 2, 3, 1) if w_tag == "ohwi" else (0, 1, 2, 3)
    far = np.zeros(1 << 26, np.int8)  # (the first weights 64 MB away from the copies)
    weights = far[-oc * c * h * w_:].reshape(np.transpose(np.zeros((oc, c, h, w_)), order).shape)
    y = np.zeros((n, oc), np.int32)

    def check(w_logical):
        want = x.reshape(n, -1).astype(np.int64) @ w_logical.reshape(oc, -1).T.astype(np.int64)
        np.testing.assert_array_equal(y, want)

    def logical(w_user):
        return w_user if w_tag == "oihw" else w_user.transpose(0, 3, 1, 2)

    args = {"src": x_user, "weights": weights, "dst": y}
    for _ in range(3):  # (the same arrays, new values in the weights)
        weights[...] = rng.integers(-128, 128, weights.shape)
        p.execute(args)
        check(logical(weights))
    for _ in range(3):  # (new weights arrays)
        new = rng.integers(-128, 128, weights.shape).astype(np.int8)
        p.execute({"src": x_user, "weights": new, "dst": y})
        check(logical(new))
    run = p.bind(args)
    weights[...] = rng.integers(-128, 128, weights.shape)
    run()
    check(logical(weights))


@pytest.mark.parametrize("tag", ["nhwc", "nchw"])
def test_pooling_replay(tag, monkeypatch):
    from primitives.pooling import PoolingDesc
    from primitives.pooling_ref import pooling_ref

    rng = np.random.default_rng(3)
    pd = PoolingDesc("avg_exclude_padding", desc((2, 5, 7, 6), "u8", tag), desc((2, 5, 4, 3), "u8", tag), 2, 3, 1, 1)
    p = pd.create()
    x = np.ascontiguousarray(rng.integers(0, 256, (2, 5, 7, 6)).astype(np.uint8).transpose(
        (0, 2, 3, 1) if tag == "nhwc" else (0, 1, 2, 3)))
    y = np.zeros((2, 4, 3, 5) if tag == "nhwc" else (2, 5, 4, 3), np.uint8)
    args = {"src": x, "dst": y}
    p.execute(args)
    x[...] = rng.integers(0, 256, x.shape)
    with monkeypatch.context() as m:
        _no_setup(p, m)
        p.execute(args)
    logical = np.moveaxis(x, -1, 1) if tag == "nhwc" else x
    expect = pooling_ref(np.moveaxis(logical, 1, -1), "avg_exclude_padding", (3, 3), (2, 2), (1, 1), (1, 1))
    np.testing.assert_array_equal(np.moveaxis(y, -1, 1) if tag == "nhwc" else y, np.moveaxis(expect, -1, 1))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("tag", ["nhwc", "nchw"])
def test_pooling_moves_to_new_arrays(tag, threads, monkeypatch):
    """New source and dst arrays at every call: the replay is pointed at them (channels
    last, or NCHW read as one channel per image) or set up again (NCHW transposed); every
    result is the model's, the last call's dst left alone."""
    from primitives import pooling, primitive_cache
    from primitives.pooling import PoolingDesc
    from primitives.pooling_ref import pooling_ref

    with monkeypatch.context() as m:  # a small pooling takes one thread: split this one anyway
        m.setattr(pooling, "_MIN_BYTES_PER_THREAD", 1)
        primitive_cache.clear()
        p = PoolingDesc("pooling_max", desc((2, 5, 7, 6), "u8", tag), desc((2, 5, 4, 3), "u8", tag), 2, 3, 1, 1,
                        threads=threads).create()
        primitive_cache.clear()
    assert len(p._chunks) == threads
    rng = np.random.default_rng(4)
    shape_x, shape_y = ((2, 7, 6, 5), (2, 4, 3, 5)) if tag == "nhwc" else ((2, 5, 7, 6), (2, 5, 4, 3))
    last = None
    for i in range(3):
        x = rng.integers(0, 256, shape_x).astype(np.uint8)
        y = np.zeros(shape_y, np.uint8)
        before = None if last is None else last.copy()
        with monkeypatch.context() as m:
            if i and p._route != "nchw_transpose":
                _no_setup(p, m)
            p.execute({"src": x, "dst": y})
        logical = np.moveaxis(x, -1, 1) if tag == "nhwc" else x
        expect = np.moveaxis(pooling_ref(np.moveaxis(logical, 1, -1), "max", (3, 3), (2, 2), (1, 1), (1, 1)), -1, 1)
        np.testing.assert_array_equal(np.moveaxis(y, -1, 1) if tag == "nhwc" else y, expect)
        if last is not None:
            np.testing.assert_array_equal(last, before)
        last = y


def test_thread_count_is_part_of_the_primitive_identity():
    """Two descriptors that differ only in their thread count are two primitives (each
    splits its work for its own count): the primitive cache must not hand one the other's."""
    mds = (desc((1, 8, 6, 6), "u8", "nhwc"), desc((8, 8, 3, 3), "s8", "any"), desc((1, 8, 4, 4), "s32", "nhwc"))
    one, two = ConvolutionDesc(*mds, threads=1), ConvolutionDesc(*mds, threads=2)
    assert one.create() is not two.create()
    assert one.create() is ConvolutionDesc(*mds, threads=1).create()


def _layers_of_one_shape(count, user=False):
    """``count`` layers of one shape (so one primitive, from the primitive cache), each
    with its own weights, bias, scales, zero point, source and dst."""
    layers = []
    for i in range(count):
        p, args = _conv(user=user, bias_shift=10.0 * i)
        rng = np.random.default_rng(100 + i)
        w = Memory(args["weights"].desc)
        reorder_desc(desc((24, 3, 3, 3), "s8", "oihw"), args["weights"].desc).create().execute(
            {"src": rng.integers(-128, 128, (24, 3, 3, 3)).astype(np.int8), "dst": w})
        args.update(weights=w, src=rng.integers(0, 256, args["src"].shape).astype(np.uint8),
                    dst=np.zeros_like(args["dst"]), **{"zero_points:src": np.int32([i + 3])})
        args["scales:weights"] = args["scales:weights"] * np.float32(1 + i / 4)
        layers.append((p, args))
    assert all(p is layers[0][0] for p, _ in layers)  # identical descriptors: one primitive
    return layers


@pytest.mark.parametrize("user", [False, True])
def test_layers_of_one_shape_each_replay(user, monkeypatch):
    """A network's layers of one shape share the primitive and call it in turn: each
    keeps its own set-up (and library scratchpad) and replays, bit for bit. ``user``: the
    layers share one user scratchpad, where a layer's set-up undoes another's (per-column
    values, the padded source's zero point), so each replay writes its own back before
    its kernels run (primitives.replay.restoring)."""
    layers = _layers_of_one_shape(3, user=user)
    p = layers[0][0]
    want = [_fresh(p, args) for _, args in layers]  # (copies with the same weights: their slots)
    for _, args in layers:
        if user:
            args["scratchpad"] = layers[0][1]["scratchpad"]
        p.execute(args)
    assert all(p._replay_for(args) is not None for _, args in layers)
    with monkeypatch.context() as m:
        _no_setup(p, m)
        for _ in range(2):
            for (_, args), expect in zip(layers, want):
                args["dst"][...] = 0
                p.execute(args)
                np.testing.assert_array_equal(args["dst"], expect)


def test_more_layers_than_slots_stay_exact(monkeypatch):
    """More argument sets than a thread keeps: the oldest are set up again, and every
    result stays what the full path gives."""
    from primitives import base, primitive_cache

    monkeypatch.setattr(base, "_SLOTS", 4)
    primitive_cache.clear()  # a primitive of its own, no slots from other tests
    layers = _layers_of_one_shape(base._SLOTS + 2)
    p = layers[0][0]
    for _ in range(2):
        for _, args in layers:
            p.execute(args)
            np.testing.assert_array_equal(args["dst"], _fresh(p, args))
    assert len(p._local.slots) == base._SLOTS  # (_fresh's copies share their layer's weights: its slot)


@pytest.mark.parametrize("threads", [1, 2])
def test_user_scratchpad_shared_by_primitives_each_replay(threads, monkeypatch):
    """Primitives of different shapes and kinds sharing one user scratchpad, called in
    turn, each on new arrays at every other call: each replays (moved, where the arrays
    are new), writing back what its set-up left there; every result stays exact."""
    from primitives import primitive_cache

    primitive_cache.clear()
    made = [_conv(ic=16, pad=1, user=True, threads=threads), _conv(ic=8, pad=2, k=5, user=True, threads=threads),
            _matmul_case(7, False, threads, user=True), _matmul_case(9, True, threads, user=True),
            _conv(ic=16, pad=0, k=1, user=True, threads=threads)]
    made[1][1]["zero_points:src"] = np.int32([200])  # (another zero point in the padded borders)
    want = []
    for p, args in made:
        args["scratchpad"] = np.zeros(p.pd.scratchpad_desc().nbytes, np.uint8)
        want.append(_fresh(p, args))
    shared = np.zeros(max(p.pd.scratchpad_desc().nbytes for p, _ in made), np.uint8)
    for p, args in made:
        args["scratchpad"] = shared[:p.pd.scratchpad_desc().nbytes]
        p.execute(args)
    for round_ in range(3):
        for (p, args), expect in zip(made, want):
            call = args if round_ % 2 == 0 else dict(args, src=args["src"].copy(), dst=np.zeros_like(args["dst"]))
            call["dst"][...] = 0
            with monkeypatch.context() as m:
                _no_setup(p, m)
                p.execute(call)
            np.testing.assert_array_equal(call["dst"], expect, err_msg=f"{p.pd.kind} round {round_}")
    primitive_cache.clear()


def test_bound_call_runs_the_kernels_on_the_current_values(monkeypatch):
    """bind(): checked and set up once; the call then runs on whatever the arrays hold
    (no set-up, no checks), bit for bit what execute gives."""
    p, args = _conv()
    run = p.bind(args)
    np.testing.assert_array_equal(args["dst"], _fresh(p, args))  # bind executed once
    with monkeypatch.context() as m:
        _no_setup(p, m)
        for seed in (1, 2):
            args["src"][...] = np.random.default_rng(seed).integers(0, 256, args["src"].shape)
            run()
            got = args["dst"].copy()
            m.undo()
            np.testing.assert_array_equal(got, _fresh(p, args))
            _no_setup(p, m)


@pytest.mark.parametrize("isa", ["avx2", "avx512_core_vnni"])
@pytest.mark.parametrize("kind", ["matmul", "conv"])
def test_bound_call_follows_weights_reordered_into_its_packed_memory(kind, isa):
    """New weights reordered into the bound packed memory bring a new compensation (an s8
    source) and, without VNNI, maybe another kernel (the widening one for full-range
    weights): the bound call sets up again for them (it had mixed them with the old)."""
    from runtime.isa import cpu_supports

    if not cpu_supports(isa):
        pytest.skip(f"CPU lacks {isa}")
    rng = np.random.default_rng(3)
    if kind == "matmul":
        w_dims, w_tag = (64, 32), "ab"
        pd = MatmulDesc(desc((8, 64), "s8", "ab"), desc(w_dims, "s8", "any"), desc((8, 32), "s32", "ab"), isa=isa)
        x = rng.integers(-128, 128, (8, 64)).astype(np.int8)
        y = np.zeros((8, 32), np.int32)

        def want(w):
            return x.astype(np.int64) @ w.astype(np.int64)
    else:
        w_dims, w_tag = (16, 16, 1, 1), "oihw"
        pd = ConvolutionDesc(desc((1, 16, 6, 6), "s8", "nhwc"), desc(w_dims, "s8", "any"),
                             desc((1, 16, 6, 6), "s32", "nhwc"), isa=isa)
        x = rng.integers(-128, 128, (1, 6, 6, 16)).astype(np.int8)
        y = np.zeros((1, 6, 6, 16), np.int32)

        def want(w):
            return np.einsum("nhwc,oc->nhwo", x.astype(np.int64), w[:, :, 0, 0].astype(np.int64))
    packed = Memory(pd.weights_desc())
    reorder = reorder_desc(desc(w_dims, "s8", w_tag), pd.weights_desc()).create()
    w = rng.integers(-20, 21, w_dims).astype(np.int8)
    reorder.execute({"src": w, "dst": packed})
    run = pd.create().bind({"src": x, "weights": packed, "dst": y})
    for low, high in [(-128, 128), (-20, 21), (-128, 128)]:
        w = rng.integers(low, high, w_dims).astype(np.int8)
        reorder.execute({"src": w, "dst": packed})
        for _ in range(2):
            y[...] = 0
            run()
            np.testing.assert_array_equal(y, want(w))
        x[...] = rng.integers(-128, 128, x.shape)
        run()
        np.testing.assert_array_equal(y, want(w))


def test_bound_call_keeps_its_scales_and_scratchpad():
    """A bound call reads the scales and bias as they were at bind time (bind again after
    changing them), and other executions of the same primitive, same shape, other values,
    even with the same weights and dst, do not disturb its set-up."""
    layers = _layers_of_one_shape(2)
    p, args = layers[0]
    run = p.bind(args)
    want = args["dst"].copy()
    other = dict(layers[1][1], weights=args["weights"], dst=args["dst"])  # same slot key as args
    p.execute(other)
    run()
    np.testing.assert_array_equal(args["dst"], want)
    args["bias"] += 40.0  # in place: not seen by the bound call
    run()
    np.testing.assert_array_equal(args["dst"], want)
    p.bind(args)()  # bound again: seen
    np.testing.assert_array_equal(args["dst"], _fresh(p, args))
    assert not np.array_equal(args["dst"], want)


def test_bind_without_a_replay_is_execute():
    """A user scratchpad (which other argument sets may set up in) binds to execute itself."""
    p, args = _conv(user=True)
    run = p.bind(args)
    assert run.func == p.execute
    args["src"][...] = 5
    run()
    np.testing.assert_array_equal(args["dst"], _fresh(p, args))
    with pytest.raises(TypeError, match="args"):
        p.bind([("src", args["src"])])


def test_bound_inner_product_and_pooling():
    """bind() on the other replaying primitives: an inner product with the whole pipeline
    and a pooling."""
    from primitives.pooling import PoolingDesc

    rng = np.random.default_rng(3)
    attr = Attr(scales={"src": 0, "weights": 1, "dst": 0}).set_post_ops(PostOps().eltwise("relu"))
    pd = InnerProductDesc(desc((5, 40), "u8", "ab"), desc((24, 40), "s8", "any"), desc((5, 24), "u8", "ab"),
                          desc((24,), "f32", "a"), attr=attr)
    w = Memory(pd.weights_desc())
    reorder_desc(desc((24, 40), "s8", "ab"), pd.weights_desc()).create().execute(
        {"src": rng.integers(-128, 128, (24, 40)).astype(np.int8), "dst": w})
    ip = pd.create()
    args = {"src": rng.integers(0, 256, (5, 40)).astype(np.uint8), "weights": w,
            "bias": rng.normal(0, 50, 24).astype(np.float32), "dst": np.zeros((5, 24), np.uint8),
            "scales:src": np.float32([0.5]), "scales:weights": rng.uniform(0.01, 0.02, 24).astype(np.float32),
            "scales:dst": np.float32([0.5])}
    pool = PoolingDesc("avg_exclude_padding", desc((1, 16, 6, 6), "u8", "nhwc"), desc((1, 16, 3, 3), "u8", "nhwc"),
                       2, 3, 1, 0).create()
    pargs = {"src": rng.integers(0, 256, (1, 6, 6, 16)).astype(np.uint8), "dst": np.zeros((1, 3, 3, 16), np.uint8)}
    for prim, a in ((ip, args), (pool, pargs)):
        run = prim.bind(a)
        assert run.func != prim.execute  # a replay, not execute
        a["src"][...] = rng.integers(0, 256, a["src"].shape)
        run()
        np.testing.assert_array_equal(a["dst"], _fresh(prim, a))


def test_bound_calls_outlive_the_plan_cache():
    """More bound calls than the primitive keeps plans for: the first call's plan has left
    the primitive's plan cache, and its structs still point at live arrays (the table of
    kernel-position offsets among them: freed under it, a SIGSEGV)."""
    import gc

    layers = _layers_of_one_shape(11)
    p = layers[0][0]
    bound = [p.bind(args) for _, args in layers]
    assert len(p._plans) < len(layers)  # the early plans were let go
    gc.collect()
    for run, (_, args) in zip(bound, layers):
        args["src"][...] = 9
        run()
        np.testing.assert_array_equal(args["dst"], _fresh(p, args))


@pytest.mark.parametrize("kind", ["conv", "inner product", "pooling", "depthwise"])
def test_bound_calls_outlive_their_primitive(kind):
    """A bound call whose primitive the caller dropped, after the primitive cache and the
    kernel cache were cleared, still runs its kernels: their code stays mapped (it was
    unmapped under the pooling's call, a SIGSEGV)."""
    import gc

    from jit import cache
    from primitives import primitive_cache
    from primitives.conv_depthwise import DepthwiseConvDesc
    from primitives.pooling import PoolingDesc

    rng = np.random.default_rng(8)
    if kind == "conv":
        p, args = _conv()
    elif kind == "inner product":
        p = InnerProductDesc(desc((3, 8), "u8", "ab"), desc((5, 8), "s8", "ab"), desc((3, 5), "s32", "ab")).create()
        args = {"src": rng.integers(0, 256, (3, 8)).astype(np.uint8),
                "weights": rng.integers(-128, 128, (5, 8)).astype(np.int8), "dst": np.zeros((3, 5), np.int32)}
    elif kind == "pooling":
        p = PoolingDesc("avg_exclude_padding", desc((1, 16, 7, 7), "u8", "nhwc"), desc((1, 16, 1, 1), "u8", "nhwc"),
                        1, 7, 0, 0).create()
        args = {"src": rng.integers(0, 256, (1, 7, 7, 16)).astype(np.uint8), "dst": np.zeros((1, 1, 1, 16), np.uint8)}
    else:
        p = DepthwiseConvDesc(desc((1, 16, 6, 6), "u8", "nhwc"), desc((16, 1, 1, 3, 3), "s8", "goihw"),
                              desc((1, 16, 6, 6), "s32", "nhwc"), padding_l=(1, 1), padding_r=(1, 1)).create()
        args = {"src": rng.integers(0, 256, (1, 6, 6, 16)).astype(np.uint8),
                "weights": rng.integers(-128, 128, (16, 1, 1, 3, 3)).astype(np.int8),
                "dst": np.zeros((1, 6, 6, 16), np.int32)}
    run = p.bind(args)
    first = args["dst"].copy()
    del p
    primitive_cache.clear()
    cache.clear_memory()
    gc.collect()
    args["dst"][...] = 0
    run()
    np.testing.assert_array_equal(args["dst"], first)


def test_new_arrays_on_every_call_are_not_kept():
    """A caller that passes new src and dst arrays on every call (same packed weights)
    takes one slot, and no call's arrays stay alive (test_held_arrays: the last's neither)."""
    import gc
    import weakref

    from primitives import primitive_cache

    primitive_cache.clear()
    p, args = _conv()
    first = weakref.ref(args["dst"])
    for _ in range(5):
        args = dict(args, src=args["src"].copy(), dst=np.zeros_like(args["dst"]))
        p.execute(args)
    last = weakref.ref(args["dst"])
    del args
    gc.collect()
    assert first() is None and last() is None
    assert len(p._local.slots) == 1


def test_dropped_bound_calls_leave_nothing_behind():
    """What the primitive keeps about a bound call's scratchpad goes when the call does:
    binding again and again does not grow it."""
    import gc

    from primitives import primitive_cache

    primitive_cache.clear()
    p, args = _conv()
    q = InnerProductDesc(desc((2, 8), "u8", "ab"), desc((3, 8), "s8", "ab"), desc((2, 3), "s32", "ab")).create()
    qargs = {"src": np.ones((2, 8), np.uint8), "weights": np.ones((3, 8), np.int8), "dst": np.zeros((2, 3), np.int32)}
    for _ in range(20):
        p.bind(args)()
        q.bind(qargs)()
    gc.collect()
    assert len(p._written) <= 2 and len(p._filled) <= 2
    assert len(q._sp_views) <= 2


OPERAND = post_op_src1(0)


def _in_place_cases():
    """(label, primitive, args, (output, other argument) pairs to alias): small layers of
    each kind whose dst could be laid over an input of the same byte size."""
    from primitives.conv_depthwise import DepthwiseConvDesc
    from primitives.matmul import MatmulDesc
    from primitives.pooling import PoolingDesc

    rng = np.random.default_rng(11)
    u8 = lambda *shape: rng.integers(0, 256, shape).astype(np.uint8)  # noqa: E731
    s8 = lambda *shape: rng.integers(-128, 128, shape).astype(np.int8)  # noqa: E731
    q = Attr(scales={"dst": 0})
    cases = []
    # wide enough for several column tiles: in place, a later tile reads an earlier one's output
    conv = ConvolutionDesc(desc((1, 256, 4, 4), "u8", "nhwc"), desc((256, 256, 1, 1), "s8", "oihw"),
                           desc((1, 256, 4, 4), "u8", "nhwc"), attr=q).create()
    cases.append(("conv", conv, {"src": u8(1, 4, 4, 256), "weights": s8(256, 256, 1, 1),
                                 "dst": np.zeros((1, 4, 4, 256), np.uint8), "scales:dst": np.float32([300.0])}))
    mm = MatmulDesc(desc((8, 256), "u8", "ab"), desc((256, 256), "s8", "ab"), desc((8, 256), "u8", "ab"),
                    attr=q).create()
    cases.append(("matmul", mm, {"src": u8(8, 256), "weights": s8(256, 256), "dst": np.zeros((8, 256), np.uint8),
                                 "scales:dst": np.float32([300.0])}))
    binary = Attr().set_post_ops(PostOps().binary("add", desc((8, 64), "f32", "ab")))
    ip = InnerProductDesc(desc((8, 64), "u8", "ab"), desc((64, 64), "s8", "ab"), desc((8, 64), "f32", "ab"),
                          attr=binary).create()
    cases.append(("inner product + binary", ip, {"src": u8(8, 64), "weights": s8(64, 64),
                                                 "dst": np.zeros((8, 64), np.float32), OPERAND: np.ones((8, 64), np.float32)}))
    dw = DepthwiseConvDesc(desc((1, 16, 6, 6), "u8", "nhwc"), desc((16, 1, 1, 3, 3), "s8", "goihw"),
                           desc((1, 16, 6, 6), "u8", "nhwc"), padding_l=(1, 1), padding_r=(1, 1), attr=q).create()
    cases.append(("depthwise", dw, {"src": u8(1, 6, 6, 16), "weights": s8(16, 1, 1, 3, 3),
                                    "dst": np.zeros((1, 6, 6, 16), np.uint8), "scales:dst": np.float32([50.0])}))
    pool = PoolingDesc("max", desc((1, 16, 6, 6), "u8", "nhwc"), desc((1, 16, 6, 6), "u8", "nhwc"), 1, 3, 1, 1).create()
    cases.append(("pooling", pool, {"src": u8(1, 6, 6, 16), "dst": np.zeros((1, 6, 6, 16), np.uint8)}))
    rq = reorder_desc(desc((16, 16), "u8", "ab"), desc((16, 16), "u8", "ba")).create()
    cases.append(("reorder", rq, {"src": u8(16, 16), "dst": np.zeros((16, 16), np.uint8)}))
    return cases


@pytest.mark.parametrize("case", range(6))
def test_in_place_is_refused_before_any_kernel_runs(case):
    """dst laid over an input (or over a binary post-op's operand) raises, naming both,
    before any code writes: in place, a kernel would read what it had just written (the
    1x1 convolution and the matmul gave wrong results silently before this check)."""
    label, prim, args = _in_place_cases()[case]
    other = OPERAND if OPERAND in args else "src"
    shared = args[other] if other == OPERAND else args[other].view(args["dst"].dtype).reshape(args["dst"].shape)
    before = args[other].copy()
    with pytest.raises(ValueError, match=f"^dst: overlaps {other}; .* does not run in place"):
        prim.execute(dict(args, dst=shared))
    np.testing.assert_array_equal(args[other], before)  # nothing ran
    prim.execute(args)  # apart: runs, and the next call takes the checked path again
    with pytest.raises(ValueError, match="^dst: overlaps"):
        prim.bind(dict(args, dst=shared))


def test_user_scratchpad_over_an_argument_is_refused():
    p, args = _conv(user=True)
    pad = args["scratchpad"]
    big = np.zeros(pad.nbytes + args["dst"].nbytes, np.uint8)
    with pytest.raises(ValueError, match="^scratchpad: overlaps dst"):
        p.execute(dict(args, scratchpad=big, dst=big[pad.nbytes - 8:pad.nbytes - 8 + args["dst"].nbytes]
                       .reshape(args["dst"].shape)))


def test_gemm_c_over_a_is_refused():
    from primitives.gemm import Gemm

    buf = np.zeros((8, 32), np.int32)
    A = buf.view(np.uint8)[:, :64]  # 8 x 64 u8, inside C's rows
    g = Gemm(8, 32, 64, B=np.ones((64, 32), np.int8), lda=128)
    with pytest.raises(ValueError, match="^C: overlaps A; gemm does not run in place"):
        g.execute(A, buf)


def test_last_replay_first_then_the_slots(monkeypatch):
    """execute() tries this thread's last replay before it looks up the argument set's
    slot: a set that shares the slot (the same packed weights) and replaced its replay,
    a set taken through the slot, and a bound call (whose replay is its own) each leave
    the last one what the next call may run, bit for bit."""
    p, a = _conv()
    b = dict(a, src=np.random.default_rng(3).integers(0, 256, a["src"].shape).astype(np.uint8),
             dst=np.zeros_like(a["dst"]))
    p.execute(a)
    assert p._local.last is p._replay_for(a)
    want_a = _fresh(p, a)  # (a full path: the last replay is now the copy's)
    p.execute(b)  # the same slot: b's replay takes its place
    assert p._local.last is p._replay_for(b) is not None and p._replay_for(a) is p._replay_for(b)
    want_b = _fresh(p, b)
    for _ in range(2):
        for args, want in ((a, want_a), (b, want_b)):  # each: past the last one, through a full path
            args["dst"][...] = 0
            p.execute(args)
            np.testing.assert_array_equal(args["dst"], want)
    run = p.bind(a)
    assert p._local.last is None  # the bound call's replay is not this thread's to run
    with monkeypatch.context() as m:
        _no_setup(p, m)
        run()
    np.testing.assert_array_equal(a["dst"], want_a)
    p.execute(b)
    with monkeypatch.context() as m:
        _no_setup(p, m)
        b["dst"][...] = 0
        p.execute(b)  # the last replay, taken first
    np.testing.assert_array_equal(b["dst"], want_b)
    # A set of the same slot that records no replay (a verbose call) rewrites the slot's
    # scratchpad with its own bias: a's next call sets up again.
    c = dict(a, bias=a["bias"] + 40, dst=np.zeros_like(a["dst"]))
    p.execute(a)
    with monkeypatch.context() as m:
        m.setenv("INT8JIT_VERBOSE", "exec")
        p.execute(c)
    assert p._replay_for(c) is None and p._local.last is None
    a["dst"][...] = 0
    p.execute(a)
    np.testing.assert_array_equal(a["dst"], want_a)
    assert not np.array_equal(c["dst"], want_a)


def test_new_user_scratchpads_on_every_call_are_not_all_kept():
    """A matmul in user scratchpad mode given a new scratchpad at every call (runtime
    weights: their packing buffers go with each scratchpad's views) keeps what it knows
    of at most matmul._VIEWS_KEPT of them, and computes right with each."""
    import gc
    import weakref

    from primitives import matmul

    pd = MatmulDesc(desc((4, 16), "u8", "ab"), desc((16, 24), "s8", "ab"), desc((4, 24), "s32", "ab"),
                    attr=Attr(scratchpad_mode="user"))
    p = pd.create()
    rng = np.random.default_rng(9)
    a = rng.integers(0, 256, (4, 16)).astype(np.uint8)
    first = None
    for i in range(matmul._VIEWS_KEPT + 5):
        w = rng.integers(-128, 128, (16, 24)).astype(np.int8)
        c = np.zeros((4, 24), np.int32)
        pad = np.zeros(pd.scratchpad_desc().nbytes + 64 * (i % 3), np.uint8)  # (new addresses)
        first = first or weakref.ref(pad)
        p.execute({"src": a, "weights": w, "dst": c, "scratchpad": pad})
        np.testing.assert_array_equal(c, a.astype(np.int64) @ w.astype(np.int64))
    gc.collect()
    assert len(p._sp_views) <= matmul._VIEWS_KEPT and first() is None


# ------------------------------------------------------------------ new arrays: moved replays
def _matmul_case(m: int, runtime: bool, threads: int, binary: str | None = None, user: bool = False, n: int = 48):
    """A matmul with the whole pipeline; weights packed through ``any``, or plain ones
    given at every call (``runtime``: read in place at 1-4 rows, else packed per call;
    one row over rows of ``n`` = 2048 bytes, which alias in the caches, walks K in
    chunks); ``binary``: an add post-op's operand kind ("row", "col", "full")."""
    rng = np.random.default_rng(m)
    k = 40
    po = PostOps().eltwise("relu")
    dims = {"row": (m, 1), "col": (1, n), "full": (m, n)}.get(binary)
    if binary:
        po.binary("add", desc(dims, "f32", "ab"))
    attr = Attr(scales={"src": 0, "weights": 2, "dst": 0}, scratchpad_mode="user" if user else "library"
                ).set_post_ops(po)
    pd = MatmulDesc(desc((m, k), "u8", "ab"), desc((k, n), "s8", "ab" if runtime else "any"),
                    desc((m, n), "u8", "ab"), desc((n,), "f32", "a"), attr=attr, threads=threads)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    if not runtime:
        packed = Memory(pd.weights_desc())
        reorder_desc(desc((k, n), "s8", "ab"), pd.weights_desc()).create().execute({"src": w, "dst": packed})
        w = packed
    args = {"src": rng.integers(0, 256, (m, k)).astype(np.uint8), "weights": w,
            "bias": rng.normal(0, 50, n).astype(np.float32), "dst": np.zeros((m, n), np.uint8),
            "scales:src": np.float32([0.5]), "scales:weights": rng.uniform(0.5, 2, n).astype(np.float32) / (k * 40),
            "scales:dst": np.float32([0.25])}
    if binary:
        args["post_op:1:src_1"] = rng.normal(0, 20, dims).astype(np.float32)
    return pd.create(), args


def _batched_case(m: int, zp: int, threads: int, wtag: str = "abc", flat: bool = False, k: int = 24, n: int = 40,
                  isa: str | None = None):
    """Attention's shape of matmul: a batch of 4 items, each with weights of its own given
    at every call (read in place at 1-4 rows, else packed per call), s32 output. ``wtag``
    acb: the weights as the keys are (rows of K), passed as a logical-shape view of them;
    ``flat``: the source passed as a 1-D array. (On a 256-bit path, K or N that are no
    whole dwords are packed from a padded copy.)"""
    rng = np.random.default_rng(m + zp)
    items = 4
    attr = Attr(zero_points={"src": 0} if zp else {})
    pd = MatmulDesc(desc((items, m, k), "u8", "abc"), desc((items, k, n), "s8", wtag),
                    desc((items, m, n), "s32", "abc"), attr=attr, threads=threads, isa=isa)
    w = rng.integers(-128, 128, (items, k, n)).astype(np.int8)
    if wtag == "acb":
        w = np.ascontiguousarray(w.transpose(0, 2, 1)).transpose(0, 2, 1)  # (items, k, n), memory (items, n, k)
    src = rng.integers(0, 256, (items, m, k)).astype(np.uint8)
    args = {"src": src.reshape(-1) if flat else src, "weights": w, "dst": np.zeros((items, m, n), np.int32)}
    if zp:
        args["zero_points:src"] = np.int32([zp])
    return pd.create(), args


_MOVE_CASES = {  # name -> (make(threads), whether new arrays move the replay)
    "conv 3x3, source rows copied": (lambda t: _conv(ic=16, pad=1, threads=t), True),
    "conv 1x1, source read in place": (lambda t: _conv(ic=16, pad=0, k=1, threads=t), True),
    "conv 3x3, no padding": (lambda t: _conv(ic=8, pad=0, threads=t), True),
    "conv stem": (lambda t: _conv(ic=3, pad=1, threads=t), True),
    "conv, channels-first dst": (lambda t: _conv(ic=8, pad=1, threads=t, dst_tag="nchw"), True),
    "conv, channels-first source": (lambda t: _conv(ic=8, pad=1, threads=t, src_tag="nchw"), True),
    "conv stem on avx2, word copy": (lambda t: _conv(ic=3, pad=1, threads=t, isa="avx2"), True),
    "conv, binary per channel": (lambda t: _conv(ic=16, pad=1, threads=t, binary="col"), True),
    "conv, binary full, 1x1": (lambda t: _conv(ic=16, pad=0, k=1, threads=t, binary="full"), True),
    "matmul, packed weights": (lambda t: _matmul_case(7, False, t), True),
    "matmul, weights read in place": (lambda t: _matmul_case(2, True, t), True),
    "matmul, weights packed per call": (lambda t: _matmul_case(9, True, t), True),
    "matmul, one row, weights read in place in chunks of K": (lambda t: _matmul_case(1, True, t, n=2048), True),
    "matmul, binary per row": (lambda t: _matmul_case(7, False, t, "row"), True),
    "matmul, binary full, weights read in place": (lambda t: _matmul_case(3, True, t, "full"), True),
    "matmul, binary per column, packed per call": (lambda t: _matmul_case(9, True, t, "col"), True),
    "batched matmul, weights read in place": (lambda t: _batched_case(1, 0, t), True),
    "batched matmul, weights packed per call": (lambda t: _batched_case(9, 0, t), True),
    "batched matmul, packed per call, zero point": (lambda t: _batched_case(9, 5, t), True),
    "batched matmul, keys' view, packed per call": (lambda t: _batched_case(9, 0, t, "acb"), True),
    "batched matmul, keys' view, read in place": (lambda t: _batched_case(1, 0, t, "acb"), True),
    "batched matmul, 1-D source": (lambda t: _batched_case(9, 0, t, flat=True), True),
    "batched matmul on avx2, packed from a padded copy": (lambda t: _batched_case(9, 0, t, k=23, n=37, isa="avx2"),
                                                          True),
    "batched matmul on avx2, keys' view, padded copy": (lambda t: _batched_case(9, 3, t, "acb", k=23, n=37,
                                                                                 isa="avx2"), True),
}


def _new_arrays(args: dict, seed: int) -> dict:
    """Other objects for every ndarray: new source, runtime weights and binary operand
    values, a new zeroed dst, the rest equal copies."""
    rng = np.random.default_rng(seed)
    new = {}
    for name, v in args.items():
        if isinstance(v, Memory) or name == "scratchpad":
            new[name] = v
        elif name == "dst":
            new[name] = np.zeros_like(v)
        else:  # (empty_like: the same memory order, a view's too)
            new[name] = np.empty_like(v)
            if name in ("src", "weights"):
                info = np.iinfo(v.dtype)
                new[name][...] = rng.integers(info.min, info.max + 1, v.shape)
            elif name.startswith("post_op:"):  # a binary operand
                new[name][...] = rng.normal(0, 20, v.shape)
            else:
                new[name][...] = v
    return new


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", list(_MOVE_CASES))
def test_new_arrays_move_the_replay(case, threads, monkeypatch):
    """Arrays of the same layouts, other objects, at every call (a loop that allocates its
    tensors): the last replay is pointed at them (Replay.moves) where its calls read and
    write the arrays alone, with no set-up; every result is the full path's, and the
    arrays of earlier calls are left alone."""
    make, moves = _MOVE_CASES[case]
    p, args = make(threads)
    p.execute(args)
    assert (p._replay_for(args).move is not None) == moves
    want = _fresh(p, args)
    p.execute(args)
    calls = [args] + [_new_arrays(args, seed) for seed in (1, 2)]
    wants = [want] + [_fresh(p, c) for c in calls[1:]]
    p.execute(args)
    for round_ in range(2):
        for c, expect in zip(calls, wants):
            others = [d["dst"].copy() for d in calls if d is not c]
            c["dst"][...] = 0
            with monkeypatch.context() as m:
                if moves:
                    _no_setup(p, m)
                p.execute(c)
            np.testing.assert_array_equal(c["dst"], expect, err_msg=f"round {round_}")
            np.testing.assert_array_equal([d["dst"] for d in calls if d is not c], others)


@pytest.mark.parametrize("case", list(_MOVE_CASES))
def test_a_setup_after_moved_calls_points_at_its_own_arrays(case):
    """Set up on some arrays, move to others, then set up again on the first ones (the
    replays forgotten): what the set-up compares to skip re-pointing (a convolution's
    source address for its row copies, a packer's source) must follow the moves, or the
    kernels would read the moved-to arrays."""
    make, _ = _MOVE_CASES[case]
    p, args = make(1)
    want = _fresh(p, args)
    other = _new_arrays(args, 3)
    p._forget_replays()
    p.execute(args)  # set up on args
    p.execute(other)  # moved to other
    p._forget_replays()
    args["dst"][...] = 0
    p.execute(args)  # set up on args again
    np.testing.assert_array_equal(args["dst"], want)


def test_moved_replay_takes_the_full_path_when_it_must(monkeypatch):
    """New arrays that differ in more than their place: other strides, other scale values,
    a dst over the source or read-only. The full path runs (and names what is wrong)."""
    p, args = _conv(ic=16, pad=1)
    p.execute(args)
    assert p._replay_for(args).move is not None

    def full(c):  # the full path ran (set-up counted), and gave its own result
        ran = []
        real = p._execute
        with monkeypatch.context() as m:
            m.setattr(p, "_execute", lambda *a: ran.append(1) or real(*a))
            p.execute(c)
        assert ran, "the replay moved to arrays it cannot take"

    # the source in a strided view: another layout, which the full path refuses
    wide = np.zeros(args["src"].shape[:-1] + (32,), np.uint8)
    with pytest.raises(ValueError, match="^src: got shape"):
        p.execute(dict(_new_arrays(args, 0), src=wide[..., :16]))
    p.execute(args)
    other_scale = dict(_new_arrays(args, 0), **{"scales:dst": np.float32([0.5])})
    full(other_scale)
    np.testing.assert_array_equal(other_scale["dst"], _fresh(p, other_scale))
    p.execute(args)
    other_zp = dict(_new_arrays(args, 0), **{"zero_points:src": np.int32([9])})
    full(other_zp)
    np.testing.assert_array_equal(other_zp["dst"], _fresh(p, other_zp))
    # a dst over the new source; a read-only dst: refused as the full path refuses them
    p.execute(args)
    buf = np.zeros(args["src"].nbytes + args["dst"].nbytes, np.uint8)
    over = dict(_new_arrays(args, 0), src=buf[:args["src"].nbytes].reshape(args["src"].shape),
                dst=buf[args["src"].nbytes // 2:][:args["dst"].nbytes].reshape(args["dst"].shape))
    with pytest.raises(ValueError, match="^dst: overlaps src"):
        p.execute(over)
    p.execute(args)
    frozen = _new_arrays(args, 0)
    frozen["dst"].flags.writeable = False
    with pytest.raises(ValueError, match="dst"):
        p.execute(frozen)
    # the same values in new objects (scales, bias, zero point): moved, no set-up
    p.execute(args)
    same = _new_arrays(args, 5)
    with monkeypatch.context() as m:
        _no_setup(p, m)
        p.execute(same)
    np.testing.assert_array_equal(same["dst"], _fresh(p, same))


def test_view_maker_takes_a_new_array_as_the_view_was_taken():
    """view_maker: the transpose or reshape that made a view of an array, for a new array
    of the same layout; None for a copy or a view of other bytes."""
    from primitives.replay import view_maker

    x = np.arange(2 * 3 * 4, dtype=np.int8).reshape(2, 3, 4)
    y = np.arange(100, 124, dtype=np.int8).reshape(2, 3, 4)
    for view in (x, x.transpose(0, 2, 1), x.transpose(2, 0, 1), x.reshape(6, 4), x.reshape(-1)):
        make = view_maker(view, x)
        got = make(y)
        assert got.shape == view.shape and got.strides == view.strides and got.ctypes.data == y.ctypes.data
    t = x.transpose(0, 2, 1)  # the other way: a contiguous view of a transposed array
    back = np.ascontiguousarray(t)
    assert view_maker(back, t) is None  # (a copy)
    assert view_maker(t.transpose(0, 2, 1), t)(y.transpose(0, 2, 1)).flags.c_contiguous
    assert view_maker(x[1:], x) is None and view_maker(x[:, :, ::2], x) is None


def _guarded_like(v: np.ndarray, guarded, where: str) -> np.ndarray:
    """An array laid out as ``v`` (its memory order too) flush against a guard page."""
    order = [int(i) for i in np.argsort([-s for s in v.strides], kind="stable")]
    buf = guarded(v.size, v.dtype, where).reshape([v.shape[i] for i in order])
    out = buf.transpose(np.argsort(order))
    assert out.strides == v.strides
    return out


@pytest.mark.parametrize("where", ["end", "start"])
@pytest.mark.parametrize("case", ["conv 3x3, source rows copied", "conv 1x1, source read in place",
                                  "conv, channels-first source", "conv, binary full, 1x1", "matmul, packed weights",
                                  "matmul, binary full, weights read in place", "batched matmul, keys' view, packed "
                                  "per call", "batched matmul, keys' view, read in place"])
def test_moved_replays_stay_inside_new_arrays(case, where, guarded, monkeypatch):
    """New arrays flush against PROT_NONE pages, after or before them: the moved replay's
    kernels (and copies) read and write inside them."""
    make, _ = _MOVE_CASES[case]
    p, args = make(2)
    p.execute(args)
    new = _new_arrays(args, 3)
    for name, v in list(new.items()):
        if isinstance(v, np.ndarray) and v.size and name not in ("bias",) and not name.startswith("scales"):
            g = _guarded_like(v, guarded, where)
            g[...] = v
            new[name] = g
    want = _fresh(p, new)
    p.execute(args)
    with monkeypatch.context() as m:
        _no_setup(p, m)
        p.execute(new)
    np.testing.assert_array_equal(new["dst"], want)


def test_conv_on_two_python_threads_with_user_scratchpads():
    """One convolution run from two Python threads at once, each with its own user
    scratchpad and arrays (new ones at every other call: moved replays): each thread's
    replays restore and point into its own, and every result is exact."""
    from concurrent.futures import ThreadPoolExecutor

    p, base_args = _conv(ic=16, pad=1, user=True)

    def job(seed):
        args = _new_arrays(base_args, seed)
        args["scratchpad"] = np.zeros(p.pd.scratchpad_desc().nbytes, np.uint8)
        args["zero_points:src"] = np.int32([seed % 50])
        p.execute(args)
        want = args["dst"].copy()
        ok = True
        for i in range(30):
            call = args if i % 2 else dict(args, src=args["src"].copy(), dst=np.zeros_like(args["dst"]))
            p.execute(call)
            ok = ok and np.array_equal(call["dst"], want)
        return ok, want

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(job, range(1, 5)))
    assert all(ok for ok, _ in results)
    for seed, (_, want) in zip(range(1, 5), results):  # (each thread's first call: the full path)
        args = _new_arrays(base_args, seed)
        args["zero_points:src"] = np.int32([seed % 50])
        np.testing.assert_array_equal(_fresh(p, dict(args, scratchpad=np.zeros(p.pd.scratchpad_desc().nbytes,
                                                                               np.uint8))), want)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", ["quantize", "dequantize", "transpose", "pack weights"])
def test_reorder_replays_and_moves(case, threads, monkeypatch):
    """A reorder called again: with the same arrays (new values in place) the kernel calls
    alone, with new arrays of the same layouts the replay moved to them; other scale or
    zero-point values, the full path; every result as reorder_ref's (or a fresh call's)."""
    from primitives import primitive_cache, reorder
    from primitives.reorder import ReorderDesc

    monkeypatch.setattr(reorder, "_SMALL", 1)  # (a small reorder takes one thread: split this one)
    rng = np.random.default_rng(6)
    shape = (6, 40, 33)
    if case == "quantize":
        pd = ReorderDesc(desc(shape, "f32", "abc"), desc(shape, "s8", "abc"),
                          attr=Attr(scales={"dst": 4}, zero_points={"dst": 0}), threads=threads)
        make = lambda: rng.normal(0, 50, shape).astype(np.float32)  # noqa: E731
        extra = {"scales:dst": rng.uniform(0.5, 2, 33).astype(np.float32), "zero_points:dst": np.int32([-3])}
    elif case == "dequantize":
        pd = ReorderDesc(desc(shape, "u8", "abc"), desc(shape, "f32", "abc"),
                          attr=Attr(scales={"src": 2}, zero_points={"src": 0}), threads=threads)
        make = lambda: rng.integers(0, 256, shape).astype(np.uint8)  # noqa: E731
        extra = {"scales:src": rng.uniform(0.01, 0.1, 40).astype(np.float32), "zero_points:src": np.int32([128])}
    elif case == "transpose":
        pd = ReorderDesc(desc(shape, "s8", "abc"), desc(shape, "s8", "cab"), threads=threads)
        make = lambda: rng.integers(-128, 128, shape).astype(np.int8)  # noqa: E731
        extra = {}
    else:
        mm = MatmulDesc(desc((8, 40), "u8", "ab"), desc((40, 33), "s8", "any"), desc((8, 33), "s32", "ab"))
        pd = ReorderDesc(desc((40, 33), "s8", "ab"), mm.weights_desc(), threads=threads)
        shape = (40, 33)
        make = lambda: rng.integers(-128, 128, shape).astype(np.int8)  # noqa: E731
        extra = {}
    primitive_cache.clear()
    p = pd.create()

    def dst_of():
        return Memory(pd.dst_desc()) if case == "pack weights" else np.zeros(pd.dst_desc().physical_shape,
                                                                              pd.dst_desc().numpy_dtype)

    def fresh(args):  # the full path, on copies
        copy = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in args.items()}
        copy["dst"] = dst_of()
        p._forget_replays()
        p.execute(copy)
        return copy["dst"]

    def same(a, b):
        if isinstance(a, Memory):
            x = np.zeros((8, 40), np.uint8) + 1
            outs = []
            for w in (a, b):  # packed weights: equal when a matmul computes the same with them
                y = np.zeros((8, 33), np.int32)
                mm.create().execute({"src": x, "weights": w, "dst": y})
                outs.append(y)
            return np.array_equal(*outs)
        return np.array_equal(a, b)

    args = dict(extra, src=make(), dst=dst_of())
    p.execute(args)
    assert same(args["dst"], fresh(args))
    p.execute(args)
    args["src"][...] = make()  # new values in place: the replay
    with monkeypatch.context() as m:
        _no_setup(p, m)
        p.execute(args)
    assert same(args["dst"], fresh(args))
    p.execute(args)
    moved = dict(args, src=make(), dst=dst_of(), **{k: v.copy() for k, v in extra.items()})
    with monkeypatch.context() as m:
        # (a packed dst is a Memory: the same object or the full path; the numpy routes
        # replay the same arrays only)
        if case != "pack weights" and pd.impl_info()["impl"].startswith("jit"):
            _no_setup(p, m)
        p.execute(moved)
    assert same(moved["dst"], fresh(moved))
    if extra:
        other = dict(moved, dst=dst_of(), **{k: (v * 2).astype(v.dtype) for k, v in extra.items()})
        p.execute(other)
        assert same(other["dst"], fresh(other))
        assert not same(other["dst"], moved["dst"])
    primitive_cache.clear()


@pytest.mark.parametrize("case", ["conv 3x3, source rows copied", "matmul, packed weights",
                                  "matmul, weights read in place"])
def test_new_memory_objects_move_the_replay(case, monkeypatch):
    """oneDNN's style: a new Memory around each new array, of the same descriptor, at every
    call; the replay moves to them as to new ndarrays. A Memory of another descriptor
    (or one a reorder filled) takes the full path."""
    make, _ = _MOVE_CASES[case]
    p, args = make(1)

    def wrapped(a):
        return {k: Memory(p.pd.query(k), v) if k in ("src", "dst") or (k == "weights" and isinstance(v, np.ndarray))
                else v for k, v in a.items()}
    first = wrapped(args)
    p.execute(first)
    want = _fresh(p, args)
    p.execute(first)
    for seed in (1, 2):
        new = _new_arrays(args, seed)
        expect = _fresh(p, new)
        p.execute(first)
        call = wrapped(new)
        with monkeypatch.context() as m:
            _no_setup(p, m)
            p.execute(call)
        np.testing.assert_array_equal(call["dst"].array, expect)
    np.testing.assert_array_equal(first["dst"].array, want)
    # another descriptor of the same bytes (a 1-D array's): the full path, the same result
    flat = dict(first, dst=Memory(desc((first["dst"].array.size,), first["dst"].desc.dt, "a"),
                                  first["dst"].array.reshape(-1)))
    ran = []
    real = p._execute
    with monkeypatch.context() as m:
        m.setattr(p, "_execute", lambda *a: ran.append(1) or real(*a))
        with pytest.raises((ValueError, TypeError)):
            p.execute(flat)  # (a dst of another shape: refused, as on a first call)
    assert not ran


def test_conv_plain_weights_packed_once_while_unchanged(monkeypatch):
    """Plain weights given at every call are packed again only when their bytes change
    (a one-entry cache), and the call replays (or moves) while they are those packed:
    the same array, an equal copy, then new values in place, a new array of other values
    and a logical-shape view of them; every result as a convolution on weights packed
    through 'any' gives, the packing and the set-ups counted. A bound call follows
    weights changed in place (it is execute itself: the bytes are compared at each call)."""
    from primitives import conv_weights

    rng = np.random.default_rng(21)
    attr = Attr(scales={"weights": 1, "dst": 0}).set_post_ops(PostOps().eltwise("relu"))
    mds = (desc((1, 16, 9, 9), "u8", "nhwc"), desc((24, 16, 3, 3), "s8", "hwio"), desc((1, 24, 9, 9), "u8", "nhwc"),
           desc((24,), "f32", "a"))
    p = ConvolutionDesc(*mds, padding_l=(1, 1), attr=attr).create()
    ref = ConvolutionDesc(mds[0], desc((24, 16, 3, 3), "s8", "any"), *mds[2:], padding_l=(1, 1), attr=attr).create()
    packs, setups = [], []
    real = conv_weights.ConvWeightsLayout.pack_all
    monkeypatch.setattr(conv_weights.ConvWeightsLayout, "pack_all", lambda self, w: packs.append(1) or real(self, w))
    real_execute = p._execute
    monkeypatch.setattr(p, "_execute", lambda *a: setups.append(1) or real_execute(*a))
    w = rng.integers(-128, 128, (3, 3, 16, 24)).astype(np.int8)  # hwio: the array in memory order
    args = {"src": rng.integers(0, 256, (1, 9, 9, 16)).astype(np.uint8), "weights": w,
            "bias": rng.normal(0, 50, 24).astype(np.float32), "dst": np.zeros((1, 9, 9, 24), np.uint8),
            "scales:weights": rng.uniform(0.5, 2, 24).astype(np.float32) / 5000, "scales:dst": np.float32([0.25])}

    def expect(a):
        wmem = Memory(ref.pd.weights_desc())
        weights = a["weights"] if a["weights"].shape == w.shape else a["weights"].transpose(2, 3, 1, 0)
        reorder_desc(desc((24, 16, 3, 3), "s8", "hwio"), ref.pd.weights_desc()).create().execute(
            {"src": weights, "dst": wmem})
        out = np.zeros_like(a["dst"])
        ref.execute(dict(a, weights=wmem, dst=out))
        return out

    steps = [("the same array", lambda: w, 0, 0), ("an equal copy", lambda: w.copy(), 0, 0),
             ("new values in place", lambda: (w.__setitem__(slice(None), w[::-1]), w)[1], 1, 1),
             ("a new array of other values", lambda: rng.integers(-128, 128, w.shape).astype(np.int8), 1, 1),
             ("the same values, a logical-shape view (oihw)", lambda: args["weights"].transpose(3, 2, 0, 1), 0, 1)]
    p.execute(args)
    assert len(packs) == len(setups) == 1
    for what, weights, more, setup in steps:
        before = len(packs), len(setups)
        args["weights"] = weights()
        args["dst"][...] = 0
        p.execute(args)
        assert (len(packs), len(setups)) == (before[0] + more, before[1] + setup), what
        np.testing.assert_array_equal(args["dst"], expect(args), err_msg=what)
    bound = p.bind(args)
    args["weights"][...] = rng.integers(-128, 128, args["weights"].shape)
    bound()
    np.testing.assert_array_equal(args["dst"], expect(args), err_msg="a bound call, weights changed in place")


def _user_scratchpad_layers():
    mm = MatmulDesc(desc((8, 64), "u8", "ab"), desc((64, 64), "s8", "ab"), desc((8, 64), "f32", "ab"),
                    attr=Attr(scales={"weights": 2}, scratchpad_mode="user"))
    mm_args = {"src": np.full((8, 64), 2, np.uint8), "weights": np.ones((64, 64), np.int8),
               "dst": np.zeros((8, 64), np.float32), "scales:weights": np.full(64, 0.5, np.float32)}
    cv = ConvolutionDesc(desc((1, 8, 7, 7), "u8", "nhwc"), desc((16, 8, 3, 3), "s8", "oihw"),
                         desc((1, 16, 7, 7), "s32", "nhwc"), padding_l=(1, 1), padding_r=(1, 1),
                         attr=Attr(scratchpad_mode="user", zero_points={"src": 0}))
    cv_args = {"src": np.ones((1, 7, 7, 8), np.uint8), "weights": np.ones((16, 8, 3, 3), np.int8),
               "dst": np.zeros((1, 7, 7, 16), np.int32), "zero_points:src": np.int32([3])}
    return [(mm, mm_args), (cv, cv_args)]


@pytest.mark.parametrize("layer", [0, 1], ids=["matmul", "conv"])
def test_later_calls_check_the_user_scratchpad_as_the_first_does(layer):
    """A call after the first (a replay, or its move to new arrays) refuses, as a first call
    does, a source that lies in the user scratchpad and a scratchpad made read-only: they
    had been taken (a wrong result, the source overwritten; the read-only buffer written)."""
    pd, args = _user_scratchpad_layers()[layer]
    prim = pd.create()
    sp = np.zeros(pd.scratchpad_desc().nbytes, np.uint8)
    prim.execute({**args, "scratchpad": sp})
    prim.execute({**args, "scratchpad": sp})  # (replayed)
    src = args["src"]
    inside = sp[:src.nbytes].view(src.dtype).reshape(src.shape)
    inside[...] = src
    with pytest.raises(ValueError, match="scratchpad: overlaps src"):
        prim.execute({**args, "src": inside, "scratchpad": sp})
    prim.execute({**args, "scratchpad": sp})
    sp.flags.writeable = False
    before = sp.copy()
    with pytest.raises(ValueError, match="scratchpad: the buffer is read-only"):
        prim.execute({**args, "scratchpad": sp})
    assert np.array_equal(sp, before)


def test_a_move_cut_short_leaves_no_replay_to_match():
    """Ctrl-C (or any error) while a replay is moved to new arrays: the next call sets up
    again. The record had named the new arrays before the structs were moved, so the
    next call with them ran on the old ones' addresses: its dst untouched, another
    array written."""
    import sys

    pd = MatmulDesc(desc((8, 64), "u8", "ab"), desc((64, 48), "s8", "ab"), desc((8, 48), "s32", "ab"),
                    attr=Attr(scratchpad_mode="user"), threads=1)  # (a user scratchpad: moved in Python)
    mm, sp = pd.create(), np.zeros(pd.scratchpad_desc().nbytes, np.uint8)
    rng = np.random.default_rng(0)
    w = rng.integers(-128, 128, (64, 48), dtype=np.int8)
    x0, x1 = (rng.integers(0, 256, (8, 64), dtype=np.uint8) for _ in range(2))
    y0, y1 = np.zeros((8, 48), np.int32), np.zeros((8, 48), np.int32)

    def run(x, y):
        mm.execute({"src": x, "weights": w, "dst": y, "scratchpad": sp})
    for x, y in [(x0, y0), (x1, y1), (x0, y0), (x1, y1)]:
        run(x, y)

    def tracer(frame, event, arg):  # (Ctrl-C as the move starts)
        if frame.f_code.co_name == "move" and frame.f_code.co_filename.endswith("matmul.py"):
            raise KeyboardInterrupt
    sys.settrace(tracer)
    try:
        with pytest.raises(KeyboardInterrupt):
            run(x0, y0)
    finally:
        sys.settrace(None)
    x0[...], x1[...], y0[...], y1[...] = 1, 2, -7, -7
    run(x0, y0)
    np.testing.assert_array_equal(y0, x0.astype(np.int64) @ w)
    assert (y1 == -7).all()


def test_threads_that_end_leave_no_scratchpad_state():
    """A library scratchpad belongs to a thread's slot; when the thread ends, what the
    primitive kept about it goes too (a matmul's views and runtime weights' buffers, a
    convolution's records of what it wrote): they had been kept, 312 MB after 80 threads
    at 2048 x 2048."""
    mm = MatmulDesc(desc((4, 256), "u8", "ab"), desc((256, 256), "s8", "ab"), desc((4, 256), "s32", "ab"),
                    threads=1).create()
    conv = ConvolutionDesc(desc((1, 8, 6, 6), "u8", "nhwc"), desc((16, 8, 3, 3), "s8", "oihw"),
                           desc((1, 16, 6, 6), "s32", "nhwc"), padding_l=(1, 1), padding_r=(1, 1), threads=1).create()
    a, w = np.ones((4, 256), np.uint8), np.ones((256, 256), np.int8)
    x, wc = np.ones((1, 6, 6, 8), np.uint8), np.ones((16, 8, 3, 3), np.int8)

    def calls():
        mm.execute({"src": a, "weights": w, "dst": np.zeros((4, 256), np.int32)})
        conv.execute({"src": x, "weights": wc, "dst": np.zeros((1, 6, 6, 16), np.int32)})
    import threading

    for _ in range(30):
        thread = threading.Thread(target=calls)
        thread.start()
        thread.join()
    assert len(mm._sp_views) <= 1 and len(conv._written) <= 1 and len(conv._filled) <= 1, \
        (len(mm._sp_views), len(conv._written), len(conv._filled))
