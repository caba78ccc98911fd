"""Int8 depthwise convolution, forward inference, NHWC (the MobileNet-v2 fast case).

``groups == IC == OC``: every channel has its own ``KH x KW`` filter::

    acc[n, c, oh, ow] = sum_{kh, kw valid} (src[n, c, oh*SH - pt + kh*DH, ow*SW - pl + kw*DW] - zp_src)
                                           * wei[c, 0, 0, kh, kw]                (int32, exact)
    dst = saturate(round(post_ops(scale_src * scale_wei[c] * acc + bias[c]) / scale_dst + zp_dst[c]))

with ``DH = dilation_h + 1`` (oneDNN's convention: dilation 0 is a dense window).
Padded positions contribute nothing: ``(zp_src - zp_src) * w = 0``. The kernel
(``jit.depthwise_kernel``) computes ``acc`` exactly on every ISA path (no VPMADDUBSW
saturation anywhere), so the overflow policies ``exact``, ``faithful`` and
``halve_weights`` all give the exact result and ``impl_info()`` says ``"exact"``; the
output pipeline is the shared one (``jit.output``), channels as its columns.

* src: logical ``(N, C, H, W)`` u8 or s8, tag ``nhwc`` (``acdb``) or ``any`` (-> nhwc).
* weights: logical ``(C, 1, 1, KH, KW)`` s8 (``goihw``; the 4-D ``(C, 1, KH, KW)`` is
  accepted too) in any plain tag, packed at every execution, or ``any``: then
  :meth:`DepthwiseConvDesc.weights_desc` is a packed layout (:class:`DwWeightsLayout`);
  fill it once with ``primitives.reorder`` and pass that memory.
* dst: ``(N, C, OH, OW)`` u8/s8/s32/f32, nhwc (or ``any``); bias ``(C,)`` f32 or s32.
* Attributes: scales src (mask 0), weights (mask 0, or one per channel: mask 1 = dim 0
  (G); mask 3 (G and OC/G = 1) is the same count and accepted; 4-D weights: mask 1),
  dst (mask 0); zero points src (mask 0, any s32 value) and dst (mask 0 or per channel,
  mask 2); post-ops eltwise, one sum, binary with an f32 operand that is one value
  ``(1,1,1,1)``, per channel ``(1,C,1,1)``, per pixel ``(N,1,OH,OW)`` or full
  ``(N,C,OH,OW)`` in nhwc.
* Threads: the ``N*OH`` output rows are split into one chunk per thread, one kernel call
  per chunk. Blocking (``jit.depthwise_kernel``): P output pixels of a row per block, P
  chosen at creation for the row's width (:func:`_choose_pixels`), the window along W
  compiled into the kernel; the row and block tables are built at creation too.
* Per call, only what changed is redone: the per-channel scale/bias/zero-point vectors
  (padded to whole vectors) are rebuilt when the bytes of the scales, bias or zero points
  differ from the previous call's (a one-entry cache of the primitive; in user
  scratchpad mode they are written into the scratchpad at every call), plain weights are
  packed when their bytes differ (and the zero-point compensation of the dot kernels
  rebuilt when the weights or the zero point differ), and each thread keeps its own
  argument structs, so a call sets the src and dst pointers and calls the kernel. A call
  with the very objects of this thread's previous call (dense arrays of the same shape,
  dtype and small arguments' bytes, dst still writable, the same packed weights) replays
  it: one generated comparison, then the kernel call (3.7 us of Python where the checks
  took 8.5 us, both measured on the loaded project VM).

Example::

    >>> import numpy as np
    >>> from primitives.memory import desc
    >>> pd = DepthwiseConvDesc(desc((1, 2, 3, 3), "u8", "nhwc"), desc((2, 1, 1, 3, 3), "s8", "goihw"),
    ...                        desc((1, 2, 1, 1), "s32", "nhwc"))
    >>> x = np.ones((1, 3, 3, 2), np.uint8); w = np.ones((2, 1, 1, 3, 3), np.int8); w[1] *= -2
    >>> y = np.zeros((1, 1, 1, 2), np.int32)
    >>> pd.create().execute({"src": x, "weights": w, "dst": y})
    >>> y.ravel().tolist()
    [9, -18]
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace

import numpy as np

from jit.depthwise_kernel import (ARGS_CDEF, DOT_LANES, MAX_COLUMNS, MAX_PIXELS, SIGNATURE, DwKernelSpec,
                                   block_columns, zp_route)
from jit.output import OutputSpec
from primitives import verbose
from primitives.attr import BIAS, DST, SCRATCHPAD, SRC, WEIGHTS, Sum, post_op_src1, scales, zero_points
from primitives.checks import check_disjoint, check_known_dims, check_no_zero_dim
from primitives.pipeline import dst_stage, output_plan
from primitives.base import Primitive, PrimitiveDesc, keyed_slot, slot_key
from primitives.memory import Memory, MemoryDesc, aligned_zeros, desc, identity_tag, packed_desc
from primitives.reference import wrap_int32
from primitives.replay import Replay, pointing, restoring
from runtime import isa as isa_mod
from runtime.ffi import declare, dense_pointer, ffi, pointer_to
from runtime.pool import CallPlan
from runtime.threads import resolve_threads, split

declare(ARGS_CDEF, (SIGNATURE, "struct i8j_dw_args *"))

_DST_TYPES = ("u8", "s8", "s32", "f32")
_NHWC = "acdb"
# Below this many multiply-adds per thread a second thread costs more than it gives. With
# the parked Python workers (a futex wake each way, 10-25 us) that was 1M: MobileNet-v2's
# 0.7-1.4M layers ran 1.3-3x slower on two threads. The spinning pool hands off in 1-4
# us: at 256K, 192@28, 576@14 and 144@56/2 (batch 1) ran 1.2-1.5x faster on two threads
# than on one. At 100K a thread (Zen 4, batch 1) the layers of 200-500K MACs gain too:
# 576@14/2 10.4 -> 8-9 us, 192@28/2 13 -> 9-10 us, 960@7 13-14 -> 10 us.
_MIN_MACS_PER_THREAD = 100_000
_INPUT, _OUTPUT, _VALUES = "input", "output", "values"  # roles of execute() arguments (see _fast_checks)


def _ints(name: str, value, minimum: int) -> tuple[int, int]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value, value)
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{name}: expected 2 integers (H, W), got {value!r}")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
            what = "positive" if minimum == 1 else "non-negative"
            raise ValueError(f"{name}: expected {what} integers, got {tuple(value)!r}")
    return int(value[0]), int(value[1])


def _lanes(isa: str) -> int:
    from jit.dot import fast_path

    return fast_path(isa).lanes


def _c_pad(c: int, lanes: int) -> int:
    return -(-c // lanes) * lanes


def pack_into(w_ck: np.ndarray, out: np.ndarray, lanes: int, dot: bool = False) -> np.ndarray:
    """Pack ``(C, taps)`` s8 weights into ``out`` (int32, one or two sections of
    ``taps*C_pad + lanes``; everything not set below is zero).

    Section 1 (every kernel but the dot ones): ``[tap][C_pad]`` lanes whose low s16 is
    the weight and high s16 zero. Section 2 (``dot``, read by the broadcast VPDPBUSD
    kernels): the same for the channels after the last whole 16, and for each whole 16
    channels (c0..c0+15) dword lane i holds the weight of channel c0 + DOT_LANES[i] in
    its byte i // 4 (see ``jit.depthwise_kernel``).
    """
    c, taps = w_ck.shape
    cp = _c_pad(c, lanes)
    section = taps * cp + lanes
    out[:] = 0
    words = out[:section].view(np.int16)[: 2 * taps * cp].reshape(taps, cp, 2)
    words[:, :c, 0] = w_ck.T
    if dot:
        second = out[section:2 * section]
        full = c // 16 * 16
        words = second.view(np.int16)[: 2 * taps * cp].reshape(taps, cp, 2)
        words[:, full:c, 0] = w_ck[full:].T
        lane = np.arange(full)
        channel = lane // 16 * 16 + np.asarray(DOT_LANES)[lane % 16]
        second.view(np.int8)[: 4 * taps * cp].reshape(taps, cp, 4)[:, lane, lane % 16 // 4] = w_ck[channel].T
    return out


@dataclass(frozen=True)
class DwWeightsLayout:
    """The packed weights layout of :class:`DepthwiseConvDesc` (a ``packed`` desc's record):
    ``[KH*KW][C_pad]`` s32 lanes (weight in the low s16, zero high s16) plus one vector of
    slack, ``C_pad`` = C rounded up to the ISA's vector lanes; with ``dot``, a second
    section of that size for the broadcast VPDPBUSD kernels (see :func:`pack_into`)."""

    isa: str
    c: int
    kh: int
    kw: int
    dot: bool = False

    @property
    def lanes(self) -> int:
        return _lanes(self.isa)

    @property
    def section(self) -> int:
        """int32 elements of one section."""
        return self.kh * self.kw * _c_pad(self.c, self.lanes) + self.lanes

    @property
    def elements(self) -> int:
        return self.section * (2 if self.dot else 1)

    @property
    def nbytes(self) -> int:
        return 4 * self.elements

    def pack(self, src_logical: np.ndarray, dst: Memory) -> None:
        """Pack logical s8 weights ``(C, 1, 1, KH, KW)`` (or ``(C, 1, KH, KW)``) into ``dst``."""
        if src_logical.dtype != np.int8:
            raise ValueError(f"weights: expected s8 values to pack, got {src_logical.dtype}")
        if src_logical.size != self.c * self.kh * self.kw:
            raise ValueError(f"weights: expected {self.c * self.kh * self.kw} values, got shape {src_logical.shape}")
        buf = dst.array.reshape(-1).view(np.uint8)[: self.nbytes].view(np.int32)
        pack_into(np.asarray(src_logical).reshape(self.c, self.kh * self.kw), buf, self.lanes, self.dot)
        dst.payload = ("dw", self, buf)


@dataclass(frozen=True)
class _Geometry:
    n: int
    c: int
    ih: int
    iw: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int  # effective: dilation + 1
    dw: int
    pt: int
    pl: int

    @property
    def macs(self) -> int:
        return self.n * self.c * self.oh * self.ow * self.kh * self.kw


def _valid_taps(o: int, stride: int, pad: int, dil: int, k: int, size: int) -> tuple[int, int]:
    """(first valid tap, number of valid taps) of output position ``o`` along one axis."""
    start = o * stride - pad
    taps = [t for t in range(k) if 0 <= start + t * dil < size]
    return (taps[0], len(taps)) if taps else (0, 0)


_OUTPUT_COST = 11  # vector instructions of a pixel's output stage (MobileNet's: scale, bias, relu, u8)
_BLOCK_COST = 8  # a block's set-up and dispatch, in the same units
_PER_PIXEL_STAGE_COST = 4  # a partial block's extra per pixel (its own stage masks, a test of n)


def _choose_pixels(g: _Geometry, widest: DwKernelSpec) -> int:
    """P, output pixels per block: the one whose blocking of a row costs the fewest vector
    instructions, counting the source loads (once per column of a block), multiply-adds,
    output stages and the partial block's extra; among the sizes that fit the registers.
    Few sizes in use (MobileNet's rows of 7 to 112 pixels get 7 or 8), so a handful of
    kernels serve every shape."""
    madd = 1 if widest.vnni else 2
    best = None
    for p in range(MAX_PIXELS, 0, -1):
        if not widest.fits(p):
            continue
        blocks, rest = -(-g.ow // p), g.ow % p
        per_row = len(block_columns(p, g.kw, g.sw, g.dw)) + p * g.kw * madd
        cost = blocks * (g.kh * per_row + _BLOCK_COST) + g.ow * _OUTPUT_COST + (rest * _PER_PIXEL_STAGE_COST)
        if p < 4 and g.ow >= 4:
            continue  # small blocks only for rows that are that short
        if best is None or cost < best[0]:
            best = (cost, p)
    if best is None:
        raise ValueError(f"the output stage needs more registers than {widest.isa} has")
    return best[1]


class DepthwiseConvDesc(PrimitiveDesc):
    """Depthwise int8 convolution (forward inference, NHWC); see the module docstring.

    ``DepthwiseConvDesc(src_md, weights_md, dst_md, bias_md=None, strides=(1, 1),
    padding_l=(0, 0), padding_r=(0, 0), dilation=(0, 0), attr=None, isa=None, threads=None)``
    """

    kind = "convolution"

    def __init__(self, src_md: MemoryDesc, weights_md: MemoryDesc, dst_md: MemoryDesc,
                 bias_md: MemoryDesc | None = None, strides=(1, 1), padding_l=(0, 0), padding_r=(0, 0),
                 dilation=(0, 0), attr=None, isa: str | None = None, threads: int | None = None):
        super().__init__(attr, isa)
        self.threads = resolve_threads(threads)
        for name, md in (("src", src_md), ("weights", weights_md), ("dst", dst_md)):
            if not isinstance(md, MemoryDesc):
                raise TypeError(f"{name}: expected a MemoryDesc, got {type(md).__name__}")
            check_known_dims(name, md)
        if bias_md is not None and not isinstance(bias_md, MemoryDesc):
            raise TypeError(f"bias: expected a MemoryDesc or None, got {type(bias_md).__name__}")
        self.isa = verbose.planned_isa(self.kind, isa)
        strides = _ints("strides", strides, 1)
        padding_l = _ints("padding_l", padding_l, 0)
        padding_r = _ints("padding_r", padding_r, 0)
        dilation = _ints("dilation", dilation, 0)
        # -- shapes
        if src_md.ndims != 4:
            raise ValueError(f"src: expected 4 dims (N, C, H, W), got {src_md.dims}")
        if src_md.dt not in ("u8", "s8"):
            raise ValueError(f"src: expected a u8 or s8 source, got {src_md.dt!r}")
        N, C, IH, IW = src_md.dims
        for name, md in (("src", src_md), ("weights", weights_md)):
            check_no_zero_dim(name, md, (), "DepthwiseConvDesc takes no 0 (ConvolutionDesc takes a batch of 0)")
        if weights_md.dt != "s8":
            raise ValueError(f"weights: expected s8 weights, got {weights_md.dt!r}")
        wd = weights_md.dims
        if weights_md.ndims == 5 and wd[:3] == (C, 1, 1):
            KH, KW = wd[3:]
        elif weights_md.ndims == 4 and wd[:2] == (C, 1):
            KH, KW = wd[2:]
        else:
            raise ValueError(f"weights: expected dims (G={C}, 1, 1, KH, KW) (or ({C}, 1, KH, KW)) for a depthwise "
                             f"convolution of {C} channels, got {wd}")
        if not (weights_md.is_any or weights_md.is_plain):
            raise ValueError(f"weights: expected a plain tag or 'any', got {weights_md}")
        geo_k = []
        outs = []
        for axis, i, k, s, pl, pr, d in (("H", IH, KH, strides[0], padding_l[0], padding_r[0], dilation[0]),
                                         ("W", IW, KW, strides[1], padding_l[1], padding_r[1], dilation[1])):
            extent = (k - 1) * (d + 1) + 1
            if extent > i + pl + pr:
                raise ValueError(f"weights: window of {extent} along {axis} (kernel {k}, dilation {d}) is larger "
                                 f"than the padded input {i} + {pl} + {pr} = {i + pl + pr}")
            outs.append((i + pl + pr - extent) // s + 1)
            geo_k.append(d + 1)
        OH, OW = outs
        if dst_md.ndims != 4 or dst_md.dims != (N, C, OH, OW):
            raise ValueError(f"dst: expected dims {(N, C, OH, OW)} (src {src_md.dims}, kernel {KH}x{KW}, strides "
                             f"{strides}, padding {padding_l}/{padding_r}, dilation {dilation}), got {dst_md.dims}")
        if dst_md.dt not in _DST_TYPES:
            raise ValueError(f"dst: expected a dst of type {', '.join(_DST_TYPES)}, got {dst_md.dt!r}")
        if src_md.is_any:
            src_md = src_md.with_tag(_NHWC)
        if dst_md.is_any:
            dst_md = dst_md.with_tag(_NHWC)
        if src_md.tag != _NHWC:
            raise ValueError(f"src: expected tag nhwc (acdb) or any, got {src_md.tag!r}; the depthwise kernel is NHWC")
        if dst_md.tag != _NHWC:
            raise ValueError(f"dst: expected tag nhwc (acdb) or any, got {dst_md.tag!r}; the depthwise kernel is NHWC")
        if bias_md is not None:
            if bias_md.dt not in ("f32", "s32"):
                raise ValueError(f"bias: expected an f32 or s32 bias, got {bias_md.dt!r}")
            if bias_md.size != C or (bias_md.ndims != 1 and bias_md.dims[-1] != C):
                raise ValueError(f"bias: expected {C} values (one per channel), got dims {bias_md.dims}")
            if bias_md.is_any:
                bias_md = bias_md.with_tag(identity_tag(bias_md.ndims))
        self.geo = _Geometry(N, C, IH, IW, OH, OW, KH, KW, strides[0], strides[1], geo_k[0], geo_k[1],
                             padding_l[0], padding_l[1])
        self.strides, self.padding_l, self.padding_r, self.dilation = strides, padding_l, padding_r, dilation
        # -- attributes
        attr = self.attr
        wmasks = (0, 1, 3) if weights_md.ndims == 5 else (0, 1)
        attr.validate({SRC: src_md, WEIGHTS: weights_md, DST: dst_md}, "depthwise convolution",
                      scales_masks={SRC: (0,), WEIGHTS: wmasks, DST: (0,)}, zero_points_args=(SRC, DST),
                      zero_points_masks={SRC: (0,), DST: (0, 2)}, max_sums=1)
        plan = output_plan(attr, dst_md, bias_md, self._broadcast, col_comp=False)  # the kernel subtracts zero points
        self.output, self._scale_kind, self._binary = plan.spec, plan.scale_kind, list(plan.binary)
        self.src_dt = src_md.dt
        self.has_src_zp = SRC in attr.zero_points
        g = self.geo
        if g.kw > MAX_COLUMNS:
            raise ValueError(f"weights: the depthwise kernel takes at most {MAX_COLUMNS} taps along W, got {g.kw}")
        isa_mod.require_path(self.isa)
        self._dot, self._pixels = self._blocking(self.isa)
        # One kernel now, so creation pays code generation (or the disk cache) once.
        self.spec = self.kernel_spec("s16" if self.has_src_zp else "none")
        self._kernel(self.spec)
        self.lanes = self.spec.lanes
        self.c_pad = _c_pad(C, self.lanes)
        self._weights_layout = DwWeightsLayout(self.isa, C, KH, KW, self._dot)
        if weights_md.is_any:
            weights_md = packed_desc(weights_md.dims, "s8", self._weights_layout, self._weights_layout.nbytes)
        self._set_desc(SRC, src_md)
        self._set_desc(WEIGHTS, weights_md)
        self._set_desc(DST, dst_md)
        self._set_desc(BIAS, bias_md)
        # Scratchpad: the per-channel vectors the output stage reads whole (padded to full vectors).
        vec_bytes = 4 * (self.c_pad + self.lanes)
        needs = [self._scale_kind != "none", bias_md is not None, self.output.dst_zp != "none"]
        self._sp = {}
        for name, need in zip(("scale", "bias", "dst_zp"), needs):
            if need:
                self._sp[name] = slice(len(self._sp) * vec_bytes, (len(self._sp) + 1) * vec_bytes)
        self.scratchpad_nbytes = len(self._sp) * vec_bytes
        if verbose.enabled("dispatch"):
            verbose.dispatch(self.kind, self.impl_name(), "chosen: groups == IC == OC, NHWC")

    def _blocking(self, isa: str) -> tuple[bool, int]:
        """(dot, pixels) of this layer's kernel on ``isa``. u8 on avx512_core_vnni: broadcast
        VPDPBUSD blocks (no widening) for the full vectors; a source zero point through the
        compensation table. (An s8 source flipped to u8 by a VPXORD per loaded vector
        measured no faster than widening it: it stays widened.) Pixels per block (P): the
        cheapest blocking of a row (see _choose_pixels); the window along W is part of the
        kernel (its column schedule), the rest are run-time sizes."""
        g = self.geo
        dot = isa == "avx512_core_vnni" and self.src_dt == "u8"
        return dot, _choose_pixels(g, DwKernelSpec(isa, self.src_dt, "none", self.output, 0, g.kw, g.sw, g.dw))

    def kernel_spec(self, zp: str, output: OutputSpec | None = None, isa: str | None = None) -> DwKernelSpec:
        """``output``: the stage to run, where not the descriptor's (``primitives.pipeline.dst_stage``);
        ``isa``: the kernel this layer would get on another path (dump-asm's, where the CPU
        lacks it: generated, never run)."""
        g = self.geo
        dot, pixels = (self._dot, self._pixels) if isa in (None, self.isa) else self._blocking(isa)
        return DwKernelSpec(isa or self.isa, self.src_dt, zp, output or self.output, pixels, g.kw, g.sw, g.dw,
                            dot=dot)

    @staticmethod
    def _kernel(spec: DwKernelSpec):
        from jit import cache
        from jit.depthwise_kernel import generate

        return cache.get_kernel(("depthwise", spec), lambda: generate(spec))

    def _broadcast(self, src1: MemoryDesc, index: int) -> str:
        g = self.geo
        if src1.dt != "f32":
            raise ValueError(f"post_ops[{index}]: binary operand of type {src1.dt!r}; the depthwise convolution "
                             "takes f32 operands")
        dims = src1.dims
        if src1.ndims == 4 and src1.is_plain:
            if dims == (1, 1, 1, 1):
                return "common"
            if dims == (1, g.c, 1, 1):
                return "col"
            if dims in ((g.n, g.c, g.oh, g.ow), (g.n, 1, g.oh, g.ow)):
                # (the kernel reads them in dst's pixel order: one per pixel, or every channel's)
                nhwc = all(a == b for a, b, d in zip(src1.strides, desc(dims, "f32", _NHWC).strides, dims) if d > 1)
                kind = "full" if dims[1] == g.c else "row"
                if nhwc:
                    return kind
                raise ValueError(f"post_ops[{index}]: a {kind} binary operand must be laid out as nhwc (acdb) like "
                                 f"dst, got tag {src1.tag!r}")
        raise ValueError(f"post_ops[{index}]: binary operand {src1} against dst {(g.n, g.c, g.oh, g.ow)}: the "
                         f"depthwise convolution takes plain 4-D f32 operands of dims (1,1,1,1), (1,{g.c},1,1), "
                         f"({g.n},1,{g.oh},{g.ow}) or ({g.n},{g.c},{g.oh},{g.ow}) (nhwc)")

    def _key_extra(self):
        return (self.strides, self.padding_l, self.padding_r, self.dilation, self.threads)

    def _impl_info(self) -> dict:
        g = self.geo
        return {"kind": self.kind, "impl": f"depthwise:{self.isa}", "isa": self.isa, "kernel": self.spec.name,
                "policy": self.attr.policy, "exact": True,
                "decision": "exact: bytes widened to s32 lanes, products by VPDPWSSD (VNNI) / VPMADDWD or, for "
                            "a source zero point outside s16 reach, VPMULLD; a u8 source on avx512_core_vnni: 16 bytes "
                            "broadcast per 128-bit lane and VPDPBUSD with one nonzero weight byte per lane (one "
                            "product each), a zero point through per-pixel-class compensation; no saturating step on any ISA, so every "
                            "overflow policy gives the exact int32 sums; blocks of pixels_per_block output "
                            "pixels share each loaded source column",
                "pixels_per_block": self.spec.pixels, "vectors_per_block": self.spec.vectors,
                "dot_blocks": self._dot, "vector_lanes": self.spec.lanes,
                "shape": {"N": g.n, "C": g.c, "IH": g.ih, "IW": g.iw, "OH": g.oh, "OW": g.ow, "KH": g.kh,
                          "KW": g.kw}, "strides": self.strides, "padding": (self.padding_l, self.padding_r),
                "dilation": self.dilation, "threads": self.threads, "output": self.output}

    def _verbose_desc(self) -> str:
        def x(v):
            return "x".join(map(str, v))

        return (f"{super()._verbose_desc()} g:{self.geo.c} kernel:{self.geo.kh}x{self.geo.kw} "
                f"strides:{x(self.strides)} pad:{x(self.padding_l)}/{x(self.padding_r)} dil:{x(self.dilation)}")

    def _create_primitive(self) -> "DepthwiseConv":
        return DepthwiseConv(self)


def _block_table(g: _Geometry, pixels: int) -> tuple[np.ndarray, int, int]:
    """The blocks of a row of ``pixels`` output pixels each: ``(table, ow_lo, ow_hi)``.

    ``table[b]`` = (column mask, pixel count) as int64: bit r of the mask is set when the
    r-th column the block reads (``block_columns``) lies inside the image and is read by
    one of the block's pixels; interior blocks (every pixel, every column inside) start
    at ow in ``[ow_lo, ow_hi)``, which the kernel checks without reading the table.
    """
    cols = block_columns(pixels, g.kw, g.sw, g.dw)
    first_reader = [min(p for p in range(pixels) for k in range(g.kw) if p * g.sw + k * g.dw == j) for j in cols]
    full = (1 << len(cols)) - 1
    blocks = -(-g.ow // pixels)
    table = np.zeros((blocks, 2), np.uint64)
    interior = []
    for b in range(blocks):
        ow0 = b * pixels
        n = min(pixels, g.ow - ow0)
        mask = 0
        for r, j in enumerate(cols):
            if 0 <= ow0 * g.sw - g.pl + j < g.iw and first_reader[r] < n:
                mask |= 1 << r
        table[b] = (mask, n)
        if n == pixels and mask == full:
            interior.append(ow0)
    ow_lo, ow_hi = (interior[0], interior[-1] + 1) if interior else (g.ow + 1, 0)
    return table.view(np.int64), ow_lo, ow_hi


@dataclass(frozen=True)
class _Params:
    """What a call's argument values make of the per-call fields: built when those values
    change, shared by every call (and thread) that brings the same values again."""

    key: tuple  # the bytes of the scales, bias and zero points it was built from
    arrays: tuple  # the vectors the pointers point into (kept alive here)
    scale: object
    bias: object
    dst_zp: object
    dst_scale_inv: float
    zp: int
    function: object  # the kernel of the zero point's route
    wei_offset: int  # bytes from the packed weights to the section that kernel reads
    comp_k: int | None  # dot kernels with compensation: its factor (the zero point); else None


class DepthwiseConv(Primitive):
    """The depthwise convolution primitive: ``execute({"src", "weights", "dst", ...})``."""

    def __init__(self, pd: DepthwiseConvDesc):
        super().__init__(pd)
        self._kernels = {(pd.spec.zp, pd.output): pd._kernel(pd.spec)}
        g = pd.geo
        cp = pd.c_pad
        P = pd.spec.pixels
        w_tap = 4 * cp
        # Compensation classes (dot kernels with a source zero point): the valid
        # kh range of a row and the valid kw range of a column; comp[row class][col class]
        # is a C_pad vector (see _comp_table).
        rows = [_valid_taps(oh, g.sh, g.pt, g.dh, g.kh, g.ih) for oh in range(g.oh)]
        cols = [_valid_taps(ow, g.sw, g.pl, g.dw, g.kw, g.iw) for ow in range(g.ow)]
        self._row_classes, self._col_classes = sorted(set(rows)), sorted(set(cols))
        row_class = {r: i for i, r in enumerate(self._row_classes)}
        col_class = {c: i for i, c in enumerate(self._col_classes)}
        htab = np.zeros((g.oh, 4), np.int64)
        for oh, (k0, kn) in enumerate(rows):
            # src of the row's first valid kh at column -pad_l: the kernel adds ow0*SW*C
            htab[oh] = (((oh * g.sh - g.pt + k0 * g.dh) * g.iw - g.pl) * g.c if kn else 0, k0 * g.kw * w_tap, kn,
                        row_class[k0, kn] * len(self._col_classes) * w_tap)
        btab, ow_lo, ow_hi = _block_table(g, P)
        ccol = np.zeros(-(-g.ow // P) * P, np.int64)  # whole blocks: a partial block's missing pixels read 0
        ccol[:g.ow] = [col_class[c] * w_tap for c in cols]
        self._tables = (htab, btab, ccol)
        self._comp = None  # (packed weights, K, table): the last compensation table
        # 64-byte aligned, as every vector the kernel reads whole: a zmm load across two cache lines
        # costs two (the weights, the output stage's per-channel vectors)
        self._w_cache = None
        self._w_payload_seen = None
        self._params = None
        self._user = pd.attr.scratchpad_mode == "user"
        wmd = pd.weights_desc()
        self._w_inverse = None  # plain weights in a tag other than goihw: the axes back to logical order
        if not wmd.is_packed:
            inverse = tuple(int(i) for i in np.argsort(wmd.perm))
            self._w_inverse = None if inverse == tuple(range(len(inverse))) else inverse
        self._checks = self._fast_checks()
        self._param_names = tuple(name for name, _, _, role, _ in self._checks if role is _VALUES)
        dst_bytes = pd.dst_desc().itemsize
        rows = g.n * g.oh
        threads = max(1, min(pd.threads, rows, g.macs // _MIN_MACS_PER_THREAD))
        full = g.c // pd.lanes * pd.lanes
        self._chunks = []
        for begin, end in split(rows, threads):
            s = ffi.new("struct i8j_dw_args *")
            n0, oh0 = divmod(begin, g.oh)
            s.htab, s.btab, s.ccol = pointer_to(htab), pointer_to(btab), pointer_to(ccol)
            s.rows0, s.oh0, s.pix0 = end - begin, oh0, begin * g.ow
            s.OH, s.OW, s.img_bytes, s.C, s.C3 = g.oh, g.ow, g.ih * g.iw * g.c, g.c, 3 * g.c
            s.full_bytes = 4 * full
            s.tail, s.tail_mask = g.c - full, (1 << (g.c - full)) - 1
            s.src_px, s.src_dh = g.sw * g.c, g.dh * g.iw * g.c
            s.w_tap, s.w_tap3, s.w_kh = w_tap, 3 * w_tap, g.kw * w_tap
            s.dst_px, s.row_dst = g.c * dst_bytes, g.ow * g.c * dst_bytes
            s.ow_lo, s.ow_hi = ow_lo, ow_hi
            s.dst_scale_inv = 1.0
            for i, e in enumerate(pd.attr.post_ops):
                s.po_scale[i] = e.scale if isinstance(e, Sum) else 1.0
                s.po_zp[i] = float(e.zero_point) if isinstance(e, Sum) else 0.0
                s.po_ld[i] = 4 * g.c
            self._chunks.append((bytes(ffi.buffer(s)), n0 * g.ih * g.iw * g.c, begin * g.ow * g.c * dst_bytes,
                                 begin * g.ow))

        # What a replay of a repeated call compares by value (see execute): the small
        # arguments copied into vectors, and plain weights (packed here from their bytes).
        self._by_value = frozenset(name for name, _, _, role, packed in self._checks
                                   if packed is None and (role is _VALUES or name == WEIGHTS))

    def impl_info(self) -> dict:
        return self.pd.impl_info()

    def _kernel(self, route: str, output: OutputSpec):
        kernel = self._kernels.get((route, output))
        if kernel is None:
            kernel = self._kernels[route, output] = self.pd._kernel(self.pd.kernel_spec(route, output))
        return kernel

    # -- execution ----------------------------------------------------------------------
    def execute(self, args) -> None:
        """Run the convolution on ``args``.

        Three routes, cheapest first: the same objects as this argument set's last call on
        this thread (a :class:`~primitives.replay.Replay`: identity, shape, dtype, the small
        arguments' bytes, then the kernel call alone); dense ndarrays (and the packed
        weights Memory) of exactly the descriptor's shapes (and a user scratchpad, in that
        mode), checked here in fewer steps than :meth:`Primitive.execute`; anything else,
        or verbose mode, through :meth:`Primitive.execute`. Each argument set (its packed
        weights, as :func:`~primitives.base.slot_key` tells them apart) has its own
        structs and replay, so layers of one shape, which share this primitive, replay in
        turn; a call with new arrays laid out alike moves it (Replay.moves)."""
        quiet, last = verbose.exec_quiet(), None
        if type(args) is dict and quiet:
            # The replay of this thread's last argument set first, before finding its set's
            # (a network calls a layer with one set; 576@14/2 with new arrays: -0.4 us a call).
            last = getattr(self._local, "cur", None)
            replay = last.replay if last is not None else None
            if replay is not None and (replay.matches(args) or replay.moves(args)):  # (moves: new arrays)
                replay.run()
                return
        local = self._set_local(args if type(args) is dict else None)
        replay = local.replay
        if replay is not None and type(args) is dict and quiet and local is not last \
                and (replay.matches(args) or replay.moves(args)):
            replay.run()
            return
        local.replay = None
        checks = self._checks
        if type(args) is dict and len(args) == len(checks) + self._user and (not self._user or SCRATCHPAD in args) \
                and quiet:
            key = []  # the bytes of the scales, zero points and bias, in _param_names order
            for name, shape, dtype, role, packed in checks:
                value = args.get(name)
                if type(value) is np.ndarray:
                    # `is`: native dtypes are singletons; any other spelling takes the generic path
                    if value.shape != shape or value.dtype is not dtype:
                        break
                    if role is _VALUES:
                        key.append(value.tobytes())
                    elif not value.flags.c_contiguous or (role is _OUTPUT and not value.flags.writeable):
                        break
                elif packed is None or type(value) is not Memory or (value.desc is not packed
                                                                     and value.desc != packed):
                    break
            else:
                # (a user scratchpad, checked as Primitive.execute checks it: the per-channel
                # vectors go there, and the replay writes them back before each run)
                scratchpad = self._scratchpad(args, self._spec()) if self._user else None
                check_disjoint({k: v for k, v in args.items() if k != SCRATCHPAD}, (DST,), self.pd.kind,
                               args.get(SCRATCHPAD))
                if self._run(args, scratchpad, tuple(key)):
                    self._remember_run(args, scratchpad)
                    return
        super().execute(args)

    def _set_local(self, args: dict | None) -> SimpleNamespace:
        """This thread's state for ``args``' argument set (None: the checked path's own),
        made the current one for ``_run``: its structs, what they point at, its call plan
        and its replay. At most ``_SLOTS`` sets a thread; a new one retires the oldest."""
        local = self._local
        sets = getattr(local, "sets", None)
        if sets is None:
            sets = local.sets = {}
        local.cur = keyed_slot(sets, "checked" if args is None else slot_key(args),
                               lambda: SimpleNamespace(replay=None, structs=None, held=None, calls=None))
        return local.cur

    def _remember_run(self, args: dict, scratchpad: np.ndarray | None = None) -> None:
        """The replay of this fast-path call: the kernel on this thread's structs, which
        ``_run`` just pointed at these arrays and at the vectors made of these values
        (``local.held`` keeps those alive; on a user ``scratchpad``, which the replay
        writes back first: :func:`~primitives.replay.restoring`)."""
        local = self._local.cur
        function, structs = local.held[0].function, local.structs
        run = partial(function, structs[0]) if len(structs) == 1 else self._call_plan(function, structs).run
        move = lambda arrays: self._point(structs, arrays)  # noqa: E731
        if not self.pd._binary:  # (src and dst alone: a guard may move it)
            move = pointing(move, [(s, field, base, offset)
                                   for s, (_, src_off, dst_off, _pix0) in zip(structs, self._chunks)
                                   for field, base, offset in (("src0", 0, src_off), ("dst0", 1, dst_off))],
                            (SRC, DST))
        replay = Replay(run, move=move)
        if replay.remember(args, self._by_value, (DST,)):
            local.replay = replay if scratchpad is None else restoring(replay, scratchpad)

    def _fast_checks(self) -> tuple:
        """(name, physical shape, dtype, role, packed desc or None) of every argument the fast
        path takes; role: _VALUES (scales, zero points, bias: copied into the kernel's
        vectors, so any strides do), _INPUT or _OUTPUT (read or written in place by the
        kernel: contiguous, and writable for the output)."""
        pd = self.pd
        out = []
        for name in pd.exec_arg_names():
            md = pd.query(name)
            kind = name.partition(":")[0]
            if kind in ("scales", "zero_points"):
                dtype = np.dtype(np.float32 if kind == "scales" else np.int32)
                out.append((name, (md.dims[0],), dtype, _VALUES, None))
            elif md.is_packed:
                out.append((name, None, None, _INPUT, md))
            else:
                role = _VALUES if name == BIAS else _OUTPUT if name == DST else _INPUT
                out.append((name, md.physical_shape, np.dtype(md.numpy_dtype), role, None))
        return tuple(out)

    def _execute(self, mem: dict, scratchpad) -> None:
        self._set_local(None)
        self._run({name: (m if name == WEIGHTS else m.array) for name, m in mem.items()},
                  scratchpad if self._user else None)

    def _packed_weights(self, w) -> np.ndarray:
        """The packed weights of ``w``: a packed Memory's payload (a reorder wrote it), or
        plain weights packed here, from a one-entry cache while the same bytes come back."""
        pd = self.pd
        seen = self._w_payload_seen
        if type(w) is Memory and seen is not None and w.payload is seen:  # checked at an earlier call
            return seen[2]
        if isinstance(w, Memory) and w.desc.is_packed:
            payload = w.payload
            if not (type(payload) is tuple and len(payload) == 3 and payload[0] == "dw"
                    and (payload[1] is pd._weights_layout or payload[1] == pd._weights_layout)):
                raise ValueError("weights: this packed memory was not filled by a reorder into the layout "
                                 "weights_desc() asked for")
            self._w_payload_seen = payload  # a reorder into the memory again replaces the tuple
            return payload[2]
        if isinstance(w, Memory):
            logical = w.logical()
        else:
            logical = w if self._w_inverse is None else np.transpose(w, self._w_inverse)
        raw = logical.tobytes()
        cached = self._w_cache  # (bytes, packed): replaced whole, so concurrent readers see one pair
        if cached is not None and cached[0] == raw:
            return cached[1]
        g = pd.geo
        layout = pd._weights_layout
        packed = pack_into(np.frombuffer(raw, np.int8).reshape(g.c, g.kh * g.kw),
                           aligned_zeros(layout.elements, np.int32), pd.lanes, layout.dot)
        self._w_cache = (raw, packed)
        return packed

    def _prepare(self, a: dict, scratchpad, key: tuple | None = None) -> _Params | None:
        """The per-call values as the kernel reads them: the per-channel vectors (scale =
        src scale * weight scales, bias, dst zero points; padded to whole vectors), the dst
        scale's inverse, the source zero point and its kernel. From a one-entry cache while
        the same values come back (library scratchpad mode); None where a scale is not
        finite (the generic path then says which). ``key``: those values' bytes, where the
        caller has them already."""
        if key is None:
            key = tuple([a[name].tobytes() for name in self._param_names])
        params = self._params  # replaced whole, so concurrent readers see one entry
        if scratchpad is None and params is not None and params.key == key:
            return params
        pd = self.pd
        C = pd.geo.c
        vec_elems = pd.c_pad + pd.lanes
        ss, ws, ds = a.get(scales(SRC)), a.get(scales(WEIGHTS)), a.get(scales(DST))
        for values in (ss, ws, ds):
            if values is not None and not np.isfinite(values).all():
                return None

        def vector(name: str) -> np.ndarray:
            if scratchpad is not None:
                return scratchpad[pd._sp[name]].view(np.float32)
            return aligned_zeros(vec_elems, np.float32)

        arrays = []
        scale_p = bias_p = dst_zp_p = ffi.NULL
        if pd._scale_kind != "none":
            vec = vector("scale")
            s = np.float32(1) if ss is None else ss[0]
            if ws is None:
                vec[0] = s
            else:
                np.multiply(ws, s, out=vec[:ws.size])
            arrays.append(vec)
            scale_p = pointer_to(vec)
        if BIAS in a:
            vec = vector("bias")
            vec[:C] = a[BIAS].reshape(-1)
            arrays.append(vec)
            bias_p = pointer_to(vec)
        if pd.output.dst_zp != "none":
            vec = vector("dst_zp")
            zp = a[zero_points(DST)]
            vec[:zp.size] = zp
            arrays.append(vec)
            dst_zp_p = pointer_to(vec)
        zp_src = int(a[zero_points(SRC)][0]) if pd.has_src_zp else 0
        route = zp_route(pd.src_dt, zp_src) if zp_src else "none"
        dst_scale, output = dst_stage(pd.output, ds, a.get(zero_points(DST)))
        kernel = self._kernel(route, output)
        spec = pd.kernel_spec(route, output)
        wei_offset = 4 * pd._weights_layout.section if spec.dot else 0
        comp_k = zp_src if spec.comp else None
        params = _Params(key, tuple(arrays), scale_p, bias_p, dst_zp_p,
                         dst_scale, zp_src, kernel.function, wei_offset,
                         comp_k)
        if scratchpad is None:
            self._params = params
        return params

    def _comp_table(self, wpacked: np.ndarray, k: int) -> np.ndarray:
        """The dot kernels' compensation for packed weights ``wpacked`` and factor ``k`` (the
        source zero point): ``[row class][col class][C_pad]`` int32, ``-k * (sum of the weights of
        the class's valid taps)`` wrapped to int32, whole 16-channel vectors in the dot lane
        order (``DOT_LANES``; the channel tail is widened, it reads none). A one-entry cache:
        the same weights and factor come back call after call."""
        cached = self._comp  # replaced whole, so concurrent readers see one entry
        if cached is not None and cached[0] is wpacked and cached[1] == k:
            return cached[2]
        pd = self.pd
        g, cp = pd.geo, pd.c_pad
        w = wpacked[:g.kh * g.kw * cp].view(np.int16)[0::2].reshape(g.kh, g.kw, cp).astype(np.int64)
        # prefix sums over kh and kw: the sum over a rectangle of taps in four look-ups
        pre = np.zeros((g.kh + 1, g.kw + 1, cp), np.int64)
        pre[1:, 1:] = w.cumsum(0).cumsum(1)
        table = aligned_zeros((len(self._row_classes), len(self._col_classes), cp), np.int32)
        full = g.c // 16 * 16
        perm = (np.arange(full) // 16 * 16 + np.asarray(DOT_LANES)[np.arange(full) % 16])
        for i, (k0, kn) in enumerate(self._row_classes):
            for j, (j0, jn) in enumerate(self._col_classes):
                total = pre[k0 + kn, j0 + jn] - pre[k0, j0 + jn] - pre[k0 + kn, j0] + pre[k0, j0]
                table[i, j, :full] = wrap_int32(-k * total[perm])
        self._comp = (wpacked, k, table)
        return table

    def _structs(self) -> list:
        """This thread's argument structs, one per chunk (the kernel writes its row state
        into them, so concurrent calls must not share them)."""
        local = self._local.cur
        structs = local.structs
        if structs is None:
            structs = []
            for template, *_ in self._chunks:
                s = ffi.new("struct i8j_dw_args *")
                ffi.memmove(s, template, len(template))
                structs.append(s)
            local.structs = structs
            local.held = local.calls = None
        return structs

    def _call_plan(self, function, structs: list) -> CallPlan:
        """This thread's chunks as one pool run of ``function`` (kept while the kernel,
        which depends on the zero point's route, stays the same)."""
        local = self._local.cur
        cached = local.calls
        if cached is None or cached[0] is not function:
            cached = local.calls = (function, CallPlan([[(function, s)] for s in structs]))
        return cached[1]

    def _run(self, a: dict, scratchpad, key: tuple | None = None) -> bool:
        """Run the kernel over ``a`` (name -> ndarray, weights also a packed Memory);
        False, before running anything, where ``_prepare`` refuses the values."""
        src, dst = a[SRC], a[DST]  # (apart: checked by execute, and by its fast path)
        params = self._prepare(a, scratchpad, key)
        if params is None:
            return False
        wpacked = self._packed_weights(a[WEIGHTS])
        local = self._local.cur
        structs = local.structs or self._structs()
        held = local.held
        if held is None or held[0] is not params or held[1] is not wpacked:
            w_ptr = pointer_to(wpacked) + params.wei_offset
            comp = None if params.comp_k is None else self._comp_table(wpacked, params.comp_k)
            comp_ptr = ffi.NULL if comp is None else pointer_to(comp)
            for s in structs:
                s.wei, s.scale, s.bias, s.dst_zp = w_ptr, params.scale, params.bias, params.dst_zp
                s.dst_scale_inv, s.zp, s.comp = params.dst_scale_inv, params.zp, comp_ptr
            local.held = (params, wpacked, comp)  # also keeps what the structs point to alive
        if len(structs) == 1 and not self.pd._binary:  # the common case, in fewest steps
            s = structs[0]
            # src and dst are dense (the descriptors' nhwc): cffi's buffer route always takes them
            s.src0, s.dst0 = dense_pointer(src), dense_pointer(dst)
            params.function(s)
            return True
        self._point(structs, a)
        self._call_plan(params.function, structs).run()
        return True

    def _point(self, structs: list, a: dict) -> None:
        """The structs at the arrays of ``a`` (name -> ndarray): src, dst and the binary
        operands, whose base every chunk takes (the output stage adds the pixel's index,
        which counts from the chunk's pix0 already: an offset here would count it twice)."""
        src_ptr, dst_ptr = dense_pointer(a[SRC]), dense_pointer(a[DST])
        binaries = [(i, pointer_to(a[post_op_src1(i)])) for i, _ in self.pd._binary]
        for s, (_, src_off, dst_off, _pix0) in zip(structs, self._chunks):
            s.src0, s.dst0 = src_ptr + src_off, dst_ptr + dst_off
            for i, base in binaries:
                s.po_src[i] = base


def depthwise_conv_desc(*args, **kwargs) -> DepthwiseConvDesc:
    """Function form of :class:`DepthwiseConvDesc`."""
    return DepthwiseConvDesc(*args, **kwargs)


__all__ = ["DepthwiseConvDesc", "DepthwiseConv", "DwWeightsLayout", "depthwise_conv_desc", "pack_into"]
