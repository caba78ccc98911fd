"""An x86-64 interpreter for the instructions int8jit's kernels use, for the tests.

The paths this CPU lacks (AVX-512 on an AVX2 machine) are otherwise only generated and
disassembled. This runs their bytes, decoded by iced-x86, against the process's real
memory (ctypes), one instruction at a time, with the semantics the Intel SDM gives each
instruction: VPMADDUBSW's saturation, VPDPBUSD's wrap-around, masked (fault-suppressing)
loads and stores, the f32 output stage. It is checked against the CPU on the paths the
CPU has (``tests/test_emulated_paths.py``): an emulated AVX2 kernel must write the bytes
the native one writes. An instruction it does not know raises ``NotImplementedError``.

It is slow (about 20 microseconds an instruction, decoding included): for small
problems only. It knows the process's memory only through the addresses the kernel
computes, so a kernel reading outside its buffers may crash the process here as it would
natively (the guard-page tests catch those natively).
"""
from __future__ import annotations

import ctypes

import iced_x86 as ix
import numpy as np

M64 = (1 << 64) - 1
_RET = 0x7E57_0000_0000  # the return address the emulated call starts with
_BASE = {ix.Register.RAX: ("gpr", 8), ix.Register.EAX: ("gpr", 4), ix.Register.AX: ("gpr", 2),
         ix.Register.AL: ("gpr", 1), ix.Register.XMM0: ("vec", 16), ix.Register.YMM0: ("vec", 32),
         ix.Register.ZMM0: ("vec", 64), ix.Register.K0: ("k", 8)}
_REG: dict = {}


def _reg(reg: int) -> tuple[str, int, int]:
    """(class, number, bytes) of an iced register."""
    if reg not in _REG:
        info = ix.RegisterInfo(reg)
        kind, size = _BASE[info.base]
        # (a byte register's number counts AH..BH: the GPR's is its full register's)
        number = ix.RegisterInfo(info.full_register).number if kind == "gpr" else info.number
        _REG[reg] = (kind, number, size)
    return _REG[reg]


def _read(addr: int, n: int) -> np.ndarray:
    return np.frombuffer(ctypes.string_at(int(addr), int(n)), np.uint8).copy()


def _write(addr: int, data: np.ndarray) -> None:
    data = np.ascontiguousarray(data).view(np.uint8)
    ctypes.memmove(int(addr), data.ctypes.data, data.nbytes)


