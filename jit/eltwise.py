"""Vectorised eltwise post-ops: the f32 code every kernel's output stage can end in.

:func:`emit_eltwise` transforms the f32 lanes of one vector register in place with one
of oneDNN's forward eltwise algorithms (:data:`ALGS`), with ``alpha`` and ``beta``
baked into the code. The same instruction sequence is emitted for zmm (AVX-512) and
ymm (AVX2) and uses IEEE operations only (add, sub, mul, div, sqrt, min, max,
round-to-nearest-even, conversions, integer shifts and bit logic), so both widths and
:func:`primitives.eltwise_ref.eltwise_model` give the same bits for every input. No FMA
(it rounds once where the model rounds twice), no approximate reciprocal, no
VGETEXP/VSCALEF, and no opmask register: selections are made on a lane's sign bit
(VBLENDVPS on ymm; VPSRAD + VPTERNLOGD on zmm), so the output stage keeps k1..k7.

For the code that calls :func:`emit_eltwise` (the output stage):

* it writes x and the ``temps`` it is given (:func:`temps_needed`: relu 1, clip 1,
  linear/abs/square/sqrt/round 0, exp 2, logistic/tanh/gelu_tanh/swish 3,
  hardswish 2, gelu_erf 4) and nothing else: no opmask, no general-purpose register,
  no flags; constants are RIP-relative memory operands from the kernel's constant pool
  (PeachPy shares equal constants, and a repeated ``tag`` is harmless);
* alpha and beta are baked into the code, so a kernel's cache key must hold their
  float32 bits, and :func:`code_version` so that a changed emitter is not served from
  the disk cache;
* instructions: ymm needs AVX (VBLENDVPS, VROUNDPS) and AVX2 (integer ops); zmm needs
  AVX512F and AVX512DQ (VANDPS/VORPS/VXORPS on zmm).

:func:`generate_apply` / :func:`generate_chain` build a stand-alone kernel
``void f(float *x, int64_t n)`` that applies one (or a chain of) post-op(s) in place,
for tests and for looking at the code (``GeneratedCode.listing`` inside ``jit.build.listings()``).

Assumed run-time state: MXCSR as every thread starts with it (round to nearest even,
no flush-to-zero, no denormals-are-zero, exceptions masked). The model assumes the same.

Algorithms (x is the lane; alpha and beta are rounded to float32 first):

============  ==========================================================================
relu          alpha == 0: ``max(0, x)`` (negatives give +0, -0 stays -0, NaN passes).
              else ``x * (signbit(x) ? alpha : 1)``: the sign bit selects, so +0 gives
              +0 whatever alpha is; ``-inf * alpha`` is +-inf.
clip          ``min(beta, max(alpha, x))`` with x as the second operand of both, so NaN
              passes through (alpha/beta may be +-inf here, nowhere else).
linear        ``alpha * x + beta`` (two roundings).
abs, square   sign bit cleared; ``x * x``.
sqrt          VSQRTPS: correctly rounded; negative -> NaN, -0 -> -0.
round         round half to even (VROUNDPS / VRNDSCALEPS, imm 8).
exp           see below; NaN passes, +inf -> +inf, -inf -> +0.
logistic      e = exp(-|x|); ``(x < 0 ? e : 1) / (1 + e)`` (selected on the sign bit):
              no cancellation on either side, so the relative error stays small where
              the result is tiny.
tanh          m = expm1(-2|x|) (argument clamped at -20: tanh is 1.0f beyond 9.1);
              ``copysign(|m| / (2 + m), x)``; small |x| keeps full relative accuracy.
gelu_tanh     0.5x(1 + tanh(u)) rewritten as x * logistic(2u) with
              2u = x * (c1 + c2 * x * x), c1 = 2 sqrt(2/pi), c2 = 0.044715 c1.
gelu_erf      x * Phi(x); c = 0.5 erfc(|x|/sqrt2) = t exp(g(t) - x*x/2),
              t = 1 / (1 + |x|/2), g a degree-10 polynomial in t - 0.6 fitted here
              (minimax of log(0.5 erfc(a/sqrt2)/t) + a^2/2 over a = |x| in [0, 16]);
              Phi = (x < 0 ? c : 1 - c). Relative accuracy holds far into the left tail.
swish         x * logistic(alpha * x) (the logistic above); alpha == 0 gives x * 0.5.
hardswish     ``x * min(1, max(0, alpha * x + beta))``; alpha and beta literal (no
              oneDNN-style defaults: pass 1/6 and 1/2 for the usual hard-swish);
              alpha == 0 multiplies by the constant clamp(beta).
============  ==========================================================================

Products ``x * f`` where f -> 0 as x -> +-inf (swish, gelu_*, hardswish) would give
``inf * 0 = NaN``; x is first clamped to +-FLT_MAX on that side, so the result is +-0.

exp(v) (the core of exp, logistic, tanh, swish, gelu_*):
    v clamped to [-110, 89] (NaN passes); n = round_even(v * log2e);
    r = (v - n*ln2_hi) - n*ln2_lo with ln2_hi = 0.693359375 (9 bits: n*ln2_hi and the
    first subtraction are exact); s = r + ((q(r)*r)*r) with q a degree-5 polynomial
    (Horner, weighted minimax fitted here: |expm1(r) - s| <= 2.5e-10 |expm1(r)| in
    real arithmetic); exp: (1 + s) * 2^floor(n/2) * 2^(n - floor(n/2)) built in the
    exponent bits; the two factors keep every step exact except the last product, which
    rounds once, also into the subnormal range, to +0 below -103.97 and to +inf above
    88.72. expm1 (tanh only, n >= -29): 2^n * s + (2^n - 1).

Operand order of VMINPS/VMAXPS matters: ``VMAXPS d, a, b`` is ``a > b ? a : b``, so it
returns b when either is NaN (or both are zeros); the model writes it that way.

Measured error of the model (= the kernels) against float64 truth
(:data:`ERROR_BOUNDS`; ``err <= rel * |f| * max(1, cond) + abs``, where cond is the
condition number ``|x f'(x) / f(x)|`` of the function for the float32 input; the
tests check it over dense grids and random inputs):

==========  ========  ========  ===================================================
alg         rel       abs       measured (max over ~17M float32 inputs)
==========  ========  ========  ===================================================
relu        6.0e-8    1.5e-45   0.5 ulp (one rounding of alpha*x); exact if alpha=0
clip, abs,  0         0         exact
round
linear      1.2e-7    1.5e-45   two roundings; cond = |alpha x / (alpha x + beta)|
square      6.0e-8    1.5e-45   correctly rounded
sqrt        6.0e-8    0         correctly rounded
exp         8.0e-8    1.5e-45   6.7e-8 x cond (cond = |x|); raw 7.8e-8 (1.3 ulp)
logistic    1.6e-7    1.5e-45   1.4e-7 x cond; raw 1.7e-7 at x = -9.7
tanh        1.8e-7    1.5e-45   1.6e-7 (2.7 ulp), cond <= 1
gelu_tanh   3.6e-7    2.0e-43   3.2e-7 x cond; raw 1.3e-5 at x = -9.8 (cond 218)
gelu_erf    4.4e-7    2.0e-43   3.8e-7 x cond; raw 7.9e-6 at x = -13.1 (cond 172)
swish       3.0e-7    2.0e-43   2.5e-7 x cond (alpha 1, 1.3, -0.7); raw 5.2e-6 at
                                alpha x = -70 (cond 90)
hardswish   1.4e-7    1.5e-45   1.2e-7 x cond (cond 1 + |alpha x / (alpha x + beta)|
                                on the ramp)
==========  ========  ========  ===================================================

abs covers results below FLT_MIN (subnormal; the gelu/swish factors lose bits there
before the last product). Overflow: exp gives +inf exactly where the rounded true
value does.

Example (run a generated in-place kernel on six floats)::

    >>> from runtime.ffi import ffi
    >>> from runtime.isa import cpu_supports
    >>> from jit.dot import fast_path
    >>> kernel = apply_kernel(fast_path("avx2"), "relu", alpha=0.5)
    >>> buf = ffi.new("float[]", [-2.0, -1.0, 0.0, 1.0, 2.0, 3.5])
    >>> if cpu_supports("avx2"):
    ...     kernel(buf, 6)
    ... else:
    ...     buf[0:2] = [-1.0, -0.5]
    >>> list(buf)
    [-1.0, -0.5, 0.0, 1.0, 2.0, 3.5]
"""
from __future__ import annotations

