"""numpy references of the eltwise post-ops.

* :func:`eltwise_model`: the bit-exact float32 model of :func:`jit.eltwise.emit_eltwise`,
  the same IEEE float32 operations in the same order (numpy rounds every float32 operation
  to nearest even and never fuses a multiply and an add; every constant here is a
  ``np.float32`` so nothing is promoted to float64). ``VMAXPS d, a, b`` is written
  ``maxps(a, b) = where(a > b, a, b)`` and ``VMINPS`` likewise, so NaNs and signed zeros
  go where the instructions send them.
* :func:`eltwise_math`: the true function in float64, written in forms that do not
  cancel (1 + tanh(u) as 2 logistic(2u), erfc for the left tail), for accuracy tests.
* :func:`condition`: the condition number ``|x f'(x) / f(x)|`` (how much any float32
  implementation must lose to the rounding of its input), used by the error bounds.
* :func:`fit_expm1_q`, :func:`fit_erfc_g`: how the polynomial coefficients in
  :mod:`jit.eltwise` were obtained (weighted minimax by Lawson's iteration).

Example::

    >>> import numpy as np
    >>> eltwise_model("relu", np.array([-2.0, 3.0], np.float32), 0.5, 0.0).tolist()
    [-1.0, 3.0]
    >>> float(eltwise_math("logistic", np.array([0.0]), 0.0, 0.0)[0])
    0.5
"""
from __future__ import annotations

import math

import numpy as np

from jit import eltwise as E

F = np.float32
I32 = np.int32


def _c(value) -> np.float32:
    return F(value)


def _bits_c(bits: int) -> np.uint32:
    return np.uint32(bits)


def maxps(a, b):
    """VMAXPS d, a, b: a > b ? a : b (b when either is NaN or both are zeros)."""
    return np.where(a > b, a, b).astype(F)


def minps(a, b):
    """VMINPS d, a, b: a < b ? a : b."""
    return np.where(a < b, a, b).astype(F)


def _u(x):
    return np.asarray(x, F).view(np.uint32)


def _f(u):
    return np.asarray(u, np.uint32).view(F)


def _band(x, bits):
    return _f(_u(x) & _bits_c(bits))


def _bor(x, bits):
    return _f(_u(x) | _bits_c(bits))


def _select(sign_src, if_set, if_clear):
    """signbit(sign_src) ? if_set : if_clear, bitwise (VBLENDVPS / VPSRAD+VPTERNLOGD)."""
    return np.where(np.signbit(sign_src), if_set, if_clear).astype(F)


def _cvtps2dq(n):
    """VCVTPS2DQ of an integral value (NaN gives the integer indefinite 0x80000000)."""
    out = np.full(n.shape, np.iinfo(I32).min, I32)
    ok = np.isfinite(n)
    out[ok] = n[ok].astype(I32)
    return out


def _pow2(k):
    """float32 with bits (k << 23) + 0x3f800000 (int32 wrap-around, as VPSLLD/VPADDD)."""
    u = (k.astype(np.uint32) << np.uint32(23)) + np.uint32(E.ONE)
    return _f(u)


def _exp_core(v, lo, hi, expm1=False):
    v = maxps(_c(lo), v)
    if hi is not None:
        v = minps(_c(hi), v)
    n = np.rint(v * _c(E.LOG2E))
    v = v - n * _c(E.LN2_HI)
    r = v - n * _c(E.LN2_LO)
    ni = _cvtps2dq(n)
    q = E.EXPM1_Q
    t = r * _c(q[-1])
    for i in range(len(q) - 2, -1, -1):
        t = (t + _c(q[i])) * r
    t = t * r
    s = r + t
    if expm1:
        p = _pow2(ni)
        return s * p + (p - _c(1.0))
    e = s + _c(1.0)
    a = ni >> 1
    b = ni - a
    return (e * _pow2(a)) * _pow2(b)


def _logistic_of(z, sign_src, flip):
    z = _bor(z, E.SIGN)
    e = _exp_core(z, E.EXP_LO, None)
    d = e + _c(1.0)
    one = np.full_like(e, 1.0)
    num = _select(sign_src, one, e) if flip else _select(sign_src, e, one)
    return num / d


def _clamp_infinity(x, low, high):
    if low:
        x = maxps(_c(-E.FLT_MAX), x)
    if high:
        x = minps(_c(E.FLT_MAX), x)
    return x


