"""Int8 GEMM with oneDNN's semantics: ``C = alpha*(op(A) - ao)(op(B) - bo) + beta*C + co``.

Row-major, as ``dnnl_gemm_u8s8s32`` / ``dnnl_gemm_s8s8s32``. A is u8 (or s8, shifted by
+128 with the compensation folded into the column offsets), B is s8, C is s32.

Example::

    >>> import numpy as np
    >>> from primitives.gemm import gemm
    >>> a = np.array([[255, 255, 0, 0]], np.uint8)
    >>> b = np.array([[127], [127], [0], [0]], np.int8)
    >>> int(gemm(a, b)[0, 0])                       # exact on every ISA path
    64770
    >>> int(gemm(a, b, policy="faithful", isa="avx2")[0, 0])   # what VPMADDUBSW computes
    32767
"""
from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass

import numpy as np

from jit.column_term import column_term_kernel
from jit.dot import Path, fast_path, widening_path
from jit.gemv_kernel import gemv_kernel, shifts_s8, takes
from jit.output import OutputSpec, SumOp
from jit.pack_kernel import VnniPacker, pack_vnni, vnni_packs
from jit.repoint import repoint_kernel, repointer
from primitives import verbose
from primitives.base import in_force, kept_setup
from primitives.checks import check_choice, check_dim, check_disjoint, check_int_range, check_matrix, check_vector
from primitives.gemm_pack import PackedB, cell_share, pack_b, saturation_proof, unsafe_pairs
from primitives.reference import op
from primitives.replay import Replay, pointing
from runtime import isa as isa_mod
from primitives.gemm_driver import (Operand, OutputArgs, Plan, kernel_of, make_plan, point, run, shifts_s8_a_once,
                                    tuned_spec)
from primitives.gemv_driver import (CHUNKED_BYTES, IN_PLACE_ROWS, ChunkedRows, GemvPlan, chunk_kernels,
                                   partial_columns, rows_alias, walks_in_chunks)
from runtime.ffi import pointer_to, unowned
from runtime.pool import CallPlan
from runtime.settings import stamp as settings_stamp
from runtime.threads import resolve_threads

POLICIES = ("exact", "faithful")
_NR = {512: 4, 256: 2}  # vectors per tile
_SHIFT_A_TILES = 4  # s8 A: shift to u8 once per call (not per tile) from this many column tiles
# Exact weights split into safe ones and residual cells while at most this share of the
# (K group, vector)s hold an unsafe pair; widened beyond. A cell, one more VPMADDUBSW step
# plus its loop's bookkeeping, costs about 1.2 times its share of the loop, widening
# 30-43% (Zen 3, one thread: BERT-base inner products; ResNet-50's res3 1x1 128->512 at
# 26% of cells split 1.27 against widened 1.30 of faithful, res2 1x1 64->256 at 43%
# 1.50 against 1.38).
SPLIT_MAX_SHARE = 0.30


_CHUNKED_ROWS = 2  # rows of A that read B's rows in chunks of K (gemv_driver.ChunkedRows), a row at a time


@dataclass
class _InPlace:
    """B read in place: per plan (one, or a row of A's chunked walk each), its bytes past
    A's and C's first; every call in one hand-off; the kernel's name."""

    plans: list  # (GemvPlan or ChunkedRows, A's byte offset, C's byte offset)
    name: str
    calls: CallPlan


def _wrap32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.int64).astype(np.uint32).view(np.int32)


@dataclass(frozen=True)
class _Comps:
    key: tuple
    kernel: object
    out: OutputArgs
    sums: np.ndarray  # int64 scratch: the column term of a B packed at each call
    add: np.ndarray  # int32: the column term's part that is not B's sums (K*ao'*bo, co; jit.column_term's add)


@dataclass(frozen=True)
class Choice:
    """The implementation decision, as impl_info reports it."""

    path: Path
    nr: int
    reason: str
    residual: bool = False  # the kernel adds split weights' residual cells (gemm_pack)

    def exact_under(self, policy: str) -> bool:
        """Whether the results are exact: the path is (VPDPBUSD, widening), or ``exact``
        made them so on VPMADDUBSW (every pair proven safe, or the rest split into cells)."""
        return self.path.exact or policy == "exact"