def _sat(x: np.ndarray, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(x, info.min, info.max).astype(dtype)


def _cvt_ps2dq(x: np.ndarray) -> np.ndarray:
    """VCVTPS2DQ under the default MXCSR: round to nearest even; NaN and out of range
    give the integer indefinite 0x80000000."""
    r = np.rint(x.astype(np.float64))
    bad = ~np.isfinite(r) | (r >= 2.0 ** 31) | (r < -(2.0 ** 31))
    r = np.where(bad, 0.0, r)  # (no NaN reaches the integer conversion)
    return np.where(bad, -(2 ** 31), r).astype(np.int64).astype(np.int32)


def _mapping_end(addr: int) -> int:
    """Where the mapping holding ``addr`` ends (/proc/self/maps), so that decoding the
    code's last instruction does not read past it."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return hi
    raise ValueError(f"{addr:#x} is not mapped")


def _decode(rip: int, end: int):
    ins = ix.Decoder(64, ctypes.string_at(rip, min(15, end - rip)), ip=rip).decode()
    if ins.is_invalid:
        raise NotImplementedError(f"undecodable bytes at {rip:#x}")
    return ins


class _Facts:
    """An instruction's operands as the vector handlers read them: per operand ("vec",
    number, bytes, register), ("gpr", number, bytes, register), ("mem", broadcast,
    element bytes, bytes) or None (an immediate); its vector width (its widest vector
    register, at least 16 bytes); whether it has an opmask."""

    __slots__ = ("ops", "width", "masked", "handler", "next_ip")

    def __init__(self, ins):
        # handler: the function that executes it; None for flow control (Machine.step)
        self.next_ip = ins.next_ip
        self.handler = None
        if ins.flow_control == ix.FlowControl.NEXT:
            self.handler = _SCALAR.get(ins.mnemonic) or _VECTOR.get(ins.mnemonic)
            if self.handler is None:
                raise NotImplementedError(str(ins))
        ops = []
        for i in range(ins.op_count):
            kind = ins.op_kind(i)
            if kind == ix.OpKind.REGISTER:
                reg = ins.op_register(i)
                cls, n, size = _reg(reg)
                ops.append((cls, n, size, reg))
            elif kind == ix.OpKind.MEMORY:
                info = ix.MemorySizeInfo(ins.memory_size)
                ops.append(("mem", info.is_broadcast, info.element_size, info.size))
            else:
                ops.append(None)
        self.ops = tuple(ops)
        self.width = max([16] + [op[2] for op in ops if op is not None and op[0] == "vec"])
        self.masked = ins.op_mask != ix.Register.NONE


class Machine:
    """Registers and flags of one emulated thread; :meth:`call` runs a function."""

    def __init__(self) -> None:
        self.gpr = [0] * 16
        self.vec = np.zeros((32, 64), np.uint8)
        self.k = [0] * 8
        self.zf = self.sf = self.cf = self.of = False
        self._stack = np.zeros(1 << 16, np.uint8)
        self.cur: _Facts | None = None  # the instruction being executed, as its handlers read it

    # -- operands ---------------------------------------------------------------------
    def addr(self, ins) -> int:
        if ins.is_ip_rel_memory_operand:
            return ins.ip_rel_memory_address
        a = ins.memory_displacement
        if ins.memory_base != ix.Register.NONE:
            a += self.gpr[_reg(ins.memory_base)[1]]
        if ins.memory_index != ix.Register.NONE:
            a += self.gpr[_reg(ins.memory_index)[1]] * ins.memory_index_scale
        return a & M64

    def get_gpr(self, reg: int) -> int:
        _, n, size = _reg(reg)
        return self.gpr[n] & ((1 << (8 * size)) - 1)

    def set_gpr(self, reg: int, value: int) -> None:
        _, n, size = _reg(reg)
        if size >= 4:  # a 32-bit write zero-extends
            self.gpr[n] = value & ((1 << (8 * size)) - 1)
        else:
            mask = (1 << (8 * size)) - 1
            self.gpr[n] = (self.gpr[n] & ~mask & M64) | (value & mask)

    def scalar(self, ins, i: int, size: int) -> int:
        """Operand i as an unsigned ``size``-byte integer."""
        kind = ins.op_kind(i)
        if kind == ix.OpKind.REGISTER:
            return self.get_gpr(ins.op_register(i))
        if kind == ix.OpKind.MEMORY:
            return int.from_bytes(ctypes.string_at(self.addr(ins), size), "little")
        return ins.immediate(i) & ((1 << (8 * size)) - 1)

    def set_scalar(self, ins, value: int, size: int) -> None:
        if ins.op_kind(0) == ix.OpKind.REGISTER:
            self.set_gpr(ins.op_register(0), value)
        else:
            ctypes.memmove(self.addr(ins), (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little"), size)

    def vsrc(self, ins, i: int, width: int) -> np.ndarray:
        """Operand i, ``width`` bytes of a vector register or memory (a broadcast element
        repeated; under an opmask only the selected elements read)."""
        op = self.cur.ops[i]
        if op[0] == "gpr":
            return np.frombuffer(self.get_gpr(op[3]).to_bytes(op[2], "little"), np.uint8).copy()
        if op[0] == "vec":
            return self.vec[op[1], :width].copy()
        _, broadcast, element, size = op  # memory
        if broadcast:
            return np.tile(_read(self.addr(ins), element), width // element)
        return self.read_masked(ins, min(width, size), max(1, element))

    def read_masked(self, ins, nbytes: int, per: int) -> np.ndarray:
        """``nbytes`` of the memory operand, ``per`` bytes to an opmask bit: under a mask
        only the selected elements are read (EVEX suppresses faults on the others)."""
        if ins.op_mask == ix.Register.NONE:
            return _read(self.addr(ins), nbytes)
        a, out = self.addr(ins), np.zeros(nbytes, np.uint8)
        for e in np.flatnonzero(self.mask_bits(ins, nbytes // per)):
            out[e * per: (e + 1) * per] = _read(a + e * per, per)
        return out

    def mask_bits(self, ins, elements: int) -> np.ndarray | None:
        if ins.op_mask == ix.Register.NONE:
            return None
        k = self.k[_reg(ins.op_mask)[1]]
        return np.array([(k >> e) & 1 for e in range(elements)], bool)

    def vdst(self, ins, value: np.ndarray, esize: int) -> None:
        """Write a vector result to operand 0 (register: the rest of the 512 bits zeroed,
        as VEX and EVEX writes do; merge- or zero-masked by the op mask)."""
        value = np.ascontiguousarray(value).view(np.uint8)
        f = self.cur
        if f.ops[0][0] == "mem":
            self.store(ins, value, esize)
            return
        n = f.ops[0][1]
        mask = self.mask_bits(ins, value.size // esize) if f.masked else None
        if mask is not None:
            old = self.vec[n, : value.size].copy()
            if ins.zeroing_masking:
                old[:] = 0
            m = np.repeat(mask, esize)
            value = np.where(m, value, old)
        self.vec[n, :] = 0
        self.vec[n, : value.size] = value

    def store(self, ins, value: np.ndarray, esize: int) -> None:
        a = self.addr(ins)
        mask = self.mask_bits(ins, value.size // esize)
        if mask is None:
            _write(a, value)
            return
        for e in np.flatnonzero(mask):  # only the masked elements are touched
            _write(a + e * esize, value[e * esize: (e + 1) * esize])

    # -- flags ------------------------------------------------------------------------
    def logic_flags(self, r: int, size: int) -> None:
        bits = 8 * size
        r &= (1 << bits) - 1
        self.zf, self.sf, self.cf, self.of = r == 0, bool(r >> (bits - 1)), False, False

    def arith_flags(self, a: int, b: int, r: int, size: int, sub: bool) -> None:
        bits = 8 * size
        mask = (1 << bits) - 1
        res = r & mask
        sa, sb, sr = a >> (bits - 1) & 1, b >> (bits - 1) & 1, res >> (bits - 1) & 1
        self.zf, self.sf = res == 0, bool(sr)
        self.cf = (a & mask) < (b & mask) if sub else r > mask
        self.of = bool((sa != sb and sr != sa) if sub else (sa == sb and sr != sa))

    def condition(self, cc) -> bool:
        C = ix.ConditionCode
        return {C.E: self.zf, C.NE: not self.zf, C.B: self.cf, C.AE: not self.cf,
                C.BE: self.cf or self.zf, C.A: not (self.cf or self.zf), C.S: self.sf, C.NS: not self.sf,
                C.O: self.of, C.NO: not self.of, C.L: self.sf != self.of, C.GE: self.sf == self.of,
                C.LE: self.zf or self.sf != self.of, C.G: not self.zf and self.sf == self.of}[cc]

    # -- running ----------------------------------------------------------------------
    def call(self, fn: int, *args: int, limit: int = 50_000_000) -> None:
        """Run the function at ``fn`` with integer/pointer ``args`` (System V) to its return."""
        for reg, value in zip((7, 6, 2, 1, 8, 9), args):  # rdi, rsi, rdx, rcx, r8, r9
            self.gpr[reg] = value & M64
        rsp = (self._stack.ctypes.data + self._stack.nbytes - 64) & ~63
        rsp -= 8
        ctypes.memmove(rsp, _RET.to_bytes(8, "little"), 8)
        self.gpr[4] = rsp
        end = _mapping_end(fn)  # (a kernel calls nothing: its code is one mapping)
        decoded: dict = {}  # rip -> (instruction, its _Facts), for this call (code may be remapped after it)
        rip, executed = fn, 0
        while rip != _RET:
            entry = decoded.get(rip)
            if entry is None:
                ins = _decode(rip, end)
                entry = decoded[rip] = (ins, _Facts(ins))
            rip = self.step(*entry)
            executed += 1
            if executed > limit:
                raise RuntimeError("emulated call ran past its instruction limit")

    def step(self, ins, facts: "_Facts") -> int:
        """Execute one instruction; the next rip."""
        if facts.handler is not None:
            self.cur = facts
            facts.handler(self, ins)
            return facts.next_ip
        M, name = ix.Mnemonic, ins.mnemonic
        nxt = ins.next_ip
        if name == M.RET:
            rsp = self.gpr[4]
            self.gpr[4] = rsp + 8
            return int.from_bytes(ctypes.string_at(rsp, 8), "little")
        if name == M.JMP and ins.op_kind(0) == ix.OpKind.NEAR_BRANCH64:
            return ins.near_branch_target
        if ins.is_jcc_short_or_near:
            return ins.near_branch_target if self.condition(ins.condition_code) else nxt
        raise NotImplementedError(f"{ins} (flow control)")


# -- int8jit's kernel calls, emulated ---------------------------------------------------
class EmulatedFunction:
    """What ``Kernel.function`` gives while emulating: called like the cffi pointer,
    it runs the kernel's bytes in a fresh :class:`Machine` (so Python threads calling
    it at once do not share registers)."""

    def __init__(self, address: int):
        self.address = address

    def __call__(self, *args) -> None:
        _emulate(self, *args)


def _address(value) -> int:
    from runtime.ffi import ffi

    if isinstance(value, EmulatedFunction):
        return value.address
    return value if isinstance(value, int) else int(ffi.cast("uintptr_t", value))


def _emulate(fn, *args) -> None:
    Machine().call(_address(fn), *(_address(a) for a in args))


def _plan_init(plan, per_thread) -> None:
    plan._keep = [list(calls) for calls in per_thread] or [[]]
    plan.threads = len(plan._keep)


def _plan_run(plan) -> None:
    for calls in plan._keep:  # one thread's list after another (a plan made natively too)
        for fn, arg in calls:
            _emulate(fn, arg)


def emulation_switch(monkeypatch):
    """``switch(on)``: with ``on``, every int8jit kernel call goes through the emulator
    (``Kernel.function`` and the thread pool's call plans: a plan's calls run one after
    another) and every ISA path counts as supported, so primitives make their kernels;
    without, native calls on the CPU's own paths. Either way the primitives made before
    are dropped from the cache, so a primitive's plans are made in the mode that runs
    them. (The CPU is probed natively first: CPUID is not emulated.)"""
    from primitives import primitive_cache
    from runtime import isa as isa_mod
    from runtime import pool
    from runtime.cpu import cpu_info
    from runtime.kernel import Kernel

    cpu_info()
    native = {(pool.CallPlan, "__init__"): pool.CallPlan.__init__, (pool.CallPlan, "run"): pool.CallPlan.run,
              (Kernel, "function"): Kernel.__dict__["function"], (isa_mod, "supported"): isa_mod.supported}
    emulating = {(pool.CallPlan, "__init__"): _plan_init, (pool.CallPlan, "run"): _plan_run,
                 (Kernel, "function"): property(lambda kernel: EmulatedFunction(kernel.address)),
                 (isa_mod, "supported"): lambda: isa_mod.LADDER}

    def switch(on: bool) -> None:
        primitive_cache.clear()
        for (owner, name), value in (emulating if on else native).items():
            monkeypatch.setattr(owner, name, value)
    return switch


# -- scalar instructions ---------------------------------------------------------------
def _size0(ins) -> int:
    if ins.op_kind(0) == ix.OpKind.REGISTER:
        return _reg(ins.op_register(0))[2]
    return ix.MemorySizeInfo(ins.memory_size).size


def _mov(m: Machine, ins) -> None:
    size = _size0(ins)
    m.set_scalar(ins, m.scalar(ins, 1, size), size)


def _movsxd(m: Machine, ins) -> None:
    v = m.scalar(ins, 1, 4)
    m.set_gpr(ins.op_register(0), v - (1 << 32) if v >> 31 else v)


def _movzx(m: Machine, ins) -> None:
    size = _reg(ins.op_register(1))[2] if ins.op_kind(1) == ix.OpKind.REGISTER else \
        ix.MemorySizeInfo(ins.memory_size).size
    m.set_gpr(ins.op_register(0), m.scalar(ins, 1, size))


def _lea(m: Machine, ins) -> None:
    m.set_gpr(ins.op_register(0), m.addr(ins))


def _arith(op: str):
    def run(m: Machine, ins) -> None:
        size = _size0(ins)
        a = m.scalar(ins, 0, size)
        b = 1 if op in ("inc", "dec") else m.scalar(ins, 1, size)
        sub = op in ("sub", "cmp", "dec")
        r = a - b if sub else a + b
        cf = m.cf
        m.arith_flags(a, b, r, size, sub)
        if op in ("inc", "dec"):
            m.cf = cf  # INC and DEC leave CF alone
        if op != "cmp":
            m.set_scalar(ins, r, size)
    return run


def _logic(op: str):
    def run(m: Machine, ins) -> None:
        size = _size0(ins)
        a, b = m.scalar(ins, 0, size), m.scalar(ins, 1, size)
        r = {"and": a & b, "or": a | b, "xor": a ^ b, "test": a & b}[op]
        m.logic_flags(r, size)
        if op != "test":
            m.set_scalar(ins, r, size)
    return run


def _signed(v: int, size: int) -> int:
    bits = 8 * size
    return v - (1 << bits) if v >> (bits - 1) else v


def _imul(m: Machine, ins) -> None:
    size = _size0(ins)
    if ins.op_count == 3:
        a, b = m.scalar(ins, 1, size), ins.immediate(2) & ((1 << (8 * size)) - 1)
    else:
        a, b = m.scalar(ins, 0, size), m.scalar(ins, 1, size)
    m.set_gpr(ins.op_register(0), _signed(a, size) * _signed(b, size))


def _shift(op: str):
    def run(m: Machine, ins) -> None:
        size = _size0(ins)
        bits = 8 * size
        if op in ("shrx", "shlx", "sarx"):
            v, count = m.scalar(ins, 1, size), m.scalar(ins, 2, size) & (bits - 1)
        else:
            v = m.scalar(ins, 0, size)
            count = (1 if ins.op_count == 1 else m.scalar(ins, 1, 1)) & (bits - 1)
        if op.startswith("shr"):
            r = v >> count
        elif op.startswith("shl"):
            r = v << count
        else:
            r = _signed(v, size) >> count
        r &= (1 << bits) - 1
        if op in ("shrx", "shlx", "sarx"):  # (BMI2: three operands, no flags)
            m.set_gpr(ins.op_register(0), r)
            return
        if count:
            m.logic_flags(r, size)
        m.set_scalar(ins, r, size)
    return run


def _neg(m: Machine, ins) -> None:
    size = _size0(ins)
    v = m.scalar(ins, 0, size)
    m.arith_flags(0, v, -v, size, True)
    m.set_scalar(ins, -v, size)


def _push(m: Machine, ins) -> None:
    m.gpr[4] -= 8
    ctypes.memmove(m.gpr[4], m.scalar(ins, 0, 8).to_bytes(8, "little"), 8)


def _pop(m: Machine, ins) -> None:
    m.set_gpr(ins.op_register(0), int.from_bytes(ctypes.string_at(m.gpr[4], 8), "little"))
    m.gpr[4] += 8


def _nop(m: Machine, ins) -> None:
    pass


def _vzeroupper(m: Machine, ins) -> None:
    m.vec[:16, 16:] = 0


_KBITS = {ix.Mnemonic.KMOVB: 8, ix.Mnemonic.KMOVW: 16, ix.Mnemonic.KMOVD: 32, ix.Mnemonic.KMOVQ: 64}


def _kxnor(m: Machine, ins) -> None:
    n = [_reg(ins.op_register(i))[1] for i in range(3)]
    bits = 64 if ins.mnemonic == ix.Mnemonic.KXNORQ else 16
    m.k[n[0]] = ~(m.k[n[1]] ^ m.k[n[2]]) & ((1 << bits) - 1)


def _kshiftr(m: Machine, ins) -> None:
    bits = 32 if ins.mnemonic == ix.Mnemonic.KSHIFTRD else 64 if ins.mnemonic == ix.Mnemonic.KSHIFTRQ else 16
    v = m.k[_reg(ins.op_register(1))[1]] & ((1 << bits) - 1)
    m.k[_reg(ins.op_register(0))[1]] = v >> ins.immediate(2) if ins.immediate(2) < bits else 0


def _kmov(m: Machine, ins) -> None:
    """KMOVB/W/D/Q between mask registers, general registers and memory (zero-extended)."""
    bits = _KBITS[ins.mnemonic]
    mask = (1 << bits) - 1
    dst_k = ins.op_kind(0) == ix.OpKind.REGISTER and _reg(ins.op_register(0))[0] == "k"
    if ins.op_kind(1) == ix.OpKind.MEMORY:
        v = int.from_bytes(ctypes.string_at(m.addr(ins), bits // 8), "little")
    elif _reg(ins.op_register(1))[0] == "k":
        v = m.k[_reg(ins.op_register(1))[1]]
    else:
        v = m.get_gpr(ins.op_register(1))
    v &= mask
    if dst_k:
        m.k[_reg(ins.op_register(0))[1]] = v
    elif ins.op_kind(0) == ix.OpKind.MEMORY:
        ctypes.memmove(m.addr(ins), v.to_bytes(bits // 8, "little"), bits // 8)
    else:
        m.set_gpr(ins.op_register(0), v)


def _cmov(m: Machine, ins) -> None:
    size = _size0(ins)
    value = m.scalar(ins, 1, size) if m.condition(ins.condition_code) else m.get_gpr(ins.op_register(0))
    m.set_gpr(ins.op_register(0), value)  # (a 32-bit CMOV zero-extends, taken or not)


def _bzhi(m: Machine, ins) -> None:
    size = _size0(ins)
    v, n = m.scalar(ins, 1, size), m.scalar(ins, 2, size) & 0xFF
    r = v & ((1 << n) - 1) if n < 8 * size else v
    m.logic_flags(r, size)
    m.cf = n > 8 * size - 1
    m.set_gpr(ins.op_register(0), r)


_SCALAR = {
    ix.Mnemonic.MOV: _mov, ix.Mnemonic.MOVSXD: _movsxd, ix.Mnemonic.MOVZX: _movzx, ix.Mnemonic.LEA: _lea,
    ix.Mnemonic.ADD: _arith("add"), ix.Mnemonic.SUB: _arith("sub"), ix.Mnemonic.CMP: _arith("cmp"),
    ix.Mnemonic.INC: _arith("inc"), ix.Mnemonic.DEC: _arith("dec"), ix.Mnemonic.AND: _logic("and"),
    ix.Mnemonic.OR: _logic("or"), ix.Mnemonic.XOR: _logic("xor"), ix.Mnemonic.TEST: _logic("test"),
    ix.Mnemonic.IMUL: _imul, ix.Mnemonic.SHR: _shift("shr"), ix.Mnemonic.SHL: _shift("shl"),
    ix.Mnemonic.SAR: _shift("sar"), ix.Mnemonic.SHRX: _shift("shrx"), ix.Mnemonic.SHLX: _shift("shlx"),
    ix.Mnemonic.SARX: _shift("sarx"), ix.Mnemonic.NEG: _neg, ix.Mnemonic.PUSH: _push, ix.Mnemonic.POP: _pop,
    ix.Mnemonic.PREFETCHT0: _nop, ix.Mnemonic.PREFETCHT1: _nop, ix.Mnemonic.PREFETCHT2: _nop,
    ix.Mnemonic.PREFETCHNTA: _nop, ix.Mnemonic.NOP: _nop, ix.Mnemonic.VZEROUPPER: _vzeroupper,
    ix.Mnemonic.KXNORW: _kxnor, ix.Mnemonic.KXNORQ: _kxnor, ix.Mnemonic.KMOVB: _kmov, ix.Mnemonic.KMOVW: _kmov, ix.Mnemonic.KMOVD: _kmov,
    ix.Mnemonic.KMOVQ: _kmov, ix.Mnemonic.KSHIFTRW: _kshiftr, ix.Mnemonic.KSHIFTRD: _kshiftr,
    ix.Mnemonic.KSHIFTRQ: _kshiftr, ix.Mnemonic.BZHI: _bzhi,
    **{getattr(ix.Mnemonic, "CMOV" + cc): _cmov for cc in ("E", "NE", "B", "AE", "BE", "A", "S", "NS", "L", "GE",
                                                             "LE", "G", "O", "NO")},
}


# -- vector instructions ---------------------------------------------------------------
def _binary(fn, dtype, esize: int):
    """dst = fn(src1, src2) elementwise on ``dtype`` lanes (three-operand VEX/EVEX form)."""
    def run(m: Machine, ins) -> None:
        w = m.cur.width
        a = m.vsrc(ins, 1, w).view(dtype)
        b = m.vsrc(ins, 2, w).view(dtype)
        m.vdst(ins, fn(a, b).astype(dtype), esize)
    return run


def _maddubsw(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    p = a.view(np.uint8).astype(np.int32) * b.view(np.int8).astype(np.int32)
    return _sat(p[0::2] + p[1::2], np.int16)


def _maddwd(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    p = a.view(np.int16).astype(np.int64) * b.view(np.int16).astype(np.int64)
    return (p[0::2] + p[1::2]).astype(np.uint32).view(np.int32)  # -32768^2 * 2 wraps


def _dpbusd(m: Machine, ins) -> None:
    w = m.cur.width
    acc = m.vsrc(ins, 0, w).view(np.int32).astype(np.int64)
    a = m.vsrc(ins, 1, w).astype(np.int64)
    b = m.vsrc(ins, 2, w).view(np.int8).astype(np.int64)
    s = (a * b).reshape(-1, 4).sum(axis=1)
    m.vdst(ins, (acc + s).astype(np.uint32).view(np.int32), 4)  # wraps, as VPDPBUSD does


def _move(esize: int):
    """Loads, stores and register moves (masked where the instruction has a mask)."""
    def run(m: Machine, ins) -> None:
        m.vdst(ins, m.vsrc(ins, 1, m.cur.width), esize)
    return run


def _movd(m: Machine, ins) -> None:
    size = 8 if ins.mnemonic == ix.Mnemonic.VMOVQ else 4
    if ins.op_kind(0) == ix.OpKind.REGISTER and _reg(ins.op_register(0))[0] == "vec":
        v = np.zeros(16, np.uint8)
        v[:size] = m.vsrc(ins, 1, size)[:size]
        m.vdst(ins, v, 4)
    elif ins.op_kind(0) == ix.OpKind.REGISTER:
        m.set_gpr(ins.op_register(0), int.from_bytes(m.vec[_reg(ins.op_register(1))[1], :size].tobytes(), "little"))
    else:
        _write(m.addr(ins), m.vec[_reg(ins.op_register(1))[1], :size])


def _broadcast(esize: int):
    def run(m: Machine, ins) -> None:
        w = m.cur.width
        if ins.op_kind(1) == ix.OpKind.MEMORY:
            e = _read(m.addr(ins), esize)
        elif _reg(ins.op_register(1))[0] == "gpr":
            e = np.frombuffer(m.get_gpr(ins.op_register(1)).to_bytes(8, "little")[:esize], np.uint8)
        else:
            e = m.vec[_reg(ins.op_register(1))[1], :esize]
        m.vdst(ins, np.tile(e, w // esize), esize)
    return run


_LANE_BASES = np.arange(64) & ~15  # each byte's 128-bit lane's first byte


def _pshufb(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.view(np.uint8), b.view(np.uint8)
    out = a[_LANE_BASES[: a.size] + (b & 15)]  # within each 128-bit lane
    out[b >= 0x80] = 0
    return out


def _pmov(dtype, saturate: str | None):
    """VPMOVDB and friends: dwords to bytes, truncated or saturated."""
    def run(m: Machine, ins) -> None:
        src_w = m.cur.width
        v = m.vec[_reg(ins.op_register(1))[1], :src_w].view(np.int32)
        if saturate == "s":
            out = _sat(v, np.int8)
        elif saturate == "us":
            out = np.clip(v.view(np.uint32), 0, 255).astype(np.uint8)
        else:
            out = v.astype(dtype)
        out = out.view(np.uint8)
        if ins.op_kind(0) == ix.OpKind.MEMORY:
            m.store(ins, out, 1)
        else:
            padded = np.zeros(16, np.uint8)
            padded[: out.size] = out
            m.vdst(ins, padded, 1)
    return run


def _pcmpgtd(m: Machine, ins) -> None:
    w = m.cur.width
    a = m.vsrc(ins, 1, w).view(np.int32)
    b = m.vsrc(ins, 2, w).view(np.int32)
    if _reg(ins.op_register(0))[0] == "k":
        bits = a > b
        m.k[_reg(ins.op_register(0))[1]] = int(sum(1 << i for i in np.flatnonzero(bits)))
    else:
        m.vdst(ins, np.where(a > b, -1, 0).astype(np.int32), 4)


def _maskmov(m: Machine, ins) -> None:
    """VMASKMOVPS / VPMASKMOVD: the mask is each dword's sign bit; only those are touched."""
    w = m.cur.width
    if ins.op_kind(0) == ix.OpKind.MEMORY:  # store: [mem], mask, value
        mask = m.vec[_reg(ins.op_register(1))[1], :w].view(np.int32) < 0
        value = m.vec[_reg(ins.op_register(2))[1], :w]
        a = m.addr(ins)
        for e in np.flatnonzero(mask):
            _write(a + 4 * e, value[4 * e: 4 * e + 4])
    else:  # load: dst, mask, [mem]
        mask = m.vec[_reg(ins.op_register(1))[1], :w].view(np.int32) < 0
        a, out = m.addr(ins), np.zeros(w, np.uint8)
        for e in np.flatnonzero(mask):
            out[4 * e: 4 * e + 4] = _read(a + 4 * e, 4)
        m.vdst(ins, out, 4)


