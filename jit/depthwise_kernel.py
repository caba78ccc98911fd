"""The int8 depthwise convolution kernel template (forward inference, NHWC, one PeachPy generator).

Depthwise: every channel ``c`` has its own ``KH x KW`` filter, and

    acc[n, oh, ow, c] = sum over valid taps (kh, kw) of (x[n, ih, iw, c] - zp_src) * w[c, kh, kw]
    ih = oh*SH - pad_t + kh*DH,  iw = ow*SW - pad_l + kw*DW   (DH, DW: dilation + 1)

computed exactly in int32 (wrapping, as every int32 accumulator here), then the shared
output pipeline (``jit.output``) with channels as its columns. Padded taps are skipped,
which is what "padding contributes (zp - zp) * w = 0" means; the source zero point is
subtracted from each loaded value, so borders need no special compensation.

Arithmetic, per source vector of channels (s32 lanes). Widening blocks (every ISA):

    x = VPMOVZXBD / VPMOVSXBD (src bytes)              low s16 of each lane = the byte
    x = x - zp                                          (only with a source zero point)
    acc += x * w                                        w lanes: low s16 = weight, high s16 = 0
        s16 route:  VPDPWSSD acc, x, w (VNNI ISAs) or VPMADDWD t, x, w; VPADDD acc, acc, t.
                    A lane's product is lo(x)*w + hi(x)*0, exact while x - zp fits s16
                    (any zero point within about +-32500: the driver checks the value).
        s32 route:  (``zp="s32"``, larger zero points) w sign-extended (VPSLLD/VPSRAD 16),
                    VPMULLD t, x, w; VPADDD acc, acc, t: exact modulo 2^32.

Dot blocks (``spec.dot``: avx512_core_vnni, u8 source) skip the widening, a port-5
shuffle per source vector that competes with the output stage for that port (and, with a
zero point, the VPSUBD after it):

    acc = comp[row class][column class]                 with a zero point (``spec.comp``), else 0
    x = VBROADCASTI32X4 (16 src bytes)                 every 128-bit lane: the 16 channels
    acc += VPDPBUSD(x, w)                               w dword i: one nonzero byte, at i // 4
    (output) VPERMD acc, DOT_UNPERMUTE, acc             lane i held channel DOT_LANES[i]

``comp`` (built by the driver, in the dot lane order) is ``-zp * (sum of the weights of the
pixel's valid taps)``, wrapped to int32: a pixel's valid taps are a rectangle, its kh range
from the row (a class per distinct range, offset in the row table) and its kw range from
the column (``ccol[ow]``; every pixel of an interior block has the full range), so
``sum (x - zp) * w = sum x * w + comp`` modulo 2^32 for every zero point. The channel tail
is widened and subtracts the zero point as the widening blocks do.

Dword lane i = 4b + q of x holds channels 4q..4q+3; its weight byte b selects channel
4q + b, so each lane adds exactly one u8 * s8 product (no intermediate to saturate).

So every ISA path computes the mathematical int32 result; no VPMADDUBSW saturation.

Register blocking along W. A *block* is P consecutive output pixels of one row (P =
``spec.pixels``) and ``nv`` vectors of channels: P x nv accumulators (nv = ``spec.vectors``
while that many full vectors are left: two on the zmm VNNI path, where the multiply-add's
latency needs about 12 independent accumulators to run at full rate). The window's width,
stride and dilation along W are part of the spec, so the generator knows, for every source
column ``j`` of the block (``iw = ow0*SW - pad_l + j``), which (pixel, kw) pairs read it:
pixel ``p`` reads column ``p*SW + kw*DW``. Per kh row of the window the block loads each
such column once (widens it once) and feeds it to every pixel that reads it, with the
row's KW weight vectors held in registers (in groups of kw when they do not all fit).
For a 3x3 stride-1 window and P = 7 that is 9 widened loads for 21 multiply-adds, where
a pixel-at-a-time kernel would widen 21.

Blocks of a row start at ow = 0, P, 2P, ...; the driver's block table (``btab``) gives
each block a *column mask* (bit r: the r-th distinct column the block reads lies inside
the image and is read by one of the block's pixels) and its pixel count. Three bodies:

    interior  P pixels, every column inside the image: no tests (the hot one)
    edge      P pixels, columns tested against the mask (TEST + JZ), so padding columns
              are never loaded; one output stage for the block
    partial   n < P pixels (the row's last block): columns tested, the output stage
              per pixel, each behind a test of n

``ow_lo``/``ow_hi`` bound the interior blocks' first pixels, so the dispatch of an
interior block reads no table. Valid kh rows come from the row table (``htab``):
padded rows are skipped.

Loop nest of one call (a chunk of consecutive output rows (n, oh)):

    for each output row:
        kh range from the row table (first valid kh, its offsets, count)
        for each block of the row (interior / edge / partial):
            for each channel group (nv full vectors while that many are left, then fewer):
                for kh in the valid rows:
                    for each group of kw: load its weights; for each column the group
                        reads: (test), load (widen, -zp), multiply-add into its pixels
                (dot: VPERMD) output stage (jit.output) for the block's pixels
        the channel tail: a second pass over the row's blocks

Blocks outermost: a block's source pixels are read whole (every channel) while they
are in L1, and the weights of all channels stay there too (stride 2 gains most).

The channel tail is a masked piece on AVX-512 (zero-masking VPMOVZXBD with fault
suppression) and, on AVX2, pieces of 4, 2 and 1 channels (VMOVD / VPINSRW / VPINSRB) so
no byte outside the source is read (pieces take the partial body only: at most 7
channels); the output stage masks the stores. Weights are packed by the driver as
``[tap][C_pad]`` s32 lanes (low s16 = weight), zero padded, with one vector of slack
after the last tap, so weight loads never need masks; dot kernels read a second section
of that size whose whole 16-channel vectors are in the dot layout (the tail stays
plain).

Sizes (N, C, H, W, KH, strides and dilation along H, padding) are run-time values
(fields and the two tables); the code depends on :class:`DwKernelSpec` only, whose
window fields (KW, SW, DW) and P shape the unrolled column schedule. The driver sets
the input fields; the kernel copies the chunk's start (``src0``, ``dst0``, ``rows0``,
``oh0``, ``pix0``) into its state fields (``src``, ``dst``, ``rows``, ``oh``, ``pix``,
``wrow``, ``khn``) on entry, so a struct can be called again without being reset; give
each concurrent call its own struct.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from jit.dot import Path, fast_path, vector_constant, vector_register
from jit.output import (OUTPUT_FIELDS, OutputContext, OutputSpec, args_cdef_fields, emit_output,
                        output_registers_needed)

ARGS_CDEF = """
struct i8j_dw_args {
    void *src0;           /* image of the chunk's first row */
    void *dst0;           /* dst pixel (n, oh, 0), channel 0, of the chunk's first row */
    void *wei;            /* packed weights [tap][C_pad] s32 lanes */
    void *htab;           /* per oh: {src_off, w_off, kh count, comp_off} int64; src_off includes -pad_l*C */
    void *btab;           /* per block of a row: {column mask, pixels} int64 */
    int64_t rows0;        /* output rows of the chunk */
    int64_t oh0;          /* oh of the chunk's first row */
    int64_t pix0;         /* index of the chunk's first pixel (binary post-op operands) */
    int64_t OH; int64_t OW;
    int64_t img_bytes;    /* IH*IW*C */
    int64_t C; int64_t C3;  /* src bytes between neighbouring pixels of a row, and 3 times that */
    int64_t full_bytes;   /* 4 * channels in full vectors */
    int64_t tail;         /* channels after the full vectors */
    uint64_t tail_mask;   /* AVX-512: lanes of the tail */
    int64_t src_px;       /* SW*C: src bytes between neighbouring output pixels' windows */
    int64_t src_dh;       /* DH*IW*C: src bytes between kh taps */
    int64_t w_tap; int64_t w_tap3;  /* 4*C_pad: weight bytes between taps, and 3 times that */
    int64_t w_kh;         /* KW * w_tap */
    int64_t dst_px;       /* C*sizeof(dst) */
    int64_t row_dst;      /* OW*C*sizeof(dst) */
    int64_t ow_lo; int64_t ow_hi;  /* interior blocks start at ow in [ow_lo, ow_hi) */
    int32_t zp; int32_t pad0;
    void *comp;           /* dot kernels with compensation: [row class][col class][C_pad] int32, dot lane order */
    void *ccol;           /* per ow (whole blocks): byte offset of its column class in a comp row class */
    void *src;            /* kernel state: image of the current row */
    void *dst;            /* kernel state: dst pixel (n, oh, 0) of the current row */
    int64_t rows;         /* kernel state: rows left */
    int64_t oh;           /* kernel state: oh of the current row */
    int64_t pix;          /* kernel state: index of pixel (n, oh, 0) */
    void *wrow;           /* kernel state: weights of the row's first valid kh */
    int64_t khn;          /* kernel state: valid kh of the row */
    void *crow;           /* kernel state: comp of the row's class */
    %s                    /* the output stage's (jit.output) */
};
""" % args_cdef_fields()
SIGNATURE = "void (*)(struct i8j_dw_args *)"
FIELDS = ("src0", "dst0", "wei", "htab", "btab", "rows0", "oh0", "pix0", "OH", "OW", "img_bytes", "C", "C3",
          "full_bytes", "tail", "tail_mask", "src_px", "src_dh", "w_tap", "w_tap3", "w_kh", "dst_px",
          "row_dst", "ow_lo", "ow_hi", "zp", "comp", "ccol", "src", "dst", "rows", "oh", "pix", "wrow", "khn",
          "crow") + OUTPUT_FIELDS
ZP_ROUTES = ("none", "s16", "s32")
MAX_PIXELS = 9  # three dst bases of three pixels each in the output stage
MAX_COLUMNS = 64  # distinct source columns of a block: one bit each in a 64-bit mask
MAX_VECTORS = 2  # three or four measured no faster on MobileNet's layers
# Dot blocks: a 16-channel source vector broadcast to the four 128-bit lanes, so dword
# lane i = 4*b + q holds channels 4q..4q+3; its weight dword has one nonzero byte, at
# position b, so VPDPBUSD adds x[c] * w[c] for c = 4q + b alone (exact: one u8 * s8
# product per lane). VPERMD by DOT_UNPERMUTE puts channel j back in lane j.
DOT_LANES = tuple(4 * (i % 4) + i // 4 for i in range(16))  # lane i -> its channel
DOT_UNPERMUTE = tuple(DOT_LANES.index(j) for j in range(16))
S16_ZP_RANGE = {"u8": (255 - 32767, 32768), "s8": (127 - 32767, 32768 - 128)}  # x - zp fits s16


def zp_route(src_dt: str, zp: int) -> str:
    """The arithmetic a source zero point needs: none, s16 (x - zp fits s16) or s32."""
    if zp == 0:
        return "none"
    lo, hi = S16_ZP_RANGE[src_dt]
    return "s16" if lo <= zp <= hi else "s32"


def block_columns(pixels: int, kw: int, sw: int, dw: int) -> tuple[int, ...]:
    """The distinct source columns ``p*SW + k*DW`` a block of ``pixels`` reads, sorted
    (bit r of a block's column mask stands for the r-th)."""
    return tuple(sorted({p * sw + k * dw for p in range(pixels) for k in range(kw)}))


@dataclass(frozen=True)
class DwKernelSpec:
    """Everything that shapes the generated code (the cache key, with the code version).

    ``kw``, ``sw``, ``dw``: the window's width, stride and dilation + 1 along W (the
    column schedule is unrolled for them); ``pixels``: P, output pixels per block
    (0: the most that fits); ``vectors``: channel vectors per block while that many full
    ones are left (1..MAX_VECTORS; 0: 2 on the zmm VNNI path, where the multiply-add's
    latency needs more independent accumulators than P, else 1); ``dot``: broadcast
    VPDPBUSD blocks for the full vectors (see the module docstring).
    """

    isa: str
    src_dt: str
    zp: str  # ZP_ROUTES
    output: OutputSpec
    pixels: int = 0
    kw: int = 1
    sw: int = 1
    dw: int = 1
    vectors: int = 0
    dot: bool = False

    def __post_init__(self):
        fast_path(self.isa)
        if self.src_dt not in ("u8", "s8"):
            raise ValueError(f"src_dt: expected u8 or s8, got {self.src_dt!r}")
        if self.zp not in ZP_ROUTES:
            raise ValueError(f"zp: expected one of {', '.join(ZP_ROUTES)}, got {self.zp!r}")
        for name in ("kw", "sw", "dw"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if self.kw > MAX_COLUMNS:
            raise ValueError(f"kw: at most {MAX_COLUMNS} taps along W, got {self.kw}")
        if self.dot and not (self.isa == "avx512_core_vnni" and self.src_dt == "u8"):
            raise ValueError("dot: the broadcast VPDPBUSD blocks take a u8 source on avx512_core_vnni, not "
                             f"{self.src_dt} on {self.isa}")
        if self.vectors == 0:
            object.__setattr__(self, "vectors", 2 if self.path.bits == 512 and self.vnni else 1)
        if self.vectors not in range(1, MAX_VECTORS + 1):
            raise ValueError(f"vectors: expected 1..{MAX_VECTORS} channel vectors per block, got {self.vectors!r}")
        if self.pixels == 0:
            for p in range(MAX_PIXELS, 0, -1):
                if self.fits(p):
                    object.__setattr__(self, "pixels", p)
                    break
            else:
                raise ValueError(f"output stage needs more registers than {self.isa} has")
        elif not 1 <= self.pixels <= MAX_PIXELS or not self.fits(self.pixels):
            raise ValueError(f"pixels: expected 1..{MAX_PIXELS} with registers for the output stage and at most "
                             f"{MAX_COLUMNS} source columns per block, got {self.pixels}")

    def fits(self, p: int) -> bool:
        """Whether blocks of ``p`` pixels (of ``vectors`` channel vectors) fit: registers (for
        every zero-point route, so a primitive's P serves them all) and the 64-bit column
        mask."""
        path, nv = self.path, self.vectors
        compute = nv * p + nv + 3  # accumulators, a weight per vector, x, a product temporary, zero point
        stage = nv * p + output_registers_needed(path, self.output, nv)
        return (compute <= path.registers and stage <= path.registers
                and len(block_columns(p, self.kw, self.sw, self.dw)) <= MAX_COLUMNS)

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
    def comp(self) -> bool:
        """Dot blocks with a source zero point: their accumulators start from the
        compensation ``-zp * (sum of the pixel's valid taps' weights)`` (the ``comp``
        table), since VPDPBUSD takes the source whole (no zero point subtracted)."""
        return self.dot and self.zp != "none"

    @property
    def temporaries(self) -> int:
        """Vector registers of the accumulation besides accumulators and weights."""
        product = 0 if self.vnni and self.zp != "s32" else 1
        return 1 + product + (self.zp != "none")  # x, product, zero point

    def group(self, vectors: int) -> int:
        """Taps whose weights are held at once by a block of ``vectors`` channel vectors:
        the whole row of KW where registers allow."""
        return min(self.kw, (self.path.registers - vectors * self.pixels - self.temporaries) // vectors)

    @cached_property
    def columns(self) -> tuple[int, ...]:
        return block_columns(self.pixels, self.kw, self.sw, self.dw)

    @property
    def name(self) -> str:
        return (f"dw_{self.src_dt}s8{self.output.dst_dt}_zp{self.zp}_{self.isa}_p{self.pixels}v{self.vectors}"
                f"_kw{self.kw}s{self.sw}d{self.dw}{'_dot' if self.dot else ''}{'c' if self.comp else ''}")


def args_offsets() -> dict[str, int]:
    from runtime.ffi import struct_offsets

    return struct_offsets(ARGS_CDEF, "struct i8j_dw_args", FIELDS)


def generate(spec: DwKernelSpec):
    """Generate the kernel's code (slow: PeachPy); see ``jit.cache.get_kernel``."""
    from jit import asm
    from jit.build import generate as build

    argument = asm.Argument(asm.ptr(asm.uint8_t), "args")
    return build(spec.name, spec.isa, SIGNATURE, (argument,), lambda: _emit(spec, argument),
                 meta={"spec": repr(spec), "pixels": spec.pixels, "vectors": spec.vectors, "dot": spec.dot})


class _Stepper:
    """Addresses ``base + i*unit`` for increasing i through a running pointer, with the
    unit and three units in registers: from the pointer, i - at in {0, 1, 2, 3, 4, 6, 8,
    12, 24} is one operand; farther targets move the pointer with LEA first."""

    def __init__(self, base, running, unit, unit3):
        self.base, self.running, self.unit, self.unit3 = base, running, unit, unit3
        self.at = 0
        self.current = base  # the running register once the pointer has moved

    def _offsets(self) -> dict:
        u, u3, p = self.unit, self.unit3, self.current
        return {0: p + 0, 1: p + u * 1, 2: p + u * 2, 3: p + u3 * 1, 4: p + u * 4, 6: p + u3 * 2, 8: p + u * 8,
                12: p + u3 * 4, 24: p + u3 * 8}

    def address(self, i: int):
        from jit.asm import LEA

        if i < self.at:
            raise AssertionError("columns and taps are visited in increasing order")
        while i - self.at not in self._offsets():
            step = max(s for s in self._offsets() if s <= i - self.at)
            LEA(self.running, [self._offsets()[step]])
            self.current, self.at = self.running, self.at + step
        return self._offsets()[i - self.at]


@dataclass(frozen=True)
class _Kind:
    """A channel block's kind: ``what`` is "full" (whole vectors, widened), "dot" (whole
    vectors, broadcast + VPDPBUSD), "masked" (the AVX-512 tail) or an AVX2 piece width
    (4, 2, 1 channels); ``vectors`` of them per block."""

    what: object
    vectors: int = 1

    @property
    def whole(self) -> bool:
        return self.what in ("full", "dot", "masked")


def _emit(spec: DwKernelSpec, argument) -> None:  # noqa: C901 - one loop nest, read top down
    from jit import asm
    from jit.asm import (ADD, BT, CMP, DEC, IMUL, JE, JG, JGE, JL, JLE, JMP, JNC, JNE, JNZ, JZ, LABEL, LEA, MOV, SHL,
                         SHR, TEST, XOR, Label, rax, rbp, rbx, rcx, rdi, rdx, rsi, r8, r9, r10, r11, r12, r13, r14,
                         r15)

    path = spec.path
    wide = path.bits == 512
    lanes, vb = path.lanes, path.vector_bytes
    P = spec.pixels
    off = args_offsets()
    dst_bytes = spec.output.dst_bytes
    V = lambda i: vector_register(path, i)  # noqa: E731
    A = lambda f: [rdi + off[f]]  # noqa: E731
    ktail = asm.KRegister(physical_id=7)  # the output stage uses k1..k(nr)
    vxor = asm.VPXORD if wide else asm.VPXOR
    widen = asm.VPMOVSXBD if spec.src_dt == "s8" else asm.VPMOVZXBD
    src_operand = asm.oword if wide else asm.qword
    columns = spec.columns

    class Regs:
        """Vector registers of a block of ``nv`` channel vectors: acc[p][v], weights w[k][v]
        of the current kw group, x, the product temporary, the zero point."""

        def __init__(self, nv: int):
            self.nv, self.group = nv, spec.group(nv)
            self.acc = [[V(p * nv + v) for v in range(nv)] for p in range(P)]
            self.w = [[V(nv * P + k * nv + v) for v in range(nv)] for k in range(self.group)]
            spare = iter([V(nv * (P + self.group) + i) for i in range(spec.temporaries)])
            self.x = next(spare)
            self.prod = next(spare) if not (spec.vnni and spec.zp != "s32") else None
            self.zpv = next(spare) if spec.zp != "none" else None
            # kw taps in groups of at most `group` (one group unless KW is large)
            self.groups = [list(range(k, min(spec.kw, k + self.group))) for k in range(0, spec.kw, self.group)]

    # GPRs. Whole call: rdi args, r12 src row (first valid kh, column -pad_l), r14
    # channel*4, rsi first ow of the block, rbp its block-table entry.
    # Accumulation: rax src of the kh row at the block's column 0, rcx running column
    # pointer, rdx weights of the kh row, r8 running weight pointer, rbx kh rows left,
    # r9/r10 C/3C, r11/r13 w_tap/3*w_tap, r15 column mask.
    # Output stage: r13 n_left, r15 pixel*4, r11 dst_px, r10/rcx/rbx dst of pixels
    # 0-2/3-5/6-8; rax, rdx, r8, r9 its scratch.
    asm.LOAD.ARGUMENT(rdi, argument)
    if wide:
        asm.KMOVW(ktail, asm.word[A("tail_mask")[0]])
    for state, start in (("src", "src0"), ("dst", "dst0"), ("rows", "rows0"), ("oh", "oh0"), ("pix", "pix0")):
        MOV(rax, A(start))
        MOV(A(state), rax)

    def load_x(r: Regs, address, kind: _Kind) -> None:
        """x = a block vector's channels of one source pixel: widened to s32 lanes (minus zp),
        or for dot blocks the 16 bytes broadcast to every 128-bit lane."""
        x = r.x
        if kind.what == "dot":
            asm.VBROADCASTI32X4(x, asm.oword[address])  # a load-port uop: no shuffle
            return
        if kind.what == "full":
            widen(x, src_operand[address])
        elif kind.what == "masked":
            widen(x(ktail.z), asm.oword[address])
        else:  # AVX2 piece of `kind.what` channels: exactly that many bytes
            xx = x.as_xmm
            if kind.what == 4:
                asm.VMOVD(xx, asm.dword[address])
            elif kind.what == 2:
                asm.VPINSRW(xx, xx, asm.word[address], 0)
            else:
                asm.VPINSRB(xx, xx, asm.byte[address], 0)
            widen(x, xx)
        if r.zpv is not None:
            asm.VPSUBD(x, x, r.zpv)

    def multiply_add(r: Regs, a, w, kind: _Kind) -> None:
        if kind.what == "dot":
            asm.VPDPBUSD(a, r.x, w)
        elif spec.zp == "s32":
            asm.VPMULLD(r.prod, r.x, w)
            asm.VPADDD(a, a, r.prod)
        elif spec.vnni:
            asm.VPDPWSSD(a, r.x, w, vex=path.vex)
        else:
            asm.VPMADDWD(r.prod, r.x, w)
            asm.VPADDD(a, a, r.prod)

    def test_column(rank: int, skip: Label) -> None:
        """Jump to ``skip`` unless bit ``rank`` of the block's column mask (r15) is set."""
        if rank < 31:  # TEST's imm32 is sign-extended: bits 0..30 only
            TEST(r15.as_dword, 1 << rank)
            JZ(skip)
        else:
            BT(r15, rank)
            JNC(skip)

    def accumulate(r: Regs, kind: _Kind, checked: bool) -> None:
        """acc = the block's sums over the valid kh rows (columns tested if ``checked``)."""
        MOV(rax, rsi)
        IMUL(rax, A("src_px"))             # ow0*SW*C
        MOV(rcx, r14)
        SHR(rcx, 2)
        ADD(rax, rcx)
        ADD(rax, r12)                      # src: kh row, block's column 0, channel
        MOV(rdx, A("wrow"))
        ADD(rdx, r14)                      # weights: the row's first valid kh, kw 0, channel
        if kind.what == "dot" and spec.comp:
            # accumulators start from the pixel's compensation: comp row class (crow) + its
            # column class (ccol[ow]; one class for every pixel of an interior block)
            MOV(r9, A("crow"))
            ADD(r9, r14)
            MOV(r10, A("ccol"))
            for p, row in enumerate(r.acc):
                if p == 0 or checked:
                    MOV(r11, [r10 + rsi * 8 + 8 * p])
                    ADD(r11, r9)
                for v, a in enumerate(row):
                    asm.VMOVDQU32(a, [r11 + v * vb])
        else:
            for row in r.acc:
                for a in row:
                    vxor(a, a, a)
        if not kind.whole:
            vxor(r.x, r.x, r.x)            # piece loads fill the low bytes only
        if r.zpv is not None and kind.what != "dot":
            asm.VPBROADCASTD(r.zpv, asm.dword[A("zp")[0]])
        if checked:
            MOV(r15, [rbp])
        done = Label()
        MOV(rbx, A("khn"))
        TEST(rbx, rbx)
        JZ(done)
        MOV(r9, A("C"))
        MOV(r10, A("C3"))
        MOV(r11, A("w_tap"))
        MOV(r13, A("w_tap3"))
        kh_loop = Label()
        LABEL(kh_loop)
        for taps in r.groups:
            weights = _Stepper(rdx, r8, r11, r13)
            for k in taps:
                address = weights.address(k)
                for v in range(r.nv):
                    w = r.w[k - taps[0]][v]
                    (asm.VMOVDQU32 if wide else asm.VMOVDQU)(w, [address + v * vb])
                    if spec.zp == "s32" and kind.what != "dot":
                        asm.VPSLLD(w, w, 16)
                        asm.VPSRAD(w, w, 16)
            src = _Stepper(rax, rcx, r9, r10)
            for rank, j in enumerate(columns):
                users = [(p, k) for p in range(P) for k in taps if p * spec.sw + k * spec.dw == j]
                if not users:
                    continue
                address = src.address(j)
                skip = Label()
                if checked:
                    test_column(rank, skip)
                for v in range(r.nv):
                    load_x(r, address + v * lanes, kind)
                    for p, k in users:
                        multiply_add(r, r.acc[p][v], r.w[k - taps[0]][v], kind)
                LABEL(skip)
        ADD(rax, A("src_dh"))
        ADD(rdx, A("w_kh"))
        DEC(rbx)
        JNZ(kh_loop)
        LABEL(done)

    def c_row(i):
        base = [r10, rcx, rbx][i // 3]
        return base + 0 if i % 3 == 0 else base + r11 * (i % 3)

    def output(r: Regs, kind: _Kind, per_pixel: bool) -> None:
        """The output stage: P pixels at once, or (``per_pixel``) pixel by pixel while the
        block has them (its pixel count is in the block table)."""
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
        if P > 3:
            LEA(rcx, [r11 + r11 * 2])
            ADD(rcx, r10)
        if P > 6:
            LEA(rbx, [r11 + r11 * 2])
            ADD(rbx, rcx)
        MOV(r15, A("pix"))
        ADD(r15, rsi)
        SHL(r15, 2)
        if kind.what == "dot":
            # lane i of a dot accumulator holds channel 4*(i%4) + i//4 (see DOT_LANES)
            index = r.w[0][0]
            asm.VMOVDQU32(index, vector_constant(path, DOT_UNPERMUTE, "dw_dot_unpermute"))
            for row in r.acc:
                for a in row:
                    asm.VPERMD(a, index, a)
        if kind.what in ("full", "dot"):
            MOV(r13.as_dword, lanes * r.nv)
        elif kind.what == "masked":
            MOV(r13, A("tail"))
        else:
            MOV(r13.as_dword, kind.what)

        def context(first: int, rows):
            """Pixels first..P-1 still hold live accumulators (V(p*nv + v)); the rest is free."""
            free = [V(j) for j in range(path.registers) if not first * r.nv <= j < P * r.nv]
            # full and dot blocks store whole vectors; masked blocks and AVX2 pieces, partial ones
            return OutputContext(path=path, spec=spec.output, args=rdi, offsets=off, col_bytes=r14, row_bytes=r15,
                                 n_left=r13, c_row=rows, free_vectors=free, free_gprs=[rax, rdx, r8, r9],
                                 n_tail=kind.what not in ("full", "dot"), partial_only=True)

        if not per_pixel:
            emit_output(context(0, c_row), r.acc, P, r.nv)
            return
        end = Label()
        for pixel in range(P):
            if pixel:
                CMP(asm.qword[rbp + 8], pixel)
                JLE(end)                   # the block has no pixel `pixel`
                ADD(r15, 4)
            address = c_row(pixel)
            emit_output(context(pixel, lambda i, a=address: a), [r.acc[pixel]], 1, r.nv)
        LABEL(end)

    def block(kind: _Kind, body: str) -> None:
        r = Regs(kind.vectors)
        accumulate(r, kind, checked=body != "interior")
        output(r, kind, per_pixel=body == "partial")

    def dispatch(body, variants: bool = True) -> None:
        """Every block of the row: ``body(variant)`` for the block at rsi (rbp its table
        entry), variant "interior", "edge" or "partial"; without ``variants``, "partial"
        (which takes any block) for all."""
        loop, checked, partial, nxt = Label(), Label(), Label(), Label()
        XOR(rsi.as_dword, rsi.as_dword)
        MOV(rbp, A("btab"))
        LABEL(loop)
        if variants:
            CMP(rsi, A("ow_lo"))
            JL(checked)
            CMP(rsi, A("ow_hi"))
            JGE(checked)
            body("interior")
            JMP(nxt)
            LABEL(checked)
            CMP(asm.qword[rbp + 8], P)
            JNE(partial)
            body("edge")
            JMP(nxt)
        LABEL(partial)
        body("partial")
        LABEL(nxt)
        ADD(rsi, P)
        ADD(rbp, 16)
        CMP(rsi, A("OW"))
        JL(loop)

    def full_vectors(variant: str) -> None:
        """The block at rsi over every full vector of channels: groups of spec.vectors while
        that many are left, then (at most) one group of each smaller count."""
        XOR(r14.as_dword, r14.as_dword)
        for nv in range(spec.vectors, 0, -1):
            group_loop, group_done = Label(), Label()
            LABEL(group_loop)
            LEA(rax, [r14 + 4 * lanes * nv])
            CMP(rax, A("full_bytes"))
            JG(group_done)
            block(_Kind("dot" if spec.dot else "full", nv), variant)
            ADD(r14, 4 * lanes * nv)
            if nv == spec.vectors:
                JMP(group_loop)
            LABEL(group_done)

    # ---------------------------------------------------------------- rows
    row_loop, same_image = Label(), Label()
    LABEL(row_loop)
    MOV(rax, A("oh"))
    SHL(rax, 5)                            # 32-byte htab rows
    MOV(rcx, A("htab"))
    MOV(r12, A("src"))
    ADD(r12, [rcx + rax * 1])
    MOV(rdx, A("wei"))
    ADD(rdx, [rcx + rax * 1 + 8])
    MOV(A("wrow"), rdx)
    MOV(rdx, [rcx + rax * 1 + 16])
    MOV(A("khn"), rdx)
    if spec.comp:
        MOV(rdx, A("comp"))
        ADD(rdx, [rcx + rax * 1 + 24])
        MOV(A("crow"), rdx)

    # Full vectors: blocks outermost, channels inside, so a block's source pixels are read
    # whole (all their channels) while in L1, and the weights of every channel stay there.
    dispatch(full_vectors)
    # The tail, a second pass over the blocks (a few channels: its own bodies stay few;
    # the block bodies leave r14 as they found it).
    MOV(r14, A("full_bytes"))
    if wide:
        no_tail = Label()
        CMP(asm.qword[A("tail")[0]], 0)
        JE(no_tail)
        dispatch(lambda variant: block(_Kind("masked"), variant))
        LABEL(no_tail)
    else:
        for width in (4, 2, 1):
            skip = Label()
            TEST(asm.qword[A("tail")[0]], width)
            JZ(skip)
            dispatch(lambda variant, w=width: block(_Kind(w), variant), variants=False)
            ADD(r14, 4 * width)
            LABEL(skip)

    # next row: oh + 1, or the next image
    MOV(rax, A("row_dst"))
    ADD(A("dst"), rax)
    MOV(rax, A("OW"))
    ADD(A("pix"), rax)
    MOV(rax, A("oh"))
    asm.INC(rax)
    CMP(rax, A("OH"))
    JNE(same_image)
    XOR(rax.as_dword, rax.as_dword)
    MOV(rcx, A("img_bytes"))
    ADD(A("src"), rcx)
    LABEL(same_image)
    MOV(A("oh"), rax)
    DEC(asm.qword[A("rows")[0]])
    JNZ(row_loop)
    # PeachPy's VZEROUPPER placement follows each branch once and can miss a RETURN
    # first reached before any AVX code: clear the upper halves here, always.
    asm.VZEROUPPER()
    asm.RETURN()