import hashlib
import math
import os
import re
import struct

from jit.dot import Path, vector_constant, vector_register

ALGS = ("relu", "clip", "linear", "abs", "square", "sqrt", "exp", "logistic", "tanh", "gelu_tanh",
        "gelu_erf", "swish", "hardswish", "round")

# Vector registers each emitter needs besides x (the most any alpha/beta needs).
_TEMPS = {
    "relu": 1, "clip": 1, "linear": 0, "abs": 0, "square": 0, "sqrt": 0, "round": 0,
    "exp": 2, "logistic": 3, "tanh": 3, "gelu_tanh": 3, "gelu_erf": 4, "swish": 3, "hardswish": 2,
}

# Error bounds, see the module docstring: alg -> (rel, abs) with
# |computed - true| <= rel * |true| * max(1, cond) + abs (checked by tests/test_eltwise.py).
ERROR_BOUNDS = {
    "relu": (6.0e-8, 1.5e-45), "clip": (0.0, 0.0), "abs": (0.0, 0.0), "round": (0.0, 0.0),
    "linear": (1.2e-7, 1.5e-45), "square": (6.0e-8, 1.5e-45), "sqrt": (6.0e-8, 0.0),
    "exp": (8.0e-8, 1.5e-45), "logistic": (1.6e-7, 1.5e-45), "tanh": (1.8e-7, 1.5e-45),
    "gelu_tanh": (3.6e-7, 2.0e-43), "gelu_erf": (4.4e-7, 2.0e-43), "swish": (3.0e-7, 2.0e-43),
    "hardswish": (1.4e-7, 1.5e-45),
}