def eltwise_model(alg: str, x, alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    """What the generated code computes for float32 ``x`` (bit-exact, NaN payloads aside)."""
    alg = E.check_alg(alg)
    alpha, beta = E.check_params(alg, alpha, beta)
    x = np.array(x, dtype=F, copy=True)
    a, b = _c(alpha), _c(beta)
    with np.errstate(all="ignore"):
        if alg == "relu":
            if alpha == 0.0:
                return maxps(_c(0.0), x)
            return x * _select(x, np.full_like(x, a), np.full_like(x, 1.0))
        if alg == "clip":
            return minps(b, maxps(a, x))
        if alg == "linear":
            return x * a + b
        if alg == "abs":
            return _band(x, E.ABS)
        if alg == "square":
            return x * x
        if alg == "sqrt":
            return np.sqrt(x)
        if alg == "round":
            return np.rint(x)
        if alg == "exp":
            return _exp_core(x, E.EXP_LO, E.EXP_HI)
        if alg == "logistic":
            return _logistic_of(x.copy(), x, False)
        if alg == "tanh":
            y = _bor(x, E.SIGN)
            y = y + y
            m = _exp_core(y, E.TANH_LO, None, expm1=True)
            d = m + _c(2.0)
            t = _band(m, E.ABS) / d
            return _f(_u(_band(x, E.SIGN)) | _u(t))
        if alg == "swish":
            if alpha == 0.0:
                return x * _c(0.5)
            x = _clamp_infinity(x, alpha > 0, alpha < 0)
            z = x * a
            return x * _logistic_of(z, x, alpha < 0)
        if alg == "gelu_tanh":
            x = _clamp_infinity(x, True, False)
            v = x * x
            v = v * _c(E.GELU_C2)
            v = v + _c(E.GELU_C1)
            v = v * x
            return x * _logistic_of(v, x, False)
        if alg == "gelu_erf":
            x = _clamp_infinity(x, True, False)
            h = (x * x) * _c(0.5)
            t = _band(x, E.ABS) * _c(E.ERFC_K) + _c(1.0)
            t = _c(1.0) / t
            u = t - _c(E.ERFC_CENTER)
            g = E.ERFC_G
            acc = u * _c(g[-1])
            for i in range(len(g) - 2, 0, -1):
                acc = (acc + _c(g[i])) * u
            acc = acc + _c(g[0])
            acc = acc - h
            c = _exp_core(acc, E.EXP_LO, None) * t
            phi = _select(x, c, _c(1.0) - c)
            return x * phi
        if alg == "hardswish":
            if alpha == 0.0:
                factor = min(max(beta, 0.0), 1.0)
                x = _clamp_infinity(x, factor == 0.0, factor == 0.0)
                return x * _c(factor)
            f = x * a + b
            f = maxps(_c(0.0), f)
            f = minps(_c(1.0), f)
            x = maxps(x, _c(-E.FLT_MAX)) if alpha > 0 else minps(x, _c(E.FLT_MAX))
            return x * f
    raise AssertionError(alg)  # pragma: no cover


# ------------------------------------------------------------------ float64 truth

def _logistic64(v):
    v = np.asarray(v, np.float64)
    e = np.exp(-np.abs(v))
    return np.where(v < 0, e, 1.0) / (1.0 + e)


_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def eltwise_math(alg: str, x, alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    """The true function in float64 of the float32 ``x`` (alpha, beta rounded to float32)."""
    alg = E.check_alg(alg)
    alpha, beta = E.check_params(alg, alpha, beta)
    x = np.asarray(x, np.float32).astype(np.float64)
    with np.errstate(all="ignore"):
        if alg == "relu":
            return np.where(x > 0, x, alpha * x)
        if alg == "clip":
            return np.minimum(np.maximum(x, alpha), beta)
        if alg == "linear":
            return alpha * x + beta
        if alg == "abs":
            return np.abs(x)
        if alg == "square":
            return x * x
        if alg == "sqrt":
            return np.sqrt(x)
        if alg == "round":
            return np.rint(x)
        if alg == "exp":
            return np.exp(x)
        if alg == "logistic":
            return _logistic64(x)
        if alg == "tanh":
            return np.tanh(x)
        if alg == "swish":
            return x * _logistic64(alpha * x)
        if alg == "gelu_tanh":
            return x * _logistic64(2.0 * math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3))
        if alg == "gelu_erf":
            return x * 0.5 * _erfc(-x / math.sqrt(2.0))
        if alg == "hardswish":
            return x * np.minimum(np.maximum(alpha * x + beta, 0.0), 1.0)
    raise AssertionError(alg)  # pragma: no cover


def condition(alg: str, x, alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    """``|x f'(x) / f(x)|`` in float64 (1 where f is linear in x or the ratio is 0/0).

    The relative error a float32 input's own rounding (2^-24) causes, divided by 2^-24.
    """
    alg = E.check_alg(alg)
    alpha, beta = E.check_params(alg, alpha, beta)
    x = np.asarray(x, np.float32).astype(np.float64)
    with np.errstate(all="ignore"):
        if alg == "exp":
            k = np.abs(x)
        elif alg == "logistic":
            k = np.abs(x) * _logistic64(-x)
        elif alg == "tanh":
            k = np.abs(2 * x / np.sinh(2 * x))
        elif alg == "swish":
            z = alpha * x
            k = np.abs(1 + z * _logistic64(-z))
        elif alg == "gelu_tanh":
            c1 = 2.0 * math.sqrt(2.0 / math.pi)
            v = c1 * (x + 0.044715 * x ** 3)
            dv = c1 * (x + 3 * 0.044715 * x ** 3)
            k = np.abs(1 + dv * _logistic64(-v))
        elif alg == "gelu_erf":
            phi = 0.5 * _erfc(-x / math.sqrt(2.0))
            k = np.abs(1 + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi) / phi)
        elif alg == "linear":
            k = np.abs(alpha * x / (alpha * x + beta))
        elif alg == "hardswish":
            lin = alpha * x + beta
            k = np.where((lin > 0) & (lin < 1), 1 + np.abs(alpha * x / lin), 1.0)
        else:
            k = np.ones_like(x)
    return np.where(np.isfinite(k), np.maximum(k, 1.0), 1.0)


# ------------------------------------------------------------------ coefficient fits

def _lawson(xs, target, weight, degree, iterations=300):
    """Weighted minimax polynomial (coefficients, lowest first) by Lawson's iteration."""
    vander = np.vander(xs, degree + 1, increasing=True)
    w = np.full(xs.shape, 1.0 / len(xs))
    for _ in range(iterations):
        sw = np.sqrt(w) * weight
        coef, *_ = np.linalg.lstsq(vander * sw[:, None], target * sw, rcond=None)
        err = np.abs((vander @ coef - target) * weight)
        w = w * err
        w /= w.sum()
    return coef, float(err.max())


def _chebyshev_nodes(lo, hi, count):
    k = np.arange(count)
    return (lo + hi) / 2 + (hi - lo) / 2 * np.cos((2 * k + 1) * np.pi / (2 * count))


def fit_expm1_q(degree: int = 5):
    """q with expm1(r) ~ r + r^2 q(r) on |r| <= ln2/2 (+ slack), minimising the relative
    error of expm1. Returns (float32-rounded coefficients, max relative error)."""
    r = _chebyshev_nodes(-0.3486, 0.3486, 4000)
    target = sum(r ** k / math.factorial(k + 2) for k in range(30))  # (expm1(r) - r) / r^2
    coef, err = _lawson(r, target, r * r / np.abs(np.expm1(r)), degree)
    return tuple(float(F(c)) for c in coef), err


def fit_erfc_g(degree: int = 10, k: float = 0.5, center: float = 0.6, a_max: float = 16.0):
    """g with 0.5 erfc(a/sqrt2) ~ t exp(g(t - center) - a^2/2), t = 1/(1 + k a),
    a in [0, a_max], minimising the absolute error of g (= relative error of the result).
    The centred variable keeps the coefficients below 1, so Horner rounds less."""
    k = float(F(k))
    t = _chebyshev_nodes(1.0 / (1.0 + k * a_max), 1.0, 3000)
    a = (1.0 / t - 1.0) / k
    target = np.log(0.5 * _erfc(a / math.sqrt(2.0)) / t) + a * a / 2
    coef, err = _lawson(t - center, target, np.ones_like(t), degree)
    return tuple(float(F(c)) for c in coef), err
