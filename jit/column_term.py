"""The column term of a compensation, from the column sums a packing kernel just wrote.

A GEMM whose A is s8 (shifted to u8 by +128) or has a zero point ``ao`` adds
``-ao' * colsum(B)[j]`` (ao' = ao, +128 for s8) to every column ``j`` of its product, plus
integer mode's per-column offsets ``co``. With B given at every call those column sums
are new at every call. One call of this kernel per thread, between that thread's packing
call and its product in one hand-off, turns the sums of the columns it packed into the
term its product's output stage reads::

    dst[j] = mul * sums[j] + add[j]        j < n, int32, wrapping modulo 2^32 (VPMULLD, VPADDD)

``n`` is whole 8-column vectors (the GEMM's column tiles are). AVX2 only: every ISA path
has it.

Example::

    >>> import numpy as np
    >>> from runtime.ffi import ffi, pointer_to
    >>> kernel = column_term_kernel()  # (declares the struct)
    >>> sums = np.arange(16, dtype=np.int32); add = np.full(16, 5, np.int32); dst = np.zeros(16, np.int32)
    >>> s = ffi.new("struct i8j_colterm_args *", dict(n=16, mul=-128))
    >>> s.sums, s.add, s.dst = pointer_to(sums), pointer_to(add), pointer_to(dst)
    >>> kernel.function(s)
    >>> dst[:4].tolist()
    [5, -123, -251, -379]
"""
from __future__ import annotations

ARGS_CDEF = """
struct i8j_colterm_args {
    void *sums; void *add; void *dst;   /* int32 */
    int64_t n; int32_t mul;
};
"""
SIGNATURE = "void (*)(struct i8j_colterm_args *)"
FIELDS = ("sums", "add", "dst", "n", "mul")
ISA = "avx2"
LANES = 8


def args_offsets() -> dict[str, int]:
    from runtime.ffi import declare, struct_offsets

    declare(ARGS_CDEF, (SIGNATURE, "struct i8j_colterm_args *"))
    return struct_offsets(ARGS_CDEF, "struct i8j_colterm_args", FIELDS)


args_offsets()  # (at import: a creation parses no C, see runtime.ffi.declare)


def column_term_kernel():
    """The kernel (generated once, then from the caches)."""
    from jit import cache

    return cache.get_kernel(("column_term", ISA), generate)


def generate():
    """Generate the kernel's code (PeachPy); see :func:`column_term_kernel`."""
    from jit import asm
    from jit.build import generate as build

    argument = asm.Argument(asm.ptr(asm.uint8_t), "args")
    return build("column_term", ISA, SIGNATURE, (argument,), lambda: _emit(argument))


def _emit(argument) -> None:
    from jit import asm
    from jit.asm import ADD, JZ, LABEL, MOV, SUB, TEST, Label, rcx, rdi, rdx, rsi, r8

    off = args_offsets()
    A = lambda f: [rdi + off[f]]  # noqa: E731
    mul, v = asm.ymm0, asm.ymm1
    asm.LOAD.ARGUMENT(rdi, argument)
    MOV(rsi, A("sums"))
    MOV(rdx, A("add"))
    MOV(r8, A("dst"))
    MOV(rcx, A("n"))
    asm.VPBROADCASTD(mul, asm.dword[A("mul")[0]])
    vector, done = Label(), Label()
    TEST(rcx, rcx)
    JZ(done)
    LABEL(vector)
    asm.VPMULLD(v, mul, [rsi])
    asm.VPADDD(v, v, [rdx])
    asm.VMOVDQU([r8], v)
    ADD(rsi, 4 * LANES)
    ADD(rdx, 4 * LANES)
    ADD(r8, 4 * LANES)
    SUB(rcx, LANES)
    asm.JNZ(vector)
    LABEL(done)
    asm.VZEROUPPER()
    asm.RETURN()
