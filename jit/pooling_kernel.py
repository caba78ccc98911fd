"""The int8 pooling kernel template (forward inference, NHWC, one PeachPy generator).

A kernel call computes a chunk of consecutive output rows ``(n, oh)`` of an NHWC
tensor (``(n, od, oh)`` of an NDHWC one: ``d3``), with the whole loop nest in the
generated code::

    for each output row of the chunk:                  (n, [od,] oh), the image advances itself
        h0, h1 = clamp(oh*SH - pad_t, 0, IH), clamp(oh*SH - pad_t + KH, 0, IH)
        [d0, d1 = the same along D, from od]
        for each output pixel ow:
            w0, w1 = the same along W
            divisor = [KD*]KH*KW (avg_include_padding) or [(d1-d0)*](h1-h0)*(w1-w0) (exclude)
            for each channel block (big blocks, then small blocks, then the tail):
                acc = identity                          max: 0 (u8) / -128 (s8); avg: 0 (s32)
                [for d in d0..d1-1:]
                for h in h0..h1-1: for w in w0..w1-1:   only valid input: padding never read
                    max: acc = VPMAXUB/VPMAXSB(acc, src[h][w][block])
                    avg: acc += VPMOVZXBD/VPMOVSXBD(src[h][w][block])
                         (s16_sums: VPMOVZXBW/VPMOVSXBW and VPADDW, widened to s32 at
                         the end: windows of up to 257 u8 / 256 s8 pixels on AVX-512)
                avg: q = f32(acc) / f32(divisor)         VCVTDQ2PS, VDIVPS (IEEE, exact division
                                                          rounded once to f32)
                     dst f32: q;  s32: VCVTPS2DQ(q) (round to nearest even);
                     u8/s8: VCVTPS2DQ then saturating packs (VPMOVUSDB/VPMOVSDB on AVX-512,
                     VPACKSSDW + VPACKUSWB/VPACKSSWB + VPERMD on AVX2)
                store dst[n][oh][ow][block]

Padding is never materialised: max pooling ignores it (it is -inf), avg pooling counts it
only in the include-padding divisor. Channel blocks: ``big`` = 4 pieces, ``small`` = 1
piece, where a piece is one vector of bytes (max) or the bytes that widen into one
vector of s32 (avg). The channel tail (fewer than a piece) is one masked piece on
AVX-512 (zero-masking loads, fault suppression, masked stores) and on AVX2 a sequence of
exact-width sub-blocks (16, 8, 4, 2, 1 bytes: VMOVDQU xmm, VMOVQ, VMOVD, VPINSRW,
VPINSRB and the matching stores), so no byte outside the tensors is ever touched.

Every size (N, C, H, W, kernel window, strides, padding) is a run-time field of the
argument struct; the code depends only on :class:`PoolKernelSpec` (ISA, vector width,
algorithm, source and destination types, and the window size when it is 2 or 3 wide:
``kw`` unrolls a window row of that width, i.e. every row away from the W borders, and
``kh`` (2 or 3 high as well) makes every window inside the input straight-line code;
border windows and other sizes take the run-time loops). The kernel only reads the struct
(its row state lives on the stack), so calls may share one.
"""
from __future__ import annotations

from dataclasses import dataclass

from jit.dot import Path, fast_path, vector_constant, vector_register

