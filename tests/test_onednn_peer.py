"""The oneDNN peer (tools/onednn.py) and the facts int8jit's GEMM is checked against.

oneDNN 3.2 (PyPI ``onednn-cpu-gomp``) through its C API, each ISA path in a child
process started with ``ONEDNN_MAX_CPU_ISA`` set before the library loads:

* VNNI paths (``avx512_core_vnni``, ``avx2_vnni``, and the AMX default on CPUs that
  have it) compute the exact int32 result: the seeds' 64770 and 32258.
* ``avx2`` and ``avx512_core`` (VPMADDUBSW) saturate each pair sum to s16: 32767 and
  255, and whole matrices saturate. They match :func:`saturating_model` bit for bit,
  which records what oneDNN really does there, measured here:
  - s8/s8 adds 128 to A and subtracts ``128 * colsum(B)``; ``ao``/``bo`` are applied
    exactly afterwards (``- ao * colsum(B) - bo * rowsum(A) + K * ao * bo``);
  - pairs are (k, k+1) from the start of each K block, and oneDNN splits K
    (``avx512_core``: K <= 384 one block, K < 1536 two blocks of ceil(K/2) and
    floor(K/2), else blocks of 768; ``avx2``: 256 / 512 / 384), so an odd first block
    leaves an unpaired element and shifts the pairing after it;
  - ``avx512_core`` has a GEMV kernel, used when ``ao = bo = 0``, ``offsetc='F'`` and
    ``co[0] = 0``, for M = 1 with ``transb='T'``, else for N = 1 with ``transa='N'``:
    no K split, and in the N = 1 case s8/s8 shifts B (not A) by 128 and subtracts
    ``128 * rowsum(A)``;
  - ``avx2`` s8/s8 with a non-zero ``ao`` or ``bo`` takes another implementation: no
    saturation, but the result goes through f32 once (``f32(acc + beta * C + co)``),
    so values beyond 2**24 are rounded to float precision.
* ``offsetc='C'`` adds a column vector (M values, ``co[i]`` to row i); ``'R'`` a row
  vector (N values, ``co[j]`` to column j), as in BLAS.

Every test skips, with the reason, where the peer cannot be loaded or the CPU lacks the
ISA path.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from tools import onednn

OK, WHY = onednn.available()
pytestmark = pytest.mark.skipif(not OK, reason=f"oneDNN peer unavailable: {WHY}")

EXACT_ISAS = ("avx512_core_vnni", "avx2_vnni")
SATURATING_ISAS = ("avx512_core", "avx2")
# oneDNN 3.2's K blocking on the VPMADDUBSW paths: (one block up to, block size).
K_BLOCKING = {"avx512_core": (384, 768), "avx2": (256, 384)}

# The seeds (../shared/seeds/000_*.txt): four products, M = N = 1, K = 4.
SEED_U8 = np.array([[255, 255, 0, 0]], np.uint8)
SEED_S8 = np.array([[127, 127, 0, 0]], np.int8)
SEED_B = np.array([[127], [127], [0], [0]], np.int8)


# ------------------------------------------------------------------ numpy models

def _op(x, trans, rows, cols):
    """op(X) as an int64 rows x cols matrix from the stored (possibly padded) array."""
    stored = x[:cols, :rows].T if trans == "T" else x[:rows, :cols]
    return stored.astype(np.int64)


def _offset(offsetc, co, M, N):
    co = co.astype(np.int64)
    return {"F": lambda: co[0], "C": lambda: co[:M, None], "R": lambda: co[None, :N]}[offsetc]()


def exact_model(kind, transa, transb, offsetc, M, N, K, alpha, A, lda, ao, B, ldb, bo,
                beta, C, ldc, co):
    """C = (op(A) - ao)(op(B) - bo) + beta * C + co in int64 (alpha = 1, beta 0 or 1)."""
    assert alpha == 1 and beta in (0, 1)
    a, b = _op(A, transa, M, K), _op(B, transb, K, N)
    acc = (a - ao) @ (b - bo)
    return acc + int(beta) * C[:M, :N].astype(np.int64) + _offset(offsetc, co, M, N)


def k_blocks(isa, K):
    small, block = K_BLOCKING[isa]
    if K <= small:
        return [K]
    if K < 2 * block:
        return [(K + 1) // 2, K // 2]
    return [block] * (K // block) + ([K % block] if K % block else [])


def _pair_sums(u, s, blocks):
    """sum over pairs of sat16(u[:, k] * s[k] + u[:, k+1] * s[k+1]), pairs per block."""
    acc = np.zeros((u.shape[0], s.shape[1]), np.int64)
    k0 = 0
    for kb in blocks:
        for k in range(k0, k0 + kb, 2):
            pair = np.outer(u[:, k], s[k])
            if k + 1 < k0 + kb:
                pair += np.outer(u[:, k + 1], s[k + 1])
            acc += np.clip(pair, -32768, 32767)
        k0 += kb
    return acc


def _gemv_kind(isa, transa, transb, offsetc, M, N, ao, bo, co):
    """Which GEMV variant oneDNN's avx512_core takes, or None for its GEMM."""
    if isa != "avx512_core" or ao or bo or offsetc != "F" or co[0] != 0:
        return None
    if M == 1 and transb == "T":
        return "shift_a"
    if N == 1 and transa == "N":
        return "shift_b"
    return None


