"""Every ISA path's kernels run, on any CPU, through the test emulator (tests/emulator.py).

On a CPU without AVX-512 or AVX-VNNI those paths are otherwise only generated and
disassembled. Here the kernels of the GEMM, matmul, convolution, depthwise convolution,
pooling and reorder run emulated, instruction by instruction, under those primitives'
own property tests (smaller shapes), and are compared bit for bit with the numpy models.
The emulator itself is held to the CPU first: on the AVX2 path, which every x86-64 CPU
this runs on has, an emulated execution must write the bytes the native one writes.
(The thread pool's native fork-join is not emulated: a plan's calls run one after another.)
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings

from jit.dot import fast_path
from primitives import reference
from primitives.gemm import Gemm
from primitives.memory import desc
from runtime import isa as isa_mod
from tests.conftest import ALL_ISAS as PATHS, assert_same_bits
from tests.emulator import emulation_switch
from tests import test_gemm as gemm_tests
from tests import test_gemm_split as split
from tests import test_conv as conv
from tests import test_conv_depthwise as depthwise
from tests import test_pooling as pooling
from tests import test_reorder as reorder
from tests import test_matmul as matmul
from tests.test_conv import strips_always  # noqa: F401 (a fixture of the edge-strip test below)
from tests.test_matmul import _run, problems

EMULATED = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def emulated(monkeypatch):
    """Every kernel call goes through the emulator and every ISA path counts as supported
    (``tests.emulator.emulation_switch``); returns the switch, to turn that off and on."""
    from primitives import primitive_cache

    switch = emulation_switch(monkeypatch)
    switch(True)
    yield switch
    primitive_cache.clear()


def _gemm_case(rng, kind: str, a_type: str, M: int, N: int, K: int):
    B = rng.integers(-128, 128, (K, N)).astype(np.int8) if kind == "uniform" else split.sparse_weights(rng, K, N, 0.002)
    if kind == "split":  # an unsafe pair in the first group of the first column and the last of the last
        B[0:2, 0] = 127
        B[2 * ((K - 2) // 2):][:2, N - 1] = -128
    lo, hi = (200, 256) if a_type == "u8" else (100, 128)  # sources that saturate VPMADDUBSW on large pairs
    A = rng.integers(lo, hi, (M, K)).astype(np.uint8 if a_type == "u8" else np.int8)
    return A, B


GEMM_CASES = [("split", "u8", 7, 40, 70), ("split", "s8", 3, 24, 64), ("split", "u8", 13, 70, 130),
              ("uniform", "u8", 5, 17, 13), ("uniform", "s8", 9, 33, 29), ("split", "u8", 1, 9, 6)]


def _native_then_emulated(emulated, run) -> None:
    """``run()``'s output natively and emulated, on the AVX2 path: the same bytes."""
    if not isa_mod.cpu_supports("avx2"):
        pytest.skip("the CPU lacks AVX2: nothing native to compare the emulator with")
    out = []
    for on in (False, True):
        emulated(on)
        out.append(np.ascontiguousarray(run()))
    np.testing.assert_array_equal(out[1].view(np.uint8), out[0].view(np.uint8))


@pytest.mark.parametrize("case", GEMM_CASES)
@pytest.mark.parametrize("policy", ["exact", "faithful"])
def test_emulator_writes_what_the_cpu_writes(emulated, case, policy):
    """The AVX2 kernels, native and emulated: the same bytes (VPMADDUBSW's saturation,
    the residual cells, widening, s8 sources)."""
    kind, a_type, M, N, K = case
    A, B = _gemm_case(np.random.default_rng([M, N, K]), kind, a_type, M, N, K)
    g = Gemm(M, N, K, a_type=a_type, B=B, policy=policy, isa="avx2", threads=1)

    def run():
        C = np.zeros((M, N), np.int32)
        g.execute(A, C)
        return C
    _native_then_emulated(emulated, run)


@EMULATED
@given(p=problems())
def test_emulated_matmul_pipeline_writes_what_the_cpu_writes(emulated, p):
    """The whole output pipeline on AVX2 (scales, zero points, bias, eltwise, sum and
    binary post-ops, every dst type, masked tails), native and emulated."""
    _native_then_emulated(emulated, lambda: _run(p, "avx2")[0])


