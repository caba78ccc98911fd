"""Data types, memory descriptors and memory objects of the primitive API.

A :class:`MemoryDesc` says what a tensor is (logical dims, data type) and how it lies
in memory (a *format tag*). A :class:`Memory` pairs a descriptor with a numpy array
and never copies the array it is given.

Format tags
    A plain tag is a string of distinct letters ``a``, ``b``, ... naming the logical
    dimensions in memory order, outermost first: logical dim ``i`` is letter
    ``chr(ord('a') + i)``. ``"ab"`` is row-major, ``"ba"`` column-major, ``"acdb"`` is
    NHWC for a tensor whose logical dims are (N, C, H, W). Names such as ``"nhwc"`` or
    ``"hwio"`` are aliases (:data:`TAG_ALIASES`). Two tags are not plain:

    * ``"any"``: only in a primitive descriptor's input; the implementation picks the
      layout and the descriptor's queries return a concrete one;
    * ``"packed"``: an implementation's own layout (``layout`` is its opaque, hashable
      record, ``nbytes_packed`` its size); its memory is a flat ``uint8`` buffer.

Logical dims never depend on the layout: the dims of an NHWC tensor are still
(N, C, H, W); only :attr:`MemoryDesc.physical_shape` (the shape in memory order)
changes.

Data types are ``u8``, ``s8``, ``s32``, ``f32`` and ``bf16``; bf16 values are stored
as ``uint16`` (the upper half of the f32 bit pattern), converted with
:func:`f32_to_bf16` (round to nearest even) and :func:`bf16_to_f32` (exact).

Example::

    >>> import numpy as np
    >>> md = desc((2, 3, 4, 5), "u8", "nhwc")
    >>> md.tag, md.perm, md.physical_shape, md.strides, md.nbytes
    ('acdb', (0, 2, 3, 1), (2, 4, 5, 3), (60, 1, 15, 3), 120)
    >>> buf = np.arange(120, dtype=np.uint8).reshape(2, 4, 5, 3)   # N, H, W, C in memory
    >>> mem = Memory(md, buf)
    >>> np.shares_memory(mem.array, buf), mem.logical().shape       # wrapped, not copied
    (True, (2, 3, 4, 5))
    >>> int(mem.logical()[0, 1, 0, 0])     # n=0, c=1, h=0, w=0 is the second byte
    1
    >>> bits = f32_to_bf16(np.array([1.0, 1.00390625, 3.0e38], np.float32))
    >>> [hex(b) for b in bits], bf16_to_f32(bits)[:2].tolist()
    (['0x3f80', '0x3f80', '0x7f62'], [1.0, 1.0])
"""
from __future__ import annotations

import math
import mmap
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import numpy as np

from primitives.checks import dtype_text

DATA_TYPES: tuple[str, ...] = ("u8", "s8", "s32", "f32", "bf16")

# bf16 has no numpy type: it is kept as its 16 raw bits.
_NUMPY: dict[str, np.dtype] = {
    "u8": np.dtype(np.uint8),
    "s8": np.dtype(np.int8),
    "s32": np.dtype(np.int32),
    "f32": np.dtype(np.float32),
    "bf16": np.dtype(np.uint16),
}
_FROM_NUMPY: dict[np.dtype, str] = {v: k for k, v in _NUMPY.items()}

# The integer types' ranges, for saturation and zero-point checks.
INT_RANGES: dict[str, tuple[int, int]] = {
    "u8": (0, 255),
    "s8": (-128, 127),
    "s32": (-(2 ** 31), 2 ** 31 - 1),
}

ALIGNMENT = 64  # bytes: one cache line, and one ZMM register
MAX_NDIMS = 12  # as many as a mask of a 12-bit int can address; oneDNN has the same bound

ANY = "any"
PACKED = "packed"
# A dim known only at execution (oneDNN's DNNL_RUNTIME_DIM_VAL, INT64_MIN): a matmul's M
# and batch (primitives.matmul). A descriptor holding one makes no Memory.
RUNTIME_DIM = -(2 ** 63)