ARGS_CDEF = """
struct i8j_pool_args {
    void *src;            /* NHWC image of the chunk's first row */
    void *dst;            /* the chunk's first output pixel */
    int64_t rows;         /* output rows (n, oh) in the chunk */
    int64_t oh;           /* oh of the chunk's first row */
    int64_t ih_start;     /* oh*SH - pad_t of the chunk's first row */
    int64_t OH; int64_t OW; int64_t IH; int64_t IW;
    int64_t KH; int64_t KW; int64_t SH; int64_t SW;
    int64_t pad_t; int64_t pad_l;
    int64_t row_bytes;    /* IW*C*sizeof(src) */
    int64_t pix_bytes;    /* C*sizeof(src) */
    int64_t img_bytes;    /* IH*IW*C*sizeof(src) */
    int64_t n_big; int64_t n_small; int64_t tail;   /* channel blocks; tail in channels */
    uint64_t tail_mask;   /* AVX-512: lanes of the tail piece */
    int64_t tail_dst_bytes;
    float divisor;        /* avg_include_padding: KH*KW (KD*KH*KW) */
    /* 3-D windows (d3 kernels only; a 2-D kernel reads none of these) */
    int64_t od;           /* od of the chunk's first row */
    int64_t id_start;     /* od*SD - pad_f of the chunk's first row */
    int64_t OD; int64_t ID; int64_t KD; int64_t SD; int64_t pad_f;
    int64_t plane_bytes;  /* IH*IW*C*sizeof(src): one depth slice */
};
"""
SIGNATURE = "void (*)(struct i8j_pool_args *)"
FIELDS = (
    "src", "dst", "rows", "oh", "ih_start", "OH", "OW", "IH", "IW", "KH", "KW", "SH", "SW",
    "pad_t", "pad_l", "row_bytes", "pix_bytes", "img_bytes", "n_big", "n_small", "tail",
    "tail_mask", "tail_dst_bytes", "divisor", "od", "id_start", "OD", "ID", "KD", "SD", "pad_f", "plane_bytes",
)
ALGS = ("max", "avg_include_padding", "avg_exclude_padding")
SRC_TYPES = ("u8", "s8")
DT_SIZE = {"u8": 1, "s8": 1, "s32": 4, "f32": 4}
BIG = 4  # pieces per big block
UNROLLED = (2, 3)  # window sizes unrolled in the code (addresses base + pix_bytes * {0, 1, 2})
S16_WINDOW = {"u8": 257, "s8": 256}  # most window pixels whose sums fit s16 lanes (see s16_sums)


@dataclass(frozen=True)
class PoolKernelSpec:
    """Everything that shapes the generated code (the cache key, with the version)."""

    isa: str
    alg: str
    src_dt: str
    dst_dt: str
    kw: int = 0  # UNROLLED: window rows of this width are unrolled; 0: run-time loop only
    kh: int = 0  # UNROLLED (with kw): whole interior windows are straight-line code
    # avg on AVX-512: sums in s16 lanes (u8: windows of at most S16_WINDOW["u8"] pixels
    # stay below 65536, read as unsigned; s8: S16_WINDOW["s8"] within [-32768, 32767]),
    # so a piece is 32 channels: half the widening loads and adds of s32 sums.
    s16_sums: bool = False
    # 3-D windows (NDHWC): a depth loop around the window rows, rows (n, od, oh); 2-D
    # kernels carry none of its code.
    d3: bool = False

    def __post_init__(self):
        for name, value in (("kw", self.kw), ("kh", self.kh)):
            if value not in (0,) + UNROLLED:
                raise ValueError(f"{name}: expected 0 or one of {UNROLLED}, got {value!r}")
        if self.kh and not self.kw:
            raise ValueError("kh: an unrolled window height needs an unrolled width (kw)")
        if self.alg not in ALGS:
            raise ValueError(f"alg: expected one of {', '.join(ALGS)}, got {self.alg!r}")
        if self.src_dt not in SRC_TYPES:
            raise ValueError(f"src_dt: expected u8 or s8, got {self.src_dt!r}")
        allowed = (self.src_dt,) if self.alg == "max" else (self.src_dt, "s32", "f32")
        if self.dst_dt not in allowed:
            raise ValueError(f"dst_dt: {self.alg} pooling of {self.src_dt} writes {' or '.join(allowed)}, "
                             f"got {self.dst_dt!r}")
        fast_path(self.isa)  # validates the ISA name
        if self.s16_sums and (self.is_max or self.bits != 512):
            raise ValueError("s16_sums: only avg pooling on AVX-512 sums in s16 lanes")

    @property
    def path(self) -> Path:
        return fast_path(self.isa)

    @property
    def bits(self) -> int:
        return self.path.bits

    @property
    def is_max(self) -> bool:
        return self.alg == "max"

    @property
    def piece_channels(self) -> int:
        """Channels per piece: a vector of bytes (max), or of s32 (avg) or s16 lanes (s16_sums)."""
        return self.bits // 8 if self.is_max else self.bits // (16 if self.s16_sums else 32)

    @property
    def dst_size(self) -> int:
        return DT_SIZE[self.dst_dt]

    @property
    def name(self) -> str:
        kw = (f"_kh{self.kh}" if self.kh else "") + (f"_kw{self.kw}" if self.kw else "")
        sums = "_s16" if self.s16_sums else ""
        d3 = "_3d" if self.d3 else ""
        return f"pool_{self.alg}_{self.src_dt}{self.dst_dt}{d3}{kw}{sums}_{self.isa}"

    def blocks(self, channels: int) -> tuple[int, int, int]:
        """(big blocks, small blocks, tail channels) for ``channels`` channels."""
        piece = self.piece_channels
        big, rest = divmod(channels, BIG * piece)
        small, tail = divmod(rest, piece)
        return big, small, tail