@EMULATED
@given(p=depthwise.problems())
def test_emulated_depthwise_writes_what_the_cpu_writes(emulated, p):
    p.update(N=min(p["N"], 2), C=min(p["C"], 40))  # emulation is slow
    _native_then_emulated(emulated, lambda: depthwise.run_case(p, "avx2")[0])


@EMULATED
@given(case=pooling.cases())
def test_emulated_pooling_writes_what_the_cpu_writes(emulated, case):
    _native_then_emulated(emulated, lambda: pooling.run_case("avx2", **case)[0])


@EMULATED
@given(problem=reorder.problems())
def test_emulated_reorder_writes_what_the_cpu_writes(emulated, problem):
    _native_then_emulated(emulated, lambda: _reorder_case("avx2", problem)[0])


@pytest.mark.parametrize("isa", ["avx512_core_vnni", "avx2_vnni", "avx512_core:widen", "avx2:widen",
                                 "avx512_core:maddubsw"])
@pytest.mark.parametrize("M,N,K,src_dt,zp", [(1, 21, 100, "u8", 0), (2, 8, 36, "s8", 0), (3, 19, 64, "u8", 5),
                                             (1, 40, 8, "s8", 3)])
def test_gemv_emulated(emulated, isa, M, N, K, src_dt, zp):
    """jit.gemv_kernel's columns kernel on the VNNI, widening and VPMADDUBSW paths,
    emulated: the path's product (the K loop and its masked tail, the compensation in
    the loop or in a second pass, the lanes added across by VPUNPCK*, VPERM2I128 or
    VSHUFI64X2, a partial last block)."""
    from tests.test_gemv import gemv_case

    got, want = gemv_case(np.random.default_rng(K), isa, M, N, K, src_dt, zp, gap=3)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("isa,M,N,K,src_dt,zp", [("avx512_core_vnni", 1, 70, 9, "u8", 0),
                                                 ("avx512_core_vnni", 4, 33, 6, "s8", 2),
                                                 ("avx2_vnni", 2, 44, 11, "u8", 0), ("avx2_vnni", 1, 8, 4, "u8", 0),
                                                 ("avx512_core:widen", 3, 40, 7, "s8", 0),
                                                 ("avx2:widen", 1, 20, 9, "u8", 5),
                                                 ("avx512_core:maddubsw", 2, 70, 10, "s8", 0)])
def test_rows_gemv_emulated(emulated, isa, M, N, K, src_dt, zp):
    """The rows kernel, emulated: rows interleaved by VPUNPCK* (widened: sign-extended
    first, A's pairs by VPSHUFD), masked loads past N (VMOVDQU8, VPMASKMOVD), the last
    1-3 K rows, the blocks put back in column order (VSHUFI64X2, VPERM2I128)."""
    from tests.test_gemv import gemv_case

    got, want = gemv_case(np.random.default_rng(K), isa, M, N, K, src_dt, zp, 3, "rows")
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("k,n,nr", [(12, 64, 4), (37, 70, 3), (4, 8, 1), (32, 24, 2)])
@pytest.mark.parametrize("columns", [False, True])
@pytest.mark.parametrize("layout", ["avx512_core_vnni", "avx512_core", "avx2", "widen"])
def test_emulated_vnni_packing_writes_what_the_cpu_writes(emulated, k, n, nr, columns, layout):
    """jit.pack_rows' and jit.pack_columns' kernels, from rows of N bytes and from columns
    of K, native and emulated: the same packed bytes and column sums. 512-bit (on a CPU
    with AVX-512: KXNORQ, byte-masked loads, VPERMD, VSHUFI64X2, sums by VPDPBUSD or
    VPMADDUBSW) and 256-bit (VPMASKMOVD, VPERM2I128; widened: VPMOVSXBW, VSHUFPS, VPERMQ)."""
    from jit.dot import fast_path, widening_path
    from jit.pack_kernel import pack_vnni

    path = widening_path("avx512_core") if layout == "widen" else fast_path(layout)
    b = np.random.default_rng(k + n).integers(-128, 128, (k, n)).astype(np.int8)
    if columns:
        b = np.ascontiguousarray(b.T).T

    def run():
        packed = pack_vnni(b, path, nr)
        return np.concatenate([packed.data.view(np.uint8), packed.colsum.view(np.uint8)])
    _native_then_emulated(emulated, run)


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("case", GEMM_CASES)
@pytest.mark.parametrize("policy", ["exact", "faithful"])
def test_gemm_every_path_emulated(emulated, isa, case, policy):
    kind, a_type, M, N, K = case
    A, B = _gemm_case(np.random.default_rng([M, N, K, 1]), kind, a_type, M, N, K)
    g = Gemm(M, N, K, a_type=a_type, B=B, policy=policy, isa=isa, threads=1)
    C = np.zeros((M, N), np.int32)
    g.execute(A, C)
    faithful = policy == "faithful" and not isa.endswith("vnni")
    want = reference.gemm("N", "N", "F", M, N, K, 1.0, A, K, 0, B, N, 0, 0.0, np.zeros((M, N), np.int32), N,
                          np.zeros(1, np.int32), faithful=faithful)
    np.testing.assert_array_equal(C, want)
    kernels = g.impl_info()["kernels"]
    assert all(isa in name for name in kernels)
    if kind == "split" and policy == "exact" and not isa.endswith("vnni") and g.impl_info()["cells"]:
        assert all("_cells_" in name for name in kernels)


