"""The GEMM's speed choices change nothing in the result: each variant, bit for bit.

* K loop unrolled by 4 groups: K of 1..3, one group, 4 groups, 4n + 1..3 (whole and
  partial unrolled iterations, the single-group loop, the tail group).
* Next-tile B prefetch (8..48 row blocks per thread and several column tiles, so the
  last tile prefetches past the end of packed B, which must not fault or matter).
* B prefetched ahead of the K loop (fewer than 8 row blocks), past the end on the last tile.
* Blocks of 7-9 rows (a third row base), every M around the block height.
* Kernels made for a known M and K (only the tail blocks and K loops those run), and
  their refusal of a call of another shape; made for an N of whole column tiles (no
  masked tail code in the output stage), and their refusal of another N.
* s8 A shifted to u8 once per call (4+ column tiles): rows with gaps (lda > K), a 1-D
  A, transposed A, K < 4, offsets, and the buffer reused across calls.
"""
from __future__ import annotations

import numpy as np
import pytest

from jit.dot import widening_path
from primitives import gemm, gemm_driver, reference
from primitives.gemm import Gemm, _SHIFT_A_TILES, fast_path
from tests.conftest import faithful_model, isa_params


def _run(isa, policy, a_type, M, N, K, *, transa="N", lda_extra=0, flat=False, ao=0, bo=0, threads=1, calls=2,
         alpha=1.0, beta=0.0, seed=0):
    rng = np.random.default_rng([M, N, K, seed])
    lo, hi, dt = (0, 256, np.uint8) if a_type == "u8" else (-128, 128, np.int8)
    rows, cols = (M, K) if transa == "N" else (K, M)
    lda = cols + lda_extra
    A = rng.integers(lo, hi, (rows, lda)).astype(dt)
    B = rng.integers(-128, 128, (K, N)).astype(np.int8)
    C0 = rng.integers(-1000, 1000, (M, N)).astype(np.int32)
    A_in = A.reshape(-1)[: (rows - 1) * lda + cols].copy() if flat else A
    g = Gemm(M, N, K, a_type=a_type, transa=transa, lda=lda, B=B, policy=policy, isa=isa, threads=threads,
             alpha=alpha, beta=beta)
    for _ in range(calls):  # the second call reuses the plan (and the shift buffer)
        C = C0.copy()
        g.execute(A_in, C, ao=ao, bo=bo)
        want = reference.gemm(transa, "N", "F", M, N, K, alpha, A, lda, ao, B, N, bo, beta, C0.copy(), N,
                              np.zeros(1, np.int32), faithful=faithful_model(policy, isa))
        np.testing.assert_array_equal(C, want)
    return g.impl_info()


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("K", [1, 3, 4, 12, 16, 17, 19, 30, 64, 67])
def test_k_unroll_and_tails(isa, K):
    _run(isa, "exact", "u8", 13, 40, K)
    _run(isa, "faithful", "s8", 7, 300, K, ao=-5, bo=3)


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("M", [48, 100, 190])  # 8..48 row blocks for mr 4..6
def test_next_tile_prefetch(isa, M):
    info = _run(isa, "exact", "u8", M, 150, 40, ao=7, bo=-2)
    assert info["blocking"]["prefetch_next_tile_b"]
    info = _run(isa, "exact", "s8", M, 150, 21, threads=2, alpha=0.5, beta=1.5)
    assert info["blocking"]["prefetch_next_tile_b"]


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("case", [
    dict(), dict(lda_extra=5), dict(flat=True, lda_extra=3), dict(transa="T"), dict(transa="T", lda_extra=2),
    dict(K=2), dict(ao=-128, bo=127), dict(threads=2), dict(policy="faithful"), dict(K=2, flat=True, lda_extra=1),
])
def test_s8_shift_once(isa, case, monkeypatch):
    """The shifted A and the u8 kernel on every path (AMD's VNNI path keeps the s8 kernel:
    the test pretends otherwise), against the reference; and the s8 kernel over as many
    tiles, as AMD's VNNI path runs it."""
    args = dict(M=37, N=64 * _SHIFT_A_TILES + 5, K=45, policy="exact")
    args.update(case)
    policy, M, N, K = (args.pop(name) for name in ("policy", "M", "N", "K"))
    for shifts in (True, False):
        monkeypatch.setattr(gemm, "shifts_s8_a_once", lambda path, shifts=shifts: shifts)
        info = _run(isa, policy, "s8", M, N, K, **args)
        assert info["blocking"]["s8_a_shifted_once_per_call"] is shifts


