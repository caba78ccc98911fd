"""runtime/: W^X executable memory, kernel objects, bad input; jit.cache on disk; JIT dumps."""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest

from runtime import isa as isa_mod
from runtime.execmem import PAGE, ExecutableMemory, Relocation
from runtime.kernel import Kernel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RET7 = bytes([0xB8, 7, 0, 0, 0, 0xC3])  # mov eax, 7; ret
# mov eax, [rip + disp32]; ret  -- disp32 at offset 2, relative to the end (offset 6)
LOAD_CONST = bytes([0x8B, 0x05, 0, 0, 0, 0, 0xC3])


def maps() -> list[tuple[int, int, str, str]]:
    """(start, end, perms, rest) of every mapping of this process."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in parts[0].split("-"))
            out.append((start, end, parts[1], parts[5].strip() if len(parts) > 5 else ""))
    return out


def _foreign_wx() -> set:
    """RWX mappings made by other libraries in this process (oneDNN's JIT, loaded by the
    conformance tests, maps its code RWX); int8jit's own mappings never are."""
    import sys

    if not any("dnnl" in name for name in sys.modules) and "libdnnl" not in open("/proc/self/maps").read():
        return set()
    return {m[:2] for m in maps() if "w" in m[2] and "x" in m[2]}


_FOREIGN_WX = None


def assert_no_wx() -> None:
    global _FOREIGN_WX
    if _FOREIGN_WX is None:
        _FOREIGN_WX = _foreign_wx()
    bad = [m for m in maps() if "w" in m[2] and "x" in m[2] and m[:2] not in _FOREIGN_WX]
    assert not bad, f"writable+executable mappings: {bad}"


def perms_at(address: int) -> str:
    for start, end, perms, _ in maps():
        if start <= address < end:
            return perms
    return ""


def mapped(address: int) -> bool:
    return bool(perms_at(address))


def _peachpy_const_kernel(value: int) -> "object":
    """A PeachPy-built kernel that loads a constant from its constant pool (no cache)."""
    from jit import asm
    from jit.build import generate
    from jit.dot import fast_path, vector_constant

    path = fast_path("avx2")
    out = asm.Argument(asm.ptr(asm.int32_t), "out")

    def emit():
        asm.LOAD.ARGUMENT(asm.rdi, out)
        asm.VMOVDQU(asm.ymm0, vector_constant(path, [value], f"c{value & 0xFFFF}"))
        asm.VMOVD(asm.eax, asm.xmm0)
        asm.MOV(asm.dword[asm.rdi], asm.eax)
        asm.RETURN()

    return generate(f"const_{value}", "avx2", "void (*)(int32_t *)", (out,), emit)


# -- W^X ------------------------------------------------------------------------------------
def _build_and_free(generated, rounds: int = 3) -> None:
    from jit.build import load

    for r in range(rounds):
        kernels = [Kernel(f"k{i}", RET7 + bytes(i), signature="int (*)(void)") for i in range(60)]
        kernels += [Kernel(f"c{i}", LOAD_CONST, signature="int (*)(void)", const=i.to_bytes(4, "little") * 2,
                           relocations=(Relocation(2, 6, 4),)) for i in range(20)]
        kernels += [load(g) for g in generated]
        assert_no_wx()
        for k in kernels[:40]:
            assert k() == 7
        addresses = [k.address for k in kernels]
        for i, k in enumerate(kernels):
            if i % 2:
                k.close()  # explicit release; the rest go by garbage collection
        del kernels, k
        gc.collect()
        assert_no_wx()
        still = [hex(a) for a in addresses if mapped(a)]
        assert not still, f"kernel mappings not released: {still[:5]}"


def test_no_rwx_and_mappings_return_after_many_kernels():
    generated = [_peachpy_const_kernel(1000 + i) for i in range(3)]
    _build_and_free(generated, rounds=1)  # warm up allocator arenas and cffi caches
    gc.collect()
    before = len(maps())
    assert_no_wx()
    _build_and_free(generated, rounds=3)
    gc.collect()
    assert_no_wx()
    assert len(maps()) == before


def test_code_is_rx_constants_are_r_and_relocations_resolve():
    value = 0x12345678
    k = Kernel("const", LOAD_CONST, signature="int (*)(void)", const=value.to_bytes(4, "little"),
               relocations=(Relocation(2, 6, 0),))
    try:
        mem = k._memory
        assert perms_at(k.address).startswith("r-x")
        assert perms_at(mem.const_address).startswith("r--")
        assert mem.const_address == k.address + PAGE
        assert k() == value
        # the bytes in executable memory hold the resolved displacement, not PeachPy's zero
        disp = int.from_bytes(k.code()[2:6], "little", signed=True)
        assert k.address + 6 + disp == mem.const_address
    finally:
        k.close()


