"""The guard: a replay's test of a call's arrays and its move to them, in one kernel call.

A replay (``primitives.replay.Replay``) runs again when a call passes arrays laid out as
the ones its set-up pointed the kernels' structs at; new arrays of that layout only need
the structs' addresses written anew (``jit.repoint``). Tested in Python, that costs 3-4 us
a call of seven arguments (each array's type, shape, dtype, strides, writability, the
small arguments' values, the outputs' overlaps, then the addresses). This kernel does all
of it from a table made at set-up, reading each array's fields where CPython and numpy
keep them: the call passes a tuple of the arguments, by address (``id``)::

    for each check:    item = tuple[pos]; item is an exact ndarray with the recorded dtype
                       object, ndim, shape and strides (and writable, for an output; and
                       the recorded bytes, for a value read at set-up); data[pos] = its data
    for each pair:     the extents (data + lo .. data + hi) of two arguments are disjoint
    for each point:    *(int64 *) where = data[pos] + offset
    return 1           (0, with nothing written, as soon as one test fails)

Those fields (``PyObject``'s type, ``PyTupleObject``'s items, numpy's
``PyArrayObject_fields``: data, nd, dimensions, strides, descr, flags) are a stable C ABI
of both projects, and :func:`layout_ok` confirms them on live objects once per process
before any guard is made: elsewhere (another Python implementation, a free-threaded or
debug build that moves the header) there are no guards, and replays test in Python.
Scalar x86-64 only: every ISA path has it.

Example, a dst that must be a writable 2 x 3 int32 array, its address written into a field::

    >>> import numpy as np
    >>> from runtime.ffi import ffi
    >>> field = ffi.new("int64_t[1]")
    >>> like = np.zeros((2, 3), np.int32)
    >>> guard = Guard(1, [(0, like, True, None)], [], [(ffi.addressof(field, 0), 0, 4)], keep=field) \\
    ...     if layout_ok() else None
    >>> y = np.ones((2, 3), np.int32)
    >>> guard is None or (guard((y,)) and field[0] == y.ctypes.data + 4)
    True
    >>> guard is None or guard((y.T,)) or guard((y[None],)) or guard((y.astype(np.int64),))
    False
"""
from __future__ import annotations

import functools
import sys

ARGS_CDEF = """
struct i8j_guard_args {
    const int64_t *checks;     /* records of 7 + 2 * ndim int64, see Guard */
    int64_t n_checks;
    const int64_t *pairs;      /* pos, lo, hi of one extent, then of the other */
    int64_t n_pairs;
    const int64_t *points;     /* where, pos, offset */
    int64_t n_points;
    int64_t *data;             /* per position: the item's data; the last is 0 */
};
"""
SIGNATURE = "int64_t (*)(struct i8j_guard_args *, intptr_t)"
FIELDS = ("checks", "n_checks", "pairs", "n_pairs", "points", "n_points", "data")
ISA = "avx2"
CHECK_HEADER = 7  # pos, type, descr, ndim, required flags, values' address, values' bytes

# Offsets in CPython's objects (PyObject_HEAD: refcount, type) and numpy's
# PyArrayObject_fields; layout_ok() confirms each before a guard reads them.
_TYPE, _ITEMS = 8, 24
_DATA, _NDIM, _DIMS, _STRIDES, _DESCR, _FLAGS = 16, 24, 32, 40, 56, 64
WRITEABLE = 0x0400  # NPY_ARRAY_WRITEABLE


def args_offsets() -> dict[str, int]:
    from runtime.ffi import declare, struct_offsets

    declare(ARGS_CDEF, (SIGNATURE, "struct i8j_guard_args *", "intptr_t", "int32_t *"))
    return struct_offsets(ARGS_CDEF, "struct i8j_guard_args", FIELDS)


args_offsets()  # (at import: a creation parses no C, see runtime.ffi.declare)


