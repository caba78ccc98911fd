"""Eltwise post-ops (jit.eltwise) against their numpy model and the true functions.

* Generated code == :func:`primitives.eltwise_ref.eltwise_model`, bit for bit, on every
  executable ISA path, for fixed edge arrays and hypothesis-drawn arrays (lengths 1..100,
  so every tail length), buffers against guard pages (the masked tail reads and writes
  nothing outside the array).
* zmm and ymm code give the same bits.
* The model is within :data:`jit.eltwise.ERROR_BOUNDS` of the float64 truth on dense grids.
* Special values behave as documented.
* The emitted instructions (decoded by iced-x86, on every path, executable or not) are
  IEEE operations only: no FMA, no approximation, no opmask, only the given registers.

NaN: where the model gives NaN the code must give NaN (payloads are not compared).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jit import eltwise as E
from jit.dot import fast_path
from primitives.eltwise_ref import condition, eltwise_math, eltwise_model
from runtime import isa as isa_mod
from runtime.ffi import ffi
from tests.conftest import ALL_ISAS, GuardedBuffer

F = np.float32
FMAX = float(np.finfo(F).max)
TINY = float(np.finfo(F).tiny)

# (alg, alpha, beta): every alg, and the parameter branches the emitters take.
CASES = [
    ("relu", 0.0, 0.0), ("relu", 0.25, 0.0), ("relu", -1.5, 0.0),
    ("clip", -1.5, 2.5), ("clip", float("-inf"), 6.0),
    ("linear", 1.7, -0.3),
    ("abs", 0.0, 0.0), ("square", 0.0, 0.0), ("sqrt", 0.0, 0.0), ("round", 0.0, 0.0),
    ("exp", 0.0, 0.0), ("logistic", 0.0, 0.0), ("tanh", 0.0, 0.0),
    ("gelu_tanh", 0.0, 0.0), ("gelu_erf", 0.0, 0.0),
    ("swish", 1.0, 0.0), ("swish", -0.7, 0.0), ("swish", 0.0, 0.0),
    ("hardswish", 1 / 6, 0.5), ("hardswish", -0.4, 0.2), ("hardswish", 0.0, -1.0),
]
CASE_IDS = [f"{a}({al:g},{be:g})" for a, al, be in CASES]

SPECIALS = np.array(
    [0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40, TINY, -TINY, 1e-30, -1e-30, 1e-7, -1e-7, 0.5, -0.5,
     1.0, -1.0, 1.5, -1.5, 2.5, -2.5, 3.0, -3.0, 9.0, -9.0, 20.0, -20.0, 87.3, -87.3, 88.72, 88.73,
     -103.9, -104.0, -110.0, 1e10, -1e10, 1e20, -1e20, FMAX, -FMAX, np.inf, -np.inf, np.nan,
     -np.nan], F)


def _edge_array() -> np.ndarray:
    rng = np.random.default_rng(20261121)
    bits = rng.integers(0, 2**32, 300, dtype=np.uint64).astype(np.uint32).view(F)
    dense = np.linspace(-12.0, 12.0, 241, dtype=F)
    return np.concatenate([SPECIALS, bits, dense, rng.normal(0, 4, 200).astype(F)])


def run_kernel(kernel, x: np.ndarray, where: str = "end") -> np.ndarray:
    """Apply ``kernel`` in place to a copy of ``x`` placed against a guard page."""
    buf = GuardedBuffer(len(x), F, where)
    try:
        buf.array[:] = x
        kernel(ffi.cast("float *", buf.array.ctypes.data), len(x))
        return buf.array.copy()
    finally:
        buf.close()


def assert_same(got: np.ndarray, want: np.ndarray, x: np.ndarray, what: str) -> None:
    """Bitwise equality, NaN equal to NaN whatever its payload."""
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    if not same.all():
        i = np.flatnonzero(~same)[:5]
        raise AssertionError(f"{what}: {len(np.flatnonzero(~same))} lanes differ, e.g. x={x[i]!r} "
                             f"got={got[i]!r} want={want[i]!r}")


def executable(isa: str) -> bool:
    return isa_mod.cpu_supports(isa)


# ------------------------------------------------------------------ code == model

@pytest.mark.parametrize("alg, alpha, beta", CASES, ids=CASE_IDS)
def test_code_equals_model_on_edges(isa_path, alg, alpha, beta):
    x = _edge_array()
    kernel = E.apply_kernel(fast_path(isa_path), alg, alpha, beta)
    want = eltwise_model(alg, x, alpha, beta)
    assert_same(run_kernel(kernel, x, "end"), want, x, f"{alg} on {isa_path}")
    for n in (1, 7, 8, 9, 15, 16, 17):  # tails; the buffer starts right after a guard page
        assert_same(run_kernel(kernel, x[:n], "start"), want[:n], x[:n], f"{alg} n={n}")


_floats = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)
_wide = st.one_of(_floats, st.floats(-30, 30, width=32), st.sampled_from([float(v) for v in SPECIALS]))


@pytest.mark.parametrize("alg, alpha, beta", CASES, ids=CASE_IDS)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(_wide, min_size=1, max_size=100))
def test_code_equals_model_property(isa_path, alg, alpha, beta, values):
    x = np.array(values, F)
    kernel = E.apply_kernel(fast_path(isa_path), alg, alpha, beta)
    assert_same(run_kernel(kernel, x), eltwise_model(alg, x, alpha, beta), x, f"{alg} on {isa_path}")


def test_chain_of_post_ops_equals_composed_model(isa_path):
    """Several post-ops in one kernel (one tag each, the same alg twice) compose exactly."""
    ops = (("linear", 0.5, 0.25), ("gelu_erf", 0.0, 0.0), ("relu", 0.1, 0.0), ("relu", -2.0, 0.0),
           ("swish", 1.0, 0.0), ("tanh", 0.0, 0.0), ("clip", -0.5, 0.75), ("logistic", 0.0, 0.0))
    x = _edge_array()
    want = x
    for alg, alpha, beta in ops:
        want = eltwise_model(alg, want, alpha, beta)
    got = run_kernel(E.chain_kernel(fast_path(isa_path), ops), x)
    assert_same(got, want, x, f"chain on {isa_path}")


def test_other_registers(isa_path):
    """The emitters work on any registers: high ones (zmm16-31 need EVEX; ymm8-15 VEX.R/B)."""
    path = fast_path(isa_path)
    registers = (31, (17, 20, 24, 28)) if path.bits == 512 else (13, (8, 9, 11, 12))
    x = _edge_array()
    for alg in ("gelu_erf", "relu"):
        kernel = E.apply_kernel(path, alg, 0.3, 0.0, registers=registers)
        assert_same(run_kernel(kernel, x), eltwise_model(alg, x, 0.3, 0.0), x, f"{alg} {registers}")


@pytest.mark.parametrize("alg, alpha, beta", CASES, ids=CASE_IDS)
def test_zmm_equals_ymm(alg, alpha, beta):
    wide = [i for i in ALL_ISAS if i.startswith("avx512") and executable(i)]
    narrow = [i for i in ALL_ISAS if not i.startswith("avx512") and executable(i)]
    if not wide or not narrow:
        pytest.skip("needs a CPU that runs both an AVX-512 and an AVX2 path")
    rng = np.random.default_rng(7)
    x = np.concatenate([_edge_array(), rng.integers(0, 2**32, 2000, dtype=np.uint64).astype(np.uint32).view(F)])
    z = run_kernel(E.apply_kernel(fast_path(wide[0]), alg, alpha, beta), x)
    y = run_kernel(E.apply_kernel(fast_path(narrow[0]), alg, alpha, beta), x)
    assert_same(z, y, x, f"{alg}: zmm vs ymm")


# ------------------------------------------------------------------ accuracy

def _accuracy_grid() -> np.ndarray:
    positive = np.arange(0, 0x7F800000, 1 << 16, dtype=np.uint32).view(F)  # every magnitude
    dense = np.linspace(-16.0, 16.0, 64001, dtype=F)
    return np.concatenate([positive, -positive, dense, SPECIALS[np.isfinite(SPECIALS)]])


ACCURACY_CASES = CASES + [("swish", 1.3, 0.0), ("linear", -0.25, 3.0)]


@pytest.mark.parametrize("alg, alpha, beta", ACCURACY_CASES,
                         ids=[f"{a}({al:g},{be:g})" for a, al, be in ACCURACY_CASES])
def test_model_within_documented_bounds(alg, alpha, beta):
    x = _accuracy_grid()
    got = eltwise_model(alg, x, alpha, beta).astype(np.float64)
    true = eltwise_math(alg, x, alpha, beta)
    rel, absolute = E.ERROR_BOUNDS[alg]
    with np.errstate(all="ignore"):
        overflow = np.abs(true) >= FMAX * (1 - 2.0**-25)  # rounds to FLT_MAX or inf
        finite = np.isfinite(true) & ~overflow
        err = np.abs(got - true)
        bound = rel * np.abs(true) * condition(alg, x, alpha, beta) + absolute
    bad = finite & ~(err <= bound)
    assert not bad.any(), (f"{alg}: {bad.sum()} inputs beyond the bound, e.g. x={x[bad][:4]!r} "
                           f"got={got[bad][:4]!r} true={true[bad][:4]!r}")
    # where the true value overflows float32, the result is the infinity (or FLT_MAX) of its sign
    big = overflow & np.isfinite(true)
    assert np.all(np.abs(got[big]) >= FMAX) and np.all(np.sign(got[big]) == np.sign(true[big]))
    # the function's NaNs are the model's NaNs, and no NaN appears elsewhere
    assert np.array_equal(np.isnan(got), np.isnan(true)), f"{alg}: NaN where the function has none"


def test_bounds_cover_every_alg():
    assert set(E.ERROR_BOUNDS) == set(E.ALGS) and set(E.ALGS) == set(E._TEMPS)


# ------------------------------------------------------------------ documented special values

def _m(alg, values, alpha=0.0, beta=0.0):
    return eltwise_model(alg, np.array(values, F), alpha, beta)


def _bits(values):
    return np.array(values, F).view(np.uint32).tolist()


def test_special_values():
    inf, nan = np.inf, np.nan
    assert _bits(_m("exp", [-inf, inf, 0.0, -0.0, -200.0, 200.0, 88.73, 1.0])) == \
        _bits([0.0, inf, 1.0, 1.0, 0.0, inf, inf, np.e])
    assert 3.3e38 < _m("exp", [88.72])[0] < np.inf
    assert np.isnan(_m("exp", [nan])).all()
    assert _m("exp", [-103.0])[0] > 0 and _m("exp", [-104.0])[0] == 0  # subnormals, then +0
    assert _bits(_m("logistic", [-inf, inf, 0.0, -200.0])) == _bits([0.0, 1.0, 0.5, 0.0])
    assert _bits(_m("tanh", [0.0, -0.0, inf, -inf, 1e-40, -1e-40])) == \
        _bits([0.0, -0.0, 1.0, -1.0, 1e-40, -1e-40])
    for alg in ("gelu_tanh", "gelu_erf", "swish"):
        alpha = 1.0 if alg == "swish" else 0.0
        assert _bits(_m(alg, [-inf, inf, 0.0, -0.0], alpha)) == _bits([-0.0, inf, 0.0, -0.0]), alg
    assert _bits(_m("swish", [-inf, inf], -0.7)) == _bits([-inf, 0.0])
    assert _bits(_m("swish", [-inf, inf, -2.0], 0.0)) == _bits([-inf, inf, -1.0])
    assert _bits(_m("hardswish", [-inf, inf, -3.0, 3.0, 0.0], 1 / 6, 0.5)) == _bits([-0.0, inf, -0.0, 3.0, 0.0])
    assert _bits(_m("hardswish", [-inf, inf], -0.4, 0.2)) == _bits([-inf, 0.0])
    assert _bits(_m("relu", [-2.0, -0.0, 0.0, 3.0, -inf])) == _bits([0.0, -0.0, 0.0, 3.0, 0.0])
    assert _bits(_m("relu", [-2.0, -0.0, 0.0, -inf], -1.5)) == _bits([3.0, 0.0, 0.0, inf])
    assert _bits(_m("relu", [-2.0, 0.0], 0.25)) == _bits([-0.5, 0.0])
    assert _bits(_m("round", [0.5, 1.5, 2.5, -0.5, -2.5, -0.4])) == _bits([0.0, 2.0, 2.0, -0.0, -2.0, -0.0])
    assert _bits(_m("sqrt", [-0.0, 4.0, inf])) == _bits([-0.0, 2.0, inf]) and np.isnan(_m("sqrt", [-1.0])).all()
    assert _bits(_m("abs", [-0.0, -inf])) == _bits([0.0, inf])
    assert _bits(_m("clip", [-5.0, 5.0, 1.0], -1.5, 2.5)) == _bits([-1.5, 2.5, 1.0])
    # NaN passes through every alg except abs-like sign games (it stays NaN there too)
    for alg, alpha, beta in CASES:
        got = _m(alg, [nan, -nan], alpha, beta)
        assert np.isnan(got).all(), (alg, alpha, beta, got)


# ------------------------------------------------------------------ emitted instructions

def _all_algs_code(isa: str):
    """One kernel per ISA path with every case's post-op in a row (distinct tags)."""
    return E.chain_kernel(fast_path(isa), tuple(CASES))


