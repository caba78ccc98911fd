"""Shared fixtures: the ISA paths to run on, and buffers placed against a guard page.

* ``isa_path`` (fixture, parametrised over ``runtime.isa.LADDER``): the name of an ISA
  path this CPU can execute; the others are skipped with a reason that names the CPU
  feature the path needs and the CPU lacks ("CPU lacks AVX-VNNI").
* :func:`executable_isas` / :func:`skip_reason` for tests that parametrise themselves.
* ``INT8JIT_TEST_EMULATE=1``: the paths this CPU lacks are not skipped where a test takes
  its path from ``isa_path`` or :func:`isa_params`: the test runs with every kernel call
  emulated (``tests/emulator.py``), slowly; a developer's soak on a machine without
  AVX-512 (the tests that compare with oneDNN or PyTorch, which run natively, still skip).
* :class:`GuardedBuffer` and the ``guarded`` fixture: numpy arrays whose last byte sits
  right before a PROT_NONE page (``where="end"``) or whose first byte sits right after
  one (``where="start"``), so that any access outside the array faults (SIGSEGV).
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from runtime import isa as isa_mod
from runtime.ffi import ffi, libc

ALL_ISAS = isa_mod.LADDER


def cpu_without_avx2(brand: str):
    """A ``runtime.cpu.CpuInfo`` of an x86-64 CPU with SSE4.2 at most, on which no path runs."""
    from runtime import cpu

    return cpu.CpuInfo.from_registers(cpu.encode_registers(("sse4_1", "sse4_2"), brand=brand), None)


def _synthetic_cpu(level: str) -> None:
    """``INT8JIT_TEST_CPU=<ladder level>``: the probe answers, in this test process, for a
    CPU whose best path is ``level`` (what a machine without the paths above it runs:
    their tests skip, their kernels are still generated and disassembled).
    ``INT8JIT_TEST_CPU=none``: for an x86-64 CPU without AVX2 (SSE4.2 at most), on which
    no path runs (see :func:`_skip_where_no_path_runs`)."""
    from runtime import cpu

    if level.strip().lower() == "none":
        cpu._cached = cpu_without_avx2("synthetic CPU without AVX2 (INT8JIT_TEST_CPU)")
        return
    level = isa_mod.check_name(level, "INT8JIT_TEST_CPU")
    if not isa_mod.cpu_supports(level):  # its kernels run: they must run on this machine
        raise pytest.UsageError(f"INT8JIT_TEST_CPU: this machine cannot run the {level} path "
                                f"(it runs: {', '.join(isa_mod.supported()) or 'none'})")
    features = ("osxsave", "avx") + isa_mod.REQUIRES[level]
    xcr0 = cpu.XCR0_YMM | (cpu.XCR0_ZMM if "avx512f" in features else 0)
    regs = cpu.encode_registers(features, brand=f"synthetic {level} CPU (INT8JIT_TEST_CPU)")
    cpu._cached = cpu.CpuInfo.from_registers(regs, xcr0)


if os.environ.get("INT8JIT_TEST_CPU", "").strip():
    _synthetic_cpu(os.environ["INT8JIT_TEST_CPU"])


def _synthetic_caches(text: str) -> None:
    """``INT8JIT_TEST_CACHES=<L1 data>,<L2>`` (sysfs's notation: ``32K,1M``, a Zen 4
    core's): the blocking plans, in this test process, against those caches instead of
    this machine's. Set before the primitives are imported (``primitives.conv`` takes
    its budgets at import)."""
    from runtime import caches

    try:
        l1d, l2 = (caches._size(part) for part in text.split(","))
    except ValueError:
        raise pytest.UsageError(f"INT8JIT_TEST_CACHES: expected '<L1 data>,<L2>' such as '32K,1M', got {text!r}")
    pretended = caches.DataCaches(l1d=l1d, l2=l2, source="INT8JIT_TEST_CACHES")
    caches.data_caches = lambda: pretended


if os.environ.get("INT8JIT_TEST_CACHES", "").strip():
    _synthetic_caches(os.environ["INT8JIT_TEST_CACHES"])

# What each ladder level needs beyond the one below, in words for skip reasons.
_FEATURE_WORDS = {
    "avx2": "AVX2", "fma": "FMA", "bmi2": "BMI2", "avx_vnni": "AVX-VNNI",
    "avx512f": "AVX512F", "avx512bw": "AVX512BW", "avx512vl": "AVX512VL", "avx512dq": "AVX512DQ",
    "avx512_vnni": "AVX512-VNNI",
}


def skip_reason(isa: str) -> str | None:
    """None when the CPU executes ``isa``, else why not ("CPU lacks AVX-VNNI")."""
    if isa_mod.cpu_supports(isa):
        return None
    from runtime.cpu import cpu_info

    info = cpu_info()
    missing = [_FEATURE_WORDS.get(f, f.upper()) for f in isa_mod.REQUIRES[isa] if not info.has(f)]
    return f"CPU lacks {', '.join(missing) or 'a feature'} (needed by the {isa} path)"


def executable_isas() -> tuple[str, ...]:
    return tuple(name for name in ALL_ISAS if isa_mod.cpu_supports(name))


EMULATE = os.environ.get("INT8JIT_TEST_EMULATE", "").strip() not in ("", "0")
# Tests that hold int8jit to a peer library running natively: not under emulation.
_NATIVE_PEERS = ("test_gemm_onednn", "test_onednn_prim", "test_onednn_peer", "test_torch_conv")


def isa_params():
    """pytest params over every ladder level, skipped where the CPU lacks the path (but
    under ``INT8JIT_TEST_EMULATE``)."""
    out = []
    for name in ALL_ISAS:
        why = None if EMULATE else skip_reason(name)
        marks = [pytest.mark.skip(reason=why)] if why else []
        out.append(pytest.param(name, id=name, marks=marks))
    return out


@pytest.fixture(params=isa_params())
def isa_path(request) -> str:
    """An ISA path this CPU can execute (every ladder level, skipped where it cannot)."""
    return request.param


@pytest.fixture(autouse=True)
def _own_primitives():
    """Each test starts with an empty primitive cache. Its key is the descriptor, not
    what the decisions a test patches (strips, cache budgets, cuts) made of it, so a test
    would otherwise run a primitive an earlier test made the other way for an identical
    descriptor, and pass without running what it meant to. (Kernels stay cached.)"""
    from primitives import primitive_cache

    primitive_cache.clear()


@pytest.fixture(autouse=True)
def _emulated_path(request, monkeypatch):
    """Under ``INT8JIT_TEST_EMULATE``, a test parametrised with a path this CPU lacks runs
    with its kernel calls emulated."""
    callspec = getattr(request.node, "callspec", None) if EMULATE else None
    params = callspec.params.values() if callspec is not None else ()
    if not any(isinstance(v, str) and v in ALL_ISAS and skip_reason(v) for v in params):
        yield
        return
    if request.module.__name__.rsplit(".", 1)[-1] in _NATIVE_PEERS:
        pytest.skip(f"{skip_reason(next(v for v in params if v in ALL_ISAS))}; its peer runs natively")
    from primitives import primitive_cache
    from tests.emulator import emulation_switch

    emulation_switch(monkeypatch)(True)
    yield
    primitive_cache.clear()


def met_no_path(exc: BaseException | None) -> bool:
    """Whether ``exc`` is, or was raised while handling (``pytest.raises`` with the wrong
    message, a group from hypothesis), the error of a CPU with no usable path."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, isa_mod.NoIsaPathError):
            return True
        if isinstance(exc, BaseExceptionGroup) and any(met_no_path(e) for e in exc.exceptions):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


