"""The int8 depthwise convolution kernel template (forward inference, NHWC, one PeachPy generator).

Depthwise: every channel ``c`` has its own ``KH x KW`` filter, and

    acc[n, oh, ow, c] = sum over valid taps (kh, kw) of (x[n, ih, iw, c] - zp_src) * w[c, kh, kw]
    ih = oh*SH - pad_t + kh*DH,  iw = ow*SW - pad_l + kw*DW   (DH, DW: dilation + 1)

computed exactly in int32 (wrapping, as every int32 accumulator here), then the shared
output pipeline (``jit.output``) with channels as its columns. Padded taps are skipped,
which is what "padding contributes (zp - zp) * w = 0" means; the source zero point is
subtracted from each loaded value, so borders need no special compensation.

Arithmetic, per tap and vector of channels (s32 lanes):

    x = VPMOVZXBD / VPMOVSXBD (src bytes)              low s16 of each lane = the byte
    x = x - zp                                          (only with a source zero point)
    acc += x * w                                        w lanes: low s16 = weight, high s16 = 0
        s16 route:  VPDPWSSD acc, x, w (VNNI ISAs) or VPMADDWD t, x, w; VPADDD acc, acc, t.
                    A lane's product is lo(x)*w + hi(x)*0, exact while x - zp fits s16
                    (any zero point within about +-32500: the driver checks the value).
        s32 route:  (``zp="s32"``, larger zero points) w sign-extended (VPSLLD/VPSRAD 16),
                    VPMULLD t, x, w; VPADDD acc, acc, t: exact modulo 2^32.

So every ISA path computes the mathematical int32 result; no VPMADDUBSW saturation.

Loop nest of one call (a chunk of consecutive output rows (n, oh)):

    for each output row:
        kh range from the row table (first valid kh, its offsets, count)
        for each channel block (full vectors, then the tail):
            ow = 0
            while ow < OW:
                if ow is in [ow_lo, ow_blk_last]:    P pixels whose windows lie inside the
                    block of P pixels, all KW taps     image along W (P = spec.pixels)
                else: one pixel, its valid kw range from the column table
                for kh in the valid rows: for kw in the pixel's taps:
                    load the tap's weights once, P x (widen, (-zp), multiply-add)
                output stage (jit.output) for the block's pixels

The channel tail is a masked piece on AVX-512 (zero-masking VPMOVZXBD with fault
suppression) and, on AVX2, pieces of 4, 2 and 1 channels (VMOVD / VPINSRW / VPINSRB) so
no byte outside the source is read; the output stage masks the stores. Weights are
packed by the driver as ``[tap][C_pad]`` s32 lanes (low s16 = weight), zero padded, with
one vector of slack after the last tap, so weight loads never need masks.

Every size (N, C, H, W, kernel, strides, dilation, padding) is a run-time value (fields
and the two tables); the code depends on :class:`DwKernelSpec` only. The kernel keeps
its row state in the struct (``src``, ``dst``, ``rows``, ``oh``, ``pix``, ``wrow``, ``khn``):
give each concurrent call its own struct.
"""
from __future__ import annotations

from dataclasses import dataclass

from jit.dot import Path, fast_path, vector_register
from jit.output import (OUTPUT_FIELDS, OutputContext, OutputSpec, args_cdef_fields, emit_output,
                        output_registers_needed)

ARGS_CDEF = """
struct i8j_dw_args {
    void *src;            /* image of the current row (kernel state: advanced per image) */
    void *dst;            /* dst pixel (n, oh, 0), channel 0, of the current row (kernel state) */
    void *wei;            /* packed weights [tap][C_pad] s32 lanes */
    void *htab;           /* per oh: {src_off, w_off, kh count} int64 */
    void *wtab;           /* per ow: {src_off, w_off, kw count} int64 */
    int64_t rows;         /* output rows left in the chunk (kernel state) */
    int64_t oh;           /* oh of the current row (kernel state) */
    int64_t pix;          /* index of pixel (n, oh, 0) from the chunk's first pixel (kernel state) */
    int64_t OH; int64_t OW;
    int64_t img_bytes;    /* IH*IW*C */
    int64_t C;
    int64_t full_bytes;   /* 4 * channels in full vectors */
    int64_t tail;         /* channels after the full vectors */
    uint64_t tail_mask;   /* AVX-512: lanes of the tail */
    int64_t src_px;       /* SW*C: src bytes between the block's pixels */
    int64_t src_dw;       /* DW*C: src bytes between kw taps */
    int64_t src_dh;       /* DH*IW*C: src bytes between kh taps */
    int64_t w_tap;        /* 4*C_pad: weight bytes between taps */
    int64_t w_kh;         /* KW * w_tap */
    int64_t dst_px;       /* C*sizeof(dst) */
    int64_t row_dst;      /* OW*C*sizeof(dst) */
    int64_t ow_lo; int64_t ow_blk_last;  /* blocks of P pixels start in [ow_lo, ow_blk_last] */
    int32_t zp; int32_t pad0;
    void *wrow;           /* kernel state: weights of the row's first valid kh */
    int64_t khn;          /* kernel state: valid kh of the row */
    %s                    /* the output stage's (jit.output) */
};
""" % args_cdef_fields()
SIGNATURE = "void (*)(struct i8j_dw_args *)"
FIELDS = ("src", "dst", "wei", "htab", "wtab", "rows", "oh", "pix", "OH", "OW", "img_bytes", "C", "full_bytes",
          "tail", "tail_mask", "src_px", "src_dw", "src_dh", "w_tap", "w_kh", "dst_px", "row_dst", "ow_lo",
          "ow_blk_last", "zp", "wrow", "khn") + OUTPUT_FIELDS
