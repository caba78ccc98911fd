"""numpy models of what each kernel path must compute, bit for bit.

These are the specifications the tests hold the generated code to:

- :func:`gemm_exact` is the mathematical int32 result of oneDNN's GEMM semantics,
  ``C = alpha * (op(A) - ao)(op(B) - bo) + beta * C + co``.
- :func:`dot_u8s8_maddubsw` models VPMADDUBSW + VPMADDWD: products of each pair of
  consecutive K values (k even, k+1) are added into s16 WITH saturation before the
  pairs are added in s32, exactly as the hardware pairs bytes in the packed layout.
- :func:`output_pipeline` models ``jit.output``'s operations in their order, in f32;
  :func:`output_stage` maps the GEMM's alpha, beta and co onto it.

Example::

    >>> import numpy as np
    >>> a = np.array([[255, 255, 0, 0]], np.uint8); b = np.array([[127], [127], [0], [0]], np.int8)
    >>> int(dot_u8s8_exact(a, b)[0, 0]), int(dot_u8s8_maddubsw(a, b)[0, 0])
    (64770, 32767)
"""
from __future__ import annotations

import math

import numpy as np

INT32_UPPER_F32 = np.float32(2147483520.0)
INT32_LOWER_F32 = np.float32(-2147483648.0)


def wrap_int32(x: np.ndarray) -> np.ndarray:
    """Two's-complement wrap of an integer array to int32."""
    return np.asarray(x, dtype=np.int64).astype(np.uint32).astype(np.int32) if np.asarray(x).size else np.asarray(x, np.int32)


def shift_s8(a: np.ndarray) -> np.ndarray:
    """s8 -> u8 by +128 (the byte xor 0x80 the kernels apply to s8 sources)."""
    return (a.astype(np.int16) + 128).astype(np.uint8)


def dot_u8s8_exact(a_u8: np.ndarray, b_s8: np.ndarray) -> np.ndarray:
    """sum_k a[m,k] * b[k,n] in int64 (VPDPBUSD and the widening path compute this)."""
    return a_u8.astype(np.int64) @ b_s8.astype(np.int64)


def dot_u8s8_maddubsw(a_u8: np.ndarray, b_s8: np.ndarray) -> np.ndarray:
    """VPMADDUBSW pairing: s16-saturated sums of the products of k = 2j and 2j+1."""
    m, k = a_u8.shape
    n = b_s8.shape[1]
    kp = (k + 1) // 2 * 2
    a = np.zeros((m, kp), np.int64)
    b = np.zeros((kp, n), np.int64)
    a[:, :k] = a_u8
    b[:k] = b_s8
    total = np.zeros((m, n), np.int64)
    for j in range(0, kp, 2):
        pair = np.outer(a[:, j], b[j]) + np.outer(a[:, j + 1], b[j + 1])
        total += np.clip(pair, -32768, 32767)
    return total


def op(x: np.ndarray, trans: str, rows: int, cols: int, ld: int) -> np.ndarray:
    """The logical rows x cols matrix of a row-major buffer with leading dimension ld."""
    flat = np.ravel(x)
    if trans.upper() == "N":
        idx = np.arange(rows)[:, None] * ld + np.arange(cols)[None, :]
    else:
        idx = np.arange(cols)[None, :] * ld + np.arange(rows)[:, None]
    return flat[idx]


def gemm_sum(a: np.ndarray, b: np.ndarray, ao: int, bo: int, faithful: bool) -> np.ndarray:
    """sum_k (a - ao)(b - bo) as the kernels compute it (int64, before wrapping).

    ``a`` is u8 or s8 (s8 is shifted by +128 and ao with it), ``b`` s8. With
    ``faithful`` the raw product goes through the saturating VPMADDUBSW pairing.
    """
    if a.dtype == np.int8:
        a, ao = shift_s8(a), ao + 128
    k = a.shape[1]
    raw = dot_u8s8_maddubsw(a, b) if faithful else dot_u8s8_exact(a, b)
    rowsum = a.astype(np.int64).sum(axis=1)[:, None]
    colsum = b.astype(np.int64).sum(axis=0)[None, :]
    return raw - bo * rowsum - ao * colsum + k * ao * bo


def dst_scale_inverse(scale) -> float:
    """The factor the output pipeline multiplies by for a dst scale: f32(1) / f32(scale)
    (+-inf for +-0 and for scales under 2**-128, without numpy's warnings)."""
    if scale == 0:
        return math.copysign(math.inf, float(scale))
    with np.errstate(over="ignore"):
        return float(np.float32(1) / np.float32(scale))


def clamp_f32(f: np.ndarray, lo, hi) -> np.ndarray:
    """VMINPS(f, hi) then VMAXPS(f, lo): ``f < hi ? f : hi``, ``f > lo ? f : lo`` (NaN -> hi)."""
    f = np.where(f < np.float32(hi), f, np.float32(hi)).astype(np.float32)
    return np.where(f > np.float32(lo), f, np.float32(lo)).astype(np.float32)