def saturating_model(isa, kind, transa, transb, offsetc, M, N, K, alpha, A, lda, ao, B,
                     ldb, bo, beta, C, ldc, co):
    """What oneDNN 3.2 computes on its VPMADDUBSW paths (see the module docstring)."""
    assert alpha == 1 and beta in (0, 1)
    a, b = _op(A, transa, M, K), _op(B, transb, K, N)
    c = int(beta) * C[:M, :N].astype(np.int64)
    if isa == "avx2" and kind == "s8s8" and (ao or bo):
        exact = (a - ao) @ (b - bo) + c + _offset(offsetc, co, M, N)
        return exact.astype(np.float32).astype(np.int64)
    gemv = _gemv_kind(isa, transa, transb, offsetc, M, N, ao, bo, co)
    if gemv == "shift_b" and kind == "s8s8":
        raw = _pair_sums(b.T + 128, a.T, [K]).T - 128 * a.sum(1)[:, None]
    else:
        blocks = [K] if gemv else k_blocks(isa, K)
        raw = _pair_sums(a + 128 if kind == "s8s8" else a, b, blocks)
        if kind == "s8s8":
            raw -= 128 * b.sum(0)[None, :]
    raw = raw - ao * b.sum(0)[None, :] - bo * a.sum(1)[:, None] + K * ao * bo
    return raw + c + _offset(offsetc, co, M, N)


# ------------------------------------------------------------------ helpers

def gemm_args(kind, M, N, K, *, transa="N", transb="N", offsetc="F", A=None, B=None,
              ao=0, bo=0, beta=0.0, C=None, co=None, pad=0):
    """oneDNN's argument list; matrices stored as contiguous (rows, ld) arrays."""
    a_rows, a_cols = (M, K) if transa == "N" else (K, M)
    b_rows, b_cols = (K, N) if transb == "N" else (N, K)
    lda, ldb, ldc = a_cols + pad, b_cols + pad, N + pad
    a_type = np.uint8 if kind == "u8s8" else np.int8
    if A is None:
        A = np.zeros((a_rows, lda), a_type)
    if B is None:
        B = np.zeros((b_rows, ldb), np.int8)
    if C is None:
        C = np.zeros((M, ldc), np.int32)
    if co is None:
        co = np.zeros({"F": 1, "C": M, "R": N}[offsetc], np.int32)
    return (transa, transb, offsetc, M, N, K, 1.0, A, lda, ao, B, ldb, bo, beta, C, ldc, co)


def fill_random(rng, args):
    """Fill A and B (padding included) with full-range random values; returns args."""
    for index in (7, 10):
        info = np.iinfo(args[index].dtype)
        args[index][...] = rng.integers(info.min, info.max + 1, args[index].shape)
    return args


def random_args(rng, kind, M, N, K, *, offsets=True):
    """Full-range random operands, transposes, offsets, offsetc, beta and padding."""
    transa, transb = (str(t) for t in rng.choice(["N", "T"], 2))
    offsetc = str(rng.choice(list("FCR")))
    args = list(fill_random(rng, gemm_args(kind, M, N, K, transa=transa, transb=transb,
                                           offsetc=offsetc, pad=int(rng.integers(0, 5)))))
    info = np.iinfo(args[7].dtype)
    args[14] = rng.integers(-10**6, 10**6, args[14].shape).astype(np.int32)
    args[16] = rng.integers(-10**6, 10**6, args[16].shape).astype(np.int32)
    if offsets:
        args[9] = int(rng.integers(info.min, info.max + 1))
        args[12] = int(rng.integers(-128, 128))
    args[13] = float(rng.integers(0, 2))
    return tuple(args)


def random_shape(rng):
    """Shapes around the edges that matter: 1, tails, and oneDNN's K block limits."""
    M = int(rng.choice([1, 2, 3, rng.integers(1, 70)]))
    N = int(rng.choice([1, 2, 17, rng.integers(1, 70)]))
    K = int(rng.choice([1, 2, 3, 4, 5, rng.integers(1, 300), rng.integers(250, 1700)]))
    return M, N, K


