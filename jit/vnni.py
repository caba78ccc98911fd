"""VNNI dot-product instructions for PeachPy: VPDPBUSD, VPDPBUSDS, VPDPWSSD, VPDPWSSDS.

Debian's PeachPy snapshot has none of them. They are defined here as ordinary PeachPy
``Instruction`` subclasses (so they work inside a ``peachpy.x86_64.Function`` with
virtual or physical registers, liveness analysis and target checks), in two encodings:

* EVEX (AVX512_VNNI, plus AVX512VL for xmm/ymm), the default::

      VPDPBUSD(zmm0, zmm1, zmm2)                 # also xmm/ymm, registers 0-31
      VPDPBUSD(zmm0(k1), zmm1, zword[rax])       # merge-masking
      VPDPBUSD(zmm0(k1.z), zmm1, dword.to16[rax])  # zero-masking, {1to16} dword broadcast

* VEX (AVX-VNNI), only when asked for with ``vex=True``::

      VPDPBUSD(ymm0, ymm1, hword[rax], vex=True)  # xmm/ymm, registers 0-15, no masks

An xmm/ymm form with registers 0-15 and no mask could be either; the keyword makes the
choice explicit, so the same template call always yields the same bytes and the same
ISA requirement. ``vex=True`` with zmm, a mask, a broadcast or xmm16-31 is a SyntaxError.

The four instructions share one operand syntax and differ only in the opcode byte
(0F38 50..53, pp=66, W0), so one base class builds every form from that byte.

PeachPy quirks handled here (see tests/test_vnni_encoding.py):

* PeachPy's own EVEX instructions compress displacements of broadcast memory operands by
  the full vector width (disp8*64 for ``{1to16}``); the hardware scales by the element
  size (disp8*4). The forms here use N=4 for broadcasts, N=16/32/64 otherwise.
* PeachPy prints masked registers as ``<MaskedRegister object ...>``, drops ``{1toN}``
  and cannot format zmm registers for GAS; these classes format their own operands.
"""
from __future__ import annotations

import inspect

import peachpy.stream
import peachpy.x86_64.isa as _isa
import peachpy.x86_64.options
from peachpy.x86_64.encoding import Flags, evex, modrm_sib_disp, vex3
from peachpy.x86_64.instructions import Instruction
from peachpy.x86_64.operand import (
    MemoryOperand,
    check_operand,
    format_operand_type,
    is_evex_xmm,
    is_evex_ymm,
    is_m128,
    is_m128_m32bcst,
    is_m256,
    is_m256_m32bcst,
    is_m512_m32bcst,
    is_xmm,
    is_xmmkz,
    is_ymm,
    is_ymmkz,
    is_zmm,
    is_zmmkz,
)
from peachpy.x86_64.registers import MaskedRegister, Register, ZMMRegister


class _VnniExtension(_isa.Extension):
    """An ISA extension PeachPy does not know; ``base`` supplies its prerequisites."""

    def __init__(self, name, base):
        super().__init__(name)
        self._base = base

    @property
    def prerequisites(self):
        return tuple(self._base.prerequisites) + (self,)

    @property
    def ancestors(self):
        return (self,)


avx512_vnni = _VnniExtension("AVX512_VNNI", _isa.avx512f)
avx_vnni = _VnniExtension("AVX_VNNI", _isa.avx2)

# Opcode map 0F38 (EVEX.mm / VEX.mmmmm = 0b10); W0 with pp = 0b01 (66): EVEX.W___1pp and VEX.W___Lpp.
_MAP_0F38 = 0b10
_EVEX_W0_66 = 0b00000101
_VEX_W0_66 = 0b00000001

# EVEX forms, one per vector length:
# (dst check, src1 check, src2 register check, src2 memory check, EVEX.L'L, vector bytes, extensions)
_EVEX_FORMS = (
    (is_xmmkz, is_evex_xmm, is_evex_xmm, is_m128_m32bcst, 0b00, 16, (avx512_vnni, _isa.avx512vl)),
    (is_ymmkz, is_evex_ymm, is_evex_ymm, is_m256_m32bcst, 0b01, 32, (avx512_vnni, _isa.avx512vl)),
    (is_zmmkz, is_zmm, is_zmm, is_m512_m32bcst, 0b10, 64, (avx512_vnni,)),
)
# VEX forms: (register check, memory check, VEX.L)
_VEX_FORMS = (
    (is_xmm, is_m128, 0),
    (is_ymm, is_m256, 1),
)