@pytest.mark.parametrize("vendor,kind,shifts", [("GenuineIntel", "vnni", True), ("GenuineIntel", "maddubsw", True),
                                                ("AuthenticAMD", "vnni", False), ("AuthenticAMD", "maddubsw", True),
                                                ("AuthenticAMD", "widen", True)])
def test_s8_shift_follows_the_vendor(vendor, kind, shifts, monkeypatch):
    """On AMD's VNNI path the xor of each broadcast is free beside VPDPBUSD (Zen 4): A is
    not shifted once per call there; elsewhere it is."""
    from runtime import cpu

    regs = cpu.encode_registers(["avx2", "fma", "bmi2", "avx", "osxsave"], vendor=vendor)
    monkeypatch.setattr(cpu, "_cached", cpu.CpuInfo.from_registers(regs, 0b111))
    path = next(p for p in (fast_path("avx512_core_vnni"), fast_path("avx2"), widening_path("avx2")) if p.kind == kind)
    assert gemm_driver.shifts_s8_a_once(path) is shifts


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("M", [1, 5, 13])  # fewer than 8 row blocks: B prefetched ahead
def test_prefetch_ahead(isa, M, monkeypatch):
    """Prefetching B ahead of the K loop reads past the end of packed B on the last tile's
    last groups: prefetches never fault, and the result is the same bit for bit. (The
    distance Intel gets, on any CPU: AMD gets none.)"""
    monkeypatch.setattr(gemm_driver, "prefetch_ahead_bytes", lambda: 4096)
    info = _run(isa, "exact", "u8", M, 70, 301, ao=4, bo=-1)
    assert info["blocking"]["prefetch_b_ahead_bytes"] > 0 and not info["blocking"]["prefetch_next_tile_b"]
    _run(isa, "faithful", "s8", M, 33, 7, threads=2)


@pytest.mark.parametrize("vendor,ahead", [("GenuineIntel", 4096), ("AuthenticAMD", 0), ("HygonGenuine", 0)])
def test_prefetch_ahead_follows_the_vendor(vendor, ahead, monkeypatch):
    """Intel's L1 prefetchers fall behind B's stream and AMD's (Zen 4) do not: a kernel
    for few rows prefetches B 4 KB ahead on the one and not at all on the other."""
    from jit.gemm_kernel import choose_tile
    from jit.output import OutputSpec
    from runtime import cpu

    regs = cpu.encode_registers(["avx2", "fma", "bmi2", "avx", "osxsave"], vendor=vendor)
    monkeypatch.setattr(cpu, "_cached", cpu.CpuInfo.from_registers(regs, 0b111))
    assert gemm_driver.prefetch_ahead_bytes() == ahead
    kspec = choose_tile(fast_path("avx2"), False, OutputSpec(), 2)
    assert gemm_driver.tuned_spec(kspec, 4, 4096, 4096, 1).prefetch_ahead == ahead


@pytest.mark.parametrize("isa", isa_params())
def test_s8_few_tiles_keeps_the_in_kernel_shift(isa):
    info = _run(isa, "exact", "s8", 20, 10, 33)
    assert not info["blocking"]["s8_a_shifted_once_per_call"]


