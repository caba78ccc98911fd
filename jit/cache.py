"""Kernel cache: in memory per process, and on disk across processes.

The disk cache holds :class:`jit.build.GeneratedCode` (bytes, constants, relocations,
listing) keyed by a hash of the library version, the code generators' sources and the kernel key, so a second process
maps the code without paying PeachPy again. Writes go to a temporary file and are
renamed into place, so two processes writing the same entry at once are safe. The folder
is ``INT8JIT_CACHE_DIR`` (default ``~/.cache/int8jit``), bounded by
``INT8JIT_CACHE_MAX_MB`` (default 256; the oldest entries go first, when a write draws
a prune: about once per 1/16 of the bound written, so the folder may pass the bound by
about that much between prunes);
``INT8JIT_DISK_CACHE=0`` (or ``off``, ``false``, ``no``) turns it off. The sources' digest
(:func:`_code_digest`) is of their names, sizes and modification times. An entry carries
the SHA-256 of its contents, and is read only where it is this user's own file, writable
by no one else (:func:`_read_disk`); anything else is generated again.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import random
import tempfile
import threading
from typing import Callable, Hashable

from jit.build import GeneratedCode, load
from runtime.env import env_size, env_switch
from runtime.kernel import Kernel

VERSION = "0.1.0"
_memory: dict[Hashable, Kernel] = {}
_lock = threading.RLock()
stats = {"memory_hits": 0, "disk_hits": 0, "generated": 0}


def _after_fork() -> None:
    """In a child of ``os.fork``: a lock another thread held (it is held while a kernel
    is generated) would never be released here."""
    global _lock
    _lock = threading.RLock()


os.register_at_fork(after_in_child=_after_fork)


def cache_dir() -> str:
    folder = os.environ.get("INT8JIT_CACHE_DIR", "").strip()
    return os.path.expanduser(folder) if folder else os.path.join(os.path.expanduser("~"), ".cache", "int8jit")


def _disk_enabled() -> bool:
    # (blank counts as unset, as for every INT8JIT_* variable)
    return env_switch("INT8JIT_DISK_CACHE", True)


def _code_digest() -> str:
    """A digest of the code generators' sources (jit/*.py) as this process imported them:
    an edited template or output stage must never be served stale from the disk cache.

    It hashes the sources' names, sizes and modification times (the test Python applies
    before it trusts a cached ``.pyc``), not their text: reading and hashing the text cost
    0.5-1 ms, and keeping that digest in an index beside the entries still cost 0.2-0.5 ms
    of a fresh process's first creation. A touched but unchanged source, or a second copy of
    the library, only generates its kernels once more.
    """
    return _DIGEST


def _source_stamp_digest(folder: str) -> str:
    """A hash of the ``.py`` files in ``folder``: name, size and modification time (ns)."""
    h = hashlib.sha256(folder.encode())
    try:
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py"):
                st = os.stat(os.path.join(folder, name))
                h.update(f"\0{name}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    except OSError as exc:  # an unreadable folder: a digest no stored entry can match
        h.update(f"\0unreadable {exc!r} {os.getpid()}".encode())
    return h.hexdigest()[:16]


def _write_atomically(path: str, data: bytes) -> bool:
    """Write ``data`` to a temporary file in ``path``'s folder and rename it into place, so
    a reader (or another writer) sees the old file or the new one, never a part."""
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
        return True
    except OSError:
        return False  # a read-only or full disk only costs the work again next time


# Taken with the imports (0.2 ms: a listdir and a stat a source), so that it describes the
# code this process runs.
_DIGEST = _source_stamp_digest(os.path.dirname(os.path.abspath(__file__)))


def _path(key_text: str) -> str:
    """The entry's file: ``key_text`` is ``repr(key)`` (its dataclasses' repr is not free)."""
    digest = hashlib.sha256(f"{VERSION!r} {_code_digest()} {key_text}".encode()).hexdigest()[:32]
    return os.path.join(cache_dir(), f"{digest}.kernel")


# An entry: this tag, the SHA-256 of the rest, then the pickle of (key text, GeneratedCode).
# The digest catches a damaged file (one flipped bit in its code is a wrong result or a
# crash, not an error), so such an entry is generated again instead of run.
_TAG = b"int8jit1"
_HEAD = len(_TAG) + 32


def _read_disk(key: Hashable) -> GeneratedCode | None:
    """The entry for ``key``, or None where there is none, or it is damaged, or it is not
    this user's own file, writable by no one else (the bytes are run as machine code: an
    entry another user could have written is not trusted)."""
    key_text = repr(key)
    try:
        with open(_path(key_text), "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.getuid() or st.st_mode & 0o022:
                return None
            data = f.read()
    except OSError:
        return None
    if len(data) < _HEAD or data[:len(_TAG)] != _TAG or hashlib.sha256(data[_HEAD:]).digest() != data[len(_TAG):_HEAD]:
        return None
    try:
        stored_key, generated = pickle.loads(data[_HEAD:])
    except Exception:  # noqa: BLE001 - an entry of another version of the library: generate again
        return None
    return generated if stored_key == key_text and isinstance(generated, GeneratedCode) else None


def _write_disk(key: Hashable, generated: GeneratedCode) -> None:
    key_text = repr(key)
    body = pickle.dumps((key_text, generated), protocol=pickle.HIGHEST_PROTOCOL)
    data = _TAG + hashlib.sha256(body).digest() + body
    limit = _limit_bytes()  # (checked before anything is written)
    if _write_atomically(_path(key_text), data):
        # Pruning stats every entry (a full 256 MB folder: ~48,000 files, 200 ms), so it
        # runs at random, with odds of the bytes written against 1/16 of the bound: about
        # once per 1/16 of the bound written, by all processes together, whatever their
        # lifetimes (a short process that writes one kernel rarely pays for it).
        if _rng.random() * limit / 16 < len(data):
            with contextlib.suppress(OSError):
                _prune(cache_dir(), limit)


def _limit_bytes() -> float:
    return env_size("INT8JIT_CACHE_MAX_MB", 256, "a number of megabytes, 0 or more") * 2**20


_rng = random.Random()


def _prune(folder: str, limit: float) -> None:
    """Remove the oldest entries until the folder's entries total ``limit`` bytes or less."""
    entries = []
    with os.scandir(folder) as it:
        for entry in it:
            if entry.name.endswith(".kernel"):
                try:
                    st = entry.stat()
                except OSError:
                    continue
                entries.append((st.st_mtime, st.st_size, entry.path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        with contextlib.suppress(OSError):
            os.remove(path)
        total -= size


def get_kernel(key: Hashable, generate: Callable[[], GeneratedCode]) -> Kernel:
    """The kernel for ``key``: from memory, else from disk, else ``generate()`` it."""
    with _lock:
        kernel = _from_caches(key)
        if kernel is None:
            generated = generate()
            stats["generated"] += 1
            if _disk_enabled():
                _write_disk(key, generated)
            kernel = _memory[key] = load(generated)
        return kernel


def cached_kernel(key: Hashable) -> Kernel | None:
    """The kernel for ``key`` from memory or disk, or None: never generated (for what is
    worth having only where it costs nothing to get)."""
    with _lock:
        return _from_caches(key)


def _from_caches(key: Hashable) -> Kernel | None:
    """(``_lock`` held) The kernel for ``key`` from memory, else from disk (then kept in
    memory), or None."""
    kernel = _memory.get(key)
    if kernel is not None and not kernel.closed:
        stats["memory_hits"] += 1
        return kernel
    generated = _read_disk(key) if _disk_enabled() else None
    if generated is None:
        return None
    stats["disk_hits"] += 1
    kernel = _memory[key] = load(generated)
    return kernel


def clear_memory() -> None:
    """Forget every cached kernel of this process. Each is unmapped once nothing holds it:
    a primitive keeps the kernels its call plans point at, so it goes on working (the next
    creation generates, or reads from disk, afresh)."""
    with _lock:
        _memory.clear()