DST_RANGE = {"s32": (INT32_LOWER_F32, INT32_UPPER_F32), "u8": (np.float32(0), np.float32(255)),
             "s8": (np.float32(-128), np.float32(127))}
DST_DTYPE = {"s32": np.int32, "f32": np.float32, "u8": np.uint8, "s8": np.int8}
_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
           # VMAXPS/VMINPS(a, src1): a > src1 ? a : src1 / a < src1 ? a : src1
           "max": lambda a, b: np.where(a > b, a, b), "min": lambda a, b: np.where(a < b, a, b)}


def output_pipeline(v: np.ndarray, *, dst_dt: str = "s32", float_mode: bool = True, accumulate: bool = False,
                    dst_old: np.ndarray | None = None, scale=None, bias=None, post_ops=(), dst_scale=None,
                    dst_zp=None) -> np.ndarray:
    """``jit.output``'s operations on the wrapped int32 sum ``v`` (M x N), in its order, in f32.

    ``scale``, ``bias`` and ``dst_zp`` are f32 values broadcastable to M x N (one value,
    a row of N, or a column of M). ``post_ops``: ``("eltwise", alg, alpha, beta)``,
    ``("sum", scale, zero_point)`` (reads ``dst_old``) or ``("binary", alg, src1)``.
    """
    v = wrap_int32(v)
    if not float_mode:
        return wrap_int32(v.astype(np.int64) + dst_old.astype(np.int64)) if accumulate else v
    f32 = np.float32
    f = v.astype(f32)
    with np.errstate(all="ignore"):
        if scale is not None:
            f = (f * np.asarray(scale, f32)).astype(f32)
        if bias is not None:
            f = (f + np.asarray(bias, f32)).astype(f32)
        for op in post_ops:
            if op[0] == "eltwise":
                from primitives.eltwise_ref import eltwise_model

                f = eltwise_model(op[1], f, op[2], op[3])
            elif op[0] == "sum":
                old = (dst_old.astype(f32) - f32(op[2])).astype(f32)
                f = (f + (old * f32(op[1])).astype(f32)).astype(f32)
            else:
                f = _BINARY[op[1]](f, np.asarray(op[2], f32)).astype(f32)
        if dst_scale is not None:
            f = (f * f32(dst_scale_inverse(dst_scale))).astype(f32)
        if dst_zp is not None:
            f = (f + np.asarray(dst_zp, f32)).astype(f32)
        if dst_dt == "f32":
            return f
        lo, hi = DST_RANGE[dst_dt]
        return np.rint(clamp_f32(f, lo, hi)).astype(DST_DTYPE[dst_dt])


def output_stage(v: np.ndarray, c_old: np.ndarray, alpha: float, beta: float, co: np.ndarray | None,
                 offsetc: str) -> np.ndarray:
    """The GEMM's C from the wrapped int32 sum ``v``, as the output pipeline computes it.

    Integer mode (alpha 1, beta 0 or 1): int32 wrapping. Otherwise alpha is a common
    scale, co a bias (per column for 'F'/'R', per row for 'C') and beta a sum post-op.
    """
    m, n = v.shape
    co_full = None
    if co is not None:
        co = np.asarray(co, np.int64).ravel()
        # oneDNN's letters: 'C' adds a column vector (co[i] to row i), 'R' a row vector (co[j] to column j)
        co_full = {"F": lambda: np.full((1, 1), co[0]), "C": lambda: co[:m, None],
                   "R": lambda: co[None, :n]}[offsetc.upper()]()
    if alpha == 1.0 and beta in (0.0, 1.0):
        total = v.astype(np.int64) + (0 if co_full is None else co_full)
        return output_pipeline(total, float_mode=False, accumulate=beta == 1.0, dst_old=c_old)
    return output_pipeline(v, scale=np.float32(alpha),
                           bias=None if co_full is None else co_full.astype(np.int32).astype(np.float32),
                           post_ops=(("sum", beta, 0),) if beta != 0.0 else (), dst_old=c_old)


def gemm(transa, transb, offsetc, M, N, K, alpha, A, lda, ao, B, ldb, bo, beta, C, ldc, co, *, faithful=False):
    """Model of ``gemm_u8s8s32``/``gemm_s8s8s32`` (A's dtype decides); returns the new C (M x N).

    ``faithful=True`` models the VPMADDUBSW paths under the faithful policy.
    """
    a = op(A, transa, M, K, lda)
    b = op(B, transb, K, N, ldb)
    c_old = op(C, "N", M, N, ldc) if beta != 0.0 else np.zeros((M, N), np.int32)
    v = wrap_int32(gemm_sum(a, b, int(ao), int(bo), faithful))
    return output_stage(v, c_old, alpha, beta, co, offsetc)