def _made_for(monkeypatch, rows: tuple, ks: tuple, ns: tuple | None = None) -> list:
    """Make every GEMM kernel as a primitive that knows its shape does (``rows=``, ``ks=``,
    ``ns=``)."""
    import jit.gemm_kernel as gk

    choose, made = gk.choose_tile, []

    def for_shape(*args, **kwargs):
        made.append(choose(*args, **dict(kwargs, rows=rows, ks=ks, ns=ns)))
        return made[-1]
    monkeypatch.setattr(gk, "choose_tile", for_shape)
    return made


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("M, K, rest, tail", [
    (42, 32, False, False), (44, 64, False, False), (43, 19, False, True), (1, 4, True, False),
    (5, 17, False, True), (13, 3, True, False), (7, 21, True, True),
])
def test_kernel_made_for_its_shape(isa, M, K, rest, tail, monkeypatch):
    """A kernel made for the M and K a primitive knows has only the tail block of M's
    remainder, no block taller than M, and the K loops K runs (whole unrolled
    iterations; a loop of single groups; the shifted last group): bit for bit all the same."""
    made = _made_for(monkeypatch, (M,), (K,))
    _run(isa, "exact", "u8", M, 40, K, seed=M)
    _run(isa, "faithful", "s8", M, 70, K, ao=-3, bo=2, threads=2, seed=K)
    assert made and all((s.k_rest, s.k_tail) == (rest, tail) for s in made)
    assert all(s.tails == tuple(sorted({M % s.mr} - {0})) for s in made)
    assert all(s.mr <= M for s in made)  # no block taller than M (M of 1 and 5: one block of M)


@pytest.mark.parametrize("isa", isa_params()[:1])
def test_kernel_made_for_a_shape_refuses_others(isa, monkeypatch):
    """A call the kernel has no code for (a row remainder without a tail block, K with
    a partial unrolled iteration or a last partial group) is refused before it runs,
    never computed with rows or K left out."""
    _made_for(monkeypatch, (42,), (32,))  # mr 6: no tail block; 8 groups of 4: no rest, no tail
    _run(isa, "exact", "u8", 42, 40, 32, calls=1)
    for M, K, what in ((43, 32, "no block for 43"), (42, 33, "no K loop for K=33"),
                       (42, 36, "no K loop for K=36")):
        with pytest.raises(RuntimeError, match=what):
            _run(isa, "exact", "u8", M, 40, K, calls=1)


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("N, whole", [(48, True), (128, True), (40, False), (47, False)])
def test_kernel_made_for_whole_column_tiles(isa, N, whole, monkeypatch):
    """A kernel made for an N of whole column tiles (48 and 128: tiles of 16 columns on
    AVX2; of 48 and 64 on AVX-512, whose tile has min(4, N / 16) vectors) has no masked
    tail in its output stage (plain loads and stores of the old C and the result), the
    same bits; one whose N ends inside a tile keeps it."""
    made = _made_for(monkeypatch, (13,), (40,), (N,))
    _run(isa, "exact", "u8", 13, N, 40, beta=1.0, seed=N)  # accumulate: C read and written
    _run(isa, "faithful", "s8", 13, N, 40, alpha=0.5, beta=-2.0, threads=2, seed=N + 1)  # float mode
    assert made and all(s.n_tail == (not whole) for s in made)
    if whole:
        assert all(N % s.tile_n == 0 for s in made)


@pytest.mark.parametrize("isa", isa_params()[:1])
def test_kernel_made_for_whole_tiles_refuses_a_partial_one(isa, monkeypatch):
    """A kernel without the masked tail refuses a call whose columns end inside a tile
    (it would write past them), before it runs."""
    _made_for(monkeypatch, (13,), (40,), (48,))
    _run(isa, "exact", "u8", 13, 48, 40, calls=1)
    with pytest.raises(RuntimeError, match="no partial column tile for 40 columns"):
        _run(isa, "exact", "u8", 13, 40, 40, calls=1)