ALLOWED_PREFIXES = ("VADDPS", "VSUBPS", "VMULPS", "VDIVPS", "VSQRTPS", "VMINPS", "VMAXPS",
                    "VANDPS", "VORPS", "VXORPS", "VPANDD", "VPXORD", "VROUNDPS", "VRNDSCALEPS",
                    "VCVTPS2DQ", "VPSLLD", "VPSRAD", "VPADDD", "VPSUBD", "VBLENDVPS", "VPTERNLOGD",
                    "VMOVUPS", "VMOVAPS")


@pytest.mark.parametrize("isa", ALL_ISAS)
def test_emitted_instructions(isa):
    """Every path (generated and decoded even where the CPU lacks it): IEEE ops only."""
    import iced_x86

    from jit.disasm import decode, encoding_name

    path = fast_path(isa)
    code = _all_algs_code(isa).code()
    names = {v: k.upper() for k, v in vars(iced_x86.Mnemonic).items() if isinstance(v, int)}
    mnemonics, evex, vex = set(), 0, 0
    for ins in decode(code):
        assert not ins.is_invalid
        mnemonics.add(names[ins.mnemonic])
        enc = encoding_name(ins)
        evex += enc == "evex"
        vex += enc == "vex"
    forbidden = {m for m in mnemonics if m.startswith(("VFMADD", "VFMSUB", "VFNMADD", "VFNMSUB", "VRCP",
                                                       "VRSQRT", "VGETEXP", "VGETMANT", "VSCALEF",
                                                       "VEXP2", "VRCP28", "VRSQRT28"))}
    assert not forbidden
    vector = {m for m in mnemonics if m.startswith("V")}
    scaffold = {"VMASKMOVPS", "VMOVD", "VPBROADCASTD", "VPCMPGTD", "VZEROUPPER"}
    assert vector - scaffold <= set(ALLOWED_PREFIXES), vector - scaffold - set(ALLOWED_PREFIXES)
    if path.bits == 256:
        assert evex == 0 and vex > 0  # runs on AVX2-only CPUs
    else:
        assert evex > 0


