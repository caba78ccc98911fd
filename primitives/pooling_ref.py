"""numpy reference of int8 pooling: the bit-exact model of ``jit.pooling_kernel``.

Channels-last arrays ``(N, *spatial, C)`` (any number of spatial dimensions). For every
output position the window is ``o*stride - padding_l + k`` for ``k`` in ``0..kernel-1``
along each spatial dimension; positions outside the input are padding:

* ``max``: padding is -inf (ignored); every window overlaps the input at least once.
* ``avg_include_padding``: ``sum / (product of the kernel sizes)``.
* ``avg_exclude_padding``: ``sum / (number of valid input positions in the window)``.

Averages: the sum is exact in s32; the division is IEEE single precision,
``f32(sum) / f32(divisor)`` rounded once to f32 (VCVTDQ2PS, VDIVPS); ``f32`` output is that
quotient, ``s32`` output rounds it to the nearest integer, ties to even (VCVTPS2DQ under
the default MXCSR), and ``u8``/``s8`` output rounds the same way and then saturates to the
type (the packs; an average of in-range values never actually needs it). For windows of
fewer than 2**16 elements this equals the exact rational average rounded to nearest
even: a quotient n/d that is not a tie lies at least 1/(2d) from one, far more than the
f32 rounding error of a value below 256.
"""
from __future__ import annotations

import itertools

import numpy as np

ALGS = ("max", "avg_include_padding", "avg_exclude_padding")
_RANGES = {"u8": (0, 255, np.uint8), "s8": (-128, 127, np.int8)}


def out_size(i: int, k: int, s: int, pl: int, pr: int) -> int:
    return (i + pl + pr - k) // s + 1


def pooling_ref(src: np.ndarray, alg: str, kernel, strides, padding_l, padding_r, dst_dt: str | None = None
                ) -> np.ndarray:
    """Pool a channels-last u8/s8 array ``(N, *spatial, C)``; returns ``(N, *out, C)``."""
    src_dt = {np.dtype(np.uint8): "u8", np.dtype(np.int8): "s8"}[src.dtype]
    dst_dt = dst_dt or src_dt
    if alg not in ALGS:
        raise ValueError(f"alg: expected one of {ALGS}, got {alg!r}")
    spatial = src.shape[1:-1]
    nd = len(spatial)
    kernel, strides = tuple(kernel), tuple(strides)
    padding_l, padding_r = tuple(padding_l), tuple(padding_r)
    outs = tuple(out_size(spatial[d], kernel[d], strides[d], padding_l[d], padding_r[d]) for d in range(nd))
    x = src.astype(np.int64)
    shape = (src.shape[0],) + outs + (src.shape[-1],)
    acc = np.full(shape, -(2**40) if alg == "max" else 0, np.int64)
    count = np.zeros((1,) + outs + (1,), np.int64)
    for offs in itertools.product(*(range(k) for k in kernel)):
        g = x
        valid = np.ones((1,) * (nd + 2), bool)
        for d in range(nd):
            idx = np.arange(outs[d]) * strides[d] - padding_l[d] + offs[d]
            ok = (idx >= 0) & (idx < spatial[d])
            g = np.take(g, np.clip(idx, 0, spatial[d] - 1), axis=d + 1)
            vshape = [1] * (nd + 2)
            vshape[d + 1] = outs[d]
            valid = valid & ok.reshape(vshape)
        if alg == "max":
            acc = np.where(valid, np.maximum(acc, g), acc)
        else:
            acc = acc + np.where(valid, g, 0)
        count = count + valid
    if count.min() < 1:
        raise ValueError("a window lies entirely in the padding")
    if alg == "max":
        return acc.astype(_RANGES[src_dt][2])
    divisor = np.int64(np.prod(kernel)) if alg == "avg_include_padding" else count
    q = acc.astype(np.float32) / np.asarray(divisor).astype(np.float32)
    if dst_dt == "f32":
        return q.astype(np.float32)
    r = np.rint(q)  # round half to even, as VCVTPS2DQ
    if dst_dt == "s32":
        return r.astype(np.int32)
    lo, hi, dtype = _RANGES[dst_dt]
    return np.clip(r, lo, hi).astype(dtype)