FLT_MAX = 3.4028234663852886e38
SIGN = 0x80000000
ABS = 0x7FFFFFFF
ONE = 0x3F800000  # 1.0f; also the exponent bias of 2^0 in the bits
ROUND_EVEN = 0x08  # VROUNDPS / VRNDSCALEPS imm8: round to nearest even, no precision fault

# exp core. ln2 = LN2_HI + LN2_LO, LN2_HI with 9 significant bits.
EXP_LO, EXP_HI = -110.0, 89.0
LOG2E = 1.4426950408889634
LN2_HI = 0.693359375
LN2_LO = -2.1219444005469057e-4
EXPM1_Q = (0.5, 0.1666666567325592, 0.04166635498404503, 0.008333390578627586,
           0.001394122140482068, 0.00019845923816319555)  # q(r) = sum EXPM1_Q[i] r^i
TANH_LO = -20.0  # clamp of -2|x| in tanh: expm1's 2^n stays normal (n >= -29)

# gelu_tanh: 2u = x * (GELU_C1 + GELU_C2 * x * x)
GELU_C1 = 2.0 * math.sqrt(2.0 / math.pi)
GELU_C2 = GELU_C1 * 0.044715

# gelu_erf: t = 1 / (1 + |x| * ERFC_K) (k*|x| exact); u = t - ERFC_CENTER;
# 0.5 erfc(|x|/sqrt2) = t * exp(g(u) - x*x*0.5), g(u) = sum ERFC_G[i] u^i (fit_erfc_g)
ERFC_K = 0.5
ERFC_CENTER = 0.6
ERFC_G = (-0.9948628544807434, 0.9155637621879578, -0.38051265478134155, -0.15536971390247345,
          0.30749350786209106, -0.12409444898366928, -0.16053634881973267, 0.28728926181793213,
          -0.09179440140724182, -0.21282958984375, 0.16700886189937592)


def f32_bits(value: float) -> int:
    """The bits of ``value`` rounded to float32 (round to nearest even)."""
    try:
        return struct.unpack("<I", struct.pack("<f", float(value)))[0]
    except OverflowError:
        raise ValueError(f"{value!r} is outside the float32 range") from None


def f32(value: float) -> float:
    """``value`` rounded to float32, as a Python float."""
    return struct.unpack("<f", struct.pack("<I", f32_bits(value)))[0]


def temps_needed(alg: str) -> int:
    """Vector registers :func:`emit_eltwise` needs besides x for ``alg``."""
    return _TEMPS[check_alg(alg)]


