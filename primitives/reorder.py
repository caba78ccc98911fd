"""The reorder primitive: type conversion, quantization and format changes with attributes.

Semantics (oneDNN v3 reorder with scales and zero points), per element, in f32 and in
this order (``primitives.reorder_ref`` is the model)::

    x = (f32(src) - f32(src_zp)) * src_scale
    x = x / dst_scale + f32(dst_zp)
    dst = x                                 f32 destination
    dst = bf16 nearest even of x            bf16 destination
    dst = rne(clamp(x, lo, hi))             u8 [0, 255], s8 [-128, 127], s32 [-2^31, 2147483520]
                                            NaN becomes 0 (int8jit's choice, documented)

An attribute that is not set is skipped. A same-type reorder without attributes copies
the bits (s32 is not passed through f32 then). Scales and zero points are given per
tensor (mask 0) or per index of any set of logical dims (mask bits), their values
passed at execution as ``scales("src")``, ``scales("dst")``, ``zero_points("src")``,
``zero_points("dst")``. Zero points apply to integer types only.

Implementations (``impl_info()["impl"]``):

``jit:avx2`` / ``jit:avx512_core``
    src and dst lie in the same memory order, both types among u8/s8/s32/f32, and each
    attribute's mask either contains the innermost memory dim (and only dims of a
    trailing block of memory dims) or none of that block. The tensor is viewed as
    ``rows x n`` (``n`` a trailing block of memory dims); the generated kernel
    (``jit.reorder_kernel``) converts a chunk of rows with the attribute per row or per
    element of a row. One kernel call per thread chunk. ``avx2_vnni`` runs the ``avx2``
    code and ``avx512_core_vnni`` the ``avx512_core`` code.
``numpy:copy``, ``numpy:transpose``, ``numpy:convert``
    everything else (format changes with a transposition, bf16, masks that mix the
    innermost block with outer dims, any reorder on a CPU without AVX2, where no kernel
    runs), with ``reorder_ref.convert``: the same operations in the same order, so both
    give identical bits.

A destination whose tag is ``packed`` is filled by its layout object: the reorder
converts the source to a logical-order array of the destination type (quantizing with
the attributes) and calls ``dst_desc.layout.pack(logical, dst_memory)``.

Example::

    >>> import numpy as np
    >>> from primitives.memory import desc
    >>> from primitives.attr import Attr, DST, scales
    >>> x = np.array([[0.5, 1.5, 2.5, -0.5], [1000.0, -1000.0, 3.0, 4.0]], np.float32)
    >>> pd = reorder_desc(desc((2, 4), "f32", "ab"), desc((2, 4), "s8", "ab"), Attr(scales={DST: 1 << 0}))
    >>> q = np.zeros((2, 4), np.int8)
    >>> pd.create().execute({"src": x, "dst": q, scales(DST): np.array([1.0, 2.0], np.float32)})
    >>> q.tolist()
    [[0, 2, 2, 0], [127, -128, 2, 2]]
    >>> quantize(np.array([0.5, 1.5, 2.5, 255.0 * 3]), 1.0, dt="u8").tolist()
    [0, 2, 2, 255]
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from jit.reorder_kernel import ARGS_CDEF, ATTRS, KERNEL_TYPES, SIGNATURE, ReorderKernelSpec, code_isa
from primitives import reorder_ref, verbose
from primitives.attr import DST, SRC, Attr, check_scales, check_zero_points, mask_dims, scales, zero_points
from primitives.base import Primitive, PrimitiveDesc, in_force, kept_setup
from primitives.checks import check_known_dims, dtype_text
from primitives.memory import INT_RANGES, Memory, MemoryDesc, desc, identity_tag
from primitives.replay import Replay, pointing, view_maker
from runtime import isa as isa_mod
from runtime.ffi import declare, ffi, pointer_to
from runtime.threads import resolve_threads, run_chunks, split

declare(ARGS_CDEF, (SIGNATURE, "struct i8j_reorder_args *"))

INT_TYPES = tuple(INT_RANGES)  # zero points apply to these
# (attribute name in the kernel, argument, kind) in the kernel's ATTRS order.
_ATTR_ARGS = (("src_scale", SRC, "scales"), ("dst_scale", DST, "scales"),
              ("src_zp", SRC, "zero_points"), ("dst_zp", DST, "zero_points"))
_MIN_ROW = 1024  # grow the row block until rows are at least this long (per-element tables stay small)
_SMALL = 1 << 16  # below this many elements one thread does the work
_PAD = 16  # floats of padding after per-element tables: a full vector may be read past n


def _key(kind: str, arg: str) -> str:
    return scales(arg) if kind == "scales" else zero_points(arg)


@dataclass(frozen=True)
class _View:
    """The JIT plan: ``rows x n`` with the trailing ``k`` memory dims in a row, kernel modes."""

    k: int
    rows: int
    n: int
    modes: tuple  # per ATTRS: "none", "row" or "col"


class ReorderDesc(PrimitiveDesc):
    """A validated reorder from ``src_desc`` to ``dst_desc`` under ``attr`` (oneDNN's reorder pd).

    Raises ValueError/TypeError naming the argument when descriptors, data types,
    masks or zero points do not fit. ``create()`` gives the executable primitive
    (through the primitive cache). ``threads`` bounds the thread chunks (default:
    ``INT8JIT_NUM_THREADS`` or every usable core).
    """

    kind = "reorder"

    def __init__(self, src_desc: MemoryDesc, dst_desc: MemoryDesc, attr: Attr | None = None,
                 isa: str | None = None, threads: int | None = None):
        for name, md in (("src_desc", src_desc), ("dst_desc", dst_desc)):
            if not isinstance(md, MemoryDesc):
                raise TypeError(f"{name}: expected a MemoryDesc (primitives.memory.desc), got {type(md).__name__}")
            if md.is_any:
                raise ValueError(f"{name}: a reorder needs a concrete layout, got tag 'any'")
            check_known_dims(name, md)
        if src_desc.is_packed:
            raise ValueError(f"src_desc: {src_desc} is packed; a reorder reads plain tags only")
        if src_desc.dims != dst_desc.dims:
            raise ValueError(f"dst_desc: dims {dst_desc.dims} differ from src_desc's {src_desc.dims}; "
                             "a reorder keeps the logical dims")
        super().__init__(attr)
        self.attr.validate({SRC: src_desc, DST: dst_desc}, "reorder", scales_args=(SRC, DST),
                           zero_points_args=(SRC, DST))
        if len(self.attr.post_ops):
            raise ValueError("attr post_ops: reorder takes no post-ops")
        for arg, md in ((SRC, src_desc), (DST, dst_desc)):
            if self.attr.zero_points_mask(arg) is not None and md.dt not in INT_TYPES:
                raise ValueError(f"attr {zero_points(arg)}: {arg} is {md.dt}; zero points apply to integer "
                                 f"types only ({', '.join(INT_TYPES)})")
        self._set_desc(SRC, src_desc)
        self._set_desc(DST, dst_desc)
        self.isa = verbose.planned_isa(self.kind, isa)
        self.threads = resolve_threads(threads)
        self._masks = {name: (self.attr.scales_mask(arg) if kind == "scales" else self.attr.zero_points_mask(arg))
                       for name, arg, kind in _ATTR_ARGS}
        self._inner: ReorderDesc | None = None
        if src_desc.size == 0:
            self.set_empty({SRC: src_desc, DST: dst_desc}, f"zero volume: dims {src_desc.dims}, nothing to convert")
            return
        if dst_desc.is_packed:
            pack = getattr(dst_desc.layout, "pack", None)
            if not callable(pack):
                raise ValueError(f"dst_desc: packed layout {dst_desc.layout!r} has no pack(src_logical, dst_memory)")
            plain = MemoryDesc(dst_desc.dims, dst_desc.dt, identity_tag(dst_desc.ndims))
            self._inner = ReorderDesc(src_desc, plain, attr, isa, threads)
            self._impl, self._reason, self._view, self._spec = "pack", "packed destination: layout.pack", None, None
            return
        self._impl, self._reason, self._view, self._spec = self._choose()

    def _key_extra(self):
        return (self.threads,)

    def _create_primitive(self) -> "Reorder":
        return Reorder(self)

    def runs_isa(self) -> str | None:
        """The reorder kernel's path; ``"any"`` for numpy (and the pack, a numpy step,
        after whatever its conversion runs)."""
        if self._inner is not None:
            return self._inner.runs_isa()
        return self.isa if self.empty is None and self._spec is not None else "any"

    def _impl_info(self) -> dict:
        """Which implementation runs and why."""
        if self._inner is not None:
            inner = self._inner.impl_info()
            return {"primitive": "reorder", "impl": f"{inner['impl']}+pack", "isa": self.runs_isa(),
                    "layout": repr(self.dst_desc().layout), "convert": inner, "reason": self._reason}
        info = {"primitive": "reorder", "impl": self._impl, "isa": self.runs_isa(), "reason": self._reason,
                "src": str(self.src_desc()), "dst": str(self.dst_desc()), "attr": self.attr.verbose_str()}
        if self._spec is not None:
            info.update(kernel=self._spec.name, view=(self._view.rows, self._view.n),
                        modes=dict(zip(ATTRS, self._view.modes)))
        return info

    # -- the decision -------------------------------------------------------------------
    def _is_copy(self) -> bool:
        return self.src_desc().dt == self.dst_desc().dt and all(m is None for m in self._masks.values())

    def _same_order(self) -> bool:
        s, d = self.src_desc(), self.dst_desc()
        return all(a == b for a, b, n in zip(s.strides, d.strides, s.dims) if n > 1)

    def _choose(self):
        s, d = self.src_desc(), self.dst_desc()
        same = self._same_order()
        if self._is_copy():
            return ("numpy:copy", "same data type, no attributes: bit copy", None, None) if same else \
                ("numpy:transpose", "same data type, no attributes, memory orders differ", None, None)
        if s.dt not in KERNEL_TYPES or d.dt not in KERNEL_TYPES:
            return "numpy:convert", f"{s.dt} -> {d.dt}: the kernel converts {', '.join(KERNEL_TYPES)}", None, None
        if not same:
            return ("numpy:convert", f"memory orders differ ({s.tag} -> {d.tag}): a transposition", None, None)
        view = self._view_for(d.perm, d.dims)
        if isinstance(view, str):
            return "numpy:convert", view, None, None
        if self.isa not in isa_mod.supported():
            return ("numpy:convert", "no ISA path runs here (the CPU lacks AVX2): reorder_ref in numpy, the same bits",
                    None, None)
        spec = ReorderKernelSpec(code_isa(self.isa), s.dt, d.dt, view.modes)
        return f"jit:{code_isa(self.isa)}", f"rows x n = {view.rows} x {view.n}, contiguous rows", view, spec

    def _view_for(self, perm, dims):
        """The trailing block of memory dims a row holds, or why none fits the masks."""
        nd = len(perm)
        inner = perm[-1]
        masks = {a: set(mask_dims(m)) for a, m in self._masks.items() if m}
        col = {a: m for a, m in masks.items() if inner in m}
        row = {a: m for a, m in masks.items() if inner not in m}
        pos = {dim: i for i, dim in enumerate(perm)}
        # The block must hold every dim of a per-element attribute and none of a per-row one.
        k_min = max((nd - min(pos[x] for x in m) for m in col.values()), default=1)
        k_max = min((nd - 1 - max(pos[x] for x in m) for m in row.values()), default=nd)
        if k_min > k_max:
            names = ", ".join(sorted(f"{a}={self._masks[a]}" for a in masks))
            return (f"masks {names} mix the innermost memory dims with outer ones: "
                    "no rows x n view has each attribute per row or per element")
        k = k_min
        while k < k_max and math.prod(dims[i] for i in perm[nd - k:]) < _MIN_ROW:
            k += 1
        if not col:
            k = k_max  # per-row values only: the longest rows (nothing varies: the whole tensor)
        n = math.prod(dims[i] for i in perm[nd - k:])
        modes = tuple("none" if self._masks[a] is None else ("col" if a in col else "row") for a in ATTRS)
        return _View(k, math.prod(dims) // n, n, modes)


def reorder_desc(src_desc: MemoryDesc, dst_desc: MemoryDesc, attr: Attr | None = None,
                 isa: str | None = None) -> ReorderDesc:
    """The reorder primitive descriptor (see :class:`ReorderDesc`)."""
    return ReorderDesc(src_desc, dst_desc, attr, isa)


class Reorder(Primitive):
    """An executable reorder; ``execute`` may be called from several threads at once.

    ``execute({"src": ..., "dst": ..., "scales:src": ..., "zero_points:dst": ...})``
    takes Memory objects or numpy arrays; ``primitives.base.Primitive.execute`` checks
    them (names, layouts, counts of scales and zero points) before any code runs.
    """

    def __init__(self, pd: ReorderDesc):
        super().__init__(pd)
        self._kernel = None
        if pd._spec is not None:
            from jit.reorder_kernel import get_kernel

            self._kernel = get_kernel(pd._spec)
        self._inner = Reorder(pd._inner) if pd._inner is not None else None

    def impl_info(self) -> dict:
        return self.pd.impl_info()

    def _execute(self, mem: dict, scratchpad) -> Replay:
        values = {name: mem[_key(kind, arg)].data for name, arg, kind in _ATTR_ARGS
                  if self.pd._masks[name] is not None}
        again = self._run(mem[SRC], mem[DST], values)
        # The same arrays next time (scales and zero points compared by value): the kernel
        # calls alone (64x768 f32 -> u8: 23.6 -> 8 us a call), or the numpy path again.
        return again or Replay(functools.partial(self._run, mem[SRC], mem[DST], values))

    def _run(self, src: Memory, dst: Memory, values: dict) -> Replay | None:
        pd = self.pd
        if self._inner is not None:
            self._execute_packed(src, dst, values)
        elif pd._spec is not None:
            return self._execute_jit(src, dst, values)
        else:
            self._execute_numpy(src, dst, values)
        return None

    def _expanded(self, values: dict) -> dict:
        dims = self.pd.src_desc().dims
        return {name: reorder_ref.expand(v, self.pd._masks[name], dims) for name, v in values.items()}

    # -- implementations ----------------------------------------------------------------
    def _execute_numpy(self, src: Memory, dst: Memory, values: dict) -> None:
        pd = self.pd
        ex = self._expanded(values)
        if pd._impl in ("numpy:copy", "numpy:transpose"):
            dst.logical()[...] = src.logical()
            return
        out = reorder_ref.convert(src.logical(), pd.src_desc().dt, pd.dst_desc().dt, ex.get("src_scale"),
                                  ex.get("dst_scale"), ex.get("src_zp"), ex.get("dst_zp"))
        dst.logical()[...] = out

    def _tables(self, values: dict):
        """Per-row and per-element f32 tables the kernel reads, with their row strides."""
        pd = self.pd
        view = pd._view
        perm, dims = pd.dst_desc().perm, pd.dst_desc().dims
        phys = tuple(dims[i] for i in perm)
        nd = len(perm)
        tables = {}
        for name, mode in zip(ATTRS, view.modes):
            if mode == "none":
                continue
            v = reorder_ref.expand(values[name], pd._masks[name], dims)  # broadcastable, logical order
            v = np.transpose(v, perm).astype(np.float32)  # zero points: s32 -> f32, nearest even
            if pd._masks[name] == 0:
                tables[name] = (np.ascontiguousarray(v.reshape(1)), 0)
            elif mode == "row":
                outer = np.broadcast_to(v.reshape(v.shape[:nd - view.k]), phys[:nd - view.k])
                tables[name] = (np.ascontiguousarray(outer).reshape(-1), 4)
            else:
                block = np.broadcast_to(v.reshape(v.shape[nd - view.k:]), phys[nd - view.k:]).reshape(-1)
                padded = np.ones(view.n + _PAD, np.float32)
                padded[:view.n] = block
                tables[name] = (padded, 0)
        return tables

    def _execute_jit(self, src: Memory, dst: Memory, values: dict) -> Replay:
        """The kernel over src and dst, a call per thread chunk; returns its replay (which
        moves to new arrays of the same layouts: its structs pointed at them)."""
        pd = self.pd
        view = pd._view
        tables = self._tables(values)
        s_item, d_item = src.array.itemsize, dst.array.itemsize
        threads = 1 if view.rows * view.n < _SMALL else pd.threads
        if view.rows >= threads:
            chunks = [(b, e, 0, view.n) for b, e in split(view.rows, threads)]
        else:  # few long rows: split the columns too, in whole cache lines
            chunks = [(r, r + 1, b, e) for r in range(view.rows)
                      for b, e in split(view.n, max(1, threads // view.rows), 64)]
        structs, offsets = [], []
        for r0, r1, c0, c1 in chunks:
            s = ffi.new("struct i8j_reorder_args *")
            offsets.append(((r0 * view.n + c0) * s_item, (r0 * view.n + c0) * d_item))
            s.src_stride, s.dst_stride = view.n * s_item, view.n * d_item
            s.rows, s.n = r1 - r0, c1 - c0
            for i, name in enumerate(ATTRS):
                if name in tables:
                    table, stride = tables[name]
                    offset = r0 * stride + (c0 * 4 if view.modes[i] == "col" else 0)
                    s.attr[i] = ffi.cast("float *", pointer_to(table)) + offset // 4
                    s.attr_stride[i] = stride
            structs.append(s)

        def point(src_array: np.ndarray, dst_array: np.ndarray) -> None:  # (this call's, and a moved replay's)
            s_ptr, d_ptr = pointer_to(src_array), pointer_to(dst_array)
            for s, (s_off, d_off) in zip(structs, offsets):
                s.src, s.dst = s_ptr + s_off, d_ptr + d_off
        point(src.data, dst.data)
        run = functools.partial(run_chunks, self._kernel.function, structs)
        run.tables = tables  # the structs hold raw addresses into these
        run()
        return Replay(run, move=pointing(lambda arrays: point(arrays[SRC], arrays[DST]),
                                         [(s, field, base, offset) for s, (s_off, d_off) in zip(structs, offsets)
                                          for field, base, offset in (("src", 0, s_off), ("dst", 1, d_off))],
                                         (SRC, DST)))

    def _execute_packed(self, src: Memory, dst: Memory, values: dict) -> None:
        inner = self._inner
        if inner.pd._impl == "numpy:copy" and not values:
            logical = src.logical()
        else:
            tmp = Memory(inner.pd.dst_desc())
            inner._run(src, tmp, values)
            logical = tmp.logical()
        self.pd.dst_desc().layout.pack(logical, dst)


# ----------------------------------------------------------------------------- numpy-style helpers

def _axis_mask(name: str, axis, ndim: int, values) -> int:
    """Mask for per-axis values (one value: mask 0, whatever the axis)."""
    if axis is not None and (isinstance(axis, bool) or not isinstance(axis, (int, np.integer))
                             or not -ndim <= axis < ndim):
        raise ValueError(f"axis: expected an integer in [{-ndim}, {ndim - 1}] or None, got {axis!r}")
    size = np.asarray(values).size
    if size == 1:
        return 0
    if axis is None:
        raise ValueError(f"{name}: got {size} values without axis; pass axis= for per-channel values")
    return 1 << (int(axis) % ndim)


def _source(x: np.ndarray) -> Memory:
    """``x`` as a plain memory, without a copy when it is dense in any dim order."""
    from primitives.memory import as_memory

    if x.ndim == 0:
        x = x.reshape(1)
    try:
        return as_memory(x, "x")
    except ValueError:  # strided: not dense in memory
        return as_memory(np.ascontiguousarray(x), "x")


def quantize(x, scale, zero_point=0, dt: str = "u8", axis: int | None = None, *, isa: str | None = None):
    """``q = saturate(rne(f32(x) / scale + zero_point))`` as ``dt`` (u8, s8 or s32), numpy style.

    ``scale`` and ``zero_point`` are one value, or (with ``axis``) one value per index of
    ``x``'s dimension ``axis``. ``x`` is converted to f32 first. Returns a new array with
    ``x``'s shape.

    >>> quantize([0.0, 0.25, 0.75, 100.0], 0.5, zero_point=128).tolist()   # 128.5 -> 128, 129.5 -> 130
    [128, 128, 130, 255]
    >>> quantize([[1.0, 1.0], [1.0, 1.0]], [0.5, 0.25], dt="s8", axis=1).tolist()
    [[2, 4], [2, 4]]
    """
    if dt not in INT_TYPES:
        raise ValueError(f"dt: expected one of {', '.join(INT_TYPES)}, got {dt!r}")
    x = np.asarray(x, dtype=np.float32)
    return _convert(x, dt, axis, None, None, scale, zero_point, isa)


def dequantize(q, scale, zero_point=0, axis: int | None = None, *, isa: str | None = None):
    """``x = scale * (f32(q) - zero_point)`` in f32 for u8/s8/s32 ``q``, numpy style.

    >>> import numpy as np
    >>> dequantize(np.array([128, 130, 255], np.uint8), 0.5, zero_point=128).tolist()
    [0.0, 1.0, 63.5]
    """
    q = np.asarray(q)
    if q.dtype not in (np.uint8, np.int8, np.int32):
        raise TypeError(f"q: expected dtype uint8, int8 or int32, got {dtype_text(q.dtype)}")
    return _convert(q, "f32", axis, scale, zero_point, None, None, isa)


def _convert(x: np.ndarray, dst_dt, axis, src_scale, src_zp, dst_scale, dst_zp, isa) -> np.ndarray:
    dims = x.shape or (1,)
    masks, args = [], {}
    for arg, value, kind in ((SRC, src_scale, "scales"), (SRC, src_zp, "zero_points"),
                             (DST, dst_scale, "scales"), (DST, dst_zp, "zero_points")):
        if value is None:
            continue
        name = "scale" if kind == "scales" else "zero_point"
        arr = np.asarray(value)
        if kind == "zero_points" and arr.size == 1 and not arr.any():
            continue  # zero point 0: skip the subtraction (same bits)
        mask = _axis_mask(name, axis, len(dims), value)
        masks.append((arg, kind, mask))
        if kind == "scales":
            args[scales(arg)] = check_scales(name, value, mask, dims)
        else:
            args[zero_points(arg)] = check_zero_points(name, value, mask, dims)

    def build():  # the primitive of this call, with x as a Memory and dst's descriptor
        attr = Attr()
        for arg, kind, mask in masks:
            (attr.set_scales_mask if kind == "scales" else attr.set_zero_points_mask)(arg, mask)
        src = _source(x)
        dst_md = desc(src.desc.dims, dst_dt, src.desc.tag)
        return ReorderDesc(src.desc, dst_md, attr, isa).create(), src, dst_md

    made = []  # (this call's build(), where make() ran)

    def make():  # the primitive of this signature, and how it takes x and gives the result
        made.append(build())
        p, src, dst_md = made[0]
        out = np.empty(dst_md.physical_shape, dst_md.numpy_dtype)
        take_src = view_maker(src.array, x)
        take_out = view_maker(Memory.trusted(dst_md, out).logical().reshape(x.shape), out)
        # (False: a source not dense in memory, copied at every call)
        return (p, take_src, out.shape, out.dtype, take_out) if take_src and take_out else False

    kept = kept_setup("reorder", (x.dtype.str, x.shape, x.strides, dst_dt, tuple(masks)) + in_force(isa, None), make)
    if kept:  # (quantize of 64x768 with a scale and a zero point: 159 -> 24 us a call)
        p, take_src, shape, dtype, take_out = kept
        out = np.empty(shape, dtype)
        args[SRC], args[DST] = take_src(x), out
        p.execute(args)
        return take_out(out)
    p, src, dst_md = made[0] if made else build()
    out = Memory(dst_md)
    args[SRC], args[DST] = src, out
    p.execute(args)
    return out.logical().reshape(x.shape)


__all__ = ["ReorderDesc", "Reorder", "reorder_desc", "quantize", "dequantize"]