TAG_ALIASES: dict[str, str] = {
    "x": "a",
    "nc": "ab", "cn": "ba", "oi": "ab", "io": "ba",
    "tnc": "abc", "ntc": "bac",
    "ncw": "abc", "nwc": "acb", "oiw": "abc", "wio": "cba", "owi": "acb",
    "nchw": "abcd", "nhwc": "acdb", "chwn": "bcda",
    "oihw": "abcd", "hwio": "cdba", "ohwi": "acdb", "ihwo": "bcda", "iohw": "bacd",
    "ncdhw": "abcde", "ndhwc": "acdeb",
    "oidhw": "abcde", "dhwio": "cdeba", "odhwi": "acdeb",
    "goiw": "abcd", "goihw": "abcde", "hwigo": "decab", "gohwi": "abdec",
}


# ----------------------------------------------------------------------------- data types

def check_dt(dt: Any, name: str = "dt") -> str:
    """The canonical data-type name of ``dt`` (a name or a numpy dtype), or a ValueError."""
    if isinstance(dt, str):
        if dt in _NUMPY:
            return dt
        raise ValueError(f"{name}: unknown data type {dt!r}; expected one of {', '.join(DATA_TYPES)}")
    try:
        return data_type_of(dt)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: unknown data type {dt!r}; expected one of {', '.join(DATA_TYPES)} "
                         f"(or numpy uint8, int8, int32, float32, uint16 for bf16)") from None


def numpy_dtype(dt: str) -> np.dtype:
    """The numpy storage type of a data type (``bf16`` is stored as ``uint16``).

    >>> numpy_dtype("s8"), numpy_dtype("bf16")
    (dtype('int8'), dtype('uint16'))
    """
    return _NUMPY[check_dt(dt)]


def data_type_of(dtype: Any) -> str:
    """The data-type name of a numpy dtype (``uint16`` reads as ``bf16``).

    >>> data_type_of(np.int32), data_type_of(np.zeros(1, np.uint16).dtype)
    ('s32', 'bf16')
    """
    try:
        npdt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype: expected a numpy dtype, got {dtype!r}") from None
    if npdt not in _FROM_NUMPY:
        raise ValueError(f"dtype: numpy {npdt.name} has no int8jit data type; expected one of "
                         "uint8 (u8), int8 (s8), int32 (s32), float32 (f32), uint16 (bf16)")
    return _FROM_NUMPY[npdt]


def itemsize(dt: str) -> int:
    """Bytes per element of a data type."""
    return numpy_dtype(dt).itemsize


def dt_range(dt: str) -> tuple[int, int]:
    """(lowest, highest) value of an integer data type.

    >>> dt_range("u8"), dt_range("s8")
    ((0, 255), (-128, 127))
    """
    dt = check_dt(dt)
    if dt not in INT_RANGES:
        raise ValueError(f"dt: {dt!r} is not an integer data type; expected one of {', '.join(INT_RANGES)}")
    return INT_RANGES[dt]