def check_alg(alg: str) -> str:
    if alg not in _TEMPS:
        raise ValueError(f"alg: expected one of {', '.join(ALGS)}, got {alg!r}")
    return alg


def check_params(alg: str, alpha: float, beta: float) -> tuple[float, float]:
    """alpha and beta rounded to float32; errors name the argument."""
    check_alg(alg)
    out = []
    for name, value in (("alpha", alpha), ("beta", beta)):
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: expected a number, got {value!r}") from None
        if math.isnan(value):
            raise ValueError(f"{name}: NaN is not a valid {alg} parameter")
        if math.isinf(value) and alg != "clip":
            raise ValueError(f"{name}: {value} is not a valid {alg} parameter (only clip takes infinities)")
        if not math.isinf(value):
            try:
                value = f32(value)
            except ValueError:
                raise ValueError(f"{name}: {value!r} is outside the float32 range") from None
        out.append(value)
    return out[0], out[1]


def code_version() -> str:
    """A digest of this file: put it in the key of every cached kernel that emits eltwise
    code, so that a changed emitter never maps a stale kernel from the disk cache."""
    global _CODE_VERSION
    if _CODE_VERSION is None:
        with open(os.path.abspath(__file__), "rb") as f:
            _CODE_VERSION = hashlib.sha256(f.read()).hexdigest()[:16]
    return _CODE_VERSION


_CODE_VERSION = None


