"""Encodings of the VNNI instructions in jit/vnni.py, checked against iced-x86.

Every form is encoded standalone (``instr.encode()``), decoded by iced-x86, and compared
field by field (code, registers, memory base/index/scale/displacement and displacement
size, write mask, zeroing, broadcast, EVEX vs VEX); the bytes must also equal iced's own
re-encoding of the decoded instruction (the canonical, shortest encoding). A mismatch
names the form.
"""
from __future__ import annotations

import itertools

import pytest

iced = pytest.importorskip("iced_x86")

from jit import asm  # noqa: E402  (applies the PeachPy mend, then adds jit.vnni)
from jit import vnni  # noqa: E402
from peachpy.x86_64 import registers as R  # noqa: E402

INSTRUCTIONS = (vnni.VPDPBUSD, vnni.VPDPBUSDS, vnni.VPDPWSSD, vnni.VPDPWSSDS)
OPCODES = {"VPDPBUSD": 0x50, "VPDPBUSDS": 0x51, "VPDPWSSD": 0x52, "VPDPWSSDS": 0x53}

# width name -> (register class constructor, bytes, memory size spec, broadcast spec)
WIDTHS = {
    "xmm": (R.XMMRegister, 16, asm.oword, asm.dword.to4),
    "ymm": (R.YMMRegister, 32, asm.hword, asm.dword.to8),
    "zmm": (R.ZMMRegister, 64, asm.zword, asm.dword.to16),
}
GPRS = (R.rax, R.rcx, R.rdx, R.rbx, R.rsp, R.rbp, R.rsi, R.rdi,
        R.r8, R.r9, R.r10, R.r11, R.r12, R.r13, R.r14, R.r15)
INDEXES = tuple(r for r in GPRS if r != R.rsp)
SPECIAL_BASES = (R.rsp, R.rbp, R.r12, R.r13)

_formatter = iced.Formatter(iced.FormatterSyntax.NASM)
_REGISTER_NAMES = {v: k for k, v in vars(iced.Register).items() if k.isupper()}
_CODE_NAMES = {v: k for k, v in vars(iced.Code).items() if k.isupper()}


def vreg(width, n):
    return WIDTHS[width][0](n)


def iced_reg(reg):
    return getattr(iced.Register, str(reg).upper())


def expected_code(name, width, vex):
    w = width.upper()
    bits = WIDTHS[width][1] * 8
    if vex:
        return getattr(iced.Code, f"VEX_{name}_{w}_{w}_{w}M{bits}")
    return getattr(iced.Code, f"EVEX_{name}_{w}_K1Z_{w}_{w}M{bits}B32")


def expected_disp_size(base, disp, n):
    """0, 1 (disp8, compressed by n) or 4 (disp32), from the ISA rules, not from PeachPy."""
    if base is None:
        return 4
    if disp == 0 and base not in (R.rbp, R.r13):
        return 0
    if disp % n == 0 and -128 <= disp // n <= 127:
        return 1
    return 4


def signed64(value):
    return value - (1 << 64) if value >= 1 << 63 else value


def check(form, instr, *, code, regs, mem=None, mask=None, zeroing=False, broadcast=False, vex=False,
          disp_n=1):
    """Decode ``instr.encode()`` and compare with the expectation; fail naming ``form``."""
    data = bytes(instr.encode())
    decoded = iced.Decoder(64, data, ip=0).decode()
    problems = []

    def expect(what, got, want):
        if got != want:
            names = _CODE_NAMES if what == "code" else _REGISTER_NAMES if "register" in what or what in (
                "base", "index", "op_mask") else {}
            problems.append(f"{what}: got {names.get(got, got)!r}, want {names.get(want, want)!r}")

    expect("length", decoded.len, len(data))
    expect("code", decoded.code, code)
    expect("encoding", decoded.encoding, iced.EncodingKind.VEX if vex else iced.EncodingKind.EVEX)
    expect("op_count", decoded.op_count, 3)
    for i, reg in enumerate(regs):
        expect(f"op{i} register", decoded.op_register(i), iced_reg(reg))
    if mem is None:
        expect("op2 kind", decoded.op_kind(2), iced.OpKind.REGISTER)
    else:
        base, index, scale, disp = mem
        expect("op2 kind", decoded.op_kind(2), iced.OpKind.MEMORY)
        expect("base", decoded.memory_base, iced.Register.NONE if base is None else iced_reg(base))
        expect("index", decoded.memory_index, iced.Register.NONE if index is None else iced_reg(index))
        if index is not None:
            expect("scale", decoded.memory_index_scale, scale)
        expect("displacement", signed64(decoded.memory_displacement), disp)
        size = {0: 0, 1: 1, 4: 4, 8: 4}.get(decoded.memory_displ_size, decoded.memory_displ_size)
        expect("displacement size", size, expected_disp_size(base, disp, disp_n))
    expect("op_mask", decoded.op_mask, iced.Register.NONE if mask is None else iced_reg(mask))
    expect("zeroing", decoded.zeroing_masking, zeroing)
    expect("broadcast", decoded.is_broadcast, broadcast)
    if not problems:
        encoder = iced.Encoder(64)
        encoder.encode(decoded, 0)
        expect("bytes vs iced re-encoding", data.hex(), encoder.take_buffer().hex())
    assert not problems, "%s -> %s (%s): %s" % (form, data.hex(), _formatter.format(decoded), "; ".join(problems))
    # Listings must not crash on any form.
    for syntax in ("peachpy", "nasm", "gas", "go"):
        assert instr.format(syntax)
    assert str(instr).startswith(("{vex} " if vex else "") + instr.name)
    return data


