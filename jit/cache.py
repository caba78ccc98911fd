"""Kernel cache: in memory per process, and on disk across processes.

The disk cache holds :class:`jit.build.GeneratedCode` (bytes, constants, relocations,
listing) keyed by a hash of the library version, the code generators' sources and the kernel key, so a second process
maps the code without paying PeachPy again. Writes go to a temporary file and are
renamed into place, so two processes writing the same entry at once are safe. The folder
is ``INT8JIT_CACHE_DIR`` (default ``~/.cache/int8jit``), bounded by
``INT8JIT_CACHE_MAX_MB`` (default 256; the oldest entries go first);
``INT8JIT_DISK_CACHE=0`` turns it off.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import threading
from typing import Callable, Hashable

from jit.build import GeneratedCode, load
from runtime.kernel import Kernel

VERSION = "0.1.0"
_memory: dict[Hashable, Kernel] = {}
_lock = threading.RLock()
stats = {"memory_hits": 0, "disk_hits": 0, "generated": 0}


def cache_dir() -> str:
    return os.environ.get("INT8JIT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "int8jit")


def _disk_enabled() -> bool:
    return os.environ.get("INT8JIT_DISK_CACHE", "1") not in ("0", "", "off", "false")


def _code_digest() -> str:
    """A digest of the code generators' sources (jit/*.py): an edited template or output
    stage must never be served stale from the disk cache."""
    global _digest
    if _digest is None:
        h = hashlib.sha256()
        folder = os.path.dirname(os.path.abspath(__file__))
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py"):
                with open(os.path.join(folder, name), "rb") as f:
                    h.update(name.encode() + b"\0" + f.read())
        _digest = h.hexdigest()[:16]
    return _digest


_digest: str | None = None


def _path(key: Hashable) -> str:
    digest = hashlib.sha256(repr((VERSION, _code_digest(), key)).encode()).hexdigest()[:32]
    return os.path.join(cache_dir(), f"{digest}.kernel")


def _read_disk(key: Hashable) -> GeneratedCode | None:
    try:
        with open(_path(key), "rb") as f:
            stored_key, generated = pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError):
        return None
    return generated if stored_key == repr(key) and isinstance(generated, GeneratedCode) else None


def _write_disk(key: Hashable, generated: GeneratedCode) -> None:
    folder = cache_dir()
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            pickle.dump((repr(key), generated), f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, _path(key))
        _prune(folder)
    except OSError:
        pass  # a read-only or full disk only costs regeneration next time


def _prune(folder: str) -> None:
    limit = float(os.environ.get("INT8JIT_CACHE_MAX_MB", "256")) * 2**20
    entries = []
    for name in os.listdir(folder):
        if name.endswith(".kernel"):
            try:
                st = os.stat(os.path.join(folder, name))
            except OSError:
                continue
            entries.append((st.st_mtime, st.st_size, name))
    total = sum(size for _, size, _ in entries)
    for _, size, name in sorted(entries):
        if total <= limit:
            break
        try:
            os.remove(os.path.join(folder, name))
        except OSError:
            pass
        total -= size


def get_kernel(key: Hashable, generate: Callable[[], GeneratedCode]) -> Kernel:
    """The kernel for ``key``: from memory, else from disk, else ``generate()`` it."""
    with _lock:
        kernel = _memory.get(key)
        if kernel is not None and not kernel.closed:
            stats["memory_hits"] += 1
            return kernel
        generated = _read_disk(key) if _disk_enabled() else None
        if generated is not None:
            stats["disk_hits"] += 1
        else:
            generated = generate()
            stats["generated"] += 1
            if _disk_enabled():
                _write_disk(key, generated)
        kernel = load(generated)
        _memory[key] = kernel
        return kernel


def clear_memory() -> None:
    """Forget (and unmap) every cached kernel of this process."""
    with _lock:
        for kernel in _memory.values():
            kernel.close()
        _memory.clear()