def test_avx512_cells_run_emulated(emulated):
    """The AVX-512 residual cells (16-column vectors, 128-byte entries), u8 and s8 sources
    at the top of their range: the unsplit weights would saturate."""
    rng = np.random.default_rng(5)
    for a_type, M, N, K in (("u8", 7, 64, 70), ("s8", 6, 40, 130), ("u8", 1, 33, 10)):
        B = rng.integers(-64, 65, (K, N)).astype(np.int8)
        B[0:2, 0] = 127
        B[2 * ((K - 2) // 2):][:2, N - 1] = -128
        A = np.full((M, K), 255 if a_type == "u8" else 127, np.uint8 if a_type == "u8" else np.int8)
        g = Gemm(M, N, K, a_type=a_type, B=B, policy="exact", isa="avx512_core", threads=1)
        C = np.zeros((M, N), np.int32)
        g.execute(A, C)
        np.testing.assert_array_equal(C, (A.astype(np.int64) @ B.astype(np.int64)).astype(np.int32))
        assert g.impl_info()["cells"] > 0 and all("_cells_" in k for k in g.impl_info()["kernels"])
        faithful = reference.gemm("N", "N", "F", M, N, K, 1.0, A, K, 0, B, N, 0, 0.0, np.zeros((M, N), np.int32),
                                  N, np.zeros(1, np.int32), faithful=True)
        assert not np.array_equal(faithful, C)  # the cells matter


@pytest.mark.parametrize("isa", PATHS[1:])
@EMULATED
@given(p=problems())
def test_matmul_every_path_emulated(emulated, isa, p):
    """test_matmul's property test (attributes, post-op chains, dst types, split weights)
    on the paths this CPU may lack."""
    p.update(M=min(p["M"], 12), K=min(p["K"], 70), N=min(p["N"], 40))  # emulation is slow
    dst, want = _run(p, isa)
    assert_same_bits(dst, want)


@pytest.mark.parametrize("isa", PATHS[1:])
@EMULATED
@given(p=problems())
def test_in_place_matmul_every_path_emulated(emulated, isa, p):
    """The same with runtime weights as columns of K (ba) or rows of N (ab) and 1-4 rows:
    the in-place kernels' output stages (both of AVX2's, whole and partial blocks)."""
    p.update(M=1 + p["M"] % 4, K=min(p["K"], 70), N=min(p["N"], 40), packed=False,
             layout="ba" if p["seed"] % 2 else "ab")
    dst, want = _run(p, isa)
    assert_same_bits(dst, want)


@pytest.mark.parametrize("isa", ["avx512_core", "avx2_vnni"])
@pytest.mark.parametrize("shape", [(16, 24, 6, 7, 3, 1, 1, 1, 0, "u8"), (8, 16, 5, 9, 3, 2, 1, 1, 1, "s8")])
def test_convolution_emulated(emulated, isa, shape):
    """test_gemm_split's convolution (rows and edge columns reading parts of the window,
    each adding the residual cells of its part) on a path this CPU may lack."""
    split.test_split_convolution_is_exact(isa, shape)


@pytest.mark.parametrize("isa", ["avx2_vnni", "avx512_core_vnni"])
@pytest.mark.parametrize("src_dt", ["u8", "s8"])
def test_short_blocks_split_their_accumulators(emulated, isa, src_dt):
    """A VNNI kernel's short row block (the tail of 7-pixel rows) runs its unrolled K
    loop over several sets of accumulators, against VPDPBUSD's latency, and adds them
    before the output stage (gemm_kernel.accumulator_sets): bit-exact, on a layer whose
    kernel has such a block."""
    from jit.gemm_kernel import accumulator_sets
    from primitives.conv import ConvolutionDesc

    p = dict(sp=2, groups=1, icg=16, ocg=24, ker=(3, 3), dil=(0, 0), pad_l=(1, 1), pad_r=(1, 1), strides=(2, 2),
             size=(13, 13), n=1, src_dt=src_dt, dst_dt="u8", zp_src=None, wscale="oc", s_src=0.25, zp_dst=3,
             bias=True, post=[("eltwise", "relu", 0.0, 0.0)], layout=0, policy="exact", packed=True, seed=7,
             weights="random")
    ic, oc = p["icg"], p["ocg"]  # the layer run_case makes, for its kernel's spec: 7-pixel rows
    pd = ConvolutionDesc(desc((1, ic) + p["size"], src_dt, "nhwc"), desc((oc, ic) + p["ker"], "s8", "any"),
                         desc((1, oc, 7, 7), "u8", "nhwc"), strides=p["strides"], padding_l=p["pad_l"],
                         padding_r=p["pad_r"], isa=isa)
    kspec = pd._kernel_for(pd.fast).meta["kspec"]
    assert any(accumulator_sets(kspec.path, kspec.mr, rows, kspec.nr, kspec.unroll_k) > 1
               for rows in kspec.tails), (kspec.name, kspec.tails)
    got, want = conv.run_case(p, isa)
    assert_same_bits(got, want)


@pytest.mark.parametrize("isa", PATHS[1:])
@EMULATED
@given(p=conv.problems())
def test_convolution_every_path_emulated(emulated, isa, p):
    """test_conv's property test (1-3-D, groups, strides, padding, dilation, zero points,
    post-ops, policies, split weights) on the paths this CPU may lack."""
    assume(not (p["groups"] > 1 and p["icg"] == p["ocg"] == 1))  # depthwise calls its kernel directly
    got, want = conv.run_case(p, isa)
    assert_same_bits(got, want)


@pytest.mark.parametrize("isa", PATHS[1:])
@EMULATED
@given(p=depthwise.problems())
def test_depthwise_every_path_emulated(emulated, isa, p):
    """test_conv_depthwise's property test (its own kernel, exact under every policy)."""
    p.update(N=min(p["N"], 2), C=min(p["C"], 40))  # emulation is slow
    dst, want, _ = depthwise.run_case(p, isa)
    assert_same_bits(dst, want)


@pytest.mark.parametrize("isa", PATHS[1:])
@EMULATED
@given(case=pooling.cases())
def test_pooling_every_path_emulated(emulated, isa, case):
    """test_pooling's property test: max and average pooling, every layout and tail."""
    got, want = pooling.run_case(isa, **case)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("isa", PATHS[1:])
@EMULATED
@given(problem=reorder.problems())
def test_reorder_every_path_emulated(emulated, isa, problem):
    """test_reorder's property test: quantize, dequantize, scales and zero points per mask."""
    got, want = _reorder_case(isa, problem)
    assert np.array_equal(reorder.bits(got), reorder.bits(want))


def _reorder_case(isa: str, problem) -> tuple:
    """test_reorder's property test, one problem: (the reorder's output, the model's)."""
    dims, tag, dtag, sdt, ddt, masks, seed = problem
    rng = np.random.default_rng(seed)
    attr, values, ref_kw = reorder.attr_and_values(rng, dims, masks)
    pd = reorder.ReorderDesc(desc(dims, sdt, tag), desc(dims, ddt, dtag), attr, isa=isa)
    src = reorder.random_values(rng, sdt, dims)
    return reorder.run(pd, src, values), reorder.reorder_ref(src, sdt, ddt, **ref_kw)


@pytest.mark.parametrize("isa", ["avx512_core", "avx512_core_vnni"])
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(p=conv.wide_problems())
def test_wide_convolution_avx512_emulated(emulated, isa, p, monkeypatch):
    """test_conv's wide problems (tens to hundreds of channels: 64-column tiles traded for
    rows, edge strips, column chunks, against drawn cache sizes) on AVX-512, one image
    of at most 9x9 (emulation is slow: up to ten seconds each; a soak of 6 a path passed)."""
    import primitives.conv_blocking as blocking
    from runtime.caches import DataCaches

    size = min(p["size"][0], 9)
    assume(size + p["pad_l"][0] + p["pad_r"][0] >= (p["ker"][0] - 1) * (p["dil"][0] + 1) + 1)
    p.update(n=1, size=(size, size))
    budgets = blocking.cache_budgets(DataCaches(l1d=p["caches"][0], l2=p["caches"][1], source="test"))
    monkeypatch.setattr(blocking, "L1_BUDGET", budgets[0])
    monkeypatch.setattr(blocking, "L2_BUDGET", budgets[1])
    got, want = conv.run_case(p, isa)
    assert_same_bits(got, want)


@pytest.mark.parametrize("isa", PATHS[1:])
def test_guard_pages_emulated(emulated, isa, guarded):
    """Each primitive's guard-page test (its buffers flush against PROT_NONE pages) on the
    paths this CPU may lack: a read or write past a buffer faults under the emulator as
    it does natively (its masked loads, like the CPU's, do not touch masked-off lanes)."""
    for dst_dt in ("u8", "f32"):
        for where in ("end", "start"):
            for weights in ("uniform", "split"):
                matmul.test_guard_pages(isa, guarded, dst_dt, where, weights)
            depthwise.test_guard_pages(isa, guarded, where)
    conv.test_guard_pages(isa, guarded)
    for alg in pooling.ALGS:
        for c, spatial in ((13, (7, 5)), (70, (7, 5)), (13, (4, 7, 5))):
            pooling.test_guard_pages(isa, guarded, alg, c, spatial)
    for sdt, ddt in (("f32", "u8"), ("s8", "f32")):
        reorder.test_tails_stay_inside_the_buffers(isa, sdt, ddt, guarded)
    # GEMM's own cases (test_gemm runs them in a child, natively): both policies where
    # they take different kernels (VPMADDUBSW, widening), one where VPDPBUSD serves both
    policies = ("exact",) if fast_path(isa).kind == "vnni" else gemm_tests.POLICIES
    assert gemm_tests.guard_cases(isa, policies) == (None, 2 * len(policies) * len(gemm_tests.GUARD_CASES))


@pytest.mark.parametrize("isa", ["avx512_core", "avx512_core_vnni"])
def test_edge_strips_stay_inside_the_source_emulated(emulated, isa, guarded, strips_always):  # noqa: F811
    """The convolution's source read in place (edge strips or edge columns), flush against
    a guard page, with split weights, on AVX-512."""
    for where in ("end", "start"):
        conv.test_edge_strips_stay_inside_the_source(isa, guarded, where, 1, strips_always, "split")


def test_emulate_mode_runs_the_paths_the_cpu_lacks():
    """``INT8JIT_TEST_EMULATE=1`` (tests/conftest.py): a test parametrised over the paths
    runs all four, those this CPU lacks emulated, none skipped; a test that compares with
    oneDNN, which runs natively, skips them."""
    import os
    import re
    import subprocess
    import sys

    env = dict(os.environ, INT8JIT_TEST_EMULATE="1")  # INT8JIT_TEST_CPU as here: the same paths lack

    def pytest_counts(test: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test], env=env,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             capture_output=True, text=True, timeout=600)
        assert out.returncode in (0, 5), out.stdout + out.stderr
        return {word: int(n) for n, word in re.findall(r"(\d+) (passed|skipped|failed)", out.stdout)}

    assert pytest_counts("tests/test_matmul.py::test_seed_example_every_path") == {"passed": 4}
    lacking = sum(not isa_mod.cpu_supports(isa) for isa in PATHS)
    peer = pytest_counts("tests/test_gemm_onednn.py::test_exact_equals_onednn_default_with_offsetc_vectors")
    assert "failed" not in peer and peer.get("skipped", 0) >= lacking
