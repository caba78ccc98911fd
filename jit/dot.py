"""The u8 x s8 -> s32 dot-product step of each ISA path, and the path descriptions.

Every int8 kernel (the demo's dot product, the peak loops, the GEMM microkernel that
convolution reuses) accumulates through one of these three steps:

``vnni``      VPDPBUSD acc, a_u8, b_s8: four u8*s8 products added to each s32 lane,
              no intermediate saturation (AVX512-VNNI on zmm, AVX-VNNI on ymm).
``maddubsw``  VPMADDUBSW t, a_u8, b_s8 (pairs of products added into s16 WITH
              saturation), VPMADDWD t, t, ones (pairs of s16 into s32, exact),
              VPADDD acc, acc, t. oneDNN's AVX2/AVX-512BW sequence.
``widen``     bytes already widened to s16 pairs, VPMADDWD t, a_s16, b_s16 and
              VPADDD acc, acc, t: exact, at about half the fast path's rate.

The first two read the same packed layout (four consecutive K values of a column in
one dword); ``widen`` reads pairs of s16.
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.isa import check_name


STEP_KINDS = ("vnni", "maddubsw", "widen")


@dataclass(frozen=True)
class Path:
    """One code path: an ISA level, a vector width and the step it uses."""

    isa: str
    kind: str  # "vnni" | "maddubsw" | "widen"
    bits: int  # 512 (zmm) or 256 (ymm)

    @property
    def lanes(self) -> int:
        """s32 lanes per vector = output columns per vector."""
        return self.bits // 32

    @property
    def vector_bytes(self) -> int:
        return self.bits // 8

    @property
    def vex(self) -> bool:
        """AVX-VNNI's VPDPBUSD is VEX-encoded; AVX-512's is EVEX."""
        return self.isa == "avx2_vnni"

    @property
    def registers(self) -> int:
        """Vector registers the path may use (ymm16-31 need EVEX, i.e. AVX-512)."""
        return 32 if self.bits == 512 else 16

    @property
    def exact(self) -> bool:
        return self.kind != "maddubsw"

    @property
    def name(self) -> str:
        return f"{self.isa}:{self.kind}"


def fast_path(isa: str) -> Path:
    """The fastest step of an ISA level (the one oneDNN uses there)."""
    isa = check_name(isa)
    bits = 512 if isa.startswith("avx512") else 256
    return Path(isa, "vnni" if isa.endswith("vnni") else "maddubsw", bits)


def widening_path(isa: str) -> Path:
    """The exact widening step on a non-VNNI level."""
    isa = check_name(isa)
    if isa.endswith("vnni"):
        raise ValueError(f"isa: {isa} has VPDPBUSD, which is exact; it has no widening path")
    return Path(isa, "widen", 512 if isa.startswith("avx512") else 256)


def paths(isa: str) -> tuple[Path, ...]:
    """Every path of a level: the fast one, and the widening one on non-VNNI levels."""
    fast = fast_path(isa)
    return (fast,) if fast.kind == "vnni" else (fast, widening_path(isa))


def path_for(isa: str, kind: str | None = None) -> Path:
    """The path of ``isa`` whose step is ``kind`` (None: the fast path)."""
    fast = fast_path(isa)
    if kind is None or kind == fast.kind:
        return fast
    if kind == "widen":
        return widening_path(isa)  # says why a VNNI level has none
    available = paths(isa)
    if kind not in STEP_KINDS:
        raise ValueError(f"kind: expected one of {', '.join(STEP_KINDS)} or None, got {kind!r}")
    raise ValueError(f"kind: {isa} has no {kind} path; it has {', '.join(p.kind for p in available)}")


def vector_register(path: Path, index: int):
    """Physical vector register ``index`` of the path's width."""
    from jit import asm

    if not 0 <= index < path.registers:
        raise ValueError(f"vector register {index} outside the {path.registers} of {path.name}")
    return (asm.ZMMRegister if path.bits == 512 else asm.YMMRegister)(physical_id=index)


def emit_step(path: Path, acc, a, b, tmp=None, ones=None) -> None:
    """acc += dot(a, b) per s32 lane, the way ``path`` computes it.

    ``a`` holds u8 (or, for ``widen``, s16 pairs) in a register; ``b`` holds s8 (s16
    pairs) in a register or memory; ``tmp`` is a scratch register and ``ones`` a
    register of s16 ones (``maddubsw`` only).
    """
    emit_steps(path, [(acc, b, tmp)], a, ones)


def emit_steps(path: Path, steps, a, ones=None) -> None:
    """``emit_step`` for each (acc, b, tmp) of ``steps`` on one ``a``, stage by stage: every
    product, then (``maddubsw``) every VPMADDWD by ones, then every sum."""
    from jit import asm

    if path.kind == "vnni":
        for acc, b, _ in steps:
            asm.VPDPBUSD(acc, a, b, vex=path.vex)
        return
    if path.kind not in ("maddubsw", "widen"):  # pragma: no cover - Path is built by the functions above
        raise ValueError(f"unknown step kind {path.kind!r}")
    for _, b, tmp in steps:
        (asm.VPMADDUBSW if path.kind == "maddubsw" else asm.VPMADDWD)(tmp, a, b)
    if path.kind == "maddubsw":
        for _, _, tmp in steps:
            asm.VPMADDWD(tmp, tmp, ones)
    for acc, _, tmp in steps:
        asm.VPADDD(acc, acc, tmp)


def emit_ones_s16(path: Path, register, scratch_gpr) -> None:
    """Fill ``register`` with s16 ones (the VPMADDWD multiplier of ``maddubsw``)."""
    from jit import asm

    asm.MOV(scratch_gpr.as_dword, 0x00010001)
    asm.VMOVD(register.as_xmm, scratch_gpr.as_dword)
    asm.VPBROADCASTD(register, register.as_xmm)


def emit_bytes(path: Path, register, byte: int, scratch_gpr) -> None:
    """Fill ``register`` with one repeated byte (0x80 flips s8 to u8 by +128)."""
    from jit import asm

    asm.MOV(scratch_gpr.as_dword, (byte & 0xFF) * 0x01010101)
    asm.VMOVD(register.as_xmm, scratch_gpr.as_dword)
    asm.VPBROADCASTD(register, register.as_xmm)


def vector_constant(path: Path, dwords, name: str):
    """A constant vector of the path's width from per-lane dwords (one value repeats).

    Given a pre-name: an unnamed PeachPy constant walks the Python stack to find one,
    which costs milliseconds per constant, and a full name may be used only once.
    """
    import struct

    from peachpy.literal import Constant
    from peachpy.name import Name

    values = [struct.unpack("<I", struct.pack("<f", d))[0] if isinstance(d, float) else d & 0xFFFFFFFF for d in dwords]
    if len(values) == 1:
        values = values * path.lanes
    if len(values) != path.lanes:
        raise ValueError(f"{name}: expected 1 or {path.lanes} dwords, got {len(values)}")
    return Constant._uint32xN(Name(prename=name), path.lanes, *values)