ZP_ROUTES = ("none", "s16", "s32")
MAX_PIXELS = 6  # two dst/src bases of three pixels each
S16_ZP_RANGE = {"u8": (255 - 32767, 32768), "s8": (127 - 32767, 32768 - 128)}  # x - zp fits s16


def zp_route(src_dt: str, zp: int) -> str:
    """The arithmetic a source zero point needs: none, s16 (x - zp fits s16) or s32."""
    if zp == 0:
        return "none"
    lo, hi = S16_ZP_RANGE[src_dt]
    return "s16" if lo <= zp <= hi else "s32"


@dataclass(frozen=True)
class DwKernelSpec:
    """Everything that shapes the generated code (the cache key, with the code version)."""

    isa: str
    src_dt: str
    zp: str  # ZP_ROUTES
    output: OutputSpec
    pixels: int = 0  # P, pixels per block; 0: the most that fits

    def __post_init__(self):
        fast_path(self.isa)
        if self.src_dt not in ("u8", "s8"):
            raise ValueError(f"src_dt: expected u8 or s8, got {self.src_dt!r}")
        if self.zp not in ZP_ROUTES:
            raise ValueError(f"zp: expected one of {', '.join(ZP_ROUTES)}, got {self.zp!r}")
        if self.pixels == 0:
            for p in range(MAX_PIXELS, 0, -1):
                if self._fits(p):
                    object.__setattr__(self, "pixels", p)
                    break
            else:
                raise ValueError(f"output stage needs more registers than {self.isa} has")
        elif not 1 <= self.pixels <= MAX_PIXELS or not self._fits(self.pixels):
            raise ValueError(f"pixels: expected 1..{MAX_PIXELS} with registers for the output stage, "
                             f"got {self.pixels}")

    def _fits(self, p: int) -> bool:
        path = self.path
        compute = p + 4  # accumulators, weights, two x, zero point
        stage = p + output_registers_needed(path, self.output, 1)
        return compute <= path.registers and stage <= path.registers

    @property
    def path(self) -> Path:
        return fast_path(self.isa)

    @property
    def lanes(self) -> int:
        return self.path.lanes

    @property
    def vnni(self) -> bool:
        return self.path.kind == "vnni"

    @property
    def name(self) -> str:
        return f"dw_{self.src_dt}s8{self.output.dst_dt}_zp{self.zp}_{self.isa}_p{self.pixels}"


def args_offsets() -> dict[str, int]:
    from runtime.ffi import declare, ffi

    declare(ARGS_CDEF)
    return {f: ffi.offsetof("struct i8j_dw_args", f) for f in FIELDS}


def generate(spec: DwKernelSpec):
    """Generate the kernel's code (slow: PeachPy); see ``jit.cache.get_kernel``."""
    from jit import asm
    from jit.build import generate as build

    argument = asm.Argument(asm.ptr(asm.uint8_t), "args")
    return build(spec.name, spec.isa, SIGNATURE, (argument,), lambda: _emit(spec, argument),
                 meta={"spec": repr(spec), "pixels": spec.pixels})