@pytest.mark.skipif(not isa_mod.cpu_supports("avx2"), reason="the CPU lacks AVX2: the PeachPy kernel cannot run")
def test_peachpy_kernel_loads_its_constant():
    from jit.build import load
    from runtime.ffi import ffi

    generated = _peachpy_const_kernel(-123456)
    assert generated.const and generated.relocations
    k = load(generated)
    out = ffi.new("int32_t *")
    k(out)
    assert out[0] == -123456
    assert perms_at(k.address).startswith("r-x")
    assert perms_at(k._memory.const_address).startswith("r--")
    k.close()


def test_relocation_outside_constants_is_refused():
    with pytest.raises(ValueError, match="relocation"):
        ExecutableMemory(LOAD_CONST, b"\0" * 4, (Relocation(2, 6, 8),))


# -- bad input ------------------------------------------------------------------------------
def test_wrong_argument_types_raise_type_error():
    k = Kernel("ret7", RET7, signature="int (*)(int64_t, int32_t *)")
    with pytest.raises(TypeError):
        k("not a number", None)
    with pytest.raises(TypeError):
        k(1)  # missing argument
    k.close()


def test_closed_kernel_raises_value_error():
    k = Kernel("ret7", RET7, signature="int (*)(void)")
    assert k() == 7
    k.close()
    assert k.closed and "closed" in repr(k)
    with pytest.raises(ValueError, match="closed"):
        k()
    with pytest.raises(ValueError):
        k.code()
    k.close()  # twice is fine


def test_unknown_isa_name_lists_the_valid_ones():
    with pytest.raises(isa_mod.IsaError) as info:
        isa_mod.check_name("bogus")
    for name in isa_mod.LADDER:
        assert name in str(info.value)
    assert "bogus" in str(info.value)


def test_empty_code_is_refused():
    with pytest.raises(ValueError, match="code"):
        Kernel("empty", b"", signature="void (*)(void)")


# -- disk cache -----------------------------------------------------------------------------
_CHILD = textwrap.dedent(
    """
    import json, sys
    from jit import cache
    from jit.peak import peak_kernel
    from runtime.isa import cpu_supports
    k = peak_kernel("avx2")
    if cpu_supports("avx2"):
        k(10)
    print(json.dumps({"stats": cache.stats, "peachpy": "peachpy" in sys.modules, "size": k.size,
                      "code": k.code()[:64].hex()}))
    """
)


