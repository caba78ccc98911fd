"""The one cffi FFI object of the process (ABI mode: no C compiler at run time).

Every C type that a kernel signature or an argument struct names is declared here
through :func:`declare`, so function pointers and structs all live in one FFI.
"""
from __future__ import annotations

import functools
import threading

import cffi
import numpy as np

ffi = cffi.FFI()
ffi.cdef(
    """
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset);
    int mprotect(void *addr, size_t len, int prot);
    int munmap(void *addr, size_t length);
    long sysconf(int name);
    void *memcpy(void *dest, const void *src, size_t n);
    """
)
libc = ffi.dlopen(None)

_declared: set[str] = set()
_lock = threading.Lock()


def declare(cdef: str, types: tuple[str, ...] = ()) -> None:
    """Declare C types once per process (re-declaring the same text is a no-op).

    ``types``: C types to parse now (at import): kernel function-pointer types, and the
    argument structs and arrays that executions allocate. cffi parses a type string with
    pycparser the first time it meets it (0.4-1 ms each) and keeps the result; parsed
    here, neither a process's first creation nor its first execution pays it. So each
    module declares its structs at import (a kernel module's ``args_offsets()``): the
    re-pointing struct, declared when its kernel was first asked for, was 1.3 ms of an
    inner product's 1.8 ms creation from the disk cache.
    """
    with _lock:
        if cdef not in _declared:
            ffi.cdef(cdef)
            _declared.add(cdef)
    for text in types:
        ffi.typeof(text)  # cffi keeps the parsed type


# The plain pointer types that executions cast to (execmem, pointer_to, conv's offsets,
# reorder's tables), parsed now for the same reason.
for _text in ("void *", "char *", "uintptr_t", "int64_t *", "float *"):
    ffi.typeof(_text)


@functools.lru_cache(maxsize=None)
def struct_offsets(cdef: str, struct: str, fields: tuple[str, ...]) -> dict[str, int]:
    """Declare ``cdef`` and return the byte offsets of ``fields`` in ``struct`` (a kernel's
    argument struct, as its template addresses them). Once per process: cffi's
    ``offsetof`` costs about 1 ms a struct. The dict is shared: read it, do not change it.
    """
    declare(cdef)
    return {field: ffi.offsetof(struct, field) for field in fields}


def pointer_to(array):
    """A ``void *``-compatible cdata for a numpy array's first element (no copy).

    A contiguous array takes :func:`dense_pointer`, the fast route (about 0.2 us); other
    arrays (a transposed view, rows with gaps) take their address from ``ctypes``,
    without waiting for from_buffer to refuse them (0.9 us, not 1.8).
    """
    flags = getattr(array, "flags", None)
    if flags is not None and not flags.c_contiguous:
        return ffi.cast("char *", array.ctypes.data)
    try:
        return _raw_from_buffer(_CHAR_ARRAY, array, False)  # (dense_pointer's body: a call less)
    except (TypeError, BufferError, ValueError):
        return ffi.cast("char *", array.__array_interface__["data"][0])


def dense_pointer(array):
    """:func:`pointer_to` for an array known to be C-contiguous (a caller's dense tensor,
    as its descriptor required), without the test: cffi's ``from_buffer`` as
    ``ffi.from_buffer(array)`` calls it, less that Python wrapper, which only fills in
    the type (0.15 us, not 0.2). An array with gaps raises (cffi: a buffer has no gaps)."""
    return _raw_from_buffer(_CHAR_ARRAY, array, False)


_CHAR_ARRAY = ffi.typeof("char[]")  # (ffi.from_buffer's default type)
try:
    _raw_from_buffer = ffi._backend.from_buffer
except AttributeError:  # pragma: no cover - a cffi without it: the public function, which takes the same arguments
    _raw_from_buffer = ffi.from_buffer


def address_of(array):
    """:func:`pointer_to` that does not keep ``array`` alive: a ``char *`` to keep beside a
    kernel's structs (which hold bare addresses too), e.g. to tell whether the next call's
    array starts at the same place."""
    return pointer_to(array) + 0  # (a new pointer: it owns nothing; half what ffi.cast costs)


def unowned(array):
    """An ndarray of ``array``'s shape, dtype and strides over the same memory that does
    not keep ``array`` (or what it views) alive: what a primitive keeps of a caller's
    tensor between calls, so that a replay never holds the caller's memory (it runs only
    on arrays its test found alive, see ``primitives.replay.Replay``). About 1 us.

    Example::

        >>> import numpy as np
        >>> x = np.zeros((2, 3), np.int32)
        >>> u = unowned(x.T)
        >>> u[2, 1] = 7
        >>> int(x[1, 2]), u.shape, u.base is x
        (7, (3, 2), False)
    """
    if array.size == 0:
        return np.empty_like(array)  # (no memory to share: nothing to keep)
    if array.flags.c_contiguous and array.flags.writeable:  # (the common case: about 0.9 us)
        return np.ndarray(array.shape, array.dtype, ffi.buffer(address_of(array), array.nbytes))
    # From the lowest byte any element has to the highest (a contiguous array: its bytes).
    low = sum((n - 1) * s for n, s in zip(array.shape, array.strides) if s < 0)
    high = sum((n - 1) * s for n, s in zip(array.shape, array.strides) if s > 0)
    buffer = ffi.buffer(address_of(array) + low, high - low + array.itemsize)
    view = np.ndarray(array.shape, array.dtype, buffer, -low, array.strides)
    view.flags.writeable = array.flags.writeable
    return view
