"""Primitive attributes: quantization masks, post-ops, scratchpad and fpmath modes, policy.

Argument names are strings, the keys of ``Primitive.execute``'s ``args`` dict:
``SRC``, ``WEIGHTS``, ``BIAS``, ``DST``, ``SCRATCHPAD``, and for quantization
parameters ``scales(arg)`` (``"scales:src"``), ``zero_points(arg)``
(``"zero_points:dst"``) and ``post_op_src1(i)`` (``"post_op:1:src_1"``).

Masks
    A mask says which logical dimensions of an argument get their own scale or zero
    point: bit ``i`` set means one value per index of dimension ``i``; mask 0 means one
    value for the whole tensor. At execution the number of values must equal the
    product of the masked dims (:func:`expected_count`), ordered row-major over the
    masked dims (the lowest masked dimension outermost). Per-output-channel weight
    scales are mask ``1 << 0`` for OIHW convolution weights and ``1 << 1`` for K x N
    matmul weights.

Post-ops run in f32 on the primitive's result before the destination scale and zero
point: ``dst = post_ops(result) / scale_dst + zp_dst``. Eltwise algorithms, with
``alpha`` and ``beta`` as oneDNN defines them (all on f32):

    relu        x if x > 0 else alpha * x
    clip        min(max(x, alpha), beta)            (alpha <= beta required)
    linear      alpha * x + beta
    abs, square, sqrt, exp, tanh, round (to nearest even)
    logistic    1 / (1 + exp(-x))
    gelu_tanh   0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    gelu_erf    0.5 x (1 + erf(x / sqrt(2)))
    swish       x * logistic(alpha * x)             (alpha 0 is accepted: x / 2)
    hardswish   x * min(max(alpha * x + beta, 0), 1) (alpha and beta as given: pass oneDNN's
                usual 1/6, 1/2; no defaults are filled in)

``Sum(scale, zero_point, dt)`` adds ``scale * (old_dst - zero_point)``, reading the old
destination as data type ``dt`` (default: dst's own type). ``Binary(alg, src1)``
combines with a second tensor ``src1`` that broadcasts against dst (each dim equal to
dst's or 1), passed at execution as ``post_op_src1(i)``.

Example::

    >>> from primitives.memory import desc
    >>> po = PostOps().eltwise("relu").sum(scale=0.5).binary("add", desc((1, 8), "f32", "ab"))
    >>> attr = Attr(scales={SRC: 0, WEIGHTS: 1 << 1}, zero_points={DST: 0}, post_ops=po)
    >>> attr.scales_mask(WEIGHTS), expected_count(attr.scales_mask(WEIGHTS), (16, 8))
    (2, 8)
    >>> check_scales(scales(WEIGHTS), [0.5] * 7, 2, (16, 8))
    Traceback (most recent call last):
    ...
    ValueError: scales:weights: got 7 values; expected 8 for mask 2 on dims (16, 8) (one per index of dim 1)
    >>> attr.set_policy("fast")
    Traceback (most recent call last):
    ...
    ValueError: policy: unknown policy 'fast'; expected one of 'exact', 'faithful', 'halve_weights'
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence, Union

import numpy as np

from primitives.memory import DATA_TYPES, MAX_NDIMS, MemoryDesc, numpy_dtype

# ----------------------------------------------------------------------------- argument names
SRC = "src"
WEIGHTS = "weights"
BIAS = "bias"
DST = "dst"
SCRATCHPAD = "scratchpad"
SRC_1 = "src_1"

# Arguments a scale or zero-point mask may be attached to; whether a primitive
# supports one is its descriptor's business (Attr.validate).
QUANT_ARGS: tuple[str, ...] = (SRC, WEIGHTS, DST, BIAS, SRC_1)


def scales(arg: str) -> str:
    """Execute-args key of the scales of ``arg``: ``scales("src") == "scales:src"``."""
    return f"scales:{arg}"


def zero_points(arg: str) -> str:
    """Execute-args key of the zero points of ``arg``: ``"zero_points:dst"``."""
    return f"zero_points:{arg}"


def post_op_src1(i: int) -> str:
    """Execute-args key of binary post-op ``i``'s second operand: ``"post_op:0:src_1"``."""
    return f"post_op:{int(i)}:{SRC_1}"


ELTWISE_ALGS: tuple[str, ...] = ("relu", "clip", "linear", "abs", "square", "sqrt", "exp", "logistic",
                                 "tanh", "gelu_tanh", "gelu_erf", "swish", "hardswish", "round")