class _Emitter:
    """One eltwise post-op being emitted: the path, the constant names, the helpers."""

    def __init__(self, path: Path, tag: str, alg: str):
        from jit import asm

        self.asm = asm
        self.path = path
        self.wide = path.bits == 512
        self.prefix = re.sub(r"[^A-Za-z0-9_]", "_", f"{tag}_{alg}") if tag else alg

    def c(self, value, name: str):
        """A constant vector (memory operand): a float (rounded to f32) or raw bits (int)."""
        bits = value if isinstance(value, int) else f32_bits(value)
        return vector_constant(self.path, [bits], f"{self.prefix}_{name}")

    # ---- instructions whose mnemonic differs by width; same bits on both
    def load(self, dst, value, name):
        self.asm.VMOVUPS(dst, self.c(value, name))

    def zero(self, dst):
        self.asm.VXORPS(dst, dst, dst)

    def round_even(self, dst, src):
        (self.asm.VRNDSCALEPS if self.wide else self.asm.VROUNDPS)(dst, src, ROUND_EVEN)

    def band(self, dst, a, b):
        self.asm.VANDPS(dst, a, b)

    def bor(self, dst, a, b):
        self.asm.VORPS(dst, a, b)

    def bxor(self, dst, a, b):
        self.asm.VXORPS(dst, a, b)

    def select(self, dst, sign_src, if_set, if_clear):
        """dst = signbit(sign_src) ? if_set : if_clear, per lane.

        One of if_set / if_clear may be a constant (memory operand); dst must differ from
        sign_src and from the register operands unless stated below. ymm: VBLENDVPS.
        zmm: VPSRAD by 31 spreads the sign over the lane, VPTERNLOGD picks bitwise
        (0xCA: dst ? op2 : op3; 0xAC: dst ? op3 : op2).
        """
        asm = self.asm
        set_is_reg = not _is_memory(if_set)
        if self.wide:
            asm.VPSRAD(dst, sign_src, 31)
            if set_is_reg:
                asm.VPTERNLOGD(dst, if_set, if_clear, 0xCA)
            else:
                asm.VPTERNLOGD(dst, if_clear, if_set, 0xAC)
        else:
            if _is_memory(if_clear):
                asm.VMOVUPS(dst, if_clear)
                asm.VBLENDVPS(dst, dst, if_set, sign_src)
            else:
                asm.VBLENDVPS(dst, if_clear, if_set, sign_src)

    def select_constants(self, dst, sign_src, if_set: float, if_clear: float, name: str):
        """dst = signbit(sign_src) ? if_set : if_clear for two constants (dst != sign_src).

        zmm: the spread sign masks (if_set ^ if_clear), then ^ if_clear. ymm: VBLENDVPS.
        """
        if self.wide:
            self.asm.VPSRAD(dst, sign_src, 31)
            self.asm.VPANDD(dst, dst, self.c(f32_bits(if_set) ^ f32_bits(if_clear), f"{name}_xor"))
            self.asm.VPXORD(dst, dst, self.c(if_clear, f"{name}_clear"))
        else:
            self.select(dst, sign_src, self.c(if_set, f"{name}_set"), self.c(if_clear, f"{name}_clear"))

    def clamp_infinity(self, x, tmp, low: bool, high: bool):
        """Replace -inf (low) / +inf (high) by -+FLT_MAX; NaN passes (x is the 2nd operand)."""
        if low:
            self.load(tmp, -FLT_MAX, "neg_flt_max")
            self.asm.VMAXPS(x, tmp, x)
        if high:
            self.load(tmp, FLT_MAX, "flt_max")
            self.asm.VMINPS(x, tmp, x)

    def exp_core(self, v, t0, t1, lo: float, hi: float | None, expm1: bool = False):
        """v = exp(v) (or expm1(v)) in place; t0, t1 clobbered. See the module docstring."""
        asm = self.asm
        self.load(t0, lo, "exp_lo")
        asm.VMAXPS(v, t0, v)  # lo > v ? lo : v: NaN passes
        if hi is not None:
            self.load(t0, hi, "exp_hi")
            asm.VMINPS(v, t0, v)
        asm.VMULPS(t0, v, self.c(LOG2E, "log2e"))
        self.round_even(t0, t0)  # n
        asm.VMULPS(t1, t0, self.c(LN2_HI, "ln2_hi"))  # exact: 9-bit constant, |n| <= 159
        asm.VSUBPS(v, v, t1)  # exact (Sterbenz)
        asm.VMULPS(t1, t0, self.c(LN2_LO, "ln2_lo"))
        asm.VSUBPS(v, v, t1)  # r
        asm.VCVTPS2DQ(t0, t0)  # n as int32 (exact: n is an integer)
        q = EXPM1_Q
        asm.VMULPS(t1, v, self.c(q[-1], f"q{len(q) - 1}"))
        for i in range(len(q) - 2, -1, -1):
            asm.VADDPS(t1, t1, self.c(q[i], f"q{i}"))
            asm.VMULPS(t1, t1, v)
        asm.VMULPS(t1, t1, v)  # (q*r)*r
        asm.VADDPS(v, v, t1)  # s = expm1(r)
        if expm1:
            asm.VPSLLD(t0, t0, 23)
            asm.VPADDD(t0, t0, self.c(ONE, "one_bits"))  # 2^n
            asm.VSUBPS(t1, t0, self.c(1.0, "one"))  # 2^n - 1
            asm.VMULPS(v, v, t0)
            asm.VADDPS(v, v, t1)
        else:
            asm.VADDPS(v, v, self.c(1.0, "one"))  # exp(r)
            asm.VPSRAD(t1, t0, 1)  # a = floor(n/2)
            asm.VPSUBD(t0, t0, t1)  # b = n - a
            asm.VPSLLD(t1, t1, 23)
            asm.VPADDD(t1, t1, self.c(ONE, "one_bits"))  # 2^a, normal
            asm.VMULPS(v, v, t1)  # exact
            asm.VPSLLD(t0, t0, 23)
            asm.VPADDD(t0, t0, self.c(ONE, "one_bits"))  # 2^b, normal
            asm.VMULPS(v, v, t0)  # the only rounding of the scaling

    def logistic_of(self, z, sign_src, flip: bool, t0, t1, dst):
        """dst = logistic(z) where signbit(z) == signbit(sign_src) ^ flip; z clobbered.

        e = exp(-|z|); (z < 0 ? e : 1) / (1 + e). dst may be sign_src (then it is read
        before it is written) but not z, t0 or t1.
        """
        asm = self.asm
        self.bor(z, z, self.c(SIGN, "sign"))  # -|z|
        self.exp_core(z, t0, t1, EXP_LO, None)  # e
        asm.VADDPS(t0, z, self.c(1.0, "one"))  # 1 + e
        if flip:
            self.select(t1, sign_src, self.c(1.0, "one"), z)
        else:
            self.select(t1, sign_src, z, self.c(1.0, "one"))
        asm.VDIVPS(dst, t1, t0)