def f32_to_bf16(x: Any) -> np.ndarray:
    """f32 values to bf16 bit patterns (``uint16``), rounded to nearest, ties to even.

    NaNs stay NaNs (made quiet, so rounding cannot carry them into infinity); values
    that round above bf16's largest finite value become infinity, as in IEEE rounding.
    """
    a = np.ascontiguousarray(x, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    # Adding 0x7FFF plus the lowest kept bit rounds to nearest and breaks ties to even.
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    quiet_nan = (bits >> 16) | 0x0040
    out = np.where(np.isnan(a), quiet_nan, rounded).astype(np.uint16)
    return out


def bf16_to_f32(bits: Any) -> np.ndarray:
    """bf16 bit patterns (``uint16``) to f32 values (exact: bf16 is a truncated f32)."""
    b = np.asarray(bits)
    if b.dtype != np.uint16:
        raise TypeError(f"bits: expected uint16 bf16 bit patterns, got dtype {b.dtype.name}")
    return (b.astype(np.uint32) << 16).view(np.float32)


def round_to_bf16(x: Any) -> np.ndarray:
    """f32 values rounded to the nearest bf16 value, returned as f32."""
    return bf16_to_f32(f32_to_bf16(x))


# ----------------------------------------------------------------------------- format tags

def identity_tag(ndims: int) -> str:
    """The row-major tag of ``ndims`` dims: ``"ab"``, ``"abcd"``..."""
    return "".join(chr(ord("a") + i) for i in range(ndims))


def normalize_tag(tag: Any, ndims: int, name: str = "tag") -> str:
    """The canonical form of ``tag`` for a tensor of ``ndims`` dims: letters, ``any`` or ``packed``.

    >>> normalize_tag("nhwc", 4), normalize_tag("ba", 2), normalize_tag("any", 3)
    ('acdb', 'ba', 'any')
    """
    if not isinstance(tag, str):
        raise TypeError(f"{name}: expected a format tag string, got {type(tag).__name__} {tag!r}")
    t = tag.strip().lower()
    if t in (ANY, PACKED):
        return t
    letters = TAG_ALIASES.get(t, t)
    if not letters or not letters.isalpha() or sorted(letters) != list(identity_tag(len(letters))):
        raise ValueError(
            f"{name}: {tag!r} is not a format tag; expected 'any', an alias "
            f"({', '.join(sorted(TAG_ALIASES))}) or distinct letters 'a', 'b', ... in memory order "
            f"such as {identity_tag(max(ndims, 1))!r}")
    if len(letters) != ndims:
        shown = f"{tag!r}" + (f" (= {letters!r})" if letters != t else "")
        raise ValueError(f"{name}: {shown} describes {len(letters)} dimensions but the tensor has {ndims}; "
                         f"expected a tag of {ndims} letters such as {identity_tag(ndims)!r}")
    return letters


def tag_of_perm(perm: Sequence[int]) -> str:
    """The plain tag whose memory order is ``perm`` (logical dims, outermost first)."""
    return "".join(chr(ord("a") + int(i)) for i in perm)


def _c_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = []
    step = 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(int(extent), 1)
    return tuple(reversed(strides))


# ----------------------------------------------------------------------------- descriptors

@dataclass(frozen=True)
class MemoryDesc:
    """A tensor's logical dims, data type and memory format (immutable, hashable).

    ``tag`` is normalised: plain letters (``"acdb"``), ``"any"`` or ``"packed"``.
    ``layout`` is the implementation's record of a packed layout (``None`` otherwise)
    and ``nbytes_packed`` its size in bytes. Use :func:`desc` to build one from user
    input: it validates each argument and names it when it does not fit.
    """

    dims: tuple[int, ...]
    dt: str
    tag: str = ANY
    layout: Hashable | None = None
    nbytes_packed: int = 0

    def __post_init__(self) -> None:
        # Normalise in place (frozen dataclass) so that equal descriptors hash equally
        # whatever the caller passed: numpy ints, a list of dims, a numpy dtype, an alias.
        dims = self.dims
        if isinstance(dims, (int, np.integer)) and not isinstance(dims, bool):
            dims = (dims,)
        if not isinstance(dims, (tuple, list)):
            raise TypeError(f"dims: expected a tuple of integers, got {type(dims).__name__} {dims!r}")
        norm = []
        for i, d in enumerate(dims):
            if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 and d != RUNTIME_DIM:
                raise ValueError(f"dims: dimension {i} is {d!r}; expected a non-negative integer (dims {tuple(dims)!r})")
            norm.append(int(d))
        if len(norm) > MAX_NDIMS:
            raise ValueError(f"dims: {len(norm)} dimensions; at most {MAX_NDIMS} are supported")
        object.__setattr__(self, "dims", tuple(norm))
        object.__setattr__(self, "dt", check_dt(self.dt))
        tag = normalize_tag(self.tag, len(norm))
        object.__setattr__(self, "tag", tag)
        if tag == PACKED:
            if self.layout is None:
                raise ValueError("layout: a 'packed' descriptor needs the implementation's layout record")
            if isinstance(self.nbytes_packed, bool) or not isinstance(self.nbytes_packed, (int, np.integer)) \
                    or self.nbytes_packed <= 0:
                raise ValueError(f"nbytes_packed: expected a positive byte count for a 'packed' descriptor, "
                                 f"got {self.nbytes_packed!r}")
            object.__setattr__(self, "nbytes_packed", int(self.nbytes_packed))
        elif self.layout is not None or self.nbytes_packed:
            raise ValueError(f"layout: only a 'packed' descriptor carries a layout record and nbytes_packed; "
                             f"tag is {tag!r}")
        try:
            hash(self.layout)
        except TypeError:
            raise TypeError(f"layout: expected a hashable record, got {type(self.layout).__name__}") from None
        # Derived once: execute() looks these up on every call. Not dataclass fields, so
        # they take no part in equality or hashing.
        storage = None
        runtime = RUNTIME_DIM in norm
        object.__setattr__(self, "runtime", runtime)
        if runtime and tag == PACKED:
            raise ValueError("dims: a packed descriptor's dims are all known")
        if tag == PACKED:
            storage = ((self.nbytes_packed,), np.dtype(np.uint8))
        elif tag != ANY:
            perm = tuple(ord(c) - ord("a") for c in tag)
            object.__setattr__(self, "_perm", perm)
            object.__setattr__(self, "_physical", tuple(norm[i] for i in perm))
            storage = (self._physical, _NUMPY[self.dt])
        if runtime:  # (no Memory: its shape is known at execution)
            storage = None
        object.__setattr__(self, "_storage", storage)  # (shape, dtype) of a Memory's array

    # -- shape ---------------------------------------------------------------------------
    @property
    def ndims(self) -> int:
        return len(self.dims)

    @property
    def size(self) -> int:
        """Number of elements (the product of dims)."""
        return math.prod(self.dims)

    @property
    def is_any(self) -> bool:
        return self.tag == ANY

    @property
    def is_packed(self) -> bool:
        return self.tag == PACKED

    @property
    def is_plain(self) -> bool:
        return self.tag not in (ANY, PACKED)

    @property
    def itemsize(self) -> int:
        return _NUMPY[self.dt].itemsize

    @property
    def numpy_dtype(self) -> np.dtype:
        """Storage dtype of one element (``uint8`` bytes for a packed descriptor)."""
        return np.dtype(np.uint8) if self.is_packed else _NUMPY[self.dt]

    def _need_plain(self, what: str) -> None:
        if not self.is_plain:
            hint = ("query the primitive descriptor for the layout it chose" if self.is_any
                    else "reorder it to a plain tag")
            raise ValueError(f"md: a {self.tag!r} descriptor has no {what}; {hint}")

    @property
    def perm(self) -> tuple[int, ...]:
        """Logical dims in memory order, outermost first (``acdb`` -> ``(0, 2, 3, 1)``)."""
        self._need_plain("memory order")
        return self._perm

    @property
    def physical_shape(self) -> tuple[int, ...]:
        """The shape in memory order (``(nbytes_packed,)`` for a packed descriptor)."""
        if self.is_packed:
            return (self.nbytes_packed,)
        self._need_plain("physical shape")
        return self._physical

    @property
    def strides(self) -> tuple[int, ...]:
        """Element strides per *logical* dim (dense, no padding)."""
        phys = _c_strides(self.physical_shape)
        out = [0] * self.ndims
        for pos, dim in enumerate(self.perm):
            out[dim] = phys[pos]
        return tuple(out)

    @property
    def nbytes(self) -> int:
        """Bytes of storage the tensor needs."""
        if self.is_packed:
            return self.nbytes_packed
        self._need_plain("size")
        return self.size * self.itemsize

    # -- derived descriptors ------------------------------------------------------------
    def with_tag(self, tag: str) -> "MemoryDesc":
        """The same dims and data type in another plain tag (or ``any``)."""
        return MemoryDesc(self.dims, self.dt, tag)

    def with_dt(self, dt: str) -> "MemoryDesc":
        """The same dims and layout with another data type (not for packed descriptors)."""
        if self.is_packed:
            raise ValueError("md: a packed descriptor's data type belongs to its layout; cannot change it")
        return MemoryDesc(self.dims, dt, self.tag)

    def same_layout(self, other: "MemoryDesc") -> bool:
        """Whether memory of ``other`` can be read as this descriptor: same dims, type, bytes.

        Plain tags are compared by strides, so ``ab`` and ``ba`` agree on a (1, n) tensor.
        """
        if self.dims != other.dims or self.dt != other.dt:
            return False
        if self.is_plain and other.is_plain:
            # Dims of extent 1 may sit anywhere in memory order without moving a byte.
            return all(s == o for s, o, d in zip(self.strides, other.strides, self.dims) if d > 1)
        return self == other

    def verbose_str(self) -> str:
        """Compact text for verbose lines: ``s8:ab:2x3`` (a runtime dim: ``*``, as oneDNN's)."""
        dims = "x".join("*" if d == RUNTIME_DIM else str(d) for d in self.dims)
        return f"{self.dt}:{self.tag}:{dims or 'scalar'}"

    def __str__(self) -> str:
        return self.verbose_str()


def desc(dims: Sequence[int] | int, dt: str, tag: str = ANY) -> MemoryDesc:
    """A validated plain (or ``any``) descriptor: dims non-negative integers, dt and tag known.

    A dim of 0 makes a zero-volume tensor, as in oneDNN: each primitive says which of
    its dims may be 0 (a batch, say) and runs such a problem as a no-op. ``RUNTIME_DIM``
    marks a dim given at execution (a matmul's M and batch; other primitives refuse it).

    >>> desc((2, 3), "s8", "ab").strides
    (3, 1)
    >>> desc((2, 3), "s8", "nchw")
    Traceback (most recent call last):
    ...
    ValueError: tag: 'nchw' (= 'abcd') describes 4 dimensions but the tensor has 2; expected a tag of 2 letters such as 'ab'
    """
    if isinstance(dims, (int, np.integer)) and not isinstance(dims, bool):
        dims = (dims,)
    if not isinstance(dims, (tuple, list)) or not dims:
        raise ValueError(f"dims: expected a non-empty tuple of non-negative integers, got {dims!r}")
    for i, d in enumerate(dims):
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 and d != RUNTIME_DIM:
            raise ValueError(f"dims: dimension {i} is {d!r}; expected a non-negative integer (dims {tuple(dims)!r})")
    if isinstance(tag, str) and tag.strip().lower() == PACKED:
        raise ValueError("tag: 'packed' descriptors come from an implementation (packed_desc), not from users")
    return MemoryDesc(tuple(dims), check_dt(dt), tag)


def packed_desc(dims: Sequence[int], dt: str, layout: Hashable, nbytes: int) -> MemoryDesc:
    """An implementation's packed descriptor: logical ``dims``/``dt`` plus its layout record."""
    return MemoryDesc(tuple(dims), dt, PACKED, layout=layout, nbytes_packed=nbytes)


def bytes_desc(nbytes: int) -> MemoryDesc:
    """A 1-D ``u8`` descriptor of ``nbytes`` bytes (0 allowed): scratchpad queries use it."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
        raise ValueError(f"nbytes: expected a non-negative integer, got {nbytes!r}")
    return MemoryDesc((int(nbytes),), "u8", "a")


# ----------------------------------------------------------------------------- allocation

HUGE_PAGE = 1 << 21  # x86-64's 2 MiB page


def aligned_zeros(shape: Sequence[int] | int, dtype: Any = np.uint8, alignment: int = ALIGNMENT) -> np.ndarray:
    """A zeroed C-contiguous array whose first byte is ``alignment``-byte aligned.

    >>> a = aligned_zeros((3, 5), np.int32)
    >>> a.ctypes.data % 64, a.shape, a.flags.c_contiguous
    (0, (3, 5), True)
    """
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    if alignment < 1 or alignment & (alignment - 1):
        raise ValueError(f"alignment: expected a power of two, got {alignment!r}")
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= HUGE_PAGE // 2 and alignment <= HUGE_PAGE:
        return huge_page_zeros(nbytes).view(dtype).reshape(tuple(shape))
    # Over-allocate and slice: numpy guarantees only 16-byte alignment.
    raw = np.zeros(nbytes + alignment, np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start:start + nbytes].view(dtype).reshape(tuple(shape))


def huge_page_zeros(nbytes: int) -> np.ndarray:
    """``nbytes`` zeroed bytes from a 2 MiB boundary, in a mapping advised to take
    transparent huge pages (where the kernel has them; 4 KiB pages otherwise).

    Why: on 4 KiB pages, where a large buffer's lines fall in the physically indexed
    caches is luck. The ResNet-50 fc's 2 MB of packed weights, called again and again at
    batch 1, ran 28-54 us depending on the allocation on a Xeon with a 2 MB L2, and 35-37
    us on huge pages. (Linux gives anonymous memory huge pages only where advised, unless
    its setting is ``always``.) The cost: a buffer of 1-2 MiB occupies a whole huge page.
    The array keeps its mapping alive.

    >>> a = huge_page_zeros(3 << 20)
    >>> a.ctypes.data % HUGE_PAGE, a.nbytes, int(a.max()), a.flags.writeable
    (0, 3145728, 0, True)
    """
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    # Anonymous private memory is zeroed. One spare huge page of address space lets the
    # data start on a boundary; what lies before the start is never touched, so never backed.
    area = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(area, np.uint8)
    start = (-raw.ctypes.data) % HUGE_PAGE
    if hasattr(area, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            area.madvise(mmap.MADV_HUGEPAGE, start, size)
        except OSError:  # a kernel built without transparent huge pages
            pass
    return raw[start:start + nbytes]


# ----------------------------------------------------------------------------- memory

def _tag_of_array(array: np.ndarray, name: str) -> str:
    """The plain tag under which a dense (possibly transposed) array lies in memory."""
    if array.flags.c_contiguous:
        return identity_tag(array.ndim)
    item = array.itemsize
    # Memory order = logical dims by decreasing stride; dims of extent 1 do not matter.
    order = sorted(range(array.ndim), key=lambda i: (-array.strides[i], i))
    expect = _c_strides([array.shape[i] for i in order])
    if all(array.strides[d] == s * item or array.shape[d] == 1 for d, s in zip(order, expect)):
        return tag_of_perm(order)
    raise ValueError(f"{name}: the array is not dense in memory (shape {array.shape}, byte strides "
                     f"{array.strides}); expected a C-contiguous array or a transpose of one")


class Memory:
    """A tensor: a :class:`MemoryDesc` and a numpy array holding its bytes, never copied.

    ``array`` may be

    * shaped as ``md.physical_shape`` (memory order) and C-contiguous,
    * a C-contiguous 1-D array of ``md.size`` elements (``md.nbytes`` ``uint8`` for a
      packed descriptor),
    * shaped as the logical dims with exactly ``md``'s strides (e.g. ``x.T`` of a
      row-major ``x`` for a ``"ba"`` descriptor); it is checked before the last form,
      so a square C-contiguous array always reads as memory order;
    * ``None``: zeroed storage aligned to 64 bytes is allocated.

    ``payload`` is free for the implementation that filled a packed memory (e.g. the
    packed weights' compensation vectors); Memory never looks at it.
    """

    __slots__ = ("_desc", "_array", "payload", "__weakref__")  # (a replay's record holds it weakly)

    def __init__(self, md: MemoryDesc, array: np.ndarray | None = None, *, payload: Any = None,
                 name: str = "array") -> None:
        if not isinstance(md, MemoryDesc):
            raise TypeError(f"md: expected a MemoryDesc, got {type(md).__name__}")
        if md._storage is None:
            if md.runtime:
                raise ValueError(f"md: cannot make memory for {md}, which has a runtime dim (RUNTIME_DIM); "
                                 "a Memory's dims are all known")
            raise ValueError(f"md: cannot make memory for {md} whose tag is 'any'; "
                             "query the primitive descriptor for the concrete layout")
        self._desc = md
        self.payload = payload
        shape, dtype = md._storage
        if array is None:
            try:
                self._array = aligned_zeros(shape, dtype)
            except (MemoryError, OverflowError, OSError) as exc:  # (numpy's, or mmap's for huge pages)
                raise MemoryError(f"md: {md} needs {math.prod(shape) * dtype.itemsize} bytes, which could not be "
                                  f"allocated ({type(exc).__name__}: {exc})") from None
            return
        if not isinstance(array, np.ndarray):
            raise TypeError(f"{name}: expected a numpy array, got {type(array).__name__}")
        if array.dtype != dtype:
            want = f"{dtype.name} ({'packed bytes' if md.is_packed else md.dt})"
            raise TypeError(f"{name}: expected dtype {want}, got {dtype_text(array.dtype)}")
        if array.shape == shape and array.flags.c_contiguous:
            self._array = array  # the common case, taken as it is
        else:
            self._array = self._fit(md, array, shape, name)

    @classmethod
    def trusted(cls, md: MemoryDesc, array: np.ndarray) -> "Memory":
        """Wrap an array the caller has already checked against ``md`` (dense, physical
        shape, dtype): the hot path of ``Primitive.execute``, without the checks."""
        mem = cls.__new__(cls)
        mem._desc, mem._array, mem.payload = md, array, None
        return mem

    @staticmethod
    def _fit(md: MemoryDesc, array: np.ndarray, shape: tuple[int, ...], name: str) -> np.ndarray:
        if array.flags.c_contiguous and (array.shape == shape or
                                         (array.ndim == 1 and array.size == math.prod(shape))):
            return array.reshape(shape)  # C-contiguous: a view, never a copy
        if md.is_plain and array.shape == md.dims:
            want = tuple(s * array.itemsize for s in md.strides)
            # (an empty array's strides say nothing: numpy may give it any)
            if array.size == 0 or all(a == w or d == 1 for a, w, d in zip(array.strides, want, md.dims)):
                view = array.transpose(md.perm)
                if view.flags.c_contiguous:
                    return view
        expected = f"a C-contiguous array of shape {shape} (memory order of tag {md.tag!r})"
        if md.is_plain:
            expected += f", or of logical shape {md.dims} with element strides {md.strides}"
        expected += f", or a contiguous 1-D array of {math.prod(shape)} elements"
        raise ValueError(f"{name}: got shape {array.shape} with byte strides {array.strides}; expected "
                         f"{expected} for {md}")

    @property
    def desc(self) -> MemoryDesc:
        return self._desc

    @property
    def array(self) -> np.ndarray:
        """The data in memory order (physical shape), C-contiguous."""
        return self._array

    @property
    def data(self) -> np.ndarray:
        """The data as a flat contiguous 1-D view."""
        return self._array.reshape(-1)

    @property
    def nbytes(self) -> int:
        return self._array.nbytes

    @property
    def address(self) -> int:
        """Address of the first byte (for kernel calls)."""
        return self._array.ctypes.data

    def logical(self) -> np.ndarray:
        """A view with axes in logical dim order (``np.transpose`` of :attr:`array`)."""
        md = self._desc
        if not md.is_plain:
            raise ValueError(f"memory: {md} is packed and has no logical view; reorder it to a plain tag")
        inverse = np.argsort(md.perm)
        return self._array.transpose(tuple(int(i) for i in inverse))

    def __repr__(self) -> str:
        return f"Memory({self._desc}, address=0x{self.address:x})"


def as_memory(x: Memory | np.ndarray | Any, name: str, md: MemoryDesc | None = None) -> Memory:
    """``x`` as a :class:`Memory` without copying; checked against ``md`` when given.

    An ndarray without ``md`` becomes a plain memory whose tag follows its strides
    (C-contiguous: ``ab...``; a transpose of one: the permuted tag). Errors name
    ``name``.

    >>> m = as_memory(np.zeros((4, 3), np.int8).T, "weights")
    >>> m.desc.tag, m.desc.dims
    ('ba', (3, 4))
    >>> as_memory(np.zeros((4, 3), np.int8), "weights", desc((4, 3), "u8", "ab"))
    Traceback (most recent call last):
    ...
    TypeError: weights: expected dtype uint8 (u8), got int8
    """
    if md is not None and not isinstance(md, MemoryDesc):
        raise TypeError(f"md: expected a MemoryDesc or None, got {type(md).__name__}")
    if isinstance(x, Memory):
        if md is not None and not (md.is_any and x.desc.dims == md.dims and x.desc.dt == md.dt) \
                and not md.same_layout(x.desc):
            if x.desc.is_packed and md.is_packed:  # (their texts agree: say which layouts differ)
                raise ValueError(f"{name}: memory is packed as {x.desc.layout!r}; this primitive reads "
                                 f"{md.layout!r} (reorder the weights into its weights_desc())")
            raise ValueError(f"{name}: memory is {x.desc}; expected {md}")
        return x
    if isinstance(x, np.generic):  # a numpy scalar (e.g. one scale): a 1-element array
        x = np.asarray(x)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a Memory or a numpy array, got {type(x).__name__}")
    if md is not None and not md.is_any:
        return Memory(md, x, name=name)
    if x.ndim == 0:
        x = x.reshape(1)
    dt = _dt_for(x, name)
    own = MemoryDesc(x.shape, dt, _tag_of_array(x, name))
    if md is not None and (own.dims != md.dims or own.dt != md.dt):
        raise ValueError(f"{name}: array is {own}; expected dims {md.dims} and data type {md.dt}")
    return Memory(own, x, name=name)


def _dt_for(x: np.ndarray, name: str) -> str:
    try:
        return data_type_of(x.dtype)
    except ValueError:
        raise TypeError(f"{name}: numpy {x.dtype.name} has no int8jit data type; expected one of "
                        "uint8, int8, int32, float32, uint16 (bf16)") from None


__all__ = [
    "DATA_TYPES", "INT_RANGES", "ALIGNMENT", "MAX_NDIMS", "ANY", "PACKED", "RUNTIME_DIM", "TAG_ALIASES",
    "check_dt", "numpy_dtype", "data_type_of", "itemsize", "dt_range",
    "f32_to_bf16", "bf16_to_f32", "round_to_bf16",
    "identity_tag", "normalize_tag", "tag_of_perm", "MemoryDesc", "desc", "packed_desc", "bytes_desc",
    "aligned_zeros", "huge_page_zeros", "Memory", "as_memory",
]
