"""jit.repoint: the kernel that writes a moved replay's struct fields from a table.

Its model is one line of Python per entry: ``field = bases[base] + offset``. The
property test holds the kernel to it over random tables (fields of several structs,
some left out, which must keep their values), with the table and the fields flush
against guard pages; the replays that use it are tested in tests/test_replay.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jit.repoint import Repoints
from runtime.ffi import ffi, pointer_to
from tests.conftest import GuardedBuffer


@settings(max_examples=60, deadline=None)
@given(structs=st.integers(1, 20), bases=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_repoint_writes_each_field_of_its_table(structs, bases, seed):
    """Each entry's field becomes its base's address plus its offset; every other field
    keeps its value; the fields and the table sit flush against guard pages (after, then
    before): the kernel touches nothing else."""
    rng = np.random.default_rng(seed)
    width = 6  # int64 fields a struct
    chosen = rng.random(structs * width) < 0.5
    where_base = rng.integers(0, bases, structs * width)
    offsets = rng.integers(-2**20, 2**20, structs * width)
    arrays = [np.zeros(int(rng.integers(1, 64)), np.uint8) for _ in range(bases)]
    for where in ("end", "start"):
        fields = GuardedBuffer(structs * width, np.int64, where)
        try:
            before = rng.integers(-2**62, 2**62, structs * width)
            fields.array[:] = before
            base = pointer_to(fields.array)
            entries = [(ffi.cast("char *", base) + 8 * i, int(where_base[i]), int(offsets[i]))
                       for i in np.flatnonzero(chosen)]
            points = Repoints(entries, bases, keep=fields)
            table = GuardedBuffer(points._table.size, np.int64, where)  # (the kernel's table, moved to a guarded one)
            try:
                table.array[:] = points._table.reshape(-1)
                points._args.table = ffi.cast("int64_t *", pointer_to(table.array))
                points(*(ffi.from_buffer(a) for a in arrays))
                want = before.copy()
                addresses = np.array([a.ctypes.data for a in arrays], np.int64)
                want[chosen] = addresses[where_base[chosen]] + offsets[chosen]
                np.testing.assert_array_equal(fields.array, want)
            finally:
                table.close()
        finally:
            fields.close()


def test_an_empty_table_writes_nothing():
    field = ffi.new("int64_t[1]", [7])
    points = Repoints([], 2, keep=field)
    points(ffi.NULL, ffi.NULL)
    assert field[0] == 7 and points.count == 0


def test_a_base_outside_the_list_is_refused():
    field = ffi.new("int64_t[1]")
    with pytest.raises(ValueError, match="entries: a base index outside 0..1"):
        Repoints([(ffi.addressof(field, 0), 2, 0)], 2, keep=field)


def test_a_call_takes_every_base():
    """A call with fewer bases than the table was made for is refused (none left stale)."""
    field = ffi.new("int64_t[1]", [7])
    points = Repoints([(ffi.addressof(field, 0), 1, 0)], 2, keep=field)
    with pytest.raises((ValueError, IndexError)):
        points(ffi.NULL)
    assert field[0] == 7


def test_dump_asm_lists_the_repoint_kernel():
    import io

    from tools.dump_asm import run

    out = io.StringIO()
    assert run(["repoint"], out) == 0
    text = out.getvalue()
    assert "repoint [avx2]" in text and "mov [r8],r9" in text and "add r9,[rsi+10h]" in text


def test_repointer_writes_named_fields_from_its_first_call():
    """repointer's function writes struct fields by name (the table made at its first
    call, then kept): each field its base's address plus its offset, again at a second
    call with other bases."""
    from jit.repoint import repoint_kernel, repointer

    repoint_kernel()  # (declares the struct used as a stand-in here)
    structs = [ffi.new("struct i8j_repoint_args *") for _ in range(3)]
    write = repointer([(s, field, i % 2, 8 * i) for i, s in enumerate(structs) for field in ("table", "bases")], 2)
    for _ in range(2):
        arrays = [np.zeros(16, np.int64), np.zeros(16, np.int64)]
        write(*(ffi.from_buffer(a) for a in arrays))
        for i, s in enumerate(structs):
            for field in ("table", "bases"):
                assert int(ffi.cast("intptr_t", getattr(s, field))) == arrays[i % 2].ctypes.data + 8 * i
