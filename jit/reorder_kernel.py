"""The reorder kernel template: element-wise type conversion with scales and zero points.

A kernel converts a chunk of ``rows`` rows of ``n`` contiguous elements each (the
innermost dimension is contiguous in both source and destination; rows are
``src_stride`` / ``dst_stride`` bytes apart), computing per element, in f32 and in
this order::

    x = f32(src)                          u8/s8: VPMOVZXBD/VPMOVSXBD + VCVTDQ2PS
                                          s32: VCVTDQ2PS (round to nearest even)
    x = x - src_zp                        VSUBPS   (zero points arrive as f32)
    x = x * src_scale                     VMULPS
    x = x / dst_scale                     VDIVPS   (a true division, not a reciprocal)
    x = x + dst_zp                        VADDPS
    integer dst:
        x = 0 where x is NaN              VCMPPS ORD + AND / zero-masked move
        x = min(max(x, lo), hi)           lo/hi: u8 0/255, s8 -128/127,
                                          s32 -2^31/2147483520 (largest f32 < 2^31)
        q = cvt(x)                        VCVTPS2DQ: round to nearest even (MXCSR default)
        store q (packed to bytes for u8/s8: exact, the values are in range)
    f32 dst: store x

Each of the four attributes is absent, one value per row (``row``: broadcast; the
pointer advances ``attr_stride`` bytes per row, 0 for one value for the whole chunk), or
one value per element of the row (``col``: a vector read at ``attr + col*4``; the driver
pads the array so full vectors may be read past ``n``).

Tails are masked: AVX-512 uses an opmask (masked loads and stores suppress faults);
AVX2 uses VPMASKMOVD for 4-byte types and a byte loop through a general register for
1-byte types. No byte outside ``src``/``dst`` rows is read or written.

The code depends only on the vector width: ``avx2`` and ``avx2_vnni`` share the ymm
kernel, ``avx512_core`` and ``avx512_core_vnni`` the zmm one (see :func:`code_isa`).
``primitives.reorder_ref`` is the numpy model of exactly these operations.
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.isa import check_name

ARGS_CDEF = """
struct i8j_reorder_args {
    const void *src; int64_t src_stride;   /* bytes between rows */
    void *dst; int64_t dst_stride;
    int64_t rows; int64_t n;               /* rows >= 1, n >= 1 elements per row */
    const float *attr[4];                  /* src_scale, dst_scale, src_zp, dst_zp (zero points as f32) */
    int64_t attr_stride[4];                /* bytes per row */
};
"""
SIGNATURE = "void (*)(struct i8j_reorder_args *)"
ATTRS = ("src_scale", "dst_scale", "src_zp", "dst_zp")
MODES = ("none", "row", "col")
KERNEL_TYPES = ("u8", "s8", "s32", "f32")
SIZE = {"u8": 1, "s8": 1, "s32": 4, "f32": 4}
UNROLL = 4
# Clamp bounds in f32 per integer destination type.
BOUNDS = {"u8": (0.0, 255.0), "s8": (-128.0, 127.0), "s32": (-2147483648.0, 2147483520.0)}


def code_isa(isa: str) -> str:
    """The ISA whose code a level runs: VNNI adds nothing to a conversion."""
    isa = check_name(isa)
    return "avx512_core" if isa.startswith("avx512") else "avx2"


@dataclass(frozen=True)
class ReorderKernelSpec:
    """Everything that shapes the generated code (the cache key, with the version)."""

    isa: str  # "avx2" or "avx512_core" (see code_isa)
    src_dt: str
    dst_dt: str
    modes: tuple  # one of MODES per ATTRS entry

    def __post_init__(self):
        if self.isa not in ("avx2", "avx512_core"):
            raise ValueError(f"isa: expected 'avx2' or 'avx512_core' (see code_isa), got {self.isa!r}")
        for name, dt in (("src_dt", self.src_dt), ("dst_dt", self.dst_dt)):
            if dt not in KERNEL_TYPES:
                raise ValueError(f"{name}: the reorder kernel converts {', '.join(KERNEL_TYPES)}, got {dt!r}")
        if len(self.modes) != len(ATTRS) or any(m not in MODES for m in self.modes):
            raise ValueError(f"modes: expected {len(ATTRS)} of {MODES}, got {self.modes!r}")

    @property
    def wide(self) -> bool:
        return self.isa == "avx512_core"

    @property
    def lanes(self) -> int:
        return 16 if self.wide else 8

    @property
    def name(self) -> str:
        letters = "".join({"none": "_", "row": "r", "col": "c"}[m] for m in self.modes)
        return f"reorder_{self.src_dt}_{self.dst_dt}_{letters}_{self.isa}"


def cache_key(spec: ReorderKernelSpec) -> tuple:
    """The code-cache key: the spec and a digest of this template's source.

    The digest makes a changed template miss stale disk-cache entries without anyone
    remembering to bump a version.
    """
    global _digest
    if _digest is None:
        import hashlib

        with open(__file__, "rb") as f:
            _digest = hashlib.sha256(f.read()).hexdigest()[:16]
    return ("reorder", _digest, spec)


_digest: str | None = None


def get_kernel(spec: ReorderKernelSpec):
    """The cached kernel of ``spec`` (generated on first use; see ``jit.cache``)."""
    from jit import cache

    return cache.get_kernel(cache_key(spec), lambda: generate(spec))


def args_offsets() -> dict[str, int]:
    from runtime.ffi import struct_offsets

    return struct_offsets(ARGS_CDEF, "struct i8j_reorder_args",
                          ("src", "src_stride", "dst", "dst_stride", "rows", "n", "attr", "attr_stride"))


def generate(spec: ReorderKernelSpec):
    """Generate the kernel's code (slow: PeachPy); see ``jit.cache.get_kernel``."""
    from jit import asm
    from jit.build import generate as build

    argument = asm.Argument(asm.ptr(asm.uint8_t), "args")
    return build(spec.name, spec.isa, SIGNATURE, (argument,), lambda: _emit(spec, argument),
                 meta={"spec": repr(spec)})