def _check_write_mask(dst):
    # Checked again at encoding time: a virtual mask register is bound after construction.
    if isinstance(dst, MaskedRegister) and dst.kcode == 0:
        raise ValueError("k0 can not be used as a write mask (EVEX.aaa=0 means no masking)")


def _evex_register_form(opcode, ll):
    def encode(op):
        dst, src1, src2 = op
        _check_write_mask(dst)
        return evex(_MAP_0F38, _EVEX_W0_66, ll, dst.ehcode, src2, src1.code, aaa=dst.kcode, z=dst.zcode) + \
            bytearray([opcode, 0xC0 | dst.lcode << 3 | src2.lcode])
    return encode


def _evex_memory_form(opcode, ll, disp8xn):
    def encode(op, sib=False, min_disp=0):
        dst, src1, src2 = op
        _check_write_mask(dst)
        return evex(_MAP_0F38, _EVEX_W0_66, ll, dst.ehcode, src2.address, src1.code,
                    aaa=dst.kcode, z=dst.zcode, b=src2.bcode) + \
            bytearray([opcode]) + modrm_sib_disp(dst.lcode, src2.address, sib, min_disp, disp8xN=disp8xn)
    return encode


def _check_vex_registers(op):
    # Virtual registers are bound after the form was chosen; VEX can only name 0-15.
    for operand in op:
        if isinstance(operand, Register) and operand.physical_id >= 16:
            raise ValueError("VEX encoding can not name %s (registers 16-31 need EVEX)" % operand)


def _vex_register_form(opcode, l):
    def encode(op):
        _check_vex_registers(op)
        dst, src1, src2 = op
        return bytearray([0xC4, 0xE0 ^ _MAP_0F38 ^ (dst.hcode << 7) ^ (src2.hcode << 5),
                          (0x78 | l << 2 | _VEX_W0_66) ^ (src1.hlcode << 3),
                          opcode, 0xC0 | dst.lcode << 3 | src2.lcode])
    return encode


def _vex_memory_form(opcode, l):
    def encode(op, sib=False, min_disp=0):
        _check_vex_registers(op)
        dst, src1, src2 = op
        return vex3(0xC4, _MAP_0F38, l << 2 | _VEX_W0_66, dst.hcode, src2.address, src1.hlcode) + \
            bytearray([opcode]) + modrm_sib_disp(dst.lcode, src2.address, sib, min_disp)
    return encode


def _vex_limitation(operands):
    """Why VEX can not express these operands, or None."""
    for operand in operands:
        if isinstance(operand, MaskedRegister):
            return "masking"
        if isinstance(operand, ZMMRegister):
            return "zmm registers"
        if isinstance(operand, MemoryOperand) and operand.broadcast is not None:
            return "broadcast"
        if isinstance(operand, Register) and operand.physical_id is not None and operand.physical_id >= 16:
            return "register %s (VEX names only registers 0-15)" % operand
    return None


def _format_operand(operand, assembly_format):
    gas = assembly_format == "gas"
    if isinstance(operand, MaskedRegister):
        k = _format_operand(operand.mask.mask_register, assembly_format)
        return _format_operand(operand.register, assembly_format) + "{" + k + "}" + \
            ("{z}" if operand.mask.is_zeroing else "")
    if isinstance(operand, Register):
        return ("%" if gas else "") + str(operand)
    if isinstance(operand, MemoryOperand):
        text = operand.format("gas") if gas else str(operand)
        if operand.broadcast is not None:
            text += "{1to%d}" % operand.broadcast
        return text
    return str(operand)