def args_offsets() -> dict[str, int]:
    from runtime.ffi import struct_offsets

    return struct_offsets(ARGS_CDEF, "struct i8j_pool_args", FIELDS)


def generate(spec: PoolKernelSpec):
    """Generate the kernel's code (slow: PeachPy); see ``jit.cache.get_kernel``."""
    from jit import asm
    from jit.build import generate as build

    argument = asm.Argument(asm.ptr(asm.uint8_t), "args")
    return build(spec.name, spec.isa, SIGNATURE, (argument,), lambda: _emit(spec, argument),
                 meta={"spec": repr(spec)})


def _emit(spec: PoolKernelSpec, argument) -> None:  # noqa: C901 - one loop nest, read top down
    from jit import asm
    from jit.asm import (ADD, CMOVL, CMOVNS, CMP, DEC, IMUL, INC, JE, JNE, JNZ, JZ, LABEL, LEA, MOV,
                         NEG, SUB, TEST, XOR, Label, rax, rbp, rbx, rcx, rdi, rdx, rsi, r8, r9, r10,
                         r11, r12, r13, r14, r15)
    from peachpy.x86_64.registers import rsp

    path = spec.path
    wide = spec.bits == 512
    vb = path.vector_bytes
    off = args_offsets()
    V = lambda i: vector_register(path, i)  # noqa: E731
    A = lambda f: [rdi + off[f]]  # noqa: E731  argument struct field
    acc = [V(i) for i in range(BIG)]
    tmp = [V(4 + i) for i in range(BIG)]
    vdiv, vinit, vperm = V(8), V(9), V(10)
    kmask, kmask_hi = asm.KRegister(physical_id=1), asm.KRegister(physical_id=2)
    avg = not spec.is_max
    signed = spec.src_dt == "s8"
    piece_bytes = spec.piece_channels  # source bytes per piece (1 byte per channel)
    vmov = asm.VMOVDQU32 if wide else asm.VMOVDQU
    vxor = asm.VPXORD if wide else asm.VPXOR

    # ---------------------------------------------------------------- set-up
    asm.LOAD.ARGUMENT(rdi, argument)
    # The row state (the image, oh, ih_start and the rows left) lives below the stack
    # pointer, in the ABI's red zone (this leaf calls nothing), not in the argument
    # struct: the struct stays as the driver wrote it, so a call needs no reset and
    # concurrent calls may share one.
    d3 = spec.d3
    # (3-D: od and id_start as well, and per output row the window's depth slices and
    # the step from the end of its last row in one slice to its first row in the next)
    state = ("src", "oh", "ih_start", "rows") + (("od", "id_start", "depth", "plane_step") if d3 else ())
    S = {field: [rsp - 8 * (i + 1)] for i, field in enumerate(state)}
    for field in state[:6]:
        MOV(rax, A(field))
        MOV(S[field], rax)
    if spec.is_max and signed:
        MOV(rax.as_dword, 0x80808080)
        asm.VMOVD(vinit.as_xmm, rax.as_dword)
        asm.VPBROADCASTD(vinit, vinit.as_xmm)
    if spec.alg == "avg_include_padding":
        asm.VBROADCASTSS(vdiv, asm.dword[A("divisor")[0]])
    if wide:
        if spec.is_max:
            asm.KMOVQ(kmask, asm.qword[A("tail_mask")[0]])
        elif spec.s16_sums:
            asm.KMOVD(kmask, asm.dword[A("tail_mask")[0]])
            asm.KSHIFTRD(kmask_hi, kmask, 16)  # the upper 16 channels' s32 lanes
        else:
            asm.KMOVW(kmask, asm.word[A("tail_mask")[0]])
    elif avg and spec.dst_size == 1:
        asm.VMOVDQU(vperm, vector_constant(path, [0, 4, 1, 5, 2, 6, 3, 7], "pool_pack_perm"))
    MOV(rdx, A("dst"))
    MOV(r10, A("pix_bytes"))

    # ---------------------------------------------------------------- one channel block
    def init(n: int) -> None:
        for p in range(n):
            if spec.is_max and signed:
                vmov(acc[p], vinit)
            else:
                vxor(acc[p], acc[p], acc[p])

    def combine(n: int, width: int | None, masked: bool, column: int = 0) -> None:
        """acc[p] op= piece p of src at r8 (+ column pixels); ``width``: AVX2 sub-block bytes (tail)."""
        for p in range(n):
            address = (r8 if column == 0 else r8 + r10 * column) + p * piece_bytes
            if spec.is_max:
                vmax = asm.VPMAXSB if signed else asm.VPMAXUB
                if width is None and not masked:
                    vmax(acc[p], acc[p], [address])
                elif masked:
                    asm.VMOVDQU8(tmp[p](kmask.z), [address])
                    vmax(acc[p], acc[p], tmp[p])
                else:
                    x = tmp[p].as_xmm
                    _load_bytes(asm, x, address, width)
                    vmax(acc[p].as_xmm, acc[p].as_xmm, x)
            elif spec.s16_sums:
                widen = asm.VPMOVSXBW if signed else asm.VPMOVZXBW
                widen(tmp[p](kmask.z) if masked else tmp[p], asm.yword[address])
                asm.VPADDW(acc[p], acc[p], tmp[p])
            else:
                widen = asm.VPMOVSXBD if signed else asm.VPMOVZXBD
                if width is None and not masked:
                    widen(tmp[p], (asm.oword if wide else asm.qword)[address])
                elif masked:
                    widen(tmp[p](kmask.z), asm.oword[address])
                else:
                    x = tmp[p].as_xmm
                    _load_bytes(asm, x, address, width)
                    widen(tmp[p], x)
                asm.VPADDD(acc[p], acc[p], tmp[p])

    def finish_s16(n: int, masked: bool) -> None:
        """s16 sums: each piece's two halves widened to s32 lanes, divided, converted and
        stored (16 channels each) at rdx."""
        dsz = spec.dst_size
        widen = asm.VPMOVSXWD if signed else asm.VPMOVZXWD
        lo, hi = tmp[0], tmp[1]
        for p in range(n):
            asm.VEXTRACTI64X4(hi.as_ymm, acc[p], 1)
            widen(lo, acc[p].as_ymm)
            widen(hi, hi.as_ymm)
            for half, (x, k) in enumerate(((lo, kmask), (hi, kmask_hi))):
                asm.VCVTDQ2PS(x, x)
                asm.VDIVPS(x, x, vdiv)
                if spec.dst_dt != "f32":
                    asm.VCVTPS2DQ(x, x)
                address = rdx + (2 * p + half) * 16 * dsz
                if dsz == 4:
                    asm.VMOVDQU32(asm.zword[address](k) if masked else asm.zword[address], x)
                else:
                    down = asm.VPMOVSDB if signed else asm.VPMOVUSDB
                    down(asm.oword[address](k) if masked else asm.oword[address], x)

    def finish(n: int, width: int | None, masked: bool) -> None:
        """Divide (avg), convert and store acc[0..n) at rdx."""
        dsz = spec.dst_size
        if spec.s16_sums:
            finish_s16(n, masked)
            return
        if avg:
            for p in range(n):
                asm.VCVTDQ2PS(acc[p], acc[p])
                asm.VDIVPS(acc[p], acc[p], vdiv)
                if spec.dst_dt != "f32":
                    asm.VCVTPS2DQ(acc[p], acc[p])

        def store_each(masked_move, lane_bytes: int) -> None:  # the accumulators as they are
            for p in range(n):
                address = rdx + p * vb
                if masked:
                    masked_move(asm.zword[address](kmask), acc[p])
                elif width is None:
                    vmov([address], acc[p])
                else:
                    _store_bytes(asm, address, acc[p].as_xmm, width * lane_bytes)
        if spec.is_max:  # bytes straight from the accumulators
            store_each(asm.VMOVDQU8, 1)
            return
        if dsz == 4:  # s32 / f32 lanes
            store_each(asm.VMOVDQU32, 4)
            return
        # u8 / s8 from s32 lanes: saturating packs
        if wide:
            down = asm.VPMOVSDB if signed else asm.VPMOVUSDB
            for p in range(n):
                address = rdx + p * (vb // 4)
                if masked:
                    down(asm.oword[address](kmask), acc[p])
                else:
                    down(asm.oword[address], acc[p])
            return
        regs = [acc[min(p, n - 1)] for p in range(BIG)]
        asm.VPACKSSDW(tmp[0], regs[0], regs[1])
        asm.VPACKSSDW(tmp[1], regs[2], regs[3])
        (asm.VPACKSSWB if signed else asm.VPACKUSWB)(tmp[0], tmp[0], tmp[1])
        asm.VPERMD(tmp[0], vperm, tmp[0])
        if n == BIG:
            asm.VMOVDQU([rdx], tmp[0])
        else:
            _store_bytes(asm, rdx, tmp[0].as_xmm, 8 if width is None else width)

    def block(n: int, width: int | None = None, masked: bool = False) -> None:
        """One channel block at rbp (src) and rdx (dst): window loops and the store."""
        init(n)
        h_loop, w_loop, window_done = Label(), Label(), Label()
        if d3:  # the window's depth slices (r15 of them), each a 2-D window from rcx
            depth_loop, slice_done = Label(), Label()
            MOV(rcx, rbp)
            MOV(r15, S["depth"])
            LABEL(depth_loop)
        if spec.kh:  # the whole window inside the input: straight-line code
            generic = Label()
            CMP(rbx, spec.kw)
            JNE(generic)
            CMP(r11, spec.kh)
            JNE(generic)
            MOV(r8, rcx if d3 else rbp)
            for row in range(spec.kh):
                if row:
                    ADD(r8, A("row_bytes"))
                for column in range(spec.kw):
                    combine(n, width, masked, column)
            if d3:
                ADD(rcx, A("plane_bytes"))
                asm.JMP(slice_done)
            else:
                asm.JMP(window_done)
            LABEL(generic)
        if not d3:
            MOV(rcx, rbp)
        MOV(rsi, r11)
        LABEL(h_loop)
        MOV(r8, rcx)
        w_done = Label()
        if spec.kw:  # a whole window row (away from the W borders): unrolled
            w_generic = Label()
            CMP(rbx, spec.kw)
            JNE(w_generic)
            for column in range(spec.kw):
                combine(n, width, masked, column)
            asm.JMP(w_done)
            LABEL(w_generic)
        MOV(r9, rbx)
        LABEL(w_loop)
        combine(n, width, masked)
        ADD(r8, r10)
        DEC(r9)
        JNZ(w_loop)
        LABEL(w_done)
        ADD(rcx, A("row_bytes"))
        DEC(rsi)
        JNZ(h_loop)
        if d3:
            ADD(rcx, S["plane_step"])
            LABEL(slice_done)
            DEC(r15)
            JNZ(depth_loop)
        LABEL(window_done)
        finish(n, width, masked)

    def block_loop(count_field: str, n: int) -> None:
        loop, done = Label(), Label()
        MOV(rax, A(count_field))
        TEST(rax, rax)
        JZ(done)
        LABEL(loop)
        block(n)
        ADD(rbp, n * piece_bytes)
        ADD(rdx, n * spec.piece_channels * spec.dst_size)
        DEC(rax)
        JNZ(loop)
        LABEL(done)

    # ---------------------------------------------------------------- rows and pixels
    def clamp(size: str, extent: str, first, count) -> None:
        """A window starting at rax (clobbered) along one dimension: first = max(rax, 0),
        count = min(rax + size, extent) - first, its valid positions (>= 1: the driver
        rejects windows wholly in the padding)."""
        XOR(first.as_dword, first.as_dword)
        TEST(rax, rax)
        CMOVNS(first, rax)
        ADD(rax, A(size))
        MOV(count, A(extent))
        CMP(rax, count)
        CMOVL(count, rax)
        SUB(count, first)

    row_loop, pixel_loop, same_image = Label(), Label(), Label()
    LABEL(row_loop)
    MOV(rax, S["ih_start"])
    clamp("KH", "IH", rcx, r11)      # h0, valid window rows
    IMUL(rcx, A("row_bytes"))
    MOV(r12, S["src"])
    ADD(r12, rcx)                    # first valid window row of this output row
    if d3:
        MOV(rax, S["id_start"])
        clamp("KD", "ID", rcx, rsi)  # d0, valid depth slices
        MOV(S["depth"], rsi)
        IMUL(rcx, A("plane_bytes"))
        ADD(r12, rcx)                # ... in the first valid slice
        MOV(rax, r11)
        IMUL(rax, A("row_bytes"))
        NEG(rax)
        ADD(rax, A("plane_bytes"))
        MOV(S["plane_step"], rax)    # after a slice's rows: to the next slice's first
    MOV(r13, A("OW"))
    MOV(r14, A("pad_l"))
    NEG(r14)                         # iw_start of ow = 0

    LABEL(pixel_loop)
    MOV(rax, r14)
    clamp("KW", "IW", rcx, rbx)      # w0, valid window columns
    IMUL(rcx, r10)
    LEA(rbp, [r12 + rcx * 1])        # src[h0][w0][0]
    if spec.alg == "avg_exclude_padding":
        MOV(rax, r11)
        IMUL(rax, rbx)
        if d3:
            IMUL(rax, S["depth"])
        asm.VCVTSI2SS(vdiv.as_xmm, vdiv.as_xmm, rax)
        asm.VBROADCASTSS(vdiv, vdiv.as_xmm)

    block_loop("n_big", BIG)
    block_loop("n_small", 1)
    if wide:
        no_tail = Label()
        CMP(asm.qword[A("tail")[0]], 0)
        JE(no_tail)
        block(1, masked=True)
        ADD(rdx, A("tail_dst_bytes"))
        LABEL(no_tail)
    else:
        widths = [w for w in (16, 8, 4, 2, 1) if w < spec.piece_channels]
        for w in widths:
            skip = Label()
            asm.TEST(asm.qword[A("tail")[0]], w)
            JZ(skip)
            block(1, width=w)
            ADD(rbp, w)
            ADD(rdx, w * spec.dst_size)
            LABEL(skip)

    ADD(r14, A("SW"))
    DEC(r13)
    JNZ(pixel_loop)

    def step(index: str, start: str, stride: str, count: str, pad: str, ri, rs, kept) -> None:
        """ri = index + 1 and rs = start + stride, on to ``kept``; where ri reaches
        ``count``, falls through with ri = 0 and rs = -pad (the first window again)."""
        MOV(ri, S[index])
        INC(ri)
        MOV(rs, S[start])
        ADD(rs, A(stride))
        CMP(ri, A(count))
        JNE(kept)
        XOR(ri.as_dword, ri.as_dword)
        MOV(rs, A(pad))
        NEG(rs)

    # next output row: oh + 1, or (3-D: the next output slice, od + 1, or) the next image
    step("oh", "ih_start", "SH", "OH", "pad_t", rax, rcx, same_image)
    if d3:
        same_volume = Label()
        step("od", "id_start", "SD", "OD", "pad_f", r8, r9, same_volume)
    MOV(rbx, A("img_bytes"))
    ADD(S["src"], rbx)
    if d3:
        LABEL(same_volume)
        MOV(S["od"], r8)
        MOV(S["id_start"], r9)
    LABEL(same_image)
    MOV(S["oh"], rax)
    MOV(S["ih_start"], rcx)
    DEC(asm.qword[S["rows"][0]])
    JNZ(row_loop)
    asm.RETURN()


def _load_bytes(asm, x, address, width: int) -> None:
    """Exactly ``width`` bytes at ``address`` into the low bytes of xmm ``x``."""
    if width == 16:
        asm.VMOVDQU(x, [address])
    elif width == 8:
        asm.VMOVQ(x, asm.qword[address])
    elif width == 4:
        asm.VMOVD(x, asm.dword[address])
    elif width == 2:
        asm.VPINSRW(x, x, asm.word[address], 0)
    elif width == 1:
        asm.VPINSRB(x, x, asm.byte[address], 0)
    else:  # pragma: no cover - widths come from the template
        raise ValueError(f"width {width}")


def _store_bytes(asm, address, x, width: int) -> None:
    """The low ``width`` bytes of xmm ``x`` to ``address``, nothing more."""
    if width == 16:
        asm.VMOVDQU([address], x)
    elif width == 8:
        asm.VMOVQ(asm.qword[address], x)
    elif width == 4:
        asm.VMOVD(asm.dword[address], x)
    elif width == 2:
        asm.VPEXTRW(asm.word[address], x, 0)
    elif width == 1:
        asm.VPEXTRB(asm.byte[address], x, 0)
    else:  # pragma: no cover - widths come from the template
        raise ValueError(f"width {width}")
