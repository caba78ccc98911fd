"""Int8 pooling, forward inference: max and average over 1-D, 2-D or 3-D windows.

Semantics (``primitives.pooling_ref`` is the bit-exact numpy model):

* ``max``: the largest source value of the window, directly on u8/s8 (VPMAXUB /
  VPMAXSB); padding is -inf, i.e. ignored. dst type = src type.
* ``avg_include_padding``: ``sum / (KD*KH*KW)``; ``avg_exclude_padding``:
  ``sum / (number of valid input positions in the window)``. The sum is exact s32 (a
  window of more u8 pixels than 8,421,504, or s8 ones than 16,777,216, is refused), the
  division is f32 (``f32(sum) / f32(divisor)``, one IEEE rounding), the result rounds to
  nearest even (VCVTPS2DQ) and saturates to the destination: dst u8/s8 = src type, or
  s32 (the rounded average) or f32 (the quotient itself).

Every output window must overlap the input (``padding_l < kernel`` and the last window
must start inside the input): a window made only of padding has no maximum and no
exclude-padding divisor, so such a descriptor is rejected.

Layouts: NDHWC / NHWC / NWC (``acdeb`` / ``acdb`` / ``acb``) run the kernel directly:
channels are the vector dimension, with masked (AVX-512) or exact-width (AVX2) tails.
NCDHW / NCHW / NCW (``abcde`` / ``abcd`` / ``abc``) run the same kernel through the
driver: with fewer than
``NCHW_TRANSPOSE_MIN_C`` channels the tensor is read as ``N*C`` images of one channel
(no copy, no vectorisation over channels); otherwise the driver transposes the source to
NHWC, pools, and transposes the result into dst (two copies). src and dst share a layout.

3-D windows run a kernel with a depth loop around the window rows (``d3``), whose rows
are ``(n, od, oh)``; a window one slice deep with stride 1 and no depth padding is a 2-D
problem of ``N*D`` images, run by the 2-D kernel.

Threads: the ``N*OH`` (``N*OD*OH``) output rows are split into one chunk per thread, one
kernel call per chunk; the kernel holds the whole loop nest of its chunk. Kernels are
cached by (ISA, algorithm, source type, destination type, 2-D or 3-D, and window sizes
of 2 or 3, which are unrolled) only: every size is a run-time value.

Example::

    >>> import numpy as np
    >>> x = np.arange(16, dtype=np.uint8).reshape(1, 4, 4, 1)            # NHWC
    >>> pool2d(x, 2, alg="max")[0, :, :, 0].tolist()
    [[5, 7], [13, 15]]
    >>> pool2d(x, 2, alg="avg_include_padding")[0, :, :, 0].tolist()     # 2.5 -> 2, 4.5 -> 4
    [[2, 4], [10, 12]]

A 3-D window through the descriptor (NDHWC: dims are given as N, C, D, H, W)::

    >>> v = np.arange(27, dtype=np.uint8).reshape(1, 3, 3, 3, 1)         # D, H, W = 3
    >>> pd = PoolingDesc("max", desc((1, 1, 3, 3, 3), "u8", "ndhwc"), desc((1, 1, 2, 2, 2), "u8", "any"),
    ...                  strides=2, kernel=2, padding_l=0, padding_r=1)
    >>> y = np.zeros((1, 2, 2, 2, 1), np.uint8)
    >>> pd.create().execute({"src": v, "dst": y})
    >>> y[0, :, :, :, 0].tolist()
    [[[13, 14], [16, 17]], [[22, 23], [25, 26]]]
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from jit.dot import fast_path
from jit.pooling_kernel import ARGS_CDEF, S16_WINDOW, SIGNATURE, UNROLLED, PoolKernelSpec
from primitives import verbose
from primitives.attr import Attr
from primitives.base import Primitive, PrimitiveDesc, in_force, kept_setup
from primitives.checks import check_known_dims, check_no_zero_dim
from primitives.memory import MemoryDesc, desc
from primitives.replay import Replay, pointing
from runtime import isa as isa_mod
from runtime.ffi import declare, ffi, pointer_to
from runtime.pool import CallPlan
from runtime.threads import resolve_threads, split

declare(ARGS_CDEF, (SIGNATURE, "struct i8j_pool_args *"))

ALGS = ("max", "avg_include_padding", "avg_exclude_padding")
_ALG_ALIASES = {
    "pooling_max": "max",
    "pooling_avg_include_padding": "avg_include_padding",
    "pooling_avg_exclude_padding": "avg_exclude_padding",
}
SRC = "src"
DST = "dst"
CHANNELS_LAST = {3: "acb", 4: "acdb", 5: "acdeb"}
CHANNELS_FIRST = {3: "abc", 4: "abcd", 5: "abcde"}
NCHW_TRANSPOSE_MIN_C = 8
_MIN_BYTES_PER_THREAD = 64 * 1024  # output+input bytes below which one more thread costs more than it gives


def check_alg(alg) -> str:
    if isinstance(alg, str):
        a = _ALG_ALIASES.get(alg.strip().lower(), alg.strip().lower())
        if a in ALGS:
            return a
    raise ValueError(f"alg: expected one of {', '.join(ALGS)}, got {alg!r}")


def _ints(name: str, value, count: int, minimum: int) -> tuple[int, ...]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value,) * count
    if not isinstance(value, (tuple, list)) or len(value) != count:
        raise ValueError(f"{name}: expected {count} integer(s), one per spatial dimension, got {value!r}")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
            what = "positive" if minimum == 1 else "non-negative"
            raise ValueError(f"{name}: expected {what} integers, got {tuple(value)!r}")
        out.append(int(v))
    return tuple(out)


def _as_desc(name: str, md) -> MemoryDesc:
    if isinstance(md, (tuple, list)) and len(md) in (2, 3):
        try:
            md = desc(*md)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name}: {exc}") from None
    if isinstance(md, MemoryDesc):
        check_known_dims(name, md)
        return md
    raise TypeError(f"{name}: expected a MemoryDesc (primitives.memory.desc) or (dims, dt, tag), "
                    f"got {type(md).__name__}")


def _check_attr(attr) -> None:
    if attr is None:
        return
    for field in ("scales", "zero_points"):
        if getattr(attr, field, None):
            raise ValueError(f"attr: pooling takes no {field.replace('_', ' ')}; got {getattr(attr, field)!r}")
    post_ops = getattr(attr, "post_ops", None)
    if post_ops is not None and len(getattr(post_ops, "entries", post_ops) or ()):
        raise ValueError("attr: pooling takes no post-ops")


@dataclass(frozen=True)
class _Geometry:
    """Every problem in 3-D form: 1-D and 2-D have depth 1 (and height 1), and a 3-D
    window of one slice, stride 1 and no depth padding is folded into the batch."""

    n: int
    c: int
    id: int
    ih: int
    iw: int
    od: int
    oh: int
    ow: int
    kd: int
    kh: int
    kw: int
    sd: int
    sh: int
    sw: int
    pf: int
    pt: int
    pl: int

    @property
    def d3(self) -> bool:
        """Whether the kernel needs its depth loop."""
        return (self.kd, self.sd, self.pf, self.id) != (1, 1, 0, 1)


def kernel_spec(isa: str, alg: str, src_dt: str, dst_dt: str, kh: int, kw: int,
                kd: int | None = None) -> PoolKernelSpec:
    """The kernel a ``kh`` x ``kw`` window (``kd`` slices deep: a 3-D kernel) gets on
    ``isa``: window rows of 2 or 3 unrolled (whole slices of windows too where the height
    is 2 or 3 as well), and s16 sums for averages of windows small enough on AVX-512
    (``jit.pooling_kernel.S16_WINDOW``)."""
    unrolled_w = kw if kw in UNROLLED else 0
    unrolled_h = kh if unrolled_w and kh in UNROLLED else 0
    pixels = kh * kw * (kd or 1)
    s16 = alg != "max" and fast_path(isa).bits == 512 and pixels <= S16_WINDOW[src_dt]
    return PoolKernelSpec(isa, alg, src_dt, dst_dt, kw=unrolled_w, kh=unrolled_h, s16_sums=s16, d3=kd is not None)


def pooled_dims(spatial, kernel, strides, padding_l, padding_r) -> tuple[int, ...]:
    """The output's spatial dims; a ValueError naming the argument where a window would
    not fit the padded input, or would lie wholly in the padding.

    >>> pooled_dims((112, 112), (3, 3), (2, 2), (1, 1), (1, 1))
    (56, 56)
    """
    names = ("D", "H", "W")[-len(spatial):]
    outs = []
    for d, (i, k, s, pl, pr) in enumerate(zip(spatial, kernel, strides, padding_l, padding_r)):
        if k > i + pl + pr:
            raise ValueError(f"kernel: window {k} along {names[d]} is larger than the padded input "
                             f"{i} + {pl} + {pr} = {i + pl + pr}")
        if pl >= k:
            raise ValueError(f"padding_l: {pl} along {names[d]} is not smaller than the kernel {k}; "
                             "the first window would lie entirely in the padding")
        o = (i + pl + pr - k) // s + 1
        if (o - 1) * s - pl >= i:
            raise ValueError(f"padding_r: {pr} along {names[d]} makes the last window (start "
                             f"{(o - 1) * s - pl}) lie entirely in the padding of an input of {i}")
        outs.append(o)
    return tuple(outs)


class PoolingDesc(PrimitiveDesc):
    """A validated pooling problem: ``PoolingDesc(alg, src_desc, dst_desc, strides, kernel,
    padding_l, padding_r, attr=None, isa=None)``; ``.create()`` gives the primitive.

    ``src_desc``/``dst_desc``: :class:`primitives.memory.MemoryDesc` (or ``(dims, dt, tag)``)
    with logical dims ``(N, C, W)``, ``(N, C, H, W)`` or ``(N, C, D, H, W)`` and tags
    ``nwc``/``nhwc``/``ndhwc`` or ``ncw``/``nchw``/``ncdhw``; dst's tag may be ``any``
    (it then follows src). ``strides``,
    ``kernel``, ``padding_l``, ``padding_r``: one integer per spatial dimension (or one
    integer for all). ``isa``: a cap on the ISA ladder (default: the process's).
    """

    kind = "pooling"

    def __init__(self, alg, src_desc, dst_desc, strides, kernel, padding_l, padding_r, attr=None,
                 isa: str | None = None, threads: int | None = None):
        if attr is not None and not isinstance(attr, Attr):
            raise TypeError(f"attr: expected a primitives.attr.Attr or None, got {type(attr).__name__}")
        self.alg = check_alg(alg)
        src = _as_desc("src_desc", src_desc)
        dst = _as_desc("dst_desc", dst_desc)
        if src.ndims not in (3, 4, 5):
            raise ValueError(f"src_desc: expected 3 (N, C, W), 4 (N, C, H, W) or 5 (N, C, D, H, W) dims, "
                             f"got {src.dims}")
        if src.dt not in ("u8", "s8"):
            raise ValueError(f"src_desc: data type must be u8 or s8, got {src.dt!r}")
        nd = src.ndims - 2
        if src.tag == "any":
            raise ValueError("src_desc: tag 'any' is not accepted for a source; use nhwc/nchw (nwc/ncw, "
                             "ndhwc/ncdhw)")
        if src.tag not in (CHANNELS_LAST[src.ndims], CHANNELS_FIRST[src.ndims]):
            raise ValueError(f"src_desc: tag {src.tag!r} is not supported; expected "
                             f"{CHANNELS_LAST[src.ndims]!r} (channels last) or {CHANNELS_FIRST[src.ndims]!r}")
        check_no_zero_dim("src_desc", src, (0, 1), "pooling takes a 0 only in the batch and the channels")
        kernel = _ints("kernel", kernel, nd, 1)
        strides = _ints("strides", strides, nd, 1)
        padding_l = _ints("padding_l", padding_l, nd, 0)
        padding_r = _ints("padding_r", padding_r, nd, 0)
        spatial = src.dims[2:]
        outs = pooled_dims(spatial, kernel, strides, padding_l, padding_r)
        want_dims = src.dims[:2] + outs
        if dst.dims != want_dims:
            raise ValueError(f"dst_desc: dims {dst.dims} do not match the pooled shape {want_dims} "
                             f"(src {src.dims}, kernel {kernel}, strides {strides}, padding {padding_l}/{padding_r})")
        # (the sum is exact s32: it must not wrap; s8 down to -128 * 2^24 = -2^31)
        pixels, most = math.prod(kernel), (2 ** 31 - 1) // 255 if src.dt == "u8" else 2 ** 31 // 128
        if self.alg != "max" and pixels > most:
            raise ValueError(f"kernel: an average over {pixels} pixels of {src.dt} can leave s32, where its sum "
                             f"is kept; at most {most} pixels")
        allowed = (src.dt,) if self.alg == "max" else (src.dt, "s32", "f32")
        if dst.dt not in allowed:
            raise ValueError(f"dst_desc: {self.alg} pooling of {src.dt} writes {' or '.join(allowed)}, got {dst.dt!r}")
        if dst.tag == "any":
            dst = dst.with_tag(src.tag)
        elif dst.tag != src.tag:
            raise ValueError(f"dst_desc: tag {dst.tag!r} differs from src's {src.tag!r}; pooling keeps the layout")
        _check_attr(attr)
        super().__init__(attr, verbose.planned_isa(self.kind, isa))
        self.threads = resolve_threads(threads)
        self._src, self._dst = src, dst
        self._set_desc(SRC, src)
        self._set_desc(DST, dst)
        self.kernel, self.strides, self.padding_l, self.padding_r = kernel, strides, padding_l, padding_r
        self.channels_last = src.tag == CHANNELS_LAST[src.ndims]
        def dhw(values, fill):  # (D, H, W): 1-D and 2-D problems are one slice (one row) deep
            return (fill,) * (3 - nd) + tuple(values)

        (i_d, ih, iw), (od, oh, ow), (kd, kh, kw) = dhw(spatial, 1), dhw(outs, 1), dhw(kernel, 1)
        (sd, sh, sw), (pf, pt, pl) = dhw(strides, 1), dhw(padding_l, 0)
        n = src.dims[0]
        if (kd, sd, pf) == (1, 1, 0):  # each output slice pools one input slice: N*D 2-D images
            n, i_d, od = n * i_d, 1, 1
        self._geo = _Geometry(n=n, c=src.dims[1], id=i_d, ih=ih, iw=iw, od=od, oh=oh, ow=ow, kd=kd, kh=kh, kw=kw,
                              sd=sd, sh=sh, sw=sw, pf=pf, pt=pt, pl=pl)
        self.spec = kernel_spec(self.isa, self.alg, src.dt, dst.dt, kh, kw, kd if self._geo.d3 else None)
        if src.size == 0:
            self.set_empty({SRC: src, DST: dst}, f"zero volume: dst {dst.dims} has no elements, so nothing is written")
        else:
            isa_mod.require_path(self.isa)

    # -- queries (src_desc, dst_desc, scratchpad_desc: PrimitiveDesc's) -------------------
    def _route(self) -> str:
        if self.channels_last:
            return "nhwc"
        return "nchw_as_c1" if self._geo.c < NCHW_TRANSPOSE_MIN_C else "nchw_transpose"

    def _impl_info(self) -> dict:
        route = self._route()
        why = {
            "nhwc": "channels last: channels are the vector dimension",
            "nchw_as_c1": f"channels first with C < {NCHW_TRANSPOSE_MIN_C}: read as N*C images of one channel, no copy",
            "nchw_transpose": "channels first: transposed to NHWC and back around the NHWC kernel",
        }[route]
        return {
            "kind": "pooling", "impl": self.spec.name, "alg": self.alg, "isa": self.isa, "kernel": self.spec.name,
            "vector_bits": self.spec.bits, "src": str(self._src), "dst": str(self._dst),
            "layout_route": route, "reason": why, "threads": self.threads,
        }

    def _key_extra(self):
        return (self.alg, self.kernel, self.strides, self.padding_l, self.padding_r, self.threads)

    def _verbose_desc(self) -> str:
        def x(values):
            return "x".join(map(str, values))

        return (f"{super()._verbose_desc()} alg:{self.alg} kernel:{x(self.kernel)} strides:{x(self.strides)} "
                f"pad:{x(self.padding_l)}/{x(self.padding_r)}")

    def _create_primitive(self) -> "Pooling":
        return Pooling(self)


def pooling_desc(alg, src_desc, dst_desc, strides, kernel, padding_l, padding_r, attr=None, isa=None,
                 threads=None) -> PoolingDesc:
    """Function form of :class:`PoolingDesc`."""
    return PoolingDesc(alg, src_desc, dst_desc, strides, kernel, padding_l, padding_r, attr=attr, isa=isa,
                       threads=threads)


class Pooling(Primitive):
    """The pooling primitive: ``execute({"src": ..., "dst": ...})`` (ndarrays or Memory);
    a repeated call with the same arrays replays (:class:`primitives.replay.Replay`)."""

    def __init__(self, pd: PoolingDesc):
        from jit import cache
        from jit.pooling_kernel import generate

        super().__init__(pd)
        spec = pd.spec
        self.kernel = cache.get_kernel(("pooling", spec), lambda: generate(spec))
        self._fn = self.kernel.function
        self._src_md, self._dst_md = pd.src_desc(), pd.dst_desc()
        g = pd._geo
        route = pd._route()
        self._route = route
        run_geo = _Geometry(**{**g.__dict__, "n": g.n * g.c, "c": 1}) if route == "nchw_as_c1" else g
        self._chunks = self._plan(run_geo)

    def impl_info(self) -> dict:
        return self.pd.impl_info()

    def _execute(self, mem: dict, scratchpad) -> Replay:
        src, dst = mem[SRC].array, mem[DST].array
        if self._route != "nchw_transpose":  # (src and dst apart: checked by execute)
            run = self._calls(src, dst)  # the same arrays next time: checked already
            run()
            return Replay(run, move=pointing(lambda arrays: self._point(run, arrays[SRC], arrays[DST]),
                                             self._entries(run), (SRC, DST)))
        self._pool(src, dst)
        return Replay(lambda: self._pool(src, dst))

    def _pool(self, src: np.ndarray, dst: np.ndarray) -> None:
        """The channels-first route: through channels-last copies."""
        nd = src.ndim - 2
        to_last = (0,) + tuple(range(2, 2 + nd)) + (1,)
        s = np.ascontiguousarray(src.transpose(to_last))
        d = np.empty(tuple(dst.shape[i] for i in to_last), dst.dtype)
        self._calls(s, d)()
        np.copyto(dst, d.transpose((0, nd + 1) + tuple(range(1, nd + 1))))

    def _plan(self, g: _Geometry) -> list:
        """Per thread chunk: the argument struct's bytes (pointers zero) and the pointer offsets."""
        spec, pd = self.pd.spec, self.pd
        dsz = self._dst_md.itemsize
        big, small, tail = spec.blocks(g.c)
        rows = g.n * g.od * g.oh
        work = self._src_md.nbytes + self._dst_md.nbytes
        threads = max(1, min(pd.threads, work // _MIN_BYTES_PER_THREAD))
        plane_bytes = g.ih * g.iw * g.c
        img_bytes = g.id * plane_bytes
        row_out = g.ow * g.c * dsz
        chunks = []
        for begin, end in split(rows, threads):
            s = ffi.new("struct i8j_pool_args *")
            n0, rest = divmod(begin, g.od * g.oh)
            od0, oh0 = divmod(rest, g.oh)
            s.rows, s.oh, s.ih_start = end - begin, oh0, oh0 * g.sh - g.pt
            s.od, s.id_start = od0, od0 * g.sd - g.pf
            s.OD, s.ID, s.KD, s.SD, s.pad_f, s.plane_bytes = g.od, g.id, g.kd, g.sd, g.pf, plane_bytes
            s.OH, s.OW, s.IH, s.IW = g.oh, g.ow, g.ih, g.iw
            s.KH, s.KW, s.SH, s.SW = g.kh, g.kw, g.sh, g.sw
            s.pad_t, s.pad_l = g.pt, g.pl
            s.row_bytes, s.pix_bytes, s.img_bytes = g.iw * g.c, g.c, img_bytes
            s.n_big, s.n_small, s.tail = big, small, tail
            s.tail_mask, s.tail_dst_bytes = (1 << tail) - 1, tail * dsz
            s.divisor = float(g.kd * g.kh * g.kw)
            chunks.append((bytes(ffi.buffer(s)), n0 * img_bytes, begin * row_out))
        return chunks

    def _calls(self, src: np.ndarray, dst: np.ndarray):
        """A call that pools ``src`` into ``dst``: one kernel call per thread chunk, on
        structs of its own (the kernel only reads them, so the call can repeat as it is)."""
        calls = []
        for template, _, _ in self._chunks:
            s = ffi.new("struct i8j_pool_args *")
            ffi.memmove(s, template, len(template))
            calls.append([(self._fn, s)])
        if len(calls) == 1:
            run = functools.partial(self._fn, calls[0][0][1])
        else:
            run = functools.partial(CallPlan(calls).run)
        run.structs = [c[0][1] for c in calls]
        self._point(run, src, dst)
        return run

    def _entries(self, run) -> list:
        """What :meth:`_point` writes, as :func:`~primitives.replay.pointing` takes it."""
        return [(s, field, base, offset) for s, (_, src_off, dst_off) in zip(run.structs, self._chunks)
                for field, base, offset in (("src", 0, src_off), ("dst", 1, dst_off))]

    def _point(self, run, src: np.ndarray, dst: np.ndarray) -> None:
        """``run``'s structs (:meth:`_calls`) at ``src`` and ``dst``: a replay moved to new
        arrays (Replay.moves) as well as a new call."""
        src_ptr, dst_ptr = pointer_to(src), pointer_to(dst)
        for s, (_, src_off, dst_off) in zip(run.structs, self._chunks):
            s.src, s.dst = src_ptr + src_off, dst_ptr + dst_off
        # (bare addresses: the caller keeps the arrays alive; a replay runs only on arrays
        # its test found alive, or a bound call on the ones it holds)


def _spatial_pairs(name: str, value, nd: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """padding: an int, one per dim, or one (left, right) pair per dim."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),) * nd, (int(value),) * nd
    if isinstance(value, (tuple, list)) and len(value) == nd:
        if all(isinstance(v, (tuple, list)) and len(v) == 2 for v in value):
            return tuple(v[0] for v in value), tuple(v[1] for v in value)
        return tuple(value), tuple(value)
    raise ValueError(f"{name}: expected an integer, {nd} integers or {nd} (left, right) pairs, got {value!r}")


def pool2d(x: np.ndarray, kernel, stride=None, padding=0, alg: str = "max", layout: str = "nhwc",
           dst_dt: str | None = None, isa: str | None = None, threads: int | None = None) -> np.ndarray:
    """numpy-style 2-D pooling of a u8/s8 array; returns a new array in the same layout.

    ``x``: ``(N, H, W, C)`` for ``layout="nhwc"``, ``(N, C, H, W)`` for ``"nchw"``.
    ``kernel``/``stride``: an int or ``(h, w)``; stride defaults to the kernel.
    ``padding``: an int, ``(ph, pw)`` (both sides) or ``((top, bottom), (left, right))``.
    ``alg``: ``max``, ``avg_include_padding`` or ``avg_exclude_padding``.

    >>> import numpy as np
    >>> x = np.arange(16, dtype=np.uint8).reshape(1, 4, 4, 1)
    >>> pool2d(x, 2)[0, :, :, 0].tolist()
    [[5, 7], [13, 15]]
    >>> pool2d(x, 3, stride=1, padding=1, alg="avg_exclude_padding")[0, 0, :, 0].tolist()  # 2.5 -> 2 (even)
    [2, 3, 4, 4]
    """
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x: expected a numpy array, got {type(x).__name__}")
    if x.ndim != 4:
        raise ValueError(f"x: expected a 4-D array ({'N, H, W, C' if layout == 'nhwc' else 'N, C, H, W'}), "
                         f"got shape {x.shape}")
    x = np.ascontiguousarray(x)
    # A call like an earlier one on this thread: that call's primitive (checked then),
    # which moves its replay to this call's arrays (a 3x3/2 max pooling of 1x112x112x64
    # on two threads: 117 -> 17 us a call).
    key = (x.shape, x.dtype.str, kernel, stride, padding, alg, layout, dst_dt, type(kernel), type(stride),
           type(padding)) + in_force(isa, threads)  # (2.0 equals 2, but the descriptor refuses it)
    kept = kept_setup("pool2d", key, lambda: _pool2d_setup(x, kernel, stride, padding, alg, layout, dst_dt, isa, threads))
    p, out_shape, out_dtype = kept
    dst = np.empty(out_shape, out_dtype)
    p.execute({SRC: x, DST: dst})
    return dst


def _pool2d_setup(x: np.ndarray, kernel, stride, padding, alg: str, layout: str, dst_dt, isa, threads) -> tuple:
    """:func:`pool2d`'s checks and primitive: (primitive, dst's shape and dtype)."""
    if layout not in ("nhwc", "nchw"):
        raise ValueError(f"layout: expected 'nhwc' or 'nchw', got {layout!r}")
    if x.dtype not in (np.uint8, np.int8):
        raise TypeError(f"x: expected dtype uint8 or int8, got {x.dtype.name}")
    src_dt = "u8" if x.dtype == np.uint8 else "s8"
    n, c, h, w = (x.shape[0], x.shape[3], x.shape[1], x.shape[2]) if layout == "nhwc" else x.shape
    kernel = _ints("kernel", kernel, 2, 1)
    stride = kernel if stride is None else _ints("stride", stride, 2, 1)
    pl, pr = _spatial_pairs("padding", padding, 2)
    pl, pr = _ints("padding", pl, 2, 0), _ints("padding", pr, 2, 0)
    out = pooled_dims((h, w), kernel, stride, pl, pr)
    src_md = desc((n, c, h, w), src_dt, layout)
    dst_md = desc((n, c) + out, dst_dt or src_dt, layout)
    pd = PoolingDesc(alg, src_md, dst_md, stride, kernel, pl, pr, isa=isa, threads=threads)
    return pd.create(), pd.dst_desc().physical_shape, pd.dst_desc().numpy_dtype


def bench_case(n: int = 1, c: int = 64, h: int = 112, w: int = 112, kernel: int = 3, stride: int = 2,
               padding: int = 1, alg: str = "max", src_dt: str = "u8", isa: str | None = None, threads: int = 1,
               seed: int = 0, d: int | None = None):
    """A ready-to-time pooling for a benchmark driver: ``(run, bytes_moved, numpy_run)``.

    ``run()`` executes the int8jit primitive once on NHWC data (NDHWC with a depth ``d``:
    cubic windows); ``numpy_run()`` computes the same result with numpy
    (``primitives.pooling_ref``); ``bytes_moved`` = src + dst bytes.
    """
    from primitives.pooling_ref import pooling_ref

    rng = np.random.default_rng(seed)
    dtype = np.uint8 if src_dt == "u8" else np.int8
    info = np.iinfo(dtype)
    spatial = (h, w) if d is None else (d, h, w)
    nd = len(spatial)
    x = rng.integers(info.min, info.max + 1, (n,) + spatial + (c,), dtype=dtype)
    outs = tuple((i + 2 * padding - kernel) // stride + 1 for i in spatial)
    tag = CHANNELS_LAST[nd + 2]
    pd = PoolingDesc(alg, desc((n, c) + spatial, src_dt, tag), desc((n, c) + outs, src_dt, tag), stride, kernel,
                     padding, padding, isa=isa, threads=threads)
    prim = pd.create()
    y = np.empty((n,) + outs + (c,), dtype)
    args = {SRC: x, DST: y}

    def run():
        prim.execute(args)

    def numpy_run():
        return pooling_ref(x, alg, (kernel,) * nd, (stride,) * nd, (padding,) * nd, (padding,) * nd)

    return run, x.nbytes + y.nbytes, numpy_run


__all__ = ["ALGS", "PoolingDesc", "Pooling", "pooling_desc", "pooled_dims", "pool2d", "check_alg", "bench_case"]