def _unary(fn, dtype_in, dtype_out, esize: int):
    def run(m: Machine, ins) -> None:
        w = m.cur.width
        m.vdst(ins, fn(m.vsrc(ins, 1, w).view(dtype_in)).astype(dtype_out), esize)
    return run


def _minmax(pick):
    # x86 MINPS/MAXPS: the second source unless the comparison holds (NaN: the second)
    return lambda a, b: np.where(pick(a, b), a, b)


def _pack(src_dtype, dst_dtype):
    """VPACKSSDW / VPACKUSDW / VPACKSSWB / VPACKUSWB: per 128-bit lane, a's then b's."""
    def fn(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = a.view(src_dtype), b.view(src_dtype)
        per = 16 // np.dtype(src_dtype).itemsize
        parts = []
        for lane in range(0, a.size, per):
            parts += [_sat(a[lane: lane + per], dst_dtype), _sat(b[lane: lane + per], dst_dtype)]
        return np.concatenate(parts)
    return fn


def _unpack(high: bool):
    """VPUNPCKL*/VPUNPCKH*: per 128-bit lane, the low (or high) half's elements of a and b
    interleaved, a's first."""
    def fn(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        per = a.size * 16 // a.nbytes // 2  # elements in half a lane
        out = np.empty_like(a)
        for lane in range(0, a.size, 2 * per):
            half = slice(lane + per, lane + 2 * per) if high else slice(lane, lane + per)
            out[lane: lane + 2 * per: 2], out[lane + 1: lane + 2 * per: 2] = a[half], b[half]
        return out
    return fn


def _inserti128(m: Machine, ins) -> None:
    """VINSERTI128 / VINSERTI32X4: src1 with the 128-bit lane imm8 replaced by src2."""
    w = m.cur.width
    v = m.vsrc(ins, 1, w).copy()
    lane = ins.immediate(3) & (w // 16 - 1)
    v[16 * lane: 16 * lane + 16] = m.vsrc(ins, 2, 16)[:16]
    m.vdst(ins, v, 4)


def _inserti256(m: Machine, ins) -> None:
    """VINSERTI64X4: src1 with the 256-bit half imm8 replaced by src2."""
    v = m.vsrc(ins, 1, 64).copy()
    half = ins.immediate(3) & 1
    v[32 * half: 32 * half + 32] = m.vsrc(ins, 2, 32)[:32]
    m.vdst(ins, v, 8)


def _perm2i128(m: Machine, ins) -> None:
    """VPERM2I128: each 128-bit half of the result is one of src1's or src2's halves
    (imm8 bits 1:0 and 5:4), or zero (bits 3 and 7)."""
    blocks = np.concatenate([m.vsrc(ins, 1, 32), m.vsrc(ins, 2, 32)]).reshape(4, 16)
    imm = ins.immediate(3)
    out = [np.zeros(16, np.uint8) if imm >> (4 * h + 3) & 1 else blocks[imm >> (4 * h) & 3] for h in range(2)]
    m.vdst(ins, np.concatenate(out), 4)


def _pshufd(m: Machine, ins) -> None:
    """VPSHUFD: per 128 bits, dword i of the result is the source's dword imm8[2i+1:2i]."""
    d = m.vsrc(ins, 1, m.cur.width).view(np.uint32).reshape(-1, 4)
    imm = ins.immediate(2)
    m.vdst(ins, d[:, [imm >> (2 * i) & 3 for i in range(4)]].reshape(-1), 4)


def _shufps(m: Machine, ins) -> None:
    """VSHUFPS: per 128 bits, two dwords of src1 then two of src2, picked by imm8."""
    w = m.cur.width
    a, b = m.vsrc(ins, 1, w).view(np.uint32).reshape(-1, 4), m.vsrc(ins, 2, w).view(np.uint32).reshape(-1, 4)
    imm = ins.immediate(3)
    out = np.stack([a[:, imm & 3], a[:, imm >> 2 & 3], b[:, imm >> 4 & 3], b[:, imm >> 6 & 3]], axis=1)
    m.vdst(ins, out.reshape(-1), 4)


def _shufi64x2(m: Machine, ins) -> None:
    """VSHUFI64X2: the result's low half of 128-bit blocks picked from src1's, the high
    half from src2's, by imm8 (1 bit a block in a ymm, 2 in a zmm)."""
    w = m.cur.width
    n = w // 16
    a, b = m.vsrc(ins, 1, w).reshape(n, 16), m.vsrc(ins, 2, w).reshape(n, 16)
    imm, bits = ins.immediate(3), n // 2
    out = [(a if i < n // 2 else b)[imm >> (bits * i) & (n - 1)] for i in range(n)]
    m.vdst(ins, np.concatenate(out), 8)


def _permq(m: Machine, ins) -> None:
    w = m.cur.width
    q = m.vsrc(ins, 1, w).view(np.uint64)
    imm = ins.immediate(2)
    m.vdst(ins, np.array([q[(imm >> (2 * i)) & 3] for i in range(4)], np.uint64), 8)


def _permd(m: Machine, ins) -> None:
    w = m.cur.width
    idx = m.vsrc(ins, 1, w).view(np.uint32)
    d = m.vsrc(ins, 2, w).view(np.uint32)
    m.vdst(ins, d[idx % d.size], 4)


def _perm2d(m: Machine, ins) -> None:
    """VPERMT2D (operand 0 the first table, 1 the indexes) / VPERMI2D (0 the indexes, 1
    the first table); operand 2 the second: index bit log2(lanes) picks the table."""
    w = m.cur.width
    a, b = m.vsrc(ins, 0, w).view(np.uint32), m.vsrc(ins, 1, w).view(np.uint32)
    idx, first = (b, a) if ins.mnemonic == ix.Mnemonic.VPERMT2D else (a, b)
    tables = np.concatenate([first, m.vsrc(ins, 2, w).view(np.uint32)])
    m.vdst(ins, tables[idx % tables.size], 4)


def _extract128(m: Machine, ins) -> None:
    v = m.vec[_reg(ins.op_register(1))[1]]
    part = v[16 * (ins.immediate(2) & 3): 16 * (ins.immediate(2) & 3) + 16]
    if ins.op_kind(0) == ix.OpKind.MEMORY:
        _write(m.addr(ins), part)
    else:
        m.vdst(ins, part, 4)


def _blendv(m: Machine, ins) -> None:
    """VBLENDVPS dst, a, b, mask: b's dword where mask's sign bit is set, else a's."""
    w = m.cur.width
    a, b = m.vsrc(ins, 1, w).view(np.int32), m.vsrc(ins, 2, w).view(np.int32)
    mask = m.vsrc(ins, 3, w).view(np.int32) < 0
    m.vdst(ins, np.where(mask, b, a), 4)


def _ternlog(m: Machine, ins) -> None:
    """VPTERNLOGD: each result bit is imm8's bit at (dst bit, src2 bit, src3 bit)."""
    w = m.cur.width
    a, b, c = (m.vsrc(ins, i, w).view(np.uint32) for i in range(3))
    imm, out = ins.immediate(3), np.zeros_like(a)
    for i in range(8):
        if imm >> i & 1:
            out |= (a if i & 4 else ~a) & (b if i & 2 else ~b) & (c if i & 1 else ~c)
    m.vdst(ins, out, 4)


def _extend(src_dtype, dst_dtype):
    """VPMOVZX / VPMOVSX: the source's low elements, each widened to a destination lane."""
    def run(m: Machine, ins) -> None:
        w = m.cur.width
        n = w // np.dtype(dst_dtype).itemsize * np.dtype(src_dtype).itemsize  # source bytes
        if ins.op_kind(1) == ix.OpKind.MEMORY:  # (a mask bit per destination lane)
            src = m.read_masked(ins, n, np.dtype(src_dtype).itemsize)
        else:
            src = m.vec[_reg(ins.op_register(1))[1], :n]
        m.vdst(ins, src.view(src_dtype).astype(dst_dtype), np.dtype(dst_dtype).itemsize)
    return run


def _shift_dwords(op: str):
    """VPSLLD / VPSRAD / VPSRLD by an immediate or by the low quadword of an xmm."""
    def run(m: Machine, ins) -> None:
        w = m.cur.width
        v = m.vsrc(ins, 1, w).view(np.int32)
        if ins.op_kind(2) == ix.OpKind.REGISTER:
            count = int(m.vec[_reg(ins.op_register(2))[1], :8].view(np.uint64)[0])
        else:
            count = ins.immediate(2)
        if op == "sra":
            out = v >> min(count, 31)
        elif count > 31:
            out = np.zeros_like(v)
        elif op == "sll":
            out = (v.view(np.uint32) << np.uint32(count)).view(np.int32)
        else:
            out = (v.view(np.uint32) >> np.uint32(count)).view(np.int32)
        m.vdst(ins, out, 4)
    return run


def _round(m: Machine, ins) -> None:
    """VROUNDPS / VRNDSCALEPS (scale 0): imm8 bits 1:0 the mode unless bit 2 defers to
    MXCSR (round to nearest even here)."""
    w = m.cur.width
    x = m.vsrc(ins, 1, w).view(np.float32)
    imm = ins.immediate(2)
    if imm >> 4:
        raise NotImplementedError(f"{ins}: a scale")
    mode = 0 if imm & 4 else imm & 3
    with np.errstate(invalid="ignore"):  # a NaN lane stays NaN, as the instruction leaves it
        out = {0: np.rint, 1: np.floor, 2: np.ceil, 3: np.trunc}[mode](x)
    m.vdst(ins, out.astype(np.float32), 4)


def _sqrt(m: Machine, ins) -> None:
    w = m.cur.width
    with np.errstate(invalid="ignore"):
        m.vdst(ins, np.sqrt(m.vsrc(ins, 1, w).view(np.float32)), 4)


def _fp(fn):
    """An f32 operation under IEEE rules, quietly (NaN and infinities are values here)."""
    def run(a, b):
        with np.errstate(all="ignore"):
            return fn(a, b)
    return run


def _broadcast128(m: Machine, ins) -> None:
    """VBROADCASTI32X4 / VBROADCASTI128: a 16-byte block repeated."""
    w = m.cur.width
    m.vdst(ins, np.tile(_read(m.addr(ins), 16), w // 16), 4)


def _extract256(m: Machine, ins) -> None:
    v = m.vec[_reg(ins.op_register(1))[1]]
    part = v[32 * (ins.immediate(2) & 1): 32 * (ins.immediate(2) & 1) + 32]
    if ins.op_kind(0) == ix.OpKind.MEMORY:
        m.store(ins, part, 4)
    else:
        m.vdst(ins, part, 4)


def _cmpps(m: Machine, ins) -> None:
    """VCMPPS: the predicate in imm8 (ordered/unordered, signalling or not: the same here)."""
    w = m.cur.width
    a, b = m.vsrc(ins, 1, w).view(np.float32), m.vsrc(ins, 2, w).view(np.float32)
    with np.errstate(invalid="ignore"):
        unordered = np.isnan(a) | np.isnan(b)
        pred = ins.immediate(3) & 0x0F
        base = {0: a == b, 1: a < b, 2: a <= b, 3: unordered, 4: a != b, 5: ~(a < b), 6: ~(a <= b),
                7: ~unordered, 13: a >= b, 14: a > b}[pred]
    if _reg(ins.op_register(0))[0] == "k":
        m.k[_reg(ins.op_register(0))[1]] = int(sum(1 << int(i) for i in np.flatnonzero(base)))
    else:
        m.vdst(ins, np.where(base, -1, 0).astype(np.int32), 4)


def _cvtsi2ss(m: Machine, ins) -> None:
    size = _reg(ins.op_register(2))[2] if ins.op_kind(2) == ix.OpKind.REGISTER else \
        ix.MemorySizeInfo(ins.memory_size).size
    v = _signed(m.scalar(ins, 2, size), size)
    out = m.vec[_reg(ins.op_register(1))[1], :16].copy()
    out[:4] = np.array([v], np.float64).astype(np.float32).view(np.uint8)  # one rounding, to nearest
    m.vdst(ins, out, 4)


def _dpwssd(m: Machine, ins) -> None:
    w = m.cur.width
    acc = m.vsrc(ins, 0, w).view(np.int32).astype(np.int64)
    p = m.vsrc(ins, 1, w).view(np.int16).astype(np.int64) * m.vsrc(ins, 2, w).view(np.int16).astype(np.int64)
    m.vdst(ins, (acc + p[0::2] + p[1::2]).astype(np.uint32).view(np.int32), 4)  # wraps, as VPDPWSSD does


def _pextr(esize: int):
    def run(m: Machine, ins) -> None:
        i = ins.immediate(2) & (16 // esize - 1)
        value = m.vec[_reg(ins.op_register(1))[1], i * esize: (i + 1) * esize]
        if ins.op_kind(0) == ix.OpKind.MEMORY:
            _write(m.addr(ins), value)
        else:
            m.set_gpr(ins.op_register(0), int.from_bytes(value.tobytes(), "little"))
    return run


def _pinsr(esize: int):
    def run(m: Machine, ins) -> None:
        out = m.vec[_reg(ins.op_register(1))[1], :16].copy()
        i = ins.immediate(3) & (16 // esize - 1)
        if ins.op_kind(2) == ix.OpKind.MEMORY:
            value = _read(m.addr(ins), esize)
        else:
            value = np.frombuffer(m.get_gpr(ins.op_register(2)).to_bytes(8, "little")[:esize], np.uint8)
        out[i * esize: (i + 1) * esize] = value
        m.vdst(ins, out, esize)
    return run


V = ix.Mnemonic
_VECTOR = {
    V.VPADDD: _binary(lambda a, b: a + b, np.int32, 4),
    V.VPSUBD: _binary(lambda a, b: a - b, np.int32, 4),
    V.VPADDW: _binary(lambda a, b: a + b, np.int16, 2),
    V.VPMULLD: _binary(lambda a, b: a * b, np.int32, 4),
    V.VPMADDWD: _binary(_maddwd, np.int32, 4),
    V.VPMADDUBSW: _binary(_maddubsw, np.int16, 2),
    V.VPDPBUSD: _dpbusd,
    V.VPXOR: _binary(lambda a, b: a ^ b, np.uint32, 4), V.VPXORD: _binary(lambda a, b: a ^ b, np.uint32, 4),
    V.VPXORQ: _binary(lambda a, b: a ^ b, np.uint64, 8), V.VXORPS: _binary(lambda a, b: a ^ b, np.uint32, 4),
    V.VPOR: _binary(lambda a, b: a | b, np.uint32, 4), V.VPORD: _binary(lambda a, b: a | b, np.uint32, 4),
    V.VPAND: _binary(lambda a, b: a & b, np.uint32, 4), V.VPANDD: _binary(lambda a, b: a & b, np.uint32, 4),
    V.VPMINSD: _binary(np.minimum, np.int32, 4), V.VPMAXSD: _binary(np.maximum, np.int32, 4),
    V.VADDPS: _binary(_fp(np.add), np.float32, 4), V.VSUBPS: _binary(_fp(np.subtract), np.float32, 4),
    V.VMULPS: _binary(_fp(np.multiply), np.float32, 4), V.VDIVPS: _binary(_fp(np.divide), np.float32, 4),
    V.VANDPS: _binary(lambda a, b: a & b, np.uint32, 4), V.VORPS: _binary(lambda a, b: a | b, np.uint32, 4),
    V.VBLENDVPS: _blendv, V.VPTERNLOGD: _ternlog, V.VPMOVZXBD: _extend(np.uint8, np.int32), V.VPMOVSXBD: _extend(np.int8, np.int32),
    V.VPMOVZXBW: _extend(np.uint8, np.int16), V.VPMOVSXBW: _extend(np.int8, np.int16),
    V.VPMOVZXWD: _extend(np.uint16, np.int32), V.VPMOVSXWD: _extend(np.int16, np.int32),
    V.VPSLLD: _shift_dwords("sll"), V.VPSRLD: _shift_dwords("srl"), V.VPSRAD: _shift_dwords("sra"),
    V.VROUNDPS: _round, V.VRNDSCALEPS: _round, V.VSQRTPS: _sqrt,
    V.VMINPS: _binary(_minmax(np.less), np.float32, 4), V.VMAXPS: _binary(_minmax(np.greater), np.float32, 4),
    V.VPSHUFB: _binary(_pshufb, np.uint8, 1),
    V.VPACKSSDW: _binary(_pack(np.int32, np.int16), np.int16, 2),
    V.VPACKUSDW: _binary(_pack(np.int32, np.uint16), np.uint16, 2),
    V.VPACKSSWB: _binary(_pack(np.int16, np.int8), np.int8, 1),
    V.VPACKUSWB: _binary(_pack(np.int16, np.uint8), np.uint8, 1),
    V.VCVTDQ2PS: _unary(lambda a: a.astype(np.float32), np.int32, np.float32, 4),  # (rounds to nearest even)
    V.VCVTPS2DQ: _unary(_cvt_ps2dq, np.float32, np.int32, 4),
    V.VMOVDQU: _move(1), V.VMOVDQA: _move(1), V.VMOVDQU8: _move(1), V.VMOVDQU32: _move(4),
    V.VMOVDQU64: _move(8), V.VMOVDQA32: _move(4), V.VMOVDQA64: _move(8), V.VMOVUPS: _move(4),
    V.VMOVAPS: _move(4),
    V.VMOVD: _movd, V.VMOVQ: _movd,
    V.VPBROADCASTD: _broadcast(4), V.VPBROADCASTW: _broadcast(2), V.VPBROADCASTB: _broadcast(1),
    V.VPBROADCASTQ: _broadcast(8), V.VBROADCASTSS: _broadcast(4),
    V.VPMOVDB: _pmov(np.int8, None), V.VPMOVSDB: _pmov(np.int8, "s"), V.VPMOVUSDB: _pmov(np.uint8, "us"),
    V.VPCMPGTD: _pcmpgtd, V.VMASKMOVPS: _maskmov, V.VPMASKMOVD: _maskmov,
    V.VPERMQ: _permq, V.VPERMD: _permd, V.VPERMT2D: _perm2d, V.VPERMI2D: _perm2d, V.VEXTRACTI128: _extract128, V.VEXTRACTF128: _extract128,
    V.VEXTRACTI64X4: _extract256, V.VEXTRACTI32X8: _extract256, V.VBROADCASTI32X4: _broadcast128,
    V.VBROADCASTI128: _broadcast128, V.VCMPPS: _cmpps, V.VCVTSI2SS: _cvtsi2ss, V.VPDPWSSD: _dpwssd,
    V.VPEXTRB: _pextr(1), V.VPEXTRW: _pextr(2), V.VPEXTRD: _pextr(4), V.VPINSRB: _pinsr(1),
    V.VPINSRW: _pinsr(2), V.VPINSRD: _pinsr(4),
    V.VPMAXSB: _binary(np.maximum, np.int8, 1), V.VPMAXUB: _binary(np.maximum, np.uint8, 1),
    V.VPMINSB: _binary(np.minimum, np.int8, 1), V.VPMINUB: _binary(np.minimum, np.uint8, 1),
    V.VPUNPCKLBW: _binary(_unpack(False), np.uint8, 1), V.VPUNPCKHBW: _binary(_unpack(True), np.uint8, 1),
    V.VPUNPCKLWD: _binary(_unpack(False), np.uint16, 2), V.VPUNPCKHWD: _binary(_unpack(True), np.uint16, 2),
    V.VPUNPCKLDQ: _binary(_unpack(False), np.uint32, 4), V.VPUNPCKHDQ: _binary(_unpack(True), np.uint32, 4),
    V.VPUNPCKLQDQ: _binary(_unpack(False), np.uint64, 8), V.VPUNPCKHQDQ: _binary(_unpack(True), np.uint64, 8),
    V.VINSERTI128: _inserti128, V.VINSERTI32X4: _inserti128, V.VINSERTI64X4: _inserti256,
    V.VPERM2I128: _perm2i128, V.VSHUFI64X2: _shufi64x2, V.VSHUFPS: _shufps, V.VPSHUFD: _pshufd,
}