def run(isa, kind, calls_args):
    """Run gemm calls in a child capped at ``isa``; skip if oneDNN would run another ISA.

    Returns the C arrays (updated in place)."""
    calls = [(f"gemm_{kind}s32", args) for args in calls_args]
    info = onednn.run_many_in_subprocess(isa, calls)[-1]
    if info["isa"] != isa:
        pytest.skip(f"oneDNN runs {info['isa']} under ONEDNN_MAX_CPU_ISA={isa.upper()}: "
                    f"this CPU lacks {isa}")
    return [args[14] for args in calls_args]


def result(args):
    return args[14][: args[3], : args[4]]


def default_is_exact():
    """Whether oneDNN's uncapped choice in this process is a VNNI (or AMX) path."""
    isa = onednn.effective_isa()
    return "vnni" in isa or isa.startswith(("avx512_core_bf16", "avx512_core_fp16",
                                            "avx512_core_amx"))


# ------------------------------------------------------------------ the peer itself

def test_library_loads_and_reports_itself():
    assert onednn.library_path().is_file()
    assert onednn.version().startswith("3.")
    assert onednn.effective_isa() in onednn.CPU_ISA
    info = onednn.run_many_in_subprocess("avx2", [("max_threads", ())], threads=1)[-1]
    assert info["threads"] == 1 and info["version"] == onednn.version()


