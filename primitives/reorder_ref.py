"""numpy model of the reorder primitive, written from the quantization seed's formulas.

The quantization model is ``x_f32 = scale_x * (x_int - zp_x)``. A reorder from ``src``
to ``dst`` therefore computes, per element and in f32, in this order::

    x = f32(src)               integers: exact for u8/s8, round to nearest even for s32;
                               bf16: exact (the upper half of an f32)
    x = x - f32(src_zp)        (src_zp converted from s32 to f32, nearest even)
    x = x * src_scale
    x = x / dst_scale          a true f32 division
    x = x + f32(dst_zp)
    dst f32:  x
    dst bf16: x rounded to nearest even bf16 (NaN stays NaN)
    dst u8/s8/s32:
        x = 0 where x is NaN   (NaN has no integer value; int8jit documents 0)
        x = clamp(x, lo, hi)   in f32: u8 [0, 255], s8 [-128, 127],
                               s32 [-2^31, 2147483520] (the largest f32 below 2^31)
        q = round_nearest_even(x)    (ties: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> -0)

A missing attribute is skipped (not applied as 1 or 0), so f32 -> f32 without scales
copies every bit, NaN payloads included. A same-type reorder of an integer type with no
attribute at all is an exact copy (s32 does not pass through f32 then).

Scales and zero points follow oneDNN's masks: mask 0 is one value for the tensor; bit i
set gives one value per index of logical dimension i, and the values of several set
bits are laid out row-major over those dims in logical order. ``expand`` turns such a
vector into an array that broadcasts against the logical tensor.

Example::

    >>> import numpy as np
    >>> reorder_ref(np.array([0.5, 1.5, 2.5, -0.5, 300.0], np.float32), "f32", "u8").tolist()
    [0, 2, 2, 0, 255]
    >>> reorder_ref(np.array([[1, 2], [3, 4]], np.uint8), "u8", "f32",
    ...             src_scale=np.array([0.5, 2.0], np.float32), src_scale_mask=0b10,
    ...             src_zp=np.array([1], np.int32)).tolist()
    [[0.0, 2.0], [1.0, 6.0]]
"""
from __future__ import annotations

import numpy as np

NUMPY_TYPES = {"u8": np.uint8, "s8": np.int8, "s32": np.int32, "f32": np.float32, "bf16": np.uint16}
INT_TYPES = ("u8", "s8", "s32")
F32_BOUNDS = {
    "u8": (np.float32(0.0), np.float32(255.0)),
    "s8": (np.float32(-128.0), np.float32(127.0)),
    "s32": (np.float32(-2147483648.0), np.float32(2147483520.0)),
}


def expand(values, mask: int, dims) -> np.ndarray:
    """Mask-indexed values as an array broadcastable to ``dims`` (shape 1 where a bit is clear)."""
    dims = tuple(dims)
    values = np.asarray(values).reshape(-1)
    kept = [d for i, d in enumerate(dims) if mask >> i & 1]
    count = int(np.prod(kept, dtype=np.int64)) if kept else 1
    if values.size != count:
        raise ValueError(f"mask {mask:#b} over dims {dims} needs {count} values, got {values.size}")
    shape = tuple(d if mask >> i & 1 else 1 for i, d in enumerate(dims))
    return values.reshape(shape)


def to_f32(x: np.ndarray, dt: str) -> np.ndarray:
    """Source values as f32 (bf16 bits widened exactly, integers rounded to nearest even)."""
    x = np.asarray(x)
    if dt == "bf16":
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """f32 to bf16 bit patterns, nearest even; NaN made quiet with its sign kept."""
    x = np.ascontiguousarray(x, np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.where(np.isnan(x), (bits >> 16) | 0x40, rounded).astype(np.uint16)


def from_f32(x: np.ndarray, dt: str) -> np.ndarray:
    """The f32 result stored as ``dt``: rounding and saturation for integer types."""
    x = np.asarray(x, np.float32)
    if dt == "f32":
        return x.copy()
    if dt == "bf16":
        return f32_to_bf16_bits(x)
    lo, hi = F32_BOUNDS[dt]
    x = np.where(np.isnan(x), np.float32(0.0), x)
    x = np.minimum(np.maximum(x, lo), hi)
    # rint is round-half-to-even; every clamped value fits the type (2147483520 < 2^31).
    return np.rint(x).astype(NUMPY_TYPES[dt])


def convert(src, src_dt: str, dst_dt: str, src_scale=None, dst_scale=None, src_zp=None, dst_zp=None):
    """The element-wise formula with attribute arrays already broadcastable to ``src``.

    Scales are f32, zero points s32 (converted to f32 here); ``None`` skips a step.
    """
    src = np.asarray(src)
    if src_dt == dst_dt and src_dt != "f32" and all(a is None for a in (src_scale, dst_scale, src_zp, dst_zp)):
        return src.copy()
    x = to_f32(src, src_dt)
    if src_zp is not None:
        x = x - np.asarray(src_zp, np.int32).astype(np.float32)
    if src_scale is not None:
        x = x * np.asarray(src_scale, np.float32)
    if dst_scale is not None:
        x = x / np.asarray(dst_scale, np.float32)
    if dst_zp is not None:
        x = x + np.asarray(dst_zp, np.int32).astype(np.float32)
    return from_f32(np.broadcast_to(x, src.shape), dst_dt)


def reorder_ref(src, src_dt: str, dst_dt: str, *, src_scale=None, src_scale_mask: int = 0, dst_scale=None,
                dst_scale_mask: int = 0, src_zp=None, src_zp_mask: int = 0, dst_zp=None, dst_zp_mask: int = 0):
    """Reorder of a logical-order array ``src`` (numpy storage of ``src_dt``) to ``dst_dt``.

    Each attribute is a flat vector of values indexed by its mask (see :func:`expand`).
    The result is a new logical-order array of ``dst_dt``'s numpy storage type; the
    memory format of the destination does not change any value.
    """
    src = np.asarray(src)
    dims = src.shape

    def ex(values, mask, dtype):
        return None if values is None else expand(np.asarray(values, dtype), mask, dims)

    return convert(src, src_dt, dst_dt,
                   src_scale=ex(src_scale, src_scale_mask, np.float32),
                   dst_scale=ex(dst_scale, dst_scale_mask, np.float32),
                   src_zp=ex(src_zp, src_zp_mask, np.int32),
                   dst_zp=ex(dst_zp, dst_zp_mask, np.int32))