def _child(cache_dir: str, wait: bool = True):
    env = dict(os.environ, INT8JIT_CACHE_DIR=cache_dir, INT8JIT_DISK_CACHE="1")
    env.pop("INT8JIT_JIT_DUMP", None)
    proc = subprocess.Popen([sys.executable, "-c", _CHILD], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc
    return _result(proc)


def _result(proc) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_second_process_loads_from_disk_without_generating(tmp_path):
    first = _child(str(tmp_path))
    assert first["stats"]["generated"] == 1 and first["stats"]["disk_hits"] == 0
    assert [p for p in os.listdir(tmp_path) if p.endswith(".kernel")]
    second = _child(str(tmp_path))
    assert second["stats"]["generated"] == 0 and second["stats"]["disk_hits"] == 1
    assert second["peachpy"] is False, "loading from disk must not import PeachPy"
    assert second["size"] == first["size"]


def test_two_processes_writing_at_once_leave_a_valid_entry(tmp_path):
    procs = [_child(str(tmp_path), wait=False) for _ in range(2)]
    results = [_result(p) for p in procs]
    assert all(r["stats"]["generated"] + r["stats"]["disk_hits"] == 1 for r in results)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    entries = [p for p in os.listdir(tmp_path) if p.endswith(".kernel")]
    assert len(entries) == 1
    third = _child(str(tmp_path))
    assert third["stats"]["disk_hits"] == 1 and third["stats"]["generated"] == 0
    assert third["size"] == results[0]["size"]


def test_corrupt_disk_entry_is_regenerated(tmp_path):
    _child(str(tmp_path))
    (entry,) = [p for p in os.listdir(tmp_path) if p.endswith(".kernel")]
    (tmp_path / entry).write_bytes(b"garbage")
    again = _child(str(tmp_path))
    assert again["stats"]["generated"] == 1


def test_damaged_or_foreign_disk_entries_are_regenerated(tmp_path):
    """An entry whose bytes changed (a flipped bit of its code would run as a wrong kernel,
    or crash) fails its digest; one that others may write is not trusted; both are
    generated again, and the rewritten entry is read by the next process."""
    first = _child(str(tmp_path))
    (entry,) = [tmp_path / p for p in os.listdir(tmp_path) if p.endswith(".kernel")]
    data = bytearray(entry.read_bytes())
    at = bytes(data).index(bytes.fromhex(first["code"][:32]))  # (the code's first bytes, in the pickle)
    data[at] ^= 0x01
    entry.write_bytes(bytes(data))
    again = _child(str(tmp_path))
    assert again["stats"]["generated"] == 1 and again["code"] == first["code"]
    assert _child(str(tmp_path))["stats"]["disk_hits"] == 1
    os.chmod(entry, 0o666)
    assert _child(str(tmp_path))["stats"]["generated"] == 1


def test_disk_entries_of_another_form_are_regenerated(tmp_path, monkeypatch):
    """Entries that pass the digest but do not unpickle into this library's objects (a
    module renamed since they were written) are generated again, not raised."""
    import hashlib
    import pickle

    from jit import cache

    monkeypatch.setenv("INT8JIT_CACHE_DIR", str(tmp_path))
    key = ("no such kernel",)
    body = pickle.dumps((repr(key), cache.GeneratedCode)).replace(b"jit.build", b"jit.buil5")
    path = cache._path(repr(key))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(cache._TAG + hashlib.sha256(body).digest() + body)
    os.chmod(path, 0o600)
    assert cache._read_disk(key) is None


def test_disk_cache_settings_are_checked(tmp_path, monkeypatch):
    """A bound that is no number is refused naming the variable, before anything is
    written; a blank INT8JIT_DISK_CACHE is unset (on); ``~`` in the folder is the home."""
    from jit import cache

    monkeypatch.setenv("INT8JIT_CACHE_DIR", str(tmp_path))
    for bad in ("abc", "-1", "nan"):
        monkeypatch.setenv("INT8JIT_CACHE_MAX_MB", bad)
        with pytest.raises(ValueError, match=f"^INT8JIT_CACHE_MAX_MB: expected a number of megabytes.*{bad}"):
            cache._write_disk(("entry", 0), bytes(10))
    assert not _entries(tmp_path)
    monkeypatch.setenv("INT8JIT_DISK_CACHE", " ")
    assert cache._disk_enabled()
    monkeypatch.setenv("INT8JIT_DISK_CACHE", "No")
    assert not cache._disk_enabled()
    monkeypatch.setenv("INT8JIT_DISK_CACHE", "sometimes")  # (had meant on)
    with pytest.raises(ValueError, match="^INT8JIT_DISK_CACHE: expected 0, off, false, no or 1, on.*'sometimes'"):
        cache._disk_enabled()
    monkeypatch.setenv("INT8JIT_DISK_CACHE", "ON")
    assert cache._disk_enabled()
    monkeypatch.setenv("INT8JIT_CACHE_DIR", "~/int8jit-cache")
    assert cache.cache_dir() == os.path.join(os.path.expanduser("~"), "int8jit-cache")


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("1", True), ("", True), ("huh", None)])
def test_spin_pool_switch(value, on):
    """INT8JIT_SPIN_POOL takes the switch words INT8JIT_DISK_CACHE takes ("off" had left
    the pool on: only "0" turned it off); another word is refused by name at import."""
    code = "import runtime.pool as p; print(p.ENABLED)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, INT8JIT_SPIN_POOL=value))
    if on is None:
        assert proc.returncode != 0 and "INT8JIT_SPIN_POOL: expected 0, off" in proc.stderr, proc.stderr
    else:
        assert proc.returncode == 0 and proc.stdout.strip() == str(on), proc.stderr


_EXIT_CHILD = textwrap.dedent(
    """
    import threading, time
    import numpy as np
    from primitives.gemm import Gemm
    g = Gemm(64, 256, 256, B=np.ones((256, 256), np.int8))
    a, c = np.ones((64, 256), np.uint8), np.zeros((64, 256), np.int32)
    def busy():
        while True:
            g.execute(a, c)
    threading.Thread(target=busy, daemon=True).start()
    time.sleep(0.05)
    """
)


def test_exit_while_a_daemon_thread_runs_a_kernel():
    """The interpreter's exit does not unmap kernels that a daemon thread may be running
    (it had: a segfault at exit in most runs)."""
    env = dict(os.environ, INT8JIT_DISK_CACHE="0")
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", _EXIT_CHILD], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])


def _entries(folder) -> dict:
    return {p: os.path.getsize(os.path.join(folder, p)) for p in os.listdir(folder) if p.endswith(".kernel")}


