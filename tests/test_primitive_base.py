"""primitives.base, primitive_cache and verbose, exercised through a tiny numpy primitive.

``AddDesc``/``Add`` computes ``dst = src * scale_src + 1 (+ binary src_1)`` on u8
with numpy, saturating. It asks for a scratchpad and writes a thread-specific pattern
into it, so the tests can see which buffer each execution got.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primitives import primitive_cache, verbose
from primitives.attr import DST, SCRATCHPAD, SRC, Attr, PostOps, post_op_src1, scales, zero_points
from primitives.base import Primitive, PrimitiveDesc
from primitives.memory import Memory, desc
from primitives.primitive_cache import PrimitiveCache
from tests.conftest import in_threads

FEW = settings(max_examples=25, deadline=None)


class AddDesc(PrimitiveDesc):
    kind = "add_one"

    def __init__(self, src_md, attr=None, scratch=64, extra=0):
        super().__init__(attr, isa="avx2")
        if src_md.dt != "u8":
            raise ValueError(f"src: expected data type u8, got {src_md.dt}")
        self.attr.validate({SRC: src_md, DST: src_md}, self.kind, scales_args=(SRC,), zero_points_args=(DST,),
                           binary_algs=("add",))
        self._set_desc(SRC, src_md)
        self._set_desc(DST, src_md)
        self.scratchpad_nbytes = scratch
        self.extra = extra
        self.builds = 0

    def _key_extra(self):
        return self.extra

    def impl_info(self):
        return {"impl": "numpy_add_one", "isa": self.isa, "why": "the only one"}

    def _create_primitive(self):
        self.builds += 1
        return Add(self)


class Add(Primitive):
    seen: list

    def __init__(self, pd):
        super().__init__(pd)
        self.seen = []
        self.lock = threading.Lock()
        self.barrier: threading.Barrier | None = None

    def _execute(self, mem, scratchpad):
        with self.lock:
            self.seen.append((mem, scratchpad))
        if scratchpad is not None:
            mark = threading.get_ident() % 251
            scratchpad[:] = mark
            if self.barrier is not None:
                self.barrier.wait(timeout=10)  # both threads are inside _execute now
            time.sleep(0.01)
            assert (scratchpad == mark).all(), "another execution wrote into this scratchpad"
        x = mem[SRC].array.astype(np.float32)
        if scales(SRC) in mem:
            x = x * mem[scales(SRC)].array.reshape(_bshape(self.pd, SRC))
        x = x + 1
        b = post_op_src1(0)
        if b in mem:
            x = x + mem[b].array
        if zero_points(DST) in mem:
            x = x + mem[zero_points(DST)].array.reshape(_bshape(self.pd, DST))
        np.copyto(mem[DST].array, np.clip(np.rint(x), 0, 255).astype(np.uint8))


def _bshape(pd, arg):
    """The broadcast shape of a per-dims parameter (the mask's dims kept, others 1)."""
    mask = (pd.attr.scales if arg == SRC else pd.attr.zero_points)[arg]
    return [d if mask >> i & 1 else 1 for i, d in enumerate(pd.query(arg).dims)]


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    monkeypatch.delenv(primitive_cache.ENV_CAPACITY, raising=False)
    monkeypatch.delenv(verbose.ENV, raising=False)
    monkeypatch.delenv(verbose.ENV_TIMESTAMP, raising=False)
    primitive_cache.set_capacity(None)
    primitive_cache.clear()
    yield
    primitive_cache.set_capacity(None)
    primitive_cache.clear()


MD = desc((2, 3), "u8", "ab")


def test_execute_arrays_and_memories_without_copy():
    prim = AddDesc(MD).create()
    src = np.arange(6, dtype=np.uint8).reshape(2, 3)
    dst = np.zeros((2, 3), np.uint8)
    prim.execute({SRC: src, DST: dst})
    assert (dst == src + 1).all()
    mem, scratchpad = prim.seen[-1]
    assert isinstance(mem[SRC], Memory) and np.shares_memory(mem[SRC].array, src)
    assert np.shares_memory(mem[DST].array, dst)
    assert scratchpad.dtype == np.uint8 and scratchpad.shape == (64,) and scratchpad.ctypes.data % 64 == 0
    dmem = Memory(MD)
    prim.execute({SRC: Memory(MD, src), DST: dmem})
    assert (dmem.array == src + 1).all() and np.shares_memory(prim.seen[-1][0][DST].array, dmem.array)
    # (_execute gets arrays over the caller's memory that do not keep the caller's alive)
    assert prim.seen[-1][0][DST] is not dmem and prim.seen[-1][0][DST].array.base is not dmem.array
    assert prim.last_exec_ms is not None and prim.last_exec_ms >= 0


def test_queries_and_impl_info():
    pd = AddDesc(MD, scratch=0)
    assert pd.src_desc() == pd.dst_desc() == MD
    assert pd.weights_desc() is None and pd.bias_desc() is None
    assert pd.scratchpad_desc().dims == (0,) and pd.scratchpad_desc().nbytes == 0
    assert pd.impl_info()["impl"] == "numpy_add_one" and pd.impl_name() == "numpy_add_one"
    assert pd.exec_arg_names() == (SRC, DST)
    pd2 = AddDesc(MD, Attr(scales={SRC: 2}, zero_points={DST: 0},
                           post_ops=PostOps().binary("add", desc((1, 3), "f32", "ab"))))
    assert pd2.exec_arg_names() == (SRC, DST, "scales:src", "zero_points:dst", "post_op:0:src_1")
    assert pd2.query("scales:src") == desc((3,), "f32", "a")
    assert pd2.query("zero_points:dst") == desc((1,), "s32", "a")
    assert pd2.query(post_op_src1(0)) == desc((1, 3), "f32", "ab")


def test_scratchpad_none_when_not_needed():
    prim = AddDesc(MD, scratch=0).create()
    prim.execute({SRC: np.zeros((2, 3), np.uint8), DST: np.zeros((2, 3), np.uint8)})
    assert prim.seen[-1][1] is None


@pytest.mark.parametrize("args, exc, match", [
    ({SRC: np.zeros((2, 3), np.uint8)}, ValueError, r"args: missing argument 'dst' \(u8:ab:2x3\) for add_one"),
    ({SRC: np.zeros((2, 3), np.uint8), DST: np.zeros((2, 3), np.uint8), "weights": np.zeros(1)}, ValueError,
     r"args: unexpected argument 'weights' for add_one; it takes dst, src"),
    ({SRC: np.zeros((2, 3), np.uint8), DST: np.zeros((2, 3), np.uint8), "scales:src": np.ones(1, np.float32)},
     ValueError, r"args: unexpected argument 'scales:src'"),
    ({SRC: np.zeros((2, 3), np.int8), DST: np.zeros((2, 3), np.uint8)}, TypeError,
     r"src: expected dtype uint8 \(u8\), got int8"),
    ({SRC: np.zeros((3, 2), np.uint8), DST: np.zeros((2, 3), np.uint8)}, ValueError, r"src: got shape \(3, 2\)"),
    ({SRC: np.zeros((2, 3), np.uint8), DST: [[0] * 3] * 2}, TypeError, "dst: expected a Memory or a numpy array"),
    ({SRC: Memory(desc((2, 3), "s8", "ab")), DST: np.zeros((2, 3), np.uint8)}, ValueError,
     r"src: memory is s8:ab:2x3; expected u8:ab:2x3"),
    ([(SRC, 1)], TypeError, "args: expected a dict"),
    ({0: np.zeros(1)}, TypeError, "args: argument names are strings"),
])
def test_bad_arguments_are_named(args, exc, match):
    prim = AddDesc(MD).create()
    with pytest.raises(exc, match=match):
        prim.execute(args)
    assert prim.seen == []  # nothing ran


def test_read_only_dst_is_rejected():
    dst = np.zeros((2, 3), np.uint8)
    dst.flags.writeable = False
    with pytest.raises(ValueError, match="dst: the array is read-only"):
        AddDesc(MD).create().execute({SRC: np.zeros((2, 3), np.uint8), DST: dst})


def test_bad_attr_at_creation():
    with pytest.raises(ValueError, match="attr zero_points:src: add_one takes no zero points for 'src'"):
        AddDesc(MD, Attr(zero_points={SRC: 0}))
    with pytest.raises(ValueError, match="attr scales:src: mask 4 sets bit 2 but the tensor has 2 dimensions"):
        AddDesc(MD, Attr(scales={SRC: 4}))
    with pytest.raises(ValueError, match=r"post_ops\[0\]: add_one cannot do binary 'mul'"):
        AddDesc(MD, Attr(post_ops=PostOps().binary("mul", desc((1, 3), "f32", "ab"))))
    with pytest.raises(TypeError, match="attr: expected an Attr or None, got dict"):
        AddDesc(MD, {"scales": {}})


def test_attr_is_copied_at_creation():
    attr = Attr(scales={SRC: 0})
    pd = AddDesc(MD, attr)
    attr.set_scales_mask(SRC, 1)
    assert pd.attr.scales_mask(SRC) == 0


@st.composite
def mask_and_count(draw):
    mask = draw(st.integers(0, 3))
    want = [1, 2, 3, 6][mask]
    count = draw(st.sampled_from([want, want, want + 1, max(0, want - 1)]))
    return mask, want, count


@FEW
@given(mask_and_count())
def test_scales_count_follows_mask(mc):
    mask, want, count = mc
    prim = AddDesc(MD, Attr(scales={SRC: mask}), scratch=0).create()
    src = np.full((2, 3), 10, np.uint8)
    dst = np.zeros((2, 3), np.uint8)
    values = np.arange(1, count + 1, dtype=np.float64)  # f64 in: converted to f32 for _execute
    if count != want:
        with pytest.raises(ValueError, match=rf"scales:src: got {count} values; expected {want} for mask {mask}"):
            prim.execute({SRC: src, DST: dst, scales(SRC): values})
        return
    prim.execute({SRC: src, DST: dst, scales(SRC): values})
    got = prim.seen[-1][0][scales(SRC)].array
    assert got.dtype == np.float32 and got.shape == (want,)
    expect = np.clip(10 * values.reshape(_bshape(prim.pd, SRC)) + 1, 0, 255)
    assert (dst == np.broadcast_to(expect, (2, 3))).all()


def test_zero_points_and_binary_operand():
    src1 = desc((1, 3), "f32", "ab")
    prim = AddDesc(MD, Attr(zero_points={DST: 1}, post_ops=PostOps().binary("add", src1))).create()
    dst = np.zeros((2, 3), np.uint8)
    prim.execute({SRC: np.zeros((2, 3), np.uint8), DST: dst, zero_points(DST): np.array([5, 7], np.int64),
                  post_op_src1(0): np.array([[0, 10, 20]], np.float32)})
    assert dst.tolist() == [[6, 16, 26], [8, 18, 28]]
    with pytest.raises(TypeError, match=r"zero_points:dst: expected integer \(s32\) zero points"):
        prim.execute({SRC: np.zeros((2, 3), np.uint8), DST: dst, zero_points(DST): np.array([5.0, 7.0]),
                      post_op_src1(0): np.zeros((1, 3), np.float32)})
    with pytest.raises(ValueError, match=r"post_op:0:src_1: got shape \(2, 3\)"):
        prim.execute({SRC: np.zeros((2, 3), np.uint8), DST: dst, zero_points(DST): np.array([5, 7]),
                      post_op_src1(0): np.zeros((2, 3), np.float32)})


# ----------------------------------------------------------------------------- scratchpad

def test_user_scratchpad():
    pd = AddDesc(MD, Attr(scratchpad_mode="user"), scratch=100)
    assert pd.scratchpad_desc().nbytes == 100
    prim = pd.create()
    args = {SRC: np.zeros((2, 3), np.uint8), DST: np.zeros((2, 3), np.uint8)}
    with pytest.raises(ValueError, match=r"args: missing argument 'scratchpad' \(100 bytes"):
        prim.execute(args)
    with pytest.raises(ValueError, match="scratchpad: buffer of 99 bytes is smaller than the 100 bytes"):
        prim.execute({**args, SCRATCHPAD: np.zeros(99, np.uint8)})
    with pytest.raises(ValueError, match="scratchpad: the buffer is read-only"):
        ro = np.zeros(100, np.uint8)
        ro.flags.writeable = False
        prim.execute({**args, SCRATCHPAD: ro})
    with pytest.raises(TypeError, match="scratchpad: expected a buffer of bytes .* dtype object"):
        prim.execute({**args, SCRATCHPAD: np.empty(100, object)})  # (numpy's own message had named nothing)
    buf = np.zeros(30, np.int32)  # 120 bytes of any type will do
    prim.execute({**args, SCRATCHPAD: buf})
    got = prim.seen[-1][1]
    assert got.nbytes == 100 and np.shares_memory(got, buf)
    prim.execute({**args, SCRATCHPAD: Memory(pd.scratchpad_desc())})
    assert prim.seen[-1][1].nbytes == 100


def test_scratchpad_passed_in_library_mode_is_an_error():
    prim = AddDesc(MD).create()
    with pytest.raises(ValueError, match="scratchpad: passed to a primitive whose scratchpad_mode is 'library'"):
        prim.execute({SRC: np.zeros((2, 3), np.uint8), DST: np.zeros((2, 3), np.uint8),
                      SCRATCHPAD: np.zeros(64, np.uint8)})


def _run_two_threads(prim, extra_args=lambda i: {}):
    prim.barrier = threading.Barrier(2)

    def work(i):
        prim.execute({SRC: np.zeros((2, 3), np.uint8), DST: np.zeros((2, 3), np.uint8), **extra_args(i)})

    errors = in_threads(work, [(0,), (1,)])
    prim.barrier = None
    assert not errors, errors


def test_library_scratchpad_is_per_thread_and_allocated_once():
    prim = AddDesc(MD, scratch=256).create()
    args = {SRC: np.zeros((2, 3), np.uint8), DST: np.zeros((2, 3), np.uint8)}
    prim.execute(args)
    prim.execute(args)
    first, second = prim.seen[0][1], prim.seen[1][1]
    assert first.ctypes.data == second.ctypes.data  # same thread: the same buffer, allocated once
    _run_two_threads(prim)  # both threads inside _execute at once: the barrier proves it
    a, b = prim.seen[2][1], prim.seen[3][1]
    assert a.ctypes.data != b.ctypes.data


def test_user_scratchpads_in_two_threads():
    prim = AddDesc(MD, Attr(scratchpad_mode="user"), scratch=128).create()
    bufs = [np.zeros(128, np.uint8), np.zeros(128, np.uint8)]
    _run_two_threads(prim, lambda i: {SCRATCHPAD: bufs[i]})
    assert {s.ctypes.data for _, s in prim.seen} == {b.ctypes.data for b in bufs}


# ----------------------------------------------------------------------------- primitive cache

def test_identical_descriptors_share_a_primitive():
    pd1 = AddDesc(MD, Attr(scales={SRC: 0}))
    p1 = pd1.create()
    pd2 = AddDesc(desc((2, 3), "u8", "nc"), Attr(scales={SRC: 0}))
    assert pd1.key() == pd2.key() and hash(pd1.key())
    assert pd2.create() is p1 and pd2.builds == 0
    assert primitive_cache.stats()["hits"] == 1 and primitive_cache.stats()["misses"] == 1
    assert AddDesc(MD, Attr(scales={SRC: 1})).create() is not p1
    assert AddDesc(MD, Attr(scales={SRC: 0}), extra=1).create() is not p1
    assert AddDesc(MD, Attr(scales={SRC: 0}), scratch=8).create() is not p1
    assert AddDesc(MD, Attr(scales={SRC: 0}, policy="faithful")).create() is not p1
    assert primitive_cache.stats()["size"] == 5


def test_cache_capacity_from_env(monkeypatch):
    monkeypatch.setenv(primitive_cache.ENV_CAPACITY, "0")
    pd = AddDesc(MD)
    assert pd.create() is not pd.create() and pd.builds == 2
    assert primitive_cache.stats()["size"] == 0
    monkeypatch.setenv(primitive_cache.ENV_CAPACITY, "many")
    with pytest.raises(ValueError, match="INT8JIT_PRIMITIVE_CACHE_CAPACITY: expected a non-negative integer, got 'many'"):
        pd.create()
    monkeypatch.delenv(primitive_cache.ENV_CAPACITY)
    assert primitive_cache.capacity() == 1024


def test_cache_is_lru():
    cache = PrimitiveCache(capacity=2)
    cache.get_or_create("a", lambda: 1)
    cache.get_or_create("b", lambda: 2)
    assert cache.get_or_create("a", lambda: 0) == (1, True)  # 'a' is now the most recent
    cache.get_or_create("c", lambda: 3)  # evicts 'b'
    assert "b" not in cache and "a" in cache and "c" in cache
    cache.set_capacity(1)
    assert len(cache) == 1 and "c" in cache
    assert cache.stats() == {"hits": 1, "misses": 3, "size": 1, "capacity": 1}
    cache.clear()
    assert cache.stats() == {"hits": 0, "misses": 0, "size": 0, "capacity": 1}
    with pytest.raises(ValueError, match="capacity: expected a non-negative integer, got -1"):
        cache.set_capacity(-1)
    with pytest.raises(TypeError, match="key: a primitive descriptor key must be hashable"):
        cache.get_or_create(["x"], lambda: 1)


def test_cache_creates_once_under_concurrency():
    cache = PrimitiveCache(capacity=8)
    calls = []
    start = threading.Barrier(6)

    def factory():
        calls.append(1)
        time.sleep(0.05)  # long enough for the other threads to arrive while it is pending
        return object()

    results = []

    def work():
        start.wait(timeout=10)
        results.append(cache.get_or_create("k", factory)[0])

    assert not in_threads(work, [()] * 6)
    assert len(calls) == 1 and len({id(r) for r in results}) == 1
    assert cache.stats()["hits"] == 5 and cache.stats()["misses"] == 1


def test_cache_factory_error_is_not_cached():
    cache = PrimitiveCache(capacity=8)

    def boom():
        raise RuntimeError("no kernel")

    with pytest.raises(RuntimeError, match="no kernel"):
        cache.get_or_create("k", boom)
    assert cache.get_or_create("k", lambda: 7) == (7, False)


# ----------------------------------------------------------------------------- verbose

def _lines(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("int8jit_verbose")]


def test_verbose_off_by_default(capsys):
    AddDesc(MD).create().execute({SRC: np.zeros((2, 3), np.uint8), DST: np.zeros((2, 3), np.uint8)})
    assert _lines(capsys) == []


@pytest.mark.parametrize("value, kinds", [("1", {"create", "exec"}), ("all", {"create", "exec"}),
                                          ("create", {"create"}), ("exec", {"exec"}),
                                          ("dispatch", {"create", "exec", "dispatch"}), ("0", set())])
def test_verbose_lines(monkeypatch, capsys, value, kinds):
    monkeypatch.setenv(verbose.ENV, value)
    pd = AddDesc(MD, Attr(scales={SRC: 2}, scratchpad_mode="user"), scratch=0)
    verbose.dispatch("add_one", "jit_avx512", "CPU lacks AVX512F, no avx512_core path")
    prim = pd.create()
    prim.execute({SRC: np.zeros((2, 3), np.uint8), DST: np.zeros((2, 3), np.uint8), scales(SRC): np.ones(3)})
    lines = _lines(capsys)
    assert {line.split(",")[1] for line in lines} == kinds
    for line in lines:
        fields = line.split(",")
        if fields[1] == "dispatch":
            # The comma in the reason became ';' so the line keeps its 5 fields.
            assert fields == ["int8jit_verbose", "dispatch", "add_one", "jit_avx512",
                              "CPU lacks AVX512F; no avx512_core path"]
        else:
            assert len(fields) == 8
            assert fields[2:6] == ["add_one", "numpy_add_one", "avx2", "src:u8:ab:2x3 dst:u8:ab:2x3"]
            assert fields[6] == "scales:src:2 scratchpad:user"
            assert float(fields[7]) >= 0


def test_verbose_timestamp_and_unknown_value(monkeypatch, capsys):
    monkeypatch.setenv(verbose.ENV, "exec")
    monkeypatch.setenv(verbose.ENV_TIMESTAMP, "1")
    before = time.time() * 1e3
    AddDesc(MD).create().execute({SRC: np.zeros((2, 3), np.uint8), DST: np.zeros((2, 3), np.uint8)})
    (line,) = _lines(capsys)
    fields = line.split(",")
    assert len(fields) == 9 and fields[2] == "exec" and float(fields[1]) >= before - 1
    monkeypatch.setenv(verbose.ENV, "exec,chatty")
    with pytest.warns(RuntimeWarning, match="INT8JIT_VERBOSE: unknown value 'chatty' ignored"):
        assert verbose.flags() == {"exec"}


def test_create_through_cache_prints_each_creation(monkeypatch, capsys):
    monkeypatch.setenv(verbose.ENV, "create")
    AddDesc(MD).create()
    AddDesc(MD).create()
    assert [line.split(",")[1] for line in _lines(capsys)] == ["create", "create"]


# ----------------------------------------------------------------------------- base contract

def test_subclass_contract_errors():
    class NoImpl(PrimitiveDesc):
        kind = "nothing"

    with pytest.raises(NotImplementedError, match="NoImpl implements neither _create_primitive"):
        NoImpl().create()

    class Wrong(PrimitiveDesc):
        def _create_primitive(self):
            return "not a primitive"

    with pytest.raises(TypeError, match=r"Wrong._create_primitive\(\) returned str, expected a Primitive"):
        Wrong().create()

    class Lazy(PrimitiveDesc):
        kind = "lazy"
        primitive_class = Primitive
        cacheable = False

    prim = Lazy().create()
    assert prim.pd.kind == "lazy" and Lazy().create() is not prim
    with pytest.raises(NotImplementedError, match="Primitive does not implement _execute"):
        prim.execute({})
    with pytest.raises(TypeError, match="pd: expected a PrimitiveDesc"):
        Primitive("pd")


def test_optional_arguments_do_not_hide_a_missing_one():
    class WithBias(AddDesc):
        def optional_arg_names(self):
            return ("bias",)

        def query(self, name):
            return desc(3, "f32", "a") if name == "bias" else super().query(name)

        def exec_arg_names(self):
            return (SRC, DST)

    prim = WithBias(MD, scratch=0).create()
    src = np.zeros((2, 3), np.uint8)
    with pytest.raises(ValueError, match="args: missing argument 'dst'"):
        prim.execute({SRC: src, "bias": np.zeros(3, np.float32)})
    prim.execute({SRC: src, DST: np.zeros((2, 3), np.uint8), "bias": np.zeros(3, np.float32)})
    assert isinstance(prim.seen[-1][0]["bias"], Memory)
    with pytest.raises(TypeError, match=r"bias: expected dtype float32 \(f32\), got int32"):
        prim.execute({SRC: src, DST: np.zeros((2, 3), np.uint8), "bias": np.zeros(3, np.int32)})
    with pytest.raises(TypeError, match=r"bias: expected dtype float32 \(f32\), got float32 \(big-endian\)"):
        prim.execute({SRC: src, DST: np.zeros((2, 3), np.uint8), "bias": np.zeros(3, ">f4")})


_FORK_CHILD = r"""
import os, threading, time
from jit import cache
from primitives import primitive_cache
held, done = threading.Event(), threading.Event()
def hold():  # (another thread mid-way through a kernel's generation and a primitive's creation)
    with cache._lock, primitive_cache.get_cache()._lock:
        primitive_cache.get_cache()._pending["elsewhere"] = None
        held.set()
        done.wait()
threading.Thread(target=hold, daemon=True).start()
held.wait()
pid = os.fork()
if pid == 0:
    with cache._lock:
        pass
    value, hit = primitive_cache.get_cache().get_or_create("in the child", lambda: 7)
    os._exit(0 if (value, hit) == (7, False) else 3)
for _ in range(1000):
    got, status = os.waitpid(pid, os.WNOHANG)
    if got:
        print("child", os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.01)
else:
    os.kill(pid, 9)
    print("child hung")
done.set()
"""


def test_a_child_forked_while_another_thread_holds_the_caches_runs():
    """os.fork while another thread generates a kernel or creates a primitive: the child's
    caches start with free locks and no pending creations (it had waited forever)."""
    import subprocess
    import sys

    from tests.conftest import child_env

    proc = subprocess.run([sys.executable, "-c", _FORK_CHILD], capture_output=True, text=True, timeout=60,
                          env=child_env())
    assert proc.stdout.strip() == "child 0", proc.stdout + proc.stderr


def test_an_interrupted_creation_leaves_nothing_pending():
    """An exception (Ctrl-C) from a creation removes its pending entry, so a later creation
    of the same descriptor makes it instead of waiting forever."""
    cache = PrimitiveCache(capacity=8)

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cache.get_or_create("k", interrupted)
    assert not cache._pending and cache.get_or_create("k", lambda: 5) == (5, False)
