"""The output pipeline: from s32 accumulators to the destination, written once.

Every kernel that accumulates int8 products ends in this code. For the s32 GEMM
(oneDNN's ``C = alpha * (A - ao)(B - bo) + beta * C + co``) the stage computes, per
accumulator lane (row m, column n)::

    v = acc + col_comp[n] (+ row_comp[m])            int32, wrapping
    integer mode (alpha == 1, beta in {0, 1}):
        v = v (+ C_old)                               int32, wrapping; co folded in comps
    float mode (anything else):
        f = f32(v) * alpha
        f = f + f32(C_old) * beta                     if beta != 0
        f = f + col_post[n]  /  f = f + row_post[m]   co in f32, if given
        v = cvt_round_nearest_even(clamp(f, -2^31, 2147483520.0))

Stores are masked by the number of valid columns, so tails never touch memory past
the end of a row. ``primitives.reference.output_stage`` is the numpy model of exactly
these operations, in this order.
"""
from __future__ import annotations

from dataclasses import dataclass

from jit.dot import Path, vector_constant

INT32_UPPER_F32 = 2147483520.0  # largest f32 below 2**31
INT32_LOWER_F32 = -2147483648.0


@dataclass(frozen=True)
class OutputSpec:
    """The structure of the output stage (part of the kernel key; values are run-time)."""

    row_comp: bool = False
    float_mode: bool = False
    beta: bool = False
    co_col: bool = False  # float mode only: f32 per-column (or fixed) offset
    co_row: bool = False  # float mode only: f32 per-row offset

    def __post_init__(self):
        if (self.co_col or self.co_row) and not self.float_mode:
            raise ValueError("co in the output stage is f32 and needs float mode; fold it into comps")


def output_registers_needed(path: Path, spec: OutputSpec, nr: int) -> int:
    """Vector registers the stage takes from the kernel's free ones."""
    masks = nr if path.bits == 256 else 0  # AVX-512 masks live in k1..k7
    return masks + 1 + (1 if spec.float_mode else 0) + (1 if spec.float_mode and spec.beta else 0)


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
    c_row: list  # callables i -> memory address of row i of the C block
    free_vectors: list  # vector registers the stage may use
    free_gprs: list  # GPRs the stage may use (at least 4)


def emit_output(ctx: OutputContext, acc, rows: int, nr: int) -> None:
    """Emit the stage for an ``rows x nr`` block of accumulators ``acc[i][v]``."""
    from jit import asm

    path, spec = ctx.path, ctx.spec
    lanes, vb = path.lanes, path.vector_bytes
    wide = path.bits == 512
    free = list(ctx.free_vectors)
    col_base, row_base, post_col_base, post_row_base = ctx.free_gprs[:4]

    # Column masks: lane j of vector v is valid when v*lanes + j < n_left.
    bcast_n = free.pop()
    if wide:
        asm.VPBROADCASTD(bcast_n, ctx.n_left.as_dword)
        masks = [asm.KRegister(physical_id=1 + v) for v in range(nr)]
    else:
        asm.VMOVD(bcast_n.as_xmm, ctx.n_left.as_dword)
        asm.VPBROADCASTD(bcast_n, bcast_n.as_xmm)
        masks = [free.pop() for _ in range(nr)]
    for v in range(nr):
        iota = vector_constant(path, range(v * lanes, (v + 1) * lanes), f"col_iota{v}")
        if wide:
            # PeachPy encodes VPCMPGTD k, ... as k{k}: the old mask would filter the new
            # one, so set it to all ones first.
            asm.KXNORW(masks[v], masks[v], masks[v])
        asm.VPCMPGTD(masks[v], bcast_n, iota)
    free.append(bcast_n)
    tmp = free.pop()

    def load_c(dst, address, v):
        if wide:
            asm.VMOVDQU32(dst(masks[v].z), [address])
        else:
            asm.VPMASKMOVD(dst, masks[v], [address])

    def store_c(address, src, v):
        if wide:
            asm.VMOVDQU32(asm.zword[address](masks[v]), src)
        else:
            asm.VPMASKMOVD([address], masks[v], src)

    asm.MOV(col_base, [ctx.args + ctx.offsets["col_comp"]])
    if spec.row_comp:
        asm.MOV(row_base, [ctx.args + ctx.offsets["row_comp"]])
    if spec.float_mode:
        alpha = free.pop()
        asm.VBROADCASTSS(alpha, asm.dword[ctx.args + ctx.offsets["alpha"]])
        if spec.beta:
            beta = free.pop()
            asm.VBROADCASTSS(beta, asm.dword[ctx.args + ctx.offsets["beta"]])
        if spec.co_col:
            asm.MOV(post_col_base, [ctx.args + ctx.offsets["col_post"]])
        if spec.co_row:
            asm.MOV(post_row_base, [ctx.args + ctx.offsets["row_post"]])

    for v in range(nr):
        for i in range(rows):
            a = acc[i][v]
            c_address = ctx.c_row(i) + v * vb
            asm.VPADDD(a, a, [col_base + ctx.col_bytes * 1 + v * vb])
            if spec.row_comp:
                asm.VPBROADCASTD(tmp, asm.dword[row_base + ctx.row_bytes * 1 + 4 * i])
                asm.VPADDD(a, a, tmp)
            if not spec.float_mode:
                if spec.beta:
                    load_c(tmp, c_address, v)
                    asm.VPADDD(a, a, tmp)
            else:
                asm.VCVTDQ2PS(a, a)
                asm.VMULPS(a, a, alpha)
                if spec.beta:
                    load_c(tmp, c_address, v)
                    asm.VCVTDQ2PS(tmp, tmp)
                    asm.VMULPS(tmp, tmp, beta)
                    asm.VADDPS(a, a, tmp)
                if spec.co_col:
                    asm.VADDPS(a, a, [post_col_base + ctx.col_bytes * 1 + v * vb])
                if spec.co_row:
                    asm.VBROADCASTSS(tmp, asm.dword[post_row_base + ctx.row_bytes * 1 + 4 * i])
                    asm.VADDPS(a, a, tmp)
                asm.VMINPS(a, a, vector_constant(path, [INT32_UPPER_F32], "s32_upper"))
                asm.VMAXPS(a, a, vector_constant(path, [INT32_LOWER_F32], "s32_lower"))
                asm.VCVTPS2DQ(a, a)
            store_c(c_address, a, v)