@functools.lru_cache(maxsize=None)
def layout_ok() -> bool:
    """Whether this process's objects are laid out as the kernel reads them: CPython
    (where ``id`` is the object's address), tuples' items and ndarrays' fields at the
    offsets above, checked on live objects (reading within each object's own size)."""
    if sys.implementation.name != "cpython" or hasattr(sys, "gettotalrefcount"):  # (a debug build's header)
        return False
    import numpy as np
    from runtime.ffi import ffi

    if np.ndarray.__basicsize__ < _FLAGS + 4 or tuple.__basicsize__ != _ITEMS or tuple.__itemsize__ != 8:
        return False
    base = np.zeros((3, 10), np.int16)
    x, frozen = base[1:, ::3], base.T
    frozen.flags.writeable = False
    items = (x, frozen, None, 7, base, x, x, x)
    word = ffi.cast("int64_t *", id(items))
    if word[_TYPE // 8] != id(tuple) or any(word[_ITEMS // 8 + i] != id(v) for i, v in enumerate(items)):
        return False
    for a in (x, frozen):
        word, half = ffi.cast("int64_t *", id(a)), ffi.cast("int32_t *", id(a))
        dims, strides = ffi.cast("int64_t *", word[_DIMS // 8]), ffi.cast("int64_t *", word[_STRIDES // 8])
        if word[_TYPE // 8] != id(np.ndarray) or word[_DATA // 8] != a.ctypes.data or half[_NDIM // 4] != a.ndim \
                or word[_DESCR // 8] != id(a.dtype) or half[_FLAGS // 4] != a.flags.num \
                or bool(half[_FLAGS // 4] & WRITEABLE) != a.flags.writeable \
                or tuple(dims[0:a.ndim]) != a.shape or tuple(strides[0:a.ndim]) != a.strides:
            return False
    return True


def guard_kernel():
    """The kernel (generated once, then from the caches). The primitives whose replays
    move ask for it when they are created, so that no execution makes it."""
    from jit import cache

    return cache.get_kernel(("guard", ISA), generate)


def extent(array) -> tuple[int, int] | None:
    """The bytes ``array``'s elements span, as offsets from its first element's address
    (numpy's ``may_share_memory`` bounds): ``(lo, hi)``, or None for an empty array."""
    if array.size == 0:
        return None
    lo = sum(min(0, (n - 1) * s) for n, s in zip(array.shape, array.strides))
    hi = sum(max(0, (n - 1) * s) for n, s in zip(array.shape, array.strides))
    return lo, hi + array.itemsize


class Guard:
    """A table for :func:`guard_kernel`; ``guard(items)`` runs it on a tuple of the call's
    arguments (:attr:`function` and :attr:`args` are what a generated caller passes
    ``id(items)`` with): True where every test held and the fields are written.

    ``count``: the tuple's length. ``checks``: (position, the array as recorded, must be
    writable, its bytes where the values must stay, else None): the item must be an exact
    ndarray with that array's dtype object, shape and strides. ``pairs``: ((position or
    None, array), (position or None, array)) whose extents must be disjoint: a position's
    data (a checked one) plus the array's extent, or, with None, the array's own bytes (a
    held one). ``points``: (the field, as a cdata pointer to it or its address; the
    position whose data it takes; the offset). ``keep``: what holds the fields.
    """

    def __init__(self, count: int, checks: list, pairs: list, points: list, keep=None) -> None:
        import numpy as np
        from runtime.ffi import ffi

        if not layout_ok():
            raise RuntimeError("internal: no guards in this process (layout_ok() is False)")
        checked = {pos for pos, *_ in checks}
        records, values = [], []
        for pos, like, writable, value in checks:
            if not 0 <= pos < count or type(like) is not np.ndarray:
                raise ValueError(f"checks: position {pos} outside 0..{count - 1}, or not an ndarray")
            address = size = 0
            if value is not None:  # (compared byte for byte: a dense array's own order)
                if not like.flags.c_contiguous or len(value) != like.nbytes:
                    raise ValueError("checks: a value compared in place must be a dense array's bytes")
                held = np.frombuffer(value, np.uint8).copy()
                values.append(held)
                address, size = held.ctypes.data, held.size
            records += [pos, id(np.ndarray), id(like.dtype), like.ndim, WRITEABLE if writable else 0, address, size,
                        *like.shape, *like.strides]
        table, spans = [], {}  # (an argument's extent once: it is in a pair with each output)
        for sides in pairs:
            ends = []
            for pos, array in sides:
                span = spans.get(id(array), ())
                if span == ():
                    span = spans[id(array)] = extent(array)
                if span is None:
                    break
                if pos is None:  # (a held array: its own bytes, from the zero in data[count])
                    ends += [count, array.ctypes.data + span[0], array.ctypes.data + span[1]]
                elif pos in checked:
                    ends += [pos, *span]
                else:
                    raise ValueError(f"pairs: position {pos} is not checked")
            if len(ends) == 6:
                table += ends
        wheres = []
        for where, pos, offset in points:
            if pos not in checked:
                raise ValueError(f"points: position {pos} is not checked")
            wheres += [int(ffi.cast("intptr_t", where)), pos, offset]
        self._tables = [np.array(t or [0], np.int64) for t in (records, table, wheres)]
        self._data = np.zeros(count + 1, np.int64)
        self._keep, self._values, self._dtypes = keep, values, [like.dtype for _, like, _, _ in checks]
        self._code = guard_kernel()  # (held: its code stays mapped while the table may run)
        self.args = args = ffi.new("struct i8j_guard_args *")
        args.checks, args.pairs, args.points = (ffi.cast("int64_t *", t.ctypes.data) for t in self._tables)
        args.n_checks, args.n_pairs, args.n_points = len(checks), len(table) // 6, len(wheres) // 3
        args.data = ffi.cast("int64_t *", self._data.ctypes.data)
        self.function = self._code.function

    def __call__(self, items: tuple) -> bool:
        return bool(self.function(self.args, id(items)))


def generate():
    """Generate the kernel's code (PeachPy); see :func:`guard_kernel`."""
    from jit import asm
    from jit.build import generate as build

    arguments = (asm.Argument(asm.ptr(asm.uint8_t), "args"), asm.Argument(asm.ptr(asm.uint8_t), "items"))
    return build("guard", ISA, SIGNATURE, arguments, lambda: _emit(*arguments))


def _emit(argument, items) -> None:
    from jit import asm
    from jit.asm import (ADD, AND, CMP, JAE, JB, JMP, JNE, JNZ, JZ, LABEL, LEA, MOV, MOVSXD, MOVZX, SHL, SUB, TEST,
                         XOR, Label, bl, byte, dword, eax, ebx, r8, r9, r9d, r10, r11, r12, r13, rax, rbx, rcx, rdi,
                         rdx, rsi)
    from jit.repoint import emit_writes

    off = args_offsets()
    asm.LOAD.ARGUMENT(rdi, argument)
    asm.LOAD.ARGUMENT(rsi, items)
    fail, done = Label(), Label()
    MOV(rdx, [rdi + off["data"]])

    # The checks: r10 walks the records, rcx counts them.
    MOV(r10, [rdi + off["checks"]])
    MOV(rcx, [rdi + off["n_checks"]])
    checks_done = Label()
    TEST(rcx, rcx)
    JZ(checks_done)
    check = Label()
    LABEL(check)
    MOV(r8, [r10])  # its position in the tuple
    MOV(rax, [rsi + r8 * 8 + _ITEMS])  # the item
    MOV(r9, [rax + _TYPE])
    CMP(r9, [r10 + 8])
    JNE(fail)  # not an exact ndarray (read no further: it may be any object)
    MOV(r9, [rax + _DESCR])
    CMP(r9, [r10 + 16])
    JNE(fail)
    MOVSXD(r9, dword[rax + _NDIM])
    CMP(r9, [r10 + 24])
    JNE(fail)
    MOV(r9d, dword[rax + _FLAGS])
    AND(r9, [r10 + 32])
    CMP(r9, [r10 + 32])
    JNE(fail)  # (an output that is read-only)
    MOV(r11, [rax + _DATA])
    MOV([rdx + r8 * 8], r11)
    # Shape and strides: r12 counts the dimensions, r13 = ndim * 8 (the recorded strides
    # follow the recorded shape), r11 walks the recorded shape.
    MOV(r12, [r10 + 24])
    MOV(r13, r12)
    SHL(r13, 3)
    MOV(r8, [rax + _DIMS])
    MOV(r9, [rax + _STRIDES])
    LEA(r11, [r10 + 8 * CHECK_HEADER])
    shaped = Label()
    TEST(r12, r12)
    JZ(shaped)
    dim = Label()
    LABEL(dim)
    MOV(rbx, [r8])
    CMP(rbx, [r11])
    JNE(fail)
    MOV(rbx, [r9])
    CMP(rbx, [r11 + r13 * 1])
    JNE(fail)
    ADD(r8, 8)
    ADD(r9, 8)
    ADD(r11, 8)
    SUB(r12, 1)
    JNZ(dim)
    LABEL(shaped)
    # Values read at set-up: the item's bytes equal the recorded ones (a dense array: its
    # strides are the recorded dense ones), eight at a time, then one at a time.
    MOV(r12, [r10 + 48])
    valued = Label()
    TEST(r12, r12)
    JZ(valued)
    MOV(r8, [rax + _DATA])
    MOV(r9, [r10 + 40])
    words, word, tail, one = Label(), Label(), Label(), Label()
    LABEL(words)
    CMP(r12, 8)
    JB(tail)
    LABEL(word)
    MOV(rbx, [r8])
    CMP(rbx, [r9])
    JNE(fail)
    ADD(r8, 8)
    ADD(r9, 8)
    SUB(r12, 8)
    JMP(words)
    LABEL(tail)
    TEST(r12, r12)
    JZ(valued)
    LABEL(one)
    MOVZX(ebx, byte[r8])
    CMP(bl, byte[r9])
    JNE(fail)
    ADD(r8, 1)
    ADD(r9, 1)
    SUB(r12, 1)
    JNZ(one)
    LABEL(valued)
    LEA(r10, [r11 + r13 * 1])  # the next record: past the recorded strides
    SUB(rcx, 1)
    JNZ(check)
    LABEL(checks_done)

    # The pairs: two extents that must not overlap (addresses compare unsigned).
    MOV(r10, [rdi + off["pairs"]])
    MOV(rcx, [rdi + off["n_pairs"]])
    pairs_done, pair, apart = Label(), Label(), Label()
    TEST(rcx, rcx)
    JZ(pairs_done)
    LABEL(pair)
    MOV(r8, [r10])
    MOV(rax, [rdx + r8 * 8])
    MOV(r8, rax)
    ADD(r8, [r10 + 8])  # a's first byte
    ADD(rax, [r10 + 16])  # a's end
    MOV(r9, [r10 + 24])
    MOV(rbx, [rdx + r9 * 8])
    MOV(r9, rbx)
    ADD(r9, [r10 + 32])  # b's first byte
    ADD(rbx, [r10 + 40])  # b's end
    CMP(r8, rbx)
    JAE(apart)
    CMP(r9, rax)
    JB(fail)
    LABEL(apart)
    ADD(r10, 48)
    SUB(rcx, 1)
    JNZ(pair)
    LABEL(pairs_done)

    # Every test held: the fields, as jit.repoint writes them (the items' data for bases).
    MOV(r10, [rdi + off["points"]])
    MOV(rcx, [rdi + off["n_points"]])
    emit_writes(r10, rcx, rdx)
    MOV(eax, 1)
    JMP(done)
    LABEL(fail)
    XOR(eax, eax)
    LABEL(done)
    asm.RETURN()