NO_PATH_REASON = (f"CPU lacks {', '.join(_FEATURE_WORDS[f] for f in isa_mod.REQUIRES['avx2'])} "
                  "(needed by every int8jit path): no kernel can run here")
# Taken once, before any test: a test that fakes a CPU without a path (test_cpu_probe's
# fake_cpu) must still fail when its own check of that error fails.
NO_PATH_HERE = not isa_mod.supported()


def _skip_where_no_path_runs():
    """On a CPU where no path runs, a test that needed one (it met
    :class:`runtime.isa.NoIsaPathError`) is skipped, with the reason, instead of failing.
    Only there: on any other CPU the error fails the test as any other would."""
    try:
        return (yield)
    except Exception as exc:
        if NO_PATH_HERE and met_no_path(exc):
            pytest.skip(NO_PATH_REASON)
        raise


pytest_runtest_setup = pytest.hookimpl(wrapper=True)(_skip_where_no_path_runs)
pytest_runtest_call = pytest.hookimpl(wrapper=True)(_skip_where_no_path_runs)
# For a test whose kernels run in a child process, where the hooks above cannot see why it failed.
needs_a_path = pytest.mark.skipif(NO_PATH_HERE, reason=NO_PATH_REASON)


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Bit-exact equality: f32 arrays compared as their int32 bit patterns (so -0.0 is
    not 0.0 and NaNs compare), any other type as it is."""
    def bits(a):
        return a.view(np.int32) if a.dtype == np.float32 else a
    np.testing.assert_array_equal(bits(got), bits(want))


def faithful_model(policy: str, isa: str) -> bool:
    """Whether the reference must model the saturating VPMADDUBSW pairing."""
    return policy == "faithful" and not isa.endswith("vnni")


def set_in_place(array: np.ndarray, attr: str, value) -> None:
    """Set ``array``'s shape or dtype in place, the case the replay tests check: NumPy 2.5
    deprecates it (for new views); where a NumPy refuses it, no caller can do it to a
    primitive's arrays either, and the test's rest is skipped."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            setattr(array, attr, value)
        except AttributeError as exc:
            pytest.skip(f"this NumPy does not set an array's {attr} in place ({exc})")


