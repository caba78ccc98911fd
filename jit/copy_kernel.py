"""A strided row copy: the convolution's padded source copy as one call in a thread's list.

One call copies ``rows`` rows of ``row_bytes`` bytes, ``src_stride`` and ``dst_stride``
bytes apart (the source image's rows into the interior of the padded buffer)::

    for each row:
        32-byte pieces (VMOVDQU ymm), then the last 32 bytes of the row again when the
        row is not a multiple of 32 long (an overlapping piece, no byte past the row);
        rows shorter than 32 bytes go byte by byte

As a kernel call it runs in a thread's call list right before the kernel calls that read
those rows, so a thread copies only what it computes, while the other threads copy
theirs, and the copy is still in L2 when the kernel reads it. AVX2 only: every ISA path
has it.

Example::

    >>> import numpy as np
    >>> from runtime.ffi import ffi, pointer_to
    >>> kernel = copy_kernel()  # (declares the struct)
    >>> src = np.arange(120, dtype=np.uint8).reshape(3, 40); dst = np.zeros((3, 50), np.uint8)
    >>> s = ffi.new("struct i8j_copy_args *", dict(rows=3, row_bytes=40, src_stride=40, dst_stride=50))
    >>> s.src, s.dst = pointer_to(src), pointer_to(dst) + 5
    >>> kernel.function(s)
    >>> bool((dst[:, 5:45] == src).all()) and int(dst[:, :5].sum() + dst[:, 45:].sum())
    0
"""
from __future__ import annotations

ARGS_CDEF = """
struct i8j_copy_args {
    void *src; void *dst;
    int64_t rows; int64_t row_bytes; int64_t src_stride; int64_t dst_stride;
};
"""
SIGNATURE = "void (*)(struct i8j_copy_args *)"
FIELDS = ("src", "dst", "rows", "row_bytes", "src_stride", "dst_stride")
ISA = "avx2"
PIECE = 32


def args_offsets() -> dict[str, int]:
    from runtime.ffi import declare, struct_offsets

    declare(ARGS_CDEF, (SIGNATURE, "struct i8j_copy_args *"))
    return struct_offsets(ARGS_CDEF, "struct i8j_copy_args", FIELDS)


args_offsets()  # (at import: a creation parses no C, see runtime.ffi.declare)


def copy_kernel():
    """The row-copy kernel (generated once, then from the caches)."""
    from jit import cache

    return cache.get_kernel(("copy_rows", ISA), generate)


def generate():
    """Generate the kernel's code (PeachPy); see :func:`copy_kernel`."""
    from jit import asm
    from jit.build import generate as build

    argument = asm.Argument(asm.ptr(asm.uint8_t), "args")
    return build("copy_rows", ISA, SIGNATURE, (argument,), lambda: _emit(argument))


def _emit(argument) -> None:
    from jit import asm
    from jit.asm import (ADD, CMP, DEC, JB, JBE, JNZ, JZ, LABEL, LEA, MOV, MOVZX, TEST, XOR, Label, rax, rcx,
                         rdi, rdx, rsi, r8, r9, r10, r11)

    off = args_offsets()
    A = lambda f: [rdi + off[f]]  # noqa: E731
    v = asm.ymm0
    asm.LOAD.ARGUMENT(rdi, argument)
    MOV(rsi, A("src"))
    MOV(rdx, A("dst"))
    MOV(r8, A("rows"))
    MOV(r9, A("row_bytes"))
    MOV(r10, A("src_stride"))
    MOV(r11, A("dst_stride"))
    done, row, short, short_loop, pieces, next_row = (Label() for _ in range(6))
    TEST(r8, r8)
    JZ(done)
    LABEL(row)
    CMP(r9, PIECE)
    JB(short)
    XOR(rax.as_dword, rax.as_dword)  # offset in the row
    LEA(rcx, [r9 - PIECE])  # the last piece's offset
    LABEL(pieces)
    asm.VMOVDQU(v, [rsi + rax * 1])
    asm.VMOVDQU([rdx + rax * 1], v)
    ADD(rax, PIECE)
    CMP(rax, rcx)
    JBE(pieces)
    CMP(rax, r9)
    JZ(next_row)  # the row was whole pieces
    asm.VMOVDQU(v, [rsi + rcx * 1])  # the row's last 32 bytes, overlapping the piece before
    asm.VMOVDQU([rdx + rcx * 1], v)
    asm.JMP(next_row)
    LABEL(short)
    XOR(rax.as_dword, rax.as_dword)
    TEST(r9, r9)
    JZ(next_row)
    LABEL(short_loop)
    MOVZX(rcx.as_dword, asm.byte[rsi + rax * 1])
    MOV(asm.byte[rdx + rax * 1], rcx.as_low_byte)
    ADD(rax, 1)
    CMP(rax, r9)
    JB(short_loop)
    LABEL(next_row)
    ADD(rsi, r10)
    ADD(rdx, r11)
    DEC(r8)
    JNZ(row)
    LABEL(done)
    asm.VZEROUPPER()
    asm.RETURN()