def tile_vectors(path: Path, n: int) -> int:
    """Vectors per column tile for ``n`` columns: 4 (AVX-512) or 2 (AVX2), fewer for small n."""
    return min(_NR[path.bits], -(-n // path.lanes))


def decide(isa: str, policy: str, b_kn: np.ndarray | None, n: int | None = None,
           proof: tuple[int, int] | None = None, *, unsafe: np.ndarray | None = None,
           nr: int | None = None) -> Choice:
    """The path and tile width a GEMM with logical K x N weights ``b_kn`` takes on ``isa``.

    The fast path, except for policy ``exact`` on a non-VNNI level when some column pair
    of the weights can saturate VPMADDUBSW: then, where such pairs are few, the fast path
    on split weights with residual cells (``gemm_pack.cut_pairs``), else the widening
    path. Without weights (``b_kn`` None, ``n`` columns): the fast path,
    the decision left to the packing (:func:`candidates` names every kernel it can take).
    ``proof`` and ``unsafe``: the weights' ``saturation_proof`` and ``unsafe_pairs``,
    where the caller has them; ``nr``: the tile width (vectors) where the caller's
    kernels use another than :func:`tile_vectors` (a convolution).
    """
    fast = fast_path(isa)
    n = b_kn.shape[1] if b_kn is not None else n
    nr = nr or tile_vectors(fast, n)
    if fast.kind == "vnni":
        return Choice(fast, nr, "VPDPBUSD: exact u8*s8 dot products, no intermediate saturation")
    if policy == "faithful":
        return Choice(fast, nr, "faithful: VPMADDUBSW always, saturating as the hardware and oneDNN do")
    if b_kn is None and proof is None:
        return Choice(fast, nr, "exact: decided when the weights are packed: VPMADDUBSW where every column "
                                "pair is proven safe (opposite signs, or 255*(|w0|+|w1|) <= 32767) or few "
                                "are not (residual cells), else the widening VPMADDWD path", residual=True)
    if proof is None:
        unsafe = unsafe_pairs(b_kn) if unsafe is None else unsafe
        proof = saturation_proof(b_kn, unsafe)
    safe, total = proof
    if safe == total:
        return Choice(fast, nr, f"exact: all {total} column pairs proven safe (opposite signs, or "
                                "255*(|w0|+|w1|) <= 32767), fast VPMADDUBSW path", residual=True)
    if unsafe is None:  # (a proof without its pairs: only weights that fail it need them)
        unsafe = unsafe_pairs(b_kn)
    cells, share = cell_share(unsafe, fast.lanes)
    if share <= SPLIT_MAX_SHARE:
        return Choice(fast, nr, f"exact: {safe} of {total} column pairs proven safe; the rest are split, "
                                f"VPMADDUBSW path plus {cells} residual cells ({share:.1%} of the K group x "
                                "vector cells), a VPMADDUBSW step each", residual=True)
    return Choice(widening_path(isa), nr,
                  f"exact: {safe} of {total} column pairs proven safe; the rest can saturate, "
                  "widening VPMADDWD path")


def candidates(isa: str, policy: str, n: int) -> list[Choice]:
    """Every decision weights of ``n`` columns can lead to: the fast path, and for
    ``exact`` on a non-VNNI level the widening one too, so that a primitive whose weights
    are not known yet can make both kernels at creation (its first execution then
    generates nothing, whichever the weights take). Under ``exact`` the fast kernel reads
    residual cells (none when every pair is safe)."""
    first = decide(isa, policy, None, n)
    if policy != "exact" or first.path.kind == "vnni":
        return [first]
    return [first, Choice(widening_path(isa), first.nr, "exact: some column pair can saturate VPMADDUBSW, "
                                                         "widening VPMADDWD path")]


def runtime_choice(isa: str, policy: str, n: int) -> Choice:
    """The decision for weights of ``n`` columns packed at every call, in machine code
    and without a proof: VNNI, or ``faithful`` (VPMADDUBSW reads the VNNI layout), the
    fast path; ``exact`` without VNNI the widening one (the proof and the split cost more
    per call than widening does; weights packed once take them)."""
    if fast_path(isa).kind == "vnni" or policy == "faithful":
        return decide(isa, policy, None, n)
    return dataclasses.replace(candidates(isa, policy, n)[-1], reason="exact: B given at execution, widened "
                                                                      "(no proof per call)")


def pack_weights(b_kn: np.ndarray, isa: str, policy: str, nr: int | None = None,
                 proof: bool = True, runtime: bool = False) -> tuple[PackedB, Choice]:
    """The decision for the K x N weights ``b_kn`` and the weights packed for it (the
    unsafe pairs and the saturation proof taken once, for both); ``nr`` as :func:`decide`'s.
    Where the decision needs no proof (a VNNI path, or ``faithful``: VPMADDUBSW reads
    the same layout), the packing is machine code (``jit.pack_kernel``) and the proof,
    which ``Gemm.impl_info`` reports, is taken only with ``proof``. ``runtime``: weights
    packed for one call, which under ``exact`` without VNNI widen (machine code, no proof:
    the proof and the split cost more per call than widening does)."""
    if runtime and policy == "exact" and fast_path(isa).kind != "vnni" and vnni_packs(b_kn):
        choice = runtime_choice(isa, policy, b_kn.shape[1])
        return pack_vnni(b_kn, choice.path, choice.nr), choice
    if fast_path(isa).kind == "vnni" or policy == "faithful":
        choice = decide(isa, policy, None, b_kn.shape[1], nr=nr)
        if vnni_packs(b_kn):
            packed = pack_vnni(b_kn, choice.path, choice.nr)
        else:  # neither rows of N nor columns of K, or no AVX2 to run the packing on
            packed = pack_b(b_kn, choice.path, choice.nr, (None, None))
        if proof:
            packed = dataclasses.replace(packed, **dict(zip(("safe_pairs", "total_pairs"), saturation_proof(b_kn))))
        return packed, choice
    unsafe = unsafe_pairs(b_kn)
    proof = saturation_proof(b_kn, unsafe)
    choice = decide(isa, policy, b_kn, proof=proof, unsafe=unsafe, nr=nr)
    return pack_b(b_kn, choice.path, choice.nr, proof, unsafe, residual=choice.residual), choice


def gemm_kernel(choice: Choice, s8_src: bool, output: OutputSpec, shape: tuple | None = None,
                only_this_shape: bool = True):
    """The cached kernel for a decision (generated only, never executed, here).

    ``shape``: ``(M, N, K, threads)`` of the product it will run, when the caller knows
    it: the kernel then has the B prefetch that shape wants (``gemm_driver.tuned_spec``),
    so the first execution generates nothing more, and with ``only_this_shape`` only the
    tail block and K loops that shape runs (less code; a kernel for every M % mr and K
    kind instead of one for all).
    """
    from jit.gemm_kernel import choose_tile

    if shape is None:
        return kernel_of(choose_tile(choice.path, s8_src, output, choice.nr, residual=choice.residual))
    M, N, K, threads = shape
    known = dict(rows=(M,), ks=(K,), ns=(N,)) if only_this_shape else {}
    kspec = choose_tile(choice.path, s8_src, output, choice.nr, residual=choice.residual, **known)
    return kernel_of(tuned_spec(kspec, M, N, K, threads))


def _rows_view(a: np.ndarray, rows: int, cols: int, ld: int) -> np.ndarray:
    """The first ``cols`` bytes of ``rows`` rows ``ld`` apart, as a view (no copy)."""
    if a.ndim == 2 and a.strides[1] == 1 and a.strides[0] == ld and a.shape[0] >= rows and a.shape[1] >= cols:
        return a[:rows, :cols]
    return np.lib.stride_tricks.as_strided(a.reshape(-1), (rows, cols), (ld, 1), writeable=False)


def _u8_variant(kernel):
    """The kernel like ``kernel`` (an s8-source one) that reads A already shifted to u8."""
    from dataclasses import replace

    return kernel_of(replace(kernel.meta["kspec"], s8_src=False))


class Gemm:
    """A reusable int8 GEMM for one problem shape (descriptor, kernels, packed B).

    Create once, execute many times. Pass ``B`` at creation when it is constant: it is
    packed once (with its column sums and the VPMADDUBSW overflow proof); otherwise it
    is packed at every execution, or, for 1-4 rows of A in integer mode (alpha 1, beta
    0 or 1), read in place as oneDNN reads it (``impl_info()["runtime_weights"]``).

    One Gemm runs one call at a time (its argument structs point at that call's arrays):
    calls from Python threads at once take turns (a lock), so threads that should run
    in parallel need a Gemm each, as the one-off functions keep one per thread. (A
    primitive's ``execute`` runs from several threads at once.)

    Example::

        >>> import numpy as np
        >>> g = Gemm(2, 3, 5, B=np.ones((5, 3), np.int8))
        >>> C = np.zeros((2, 3), np.int32)
        >>> g.execute(np.full((2, 5), 2, np.uint8), C)
        >>> C.tolist()
        [[10, 10, 10], [10, 10, 10]]
    """

    def __init__(
        self,
        M: int,
        N: int,
        K: int,
        *,
        a_type: str = "u8",
        transa: str = "N",
        transb: str = "N",
        offsetc: str = "F",
        lda: int | None = None,
        ldb: int | None = None,
        ldc: int | None = None,
        alpha: float = 1.0,
        beta: float = 0.0,
        B: np.ndarray | None = None,
        policy: str = "exact",
        isa: str | None = None,
        threads: int | None = None,
    ):
        t0 = time.perf_counter()
        # Zero is a valid size, as in oneDNN and numpy: nothing to multiply (see execute).
        self.M, self.N, self.K = check_dim("M", M, 0), check_dim("N", N, 0), check_dim("K", K, 0)
        if a_type not in ("u8", "s8"):
            raise ValueError(f"a_type: expected 'u8' or 's8', got {a_type!r}")
        self.a_type = a_type
        self.a_dtype = np.uint8 if a_type == "u8" else np.int8
        self.transa = check_choice("transa", transa, "NT")
        self.transb = check_choice("transb", transb, "NT")
        self.offsetc = check_choice("offsetc", offsetc, "FCR")
        self.lda = check_dim("lda", lda if lda is not None else max(1, K if self.transa == "N" else M))
        self.ldb = check_dim("ldb", ldb if ldb is not None else max(1, N if self.transb == "N" else K))
        self.ldc = check_dim("ldc", ldc if ldc is not None else max(1, N))
        for name, ld, need in (("lda", self.lda, K if self.transa == "N" else M),
                               ("ldb", self.ldb, N if self.transb == "N" else K), ("ldc", self.ldc, N)):
            if ld < need:
                raise ValueError(f"{name}: leading dimension {ld} is smaller than the row length {need}")
        for name, value in (("alpha", alpha), ("beta", beta)):
            if not isinstance(value, (int, float, np.floating, np.integer)) or not np.isfinite(value):
                raise ValueError(f"{name}: expected a finite number, got {value!r}")
        self.alpha, self.beta = float(alpha), float(beta)
        if policy not in POLICIES:
            raise ValueError(f"policy: expected one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy = policy
        self.isa = verbose.planned_isa(f"gemm_{a_type}s8s32", isa)
        self.threads = resolve_threads(threads)
        self.float_mode = not (self.alpha == 1.0 and self.beta in (0.0, 1.0))
        self._kernels: dict = {}
        self._runtime_packers: dict = {}  # B given at execution, rows or columns: (VnniPacker, Choice)
        self._runtime: Choice | None = None  # the decision for a B given at execution (see _runtime_choice)
        self._packed: PackedB | None = None
        self._choice: Choice | None = None
        self._empty = min(self.M, self.N, self.K) == 0
        self._k_zero: Gemm | None = None
        if B is not None:
            self._packed, self._choice = self._pack(B)
        if not self._empty:  # (M or N of 0 runs no kernel, so on any CPU; K of 0 runs the Gemm below)
            isa_mod.require_path(self.isa)
            self._repoint = repoint_kernel()  # (made now, not at a first moved call: _execute's move)
        if self.K == 0 and self.M and self.N:
            # C <- beta*C + co: the output stage on a zero accumulator, which a GEMM of
            # K = 1 over zeros computes bit for bit as every other GEMM's stage does.
            with verbose.muted():  # (this Gemm logs its lines, not the one it runs)
                self._k_zero = Gemm(self.M, self.N, 1, a_type=a_type, offsetc=offsetc, ldc=self.ldc, alpha=alpha,
                                    beta=beta, B=np.zeros((1, self.N), np.int8), policy=policy, isa=isa,
                                    threads=threads)
            self._k_zero_a = np.zeros((self.M, 1), self.a_dtype)
        # B given at execution times 1-4 rows of A, in integer mode: read in place by the
        # gemv kernels (rows of N bytes, or columns of K: op(B)'s layout), as oneDNN reads
        # it, not packed at every call (1 x 4096 x 4096: 16 MB); their plans per zero point
        # kind. The offsets the kernel leaves (co, bo's row term) are added after it.
        small = 1 <= self.M <= IN_PLACE_ROWS and self.K and self.N and not self.float_mode
        self._in_place_layout = ("rows" if self.transb == "N" else "columns") if small else None
        self._in_place_plans: dict = {}
        self._last_in_place: str | None = None  # the kernel that read the last call's B in place
        self._pending: VnniPacker | None = None  # B given at execution, pointed at, not packed yet
        self._fused: tuple | None = None  # (packer, plan, CallPlan): each thread packs its columns, then its product
        self._last_packed: PackedB | None = None  # B given at execution: what the last call decided
        self._last_choice: Choice | None = None
        self._comps_cache: _Comps | None = None
        self._plan_cache: tuple | None = None  # (key, plan, comps, shifted A buffer)
        self._replay: tuple | None = None  # ((ao, bo), Replay): the last call, to run again (see execute)
        self._busy = threading.Lock()
        if verbose.enabled("create"):
            self._log("create", (time.perf_counter() - t0) * 1e3)

    def _log(self, kind: str, ms: float) -> None:
        """A verbose line (``INT8JIT_VERBOSE``) for this GEMM's creation or a call, as a
        primitive's: oneDNN's verbose mode logs its GEMM API's calls too."""
        choice = self._choice or self._last_choice or self._runtime or decide(self.isa, self.policy, None, self.N)
        descs = (f"a:{self.a_type}:{self.transa}:{self.M}x{self.K} b:s8:{self.transb}:{self.K}x{self.N} "
                 f"c:s32:{self.offsetc}:{self.M}x{self.N} ld:{self.lda}/{self.ldb}/{self.ldc}")
        attrs = f"alpha:{self.alpha:g} beta:{self.beta:g} policy:{self.policy}"
        isa = "any" if self._empty and self._k_zero is None else self.isa
        (verbose.create if kind == "create" else verbose.execution)(
            f"gemm_{self.a_type}s8s32", f"gemm:{isa}:{choice.path.kind}", isa, descs,
            attrs, ms)

    # -- creation-time decisions -------------------------------------------------------
    def _pack(self, B: np.ndarray, proof: bool = True) -> tuple[PackedB | None, Choice]:
        """B packed (``proof``: with the saturation proof on VNNI too, which impl_info
        reports; a B given at execution, packed at every call, goes without)."""
        self._check_b(B)
        if self._empty:
            return None, decide(self.isa, self.policy, None, self.N)
        # op(B) as a view (no gather: 4096 x 4096 transposed took 110 ms a call that way);
        # a transposed one is packed from its columns of K bytes
        b_kn = self._b_kn(B)
        if not proof and vnni_packs(b_kn):
            # B given at execution: one packer (its buffers, so the plan) for every call
            columns = b_kn.strides[-1] != 1
            kept = self._runtime_packers.get(columns)
            if kept is None:
                choice = self._runtime_choice()
                kept = self._runtime_packers[columns] = (VnniPacker(self.K, self.N, choice.path, choice.nr,
                                                                    threads=self.threads, columns=columns), choice)
            packer, choice = kept
            packer.point(b_kn)  # (packed by execute: alone, or in the product's hand-off)
            self._pending = packer
            return packer.packed, choice
        return pack_weights(b_kn, self.isa, self.policy, proof=proof, runtime=not proof)

    def _b_kn(self, B: np.ndarray) -> np.ndarray:
        """op(B) as a K x N view of B."""
        stored = (self.K, self.N) if self.transb == "N" else (self.N, self.K)
        b_kn = _rows_view(B, *stored, self.ldb)
        return b_kn if self.transb == "N" else b_kn.T

    def _runtime_choice(self) -> Choice:
        """The decision for a B given at execution (:func:`runtime_choice`), made once: the
        in-place reads ask it at every call (2 us)."""
        if self._runtime is None:
            self._runtime = runtime_choice(self.isa, self.policy, self.N)
        return self._runtime

    def _check_b(self, B: np.ndarray) -> None:
        check_matrix("B", B, np.int8, self.K if self.transb == "N" else self.N,
                     self.N if self.transb == "N" else self.K, self.ldb)

    def _in_place(self, ao: int) -> "_InPlace | None":
        """How B is read in place for a source zero point ``ao`` (made at the first call of
        its kind), or None where the path's kernels do not take this shape (AVX2: N or K in
        whole dwords; the rows the rows kernel holds)."""
        path = self._runtime_choice().path  # (exact without VNNI: widened)
        # (the column sums: a zero point's, and an s8 source's +128 where it is shifted)
        comp = ao != 0 or self.a_type == "s8" and shifts_s8(path)
        if comp in self._in_place_plans:
            return self._in_place_plans[comp]
        layout, rows, K = self._in_place_layout, self.M, self.K
        # Rows of B that alias in the caches, or many (gemv_driver.walks_in_chunks): each of
        # 1-2 rows of A walks K in chunks; 3-4 rows walk all of K (3 x 3000 x 3000, 9 MB:
        # 0.28 ms against 0.52 packed), but where B's rows alias: packed, or, from 8 MB of
        # B, each row in chunks too (Zen 4, one / two threads, cached B / from memory:
        # 3 x 4096 x 4096 1.6 / 1.0, 1.9 / 1.4 ms against 2.4 / 1.6, 2.9 / 2.2 packed;
        # 4 x 2048 x 2048, 4 MB, packed 0.26 / 0.12 against 0.38 / 0.30 in chunks).
        alias = layout == "rows" and rows_alias(K, self.ldb)
        chunked = layout == "rows" and walks_in_chunks(K, self.ldb) and (
            rows <= _CHUNKED_ROWS or alias and K * self.ldb >= CHUNKED_BYTES)
        output = OutputSpec(col_comp=False, accumulate=self.beta == 1.0)
        plan = None
        if rows <= IN_PLACE_ROWS and (chunked or not alias) \
                and takes(path, K, self.N if layout == "rows" else None, 1 if chunked else rows, comp, output):
            isa_mod.require_path(self.isa)
            s8, lda, ldc = self.a_type == "s8", self.lda if self.transa == "N" else self.K, 4 * self.ldc
            if chunked:
                kernels = chunk_kernels(path, s8, comp, output)
                plans = [(ChunkedRows(kernels, self.N, K, self.ldb, ldc, OutputArgs(col_comp=None), self.threads,
                                      np.zeros(partial_columns(self.N), np.int32)), i * lda, i * ldc)
                         for i in range(rows)]
            else:
                kernel = gemv_kernel(path, s8, comp, output, layout, rows)
                plans = [(GemvPlan(kernel, rows, self.N, K, lda, self.ldb, ldc, OutputArgs(col_comp=None),
                                   self.threads), 0, 0)]
            plan = _InPlace(plans, plans[0][0].kernel.meta["gemv"].name,
                            CallPlan.joined([p.calls for p, _, _ in plans]))
        self._in_place_plans[comp] = plan
        return plan

    def _run_in_place(self, plan: "_InPlace", A, B, C, ao: int, bo: int, co):
        """C from B read in place: the kernel's sum of (A - ao) B (beta 1: added to C),
        then, on C's 1-4 rows, what it leaves: -bo * (rowsum(A) - K*ao) and co, wrapping
        as the packed path's compensation does (both are sums modulo 2^32). Returns the
        call again (the kernels pointed at these arrays) and the call that points them at
        new ones (as :meth:`_execute`), or None where A was copied."""
        M, K = self.M, self.K
        a, lda = A, self.lda
        if self.transa == "T":
            a, lda = np.ascontiguousarray(op(A, "T", M, K, self.lda)), K
        self._point_in_place(plan, a, B, C, ao)
        plan.calls.run()
        self._last_in_place = plan.name
        fixes = bo or (co is not None and co.any())  # (the one-off calls' co of zeros: nothing to add)
        if fixes:
            self._in_place_fix(a, lda, C, ao, bo, co)
        if a is not A:
            return None
        run, now = plan.calls.run, [a, C, co]  # (the fix reads them at every call)

        def move(arrays: dict) -> None:
            if fixes:  # (the fix reads them: arrays over their memory, not the caller's; co flat, as checked)
                co_now = arrays.get("co")
                now[:] = unowned(arrays["A"]), unowned(arrays["C"]), None if co_now is None else \
                    unowned(co_now).reshape(-1)
            self._point_in_place(plan, arrays["A"], arrays["B"], arrays["C"], ao)
        return ((lambda: (run(), self._in_place_fix(now[0], lda, now[1], ao, bo, now[2]))) if fixes else run), move

    @staticmethod
    def _point_in_place(plan: "_InPlace", a, B, C, ao: int) -> None:
        for gemv, a_at, c_at in plan.plans:
            gemv.point(a, B, C, ao, (a_at, 0), c_at)

    def _in_place_fix(self, a, lda: int, C, ao: int, bo: int, co) -> None:
        """What the in-place kernels leave of the offsets, added on C's 1-4 rows."""
        M, N, K = self.M, self.N, self.K
        fix = np.zeros((M, 1), np.int64)
        if bo:
            fix[:, 0] -= bo * (op(a, "N", M, K, lda).astype(np.int64).sum(axis=1) - K * ao)
        if co is not None:
            fix = fix + (co[:M, None] if self.offsetc == "C" else co[:N] if self.offsetc == "R"
                         else co[0]).astype(np.int64)
        if fix.any():
            c = C[:M, :N] if C.ndim == 2 else np.lib.stride_tricks.as_strided(C, (M, N), (4 * self.ldc, 4))
            np.add(c, _wrap32(np.broadcast_to(fix, (M, N))), out=c)

    def _kernel(self, choice: Choice, spec: OutputSpec):
        key = (choice.path, choice.nr, choice.residual, spec)
        kernel = self._kernels.get(key)
        if kernel is None:
            # gemm_u8s8s32 and the like make a Gemm per call, of any shape: one kernel
            # (per B prefetch) serves them all rather than one per M % mr and K kind.
            kernel = self._kernels[key] = gemm_kernel(choice, self.a_type == "s8", spec,
                                                      (self.M, self.N, self.K, self.threads),
                                                      only_this_shape=False)
        return kernel

    # -- execution ---------------------------------------------------------------------
    def execute(self, A: np.ndarray, C: np.ndarray, *, B: np.ndarray | None = None, ao: int = 0, bo: int = 0,
                co: np.ndarray | None = None) -> None:
        """C <- alpha*(op(A) - ao)(op(B) - bo) + beta*C + co, in place.

        M, N or K may be 0 (a batch that came out empty): with K = 0 there is no
        product, so C <- beta*C + co; with M or N = 0 there is no C to write.

        A call with the very arrays of the last one (the same objects, unchanged in shape,
        type and writability, co's values and the offsets the same) runs that call's
        kernels again without checking and setting up (:class:`primitives.replay.Replay`,
        as a primitive's ``execute`` does): the kernels read the arrays' values as they
        are now, and B is packed again where the last call packed it. New arrays of the
        same shapes, types and strides (co's values the same, C over none of the others)
        take that call too, its kernels pointed at them (``Replay.moves``).
        """
        with self._busy:  # (two threads at once would point one struct at both's arrays)
            self._call(A, C, B, ao, bo, co)

    def _call(self, A, C, B, ao, bo, co, logged: bool = False) -> None:
        """:meth:`execute` by a thread that holds this Gemm alone (the one-off calls' own)."""
        if not logged and not verbose.exec_quiet():
            t0 = time.perf_counter()
            self._call(A, C, B, ao, bo, co, True)
            self._log("exec", (time.perf_counter() - t0) * 1e3)
            return
        replay = self._replay
        args = _gemm_args(A, B, C, co) if type(ao) is int and type(bo) is int else None  # (else: no replay)
        if replay is not None and args is not None and replay[0] == (ao, bo) \
                and (replay[1].matches(args) or replay[1].moves(args)):  # (moves: new arrays of the same layouts)
            replay[1].run()
            return
        self._replay = None
        # (the set-up and its replay keep arrays over the caller's memory, not the caller's
        # arrays: Replay holds those weakly, and runs only on live ones)
        again = self._execute(*(unowned(x) if type(x) is np.ndarray else x for x in (A, C, B)), ao, bo, co)
        if again is not None and args is not None:
            record = Replay(again[0], move=again[1])
            if record.remember(args, ("co",), ("C",)):
                self._replay = ((ao, bo), record)

    def _execute(self, A, C, B, ao, bo, co):
        """:meth:`execute`'s checks and set-up, then the call; returns the call to run again
        for the same arrays and the call that points it at new ones, ``(again, move)``
        (None where it copies one: a transposed or short-K A, a B packed by numpy; or
        reads A's values to set up: bo's row term)."""
        M, N, K = self.M, self.N, self.K
        lo, hi = (0, 255) if self.a_type == "u8" else (-128, 127)
        ao = check_int_range("ao", ao, lo, hi)
        bo = check_int_range("bo", bo, -128, 127)
        check_matrix("A", A, self.a_dtype, M if self.transa == "N" else K, K if self.transa == "N" else M, self.lda)
        check_matrix("C", C, np.int32, M, N, self.ldc, writable=True)
        if co is not None:
            co = check_vector("co", co, np.int32, {"F": 1, "C": M, "R": N}[self.offsetc])
        check_disjoint({"A": A, "C": C} if co is None else {"A": A, "C": C, "co": co}, ("C",), "gemm")
        if B is not None and self._in_place_layout is not None:
            self._check_b(B)
            gemv = self._in_place(ao)
            if gemv is not None and not np.may_share_memory(B, C):  # (else packed: a copy)
                again = self._run_in_place(gemv, A, B, C, ao, bo, co)
                self._last_choice = self._runtime_choice()  # (its path's, for impl_info)
                return again
        packer = None
        if B is not None:
            packed, choice = self._pack(B, proof=False)
            self._last_packed, self._last_choice, self._last_in_place = packed, choice, None
            packer = self._pending  # (None: packed by numpy, a new PackedB)
        elif self._choice is not None:
            packed, choice = self._packed, self._choice
        else:
            raise ValueError("B: this Gemm was created without a constant B; pass B= to execute")
        if self._empty:  # M or N of 0: no element of C; K of 0: no product (ao, bo vanish)
            if self._k_zero is not None:
                self._k_zero._call(self._k_zero_a, C, None, 0, 0, co, logged=True)  # (its own: no lock, no line)
            return None

        pending, self._pending = self._pending, None
        ao_eff = ao + (128 if self.a_type == "s8" else 0)
        # A B that shares memory with C is packed whole before the product writes C (in
        # one hand-off, a thread's product could write what another has yet to pack).
        shared = pending is not None and np.may_share_memory(B, C)
        # The compensation's column term reads B's column sums (an s8 A, a zero point): with
        # bo 0 (no other term reads B) each thread makes it from the sums of the columns it
        # packs, in the product's hand-off (_packing_plan), or numpy after the packing.
        term = pending is not None and ao_eff != 0 and bo == 0 and not shared
        if pending is not None and ao_eff and not term:
            pending.pack()
            pending = None

        # A as the kernel reads it: row-major M x K, rows lda bytes apart, K >= 4.
        a, lda = A, self.lda
        if self.transa == "T":
            a, lda = np.ascontiguousarray(op(A, "T", M, K, self.lda)), K
        if K < 4:
            padded = np.zeros((M, 4), self.a_dtype)
            padded[:, :K] = op(a, "N", M, K, lda)
            a, lda = padded, 4

        comps = self._compensation(packed, choice, a, lda, ao, bo, co, new_sums=not term)
        plan = self._plan(comps, packed, lda)
        shifted = self._plan_cache[3]
        source = a
        if shifted is not None:  # s8 -> u8 (+128) once, for the u8 kernel (see _plan)
            np.bitwise_xor(_rows_view(a, M, shifted.shape[1], lda).view(np.uint8), 0x80, out=shifted)
            a = shifted
        fused = None
        if pending is not None:
            fused = None if shared else self._packing_plan(pending, plan, (comps, ao_eff) if term else None)
            if fused is not None:  # (each thread: its packing, [its column term,] its product)
                point(plan, a, C)
                fused.run()
            else:
                pending.pack()
                if term:
                    self._new_sums(comps, packed, ao_eff)
        if fused is None:
            run(plan, a, C)
        # Again: B packed (its column term anew, where the compensation reads its sums), A
        # shifted, the kernels; not where A was copied, B packed by numpy, or bo's row
        # term read from A's values.
        if source is not A or bo or B is not None and packer is None:
            return None
        calls = fused.run if fused is not None else plan.calls.run

        def rows_of(A):  # A's rows the xor reads, where A is shifted
            return _rows_view(A, M, shifted.shape[1], lda).view(np.uint8) if shifted is not None else None
        view = rows_of(A)

        def again():
            if fused is not None:
                packer.refresh()  # (a padded copy of B, where it needs one: the calls pack the rest)
            elif packer is not None:
                packer.repeat()
                if ao_eff:  # (the compensation reads the new column sums)
                    self._new_sums(comps, packed, ao_eff)
            if view is not None:
                np.bitwise_xor(view, 0x80, out=shifted)
            calls()

        # (Replay.moves: new arrays, the same layouts. Each struct's addresses are the new
        # arrays' first bytes plus what they were past these ones: jit.repoint's table; B's
        # view is addressed from B, and made only where the packer falls back to point():
        # 128^3 one-off with new arrays, 18.4 -> 17.2 us a call.)
        entries = [(s, "a", 0, a_off) for s, (a_off, _) in zip(plan.structs, plan.offsets)] + \
            [(s, "c", 1, c_off) for s, (_, c_off) in zip(plan.structs, plan.offsets)]
        point_ac = repointer(entries, 2)
        repoint = packer.mover() if packer is not None else None
        b_shift = self._b_kn(B).ctypes.data - B.ctypes.data if packer is not None else 0

        def move(arrays: dict) -> None:
            nonlocal view
            if repoint is not None:
                repoint(arrays["B"], pointer_to(arrays["B"]) + b_shift, self._b_kn)
            if shifted is not None:
                view = rows_of(unowned(arrays["A"]))
            point_ac(pointer_to(arrays["A"] if shifted is None else shifted), pointer_to(arrays["C"]))
        # (addresses alone, where A is read as it is and B's packing reads B in place: a
        # guard may move it; 128^3 one-off with new arrays 17.0 -> 13.3 us a call)
        b_entries = None if shifted is not None else [] if packer is None else packer.guard_entries(2, b_shift)
        if b_entries is not None:
            move = pointing(move, entries + b_entries, ("A", "C", "B") if packer is not None else ("A", "C"))
        return again, move

    def _packing_plan(self, packer: VnniPacker, plan: Plan, term: tuple | None = None) -> CallPlan | None:
        """One hand-off for the packing and the product where each thread's product reads
        only the columns that thread packs (the packer's and the plan's column splits
        agree: AVX-512's 64-column chunks and tiles): 256 x 256 x 256 on two threads, a
        fork-join less and each thread's B in its own cache. None where they differ.

        ``term`` (comps, ao'): the output stage reads ``-ao' * colsum(B)`` (an s8 A, a zero
        point), so between its packing and its product each thread makes that term of its
        columns from the sums it just packed (``jit.column_term``): s8s8 256^3 on two
        threads, a hand-off and numpy's pass over the sums less."""
        comps, ao_eff = term if term is not None else (None, 0)
        kept = self._fused
        if kept is not None and kept[0] is packer and kept[1] is plan and kept[3] is comps:
            return kept[2]
        packs = packer.thread_calls()
        fused = None
        if packs and [c0 for c0, _ in packs] == [c0 for c0, _ in plan.chunks]:
            lists = [[call, (plan.kernel.function, s)] for (_, call), s in zip(packs, plan.structs)]
            if comps is not None:
                for calls, term_call in zip(lists, self._term_calls(packer, comps, ao_eff, [c0 for c0, _ in packs])):
                    calls.insert(1, term_call)
            fused = CallPlan(lists)
        self._fused = (packer, plan, fused, comps)
        return fused

    @staticmethod
    def _term_calls(packer: VnniPacker, comps: "_Comps", ao_eff: int, firsts: list) -> list:
        """Per thread (its first column in ``firsts``), the call that writes its columns'
        term of ``comps`` from the packer's column sums: ``-ao' * sums + add``."""
        from runtime.ffi import ffi, pointer_to

        function = column_term_kernel().function
        col, sums, add = comps.out.col_comp, packer.column_sums(), comps.add
        ends = firsts[1:] + [len(col)]
        calls = []
        for c0, c1 in zip(firsts, ends):  # (whole column tiles: whole 8-column vectors)
            args = ffi.new("struct i8j_colterm_args *", dict(n=c1 - c0, mul=-ao_eff))
            args.sums, args.add, args.dst = (pointer_to(x) + 4 * c0 for x in (sums, add, col))
            calls.append((function, args))
        return calls

    def _compensation(self, packed: PackedB, choice: Choice, a, lda, ao: int, bo: int, co,
                      new_sums: bool = True) -> "_Comps":
        """Offsets folded into the output stage, and the kernel that applies them.

        sum (a' - ao')(b - bo) = raw - bo*rowsum(a') - ao'*colsum(b) + K*ao'*bo, where a' is
        A shifted to u8 (+128 for s8) and ao' = ao (+128). Cached while ao, co and B stay
        the same and bo == 0 (a row term depends on A's values).

        Float mode maps oneDNN's GEMM onto the output stage: alpha is a common scale, co
        a bias (per column for 'F'/'R', per row for 'C'), beta a sum post-op on the old C.
        ``new_sums`` False: B is packed after this, and its column term made then (see
        :meth:`_packing_plan`; what this leaves in the term is overwritten).
        """
        key = (id(packed), ao, bo, None if co is None else co.tobytes())
        cached = self._comps_cache
        ao_eff = ao + (128 if self.a_type == "s8" else 0)
        if cached is not None and cached.key == key and bo == 0:
            if ao_eff and packed is self._last_packed and new_sums:  # B packed at this call: its sums anew
                self._new_sums(cached, packed, ao_eff)
            return cached
        M, N, K = self.M, self.N, self.K
        # oneDNN's letters: 'C' a column vector (M values, one per row), 'R' a row vector (N).
        co_len = {"F": 1, "C": M, "R": N}[self.offsetc]
        co_flat = np.zeros(co_len, np.int32) if co is None else co.reshape(-1)
        add = np.full(len(packed.colsum), K * ao_eff * bo, np.int64)  # (the column term but B's sums)
        row = None
        if bo != 0:
            rows = op(a, "N", M, K, lda).astype(np.int64).sum(axis=1)
            row = -bo * (rows + (128 * K if self.a_type == "s8" else 0))
        out_bias = None
        if not self.float_mode:  # integer mode: co is one more int32 offset
            if self.offsetc == "C":
                row = (row if row is not None else 0) + co_flat[:M].astype(np.int64)
            else:
                add[:N] += co_flat[:N] if self.offsetc == "R" else co_flat[0]
        elif co is not None and self.offsetc == "C":
            out_bias = Operand(np.ascontiguousarray(co_flat[:M], np.float32), "row")
        elif co is not None:
            bias = np.zeros(packed.tiles * packed.tile_n, np.float32)
            bias[:N] = co_flat[:N] if self.offsetc == "R" else co_flat[0]
            out_bias = Operand(bias, "col")
        out = OutputArgs(col_comp=_wrap32(-ao_eff * packed.colsum + add),
                         row_comp=None if row is None else _wrap32(np.broadcast_to(row, (M,))))
        if self.float_mode:
            out.scale = Operand(np.array([self.alpha], np.float32), "common")
            out.bias = out_bias
            if self.beta != 0.0:
                out.po_scale, out.po_zp = [self.beta], [0.0]
            spec = OutputSpec(row_comp=out.row_comp is not None, float_mode=True, scale="common",
                              bias="none" if out_bias is None else out_bias.index,
                              post_ops=(SumOp("s32"),) if self.beta != 0.0 else ())
        else:
            spec = OutputSpec(row_comp=out.row_comp is not None, accumulate=self.beta == 1.0)
        comps = _Comps(key, self._kernel(choice, spec), out, np.empty_like(packed.colsum), _wrap32(add))
        self._comps_cache = comps
        return comps

    def _new_sums(self, comps: "_Comps", packed: PackedB, ao_eff: int) -> None:
        """The column term of ``comps`` anew from the column sums of a B packed at this
        call (bo 0: no other term reads B)."""
        col = np.multiply(packed.colsum, -ao_eff, out=comps.sums)
        col += comps.add
        np.copyto(comps.out.col_comp.view(np.uint32), col, casting="unsafe")  # (modulo 2^32)

    def _plan(self, comps: "_Comps", packed: PackedB, lda: int) -> Plan:
        """Per-thread argument structs; only A and C pointers change between calls."""
        key = (id(comps), id(packed), lda)
        cached = self._plan_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        # s8 A with several column tiles: one xor pass over A per call (numpy, ~15 GB/s)
        # instead of an xor per broadcast in every tile (Intel's VNNI: 6 extra vector ops
        # per 24 VPDPBUSD, about -20%; not on AMD's, see shifts_s8_a_once); the kernel
        # then reads u8 rows of K (at least 4) bytes.
        kernel, shifted = comps.kernel, None
        kspec = kernel.meta["kspec"]
        if kspec.s8_src and packed.tiles >= _SHIFT_A_TILES and shifts_s8_a_once(kspec.path):
            shifted = np.empty((self.M, max(self.K, 4)), np.uint8)
            kernel, lda = _u8_variant(kernel), shifted.shape[1]
        plan = make_plan(kernel, packed, self.M, self.N, self.K, lda, self.ldc * 4, comps.out, self.threads)
        self._plan_cache = (key, plan, comps, shifted)  # the plan points into comps' arrays
        return plan

    def impl_info(self) -> dict:
        """Which ISA path, kernel, blocking and policy decision this GEMM uses."""
        choice = self._choice or self._last_choice or decide(self.isa, self.policy, None, self.N)
        packed = self._packed or self._last_packed
        info = {
            "primitive": "gemm_u8s8s32" if self.a_type == "u8" else "gemm_s8s8s32",
            # M or N of 0 runs no machine code: "any", as for a zero-volume primitive
            "isa": "any" if self._empty and self._k_zero is None else self.isa,
            "path": choice.path.kind, "policy": self.policy,
            "exact": choice.exact_under(self.policy), "decision": choice.reason,
            "tile_n": choice.nr * choice.path.lanes, "threads": self.threads,
            "shape": (self.M, self.N, self.K),
        }
        if self._empty:
            info["decision"] = ("K is 0: no products, C <- beta*C + co through the output stage" if self._k_zero
                                else "M or N is 0: nothing to compute, C is left as it was")
        if self._last_in_place is not None:
            info["runtime_weights"] = f"read in place by {self._last_in_place}"
        elif packed is not None:
            info["safe_pairs"] = packed.safe_pairs
            info["total_pairs"] = packed.total_pairs
            info["cells"] = packed.cells
        kernels = [k.meta.get("kspec") for k in self._kernels.values()]
        if kernels:
            info["kernels"] = [k.name for k in kernels]
            info["tile"] = (kernels[0].mr, kernels[0].nr)
        if self._plan_cache is not None:  # the loop nest the last execution ran
            plan = self._plan_cache[1]
            kspec = plan.kernel.meta["kspec"]
            info["blocking"] = {"threads_used": len(plan.structs), "k_unroll": kspec.unroll_k,
                                "prefetch_next_tile_b": kspec.prefetch_next,
                                "prefetch_b_ahead_bytes": kspec.prefetch_ahead,
                                "s8_a_shifted_once_per_call": self._plan_cache[3] is not None,
                                "b_packed_with_its_product": bool(self._fused and self._fused[2]
                                                                  and self._fused[1] is plan),
                                "loops": "column tiles > row blocks of mr > K groups of 4"}
        return info


def _gemm_args(A, B, C, co) -> dict:
    """A call's arrays by name, as :class:`primitives.replay.Replay` records them."""
    args = {"A": A, "C": C}
    if B is not None:
        args["B"] = B
    if co is not None:
        args["co"] = co
    return args


_ONE_OFF_KEPT = 8  # Gemms kept per thread for the one-off calls (each holds its packing buffers)


def _gemm_call(a_type, transa, transb, offsetc, M, N, K, alpha, A, lda, ao, B, ldb, bo, beta, C, ldc, co,
               policy, isa, threads):
    """A one-off call: the Gemm of these arguments, kept per thread (its kernels, packer
    buffers and plan serve the next call of the same signature: on a Zen 4, 64x1024x1024
    on two threads 0.55 -> 0.20 ms a call, a reused Gemm given B at creation 0.15), or a new one."""
    scalars = (a_type, transa, transb, offsetc, M, N, K, alpha, lda, ldb, beta, ldc, policy)
    now = settings_stamp()
    last = getattr(_LAST_CALL, "call", None)
    # (a call like this thread's last, under the same settings: its Gemm, without resolving
    # the ISA and threads again or hashing the key, 1.6 -> 0.5 us; see runtime.settings.
    # It compares by value: M = 2.0 right after M = 2 is taken as that call, the same result;
    # testing the sizes' types here costs 0.1-0.3 us a call, 1-2% at 128^3)
    if last is not None and last[0] == scalars and last[1] == (isa, threads) and last[2] == now:
        g = last[3]
    else:
        # (the types in the key: a Gemm made for M = 2 does not serve M = 2.0, which it refuses)
        g = kept_setup("gemm", scalars + in_force(isa, threads) + tuple(map(type, scalars)),
                       lambda: Gemm(M, N, K, a_type=a_type, transa=transa, transb=transb, offsetc=offsetc,
                                    lda=lda, ldb=ldb, ldc=ldc, alpha=alpha, beta=beta, policy=policy,
                                    isa=isa, threads=threads), _ONE_OFF_KEPT)
        _LAST_CALL.call = (scalars, (isa, threads), now, g)
    g._call(A, C, B, ao, bo, co)  # (this thread's own Gemm: no lock)
    return g


_LAST_CALL = threading.local()  # per thread: (scalars, (isa, threads), settings stamp, Gemm) of the last one-off call


def gemm_u8s8s32(transa, transb, offsetc, M, N, K, alpha, A, lda, ao, B, ldb, bo, beta, C, ldc, co, *,
                 policy: str = "exact", isa: str | None = None, threads: int | None = None) -> None:
    """oneDNN's ``dnnl_gemm_u8s8s32`` on numpy arrays (C is updated in place).

    The argument list is oneDNN's, row-major; ``co`` holds 1 ('F'), M ('C') or N ('R')
    offsets. Each thread keeps the GEMMs of its last 8 argument signatures (kernels, B's
    packing buffers, plan), so a call like an earlier one skips their set-up, and one with
    that call's very arrays replays its kernels (:meth:`Gemm.execute`); B is packed at
    every call (a :class:`Gemm` given B at creation packs it once), or read in place for
    1-4 rows of A with alpha 1 and beta 0 or 1.

    >>> import numpy as np
    >>> A, B = np.full((2, 3), 10, np.uint8), np.ones((3, 2), np.int8)
    >>> C = np.ones((2, 2), np.int32)
    >>> gemm_u8s8s32("N", "N", "R", 2, 2, 3, 1.0, A, 3, 1, B, 2, 0, 1.0, C, 2, np.int32([100, 200]))
    >>> C.tolist()                                       # (10 - 1) * 3 + C + co[j]
    [[128, 228], [128, 228]]
    """
    _gemm_call("u8", transa, transb, offsetc, M, N, K, alpha, A, lda, ao, B, ldb, bo, beta, C, ldc, co,
               policy, isa, threads)


def gemm_s8s8s32(transa, transb, offsetc, M, N, K, alpha, A, lda, ao, B, ldb, bo, beta, C, ldc, co, *,
                 policy: str = "exact", isa: str | None = None, threads: int | None = None) -> None:
    """oneDNN's ``dnnl_gemm_s8s8s32`` on numpy arrays (C is updated in place).

    >>> import numpy as np
    >>> A, B = np.array([[127, 127, 0, 0]], np.int8), np.array([[127], [127], [0], [0]], np.int8)
    >>> C = np.zeros((1, 1), np.int32)
    >>> gemm_s8s8s32("N", "N", "F", 1, 1, 4, 1.0, A, 4, 0, B, 1, 0, 0.0, C, 1, np.int32([0]))
    >>> int(C[0, 0])                                     # the seeds' 32258, exact on every path
    32258
    """
    _gemm_call("s8", transa, transb, offsetc, M, N, K, alpha, A, lda, ao, B, ldb, bo, beta, C, ldc, co,
               policy, isa, threads)


def gemm(A: np.ndarray, B: np.ndarray, *, ao: int = 0, bo: int = 0, policy: str = "exact", isa: str | None = None,
         threads: int | None = None) -> np.ndarray:
    """numpy-style ``(A - ao) @ (B - bo)`` in int32 for u8/s8 ``A`` (M x K) and s8 ``B`` (K x N).

    Any layout of ``A`` and ``B`` (they are copied when not row-major); a new C.

    >>> import numpy as np
    >>> gemm(np.array([[1, 2], [3, 4]], np.uint8), np.array([[1, 0], [0, -1]], np.int8), ao=1).tolist()
    [[0, -1], [2, -3]]
    >>> gemm(np.zeros((2, 0), np.uint8), np.zeros((0, 3), np.int8)).tolist()   # K = 0, as numpy
    [[0, 0, 0], [0, 0, 0]]
    """
    if not isinstance(A, np.ndarray) or A.ndim != 2:
        raise ValueError(f"A: expected a 2-D numpy array, got {getattr(A, 'shape', type(A).__name__)}")
    if not isinstance(B, np.ndarray) or B.ndim != 2:
        raise ValueError(f"B: expected a 2-D numpy array, got {getattr(B, 'shape', type(B).__name__)}")
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"B: expected {A.shape[1]} rows to match A's {A.shape[1]} columns, got shape {B.shape}")
    if A.dtype not in (np.uint8, np.int8):
        raise TypeError(f"A: expected dtype uint8 or int8, got {A.dtype.name}")
    M, K = A.shape
    N = B.shape[1]
    A = np.ascontiguousarray(A)
    B = np.ascontiguousarray(B)
    C = np.zeros((M, N), np.int32)
    # (B given at execution, as the one-off calls take it: their kept Gemm)
    _gemm_call("u8" if A.dtype == np.uint8 else "s8", "N", "N", "F", M, N, K, 1.0, A, None, ao, B, None, bo, 0.0,
               C, None, None, policy, isa, threads)
    return C
