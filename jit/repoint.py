"""Re-pointing: the addresses a replay moved to new arrays writes into its kernels' structs.

A replay's structs hold the addresses of the arrays its set-up was given (each struct's
A and dst, a packing call's source), at fixed offsets past each array's first byte.
New arrays of the same layouts (``primitives.replay.Replay.moves``) change only those first
bytes. One call of this kernel writes every such field from a table made at set-up::

    *(int64 *) where[i] = bases[base[i]] + offset[i]        i < n

where ``table`` holds (where, base, offset) as three int64 per entry and ``bases`` the
arrays' new first bytes. In Python each field costs about 0.25 us (12 attention heads'
structs: 3 us a call); this is one cffi call for all of them. Scalar x86-64 only: every
ISA path has it.

Example::

    >>> import numpy as np
    >>> from runtime.ffi import ffi
    >>> fields = ffi.new("int64_t[2]")                     # two fields of a struct
    >>> points = Repoints([(ffi.addressof(fields, 0), 0, 8), (ffi.addressof(fields, 1), 1, 0)], 2, keep=fields)
    >>> a, c = np.zeros(4, np.int64), np.zeros(4, np.int64)
    >>> points(ffi.from_buffer(a), ffi.from_buffer(c))
    >>> fields[0] - a.ctypes.data, fields[1] - c.ctypes.data
    (8, 0)
"""
from __future__ import annotations

ARGS_CDEF = """
struct i8j_repoint_args {
    const int64_t *table;   /* n entries: where, base, offset */
    const int64_t *bases;
    int64_t n;
};
"""
SIGNATURE = "void (*)(struct i8j_repoint_args *)"
FIELDS = ("table", "bases", "n")
ISA = "avx2"


def args_offsets() -> dict[str, int]:
    from runtime.ffi import declare, struct_offsets

    # (and the types a table's set-up casts to: a first execution parses none)
    declare(ARGS_CDEF, (SIGNATURE, "struct i8j_repoint_args *", "char *[]", "int64_t *", "intptr_t"))
    return struct_offsets(ARGS_CDEF, "struct i8j_repoint_args", FIELDS)


args_offsets()  # (at import: a creation parses no C, see runtime.ffi.declare)


def repoint_kernel():
    """The kernel (generated once, then from the caches). The primitives whose replays
    move ask for it when they are created, so that no execution makes it."""
    from jit import cache

    return cache.get_kernel(("repoint", ISA), generate)


class Repoints:
    """Fields of kernel structs that point into a call's arrays, as a table for
    :func:`repoint_kernel`: ``entries`` are (the field, as a cdata pointer to it, or its
    address; which base; the offset past that base's first byte). ``keep``: what holds
    the fields (their structs), kept alive with the table. A call with ``bases`` (cdata
    pointers, one per base, in order) writes every field; so does :attr:`write`, a plain
    function (a little faster: no method lookup)."""

    def __init__(self, entries: list, bases: int, keep=None) -> None:
        import numpy as np
        from runtime.ffi import ffi

        table = np.array([(int(ffi.cast("intptr_t", where)), base, offset) for where, base, offset in entries],
                         np.int64).reshape(-1, 3)
        if table.size and (table[:, 1].min() < 0 or table[:, 1].max() >= bases):
            raise ValueError(f"entries: a base index outside 0..{bases - 1}")
        self._code = repoint_kernel()  # (held: its code stays mapped while the table may run)
        self._table, self._keep = table, keep
        self._bases = into = ffi.new("char *[]", max(bases, 1))
        self._args = args = ffi.new("struct i8j_repoint_args *", dict(n=len(table)))
        args.table = ffi.cast("int64_t *", ffi.from_buffer(table))
        args.bases = ffi.cast("int64_t *", into)
        self.count = len(table)
        function, count = self._code.function, max(bases, 1)

        def write(*new) -> None:  # (the table, through self, lives as long as this)
            into[0:count] = new  # (cffi refuses another count of bases: none is left stale)
            function(args)
        write.table = self
        self.write = write

    def __call__(self, *bases) -> None:
        self.write(*bases)


def repointer(entries: list, bases: int):
    """A function of ``bases`` cdata pointers that writes each field of ``entries``,
    (struct, field name, which base, offset): ``struct.field = bases[base] + offset``, in
    one kernel call (about 0.3 us: as fast as Python's assignments to one struct's two
    fields, and 0.25 us less per struct after that). The table is made at the first call
    (10-15 us: a set-up whose replay never moves does not pay for it)."""
    write = None

    def first_then_write(*new) -> None:
        nonlocal write
        if write is None:
            from runtime.ffi import ffi

            write = Repoints([(ffi.addressof(struct, field), base, offset)
                              for struct, field, base, offset in entries],
                             bases, keep=[entry[0] for entry in entries]).write
        write(*new)
    return first_then_write


def generate():
    """Generate the kernel's code (PeachPy); see :func:`repoint_kernel`."""
    from jit import asm
    from jit.build import generate as build

    argument = asm.Argument(asm.ptr(asm.uint8_t), "args")
    return build("repoint", ISA, SIGNATURE, (argument,), lambda: _emit(argument))


def _emit(argument) -> None:
    from jit import asm
    from jit.asm import MOV, rcx, rdi, rdx, rsi

    off = args_offsets()
    asm.LOAD.ARGUMENT(rdi, argument)
    MOV(rsi, [rdi + off["table"]])
    MOV(rdx, [rdi + off["bases"]])
    MOV(rcx, [rdi + off["n"]])
    emit_writes(rsi, rcx, rdx)
    asm.RETURN()


def emit_writes(table, count, bases) -> None:
    """The loop both this kernel and ``jit.guard``'s end with: ``count`` entries (where,
    which base, offset) from ``table``, each ``*where = bases[base] + offset``; it uses
    r8 and r9, and leaves ``table`` past the last entry and ``count`` at 0."""
    from jit.asm import ADD, JNZ, JZ, LABEL, MOV, SUB, TEST, Label, r8, r9

    entry, done = Label(), Label()
    TEST(count, count)
    JZ(done)
    LABEL(entry)
    MOV(r8, [table])  # where
    MOV(r9, [table + 8])  # which base
    MOV(r9, [bases + r9 * 8])
    ADD(r9, [table + 16])  # + the offset
    MOV([r8], r9)
    ADD(table, 24)
    SUB(count, 1)
    JNZ(entry)
    LABEL(done)
