"""The output pipeline: from s32 accumulators to the destination, written once.

Every kernel that accumulates int8 products (GEMM, matmul, inner product, convolution)
ends in this code. Per accumulator lane (row m, column n) it computes::

    v = acc (+ col_comp[n]) (+ row_comp[m])       int32, wrapping (s8 shift, zero points)
    integer mode (no float stage):
        v = v (+ dst_old)                         int32, wrapping; stored as s32
    float mode:
        f = f32(v) * scale                        scale: one value or one per column
        f = f + bias                              bias: one per column or one per row (f32)
        for each post-op, in order:
            eltwise  f = alg(f)                                  (jit.eltwise)
            sum      f = f + scale_i * (f32(dst_old) - zp_i)      (run-time scale_i, zp_i)
            binary   f = f <op> src1   src1 f32: common, per column, per row or full
        f = f * dst_scale_inv                     if a dst scale is given (f32(1) / f32(s),
                                                  computed once per call, as oneDNN does)
        f = f + dst_zp                            one value or one per column
        dst = convert(f):  f32 as is; s32 / s8 / u8: clamp to the type's range in f32
              (s32: [-2^31, 2147483520]), then round to nearest even (VCVTPS2DQ)

Each operation is one IEEE f32 instruction (no FMA, no approximations), so
``primitives.reference.output_pipeline`` reproduces the bits in numpy. The clamp is
``x < hi ? x : hi`` then ``x > lo ? x : lo`` (VMINPS/VMAXPS operand order), which sends
NaN to the type's upper bound. The lower half is emitted only where the conversion
does not already give its result (:func:`needs_lower_clamp`): after the upper clamp no
NaN is left, and VCVTPS2DQ turns anything below -2^31 into -2^31, which VPMOVSDB and
the AVX2 packs saturate to the type's minimum. Stores, dst reads and full/per-column binary operands
are masked by the number of valid columns, so tails never touch memory past a row's
end; AVX2 has no byte-masked store, so u8/s8 tails go out through a GPR in 4/2/1-byte
pieces. Per-column scale, bias and dst zero point are padded by the driver to whole
tiles and read unmasked.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from jit.dot import Path, vector_constant

INT32_UPPER_F32 = 2147483520.0  # largest f32 below 2**31
INT32_LOWER_F32 = -2147483648.0
DST_TYPES = ("s32", "f32", "u8", "s8")
DST_RANGE = {"s32": (INT32_LOWER_F32, INT32_UPPER_F32), "u8": (0.0, 255.0), "s8": (-128.0, 127.0)}
DST_BYTES = {"s32": 4, "f32": 4, "u8": 1, "s8": 1}
BROADCASTS = ("common", "col", "row", "full")
BINARY_ALGS = ("add", "mul", "max", "min", "sub", "div")
MAX_POST_OPS = 8


@dataclass(frozen=True)
class EltwiseOp:
    alg: str
    alpha: float = 0.0
    beta: float = 0.0


@dataclass(frozen=True)
class SumOp:
    """dst += scale * (dst_old - zero_point); scale and zero point are run-time values."""

    dt: str  # how the old dst is read (the dst type, or one of the same size)


@dataclass(frozen=True)
class BinaryOp:
    alg: str
    broadcast: str  # "common" | "col" | "row" | "full"; the operand is f32


@dataclass(frozen=True)
class OutputSpec:
    """The structure of the output stage (part of the kernel key; values are run-time)."""

    row_comp: bool = False
    # False where the primitive knows every column compensation is 0 (a u8 source without
    # a zero point): the stage then neither reads nor adds it.
    col_comp: bool = True
    float_mode: bool = False
    accumulate: bool = False  # integer mode: dst += old dst (GEMM with beta == 1)
    scale: str = "none"  # "none" | "common" | "col"
    bias: str = "none"  # "none" | "col" | "row"
    post_ops: tuple = ()  # EltwiseOp | SumOp | BinaryOp
    dst_scale: bool = False
    dst_zp: str = "none"  # "none" | "common" | "col"
    dst_dt: str = "s32"
    # The kernel may assume a dst scale > 0 and dst zero points >= 0 (which then keep the
    # values post-ops left >= 0 so, see needs_lower_clamp). The primitive checks the
    # values at each execution and runs the kernel of the spec without it for others.
    dst_params_nonneg: bool = False

    def __post_init__(self):
        if self.dst_dt not in DST_TYPES:
            raise ValueError(f"dst_dt: expected one of {', '.join(DST_TYPES)}, got {self.dst_dt!r}")
        if self.scale not in ("none", "common", "col"):
            raise ValueError(f"scale: expected 'none', 'common' or 'col', got {self.scale!r}")
        if self.bias not in ("none", "col", "row"):
            raise ValueError(f"bias: expected 'none', 'col' or 'row', got {self.bias!r}")
        if self.dst_zp not in ("none", "common", "col"):
            raise ValueError(f"dst_zp: expected 'none', 'common' or 'col', got {self.dst_zp!r}")
        if len(self.post_ops) > MAX_POST_OPS:
            raise ValueError(f"post_ops: at most {MAX_POST_OPS} post-ops, got {len(self.post_ops)}")
        for op in self.post_ops:
            if isinstance(op, SumOp):
                if DST_BYTES.get(op.dt) != DST_BYTES[self.dst_dt]:
                    raise ValueError(f"sum dt: {op.dt!r} must have the size of the dst type {self.dst_dt}")
            elif isinstance(op, BinaryOp):
                if op.alg not in BINARY_ALGS or op.broadcast not in BROADCASTS:
                    raise ValueError(f"binary post-op: unknown {op!r}")
            elif not isinstance(op, EltwiseOp):
                raise ValueError(f"post_ops: unknown entry {op!r}")
        needs_float = (self.scale != "none" or self.bias != "none" or self.post_ops or self.dst_scale
                       or self.dst_zp != "none" or self.dst_dt != "s32")
        if needs_float and not self.float_mode:
            raise ValueError("scales, bias, post-ops, dst scale/zero point and non-s32 dst need float mode")
        if self.accumulate and self.float_mode:
            raise ValueError("accumulate is the integer-mode sum; in float mode use a sum post-op")

    @property
    def dst_bytes(self) -> int:
        return DST_BYTES[self.dst_dt]


# Eltwise algorithms whose result is >= 0 or NaN for every input (relu only with
# alpha == 0; clip only with both bounds >= 0: it is min(beta, max(alpha, x)), so beta
# wins where beta < alpha), and those that keep that property.
_NONNEG_ALGS = ("abs", "square", "sqrt", "exp", "logistic")
_SIGN_KEEPING_ALGS = ("round",)


def needs_lower_clamp(path: Path, spec: OutputSpec) -> bool:
    """Whether the store must clamp to the dst type's lower bound in f32.

    Not for s32 (VCVTPS2DQ gives -2^31, the bound, for anything below it), nor for s8 on
    AVX-512 (VPMOVSDB saturates) or u8/s8 on AVX2 (the packs saturate); for u8 on AVX-512
    (VPMOVDB truncates) only where the values are known to be >= 0 or NaN: after relu
    with nothing later that can make them negative.
    """
    if not spec.float_mode or spec.dst_dt in ("f32", "s32"):
        return False
    if path.bits != 512 or spec.dst_dt == "s8":
        return False
    if (spec.dst_scale or spec.dst_zp != "none") and not spec.dst_params_nonneg:
        return True  # run-time values of any sign
    return not _post_ops_nonneg(spec.post_ops)


def _post_ops_nonneg(post_ops) -> bool:
    """Whether the chain leaves every value >= 0 or NaN (-0 included), whatever its input."""
    nonneg = False
    for op in post_ops:
        if isinstance(op, EltwiseOp) and (op.alg in _NONNEG_ALGS or (op.alg == "relu" and op.alpha == 0.0)
                                          or (op.alg == "clip" and min(op.alpha, op.beta) >= 0.0)):
            nonneg = True
        elif not (isinstance(op, EltwiseOp) and op.alg in _SIGN_KEEPING_ALGS):
            nonneg = False
    return nonneg


def assume_dst_params_nonneg(spec: OutputSpec) -> OutputSpec:
    """``spec`` with ``dst_params_nonneg`` where assuming it drops the store's lower clamp
    (u8 after relu, then a dst scale or zero point), else ``spec`` itself."""
    if spec.float_mode and spec.dst_dt == "u8" and (spec.dst_scale or spec.dst_zp != "none") \
            and _post_ops_nonneg(spec.post_ops):
        return replace(spec, dst_params_nonneg=True)
    return spec


def for_dst_params(spec: OutputSpec, dst_scale_inv: float, dst_zp) -> OutputSpec:
    """The spec to run with these values: ``spec``, or without ``dst_params_nonneg`` where a
    dst scale is not > 0 (NaN included) or a dst zero point (an array, or None) is < 0."""
    if not spec.dst_params_nonneg or (dst_scale_inv > 0 and (dst_zp is None or dst_zp.size == 0
                                                             or dst_zp.min() >= 0)):
        return spec
    return replace(spec, dst_params_nonneg=False)


def _eltwise():
    from jit import eltwise

    return eltwise


def _temps(spec: OutputSpec) -> int:
    """Temporaries: one for loads, a second for sum/binary operands; eltwise's reuse them."""
    if not spec.float_mode:
        return 1
    elt = [_eltwise().temps_needed(op.alg) for op in spec.post_ops if isinstance(op, EltwiseOp)]
    return max([2] + elt)