@pytest.mark.parametrize("isa", isa_params())
def test_gemm_kernel_serves_every_shape(isa):
    """``gemm_u8s8s32`` makes a Gemm per call, of any shape: its kernel keeps every tail
    block and K loop, so products of other M and K (and the same B prefetch) share it."""
    specs = set()
    for M, K in ((13, 17), (8, 32), (1, 3), (5, 64)):
        rng = np.random.default_rng(M)
        g = Gemm(M, 40, K, B=rng.integers(-64, 64, (K, 40)).astype(np.int8), isa=isa, threads=1)
        g.execute(rng.integers(0, 256, (M, K)).astype(np.uint8), np.zeros((M, 40), np.int32))
        specs.update(kernel.meta["kspec"] for kernel in g._kernels.values())
    assert len(specs) == 1, specs
    spec = specs.pop()
    assert (spec.tails, spec.k_rest, spec.k_tail, spec.n_tail) == (None, True, True, True)


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("mr", [7, 8, 9])
def test_tall_tiles(isa, mr, monkeypatch):
    """Blocks of 7-9 rows (a third A/C row base, what a convolution's short output rows
    ask for with narrower tiles), on tiles of 2 vectors: every M around the block height,
    both policies,
    where the path has the registers (otherwise the tallest tile that fits runs)."""
    import jit.gemm_kernel as gk

    choose = gk.choose_tile
    made = []

    def tall(path, s8_src, output, nr, mr_=gk.DEFAULT_MR, **kwargs):
        spec = choose(path, s8_src, output, nr, mr, **kwargs)
        made.append(spec)
        return spec
    monkeypatch.setattr(gk, "choose_tile", tall)
    for M in (1, mr - 1, mr, mr + 1, 2 * mr + 3):
        _run(isa, "exact", "u8", M, 30, 21, seed=M)  # N <= 32: 2 vectors a tile, 9 rows fit
        _run(isa, "faithful", "s8", M, 17, 9, ao=3, bo=-2, seed=M)
    assert made and all(spec.mr <= mr for spec in made)
    if isa.startswith("avx512"):
        assert any(spec.mr == mr for spec in made)


@pytest.mark.parametrize("dst, float_mode", [("s32", False), ("f32", True), ("s32", True)])
def test_avx2_whole_tiles_store_unmasked(dst, float_mode):
    """On AVX2 a kernel whose column tiles may be partial stores whole tiles with plain
    VMOVUPS and only the partial last tile with VMASKMOVPS, which is slow there (a 256^3
    s32 GEMM on a Zen 3: 15% of its time when every tile's stores were masked). Generated
    and disassembled on any CPU; the bits of both branches are the other tests' (N = 40,
    47: two whole tiles and a partial one, on every executable path)."""
    import iced_x86

    from jit.disasm import decode
    from jit.dot import fast_path
    from jit.gemm_kernel import choose_tile
    from jit.output import OutputSpec
    from primitives.gemm_driver import kernel_of

    output = OutputSpec(col_comp=True, float_mode=float_mode, scale="col" if float_mode else "none",
                        dst_dt=dst)
    spec = choose_tile(fast_path("avx2"), False, output, 2, rows=(13,), ks=(40,), ns=(40,))
    assert spec.n_tail and (spec.mr, spec.nr) == (5, 2)
    stores = {"plain": 0, "masked": 0}
    for ins in decode(kernel_of(spec).code()):
        if ins.op0_kind == iced_x86.OpKind.MEMORY and ins.op_count >= 2:
            if ins.mnemonic == iced_x86.Mnemonic.VMOVUPS:
                stores["plain"] += 1
            elif ins.mnemonic == iced_x86.Mnemonic.VMASKMOVPS:
                stores["masked"] += 1
    # every block height the kernel has (5 rows, and the 3-row tail of 13), both branches
    assert stores == {"plain": (5 + 3) * 2, "masked": (5 + 3) * 2}, stores