def _is_memory(operand) -> bool:
    from peachpy.literal import Constant

    return isinstance(operand, (Constant, list)) or type(operand).__name__ == "MemoryOperand"


def emit_eltwise(path: Path, alg: str, alpha: float, beta: float, x, temps: list, tag: str) -> None:
    """Emit ``x = alg(x; alpha, beta)`` on the f32 lanes of register ``x``.

    ``temps``: at least :func:`temps_needed` (alg) registers of x's width, distinct from
    x and each other; their contents are clobbered. ``tag`` prefixes the constants'
    names (give each post-op of a kernel its own, e.g. ``f"po{index}"``, so listings read
    well; equal tags still work). No opmask register and no general-purpose register is
    touched; flags are untouched.
    """
    alg = check_alg(alg)
    alpha, beta = check_params(alg, alpha, beta)
    need = _TEMPS[alg]
    temps = list(temps)[:need]
    width = "zmm" if path.bits == 512 else "ymm"
    regs = [x] + temps
    if len(temps) < need:
        raise ValueError(f"temps: {alg} needs {need} temporary registers, got {len(temps)}")
    for reg in regs:
        if type(reg).__name__.lower()[:3] != width:
            raise ValueError(f"temps: {reg} is not a {width} register ({path.name} works on {width})")
    if len({(type(r), r.physical_id, getattr(r, "virtual_id", None)) for r in regs}) != len(regs):
        raise ValueError(f"temps: x and the temporaries must be distinct registers, got {regs}")

    e = _Emitter(path, tag, alg)
    asm = e.asm
    t = temps
    if alg == "relu":
        if alpha == 0.0:
            e.zero(t[0])
            asm.VMAXPS(x, t[0], x)  # 0 > x ? 0 : x
        else:
            e.select_constants(t[0], x, alpha, 1.0, "alpha_or_one")
            asm.VMULPS(x, x, t[0])
    elif alg == "clip":
        e.load(t[0], alpha, "alpha")
        asm.VMAXPS(x, t[0], x)
        e.load(t[0], beta, "beta")
        asm.VMINPS(x, t[0], x)
    elif alg == "linear":
        asm.VMULPS(x, x, e.c(alpha, "alpha"))
        asm.VADDPS(x, x, e.c(beta, "beta"))
    elif alg == "abs":
        e.band(x, x, e.c(ABS, "abs"))
    elif alg == "square":
        asm.VMULPS(x, x, x)
    elif alg == "sqrt":
        asm.VSQRTPS(x, x)
    elif alg == "round":
        e.round_even(x, x)
    elif alg == "exp":
        e.exp_core(x, t[0], t[1], EXP_LO, EXP_HI)
    elif alg == "logistic":
        asm.VMOVAPS(t[2], x)
        e.logistic_of(t[2], x, False, t[0], t[1], x)
    elif alg == "tanh":
        e.bor(t[2], x, e.c(SIGN, "sign"))  # -|x|
        asm.VADDPS(t[2], t[2], t[2])  # -2|x|, exact
        e.exp_core(t[2], t[0], t[1], TANH_LO, None, expm1=True)  # m in (-1, 0]
        asm.VADDPS(t[0], t[2], e.c(2.0, "two"))  # 2 + m
        e.band(t[2], t[2], e.c(ABS, "abs"))  # -m, +0 for m = -0
        asm.VDIVPS(t[2], t[2], t[0])
        e.band(x, x, e.c(SIGN, "sign"))
        e.bor(x, x, t[2])  # copysign
    elif alg == "swish":
        if alpha == 0.0:
            asm.VMULPS(x, x, e.c(0.5, "half"))
        else:
            # logistic(alpha*x) -> 0 on the side where alpha*x -> -inf
            e.clamp_infinity(x, t[0], low=alpha > 0, high=alpha < 0)
            asm.VMULPS(t[2], x, e.c(alpha, "alpha"))
            e.logistic_of(t[2], x, alpha < 0, t[0], t[1], t[2])
            asm.VMULPS(x, x, t[2])
    elif alg == "gelu_tanh":
        e.clamp_infinity(x, t[0], low=True, high=False)
        asm.VMULPS(t[2], x, x)
        asm.VMULPS(t[2], t[2], e.c(GELU_C2, "c2"))
        asm.VADDPS(t[2], t[2], e.c(GELU_C1, "c1"))
        asm.VMULPS(t[2], t[2], x)  # 2u, same sign as x
        e.logistic_of(t[2], x, False, t[0], t[1], t[2])
        asm.VMULPS(x, x, t[2])
    elif alg == "gelu_erf":
        e.clamp_infinity(x, t[0], low=True, high=False)
        asm.VMULPS(t[2], x, x)
        asm.VMULPS(t[2], t[2], e.c(0.5, "half"))  # x*x/2
        e.band(t[3], x, e.c(ABS, "abs"))
        asm.VMULPS(t[3], t[3], e.c(ERFC_K, "k"))
        asm.VADDPS(t[3], t[3], e.c(1.0, "one"))
        e.load(t[1], 1.0, "one")
        asm.VDIVPS(t[3], t[1], t[3])  # t
        asm.VSUBPS(t[0], t[3], e.c(ERFC_CENTER, "center"))  # u
        g = ERFC_G
        asm.VMULPS(t[1], t[0], e.c(g[-1], f"g{len(g) - 1}"))
        for i in range(len(g) - 2, 0, -1):
            asm.VADDPS(t[1], t[1], e.c(g[i], f"g{i}"))
            asm.VMULPS(t[1], t[1], t[0])
        asm.VADDPS(t[1], t[1], e.c(g[0], "g0"))
        asm.VSUBPS(t[1], t[1], t[2])  # g(t) - x*x/2
        e.exp_core(t[1], t[0], t[2], EXP_LO, None)
        asm.VMULPS(t[1], t[1], t[3])  # c = 0.5 erfc(|x|/sqrt2)
        e.load(t[0], 1.0, "one")
        asm.VSUBPS(t[0], t[0], t[1])  # 1 - c
        e.select(t[2], x, t[1], t[0])  # Phi(x)
        asm.VMULPS(x, x, t[2])
    elif alg == "hardswish":
        if alpha == 0.0:
            factor = min(max(beta, 0.0), 1.0)
            e.clamp_infinity(x, t[0], low=factor == 0.0, high=factor == 0.0)
            asm.VMULPS(x, x, e.c(factor, "factor"))
        else:
            asm.VMULPS(t[0], x, e.c(alpha, "alpha"))
            asm.VADDPS(t[0], t[0], e.c(beta, "beta"))
            e.zero(t[1])
            asm.VMAXPS(t[0], t[1], t[0])  # NaN passes
            e.load(t[1], 1.0, "one")
            asm.VMINPS(t[0], t[1], t[0])
            # the factor is NaN when x is, so this clamp may turn NaN into FLT_MAX
            if alpha > 0:
                asm.VMAXPS(x, x, e.c(-FLT_MAX, "neg_flt_max"))
            else:
                asm.VMINPS(x, x, e.c(FLT_MAX, "flt_max"))
            asm.VMULPS(x, x, t[0])
    else:  # pragma: no cover - check_alg above
        raise AssertionError(alg)