ONLY_X, ONLY_TEMPS = 5, (9, 3, 14, 7)


def _eltwise_only_code(isa: str) -> bytes:
    """A function holding only eltwise code (every case, x = 5, temps 9, 3, 14, 7) and RET."""
    from jit import asm
    from jit.build import generate
    from jit.cache import get_kernel
    from jit.dot import vector_register

    path = fast_path(isa)
    x = vector_register(path, ONLY_X)
    temps = [vector_register(path, i) for i in ONLY_TEMPS]

    def emit():
        for i, (alg, alpha, beta) in enumerate(CASES):
            E.emit_eltwise(path, alg, alpha, beta, x, temps[:E.temps_needed(alg)], f"po{i}")
        asm.RETURN()

    key = ("eltwise_only_test", E.code_version(), isa, tuple(CASES))
    return get_kernel(key, lambda: generate("eltwise_only", isa, "void (*)(void)", (), emit)).code()


@pytest.mark.parametrize("isa", ["avx512_core", "avx2"])
def test_no_opmask_no_gpr_only_given_registers(isa):
    """No k register, no general-purpose register (constants are RIP-relative), and only x
    and the temporaries among the vector registers, on zmm and on ymm."""
    import iced_x86

    from jit.disasm import decode

    reg = iced_x86.Register
    kregs = {getattr(reg, f"K{i}") for i in range(8)}
    vec = {}
    for i in range(32):
        for width in ("ZMM", "YMM", "XMM"):
            vec[getattr(reg, f"{width}{i}")] = i
    used = set()
    instructions = list(decode(_eltwise_only_code(isa)))
    assert instructions[-1].mnemonic == iced_x86.Mnemonic.RET
    for ins in instructions[:-1]:
        assert ins.op_mask == reg.NONE
        for k in range(ins.op_count):
            kind = ins.op_kind(k)
            if kind == iced_x86.OpKind.REGISTER:
                r = ins.op_register(k)
                assert r not in kregs and r in vec, f"{isa}: register {r} in {ins}"
                used.add(vec[r])
            elif kind == iced_x86.OpKind.MEMORY:
                assert ins.memory_base == reg.RIP and ins.memory_index == reg.NONE
    assert used <= {ONLY_X, *ONLY_TEMPS}, used


