"""The demo's dot-product kernel: a 4-element int8 dot product through one ISA path's step.

The kernel computes ``dot(a[0:4], b[0:4]) + comp`` with the dot-product step of
:mod:`jit.dot` of its path, exactly as the GEMM microkernel does, on the path's full
vector width (the four bytes are broadcast to every dword lane; lane 0 is returned):

``vnni``      VPDPBUSD acc, a, b (zmm EVEX on avx512_core_vnni, ymm VEX on avx2_vnni)
``maddubsw``  VPMADDUBSW t, a, b; VPMADDWD t, t, ones; VPADDD acc, acc, t
``widen``     VPMOVZXBW a / VPMOVSXBW b, then twice VPMADDWD t, a_pair, b_pair;
              VPADDD acc, acc, t

A u8 source is used as is. An s8 source is shifted to u8 by ``xor 0x80`` (+128) inside
the kernel and the caller passes the compensation ``comp = -128 * sum(b)``, as the GEMM
reorder precomputes it. Signature::

    void (*)(const uint8_t *a, const int8_t *b, int32_t comp, int32_t *out)

Example::

    >>> from jit.demo_kernel import dot4
    >>> from runtime.isa import cpu_supports
    >>> dot4("avx2", [255, 255, 0, 0], [127, 127, 0, 0]) if cpu_supports("avx2") else 32767
    32767
"""
from __future__ import annotations

from typing import Sequence

from jit.dot import Path, emit_bytes, emit_ones_s16, emit_step, path_for, vector_register
from runtime.isa import REQUIRES, check_name, cpu_supports

SIGNATURE = "void (*)(const uint8_t *, const int8_t *, int32_t, int32_t *)"


def instruction_sequence(path: Path) -> str:
    """The instructions the path's step executes, for people."""
    reg = "zmm" if path.bits == 512 else "ymm"
    if path.kind == "vnni":
        return f"VPDPBUSD {reg} ({'VEX' if path.vex else 'EVEX'})"
    if path.kind == "maddubsw":
        return f"VPMADDUBSW+VPMADDWD+VPADDD {reg}"
    return f"VPMOVZXBW/VPMOVSXBW, 2x VPMADDWD+VPADDD {reg}"


def _emit(path: Path, s8_src: bool, arguments) -> None:
    from jit import asm

    a_ptr, b_ptr, comp, out = asm.rdi, asm.rsi, asm.rdx, asm.rcx
    for register, argument in zip((a_ptr, b_ptr, comp, out), arguments):
        asm.LOAD.ARGUMENT(register, argument)
    V = lambda i: vector_register(path, i)  # noqa: E731
    acc, a, b, tmp, ones, x80, a23, b23 = (V(i) for i in range(8))
    vxor = asm.VPXORD if path.bits == 512 else asm.VPXOR

    vxor(acc, acc, acc)
    if s8_src:
        emit_bytes(path, x80, 0x80, asm.rax)
    if path.kind == "widen":
        asm.VMOVD(a.as_xmm, asm.dword[a_ptr])
        if s8_src:
            asm.VPXOR(a.as_xmm, a.as_xmm, x80.as_xmm)
        asm.VPMOVZXBW(a.as_xmm, a.as_xmm)  # s16 a0 a1 a2 a3
        asm.VMOVD(b.as_xmm, asm.dword[b_ptr])
        asm.VPMOVSXBW(b.as_xmm, b.as_xmm)  # s16 b0 b1 b2 b3
        asm.VPSHUFD(a23.as_xmm, a.as_xmm, 0x55)
        asm.VPSHUFD(b23.as_xmm, b.as_xmm, 0x55)
        for r in (a, b, a23, b23):
            asm.VPBROADCASTD(r, r.as_xmm)
        emit_step(path, acc, a, b, tmp)
        emit_step(path, acc, a23, b23, tmp)
    else:
        asm.VPBROADCASTD(a, asm.dword[a_ptr])
        asm.VPBROADCASTD(b, asm.dword[b_ptr])
        if s8_src:
            vxor(a, a, x80)
        if path.kind == "maddubsw":
            emit_ones_s16(path, ones, asm.rax)
        emit_step(path, acc, a, b, tmp, ones)
    asm.VMOVD(asm.eax, acc.as_xmm)
    asm.ADD(asm.eax, comp.as_dword)
    asm.MOV(asm.dword[out], asm.eax)
    asm.RETURN()


def _generate(path: Path, s8_src: bool):
    from jit import asm
    from jit.build import generate

    arguments = (
        asm.Argument(asm.ptr(asm.const_uint8_t), "a"),
        asm.Argument(asm.ptr(asm.const_int8_t), "b"),
        asm.Argument(asm.int32_t, "comp"),
        asm.Argument(asm.ptr(asm.int32_t), "out"),
    )
    name = f"demo_dot4_{'s8' if s8_src else 'u8'}s8_{path.isa}_{path.kind}"
    return generate(name, path.isa, SIGNATURE, arguments, lambda: _emit(path, s8_src, arguments),
                    meta={"path": path.name, "s8_src": s8_src})


def demo_kernel(isa: str, kind: str | None = None, s8_src: bool = False):
    """The demo kernel of ``isa``/``kind`` for u8 (or s8) sources, cached.

    Generating and mapping it needs no CPU support; only calling it does.
    """
    from jit.cache import get_kernel

    path = path_for(isa, kind)
    return get_kernel(("demo_dot4", path, bool(s8_src)), lambda: _generate(path, bool(s8_src)))


def dot4(isa: str, a: Sequence[int], b: Sequence[int], kind: str | None = None, s8_src: bool = False) -> int:
    """Run the demo kernel on four ``a`` values (u8, or s8 with ``s8_src``) and four s8 ``b``.

    Raises :class:`RuntimeError` where the CPU cannot execute ``isa``.
    """
    from runtime.ffi import ffi

    isa = check_name(isa)
    if len(a) != 4 or len(b) != 4:
        raise ValueError(f"a, b: expected 4 values each, got {len(a)} and {len(b)}")
    lo, hi = (-128, 127) if s8_src else (0, 255)
    for name, values, (vlo, vhi) in (("a", a, (lo, hi)), ("b", b, (-128, 127))):
        bad = [v for v in values if not vlo <= int(v) <= vhi]
        if bad:
            raise ValueError(f"{name}: values {bad} outside [{vlo}, {vhi}]")
    if not cpu_supports(isa):
        raise RuntimeError(f"{isa}: this CPU cannot execute it (needs {', '.join(f.upper() for f in REQUIRES[isa])})")
    kernel = demo_kernel(isa, kind, s8_src)
    a_buf = ffi.new("uint8_t[4]", [int(v) & 0xFF for v in a])
    b_buf = ffi.new("int8_t[4]", [int(v) for v in b])
    out = ffi.new("int32_t *")
    comp = -128 * sum(int(v) for v in b) if s8_src else 0
    kernel(a_buf, b_buf, comp, out)
    return int(out[0])