BINARY_ALGS: tuple[str, ...] = ("add", "mul", "max", "min", "sub", "div")
SCRATCHPAD_MODES: tuple[str, ...] = ("library", "user")
FPMATH_MODES: tuple[str, ...] = ("strict", "bf16", "f16", "tf32", "any")
POLICIES: tuple[str, ...] = ("exact", "faithful", "halve_weights")
BINARY_SRC1_DTS: tuple[str, ...] = ("f32", "s32", "s8", "u8", "bf16")

S32_MIN, S32_MAX = -(2 ** 31), 2 ** 31 - 1


def _choice(name: str, value: Any, allowed: Sequence[str], what: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name}: unknown {what} {value!r}; expected one of {', '.join(map(repr, allowed))}")
    return value


def _finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__} {value!r}")
    f = float(value)
    if not math.isfinite(f):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    return f


def _int_in(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise ValueError(f"{name}: expected an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


# ----------------------------------------------------------------------------- masks

def check_mask(name: str, mask: Any, ndims: int) -> int:
    """``mask`` as an int after checking ``0 <= mask < 2**ndims``; errors name ``name``.

    >>> check_mask("scales:weights", 4, 2)
    Traceback (most recent call last):
    ...
    ValueError: scales:weights: mask 4 sets bit 2 but the tensor has 2 dimensions; expected 0 <= mask < 4
    """
    if isinstance(mask, bool) or not isinstance(mask, (int, np.integer)):
        raise TypeError(f"{name}: expected an integer mask, got {type(mask).__name__} {mask!r}")
    mask = int(mask)
    if mask < 0:
        raise ValueError(f"{name}: mask {mask} is negative; expected 0 <= mask < {2 ** ndims}")
    if mask >> ndims:
        bits = [i for i in range(mask.bit_length()) if mask >> i & 1 and i >= ndims]
        word = "bit" if len(bits) == 1 else "bits"
        raise ValueError(f"{name}: mask {mask} sets {word} {', '.join(map(str, bits))} but the tensor has "
                         f"{ndims} dimensions; expected 0 <= mask < {2 ** ndims}")
    return mask


def mask_dims(mask: int) -> tuple[int, ...]:
    """The dimensions a mask selects, lowest first: ``mask_dims(0b101) == (0, 2)``."""
    return tuple(i for i in range(int(mask).bit_length()) if mask >> i & 1)


def expected_count(mask: int, dims: Sequence[int]) -> int:
    """How many values a mask asks for: the product of the masked dims (1 for mask 0).

    >>> expected_count(0, (4, 5)), expected_count(1, (4, 5)), expected_count(3, (4, 5))
    (1, 4, 20)
    """
    return _count(check_mask("mask", mask, len(dims)), dims)


def _count(mask: int, dims: Sequence[int]) -> int:
    # mask already checked against len(dims)
    return math.prod(int(d) for i, d in enumerate(dims) if mask >> i & 1)


def _flat_values(name: str, values: Any) -> np.ndarray:
    arr = values if isinstance(values, np.ndarray) else np.asarray(values)
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise TypeError(f"{name}: expected numbers, got {type(values).__name__} of dtype {arr.dtype}")
    if arr.dtype.kind == "b":
        raise TypeError(f"{name}: expected numbers, got booleans")
    return arr.reshape(-1)


def _count_error(name: str, got: int, mask: int, dims: Sequence[int], want: int) -> ValueError:
    sel = mask_dims(mask)
    per = ("one for the whole tensor" if not sel else
           f"one per index of dim{'s' if len(sel) > 1 else ''} {', '.join(map(str, sel))}")
    return ValueError(f"{name}: got {got} values; expected {want} for mask {mask} on dims {tuple(dims)} ({per})")


def check_scales(name: str, values: Any, mask: int, dims: Sequence[int]) -> np.ndarray:
    """Scales as a contiguous 1-D f32 array, after checking their count and finiteness.

    ``values`` may be any array-like of real numbers whose size is the expected count
    (a float, a list, an array of any shape); it is not copied when it already is a
    contiguous f32 array.
    """
    mask = check_mask(name, mask, len(dims))
    flat = _flat_values(name, values)
    want = _count(mask, dims)
    if flat.size != want:
        raise _count_error(name, flat.size, mask, dims, want)
    if flat.dtype == np.float32:  # the usual case, checked on every execute: keep it cheap
        out = np.ascontiguousarray(flat)
    else:
        with np.errstate(over="ignore", invalid="ignore"):  # f64 beyond f32's range becomes inf: caught below
            out = np.ascontiguousarray(flat, dtype=np.float32)
    # A Python loop beats numpy's call overhead for the one or few scales per tensor.
    finite = all(map(math.isfinite, out.tolist())) if out.size <= 16 else bool(np.isfinite(out).all())
    if not finite:
        i = int(np.flatnonzero(~np.isfinite(out))[0])
        raise ValueError(f"{name}: scale {i} is {float(flat[i])!r}, not a finite f32; expected finite scales")
    return out


def check_zero_points(name: str, values: Any, mask: int, dims: Sequence[int],
                      lo: int = S32_MIN, hi: int = S32_MAX) -> np.ndarray:
    """Zero points as a contiguous 1-D int32 array, after checking count, integrality and range."""
    mask = check_mask(name, mask, len(dims))
    flat = _flat_values(name, values)
    want = _count(mask, dims)
    if flat.size != want:
        raise _count_error(name, flat.size, mask, dims, want)
    if flat.dtype.kind == "f" and flat.size:  # (numpy reads an empty list as f64)
        raise TypeError(f"{name}: expected integer (s32) zero points, got dtype {flat.dtype.name}")
    # (an int32 array under s32 bounds, or none at all, cannot be out of range)
    if flat.size and not (flat.dtype == np.int32 and lo <= S32_MIN and hi >= S32_MAX):
        small = flat.tolist() if flat.size <= 16 else None
        low, high = (min(small), max(small)) if small is not None else (int(flat.min()), int(flat.max()))
        if low < lo or high > hi:
            i = next(j for j, v in enumerate(flat.tolist()) if not lo <= v <= hi)
            raise ValueError(f"{name}: zero point {i} is {int(flat[i])}; expected an integer in [{lo}, {hi}]")
    return np.ascontiguousarray(flat, dtype=np.int32)


# ----------------------------------------------------------------------------- post-ops

@dataclass(frozen=True)
class Eltwise:
    """``dst = alg(dst; alpha, beta)`` in f32 (see the module docstring for each alg)."""

    alg: str
    alpha: float = 0.0
    beta: float = 0.0

    def __post_init__(self) -> None:
        _choice("alg", self.alg, ELTWISE_ALGS, "eltwise algorithm")
        object.__setattr__(self, "alpha", _finite("alpha", self.alpha))
        object.__setattr__(self, "beta", _finite("beta", self.beta))
        if self.alg == "clip" and self.alpha > self.beta:
            raise ValueError(f"alpha: clip's lower bound alpha={self.alpha} is above its upper bound "
                             f"beta={self.beta}; expected alpha <= beta")

    kind = "eltwise"

    def verbose_str(self) -> str:
        return f"eltwise_{self.alg}:{self.alpha:g}:{self.beta:g}"


@dataclass(frozen=True)
class Sum:
    """``dst = dst_new + scale * (dst_old - zero_point)``; the old dst read as ``dt``."""

    scale: float = 1.0
    zero_point: int = 0
    dt: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", _finite("scale", self.scale))
        object.__setattr__(self, "zero_point", _int_in("zero_point", self.zero_point, S32_MIN, S32_MAX))
        if self.dt is not None:
            _choice("dt", self.dt, DATA_TYPES, "data type")

    kind = "sum"

    def verbose_str(self) -> str:
        return f"sum:{self.scale:g}:{self.zero_point}" + (f":{self.dt}" if self.dt else "")


@dataclass(frozen=True)
class Binary:
    """``dst = alg(dst, src1)`` with ``src1`` broadcast against dst (dims equal or 1)."""

    alg: str
    src1: MemoryDesc

    def __post_init__(self) -> None:
        _choice("alg", self.alg, BINARY_ALGS, "binary algorithm")
        if not isinstance(self.src1, MemoryDesc):
            raise TypeError(f"src1: expected a MemoryDesc, got {type(self.src1).__name__}")
        if not self.src1.is_plain:
            raise ValueError(f"src1: expected a plain layout for the binary operand, got {self.src1}")
        if self.src1.dt not in BINARY_SRC1_DTS:
            raise ValueError(f"src1: data type {self.src1.dt!r} is not supported for a binary operand; "
                             f"expected one of {', '.join(BINARY_SRC1_DTS)}")

    kind = "binary"

    def verbose_str(self) -> str:
        return f"binary_{self.alg}:{self.src1}"


PostOp = Union[Eltwise, Sum, Binary]
_POST_OP_TYPES = (Eltwise, Sum, Binary)


class PostOps:
    """An ordered chain of post-ops; the builders append and return ``self``.

    >>> len(PostOps().eltwise("clip", 0.0, 6.0).sum())
    2
    """

    __slots__ = ("_entries",)

    def __init__(self, entries: Iterable[PostOp] = ()) -> None:
        entries = tuple(entries)
        for i, e in enumerate(entries):
            if not isinstance(e, _POST_OP_TYPES):
                raise TypeError(f"post_ops[{i}]: expected Eltwise, Sum or Binary, got {type(e).__name__}")
        self._entries: tuple[PostOp, ...] = entries

    def eltwise(self, alg: str, alpha: float = 0.0, beta: float = 0.0) -> "PostOps":
        self._entries += (Eltwise(alg, alpha, beta),)
        return self

    def sum(self, scale: float = 1.0, zero_point: int = 0, dt: str | None = None) -> "PostOps":
        self._entries += (Sum(scale, zero_point, dt),)
        return self

    def binary(self, alg: str, src1_desc: MemoryDesc) -> "PostOps":
        self._entries += (Binary(alg, src1_desc),)
        return self

    @property
    def entries(self) -> tuple[PostOp, ...]:
        return self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        return iter(self._entries)

    def __getitem__(self, i: int) -> PostOp:
        return self._entries[i]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PostOps) and self._entries == other._entries

    __hash__ = None  # mutable builder; use key()

    def key(self) -> tuple:
        """Hashable identity of the chain (the entries are frozen dataclasses)."""
        return self._entries

    def copy(self) -> "PostOps":
        return PostOps(self._entries)

    def binary_args(self) -> dict[str, MemoryDesc]:
        """Execute-args keys of the binary operands, with their descriptors."""
        return {post_op_src1(i): e.src1 for i, e in enumerate(self._entries) if isinstance(e, Binary)}

    def validate(self, dst: MemoryDesc, what: str = "primitive", *,
                 eltwise_algs: Sequence[str] | None = None, binary_algs: Sequence[str] | None = None,
                 max_sums: int | None = 1) -> None:
        """Check the chain against a destination; errors say which entry and why.

        ``eltwise_algs`` / ``binary_algs`` restrict the algorithms to those an
        implementation supports (None: all); ``max_sums`` bounds the sum entries.
        """
        sums = 0
        for i, e in enumerate(self._entries):
            where = f"post_ops[{i}]"
            if isinstance(e, Eltwise) and eltwise_algs is not None and e.alg not in eltwise_algs:
                raise ValueError(f"{where}: {what} cannot do eltwise {e.alg!r}; it supports "
                                 f"{', '.join(eltwise_algs) or 'no eltwise post-op'}")
            if isinstance(e, Sum):
                sums += 1
                if max_sums is not None and sums > max_sums:
                    raise ValueError(f"{where}: {what} supports at most {max_sums} sum post-op(s)")
                if e.dt is not None and numpy_dtype(e.dt).itemsize != dst.itemsize:
                    raise ValueError(f"{where}: sum data type {e.dt!r} has {numpy_dtype(e.dt).itemsize} bytes but "
                                     f"dst is {dst.dt!r} ({dst.itemsize} bytes); expected the same size")
            if isinstance(e, Binary):
                if binary_algs is not None and e.alg not in binary_algs:
                    raise ValueError(f"{where}: {what} cannot do binary {e.alg!r}; it supports "
                                     f"{', '.join(binary_algs) or 'no binary post-op'}")
                s = e.src1.dims
                if len(s) != dst.ndims or any(a not in (1, b) for a, b in zip(s, dst.dims)):
                    raise ValueError(f"{where}: binary src1 dims {s} do not broadcast to dst dims {dst.dims}; "
                                     "expected the same number of dims, each equal to dst's or 1")

    def verbose_str(self) -> str:
        return "+".join(e.verbose_str() for e in self._entries)

    def __repr__(self) -> str:
        return f"PostOps({list(self._entries)!r})"


# ----------------------------------------------------------------------------- attributes

def _arg_name(name: str, arg: Any) -> str:
    if not isinstance(arg, str) or arg not in QUANT_ARGS:
        raise ValueError(f"{name}: unknown argument {arg!r}; expected one of {', '.join(map(repr, QUANT_ARGS))}")
    return arg


def _mask_value(name: str, mask: Any) -> int:
    # The tensor's rank is unknown until a descriptor sees the attributes; bound by MAX_NDIMS.
    return check_mask(name, mask, MAX_NDIMS)


class Attr:
    """Primitive attributes; copied by a primitive descriptor when it is created.

    ``scales`` / ``zero_points`` map argument names to masks. Every setter validates,
    names the argument it rejects, and returns ``self`` so calls chain.
    """

    __slots__ = ("_scales", "_zero_points", "_post_ops", "_scratchpad_mode", "_fpmath_mode", "_policy")

    def __init__(self, scales: Mapping[str, int] | None = None, zero_points: Mapping[str, int] | None = None,
                 post_ops: PostOps | Iterable[PostOp] | None = None, scratchpad_mode: str = "library",
                 fpmath_mode: str = "strict", policy: str = "exact") -> None:
        self._scales: dict[str, int] = {}
        self._zero_points: dict[str, int] = {}
        self._post_ops = PostOps()
        self._scratchpad_mode = "library"
        self._fpmath_mode = "strict"
        self._policy = "exact"
        for arg, mask in _mapping("scales", scales).items():
            self.set_scales_mask(arg, mask)
        for arg, mask in _mapping("zero_points", zero_points).items():
            self.set_zero_points_mask(arg, mask)
        if post_ops is not None:
            self.set_post_ops(post_ops)
        self.set_scratchpad_mode(scratchpad_mode)
        self.set_fpmath_mode(fpmath_mode)
        self.set_policy(policy)

    # -- setters ----------------------------------------------------------------------
    def set_scales_mask(self, arg: str, mask: int | None) -> "Attr":
        """Scales for ``arg`` with ``mask``; ``None`` removes them."""
        arg = _arg_name("scales", arg)
        if mask is None:
            self._scales.pop(arg, None)
        else:
            self._scales[arg] = _mask_value(scales(arg), mask)
        return self

    def set_zero_points_mask(self, arg: str, mask: int | None) -> "Attr":
        """Zero points for ``arg`` with ``mask``; ``None`` removes them."""
        arg = _arg_name("zero_points", arg)
        if mask is None:
            self._zero_points.pop(arg, None)
        else:
            self._zero_points[arg] = _mask_value(zero_points(arg), mask)
        return self

    def set_post_ops(self, post_ops: PostOps | Iterable[PostOp]) -> "Attr":
        if isinstance(post_ops, PostOps):
            self._post_ops = post_ops.copy()
        elif isinstance(post_ops, (list, tuple)):
            self._post_ops = PostOps(post_ops)
        else:
            raise TypeError(f"post_ops: expected PostOps or a list of Eltwise/Sum/Binary, "
                            f"got {type(post_ops).__name__}")
        return self

    def set_scratchpad_mode(self, mode: str) -> "Attr":
        self._scratchpad_mode = _choice("scratchpad_mode", mode, SCRATCHPAD_MODES, "scratchpad mode")
        return self

    def set_fpmath_mode(self, mode: str) -> "Attr":
        """Accepted and recorded; integer computations ignore it, as oneDNN documents."""
        self._fpmath_mode = _choice("fpmath_mode", mode, FPMATH_MODES, "fpmath mode")
        return self

    def set_policy(self, policy: str) -> "Attr":
        self._policy = _choice("policy", policy, POLICIES, "policy")
        return self

    # -- getters ----------------------------------------------------------------------
    @property
    def scales(self) -> dict[str, int]:
        """{argument: mask} (a copy)."""
        return dict(self._scales)

    @property
    def zero_points(self) -> dict[str, int]:
        """{argument: mask} (a copy)."""
        return dict(self._zero_points)

    def scales_mask(self, arg: str) -> int | None:
        return self._scales.get(arg)

    def zero_points_mask(self, arg: str) -> int | None:
        return self._zero_points.get(arg)

    @property
    def post_ops(self) -> PostOps:
        return self._post_ops

    @property
    def scratchpad_mode(self) -> str:
        return self._scratchpad_mode

    @property
    def fpmath_mode(self) -> str:
        return self._fpmath_mode

    @property
    def policy(self) -> str:
        return self._policy

    # -- identity -----------------------------------------------------------------------
    def key(self) -> tuple:
        """Hashable identity, for primitive and kernel caches."""
        return (tuple(sorted(self._scales.items())), tuple(sorted(self._zero_points.items())),
                self._post_ops.key(), self._scratchpad_mode, self._fpmath_mode, self._policy)

    def copy(self) -> "Attr":
        return Attr(self._scales, self._zero_points, self._post_ops, self._scratchpad_mode,
                    self._fpmath_mode, self._policy)

    def is_default(self) -> bool:
        return self.key() == Attr().key()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Attr) and self.key() == other.key()

    __hash__ = None  # mutable; use key()

    def exec_args(self, descs: Mapping[str, MemoryDesc]) -> dict[str, int]:
        """Execute-args keys these attributes add, with the count of values each takes.

        ``descs`` gives the descriptor of every quantized argument (``{"src": md, ...}``).
        Binary post-op operands are listed by :meth:`PostOps.binary_args`.
        """
        out = {}
        for arg, mask in self._scales.items():
            out[scales(arg)] = expected_count(mask, descs[arg].dims)
        for arg, mask in self._zero_points.items():
            out[zero_points(arg)] = expected_count(mask, descs[arg].dims)
        return out

    def validate(self, descs: Mapping[str, MemoryDesc | None], what: str = "primitive", *,
                 scales_args: Sequence[str] = (SRC, WEIGHTS, DST),
                 zero_points_args: Sequence[str] = (SRC, DST),
                 scales_masks: Mapping[str, Sequence[int]] | None = None,
                 zero_points_masks: Mapping[str, Sequence[int]] | None = None,
                 dst: str = DST, **post_ops_limits: Any) -> None:
        """Check the attributes against a primitive's arguments; raise naming what does not fit.

        ``descs`` maps argument names to descriptors; ``*_args`` are the arguments the
        implementation takes scales / zero points for and ``*_masks`` (optional) the
        masks it supports per argument. Post-ops are checked against ``descs[dst]``
        with ``post_ops_limits`` passed on to :meth:`PostOps.validate`.
        """
        for kind, table, allowed, masks in (("scales", self._scales, scales_args, scales_masks),
                                            ("zero_points", self._zero_points, zero_points_args,
                                             zero_points_masks)):
            for arg, mask in table.items():
                key = f"{kind}:{arg}"
                if arg not in allowed:
                    raise ValueError(f"attr {key}: {what} takes no {kind.replace('_', ' ')} for {arg!r}; "
                                     f"it takes them for {', '.join(map(repr, allowed)) or 'no argument'}")
                md = descs.get(arg)
                if md is None:
                    raise ValueError(f"attr {key}: {what} has no {arg!r} argument")
                check_mask(f"attr {key}", mask, md.ndims)
                if masks is not None and arg in masks and mask not in masks[arg]:
                    raise ValueError(f"attr {key}: {what} supports masks {tuple(masks[arg])} for {arg!r}, "
                                     f"got {mask}")
        if len(self._post_ops):
            md = descs.get(dst)
            if md is None:
                raise ValueError(f"attr post_ops: {what} has no {dst!r} argument to apply post-ops to")
            self._post_ops.validate(md, what, **post_ops_limits)

    def verbose_str(self) -> str:
        """Compact text for verbose lines (empty for default attributes)."""
        parts = [f"scales:{a}:{m}" for a, m in sorted(self._scales.items())]
        parts += [f"zero_points:{a}:{m}" for a, m in sorted(self._zero_points.items())]
        if len(self._post_ops):
            parts.append(f"post_ops:{self._post_ops.verbose_str()}")
        if self._scratchpad_mode != "library":
            parts.append(f"scratchpad:{self._scratchpad_mode}")
        if self._fpmath_mode != "strict":
            parts.append(f"fpmath:{self._fpmath_mode}")
        if self._policy != "exact":
            parts.append(f"policy:{self._policy}")
        return " ".join(parts)

    def __repr__(self) -> str:
        return (f"Attr(scales={self._scales}, zero_points={self._zero_points}, post_ops={self._post_ops!r}, "
                f"scratchpad_mode={self._scratchpad_mode!r}, fpmath_mode={self._fpmath_mode!r}, "
                f"policy={self._policy!r})")


def _mapping(name: str, value: Any) -> Mapping[str, int]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{name}: expected a dict of argument -> mask, got {type(value).__name__}")
    return value


__all__ = [
    "SRC", "WEIGHTS", "BIAS", "DST", "SCRATCHPAD", "SRC_1", "QUANT_ARGS",
    "scales", "zero_points", "post_op_src1",
    "ELTWISE_ALGS", "BINARY_ALGS", "SCRATCHPAD_MODES", "FPMATH_MODES", "POLICIES", "BINARY_SRC1_DTS",
    "check_mask", "mask_dims", "expected_count", "check_scales", "check_zero_points",
    "Eltwise", "Sum", "Binary", "PostOp", "PostOps", "Attr",
]