# ------------------------------------------------------------------ interface

def test_temps_needed_values():
    assert {alg: E.temps_needed(alg) for alg in E.ALGS} == {
        "relu": 1, "clip": 1, "linear": 0, "abs": 0, "square": 0, "sqrt": 0, "exp": 2, "logistic": 3,
        "tanh": 3, "gelu_tanh": 3, "gelu_erf": 4, "swish": 3, "hardswish": 2, "round": 0}


def test_bad_arguments():
    from jit.dot import vector_register

    zpath, ypath = fast_path("avx512_core"), fast_path("avx2")
    z = [vector_register(zpath, i) for i in range(6)]
    y = [vector_register(ypath, i) for i in range(6)]
    with pytest.raises(ValueError, match="alg"):
        E.temps_needed("gelu")
    with pytest.raises(ValueError, match="temps"):
        E.emit_eltwise(zpath, "exp", 0.0, 0.0, z[0], z[1:2], "t")
    with pytest.raises(ValueError, match="temps"):
        E.emit_eltwise(zpath, "exp", 0.0, 0.0, z[0], y[1:3], "t")  # ymm temps on a zmm path
    with pytest.raises(ValueError, match="temps"):
        E.emit_eltwise(ypath, "exp", 0.0, 0.0, y[0], [y[1], y[0]], "t")  # x among the temps
    with pytest.raises(ValueError, match="alpha"):
        E.emit_eltwise(ypath, "relu", float("nan"), 0.0, y[0], y[1:2], "t")
    with pytest.raises(ValueError, match="beta"):
        E.emit_eltwise(ypath, "linear", 1.0, float("inf"), y[0], [], "t")
    with pytest.raises(ValueError, match="alpha"):
        E.emit_eltwise(ypath, "linear", 1e39, 0.0, y[0], [], "t")
    assert E.check_params("clip", float("-inf"), 1.0) == (-math.inf, 1.0)
    assert E.check_params("linear", 0.1, 0.0)[0] == float(F(0.1))


def test_coefficients_are_the_fits():
    """The stored polynomial coefficients are what the documented fits produce."""
    from primitives.eltwise_ref import fit_erfc_g, fit_expm1_q

    q, q_err = fit_expm1_q()
    assert q == E.EXPM1_Q and q_err < 3e-10
    g, g_err = fit_erfc_g()
    assert np.allclose(g, E.ERFC_G, rtol=0, atol=1e-6) and g_err < 3e-8