def test_disk_cache_keeps_to_its_bound(tmp_path, monkeypatch):
    """INT8JIT_CACHE_MAX_MB bounds the folder: the oldest entries go, the newest stays.
    With a bound of 20 KB, each 2 KB entry is more than 1/16 of it, so every write prunes."""
    from jit import cache

    monkeypatch.setenv("INT8JIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("INT8JIT_CACHE_MAX_MB", str(20 / 1024))
    for i in range(30):
        cache._write_disk(("entry", i), bytes(2000))
        os.utime(cache._path(repr(("entry", i))), (i, i))  # distinct ages, oldest first
        assert sum(_entries(tmp_path).values()) <= 20 << 10
    kept = _entries(tmp_path)
    assert os.path.basename(cache._path(repr(("entry", 29)))) in kept
    assert os.path.basename(cache._path(repr(("entry", 0)))) not in kept
    assert len(kept) >= 8  # the bound, not fewer


def test_disk_cache_prunes_about_once_per_sixteenth_of_its_bound(tmp_path, monkeypatch):
    """A prune stats every entry (a full 256 MB folder: 200 ms), so a write draws one with
    odds of its bytes against 1/16 of the bound: 200 writes of 2 KB against a 1 MB bound
    (400 KB written, 6.25 sixteenths) prune a few times, not 200."""
    import random

    from jit import cache

    monkeypatch.setenv("INT8JIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("INT8JIT_CACHE_MAX_MB", "1")
    monkeypatch.setattr(cache, "_rng", random.Random(5))
    calls = []
    monkeypatch.setattr(cache, "_prune", lambda folder, limit: calls.append(limit))
    for i in range(200):
        cache._write_disk(("entry", i), bytes(2000))
    assert 1 <= len(calls) <= 15, len(calls)
    assert len(_entries(tmp_path)) == 200


# -- INT8JIT_JIT_DUMP ------------------------------------------------------------------------
def test_jit_dump_writes_bin_and_s(tmp_path, monkeypatch):
    from jit.build import GeneratedCode, load

    monkeypatch.setenv("INT8JIT_JIT_DUMP", "1")
    monkeypatch.setenv("INT8JIT_JIT_DUMP_DIR", str(tmp_path / "dump"))
    k = load(GeneratedCode("ret7", "avx2", "int (*)(void)", RET7, b"", (), ""))
    try:
        assert k() == 7
        files = sorted(os.listdir(tmp_path / "dump"))
        bins = [f for f in files if f.endswith(".bin")]
        listings = [f for f in files if f.endswith(".s")]
        assert len(bins) == 1 and len(listings) == 1 and bins[0].startswith("ret7.avx2.")
        assert (tmp_path / "dump" / bins[0]).read_bytes() == RET7
        text = (tmp_path / "dump" / listings[0]).read_text()
        assert "mov eax,7" in text and "ret" in text
    finally:
        k.close()


def test_jit_dump_that_cannot_be_written_warns(tmp_path, monkeypatch):
    """A dump folder that cannot be made (here: a file of that name) does not stop the
    kernel from being loaded and run: a warning says why nothing was written."""
    from jit.build import GeneratedCode, load

    (tmp_path / "a file").write_text("")
    monkeypatch.setenv("INT8JIT_JIT_DUMP", "1")
    monkeypatch.setenv("INT8JIT_JIT_DUMP_DIR", str(tmp_path / "a file"))
    with pytest.warns(RuntimeWarning, match="INT8JIT_JIT_DUMP: cannot write"):
        k = load(GeneratedCode("ret7", "avx2", "int (*)(void)", RET7, b"", (), ""))
    try:
        assert k() == 7
    finally:
        k.close()


def test_jit_dump_off_by_default(tmp_path, monkeypatch):
    from jit.build import GeneratedCode, load

    monkeypatch.delenv("INT8JIT_JIT_DUMP", raising=False)
    monkeypatch.chdir(tmp_path)
    load(GeneratedCode("ret7", "avx2", "int (*)(void)", RET7, b"", (), "")).close()
    assert not os.path.exists(tmp_path / "jit-dump")


def test_env_raw_follows_the_environment_as_it_changes(monkeypatch):
    """env_raw answers as os.environ.get does, at once after each change (an unset name
    from os.environ's own mapping; a set one, a blank one, a deleted one), and through
    .get where os.environ is no mapping of that kind (a test's stand-in)."""
    from runtime.env import env_raw

    name = "INT8JIT_TEST_ENV_RAW"
    monkeypatch.delenv(name, raising=False)
    assert env_raw(name) == "" and env_raw(name, "d") == "d"
    monkeypatch.setenv(name, " 7 ")
    assert env_raw(name) == " 7 "
    monkeypatch.setenv(name, "")
    assert env_raw(name, "d") == ""
    monkeypatch.delenv(name)
    assert env_raw(name, "d") == "d"
    monkeypatch.setattr(os, "environ", {name: "x"})
    assert env_raw(name) == "x"