def check_dst_changed_in_place(execute, dst) -> None:
    """A dst reshaped (its first two dims merged) or made read-only in place after a call
    is checked again and refused (a replay must not take it), and accepted once restored.
    ``execute()`` runs the primitive on the arguments that hold ``dst``."""
    shape = dst.shape
    set_in_place(dst, "shape", (shape[0] * shape[1], 1) + shape[2:])
    with pytest.raises(ValueError, match="dst"):
        execute()
    set_in_place(dst, "shape", shape)
    execute()
    dst.flags.writeable = False
    with pytest.raises(ValueError, match="dst"):
        execute()
    dst.flags.writeable = True
    execute()


def in_threads(work, args_per_thread) -> list[BaseException]:
    """Run ``work(*args)`` on one Python thread per entry of ``args_per_thread``, all at
    once, and return what they raised (an exception on a thread is otherwise only printed)."""
    import threading

    errors: list[BaseException] = []

    def run(*args):
        try:
            work(*args)
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=tuple(args)) for args in args_per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def child_env() -> dict:
    """The environment for a child Python that imports int8jit from this checkout: the
    checkout first on PYTHONPATH, whatever was there kept (where the dependencies are
    found through it rather than site-packages)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))


# ------------------------------------------------------------------ guard pages

PROT_NONE, PROT_READ, PROT_WRITE = 0, 1, 2
MAP_PRIVATE, MAP_ANONYMOUS = 0x02, 0x20
_SC_PAGESIZE = 30


def page_size() -> int:
    return int(libc.sysconf(_SC_PAGESIZE))


class GuardedBuffer:
    """An array of ``count`` elements of ``dtype`` touching a PROT_NONE page.

    ``where="end"``: the array's last byte is the byte before the guard page.
    ``where="start"``: the array's first byte is the first byte after the guard page.
    Keep this object alive while the array is used; :meth:`close` unmaps it.
    """

    def __init__(self, count: int, dtype, where: str = "end"):
        if where not in ("end", "start"):
            raise ValueError(f"where: expected 'end' or 'start', got {where!r}")
        dtype = np.dtype(dtype)
        size = count * dtype.itemsize
        page = page_size()
        data_pages = -(-max(size, 1) // page)
        self.length = (data_pages + 1) * page
        ptr = libc.mmap(ffi.NULL, self.length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        if ptr == ffi.cast("void *", -1):
            raise OSError("mmap failed")
        self.base = ptr
        base = int(ffi.cast("uintptr_t", ptr))
        if where == "end":
            guard = base + data_pages * page
            start = guard - size
        else:
            guard = base
            start = base + page
        if libc.mprotect(ffi.cast("void *", guard), page, PROT_NONE) != 0:
            libc.munmap(ptr, self.length)
            raise OSError("mprotect failed")
        self.array = np.frombuffer(ffi.buffer(ffi.cast("char *", start), size), dtype)
        self.guard = guard

    def close(self) -> None:
        if self.base is not None:
            self.array = None
            libc.munmap(self.base, self.length)
            self.base = None


@pytest.fixture
def guarded():
    """Factory: ``guarded(count, dtype, where)`` -> array against a guard page."""
    made: list[GuardedBuffer] = []

    def make(count: int, dtype, where: str = "end") -> np.ndarray:
        buf = GuardedBuffer(count, dtype, where)
        made.append(buf)
        return buf.array

    yield make
    for buf in made:
        buf.close()