def _emit(spec: DwKernelSpec, argument) -> None:  # noqa: C901 - one loop nest, read top down
    from jit import asm
    from jit.asm import (ADD, CMP, DEC, IMUL, INC, JE, JG, JGE, JL, JMP, JNE, JNZ, JZ, LABEL, LEA, MOV,
                         SHR, TEST, XOR, Label, rax, rbp, rbx, rcx, rdi, rdx, rsi, r8, r9, r10, r11,
                         r12, r13, r14, r15)

    path = spec.path
    wide = path.bits == 512
    lanes = path.lanes
    P = spec.pixels
    off = args_offsets()
    dst_bytes = spec.output.dst_bytes
    V = lambda i: vector_register(path, i)  # noqa: E731
    A = lambda f: [rdi + off[f]]  # noqa: E731
    acc = [V(i) for i in range(P)]
    wreg, xregs, zpv = V(P), (V(P + 1), V(P + 2)), V(P + 3)
    ktail = asm.KRegister(physical_id=7)  # the output stage uses k1..k(nr)
    vxor = asm.VPXORD if wide else asm.VPXOR
    widen = asm.VPMOVSXBD if spec.src_dt == "s8" else asm.VPMOVZXBD
    src_operand = asm.oword if wide else asm.qword

    # GPRs. Whole call: rdi args, r12 src row (first valid kh), r14 channel*4, rsi ow.
    # Accumulation: rax/rdx src of pixels 0-2/3-5 at the tap, r8 src_px, r9 weights at the
    # tap, rcx/r10 src/weights at the kh row's first tap, rbx kh count, rbp kw count,
    # r11 kw taps, r15 src_dw, r13 w_tap. Output stage: r13 n_left, r15 pixel*4,
    # r10/rcx dst of pixels 0-2/3-5, r11 dst_px; rax, rdx, r8, r9 its scratch.
    asm.LOAD.ARGUMENT(rdi, argument)
    if wide:
        asm.KMOVW(ktail, asm.word[A("tail_mask")[0]])

    def load_x(x, address, kind) -> None:
        """x = the block's channels of one source pixel, widened to s32 lanes (minus zp)."""
        if kind == "full":
            widen(x, src_operand[address])
        elif kind == "masked":
            widen(x(ktail.z), asm.oword[address])
        else:  # AVX2 piece of `kind` channels: exactly that many bytes
            xx = x.as_xmm
            if kind == 4:
                asm.VMOVD(xx, asm.dword[address])
            elif kind == 2:
                asm.VPINSRW(xx, xx, asm.word[address], 0)
            else:
                asm.VPINSRB(xx, xx, asm.byte[address], 0)
            widen(x, xx)
        if spec.zp != "none":
            asm.VPSUBD(x, x, zpv)

    def multiply_add(a, x) -> None:
        if spec.zp == "s32":
            asm.VPMULLD(x, x, wreg)
            asm.VPADDD(a, a, x)
        elif spec.vnni:
            asm.VPDPWSSD(a, x, wreg, vex=path.vex)
        else:
            asm.VPMADDWD(x, x, wreg)
            asm.VPADDD(a, a, x)

    def src_pixel(p):
        base = rax if p < 3 else rdx
        return [base + 0, base + r8 * 1, base + r8 * 2][p % 3]

    def c_row(i):
        base = r10 if i < 3 else rcx
        return [base + 0, base + r11 * 1, base + r11 * 2][i % 3]

    def block(n: int, kind) -> None:
        """``n`` pixels from ow = rsi, one channel block at r14: accumulate, output stage."""
        LEA(rbx, [rsi + rsi * 2])
        MOV(rcx, A("wtab"))
        LEA(rcx, [rcx + rbx * 8])          # the column table's entry of ow
        MOV(rax, r14)
        SHR(rax, 2)
        ADD(rax, r12)
        ADD(rax, [rcx])                    # src: row, channel, first valid kw
        MOV(r10, A("wrow"))
        ADD(r10, r14)
        ADD(r10, [rcx + 8])                # weights: first valid kh and kw, channel
        MOV(r11, [rcx + 16])               # kw taps
        MOV(rcx, rax)
        MOV(rbx, A("khn"))
        for a in acc[:n]:
            vxor(a, a, a)
        if kind not in ("full", "masked"):
            for x in xregs:
                vxor(x, x, x)              # piece loads fill the low bytes only
        if spec.zp != "none":
            asm.VPBROADCASTD(zpv, asm.dword[A("zp")[0]])
        done = Label()
        TEST(rbx, rbx)
        JZ(done)
        TEST(r11, r11)
        JZ(done)
        if n > 1:
            MOV(r8, A("src_px"))
        MOV(r15, A("src_dw"))
        MOV(r13, A("w_tap"))
        kh_loop, kw_loop = Label(), Label()
        LABEL(kh_loop)
        MOV(rax, rcx)
        if n > 3:
            LEA(rdx, [r8 + r8 * 2])
            ADD(rdx, rax)
        MOV(r9, r10)
        MOV(rbp, r11)
        LABEL(kw_loop)
        if wide:
            asm.VMOVDQU32(wreg, [r9])
        else:
            asm.VMOVDQU(wreg, [r9])
        if spec.zp == "s32":
            asm.VPSLLD(wreg, wreg, 16)
            asm.VPSRAD(wreg, wreg, 16)
        for p in range(n):
            x = xregs[p % 2]
            load_x(x, src_pixel(p), kind)
            multiply_add(acc[p], x)
        ADD(rax, r15)
        if n > 3:
            ADD(rdx, r15)
        ADD(r9, r13)
        DEC(rbp)
        JNZ(kw_loop)
        ADD(rcx, A("src_dh"))
        ADD(r10, A("w_kh"))
        DEC(rbx)
        JNZ(kh_loop)
        LABEL(done)
        # output stage: dst of the block, pixel index, valid channels
        MOV(r11, A("dst_px"))
        MOV(r10, rsi)
        IMUL(r10, r11)
        ADD(r10, A("dst"))
        if dst_bytes == 4:
            ADD(r10, r14)
        else:
            MOV(rax, r14)
            SHR(rax, 2)
            ADD(r10, rax)
        if n > 3:
            LEA(rcx, [r11 + r11 * 2])
            ADD(rcx, r10)
        MOV(r15, A("pix"))
        ADD(r15, rsi)
        asm.SHL(r15, 2)
        if kind == "full":
            MOV(r13.as_dword, lanes)
        elif kind == "masked":
            MOV(r13, A("tail"))
        else:
            MOV(r13.as_dword, kind)
        free = [V(j) for j in range(n, path.registers)]
        ctx = OutputContext(path=path, spec=spec.output, args=rdi, offsets=off, col_bytes=r14, row_bytes=r15,
                            n_left=r13, c_row=c_row, free_vectors=free, free_gprs=[rax, rdx, r8, r9])
        emit_output(ctx, [[a] for a in acc[:n]], n, 1)

    def pixel_loop(kind, blocks: bool) -> None:
        """Every ow of the row for the channel block at r14."""
        loop, single, nxt = Label(), Label(), Label()
        XOR(rsi.as_dword, rsi.as_dword)
        LABEL(loop)
        if blocks and P > 1:
            CMP(rsi, A("ow_lo"))
            JL(single)
            CMP(rsi, A("ow_blk_last"))
            JG(single)
            block(P, kind)
            ADD(rsi, P)
            JMP(nxt)
        LABEL(single)
        block(1, kind)
        INC(rsi)
        LABEL(nxt)
        CMP(rsi, A("OW"))
        JL(loop)

    # ---------------------------------------------------------------- rows
    row_loop, same_image = Label(), Label()
    LABEL(row_loop)
    MOV(rax, A("oh"))
    LEA(rax, [rax + rax * 2])
    MOV(rcx, A("htab"))
    MOV(r12, A("src"))
    ADD(r12, [rcx + rax * 8])
    MOV(rdx, A("wei"))
    ADD(rdx, [rcx + rax * 8 + 8])
    MOV(A("wrow"), rdx)
    MOV(rdx, [rcx + rax * 8 + 16])
    MOV(A("khn"), rdx)

    # channel blocks: full vectors, then the tail
    XOR(r14.as_dword, r14.as_dword)
    full_loop, full_done = Label(), Label()
    LABEL(full_loop)
    CMP(r14, A("full_bytes"))
    JGE(full_done)
    pixel_loop("full", True)
    ADD(r14, 4 * lanes)
    JMP(full_loop)
    LABEL(full_done)
    if wide:
        no_tail = Label()
        CMP(asm.qword[A("tail")[0]], 0)
        JE(no_tail)
        pixel_loop("masked", True)
        LABEL(no_tail)
    else:
        for width in (4, 2, 1):
            skip = Label()
            TEST(asm.qword[A("tail")[0]], width)
            JZ(skip)
            pixel_loop(width, False)
            ADD(r14, 4 * width)
            LABEL(skip)

    # next row: oh + 1, or the next image
    MOV(rax, A("row_dst"))
    ADD(A("dst"), rax)
    MOV(rax, A("OW"))
    ADD(A("pix"), rax)
    MOV(rax, A("oh"))
    INC(rax)
    CMP(rax, A("OH"))
    JNE(same_image)
    XOR(rax.as_dword, rax.as_dword)
    MOV(rcx, A("img_bytes"))
    ADD(A("src"), rcx)
    LABEL(same_image)
    MOV(A("oh"), rax)
    DEC(asm.qword[A("rows")[0]])
    JNZ(row_loop)
    asm.RETURN()