# ---------------------------------------------------------------- in-place apply kernel

APPLY_SIGNATURE = "void (*)(float *, int64_t)"


def _normalise_ops(ops) -> tuple:
    """((alg, alpha, beta), ...) with alpha and beta checked and rounded to float32."""
    out = []
    for op in ops:
        alg, alpha, beta = (tuple(op) + (0.0, 0.0))[:3]
        alpha, beta = check_params(alg, alpha, beta)
        out.append((alg, alpha, beta))
    if not out:
        raise ValueError("ops: expected at least one (alg, alpha, beta)")
    return tuple(out)


def _layout(path: Path, ops: tuple, registers):
    need = max(_TEMPS[alg] for alg, _, _ in ops)
    if registers is None:
        registers = (0, tuple(range(1, need + 1)))
    x_index, temp_indices = registers
    temp_indices = tuple(temp_indices)[:need]
    used = {x_index, *temp_indices}
    mask_index = max(set(range(16)) - used)  # ymm tail mask: a free low register
    return x_index, temp_indices, mask_index


def generate_chain(path: Path, ops, registers=None):
    """Generate ``void f(float *x, int64_t n)`` applying the eltwise ``ops`` in order to
    ``x[0:n]`` in place. ``ops``: ``(alg, alpha, beta)`` tuples (post-op i's constants are
    tagged ``po{i}``, as an output stage with several post-ops would).

    Full vectors, then one masked tail (k1 on zmm, VMASKMOVPS on ymm), so no byte past
    ``x + n`` is read or written. ``registers``: ``(x_index, temp_indices)`` to place the
    eltwise code on other physical registers (default x = 0, temps 1, 2, ...).
    Returns :class:`jit.build.GeneratedCode`; generating needs no CPU support.
    """
    from jit import asm
    from jit.build import generate

    ops = _normalise_ops(ops)
    x_index, temp_indices, mask_index = _layout(path, ops, registers)
    arguments = (asm.Argument(asm.ptr(asm.float_), "x"), asm.Argument(asm.int64_t, "n"))

    def body(x, temps):
        for i, (alg, alpha, beta) in enumerate(ops):
            emit_eltwise(path, alg, alpha, beta, x, temps, f"po{i}")

    def emit():
        ptr, n = asm.rdi, asm.rsi
        asm.LOAD.ARGUMENT(ptr, arguments[0])
        asm.LOAD.ARGUMENT(n, arguments[1])
        x = vector_register(path, x_index)
        temps = [vector_register(path, i) for i in temp_indices]
        lanes, vb = path.lanes, path.vector_bytes
        loop, tail, done = asm.Label(), asm.Label(), asm.Label()
        asm.LABEL(loop)
        asm.CMP(n, lanes)
        asm.JB(tail)
        asm.VMOVUPS(x, [ptr])
        body(x, temps)
        asm.VMOVUPS([ptr], x)
        asm.ADD(ptr, vb)
        asm.SUB(n, lanes)
        asm.JMP(loop)
        asm.LABEL(tail)
        asm.TEST(n, n)
        asm.JZ(done)
        iota = vector_constant(path, list(range(lanes)), "apply_iota")
        if path.bits == 512:
            k = asm.KRegister(physical_id=1)
            asm.VPBROADCASTD(x, n.as_dword)
            asm.KXNORW(k, k, k)  # PeachPy writes VPCMPGTD k, ... as k{k}
            asm.VPCMPGTD(k, x, iota)
            asm.VMOVUPS(x(k.z), [ptr])
            body(x, temps)
            asm.VMOVUPS(asm.zword[ptr](k), x)
        else:
            mask = vector_register(path, mask_index)
            asm.VMOVD(mask.as_xmm, n.as_dword)
            asm.VPBROADCASTD(mask, mask.as_xmm)
            asm.VPCMPGTD(mask, mask, iota)
            asm.VMASKMOVPS(x, mask, [ptr])
            body(x, temps)
            asm.VMASKMOVPS([ptr], mask, x)
        asm.LABEL(done)
        asm.VZEROUPPER()
        asm.RETURN()

    name = f"eltwise_{'_'.join(alg for alg, _, _ in ops)}_{path.isa}_{path.bits}"[:120]
    return generate(name, path.isa, APPLY_SIGNATURE, arguments, emit,
                    meta={"ops": ops, "path": path.name})


def generate_apply(path: Path, alg: str, alpha: float = 0.0, beta: float = 0.0, registers=None):
    """:func:`generate_chain` of the one post-op ``(alg, alpha, beta)``."""
    return generate_chain(path, ((alg, alpha, beta),), registers)


def chain_kernel(path: Path, ops, registers=None):
    """The cached :func:`generate_chain` kernel (a :class:`runtime.kernel.Kernel`)."""
    from jit.cache import get_kernel

    ops = _normalise_ops(ops)
    key = ("eltwise_apply", code_version(), path.isa, path.bits,
           tuple((alg, f32_bits(alpha), f32_bits(beta)) for alg, alpha, beta in ops),
           _layout(path, ops, registers))
    return get_kernel(key, lambda: generate_chain(path, ops, registers))


def apply_kernel(path: Path, alg: str, alpha: float = 0.0, beta: float = 0.0, registers=None):
    """The cached :func:`generate_apply` kernel: call it as ``kernel(float_ptr, n)``."""
    return chain_kernel(path, ((alg, alpha, beta),), registers)
