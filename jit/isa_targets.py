"""PeachPy targets per ISA path, so a template cannot emit an instruction its path lacks."""
from __future__ import annotations

from runtime.isa import check_name


def extensions_for(isa_name: str) -> list:
    """The ISA extensions a ladder level adds to PeachPy's default target."""
    from jit import asm

    isa_name = check_name(isa_name)
    out = [asm.isa.avx, asm.isa.avx2, asm.isa.fma3, asm.isa.f16c, asm.isa.bmi2]
    if isa_name == "avx2_vnni":
        out.append(asm.avx_vnni)
    if isa_name.startswith("avx512"):
        out += [asm.isa.avx512f, asm.isa.avx512bw, asm.isa.avx512vl, asm.isa.avx512dq]
    if isa_name == "avx512_core_vnni":
        out.append(asm.avx512_vnni)
    return out


def target_for(isa_name: str):
    """The PeachPy target (micro-architecture + extensions) for a ladder level.

    Built in one step: ``target + extension`` expands every extension's prerequisites
    again (PeachPy builds a table of them at each lookup), so ten additions cost 3-5 ms
    of a process's first kernel; one construction from the whole list expands each once.
    """
    from jit import asm

    default = asm.uarch.default
    return asm.uarch.Microarchitecture(default.name, list(default.extensions) + extensions_for(isa_name),
                                       default.alu_width, default.fpu_width, default.load_width,
                                       default.store_width)