def test_a_library_named_by_the_variable_is_the_only_one_tried(tmp_path):
    """INT8JIT_ONEDNN_LIB naming a file that does not load makes the peer unavailable,
    saying so; it had fallen back silently to the wheel's copy."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, INT8JIT_ONEDNN_LIB=str(tmp_path / "libdnnl.so"))
    proc = subprocess.run([sys.executable, "-m", "tools.onednn", "info"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout
    assert "libdnnl not loaded from INT8JIT_ONEDNN_LIB; " in proc.stdout + proc.stderr
    assert f"tried: {tmp_path / 'libdnnl.so'} (missing)" in proc.stdout + proc.stderr
    env[onednn.ENV_LIB] = str(onednn.library_path())
    proc = subprocess.run([sys.executable, "-m", "tools.onednn", "info"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and str(onednn.library_path()) in proc.stdout, proc.stdout + proc.stderr


def test_wrapper_validates_before_calling():
    good = gemm_args("u8s8", 2, 3, 4)
    bad = {
        7: np.zeros((2, 4), np.int8),          # A must be u8 for u8s8
        10: np.zeros((4, 3), np.int32),        # B must be s8
        14: np.zeros((2, 2), np.int32),        # C too narrow
        16: np.zeros(0, np.int32),             # co empty
        0: "X",                                # transa letter
        2: "Z",                                # offsetc letter
        8: 3,                                  # lda < K
    }
    for index, value in bad.items():
        args = list(good)
        args[index] = value
        with pytest.raises((TypeError, ValueError)):
            onednn.gemm_u8s8s32(*args)
    with pytest.raises(ValueError, match="co"):  # 'R' needs N values
        onednn.gemm_u8s8s32(*gemm_args("u8s8", 2, 3, 4, offsetc="R", co=np.zeros(2, np.int32)))
    view = np.zeros((2, 8), np.uint8)[:, :4]  # lda = 8 given as a view: accepted
    onednn.gemm_u8s8s32("N", "N", "F", 2, 3, 4, 1.0, view, 8, 0, np.zeros((4, 3), np.int8),
                        3, 0, 0.0, np.zeros((2, 3), np.int32), 3, np.zeros(1, np.int32))


def test_offsetc_column_and_row_vectors():
    M, N = 3, 5
    for offsetc, n, expect in [
        ("F", 1, np.full((M, N), 7)),
        ("C", M, np.repeat([[7], [8], [9]], N, axis=1)),   # co[i] added to row i
        ("R", N, np.tile([7, 8, 9, 10, 11], (M, 1))),      # co[j] added to column j
    ]:
        args = gemm_args("u8s8", M, N, 4, offsetc=offsetc, co=np.arange(7, 7 + n, dtype=np.int32))
        onednn.gemm_u8s8s32(*args)
        np.testing.assert_array_equal(result(args), expect)


# ------------------------------------------------------------------ the seeds

@pytest.mark.parametrize("isa", EXACT_ISAS + SATURATING_ISAS)
def test_seeds_per_isa(isa):
    u8 = gemm_args("u8s8", 1, 1, 4, A=SEED_U8, B=SEED_B)
    s8 = gemm_args("s8s8", 1, 1, 4, A=SEED_S8, B=SEED_B)
    run(isa, "u8s8", [u8])
    run(isa, "s8s8", [s8])
    if isa in EXACT_ISAS:
        assert (int(u8[14][0, 0]), int(s8[14][0, 0])) == (64770, 32258)
    else:  # 255*127 + 255*127 saturates to 32767; s8/s8: 32767 - 128*254 = 255
        assert (int(u8[14][0, 0]), int(s8[14][0, 0])) == (32767, 255)


def test_seeds_default_path_in_process_is_exact():
    if not default_is_exact():
        pytest.skip(f"oneDNN's default here is {onednn.effective_isa()}, not a VNNI path")
    u8 = gemm_args("u8s8", 1, 1, 4, A=SEED_U8, B=SEED_B)
    s8 = gemm_args("s8s8", 1, 1, 4, A=SEED_S8, B=SEED_B)
    onednn.gemm_u8s8s32(*u8)
    onednn.gemm_s8s8s32(*s8)
    assert (int(u8[14][0, 0]), int(s8[14][0, 0])) == (64770, 32258)


@pytest.mark.parametrize("isa", SATURATING_ISAS)
def test_whole_512_cube_saturates(isa):
    M = N = K = 512
    u8 = gemm_args("u8s8", M, N, K, A=np.full((M, K), 255, np.uint8),
                   B=np.full((K, N), 127, np.int8))
    s8 = gemm_args("s8s8", M, N, K, A=np.full((M, K), 127, np.int8),
                   B=np.full((K, N), 127, np.int8))
    run(isa, "u8s8", [u8])
    run(isa, "s8s8", [s8])
    assert (u8[14] == K // 2 * 32767).all()                       # 8388352, exact 16581120
    assert (s8[14] == K // 2 * 32767 - 128 * 127 * K).all()       # 65280, exact 8258048


# ------------------------------------------------------------------ random data

@pytest.mark.parametrize("kind", ["u8s8", "s8s8"])
@pytest.mark.parametrize("isa", EXACT_ISAS + ("default",))
def test_vnni_paths_equal_exact_int64_matmul(isa, kind):
    rng = np.random.default_rng(zlib.crc32(f"{isa}{kind}".encode()))
    cases = [random_args(rng, kind, *random_shape(rng)) for _ in range(24)]
    expected = [exact_model(kind, *args) for args in cases]
    if isa == "default":
        if not default_is_exact():
            pytest.skip(f"oneDNN's default here is {onednn.effective_isa()}, not a VNNI path")
        for args in cases:
            getattr(onednn, f"gemm_{kind}s32")(*args)
    else:
        run(isa, kind, cases)
    for args, want in zip(cases, expected):
        np.testing.assert_array_equal(result(args), want, err_msg=f"M,N,K={args[3:6]}")


@pytest.mark.parametrize("kind", ["u8s8", "s8s8"])
@pytest.mark.parametrize("isa", SATURATING_ISAS)
def test_saturating_paths_match_the_model_bit_for_bit(isa, kind):
    rng = np.random.default_rng(zlib.crc32(f"{isa}{kind}1".encode()))
    cases = [random_args(rng, kind, *random_shape(rng), offsets=bool(i % 2)) for i in range(30)]
    cases += [random_args(rng, kind, 24, 16, K) for K in (385, 386, 777, 1535, 1537, 1600)]
    for M, N, transa, transb in [(24, 1, "N", "N"), (1, 24, "N", "T"), (1, 1, "N", "N"),
                                 (1, 1, "T", "T"), (24, 1, "T", "N"), (1, 24, "N", "N")]:
        # no offsets, offsetc='F', co = 0: avx512_core's GEMV where the shape allows
        cases.append(fill_random(rng, gemm_args(kind, M, N, 777, transa=transa, transb=transb)))
    expected = [saturating_model(isa, kind, *args) for args in cases]
    exact = [exact_model(kind, *args) for args in cases]
    run(isa, kind, cases)
    differ = 0
    for args, want, ex in zip(cases, expected, exact):
        np.testing.assert_array_equal(result(args), want,
                                      err_msg=f"{args[:3]} M,N,K={args[3:6]} ao,bo={args[9]},{args[12]}")
        differ += int((result(args) != ex).sum())
    assert differ > 0  # full-range data does saturate on these paths


@pytest.mark.parametrize("isa", SATURATING_ISAS)
def test_saturating_paths_are_wrong_almost_everywhere_on_full_range_data(isa):
    rng = np.random.default_rng(5)
    args = gemm_args("u8s8", 64, 48, 200, A=rng.integers(0, 256, (64, 200)).astype(np.uint8),
                     B=rng.integers(-128, 128, (200, 48)).astype(np.int8))
    run(isa, "u8s8", [args])
    wrong = int((result(args) != exact_model("u8s8", *args)).sum())
    assert wrong > 0.9 * 64 * 48