def _f32_bits(value: float) -> int:
    import struct

    return struct.unpack("<I", struct.pack("<f", value))[0]


def _emit(spec: ReorderKernelSpec, argument) -> None:  # noqa: C901 - one template, read top to bottom
    from peachpy.literal import Constant
    from peachpy.name import Name

    from jit import asm
    from jit.asm import (ADD, CMP, DEC, INC, JB, JMP, JNZ, JZ, LABEL, MOV, MOVZX, OR, SHL, SHR, SUB,
                         TEST, XOR, Label, rax, rbp, rbx, rcx, rdi, rdx, rsi, r8, r9, r10, r11, r12, r13,
                         r14, r15)

    off = args_offsets()
    wide, lanes = spec.wide, spec.lanes
    reg = asm.ZMMRegister if wide else asm.YMMRegister
    V = lambda i: reg(physical_id=i)  # noqa: E731
    ss, ds = SIZE[spec.src_dt], SIZE[spec.dst_dt]
    int_dst = spec.dst_dt != "f32"

    # Vector registers: UNROLL data + UNROLL temporaries, then broadcast attributes and bounds.
    data = [V(i) for i in range(UNROLL)]
    tmps = [V(UNROLL + i) for i in range(UNROLL)]
    nxt = 2 * UNROLL
    row_regs = {}
    for a, mode in zip(ATTRS, spec.modes):
        if mode == "row":
            row_regs[a] = V(nxt)
            nxt += 1
    lo = hi = None
    if int_dst:
        lo, hi = V(nxt), V(nxt + 1)
        nxt += 2
    tail_mask = V(nxt)  # AVX2 4-byte tails
    kmask = asm.KRegister(physical_id=1)
    knan = asm.KRegister(physical_id=2)

    def constant(value: int, name: str):
        return Constant._uint32xN(Name(prename=name), lanes, *([value & 0xFFFFFFFF] * lanes))

    # GPRs: rdi args, rsi src row, rdx dst row, r8 rows left, r9 n, r10-r13 attribute rows,
    # rax column, rcx tail count, rbx/rbp/r14 scratch.
    attr_gpr = dict(zip(ATTRS, (r10, r11, r12, r13)))
    args = rdi
    asm.LOAD.ARGUMENT(args, argument)
    MOV(rsi, [args + off["src"]])
    MOV(rdx, [args + off["dst"]])
    MOV(r8, [args + off["rows"]])
    MOV(r9, [args + off["n"]])
    for i, a in enumerate(ATTRS):
        if spec.modes[i] != "none":
            MOV(attr_gpr[a], [args + off["attr"] + 8 * i])
    if int_dst:
        low, high = BOUNDS[spec.dst_dt]
        asm.VMOVUPS(lo, constant(_f32_bits(low), f"reorder_lo_{spec.dst_dt}"))
        asm.VMOVUPS(hi, constant(_f32_bits(high), f"reorder_hi_{spec.dst_dt}"))

    def src_at(col_reg):
        return rsi + col_reg * ss

    def dst_at(col_reg):
        return rdx + col_reg * ds

    def attr_operand(a, v, col_reg):
        """The register or memory operand holding attribute ``a`` for vector ``v``."""
        if spec.modes[ATTRS.index(a)] == "row":
            return row_regs[a]
        return (asm.zword if wide else asm.yword)[attr_gpr[a] + col_reg * 4 + v * lanes * 4]

    def load(x, t, v, col_reg, tail: bool) -> None:
        """x <- f32 of the source vector v at column col_reg (tail: rcx elements)."""
        address = src_at(col_reg) + v * lanes * ss
        if ss == 4:
            if tail and wide:
                asm.VMOVUPS(x(kmask.z), [address])
            elif tail:
                asm.VPMASKMOVD(x, tail_mask, [address])
            else:
                asm.VMOVUPS(x, [address])
            if spec.src_dt == "s32":
                asm.VCVTDQ2PS(x, x)
            return
        extend = asm.VPMOVZXBD if spec.src_dt == "u8" else asm.VPMOVSXBD
        if not tail:
            extend(x, (asm.oword if wide else asm.qword)[address])
        elif wide:
            asm.VMOVDQU8(t.as_xmm(kmask.z), asm.oword[address])
            extend(x, t.as_xmm)
        else:  # up to 7 bytes gathered into rbx, last byte first
            gather = Label()
            asm.LEA(r15, [address])
            XOR(rbx.as_dword, rbx.as_dword)
            MOV(rbp, rcx)
            LABEL(gather)
            SHL(rbx, 8)
            MOVZX(r14.as_dword, asm.byte[r15 + rbp * 1 - 1])
            OR(rbx, r14)
            DEC(rbp)
            JNZ(gather)
            asm.VMOVQ(t.as_xmm, rbx)
            extend(x, t.as_xmm)
        asm.VCVTDQ2PS(x, x)

    def compute(x, t, v, col_reg) -> None:
        if spec.modes[2] != "none":
            asm.VSUBPS(x, x, attr_operand("src_zp", v, col_reg))
        if spec.modes[0] != "none":
            asm.VMULPS(x, x, attr_operand("src_scale", v, col_reg))
        if spec.modes[1] != "none":
            asm.VDIVPS(x, x, attr_operand("dst_scale", v, col_reg))
        if spec.modes[3] != "none":
            asm.VADDPS(x, x, attr_operand("dst_zp", v, col_reg))
        if int_dst:
            if wide:
                # PeachPy encodes VCMPPS k, ... as k{k}: set k to all ones so the old
                # value cannot filter the new one.
                asm.KXNORW(knan, knan, knan)
                asm.VCMPPS(knan, x, x, 7)  # ordered: not NaN
                asm.VMOVAPS(x(knan.z), x)
            else:
                asm.VCMPPS(t, x, x, 7)
                asm.VANDPS(x, x, t)
            asm.VMAXPS(x, x, lo)
            asm.VMINPS(x, x, hi)
            asm.VCVTPS2DQ(x, x)

    def store(x, t, v, col_reg, tail: bool) -> None:
        address = dst_at(col_reg) + v * lanes * ds
        if ds == 4:
            if tail and wide:
                asm.VMOVUPS(asm.zword[address](kmask), x)
            elif tail:
                asm.VPMASKMOVD([address], tail_mask, x)
            else:
                asm.VMOVUPS([address], x)
            return
        # Pack the in-range s32 lanes to bytes (exact: the clamp put them in range).
        if wide:
            asm.VPMOVDB(t.as_xmm, x)
        else:
            asm.VEXTRACTI128(t.as_xmm, x, 1)
            asm.VPACKSSDW(t.as_xmm, x.as_xmm, t.as_xmm)
            (asm.VPACKUSWB if spec.dst_dt == "u8" else asm.VPACKSSWB)(t.as_xmm, t.as_xmm, t.as_xmm)
        if not tail:
            (asm.VMOVDQU if wide else asm.VMOVQ)((asm.oword if wide else asm.qword)[address], t.as_xmm)
        elif wide:
            asm.VMOVDQU8(asm.oword[address](kmask), t.as_xmm)
        else:  # scatter up to 7 bytes from rbx
            scatter = Label()
            asm.VMOVQ(rbx, t.as_xmm)
            asm.LEA(r15, [address])
            XOR(rbp.as_dword, rbp.as_dword)
            LABEL(scatter)
            MOV(asm.byte[r15 + rbp * 1], rbx.as_low_byte)
            SHR(rbx, 8)
            INC(rbp)
            CMP(rbp, rcx)
            JB(scatter)

    def vectors(count: int, tail: bool) -> None:
        for v in range(count):
            load(data[v], tmps[v], v, rax, tail)
        for v in range(count):
            compute(data[v], tmps[v], v, rax)
        for v in range(count):
            store(data[v], tmps[v], v, rax, tail)

    row_loop, done = Label(), Label()
    TEST(r8, r8)
    JZ(done)
    LABEL(row_loop)
    for a, register in row_regs.items():
        asm.VBROADCASTSS(register, asm.dword[attr_gpr[a]])
    XOR(rax.as_dword, rax.as_dword)
    MOV(rcx, r9)  # columns left

    main_loop, single_loop, tail, row_end = Label(), Label(), Label(), Label()
    LABEL(main_loop)
    CMP(rcx, UNROLL * lanes)
    JB(single_loop)
    vectors(UNROLL, tail=False)
    ADD(rax, UNROLL * lanes)
    SUB(rcx, UNROLL * lanes)
    JMP(main_loop)
    LABEL(single_loop)
    CMP(rcx, lanes)
    JB(tail)
    vectors(1, tail=False)
    ADD(rax, lanes)
    SUB(rcx, lanes)
    JMP(single_loop)
    LABEL(tail)
    TEST(rcx, rcx)
    JZ(row_end)
    if wide:
        MOV(rbx.as_dword, 0xFFFF)
        asm.BZHI(rbx.as_dword, rbx.as_dword, rcx.as_dword)
        asm.KMOVW(kmask, rbx.as_dword)
    elif ss == 4 or ds == 4:
        asm.VMOVD(tail_mask.as_xmm, rcx.as_dword)
        asm.VPBROADCASTD(tail_mask, tail_mask.as_xmm)
        asm.VPCMPGTD(tail_mask, tail_mask, constant_iota(lanes))
    vectors(1, tail=True)
    LABEL(row_end)
    ADD(rsi, [args + off["src_stride"]])
    ADD(rdx, [args + off["dst_stride"]])
    for i, a in enumerate(ATTRS):
        if spec.modes[i] != "none":
            ADD(attr_gpr[a], [args + off["attr_stride"] + 8 * i])
    DEC(r8)
    JNZ(row_loop)
    LABEL(done)
    asm.RETURN()


def constant_iota(lanes: int):
    from peachpy.literal import Constant
    from peachpy.name import Name

    return Constant._uint32xN(Name(prename="reorder_iota"), lanes, *range(lanes))
