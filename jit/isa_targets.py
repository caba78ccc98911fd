"""PeachPy targets per ISA path, so a template cannot emit an instruction its path lacks."""
from __future__ import annotations

from runtime.isa import check_name


def target_for(isa_name: str):
    """The PeachPy target (micro-architecture + extensions) for a ladder level."""
    from jit import asm

    isa_name = check_name(isa_name)
    base = asm.uarch.default + asm.isa.avx + asm.isa.avx2 + asm.isa.fma3 + asm.isa.f16c + asm.isa.bmi2
    if isa_name == "avx2":
        return base
    if isa_name == "avx2_vnni":
        return base + asm.avx_vnni
    avx512 = base + asm.isa.avx512f + asm.isa.avx512bw + asm.isa.avx512vl + asm.isa.avx512dq
    if isa_name == "avx512_core":
        return avx512
    return avx512 + asm.avx512_vnni
