"""Correctness of the int8 GEMM (primitives.gemm) on every executable ISA path.

Every result is compared BIT-EXACT with the numpy model ``primitives.reference.gemm``
(``faithful=True`` only for the faithful policy on a VPMADDUBSW path), and the elements
of C outside the M x N window (ldc padding) must come back unchanged.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from primitives import reference
from primitives.base import kept_setups
from primitives.gemm import Gemm, gemm, gemm_s8s8s32, gemm_u8s8s32
from runtime import isa as isa_mod
from tests.conftest import child_env, faithful_model, in_threads, isa_params, skip_reason

REPO = Path(__file__).resolve().parent.parent
POLICIES = ("exact", "faithful")
SENTINEL = np.int32(-0x5A5A5A5B)

SEED_U8 = np.array([[255, 255, 0, 0]], np.uint8)
SEED_S8 = np.array([[127, 127, 0, 0]], np.int8)
SEED_B = np.array([[127], [127], [0], [0]], np.int8)


# ------------------------------------------------------------------ helpers

def make_data(rng, kind, a_type, rows_a, cols_a, rows_b, cols_b):
    """(A, B) stored arrays (logical data only, no padding) of the given kind."""
    a_dt = np.uint8 if a_type == "u8" else np.int8
    lo, hi = (0, 256) if a_type == "u8" else (-128, 128)
    if kind == "random":
        A = rng.integers(lo, hi, (rows_a, cols_a), dtype=a_dt)
        B = rng.integers(-128, 128, (rows_b, cols_b), dtype=np.int8)
    elif kind == "saturating":
        A = np.full((rows_a, cols_a), hi - 1, a_dt)
        B = rng.choice(np.array([127, -128, 127, -127], np.int8), (rows_b, cols_b))
        if rng.integers(2):
            B[:] = B.flat[0]
    elif kind == "safe":
        A = rng.integers(lo, hi, (rows_a, cols_a), dtype=a_dt)
        B = rng.integers(-64, 65, (rows_b, cols_b), dtype=np.int8)
    elif kind == "sparse":  # safe weights but a few large ones: split into residual cells, or widened
        A = np.full((rows_a, cols_a), hi - 1, a_dt) if rng.integers(2) else \
            rng.integers(lo, hi, (rows_a, cols_a), dtype=a_dt)
        B = rng.integers(-64, 65, (rows_b, cols_b), dtype=np.int8)
        large = rng.random(B.shape) < rng.choice([0.002, 0.01, 0.05])
        B[large] = rng.choice(np.array([127, -128, 120, -100], np.int8), int(large.sum()))
    else:
        raise AssertionError(kind)
    return A, B


def padded(x, ld, fill=0):
    """``x`` (rows x cols) stored in a rows x ld buffer (padding ``fill``)."""
    out = np.full((x.shape[0], ld), fill, x.dtype)
    out[:, : x.shape[1]] = x
    return out


def run_and_check(*, isa, policy, a_type="u8", transa="N", transb="N", offsetc="F", M, N, K,
                  lda_pad=0, ldb_pad=0, ldc_pad=0, alpha=1.0, beta=0.0, ao=0, bo=0, kind="random",
                  seed=0, api="function", threads=None, with_co=True):
    """Run one GEMM through ``api`` and assert it equals the model bit for bit."""
    rng = np.random.default_rng(seed)
    a_rows, a_cols = (M, K) if transa == "N" else (K, M)
    b_rows, b_cols = (K, N) if transb == "N" else (N, K)
    A0, B0 = make_data(rng, kind, a_type, a_rows, a_cols, b_rows, b_cols)
    lda, ldb, ldc = max(1, a_cols) + lda_pad, max(1, b_cols) + ldb_pad, max(1, N) + ldc_pad  # oneDNN's minimum: 1
    A = padded(A0, lda, fill=rng.integers(0, 100))
    B = padded(B0, ldb, fill=rng.integers(-100, 100))
    C = rng.integers(-2**31, 2**31, (M, ldc), dtype=np.int64).astype(np.int32)
    C[:, N:] = SENTINEL
    # max(M, N) values for 'C'/'R': the model and the library agree on which one is read
    # (see test_gemm_onednn.py for oneDNN's convention, which they do not follow today)
    co_len = 1 if offsetc == "F" else max(M, N)
    co = rng.integers(-2**20, 2**20, co_len, dtype=np.int64).astype(np.int32) if with_co else None
    C_before, A_before, B_before = C.copy(), A.copy(), B.copy()
    want = reference.gemm(transa, transb, offsetc, M, N, K, alpha, A, lda, ao, B, ldb, bo, beta,
                          C_before, ldc, co, faithful=faithful_model(policy, isa))
    info = None
    if api == "function":
        fn = gemm_u8s8s32 if a_type == "u8" else gemm_s8s8s32
        co_arg = co if co is not None else np.zeros(co_len, np.int32)
        fn(transa, transb, offsetc, M, N, K, alpha, A, lda, ao, B, ldb, bo, beta, C, ldc, co_arg,
           policy=policy, isa=isa, threads=threads)
    else:
        g = Gemm(M, N, K, a_type=a_type, transa=transa, transb=transb, offsetc=offsetc, lda=lda, ldb=ldb,
                 ldc=ldc, alpha=alpha, beta=beta, policy=policy, isa=isa, threads=threads,
                 B=B if api == "create" else None)
        g.execute(A, C, B=B if api == "execute" else None, ao=ao, bo=bo, co=co)
        info = g.impl_info()
    got = C[:, :N]
    if not np.array_equal(got, want):
        bad = np.argwhere(got != want)
        i, j = bad[0]
        raise AssertionError(
            f"{len(bad)} of {M * N} elements differ on {isa}/{policy} (M={M} N={N} K={K}); "
            f"first at ({i}, {j}): got {got[i, j]}, want {want[i, j]}")
    assert np.all(C[:, N:] == SENTINEL), "C's ldc padding was written"
    assert np.array_equal(A, A_before) and np.array_equal(B, B_before), "A or B was modified"
    return C, want, info


# ------------------------------------------------------------------ the seeds' examples

@pytest.mark.parametrize("policy", POLICIES)
def test_seed_examples(isa_path, policy):
    """u8/s8 {255,255,0,0}x{127,..}: 64770; s8/s8 {127,127,0,0}x{127,..}: 32258.

    Faithful on the VPMADDUBSW paths: 32767 and 255, as the seeds compute them.
    """
    saturating = faithful_model(policy, isa_path)
    want_u8, want_s8 = (32767, 255) if saturating else (64770, 32258)
    assert int(gemm(SEED_U8, SEED_B, policy=policy, isa=isa_path)[0, 0]) == want_u8
    assert int(gemm(SEED_S8, SEED_B, policy=policy, isa=isa_path)[0, 0]) == want_s8
    # and through oneDNN's argument list
    C = np.zeros((1, 1), np.int32)
    co = np.zeros(1, np.int32)
    gemm_u8s8s32("N", "N", "F", 1, 1, 4, 1.0, SEED_U8, 4, 0, SEED_B, 1, 0, 0.0, C, 1, co,
                 policy=policy, isa=isa_path)
    assert int(C[0, 0]) == want_u8
    gemm_s8s8s32("N", "N", "F", 1, 1, 4, 1.0, SEED_S8, 4, 0, SEED_B, 1, 0, 0.0, C, 1, co,
                  policy=policy, isa=isa_path)
    assert int(C[0, 0]) == want_s8


@pytest.mark.parametrize("policy", POLICIES)
def test_seed_examples_tiled(isa_path, policy):
    """The seed rows repeated over a whole matrix (every element saturates on faithful)."""
    A = np.tile(SEED_U8, (37, 9))
    B = np.tile(SEED_B, (9, 45))
    saturating = faithful_model(policy, isa_path)
    assert np.all(gemm(A, B, policy=policy, isa=isa_path) == (32767 if saturating else 64770) * 9)
    As = np.tile(SEED_S8, (37, 9))
    assert np.all(gemm(As, B, policy=policy, isa=isa_path) == (255 if saturating else 32258) * 9)


# ------------------------------------------------------------------ properties

small_biased = st.one_of(st.integers(1, 8), st.integers(1, 40), st.integers(1, 300))
ALPHA_BETA = [(1.0, 0.0), (1.0, 1.0), (0.5, 0.0), (-1.5, 1.0), (2.0, 0.5), (1.0, -1.0)]


@st.composite
def gemm_cases(draw):
    case = dict(
        a_type=draw(st.sampled_from(["u8", "s8"])),
        transa=draw(st.sampled_from("NT")), transb=draw(st.sampled_from("NT")),
        offsetc=draw(st.sampled_from("FCR")),
        M=draw(small_biased), N=draw(small_biased), K=draw(small_biased),
        lda_pad=draw(st.sampled_from([0, 0, 1, 3, 64])), ldb_pad=draw(st.sampled_from([0, 0, 1, 5])),
        ldc_pad=draw(st.sampled_from([0, 0, 1, 17])),
        kind=draw(st.sampled_from(["random", "random", "saturating", "safe", "sparse"])),
        seed=draw(st.integers(0, 2**32 - 1)),
        api=draw(st.sampled_from(["function", "create", "execute"])),
        with_co=draw(st.booleans()),
    )
    case["alpha"], case["beta"] = draw(st.sampled_from(ALPHA_BETA))
    return draw_offsets(draw, case)


def draw_offsets(draw, case: dict) -> dict:
    """``case`` with ao (in A's range) and bo drawn: 0 often, else any."""
    lo, hi = (0, 255) if case["a_type"] == "u8" else (-128, 127)
    case["ao"] = draw(st.one_of(st.just(0), st.integers(lo, hi)))
    case["bo"] = draw(st.one_of(st.just(0), st.integers(-128, 127)))
    return case


PROPERTY = settings(max_examples=int(os.environ.get("INT8JIT_TEST_EXAMPLES", "50")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("policy", POLICIES)
@PROPERTY
@given(case=gemm_cases())
def test_property_matches_model(isa_path, policy, case):
    """Any shape, transposes, leading dims, offsets, alpha/beta, data: equals the model."""
    _, _, info = run_and_check(isa=isa_path, policy=policy, **case)
    if info is not None:  # impl_info reports the decision taken (B at creation or at execution)
        check_decision(info, isa_path, policy, case["kind"] == "safe", runtime=case["api"] == "execute")


def check_decision(info, isa, policy, safe_weights, runtime=False):
    """``runtime``: B was given at execution (packed for that call alone)."""
    assert info["isa"] == isa and info["policy"] == policy
    if isa.endswith("vnni"):
        assert info["path"] == "vnni"
    elif policy == "faithful":
        assert info["path"] == "maddubsw"
    elif runtime:  # exact without VNNI: widened, no proof per call
        assert info["path"] == "widen" and "B given at execution" in info["decision"], info["decision"]
    elif safe_weights:
        # |w| <= 64: 255 * (|w0| + |w1|) <= 32640, every pair proven safe -> fast path
        assert info["safe_pairs"] == info["total_pairs"]
        assert info["path"] == "maddubsw", info["decision"]
    elif info["path"] == "maddubsw":  # every pair safe, or the unsafe ones split into cells
        assert info["safe_pairs"] == info["total_pairs"] or (info["cells"] and "residual cells" in info["decision"])
    else:
        assert info["path"] == "widen" and info["safe_pairs"] < info["total_pairs"], info["decision"]
    if info["path"] != "maddubsw":
        assert info["exact"]


def in_place_expected(isa: str, policy: str, transb: str, M: int, N: int, K: int, ldb: int, a_type: str,
                      ao: int, beta: float) -> bool:
    """Whether a Gemm of 1-4 rows, integer mode, reads B given at execution in place:
    AVX-512 takes any N and K; AVX2's dword masks whole dwords of the rows read (N for
    B's rows, K for its columns); rows a multiple of 2048 bytes apart only by 1-2 rows
    of A (K in chunks, a row at a time, as for 8 MB of rows or more), more are packed,
    but from 8 MB of them (a row at a time in chunks too); the rows kernel holds the rows
    its registers leave room for (fewer with column sums)."""
    from jit.dot import fast_path, widening_path
    from jit.gemv_kernel import rows_max
    from jit.output import OutputSpec

    alias = transb == "N" and K >= 16 and ldb % 2048 == 0
    big = K >= 16 and K * ldb >= 8 << 20
    if alias and M > 2 and not big:
        return False
    chunked = transb == "N" and (M <= 2 and (alias or big) or alias and big)  # (else 3-4 rows: all of K)
    if not (isa.startswith("avx512") or (N if transb == "N" else K) % 4 == 0):
        return False
    path = widening_path(isa) if policy == "exact" and not isa.endswith("vnni") else fast_path(isa)
    comp = ao != 0 or a_type == "s8" and path.kind != "widen"
    output = OutputSpec(col_comp=False, accumulate=beta == 1.0)
    return transb == "T" or (1 if chunked else M) <= rows_max(path, comp, output)  # (chunked: a row at a time)


@st.composite
def in_place_cases(draw):
    case = dict(
        a_type=draw(st.sampled_from(["u8", "s8"])), transa=draw(st.sampled_from("NT")),
        transb=draw(st.sampled_from("NT")), offsetc=draw(st.sampled_from("FCR")),
        M=draw(st.integers(1, 4)), N=draw(small_biased), K=draw(small_biased),
        lda_pad=draw(st.sampled_from([0, 1, 3])), ldb_pad=draw(st.sampled_from([0, 0, 1, 4])),
        ldc_pad=draw(st.sampled_from([0, 1, 17])),
        kind=draw(st.sampled_from(["random", "saturating", "safe", "sparse"])),
        seed=draw(st.integers(0, 2**32 - 1)), with_co=draw(st.booleans()),
        beta=draw(st.sampled_from([0.0, 1.0])),
    )
    draw_offsets(draw, case)
    if draw(st.integers(0, 3)) == 0:  # rows of B 2048 bytes apart: K in chunks (1-2 rows), or packed
        case["ldb_pad"] = 2048 - (case["N"] if case["transb"] == "N" else case["K"])
    return case


@pytest.mark.parametrize("policy", POLICIES)
@PROPERTY
@given(case=in_place_cases())
def test_few_rows_read_b_in_place(isa_path, policy, case):
    """1-4 rows of A times a B given at execution, in integer mode (alpha 1, beta 0 or
    1): B read in place by the gemv kernels, the offsets they leave (bo's row term, co)
    added after; equal to the model (faithful: VPMADDUBSW's pairs, saturating alike)."""
    _, _, info = run_and_check(isa=isa_path, policy=policy, api="execute", **case)
    ldb = (case["N"] if case["transb"] == "N" else case["K"]) + case["ldb_pad"]
    want = in_place_expected(isa_path, policy, case["transb"], case["M"], case["N"], case["K"], ldb, case["a_type"],
                             case["ao"], case["beta"])
    assert ("runtime_weights" in info) == want, info
    if want:
        assert info["runtime_weights"].startswith("read in place by gemv_"), info


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("M,N,K,transb,ldb_pad,offsetc,bo,beta", [
    (1, 37, 131, "N", 0, "R", -7, 1.0),   # N and K tails
    (4, 64, 3, "T", 1, "C", 5, 0.0),      # K < 4
    (2, 2048, 43, "N", 0, "F", 0, 0.0),   # rows 2048 bytes apart: K in chunks of 8 rows, then 3
    (1, 100, 1030, "N", 3996, "C", 2, 1.0),  # rows 4096 bytes apart, chunks and 6 rows
    (3, 2048, 40, "N", 0, "R", 0, 0.0),   # 3 rows: packed
    (3, 96, 2048, "T", 0, "R", 3, 1.0),   # columns of 2048 bytes: in place
    (1, 1, 1, "N", 0, "F", 1, 0.0),
])
def test_few_rows_in_place_cases(isa_path, policy, M, N, K, transb, ldb_pad, offsetc, bo, beta):
    """Fixed cases around the in-place reads' limits, through the one-off call and a Gemm."""
    for a_type in ("u8", "s8"):
        run_and_check(isa=isa_path, policy=policy, a_type=a_type, M=M, N=N, K=K, transb=transb,
                      ldb_pad=ldb_pad, offsetc=offsetc, ao=9 if a_type == "u8" else -3, bo=bo, beta=beta,
                      kind="saturating", seed=3)
        _, _, info = run_and_check(isa=isa_path, policy=policy, a_type=a_type, M=M, N=N, K=K, transb=transb,
                                   ldb_pad=ldb_pad, offsetc=offsetc, bo=bo, beta=beta, seed=4, api="execute")
        ldb = (N if transb == "N" else K) + ldb_pad
        assert ("runtime_weights" in info) == in_place_expected(isa_path, policy, transb, M, N, K, ldb, a_type, 0,
                                                                beta), info


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("M,N,K,transb", [(256, 256, 48, "N"), (64, 200, 97, "N"), (40, 1000, 130, "T"),
                                          (9, 64, 2, "N")])
@pytest.mark.parametrize("shift", [False, True])
def test_b_packed_with_its_product(isa_path, threads, M, N, K, transb, shift, monkeypatch):
    """A B given at execution: each thread packs the columns its product reads, in one
    hand-off, where the packer's and the plan's splits agree (always on one thread); with
    an s8 A or a zero point (and bo 0) it makes its columns' compensation term from the
    sums it packed in between (jit.column_term). An s8 A shifted once per call or not
    (``shift``: Intel's choice on every path, or none). Each call twice, the second on the
    same arrays with new values (replayed); every result equals the model."""
    from primitives import gemm as gemm_mod

    monkeypatch.setattr(gemm_mod, "shifts_s8_a_once", lambda path: shift)
    rng = np.random.default_rng(threads)
    for policy in POLICIES:
        for a_type, lo in (("s8", -128),) if shift else (("u8", 0), ("s8", -128)):  # (a u8 A is never shifted)
            g = Gemm(M, N, K, a_type=a_type, transb=transb, policy=policy, isa=isa_path, threads=threads)
            for ao, bo in ((0, 0), (0, 0), (7, 0), (0, 3), (7, -2), (-5 if lo else 5, 0)):
                A = rng.integers(lo, lo + 256, (M, K)).astype(np.uint8 if a_type == "u8" else np.int8)
                B = rng.integers(-128, 128, (K, N) if transb == "N" else (N, K), dtype=np.int8)
                C = np.zeros((M, N), np.int32)
                for again in range(2):
                    if again:
                        A[...] = rng.integers(lo, lo + 256, A.shape)
                        B[...] = rng.integers(-128, 128, B.shape)
                    g.execute(A, C, B=B, ao=ao, bo=bo)
                    want = reference.gemm("N", transb, "F", M, N, K, 1.0, A, K, ao, B, B.shape[1], bo, 0.0, C, N,
                                          np.zeros(1, np.int32), faithful=faithful_model(policy, isa_path))
                    assert np.array_equal(C, want), (policy, a_type, ao, bo, again)
                fused = g.impl_info()["blocking"]["b_packed_with_its_product"]
                if (ao or a_type == "s8") and bo:  # (the column sums first: the row term's set-up reads A)
                    assert not fused
                elif threads == 1:
                    assert fused, (policy, a_type, ao, bo)
    if isa_path.startswith("avx512") and (M, threads) == (256, 2):  # (4 tiles of 64 columns, 4 chunks)
        assert fused


@pytest.mark.parametrize("policy", POLICIES)
def test_one_row_times_8_mb_of_b_rows(isa_path, policy):
    """1 x 2100 x 4000: B's rows (8.4 MB, not aliasing) read in place in chunks of K (but
    where the 256-bit kernel has no room for the column sums: packed), with a zero point
    and beta 1 or without; 3 x 2048 x 4096 (8 MB of aliasing rows): each row in chunks
    too; equal to the model."""
    for M, N, K in ((1, 2100, 4000), (3, 2048, 4096)):
        for ao, beta in ((3, 1.0), (0, 0.0)):
            _, _, info = run_and_check(isa=isa_path, policy=policy, M=M, N=N, K=K, ao=ao, bo=-2, beta=beta,
                                       offsetc="R", seed=8, api="execute")
            if in_place_expected(isa_path, policy, "N", M, N, K, N, "u8", ao, beta):
                assert info["runtime_weights"].startswith("read in place by gemv_rows1_"), info
            else:
                assert "runtime_weights" not in info and ao and not isa_path.startswith("avx512"), info


def test_in_place_b_overlapping_c_is_packed(isa_path):
    """A B that shares memory with C (the kernel would read what it wrote) is packed first."""
    rng = np.random.default_rng(5)
    buf = rng.integers(-128, 128, 4 * 64 + 64 * 16, dtype=np.int64).astype(np.int32)
    B = buf.view(np.int8)[4 * 64 * 4:].reshape(64, 64)  # (bytes after C's)
    C = buf[:4 * 16].reshape(4, 16)
    A = rng.integers(0, 256, (4, 64), dtype=np.uint8)
    b_before = B.copy()
    g = Gemm(4, 16, 64, ldb=64, isa=isa_path)
    g.execute(A, C, B=B)
    assert np.array_equal(C, reference.gemm("N", "N", "F", 4, 16, 64, 1.0, A, 64, 0, b_before, 64, 0, 0.0,
                                            C, 16, np.zeros(1, np.int32)))
    Bc = buf.view(np.int8)[: 64 * 64].reshape(64, 64)  # (B over C's bytes)
    b_before = Bc.copy()
    g.execute(A, C, B=Bc)
    assert "runtime_weights" not in g.impl_info()
    assert np.array_equal(C, reference.gemm("N", "N", "F", 4, 16, 64, 1.0, A, 64, 0, b_before, 64, 0, 0.0,
                                            C, 16, np.zeros(1, np.int32)))


@pytest.mark.parametrize("a_type,ao", [("u8", 0), ("u8", 9), ("s8", 0)])
def test_packed_b_overlapping_c_on_two_threads(isa_path, a_type, ao):
    """A B that shares memory with C is packed whole before the product: with the
    packing in the product's hand-off, one thread's product would write C over columns of
    B that another has yet to pack. Twice, the second call replayed."""
    rng = np.random.default_rng(ao)
    M, N, K = 64, 256, 64  # (AVX-512: 4 tiles of 64 columns, two threads' packing and product split alike)
    C = np.zeros((M, N), np.int32)
    B = C.view(np.int8).reshape(-1)[: K * N].reshape(K, N)  # (B over C's first rows)
    lo = 0 if a_type == "u8" else -128
    A = rng.integers(lo, lo + 256, (M, K)).astype(np.uint8 if a_type == "u8" else np.int8)
    g = Gemm(M, N, K, a_type=a_type, isa=isa_path, threads=2)
    for _ in range(2):
        B[...] = rng.integers(-128, 128, B.shape)
        b_before = B.copy()
        g.execute(A, C, B=B, ao=ao)
        assert np.array_equal(C, reference.gemm("N", "N", "F", M, N, K, 1.0, A, K, ao, b_before, N, 0, 0.0, C,
                                                N, np.zeros(1, np.int32)))
        assert not g.impl_info()["blocking"]["b_packed_with_its_product"]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("a_type", ["u8", "s8"])
@pytest.mark.parametrize("kind", ["random", "saturating", "safe", "sparse"])
def test_data_kinds_every_path(isa_path, policy, a_type, kind):
    """Each data kind at a fixed odd shape with offsets (a deterministic floor under hypothesis)."""
    _, _, info = run_and_check(isa=isa_path, policy=policy, a_type=a_type, M=45, N=77, K=131, ao=3, bo=-5,
                               offsetc="C", lda_pad=3, ldc_pad=5, kind=kind, seed=11, api="create")
    check_decision(info, isa_path, policy, kind == "safe")


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("M,N,K,a_type,transa,transb", [
    (512, 512, 512, "u8", "N", "N"),
    (1000, 37, 1111, "s8", "T", "N"),
    (64, 1000, 333, "u8", "N", "T"),
])
def test_large(isa_path, policy, M, N, K, a_type, transa, transb):
    run_and_check(isa=isa_path, policy=policy, a_type=a_type, transa=transa, transb=transb, M=M, N=N, K=K,
                  ao=7 if a_type == "u8" else -7, bo=3, offsetc="R", beta=1.0, seed=M + N + K)


def test_large_saturating_faithful_512(isa_path):
    """A all 255, B all 127: every element of 512x512x512 saturates on VPMADDUBSW."""
    C, want, _ = run_and_check(isa=isa_path, policy="faithful", M=512, N=512, K=512, kind="saturating",
                               seed=1, with_co=False)
    if not isa_path.endswith("vnni"):
        exact = reference.gemm("N", "N", "F", 512, 512, 512, 1.0, np.full((512, 512), 255, np.uint8), 512, 0,
                               np.full((512, 512), 127, np.int8), 512, 0, 0.0, None, 512, None)
        assert exact[0, 0] == 255 * 127 * 512


# ------------------------------------------------------------------ tails, edges, threads

@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("a_type", ["u8", "s8"])
@pytest.mark.parametrize("M,N,K", [
    (1, 1, 1), (1, 1, 2), (1, 1, 3), (3, 5, 1), (2, 7, 2), (5, 3, 3), (1, 100, 4), (100, 1, 5),
    (1, 1, 7), (17, 1, 9), (1, 33, 10), (9, 65, 13), (33, 129, 258), (1, 300, 299), (300, 1, 301),
])
def test_edges(isa_path, policy, a_type, M, N, K):
    """K = 1, 2, 3 and K not a multiple of 4 or 2; M = 1; N = 1; tails in every dimension."""
    for kind in ("random", "saturating"):
        run_and_check(isa=isa_path, policy=policy, a_type=a_type, M=M, N=N, K=K, kind=kind, seed=M * N + K,
                      ao=1 if a_type == "u8" else -1, bo=2, offsetc="F")


@pytest.mark.parametrize("api", ["function", "create", "execute"])
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (1.0, 1.0), (2.0, 0.5)])
@pytest.mark.parametrize("M,N,K,offsetc", [
    (0, 5, 7, "F"), (6, 0, 7, "R"), (0, 0, 0, "F"), (6, 5, 0, "F"), (1, 1, 0, "C"), (33, 17, 0, "R"), (9, 40, 0, "C"),
])
def test_zero_sizes(isa_path, api, alpha, beta, M, N, K, offsetc):
    """M, N or K of 0 is a GEMM, as in numpy and oneDNN: M or N of 0 leaves C as it
    was; K of 0 has no product, so ao and bo vanish and C <- beta*C + co (what the output
    stage makes of a zero accumulator, float mode's rounding included). oneDNN 3.2
    returns at K = 0 without writing C; the formula it documents gives this."""
    for a_type in ("u8", "s8"):
        run_and_check(isa=isa_path, policy="exact", a_type=a_type, M=M, N=N, K=K, api=api, alpha=alpha, beta=beta,
                      offsetc=offsetc, ao=3, bo=-2, ldc_pad=2, seed=M + N + K)
    info = Gemm(M, N, K, isa=isa_path).impl_info()
    k_zero = K == 0 and M and N  # runs a K = 1 GEMM's kernel; M or N of 0 runs none
    assert ("K is 0" if k_zero else "M or N is 0") in info["decision"]
    assert info["isa"] == (isa_path if k_zero else "any")
    C = gemm(np.zeros((M, K), np.uint8), np.zeros((K, N), np.int8), ao=7, bo=5, isa=isa_path)
    assert C.shape == (M, N) and not C.any()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("M,N,K,offsetc,bo", [
    (1024, 16, 128, "R", 3),     # one N tile: the M split
    (1000, 7, 200, "C", 0),      # N narrower than a vector, M split with a tail row block
    (64, 1000, 64, "C", -2),     # many N tiles: the N split
    (37, 2000, 100, "R", 5),
])
def test_threads_agree(isa_path, policy, M, N, K, offsetc, bo):
    """threads=1 and threads=2 give the same (correct) result on M- and N-split chunks."""
    assert M * N * K >= 1 << 20  # large enough to be split
    results = []
    for threads in (1, 2):
        C, _, _ = run_and_check(isa=isa_path, policy=policy, a_type="s8", M=M, N=N, K=K, offsetc=offsetc,
                                bo=bo, ao=-3, ldc_pad=3, seed=5, threads=threads)
        results.append(C)
    assert np.array_equal(results[0], results[1])
    for alpha, beta in ((0.5, 1.0),):
        for threads in (1, 2):
            run_and_check(isa=isa_path, policy=policy, M=M, N=N, K=K, offsetc=offsetc, alpha=alpha, beta=beta,
                          bo=bo, seed=6, threads=threads, api="create")


# ------------------------------------------------------------------ the reusable primitive

@pytest.mark.parametrize("policy", POLICIES)
def test_gemm_reuse(isa_path, policy):
    """One Gemm executed twice with different A / ao / co; B at creation or at execution."""
    M, N, K = 29, 71, 45
    rng = np.random.default_rng(3)
    B = rng.integers(-128, 128, (K, N), dtype=np.int8)
    faithful = faithful_model(policy, isa_path)
    g = Gemm(M, N, K, offsetc="C", B=B, policy=policy, isa=isa_path)
    g_late = Gemm(M, N, K, offsetc="C", policy=policy, isa=isa_path)
    for ao in (0, 200, 17):
        A = rng.integers(0, 256, (M, K), dtype=np.uint8)
        co = rng.integers(-1000, 1000, max(M, N), dtype=np.int32)
        want = reference.gemm("N", "N", "C", M, N, K, 1.0, A, K, ao, B, N, 0, 0.0, None, N, co, faithful=faithful)
        C = np.full((M, N), 99, np.int32)
        g.execute(A, C, ao=ao, co=co)
        assert np.array_equal(C, want)
        C2 = np.full((M, N), -99, np.int32)
        g_late.execute(A, C2, B=B, ao=ao, co=co)
        assert np.array_equal(C2, want)
    # the late-B primitive takes another B at each execution
    B2 = rng.integers(-64, 65, (K, N), dtype=np.int8)
    A = rng.integers(0, 256, (M, K), dtype=np.uint8)
    C = np.zeros((M, N), np.int32)
    g_late.execute(A, C, B=B2, bo=-4)
    assert np.array_equal(C, reference.gemm("N", "N", "C", M, N, K, 1.0, A, K, 0, B2, N, -4, 0.0, None, N, None,
                                            faithful=faithful))
    # a primitive created without B must be given one
    with pytest.raises(ValueError, match="B"):
        Gemm(M, N, K, isa=isa_path).execute(A, C)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("a_type,offsetc,alpha,beta,transb", [("u8", "R", 1.0, 1.0, "N"), ("s8", "F", 1.0, 0.0, "T"),
                                                               ("u8", "C", 0.5, 2.0, "N"), ("s8", "R", 2.0, 0.0, "N")])
def test_one_off_calls_keep_their_gemm(isa_path, policy, a_type, offsetc, alpha, beta, transb):
    """gemm_u8s8s32 / gemm_s8s8s32 called again with the same signature reuse a kept Gemm
    (its B packer's buffers and plan): new B values in the same array and in another,
    new A, offsets and co, the column sums of each call's B (an s8 A, a source offset)
    recomputed in place; every result as the model's."""
    M, N, K = 9, 40, 37
    rng = np.random.default_rng(11)
    fn = gemm_u8s8s32 if a_type == "u8" else gemm_s8s8s32
    lo = 0 if a_type == "u8" else -128
    faithful = faithful_model(policy, isa_path)
    B = rng.integers(-128, 128, (N, K) if transb == "T" else (K, N), dtype=np.int8)
    ldb = B.shape[1]
    kept = []
    co = rng.integers(-500, 500, {"F": 1, "C": M, "R": N}[offsetc], dtype=np.int32)
    for step, (ao, bo) in enumerate([(0, 0), (3, 0), (3, 0), (3, 0), (0, -2), (5, 0), (5, 0)]):
        if step == 2:
            B = rng.integers(-128, 128, B.shape, dtype=np.int8)  # another array
        else:
            B[...] = rng.integers(-128, 128, B.shape)  # new values in the same one
        if step == 5:
            co = co + 7
        A = rng.integers(lo, lo + 256, (M, K)).astype(np.uint8 if a_type == "u8" else np.int8)
        C = rng.integers(-100, 100, (M, N), dtype=np.int32)
        want = reference.gemm("N", transb, offsetc, M, N, K, alpha, A, K, ao, B, ldb, bo, beta, C.copy(), N, co,
                              faithful=faithful)
        fn("N", transb, offsetc, M, N, K, alpha, A, K, ao, B, ldb, bo, beta, C, N, co, policy=policy, isa=isa_path)
        np.testing.assert_array_equal(C, want, err_msg=str(step))
        kept.append(set(map(id, kept_setups("gemm").values())))
    assert len(set.intersection(*kept)) >= 1  # the same Gemm served every call


@pytest.mark.parametrize("offsetc,co_shape", [("F", ()), ("F", (1, 5)), ("C", (3, 1)), ("R", (5, 1))])
def test_one_off_calls_take_co_of_any_shape_on_new_arrays(offsetc, co_shape):
    """co of any shape holding the values it needs (0-d, a column) is read flat, at the
    first call and at calls on new arrays of the same layouts, which move its replay (B
    read in place for 1-4 rows: its co is added after the kernels); the move had kept it
    unflattened: wrong offsets, or an error after C was written."""
    rng = np.random.default_rng(len(co_shape))
    M, N, K = 3, 5, 32
    for _ in range(3):
        A = rng.integers(0, 256, (M, K)).astype(np.uint8)
        B = rng.integers(-128, 128, (K, N)).astype(np.int8)
        C = np.full((M, N), -1, np.int32)
        co = np.arange(1, 1 + int(np.prod(co_shape)), dtype=np.int32).reshape(co_shape)
        flat = co.reshape(-1)
        want = A.astype(np.int64) @ B.astype(np.int64) + {"F": flat[0], "C": flat[:M, None], "R": flat[None, :N]}[offsetc]
        gemm_u8s8s32("N", "N", offsetc, M, N, K, 1.0, A, K, 0, B, N, 0, 0.0, C, N, co)
        np.testing.assert_array_equal(C, want)


@pytest.mark.parametrize("runtime_b", [False, True])
def test_one_gemm_called_from_threads_at_once(runtime_b):
    """Calls of one Gemm from several Python threads take turns: each gets its own product
    (its structs had pointed at whichever thread's arrays came last: wrong results, or
    a crash). Each thread new arrays at every call, and the same arrays again."""

    M, N, K = 16, 96, 64
    rng = np.random.default_rng(9)
    B = rng.integers(-128, 128, (K, N)).astype(np.int8)
    g = Gemm(M, N, K) if runtime_b else Gemm(M, N, K, B=B)
    bad = []

    def worker(seed):
        r = np.random.default_rng(seed)
        for i in range(150):
            A = r.integers(0, 256, (M, K)).astype(np.uint8)
            C = np.full((M, N), 7, np.int32)
            for _ in range(1 + i % 2):
                g.execute(A, C, B=B if runtime_b else None)
                if not np.array_equal(C, A.astype(np.int64) @ B.astype(np.int64)):
                    bad.append(seed)
    errors = in_threads(worker, [(seed,) for seed in range(4)])
    assert not errors and not bad, (errors, len(bad))


def test_verbose_lines_for_the_gemm_api(monkeypatch, capsys):
    """INT8JIT_VERBOSE logs the GEMM API as oneDNN's verbose mode does: a create line per
    Gemm made (a one-off call's kept Gemm once), an exec line per call, replayed or not;
    none when unset."""
    from primitives import verbose

    A, B = np.full((2, 5), 2, np.uint8), np.ones((5, 3), np.int8)
    C = np.zeros((2, 3), np.int32)

    def lines():
        return [line.split(",") for line in capsys.readouterr().err.splitlines()
                if line.startswith("int8jit_verbose")]
    monkeypatch.delenv(verbose.ENV, raising=False)
    Gemm(2, 3, 5, B=B).execute(A, C)
    assert lines() == []
    monkeypatch.setenv(verbose.ENV, "1")
    g = Gemm(2, 3, 5, B=B, isa="avx2", policy="faithful")
    g.execute(A, C)
    g.execute(A, C)
    for _ in range(2):
        gemm_s8s8s32("T", "N", "C", 2, 3, 5, 0.5, A.view(np.int8).T.copy(), 2, 0, B, 3, 0, 0.0, C, 3,
                     np.zeros(2, np.int32), isa="avx2")
    got = lines()
    assert [f[1] for f in got] == ["create", "exec", "exec", "create", "exec", "exec"]
    assert all(len(f) == 8 and float(f[7]) >= 0 for f in got)
    assert got[0][2:7] == ["gemm_u8s8s32", "gemm:avx2:maddubsw", "avx2",
                           "a:u8:N:2x5 b:s8:N:5x3 c:s32:F:2x3 ld:5/3/3", "alpha:1 beta:0 policy:faithful"]
    assert got[3][2] == "gemm_s8s8s32" and got[3][5] == "a:s8:T:2x5 b:s8:N:5x3 c:s32:C:2x3 ld:2/3/3"
    assert got[3][6] == "alpha:0.5 beta:0 policy:exact"


def test_one_off_calls_follow_the_settings(monkeypatch):
    """The same one-off call again takes the kept Gemm only while the ISA cap (the
    environment's, the API's) and the thread count it was made under hold: a changed
    setting makes the call resolve them again (runtime.settings' stamp) and take another."""
    supported = isa_mod.supported()
    if len(supported) < 2:
        pytest.skip("one ISA path here: no other to cap to")
    low, M, N, K = supported[0], 3, 20, 11
    rng = np.random.default_rng(5)
    A = rng.integers(0, 256, (M, K), dtype=np.uint8)
    B = rng.integers(-128, 128, (K, N), dtype=np.int8)
    want = reference.gemm("N", "N", "F", M, N, K, 1.0, A, K, 0, B, N, 0, 0.0, None, N, None)

    def call():
        C = np.zeros((M, N), np.int32)
        gemm_u8s8s32("N", "N", "F", M, N, K, 1.0, A, K, 0, B, N, 0, 0.0, C, N, np.zeros(1, np.int32))
        np.testing.assert_array_equal(C, want)
        g = list(kept_setups("gemm").values())[-1]  # (the last used is last)
        return g, g.isa, g.threads

    monkeypatch.delenv("INT8JIT_MAX_ISA", raising=False)
    monkeypatch.delenv("INT8JIT_NUM_THREADS", raising=False)
    first = call()
    assert call()[0] is first[0] and first[1] == supported[-1]
    monkeypatch.setenv("INT8JIT_MAX_ISA", low)
    assert call()[1] == low
    monkeypatch.delenv("INT8JIT_MAX_ISA")
    assert call()[0] is first[0]
    monkeypatch.setenv("INT8JIT_NUM_THREADS", str(first[2] + 1))
    assert call()[2] == first[2] + 1
    monkeypatch.delenv("INT8JIT_NUM_THREADS")
    isa_mod.set_max_isa(low)
    try:
        assert call()[1] == low
    finally:
        isa_mod.set_max_isa(None)
    assert call()[0] is first[0]


@st.composite
def repeat_cases(draw):
    """Calls on the very same arrays, their values changed in place between calls: few
    rows (read in place) and more, B at creation, at execution or through the one-off
    call, offsets, co, alpha/beta, transposes and short K (which copy A: never replayed)."""
    case = dict(
        a_type=draw(st.sampled_from(["u8", "s8"])), transa=draw(st.sampled_from("NNNT")),
        transb=draw(st.sampled_from("NT")), offsetc=draw(st.sampled_from("FCR")),
        M=draw(st.one_of(st.integers(1, 4), small_biased)), N=draw(small_biased),
        K=draw(st.one_of(st.integers(1, 3), small_biased)), lda_pad=draw(st.sampled_from([0, 3])),
        api=draw(st.sampled_from(["function", "create", "execute"])), threads=draw(st.sampled_from([1, 2])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )
    case["alpha"], case["beta"] = draw(st.sampled_from(ALPHA_BETA[:3] + [(1.0, 0.0)] * 3))
    return draw_offsets(draw, case)


@pytest.mark.parametrize("arrays", ["same", "new"])
@pytest.mark.parametrize("policy", POLICIES)
@PROPERTY
@given(case=repeat_cases())
def test_repeated_calls_on_the_same_arrays(isa_path, policy, arrays, case, monkeypatch):
    """A call with the last call's arrays replays its kernels (Gemm.execute's Replay): new
    values in A, B and C each call, co's values changed once (the full path again), C
    made read-only (refused, not replayed); every result as the model's, and the set-up
    run only where something changed (or where the call copies A or reads its values).
    ``arrays`` "new": new objects of the same layouts at every call (A, B, C, and co with
    the same values), which the replay moves to (Replay.moves); the last call's C is
    left alone."""
    from primitives import gemm as gemm_mod

    full = []
    original = gemm_mod.Gemm._execute
    monkeypatch.setattr(gemm_mod.Gemm, "_execute", lambda self, *a: full.append(1) or original(self, *a))
    c = dict(case)
    a_type, transa, transb, offsetc = c["a_type"], c["transa"], c["transb"], c["offsetc"]
    M, N, K, api, ao, bo = c["M"], c["N"], c["K"], c["api"], c["ao"], c["bo"]
    alpha, beta, threads = c["alpha"], c["beta"], c["threads"]
    rng = np.random.default_rng(c["seed"])
    lo, a_dt = (0, np.uint8) if a_type == "u8" else (-128, np.int8)
    a_rows, a_cols = (M, K) if transa == "N" else (K, M)
    lda = a_cols + c["lda_pad"]
    A = np.zeros((a_rows, lda), a_dt)
    B = np.zeros((K, N) if transb == "N" else (N, K), np.int8)
    C = np.zeros((M, N), np.int32)
    co = rng.integers(-1000, 1000, 1 if offsetc == "F" else max(M, N)).astype(np.int32)
    ldb = B.shape[1]
    faithful = faithful_model(policy, isa_path)
    g = None
    last = None  # (arrays "new": the last call's C, and what it holds)
    for step in range(4):
        if arrays == "new" and step:
            A, C, co = np.empty_like(A), np.empty_like(C), co.copy()
            B = B if api == "create" else np.empty_like(B)
        A[...] = rng.integers(lo, lo + 256, A.shape)
        if step == 0 or api != "create":
            B[...] = rng.integers(-128, 128, B.shape)
        C[...] = rng.integers(-1000, 1000, C.shape)
        if step == 2:
            co[...] += 1  # (in place: the replay compares co's values)
        want = reference.gemm(transa, transb, offsetc, M, N, K, alpha, A, lda, ao, B, ldb, bo, beta, C.copy(),
                              N, co, faithful=faithful)
        if api == "function":
            fn = gemm_u8s8s32 if a_type == "u8" else gemm_s8s8s32
            fn(transa, transb, offsetc, M, N, K, alpha, A, lda, ao, B, ldb, bo, beta, C, N, co, policy=policy,
               isa=isa_path, threads=threads)
        else:
            if g is None:
                g = Gemm(M, N, K, a_type=a_type, transa=transa, transb=transb, offsetc=offsetc, lda=lda, alpha=alpha,
                         beta=beta, policy=policy, isa=isa_path, threads=threads, B=B if api == "create" else None)
            g.execute(A, C, B=None if api == "create" else B, ao=ao, bo=bo, co=co)
        np.testing.assert_array_equal(C, want, err_msg=f"step {step}")
        if last is not None:
            np.testing.assert_array_equal(last[0], last[1], err_msg=f"step {step}: the last call's C")
        last = (C, C.copy()) if arrays == "new" else None
    # Replayed unless A is copied (transposed, K < 4) or bo's row term reads A's values
    # on the packed path (the in-place path adds it after the kernels, replayed or not).
    kept = g if g is not None else list(kept_setups("gemm").values())[-1]  # (the last used is last)
    in_place = "runtime_weights" in kept.impl_info()
    if transa == "N" and K >= 4 and (bo == 0 or in_place):
        assert len(full) == 2, full  # the first call and the one after co changed
    C.flags.writeable = False
    with pytest.raises(ValueError, match="^C"):
        if api == "function":
            fn(transa, transb, offsetc, M, N, K, alpha, A, lda, ao, B, ldb, bo, beta, C, N, co, policy=policy,
               isa=isa_path, threads=threads)
        else:
            g.execute(A, C, B=None if api == "create" else B, ao=ao, bo=bo, co=co)


def test_impl_info(isa_path):
    K, N, M = 64, 48, 8
    rng = np.random.default_rng(4)
    B_full = rng.integers(-128, 128, (K, N), dtype=np.int8)
    B_safe = rng.integers(-64, 65, (K, N), dtype=np.int8)
    vnni = isa_path.endswith("vnni")
    for policy, B, want_path in (("exact", B_full, "vnni" if vnni else "widen"),
                                 ("exact", B_safe, "vnni" if vnni else "maddubsw"),
                                 ("faithful", B_full, "vnni" if vnni else "maddubsw")):
        g = Gemm(M, N, K, a_type="s8", B=B, policy=policy, isa=isa_path)
        C = np.zeros((M, N), np.int32)
        g.execute(rng.integers(-128, 128, (M, K), dtype=np.int8), C)
        info = g.impl_info()
        assert info["primitive"] == "gemm_s8s8s32"
        assert info["isa"] == isa_path
        assert info["path"] == want_path
        assert info["policy"] == policy
        assert info["exact"] == (policy == "exact" or vnni)  # whether the results are exact
        assert isinstance(info["decision"], str) and info["decision"]
        assert info["kernels"] and all(isa_path in name for name in info["kernels"])
        assert info["total_pairs"] == N * K // 2
        if B is B_safe:
            assert info["safe_pairs"] == info["total_pairs"]
        else:
            assert info["safe_pairs"] < info["total_pairs"]
        if policy == "exact" and not vnni:
            assert str(info["safe_pairs"]) in info["decision"]


def test_impl_info_with_b_at_execution():
    if not isa_mod.cpu_supports("avx2"):
        pytest.skip("CPU lacks AVX2")
    rng = np.random.default_rng(0)
    B = rng.integers(-128, 128, (64, 48), dtype=np.int8)
    g = Gemm(8, 48, 64, isa="avx2", policy="exact")
    g.execute(rng.integers(0, 256, (8, 64), dtype=np.uint8), np.zeros((8, 48), np.int32), B=B)
    info = g.impl_info()
    assert info["kernels"] == ["gemm_u8s8s32_avx2_widen_4x2"]  # what ran
    assert info["path"] == "widen", info["decision"]


def test_isa_cap_above_cpu_is_no_error():
    """isa= names the cap; the effective ISA is the best the CPU has under it."""
    g = Gemm(2, 2, 4, B=np.ones((4, 2), np.int8), isa="avx512_core_vnni")
    assert g.impl_info()["isa"] == isa_mod.effective_isa("avx512_core_vnni")


# ------------------------------------------------------------------ guard pages

GUARD_CASES = [  # (M, N, K, transa, transb, offsetc, lda_pad, ldc_pad, a_type, beta)
    (7, 13, 5, "N", "N", "F", 0, 0, "u8", 0.0),
    (19, 37, 6, "N", "T", "C", 3, 1, "s8", 1.0),
    (33, 65, 7, "T", "N", "R", 1, 2, "u8", 0.5),
    (1, 1, 1, "N", "N", "F", 0, 0, "s8", 1.0),
    (3, 5, 3, "N", "N", "C", 2, 0, "u8", 0.0),
    (5, 31, 2, "T", "T", "R", 0, 3, "s8", 0.0),
    (67, 17, 129, "N", "N", "F", 0, 0, "u8", 1.0),
    (11, 97, 130, "N", "N", "R", 5, 0, "s8", 0.0),
    (1, 129, 131, "N", "T", "C", 0, 7, "u8", 1.0),
    (130, 3, 257, "T", "N", "F", 2, 0, "s8", 0.0),
    (1, 2048, 21, "N", "N", "R", 0, 0, "u8", 1.0),  # rows 2048 bytes apart: K in chunks, in place
    (2, 4096, 13, "T", "N", "C", 1, 3, "s8", 0.0),
]


def guard_cases(isa: str, policies: tuple = POLICIES) -> tuple[str | None, int]:
    """Run GUARD_CASES with A, B, C and co flush against a PROT_NONE page (after their
    end, then before their start), under each of ``policies``: (the first case whose
    result or padding is wrong, None if none; the cases checked). An access outside a
    buffer faults."""
    from tests.conftest import GuardedBuffer

    rng = np.random.default_rng(0)
    checked = 0
    for where in ("end", "start"):
        for (M, N, K, transa, transb, offsetc, lda_pad, ldc_pad, a_type, beta) in GUARD_CASES:
            for policy in policies:
                a_dt = np.uint8 if a_type == "u8" else np.int8
                ar, ac = (M, K) if transa == "N" else (K, M)
                br, bc = (K, N) if transb == "N" else (N, K)
                lda, ldb, ldc = ac + lda_pad, bc, N + ldc_pad
                bufs = [GuardedBuffer((ar - 1) * lda + ac, a_dt, where),
                        GuardedBuffer(br * ldb, np.int8, where),
                        GuardedBuffer((M - 1) * ldc + N, np.int32, where),
                        GuardedBuffer(1 if offsetc == "F" else max(M, N), np.int32, where)]
                A, B, C, co = (b.array for b in bufs)
                lo, hi = (0, 256) if a_type == "u8" else (-128, 128)
                A[:] = rng.integers(lo, hi, A.size).astype(a_dt)
                B[:] = rng.integers(-128, 128, B.size).astype(np.int8)
                C[:] = rng.integers(-1000, 1000, C.size).astype(np.int32)
                co[:] = rng.integers(-1000, 1000, co.size).astype(np.int32)
                ao = int(rng.integers(lo, hi))
                bo = int(rng.integers(-128, 128))
                c_old = C.copy()
                want = reference.gemm(transa, transb, offsetc, M, N, K, 1.0, A, lda, ao, B, ldb, bo, beta,
                                      c_old, ldc, co, faithful=faithful_model(policy, isa))
                fn = gemm_u8s8s32 if a_type == "u8" else gemm_s8s8s32
                fn(transa, transb, offsetc, M, N, K, 1.0, A, lda, ao, B, ldb, bo, beta, C, ldc, co,
                   policy=policy, isa=isa)
                got = reference.op(C, "N", M, N, ldc)
                pad = np.ones(C.size, bool)
                pad[(np.arange(M)[:, None] * ldc + np.arange(N)[None, :]).ravel()] = False
                if not np.array_equal(got, want) or not np.array_equal(C[pad], c_old[pad]):
                    return f"{where} {M} {N} {K} {transa} {transb} {offsetc} {a_type} {policy}", checked
                checked += 1
                for b in bufs:
                    b.close()
    return None, checked


GUARD_SCRIPT = textwrap.dedent("""
    import sys
    from tests.test_gemm import guard_cases

    bad, checked = guard_cases(sys.argv[1])
    if bad:
        print("MISMATCH", bad, flush=True)
        sys.exit(3)
    print("GUARD-OK", checked, flush=True)
""")


@pytest.mark.parametrize("isa", isa_params())
def test_guard_pages(isa):
    """A, B, C and co against a PROT_NONE page (after their end, before their start).

    An out-of-bounds read or write would kill the child with SIGSEGV. A path this CPU
    lacks (run under INT8JIT_TEST_EMULATE) runs in this process, where the emulator is:
    a child would run the CPU's own path instead.
    """
    if skip_reason(isa):
        assert guard_cases(isa) == (None, 4 * len(GUARD_CASES))
        return
    proc = subprocess.run([sys.executable, "-c", GUARD_SCRIPT, isa], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=child_env())
    assert proc.returncode == 0, (
        f"child exited with {proc.returncode} (negative: killed by that signal, -11 is SIGSEGV)\n"
        f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    assert f"GUARD-OK {4 * len(GUARD_CASES)}" in proc.stdout


def test_guard_fixture_faults(guarded):
    """The guard page itself works: touching the byte past the end kills a child."""
    a = guarded(10, np.int32, "end")
    a[:] = 7
    assert a.sum() == 70
    b = guarded(10, np.uint8, "start")
    b[:] = 1
    script = textwrap.dedent("""
        import numpy as np
        from runtime.ffi import ffi
        from tests.conftest import GuardedBuffer
        g = GuardedBuffer(16, np.uint8, "end")
        p = ffi.cast("unsigned char *", g.array.__array_interface__["data"][0])
        print(p[15], flush=True)
        print(p[16], flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          env=child_env())
    assert proc.returncode == -11, (proc.returncode, proc.stdout, proc.stderr)


# ------------------------------------------------------------------ bad input

def _args(**over):
    """oneDNN's argument list for a valid 4x5x6 u8s8 GEMM, with overrides."""
    M, N, K = 4, 5, 6
    a = dict(transa="N", transb="N", offsetc="F", M=M, N=N, K=K, alpha=1.0,
             A=np.zeros((M, K), np.uint8), lda=K, ao=0, B=np.zeros((K, N), np.int8), ldb=N, bo=0,
             beta=0.0, C=np.zeros((M, N), np.int32), ldc=N, co=np.zeros(1, np.int32))
    a.update(over)
    return a


def _call(fn=gemm_u8s8s32, **over):
    a = _args(**{k: v for k, v in over.items() if k not in ("policy", "isa", "threads")})
    kw = {k: over[k] for k in ("policy", "isa", "threads") if k in over}
    order = ["transa", "transb", "offsetc", "M", "N", "K", "alpha", "A", "lda", "ao", "B", "ldb", "bo", "beta",
             "C", "ldc", "co"]
    fn(*[a[k] for k in order], **kw)


@pytest.mark.parametrize("over,exc,match", [
    (dict(A=np.zeros((4, 6), np.float32)), TypeError, r"^A: .*uint8.*float32"),
    (dict(A=np.zeros((4, 6), np.int8)), TypeError, r"^A: .*uint8.*int8"),
    (dict(B=np.zeros((6, 5), np.uint8)), TypeError, r"^B: .*int8.*uint8"),
    (dict(C=np.zeros((4, 5), np.int64)), TypeError, r"^C: .*int32.*int64"),
    (dict(co=np.zeros(1, np.int64)), TypeError, r"^co: "),
    (dict(co=[0]), TypeError, r"^co: "),
    (dict(A=[[0] * 6] * 4), TypeError, r"^A: .*numpy"),
    (dict(B=np.zeros((5, 6), np.int8).view(np.matrix), transb="T", ldb=6), TypeError, r"^B: .*matrix"),
    (dict(A=np.zeros((3, 6), np.uint8)), ValueError, r"^A: .*4x6"),
    (dict(B=np.zeros((6, 4), np.int8), ldb=4), ValueError, r"^ldb: .*4"),
    (dict(B=np.zeros((5, 5), np.int8)), ValueError, r"^B: .*6x5"),
    (dict(C=np.zeros((4, 4), np.int32), ldc=4), ValueError, r"^ldc: "),
    (dict(C=np.zeros((3, 5), np.int32)), ValueError, r"^C: "),
    (dict(lda=5), ValueError, r"^lda: .*5"),
    (dict(ldb=2), ValueError, r"^ldb: "),
    (dict(ldc=0), ValueError, r"^ldc: "),
    (dict(A=np.zeros((4, 12), np.uint8)[:, ::2]), ValueError, r"^A: .*contiguous"),
    (dict(B=np.zeros((6, 10), np.int8)[:, ::2]), ValueError, r"^B: .*contiguous"),
    (dict(C=np.zeros((4, 10), np.int32)[:, ::2]), ValueError, r"^C: .*contiguous"),
    (dict(A=np.zeros((8, 6), np.uint8)[::2]), ValueError, r"^A: "),
    (dict(C=np.zeros((4, 5), np.int32)[:, :].copy(order="F")), ValueError, r"^C: "),
    (dict(offsetc="C", co=np.zeros(3, np.int32)), ValueError, r"^co: .*3"),
    (dict(offsetc="R", co=np.zeros(3, np.int32)), ValueError, r"^co: .*3"),
    (dict(offsetc="C", co=np.zeros(0, np.int32)), ValueError, r"^co: "),
    (dict(transa="X"), ValueError, r"^transa: .*'X'"),
    (dict(transb="NN"), ValueError, r"^transb: "),
    (dict(transb=None), ValueError, r"^transb: "),
    (dict(offsetc="Q"), ValueError, r"^offsetc: .*'Q'"),
    (dict(ao=300), ValueError, r"^ao: .*300"),
    (dict(ao=-1), ValueError, r"^ao: .*-1"),
    (dict(ao=1.5), ValueError, r"^ao: "),
    (dict(bo=128), ValueError, r"^bo: .*128"),
    (dict(bo=-129), ValueError, r"^bo: "),
    (dict(M=-3), ValueError, r"^M: "),
    (dict(N=-1), ValueError, r"^N: "),
    (dict(K=2.0), ValueError, r"^K: "),
    (dict(alpha=float("nan")), ValueError, r"^alpha: "),
    (dict(beta=float("inf")), ValueError, r"^beta: "),
    (dict(alpha="1"), ValueError, r"^alpha: "),
    (dict(policy="fast"), ValueError, r"^policy: .*'fast'"),
    (dict(policy="halve"), ValueError, r"^policy: "),
    (dict(isa="sse41"), ValueError, r"^isa: .*sse41"),
    (dict(isa="avx512"), ValueError, r"^isa: "),
    (dict(threads=0), ValueError, r"^threads: .*0"),
    (dict(threads=-2), ValueError, r"^threads: "),
    (dict(threads=1.5), ValueError, r"^threads: "),
])
def test_bad_input_u8(over, exc, match):
    C_before = over.get("C")
    with pytest.raises(exc, match=match):
        _call(**over)
    if isinstance(C_before, np.ndarray) and C_before.dtype == np.int32:
        assert not C_before.any(), "C was written before the error"


@pytest.mark.parametrize("over,exc,match", [
    (dict(ao=128), ValueError, r"^ao: .*128"),
    (dict(ao=-129), ValueError, r"^ao: "),
    (dict(A=np.zeros((4, 6), np.uint8)), TypeError, r"^A: .*int8.*uint8"),
])
def test_bad_input_s8(over, exc, match):
    over.setdefault("A", np.zeros((4, 6), np.int8))
    with pytest.raises(exc, match=match):
        _call(gemm_s8s8s32, **over)


def test_bad_input_is_rejected_before_any_kernel_runs():
    """Errors at execution leave C untouched (validation comes first)."""
    g = Gemm(4, 5, 6, B=np.ones((6, 5), np.int8))
    C = np.full((4, 5), 3, np.int32)
    for A, kw, match in ((np.ones((4, 6), np.int8), {}, "^A: "), (np.ones((4, 6), np.uint8), {"ao": 256}, "^ao: "),
                         (np.ones((4, 6), np.uint8), {"co": np.zeros(1, np.int16)}, "^co: "),
                         (np.ones((4, 6), np.uint8), {"B": np.ones((6, 4), np.int8)}, "^B: ")):
        with pytest.raises((TypeError, ValueError), match=match):
            g.execute(A, C, **kw)
        assert np.all(C == 3)
    with pytest.raises(ValueError, match="^C: .*read-only"):
        ro = np.zeros((4, 5), np.int32)
        ro.flags.writeable = False
        g.execute(np.ones((4, 6), np.uint8), ro)
    # A byte-swapped int32 is not the kernel's int32, and the message says why.
    with pytest.raises(TypeError, match=r"^C: expected dtype int32, got int32 \(big-endian\)"):
        g.execute(np.ones((4, 6), np.uint8), np.zeros((4, 5), ">i4"))


def test_bad_input_gemm_constructor():
    with pytest.raises(ValueError, match="^a_type: "):
        Gemm(2, 2, 2, a_type="u4")
    with pytest.raises(ValueError, match="^isa: .*avx1"):
        Gemm(2, 2, 2, isa="avx1")


def test_bad_input_thin_gemm():
    A = np.zeros((3, 4), np.uint8)
    with pytest.raises(ValueError, match=r"^B: .*4.*\(5, 2\)"):
        gemm(A, np.zeros((5, 2), np.int8))
    with pytest.raises(TypeError, match="^A: .*float32"):
        gemm(np.zeros((3, 4), np.float32), np.zeros((4, 2), np.int8))
    with pytest.raises(TypeError, match="^B: .*int8.*uint8"):
        gemm(A, np.zeros((4, 2), np.uint8))
    with pytest.raises(ValueError, match="^A: .*2-D"):
        gemm(np.zeros(4, np.uint8), np.zeros((4, 2), np.int8))
    with pytest.raises(ValueError, match="^B: .*2-D"):
        gemm(A, np.zeros((4, 2, 1), np.int8))
    with pytest.raises(ValueError, match="^ao: "):
        gemm(A, np.zeros((4, 2), np.int8), ao=-5)
    with pytest.raises(ValueError, match="^policy: "):
        gemm(A, np.zeros((4, 2), np.int8), policy="Exact!")


def test_one_element_dimension_strides_are_not_checked():
    """NumPy calls the transpose of a 1 x N matrix C-contiguous though its strides are
    (1, N): a dimension of one element is never walked, so its stride cannot matter."""
    rng = np.random.default_rng(10)
    A = rng.integers(0, 256, (1, 3), dtype=np.uint8).T  # 3 x 1 (K = 1), strides (1, 3)
    Bt = rng.integers(-128, 128, (1, 5), dtype=np.int8).T  # N x K = 5 x 1, strides (1, 5)
    assert A.flags.c_contiguous and Bt.strides == (1, 5)
    C = np.zeros((3, 5), np.int32)
    Gemm(3, 5, 1, B=Bt, transb="T").execute(A, C)
    np.testing.assert_array_equal(C, A.astype(np.int32) @ Bt.T.astype(np.int32))
    a_row = rng.integers(0, 256, (6, 1), dtype=np.uint8).T  # M = 1: 1 x 6, strides (1, 1)
    C1 = np.zeros((1, 5), np.int32)
    B = rng.integers(-128, 128, (6, 5), dtype=np.int8)
    Gemm(1, 5, 6, B=B).execute(a_row, C1)
    np.testing.assert_array_equal(C1, a_row.astype(np.int32) @ B.astype(np.int32))


def test_thin_gemm_matches_numpy(isa_path):
    rng = np.random.default_rng(9)
    A = rng.integers(-128, 128, (23, 57), dtype=np.int8)
    B = rng.integers(-128, 128, (57, 31), dtype=np.int8)
    want = (A.astype(np.int64) - 3) @ (B.astype(np.int64) + 2)
    assert np.array_equal(gemm(A, B, ao=3, bo=-2, isa=isa_path), want.astype(np.int32))
    # non-contiguous inputs are fine for the thin API (it copies)
    At = np.asfortranarray(A)
    assert np.array_equal(gemm(At, B, ao=3, bo=-2, isa=isa_path), want.astype(np.int32))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.data())
def test_saturation_proof_counts_pairs_by_its_definition(k, n, data):
    """The VPMADDUBSW proof against its definition in plain integers: a pair is safe when
    no u8 sources a0, a1 take a0*w0 + a1*w1 outside s16 (the sum is linear in each, so the
    corners 0 and 255 bound it). The extreme weights (-128, whose absolute value does not
    fit s8), opposite signs (safe whatever their size) and odd K (the last pair has one
    weight) included."""
    from primitives.gemm_pack import saturation_proof

    values = st.sampled_from([-128, -127, -65, -64, -63, -1, 0, 1, 63, 64, 65, 127])
    b = np.array(data.draw(st.lists(values, min_size=k * n, max_size=k * n)), np.int8).reshape(k, n)
    w = b.astype(int).tolist() + ([[0] * n] if k % 2 else [])
    pairs = [(w[2 * j][c], w[2 * j + 1][c]) for j in range(len(w) // 2) for c in range(n)]

    def safe(w0, w1):
        sums = [a0 * w0 + a1 * w1 for a0 in (0, 255) for a1 in (0, 255)]
        return -32768 <= min(sums) and max(sums) <= 32767
    assert saturation_proof(b) == (sum(safe(*p) for p in pairs), len(pairs))
    assert saturation_proof(np.ascontiguousarray(b.T).T) == saturation_proof(b)  # a strided view


def test_one_off_kept_gemm_is_not_taken_for_a_float_size():
    """A one-off call's kept Gemm is keyed by its sizes' types too: lda = 16.0, M = True
    or M = 4.0 after calls with 16 and 4 (another call between, so the thread's last
    call is not theirs) are refused as in a fresh process."""
    from primitives.gemm import gemm_u8s8s32

    A, B = np.ones((4, 16), np.uint8), np.ones((16, 32), np.int8)
    C, co = np.zeros((4, 32), np.int32), np.zeros(1, np.int32)

    def call(lda=16, M=4, N=32):
        gemm_u8s8s32("N", "N", "F", M, N, 16, 1.0, A, lda, 0, B, 32, 0, 0.0, C, 32, co)

    for bad, message in (({"lda": 16.0}, "lda: expected an integer"), ({"M": True}, "M: expected an integer"),
                         ({"M": 4.0}, "M: expected an integer")):
        call()
        call(N=31)
        with pytest.raises(ValueError, match=message):
            call(**bad)