def addresses(n):
    """(base, index, scale, displacement) tuples covering the ModRM/SIB/disp cases for disp8*n."""
    disps = sorted({0, 1, -1, n, -n, 3 * n, 127 * n, -128 * n, 128 * n, -129 * n, n + 1, n // 2 or 1,
                    -(n // 2 or 1), 0x12345678, -0x80000000, 0x7FFFFFFF})
    out = [(base, None, 1, disp) for base in GPRS for disp in disps]
    for i, (index, scale) in enumerate(itertools.product(INDEXES, (1, 2, 4, 8))):
        base = GPRS[(i * 5) % 16]
        out.append((base, index, scale, disps[i % len(disps)]))
    for base, index, scale, disp in itertools.product(SPECIAL_BASES, (None, R.rax, R.r12, R.r13), (1, 8),
                                                      (0, n, -n, 129 * n)):
        out.append((base, index, scale, disp))
    for index, disp in itertools.product((R.rax, R.rbp, R.r13, R.r15), (0, n, -0x1000)):
        out.append((None, index, 4, disp))  # no base: SIB.base=101, disp32
    return out


def make_address(base, index, scale, disp):
    if base is None:
        return index * scale + disp
    if index is None:
        return base + disp
    return base + index * scale + disp


def fmt_mem(base, index, scale, disp):
    parts = ([str(base)] if base is not None else []) + ([f"{index}*{scale}"] if index is not None else [])
    return "[%s%+d]" % ("+".join(parts), disp)


def register_triples(n: int):
    """(dst, src1, src2) over registers 0..n-1: every register in each position, in varying combinations."""
    for i in range(n):
        yield from ((i, (i * 7 + 3) % n, (i * 13 + 5) % n), ((i * 11) % n, i, n - 1 - i),
                    ((i + n // 2) % n, (i * 3) % n, i))


# --------------------------------------------------------------------------- EVEX forms


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("cls", INSTRUCTIONS, ids=lambda c: c.__name__)
def test_evex_register_forms(cls, width):
    code = expected_code(cls.__name__, width, vex=False)
    for dst, src1, src2 in register_triples(32):
        ops = (vreg(width, dst), vreg(width, src1), vreg(width, src2))
        check(f"{cls.__name__} {width}{dst}, {width}{src1}, {width}{src2}", cls(*ops), code=code, regs=ops)
    # Masks k1-k7, merging and zeroing.
    for k, zeroing in itertools.product(range(1, 8), (False, True)):
        mask = R.KRegister(k)
        dst, src1, src2 = vreg(width, (k * 5) % 32), vreg(width, 31 - k), vreg(width, k + 8)
        masked = dst(mask.z) if zeroing else dst(mask)
        form = f"{cls.__name__} {dst}{{k{k}}}{'{z}' if zeroing else ''}, {src1}, {src2}"
        check(form, cls(masked, src1, src2), code=code, regs=(dst, src1, src2), mask=mask, zeroing=zeroing)


@pytest.mark.parametrize("broadcast", (False, True), ids=("full", "bcst"))
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("cls", INSTRUCTIONS, ids=lambda c: c.__name__)
def test_evex_memory_forms(cls, width, broadcast):
    code = expected_code(cls.__name__, width, vex=False)
    _, size, full_spec, bcst_spec = WIDTHS[width]
    spec = bcst_spec if broadcast else full_spec
    n = 4 if broadcast else size
    for i, (base, index, scale, disp) in enumerate(addresses(n)):
        dst, src1 = vreg(width, (i * 7) % 32), vreg(width, (i * 11 + 16) % 32)
        k = i % 8
        zeroing = bool(i & 8)
        masked = dst if k == 0 else (dst(R.KRegister(k).z) if zeroing else dst(R.KRegister(k)))
        form = "%s %s%s, %s, %s%s" % (cls.__name__, dst, "" if k == 0 else "{k%d}%s" % (k, "{z}" if zeroing else ""),
                                      src1, spec, fmt_mem(base, index, scale, disp))
        instr = cls(masked, src1, spec[make_address(base, index, scale, disp)])
        check(form, instr, code=code, regs=(dst, src1), mem=(base, index, scale, disp),
              mask=None if k == 0 else R.KRegister(k), zeroing=k != 0 and zeroing, broadcast=broadcast, disp_n=n)


@pytest.mark.parametrize("cls", INSTRUCTIONS, ids=lambda c: c.__name__)
def test_evex_rip_relative(cls):
    for width, (_, size, full_spec, bcst_spec) in WIDTHS.items():
        for spec, bcst in ((full_spec, False), (bcst_spec, True)):
            for offset in (0, 64, -4, 0x1000):
                instr = cls(vreg(width, 20), vreg(width, 3), spec[R.rip + offset])
                data = bytes(instr.encode())
                d = iced.Decoder(64, data, ip=0).decode()
                form = f"{cls.__name__} {width}20, {width}3, {spec}[rip{offset:+d}]"
                assert d.code == expected_code(cls.__name__, width, vex=False), form
                assert d.is_ip_rel_memory_operand and d.memory_base == iced.Register.RIP, form
                assert signed64(d.memory_displacement) == len(data) + offset, form
                assert d.is_broadcast == bcst, form


def test_opcode_bytes_and_prefix_fields():
    """Spot-check raw fields against the SDM: EVEX P0 mm=10 (0F38), P1 = W0 1 pp=01, opcode 50-53."""
    for cls in INSTRUCTIONS:
        data = cls(asm.zmm1, asm.zmm2, asm.zmm3).encode()
        assert data[0] == 0x62 and data[1] & 0b11 == 0b10 and data[2] & 0x87 == 0x05, cls.__name__
        assert data[4] == OPCODES[cls.__name__], cls.__name__
        data = cls(asm.ymm1, asm.ymm2, asm.ymm3, vex=True).encode()
        assert data[0] == 0xC4 and data[1] & 0x1F == 0b10 and data[2] & 0x87 == 0x05, cls.__name__
        assert data[3] == OPCODES[cls.__name__], cls.__name__


# --------------------------------------------------------------------------- VEX forms


@pytest.mark.parametrize("width", ("xmm", "ymm"))
@pytest.mark.parametrize("cls", INSTRUCTIONS, ids=lambda c: c.__name__)
def test_vex_forms(cls, width):
    code = expected_code(cls.__name__, width, vex=True)
    for dst, src1, src2 in register_triples(16):
        ops = (vreg(width, dst), vreg(width, src1), vreg(width, src2))
        check(f"{{vex}} {cls.__name__} {width}{dst}, {width}{src1}, {width}{src2}", cls(*ops, vex=True),
              code=code, regs=ops, vex=True)
    spec = WIDTHS[width][2]
    for i, (base, index, scale, disp) in enumerate(addresses(1)):
        dst, src1 = vreg(width, (i * 7) % 16), vreg(width, (i * 11 + 8) % 16)
        form = "{vex} %s %s, %s, %s%s" % (cls.__name__, dst, src1, spec, fmt_mem(base, index, scale, disp))
        instr = cls(dst, src1, spec[make_address(base, index, scale, disp)], vex=True)
        check(form, instr, code=code, regs=(dst, src1), mem=(base, index, scale, disp), vex=True, disp_n=1)


def test_default_is_evex_and_vex_is_explicit():
    evex = vnni.VPDPBUSD(asm.ymm0, asm.ymm1, asm.ymm2)
    vex = vnni.VPDPBUSD(asm.ymm0, asm.ymm1, asm.ymm2, vex=True)
    assert evex.encode()[0] == 0x62 and vex.encode()[0] == 0xC4
    assert evex.isa_extensions == frozenset([vnni.avx512_vnni, asm.isa.avx512vl])
    assert vnni.VPDPBUSD(asm.zmm0, asm.zmm1, asm.zmm2).isa_extensions == frozenset([vnni.avx512_vnni])
    assert vex.isa_extensions == frozenset([vnni.avx_vnni])
    assert str(vex) == "{vex} VPDPBUSD ymm0, ymm1, ymm2"
    assert vex.format("gas") == "{vex} vpdpbusd %ymm2, %ymm1, %ymm0"
    masked = vnni.VPDPBUSD(asm.zmm3(asm.k2.z), asm.zmm1, asm.dword.to16[asm.rax + 64])
    assert str(masked) == "VPDPBUSD zmm3{k2}{z}, zmm1, dword [rax + 64]{1to16}"
    assert masked.format("gas") == "vpdpbusd 64(%rax){1to16}, %zmm1, %zmm3{%k2}{z}"


@pytest.mark.parametrize("cls", INSTRUCTIONS, ids=lambda c: c.__name__)
def test_vex_rejects_what_it_cannot_express(cls):
    bad = {
        "zmm": (asm.zmm0, asm.zmm1, asm.zmm2),
        "merge mask": (asm.ymm0(asm.k1), asm.ymm1, asm.ymm2),
        "zero mask": (asm.xmm0(asm.k1.z), asm.xmm1, asm.xmm2),
        "broadcast": (asm.ymm0, asm.ymm1, asm.dword.to8[asm.rax]),
        "dst 16": (R.YMMRegister(16), asm.ymm1, asm.ymm2),
        "src1 31": (asm.xmm0, R.XMMRegister(31), asm.xmm2),
        "src2 20": (asm.ymm0, asm.ymm1, R.YMMRegister(20)),
        "mixed widths": (asm.ymm0, asm.xmm1, asm.ymm2),
        "zmm memory": (asm.ymm0, asm.ymm1, asm.zword[asm.rax]),
    }
    for what, ops in bad.items():
        with pytest.raises(SyntaxError):
            cls(*ops, vex=True)
            pytest.fail(f"{cls.__name__} vex=True accepted {what}")


@pytest.mark.parametrize("cls", INSTRUCTIONS, ids=lambda c: c.__name__)
def test_evex_rejects_invalid_operands(cls):
    bad = {
        "mixed widths": (asm.zmm0, asm.ymm1, asm.zmm2),
        "qword broadcast": (asm.zmm0, asm.zmm1, asm.qword.to8[asm.rax]),
        "broadcast count for ymm on zmm": (asm.zmm0, asm.zmm1, asm.dword.to8[asm.rax]),
        "ymm memory on zmm": (asm.zmm0, asm.zmm1, asm.hword[asm.rax]),
        "gpr": (asm.zmm0, asm.zmm1, asm.rax),
        "k0 write mask": (asm.zmm0(asm.k0), asm.zmm1, asm.zmm2),
    }
    for what, ops in bad.items():
        with pytest.raises(SyntaxError):
            cls(*ops)
            pytest.fail(f"{cls.__name__} accepted {what}")
    with pytest.raises(SyntaxError):
        cls(asm.zmm0, asm.zmm1)


# --------------------------------------------------------------------------- inside a Function


def _decode_all(code):
    return list(iced.Decoder(64, bytes(code), ip=0))


def test_function_with_virtual_registers_allocates_and_encodes():
    from jit.isa_targets import target_for

    a = asm.Argument(asm.ptr(asm.const_uint8_t), "a")
    b = asm.Argument(asm.ptr(asm.const_int8_t), "b")
    c = asm.Argument(asm.ptr(asm.int32_t), "c")
    with asm.Function("vnni_virtual", (a, b, c), None, target=target_for("avx512_core_vnni")) as function:
        pa, pb, pc = asm.GeneralPurposeRegister64(), asm.GeneralPurposeRegister64(), asm.GeneralPurposeRegister64()
        asm.LOAD.ARGUMENT(pa, a)
        asm.LOAD.ARGUMENT(pb, b)
        asm.LOAD.ARGUMENT(pc, c)
        acc, x, acc_y = asm.ZMMRegister(), asm.ZMMRegister(), asm.YMMRegister()
        asm.VMOVDQU32(acc, [pc])
        asm.VMOVDQU32(x, [pa])
        vnni.VPDPBUSD(acc, x, [pb])
        vnni.VPDPBUSDS(acc, x, asm.dword.to16[pb + 64])
        asm.MOV(asm.eax, 0x5555)
        asm.KMOVW(asm.k1, asm.eax)
        vnni.VPDPWSSD(acc(asm.k1), x, asm.zword[pb + pa * 1 + 128])
        asm.VMOVDQU(acc_y, [pc + 64])
        vnni.VPDPWSSDS(acc_y, acc_y, [pa + 64])
        asm.VMOVDQU32([pc], acc)
        asm.VMOVDQU([pc + 64], acc_y)
        asm.RETURN()
    abi_function = function.finalize(asm.abi.system_v_x86_64_abi)
    listing = abi_function.format()
    assert "VPDPBUSD zmm" in listing and "{k1}" in listing and "{1to16}" in listing
    code = abi_function.encode().code_section.content
    decoded = [d for d in _decode_all(code) if d.mnemonic in
               (iced.Mnemonic.VPDPBUSD, iced.Mnemonic.VPDPBUSDS, iced.Mnemonic.VPDPWSSD, iced.Mnemonic.VPDPWSSDS)]
    assert [d.mnemonic for d in decoded] == [iced.Mnemonic.VPDPBUSD, iced.Mnemonic.VPDPBUSDS,
                                             iced.Mnemonic.VPDPWSSD, iced.Mnemonic.VPDPWSSDS]
    assert all(d.encoding == iced.EncodingKind.EVEX for d in decoded)
    assert decoded[1].is_broadcast and decoded[2].op_mask == iced.Register.K1
    # The accumulator is read and written: the same physical register in all three zmm forms.
    assert len({d.op0_register for d in decoded[:3]}) == 1
    assert decoded[3].op0_register == decoded[3].op1_register  # ymm acc_y, acc_y


def test_function_vex_form_in_avx2_vnni_target():
    from jit.isa_targets import target_for

    with asm.Function("vnni_vex", (), None, target=target_for("avx2_vnni")) as function:
        acc, x, y = asm.YMMRegister(), asm.YMMRegister(), asm.YMMRegister()
        asm.VPXOR(acc, acc, acc)
        asm.VPXOR(x, x, x)
        asm.VPXOR(y, y, y)
        vnni.VPDPBUSD(acc, x, y, vex=True)
        asm.RETURN()
    code = function.finalize(asm.abi.system_v_x86_64_abi).encode().code_section.content
    decoded = [d for d in _decode_all(code) if d.mnemonic == iced.Mnemonic.VPDPBUSD]
    assert len(decoded) == 1 and decoded[0].encoding == iced.EncodingKind.VEX


@pytest.mark.parametrize(
    "isa, form, accepted",
    [
        ("avx2", "evex_zmm", False),
        ("avx2", "evex_ymm", False),
        ("avx2", "vex", False),
        ("avx2_vnni", "vex", True),
        ("avx2_vnni", "evex_ymm", False),
        ("avx512_core", "evex_zmm", False),
        ("avx512_core_vnni", "evex_zmm", True),
        ("avx512_core_vnni", "evex_ymm", True),
        ("avx512_core_vnni", "vex", False),  # an AVX512-VNNI CPU need not have AVX-VNNI
    ],
)
def test_target_check(isa, form, accepted):
    from jit.isa_targets import target_for

    def emit():
        if form == "evex_zmm":
            vnni.VPDPBUSD(asm.zmm0, asm.zmm1, asm.zmm2)
        elif form == "evex_ymm":
            vnni.VPDPBUSD(asm.ymm0, asm.ymm1, asm.ymm2)
        else:
            vnni.VPDPBUSD(asm.ymm0, asm.ymm1, asm.ymm2, vex=True)

    with asm.Function(f"check_{isa}_{form}", (), None, target=target_for(isa)):
        if accepted:
            emit()
        else:
            with pytest.raises(ValueError, match="not supported on the target"):
                emit()
        asm.RETURN()


def test_extensions_are_peachpy_extensions():
    assert vnni.avx512_vnni in vnni.avx512_vnni.prerequisites
    assert asm.isa.avx512f in vnni.avx512_vnni.prerequisites
    assert asm.isa.avx2 in vnni.avx_vnni.prerequisites and asm.isa.avx512f not in vnni.avx_vnni.prerequisites
    assert vnni.avx512_vnni.ancestors == (vnni.avx512_vnni,)
    assert set(vnni.__all__) == {"avx512_vnni", "avx_vnni", "VPDPBUSD", "VPDPBUSDS", "VPDPWSSD", "VPDPWSSDS"}
    assert asm.VPDPBUSD is vnni.VPDPBUSD and asm.avx_vnni is vnni.avx_vnni


# --------------------------------------------------------------------------- execution (optional)


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _reference(name, acc, a, b):
    import numpy as np

    acc = acc.astype(np.int64)
    if name.startswith("VPDPBUS"):
        products = a.view(np.uint8).astype(np.int64) * b.view(np.int8).astype(np.int64)
        total = acc + products.reshape(-1, 4).sum(axis=1)
    else:
        products = a.view(np.int16).astype(np.int64) * b.view(np.int16).astype(np.int64)
        total = acc + products.reshape(-1, 2).sum(axis=1)
    if name.endswith("S"):
        total = np.clip(total, -(1 << 31), (1 << 31) - 1)
    return (total & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


@pytest.mark.parametrize("vex", (False, True), ids=("evex_zmm", "vex_ymm"))
@pytest.mark.parametrize("cls", INSTRUCTIONS, ids=lambda c: c.__name__)
def test_executes_like_numpy(cls, vex):
    np = pytest.importorskip("numpy")
    flag = "avx_vnni" if vex else "avx512_vnni"
    if flag not in _cpu_flags():
        pytest.skip(f"CPU lacks {flag}")
    from runtime.kernel import Kernel

    lanes = 8 if vex else 16
    rng = np.random.default_rng(7)
    acc = rng.integers(-(1 << 31), 1 << 31, size=lanes, dtype=np.int64).astype(np.int32)
    acc[:2] = [(1 << 31) - 5, -(1 << 31) + 5]  # saturation in the S forms
    a = rng.integers(0, 256, size=lanes * 4, dtype=np.int64).astype(np.uint8)
    b = rng.integers(0, 256, size=lanes * 4, dtype=np.int64).astype(np.uint8)
    a[:8] = 0xFF if cls.__name__.startswith("VPDPBUS") else np.array([0xFF, 0x7F] * 4, dtype=np.uint8)
    b[:8] = 0x7F
    args = (asm.Argument(asm.ptr(asm.const_uint8_t), "a"), asm.Argument(asm.ptr(asm.const_uint8_t), "b"),
            asm.Argument(asm.ptr(asm.int32_t), "c"))
    from jit.isa_targets import target_for

    target = target_for("avx2_vnni" if vex else "avx512_core_vnni")
    with asm.Function("run_" + cls.__name__, args, None, target=target) as function:
        pa, pb, pc = asm.GeneralPurposeRegister64(), asm.GeneralPurposeRegister64(), asm.GeneralPurposeRegister64()
        for reg, arg in zip((pa, pb, pc), args):
            asm.LOAD.ARGUMENT(reg, arg)
        if vex:
            acc_r, x = asm.YMMRegister(), asm.YMMRegister()
            asm.VMOVDQU(acc_r, [pc])
            asm.VMOVDQU(x, [pa])
            cls(acc_r, x, [pb], vex=True)
            asm.VMOVDQU([pc], acc_r)
            asm.VZEROUPPER()
        else:
            acc_r, x = asm.ZMMRegister(), asm.ZMMRegister()
            asm.VMOVDQU32(acc_r, [pc])
            asm.VMOVDQU32(x, [pa])
            cls(acc_r, x, [pb])
            asm.VMOVDQU32([pc], acc_r)
            asm.VZEROUPPER()
        asm.RETURN()
    code = bytes(function.finalize(asm.abi.system_v_x86_64_abi).encode().code_section.content)
    kernel = Kernel("run_" + cls.__name__, code, signature="void (*)(const uint8_t *, const uint8_t *, int32_t *)")
    try:
        from runtime.ffi import ffi

        out = acc.copy()
        kernel(ffi.from_buffer("uint8_t[]", a), ffi.from_buffer("uint8_t[]", b), ffi.from_buffer("int32_t[]", out))
    finally:
        kernel.close()
    want = _reference(cls.__name__, acc, a, b)
    assert np.array_equal(out, want), f"{cls.__name__} vex={vex}: {out} != {want}"