class _VnniInstruction(Instruction):
    """Shared body of the four VNNI instructions; subclasses set ``opcode``.

    Supported forms (``vex=False``, the default; EVEX.66.0F38.W0 opcode /r):

        * OP(xmm{k}{z}, xmm, xmm/m128/m32bcst)    [AVX512_VNNI and AVX512VL]
        * OP(ymm{k}{z}, ymm, ymm/m256/m32bcst)    [AVX512_VNNI and AVX512VL]
        * OP(zmm{k}{z}, zmm, zmm/m512/m32bcst)    [AVX512_VNNI]

    and with ``vex=True`` (VEX.128/256.66.0F38.W0 opcode /r, registers 0-15 only):

        * OP(xmm, xmm, xmm/m128)                  [AVX_VNNI]
        * OP(ymm, ymm, ymm/m256)                  [AVX_VNNI]
    """

    opcode = None

    def __init__(self, *args, vex=False, origin=None, prototype=None):
        if origin is None and prototype is None and peachpy.x86_64.options.get_debug_level() > 0:
            origin = inspect.stack()
        name = type(self).__name__
        super().__init__(name, origin=origin, prototype=prototype)
        self.operands = tuple(map(check_operand, args))
        if len(self.operands) != 3:
            raise SyntaxError('Instruction "%s" requires 3 operands' % name)
        self.vex = bool(vex)
        self.in_regs = (True, True, True)
        self.out_regs = (True, False, False)
        self.out_operands = (True, False, False)
        self.avx_mode = True
        if self.vex:
            self._gas_name = "{vex} " + name.lower()
            self._choose_vex_form()
        else:
            self._choose_evex_form()
        if peachpy.stream.active_stream is not None:
            peachpy.stream.active_stream.add_instruction(self)

    def _invalid(self, detail=""):
        return SyntaxError("Invalid operand types: %s %s%s" % (
            self.name, ", ".join(map(format_operand_type, self.operands)), detail))

    def _choose_evex_form(self):
        dst, src1, src2 = self.operands
        for is_dst, is_src1, is_src2_reg, is_src2_mem, ll, size, extensions in _EVEX_FORMS:
            if not (is_dst(dst) and is_src1(src1)):
                continue
            if is_src2_reg(src2):
                self.encodings.append((0x00, _evex_register_form(self.opcode, ll)))
            elif is_src2_mem(src2):
                disp8xn = 4 if src2.broadcast else size  # broadcasts compress by the dword size
                self.encodings.append((Flags.ModRMSIBDisp, _evex_memory_form(self.opcode, ll, disp8xn)))
            else:
                continue
            if isinstance(dst, MaskedRegister) and dst.mask.mask_register.physical_id == 0:
                raise SyntaxError("%s: k0 can not be used as a write mask" % self.name)
            self.isa_extensions = frozenset(extensions)
            return
        raise self._invalid()

    def _choose_vex_form(self):
        limitation = _vex_limitation(self.operands)
        if limitation is not None:
            raise SyntaxError("%s with vex=True (AVX-VNNI) can not express %s; use the EVEX form" % (
                self.name, limitation))
        dst, src1, src2 = self.operands
        for is_reg, is_mem, l in _VEX_FORMS:
            if not (is_reg(dst) and is_reg(src1)):
                continue
            if is_reg(src2):
                self.encodings.append((0x00, _vex_register_form(self.opcode, l)))
            elif is_mem(src2):
                self.encodings.append((Flags.ModRMSIBDisp, _vex_memory_form(self.opcode, l)))
            else:
                continue
            self.isa_extensions = frozenset([avx_vnni])
            return
        raise self._invalid(" (vex=True)")

    def __str__(self):
        return ("{vex} " if self.vex else "") + self.name + " " + \
            ", ".join(_format_operand(op, "peachpy") for op in self.operands)

    def format(self, assembly_format, indent=False, line_number=None):
        if assembly_format != "gas":
            return super().format(assembly_format, indent=indent, line_number=line_number)
        text = "\t" * self._indent_level if indent else ""
        return text + self.gas_name + " " + \
            ", ".join(_format_operand(op, "gas") for op in reversed(self.operands))


class VPDPBUSD(_VnniInstruction):
    """Multiply unsigned bytes (src1) by signed bytes (src2), add groups of 4 products to dwords."""

    opcode = 0x50


class VPDPBUSDS(_VnniInstruction):
    """VPDPBUSD with signed saturation of the dword sums."""

    opcode = 0x51


class VPDPWSSD(_VnniInstruction):
    """Multiply signed words (src1 by src2), add pairs of products to dwords."""

    opcode = 0x52


class VPDPWSSDS(_VnniInstruction):
    """VPDPWSSD with signed saturation of the dword sums."""

    opcode = 0x53


__all__ = ["avx512_vnni", "avx_vnni", "VPDPBUSD", "VPDPBUSDS", "VPDPWSSD", "VPDPWSSDS"]