def output_registers_needed(path: Path, spec: OutputSpec, nr: int, n_tail: bool = True) -> int:
    """Vector registers the stage takes from the kernel's free ones (``n_tail``: as
    :class:`OutputContext`'s)."""
    masks = nr if path.bits == 256 and n_tail else 0  # AVX-512 masks live in k1..k7
    return masks + _temps(spec)


def args_cdef_fields() -> str:
    """The output stage's fields of a kernel's argument struct (C declarations)."""
    return (f"void *col_comp; void *row_comp; void *scale; void *bias; void *dst_zp; float dst_scale_inv; "
            f"float po_scale[{MAX_POST_OPS}]; float po_zp[{MAX_POST_OPS}]; void *po_src[{MAX_POST_OPS}]; "
            f"int64_t po_ld[{MAX_POST_OPS}];")


OUTPUT_FIELDS = ("col_comp", "row_comp", "scale", "bias", "dst_zp", "dst_scale_inv", "po_scale", "po_zp", "po_src",
                 "po_ld")


@dataclass
class OutputContext:
    """Registers and addresses the kernel hands to the output stage."""

    path: Path
    spec: OutputSpec
    args: object  # GPR holding the argument struct
    offsets: dict  # field name -> byte offset in the argument struct
    col_bytes: object  # GPR: current tile's first column * 4
    row_bytes: object  # GPR: current row block's first row * 4
    n_left: object  # GPR: valid columns from the tile's first column on
    c_row: list  # callables i -> memory address of row i of the dst block (tile column included)
    free_vectors: list  # vector registers the stage may use
    free_gprs: list  # GPRs the stage may use (at least 4)
    # A column tile may end before its last vector does (n_left < the tile's columns):
    # masked loads and stores. Off where every tile the kernel runs is whole: plain ones,
    # and no tail code (half of an AVX2 u8 stage's instructions, and of its generation).
    n_tail: bool = True
    # With n_tail: every tile this code runs is partial (a kernel's own tail block), so
    # no unmasked copy of the stage is emitted beside the masked one (emit_output).
    partial_only: bool = False


def emit_output(ctx: OutputContext, acc, rows: int, nr: int) -> None:
    """Emit the stage for an ``rows x nr`` block of accumulators ``acc[i][v]``.

    On AVX2, where tiles may be partial, the stage is emitted twice: unmasked for whole
    tiles, masked for the last partial one. VMASKMOVPS stores are slow there (Zen 3:
    a 256x256x256 s32 GEMM ran 15% slower with every tile's stores masked, 1024^3 3-5%),
    while AVX-512's opmask stores cost what plain ones do.
    """
    if ctx.n_tail and not ctx.partial_only and ctx.path.bits == 256:
        from jit.asm import CMP, JB, JMP, LABEL, Label

        partial, done = Label(), Label()
        CMP(ctx.n_left, nr * ctx.path.lanes)
        JB(partial)
        _Stage(replace(ctx, n_tail=False), nr).emit(acc, rows)
        JMP(done)
        LABEL(partial)
        _Stage(ctx, nr).emit(acc, rows)
        LABEL(done)
        return
    _Stage(ctx, nr).emit(acc, rows)


class _Stage:
    def __init__(self, ctx: OutputContext, nr: int):
        from jit import asm

        self.asm, self.ctx, self.nr = asm, ctx, nr
        self.path, self.spec = ctx.path, ctx.spec
        self.wide = ctx.path.bits == 512
        self.vb, self.lanes = ctx.path.vector_bytes, ctx.path.lanes
        self.free = list(ctx.free_vectors)
        self.g, self.t, self.val, self.addr = ctx.free_gprs[:4]
        self.constants: dict = {}
        self.lower_clamp = needs_lower_clamp(ctx.path, ctx.spec)
        self.masks = None  # per column vector, where tiles can be partial (emit_masks)

    # -- small helpers -------------------------------------------------------------------
    def field(self, name: str, index: int = 0, size: int = 8):
        return self.ctx.args + (self.ctx.offsets[name] + index * size)

    def base(self, name: str, index: int = 0):
        """Load a pointer field of the argument struct into the scratch GPR."""
        self.asm.MOV(self.g, [self.field(name, index)])
        return self.g

    def const(self, value: float, name: str):
        """A broadcast f32 constant, one object per stage (the clamp bounds come back for
        every accumulator; PeachPy merges equal constants, so the bytes are the same)."""
        key = (float(value), name)
        constant = self.constants.get(key)
        if constant is None:
            constant = self.constants[key] = vector_constant(self.path, [float(value)], name)
        return constant

    def broadcast(self, dst, address) -> None:
        self.asm.VBROADCASTSS(dst, self.asm.dword[address])

    def masked_load(self, dst, address, v) -> None:
        """32-bit lanes from memory, zero beyond the valid columns (no fault past them)."""
        if self.masks is None:
            self.asm.VMOVUPS(dst, [address])
        elif self.wide:
            self.asm.VMOVUPS(dst(self.masks[v].z), [address])
        else:
            self.asm.VMASKMOVPS(dst, self.masks[v], [address])

    def masked_store(self, address, src, v) -> None:
        if self.masks is None:
            self.asm.VMOVUPS([address], src)
        elif self.wide:
            self.asm.VMOVUPS(self.asm.zword[address](self.masks[v]), src)
        else:
            self.asm.VMASKMOVPS([address], self.masks[v], src)

    # -- masks -----------------------------------------------------------------------------
    def emit_masks(self) -> None:
        if not self.ctx.n_tail:
            return
        asm, nr = self.asm, self.nr
        bcast_n = self.free.pop()
        if self.wide:
            asm.VPBROADCASTD(bcast_n, self.ctx.n_left.as_dword)
            self.masks = [asm.KRegister(physical_id=1 + v) for v in range(nr)]
        else:
            asm.VMOVD(bcast_n.as_xmm, self.ctx.n_left.as_dword)
            asm.VPBROADCASTD(bcast_n, bcast_n.as_xmm)
            self.masks = [self.free.pop() for _ in range(nr)]
        for v in range(nr):
            iota = vector_constant(self.path, range(v * self.lanes, (v + 1) * self.lanes), f"col_iota{v}")
            if self.wide:
                # PeachPy encodes VPCMPGTD k, ... as k{k}: the old mask would filter the new
                # one, so set it to all ones first.
                asm.KXNORW(self.masks[v], self.masks[v], self.masks[v])
            asm.VPCMPGTD(self.masks[v], bcast_n, iota)
        self.free.append(bcast_n)

    # -- the stage -------------------------------------------------------------------------
    def emit(self, acc, rows: int) -> None:
        self.emit_masks()
        self.tmp = self.free.pop()
        if self.spec.float_mode:
            self.tmp2 = self.free.pop()
        # Registers no eltwise needs hold what every row of the block reads: the dst
        # scale, then each column vector's compensation, scale and bias (loaded once per
        # column, not once per accumulator: the stage is most of a small-K block's time).
        spec = self.spec
        elt = [_eltwise().temps_needed(op.alg) for op in spec.post_ops if isinstance(op, EltwiseOp)]
        spare = self.free[max([2] + elt) - 2:]
        self.held = {}
        if spec.dst_scale and spare:
            self.held["dst_scale"] = spare.pop()
            self.broadcast(self.held["dst_scale"], self.field("dst_scale_inv"))
        per_column = ["col_comp"] * spec.col_comp + [name for name, kind in (("scale", spec.scale), ("bias", spec.bias),
                                                             ("dst_zp", spec.dst_zp)) if kind == "col"]
        for v in range(self.nr):
            col = self.ctx.col_bytes * 1 + v * self.vb
            held = [name for name in per_column[:len(spare)] if rows > 1]
            for name, reg in zip(held, spare):
                (self.asm.VMOVDQU32 if self.wide else self.asm.VMOVDQU)(reg, [self.base(name) + col])
                self.held[name] = reg
            for i in range(rows):
                self.one(acc[i][v], i, v)
            for name in held:
                del self.held[name]

    def column(self, name: str, v: int):
        """Column vector ``v`` of a per-column operand: its register, or its memory."""
        reg = self.held.get(name)
        return reg if reg is not None else [self.base(name) + self.ctx.col_bytes * 1 + v * self.vb]

    def one(self, a, i: int, v: int) -> None:
        asm, spec, ctx, vb, tmp = self.asm, self.spec, self.ctx, self.vb, self.tmp
        if spec.col_comp:
            asm.VPADDD(a, a, self.column("col_comp", v))
        if spec.row_comp:
            asm.VPBROADCASTD(tmp, asm.dword[self.base("row_comp") + ctx.row_bytes * 1 + 4 * i])
            asm.VPADDD(a, a, tmp)
        if not spec.float_mode:
            if spec.accumulate:
                self.masked_load(tmp, ctx.c_row(i) + v * vb, v)
                asm.VPADDD(a, a, tmp)
            self.masked_store(ctx.c_row(i) + v * vb, a, v)
            return
        asm.VCVTDQ2PS(a, a)
        if spec.scale == "common":
            self.broadcast(tmp, self.base("scale"))
            asm.VMULPS(a, a, tmp)
        elif spec.scale == "col":
            asm.VMULPS(a, a, self.column("scale", v))
        if spec.bias == "col":
            asm.VADDPS(a, a, self.column("bias", v))
        elif spec.bias == "row":
            self.broadcast(tmp, self.base("bias") + ctx.row_bytes * 1 + 4 * i)
            asm.VADDPS(a, a, tmp)
        for index, op in enumerate(spec.post_ops):
            if isinstance(op, EltwiseOp):
                self.eltwise(a, op, index)
            elif isinstance(op, SumOp):
                self.load_dst(tmp, i, v, op.dt)
                self.broadcast(self.tmp2, self.field("po_zp", index, 4))
                asm.VSUBPS(tmp, tmp, self.tmp2)
                self.broadcast(self.tmp2, self.field("po_scale", index, 4))
                asm.VMULPS(tmp, tmp, self.tmp2)
                asm.VADDPS(a, a, tmp)
            else:
                self.binary(a, op, index, i, v)
        if spec.dst_scale:  # a multiply: VDIVPS would cost more than the rest of the stage
            if "dst_scale" in self.held:
                asm.VMULPS(a, a, self.held["dst_scale"])
            else:
                self.broadcast(tmp, self.field("dst_scale_inv"))
                asm.VMULPS(a, a, tmp)
        if spec.dst_zp == "common":
            self.broadcast(tmp, self.base("dst_zp"))
            asm.VADDPS(a, a, tmp)
        elif spec.dst_zp == "col":
            asm.VADDPS(a, a, self.column("dst_zp", v))
        self.store(a, i, v)

    def eltwise(self, a, op: EltwiseOp, index: int) -> None:
        elt = _eltwise()
        temps = [self.tmp, self.tmp2] + self.free[: max(0, elt.temps_needed(op.alg) - 2)]
        elt.emit_eltwise(self.path, op.alg, op.alpha, op.beta, a, temps, f"po{index}")

    def binary(self, a, op: BinaryOp, index: int, i: int, v: int) -> None:
        asm, ctx, src1 = self.asm, self.ctx, self.tmp2
        col = ctx.col_bytes * 1 + v * self.vb
        if op.broadcast == "common":
            self.broadcast(src1, self.base("po_src", index))
        elif op.broadcast == "row":
            self.broadcast(src1, self.base("po_src", index) + ctx.row_bytes * 1 + 4 * i)
        elif op.broadcast == "col":
            self.masked_load(src1, self.base("po_src", index) + col, v)
        else:  # full: row (first row + i) of an M x N f32 operand, po_ld bytes apart
            g = self.g
            asm.MOV(g, ctx.row_bytes)
            asm.SHR(g, 2)
            asm.ADD(g, i)
            asm.IMUL(g, [self.field("po_ld", index)])
            asm.ADD(g, [self.field("po_src", index)])
            self.masked_load(src1, g + col, v)
        instruction = {"add": asm.VADDPS, "sub": asm.VSUBPS, "mul": asm.VMULPS, "div": asm.VDIVPS,
                       "max": asm.VMAXPS, "min": asm.VMINPS}[op.alg]
        instruction(a, a, src1)

    # -- dst reads and writes ----------------------------------------------------------------
    def load_dst(self, dst, i: int, v: int, dt: str) -> None:
        """The old dst of this block as f32 (masked)."""
        asm = self.asm
        address = self.ctx.c_row(i) + v * self.vb * DST_BYTES[dt] // 4
        if DST_BYTES[dt] == 4:
            self.masked_load(dst, address, v)
            if dt == "s32":
                asm.VCVTDQ2PS(dst, dst)
            return
        extend = asm.VPMOVZXBD if dt == "u8" else asm.VPMOVSXBD
        if self.wide:
            import peachpy.x86_64 as px

            extend(dst if self.masks is None else dst(self.masks[v].z), px.oword[address])
        else:
            self.partial_bytes(address, v, load_into=dst)
            extend(dst, dst.as_xmm)
        asm.VCVTDQ2PS(dst, dst)

    def store(self, a, i: int, v: int) -> None:
        asm, dt = self.asm, self.spec.dst_dt
        if dt == "f32":
            self.masked_store(self.ctx.c_row(i) + v * self.vb, a, v)
            return
        lo, hi = DST_RANGE[dt]
        # u8 on AVX-512 known >= 0 or NaN: VPMOVUSDB saturates what VCVTPS2DQ gives (above
        # 255, and 0x80000000 for NaN and values past 2^31, read unsigned) as the clamp
        # would: one FP operation less a vector (relu and u8 out, the common case)
        unsigned_store = self.wide and dt == "u8" and not self.lower_clamp
        if not unsigned_store:
            asm.VMINPS(a, a, self.const(hi, f"{dt}_upper"))
        if self.lower_clamp:
            asm.VMAXPS(a, a, self.const(lo, f"{dt}_lower"))
        asm.VCVTPS2DQ(a, a)
        if dt == "s32":
            self.masked_store(self.ctx.c_row(i) + v * self.vb, a, v)
            return
        address = self.ctx.c_row(i) + v * self.lanes
        if self.wide:
            import peachpy.x86_64 as px

            # u8: clamped, so truncation is exact, or saturated as above; s8: saturated
            out = px.oword[address] if self.masks is None else px.oword[address](self.masks[v])
            (asm.VPMOVUSDB if unsigned_store else asm.VPMOVDB if dt == "u8" else asm.VPMOVSDB)(out, a)
            return
        # ymm: 8 s32 -> 8 bytes in the low qword of tmp (the packs saturate below the range)
        asm.VEXTRACTI128(self.tmp.as_xmm, a, 1)
        asm.VPACKSSDW(self.tmp.as_xmm, a.as_xmm, self.tmp.as_xmm)
        (asm.VPACKUSWB if dt == "u8" else asm.VPACKSSWB)(self.tmp.as_xmm, self.tmp.as_xmm, self.tmp.as_xmm)
        self.partial_bytes(address, v, store_from=self.tmp)

    def partial_bytes(self, address, v: int, load_into=None, store_from=None) -> None:
        """Move the valid bytes (at most 8) of vector ``v``'s columns between memory and a qword.

        AVX2 has no byte-granular masked load or store: full vectors move as one qword;
        a tail moves as 4-, 2- and 1-byte pieces through a GPR, so no byte past the row's
        last valid column is read or written.
        """
        asm = self.asm
        from jit.asm import Label

        if self.masks is None:  # every tile whole
            if load_into is not None:
                asm.VMOVQ(load_into.as_xmm, asm.qword[address])
            else:
                asm.VMOVQ(asm.qword[address], store_from.as_xmm)
            return
        t, val, addr = self.t, self.val, self.addr
        full, done = Label(), Label()
        asm.MOV(t, self.ctx.n_left)
        if v:
            asm.SUB(t, v * self.lanes)
        asm.CMP(t, self.lanes)
        asm.JGE(full)
        asm.TEST(t, t)
        asm.JLE(done)  # no valid column in this vector
        asm.LEA(addr, [address])
        if load_into is not None:
            # Read the pieces backwards from the end of the valid bytes (1, then 2, then 4
            # bytes), shifting each earlier piece in below the later ones.
            g = self.g
            asm.XOR(val.as_dword, val.as_dword)
            asm.ADD(addr, t)
            for size in (1, 2, 4):
                skip = Label()
                asm.TEST(t, size)
                asm.JZ(skip)
                asm.SUB(addr, size)
                asm.SHL(val, 8 * size)
                if size == 4:
                    asm.MOV(g.as_dword, [addr])  # zero-extends into the qword
                else:
                    asm.MOVZX(g.as_dword, (asm.byte if size == 1 else asm.word)[addr])
                asm.OR(val, g)
                asm.LABEL(skip)
            asm.VMOVQ(load_into.as_xmm, val)
            asm.JMP(done)
            asm.LABEL(full)
            asm.VMOVQ(load_into.as_xmm, asm.qword[address])
        else:
            asm.VMOVQ(val, store_from.as_xmm)
            for size in (4, 2, 1):
                skip = Label()
                asm.TEST(t, size)
                asm.JZ(skip)
                reg = {4: val.as_dword, 2: val.as_word, 1: val.as_low_byte}[size]
                asm.MOV([addr], reg)
                asm.SHR(val, 8 * size)
                asm.ADD(addr, size)
                asm.LABEL(skip)
            asm.JMP(done)
            asm.LABEL(full)
            asm.VMOVQ(asm.qword[address], store_from.as_xmm)
        asm.LABEL(done)
