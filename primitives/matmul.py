"""Int8 matmul and inner product with quantization attributes and post-ops.

``dst = saturate(round(post_ops(src_scale * wei_scale[n] * (acc - zp_src * comp[n]) + bias[n])
* (1 / dst_scale) + zp_dst))``, where ``acc = sum_k src[m, k] * wei[k, n]`` in int32. The
int32 product runs on the GEMM microkernel (``jit.gemm_kernel``) and everything after
it in the output pipeline generated into the same kernel (``jit.output``).

* src: u8 or s8, dims (M, K) or (B, M, K), K contiguous; weights: s8 (K, N) or
  (B, K, N), plain (packed at every execution in machine code, or with 1-4 rows read in
  place: ``jit.gemv_kernel``) or ``any`` (the descriptor asks for its packed layout;
  reorder the weights into it once); bias f32 or s32, one per column;
  dst u8, s8, s32 or f32, N contiguous.
* Attributes: scales for src (mask 0), weights (mask 0 or per N) and dst (mask 0);
  zero points for src (mask 0) and dst (mask 0 or per N); post-ops eltwise, sum and
  binary (operand f32, one value, per N, per row or full); policies ``exact`` and
  ``faithful`` (``halve_weights`` belongs to convolution).

Example::

    >>> import numpy as np
    >>> from primitives.memory import desc
    >>> from primitives.attr import Attr, PostOps
    >>> attr = Attr(scales={"src": 0, "weights": 2}).set_post_ops(PostOps().eltwise("relu"))
    >>> pd = MatmulDesc(desc((2, 4), "u8", "ab"), desc((4, 3), "s8", "ab"), desc((2, 3), "s8", "ab"), attr=attr)
    >>> dst = np.zeros((2, 3), np.int8)
    >>> pd.create().execute({"src": np.full((2, 4), 10, np.uint8), "weights": np.array(
    ...     [[1, -1, 2]] * 4, np.int8), "dst": dst, "scales:src": np.float32([0.5]),
    ...     "scales:weights": np.float32([1, 1, 0.25])})
    >>> dst.tolist()
    [[20, 0, 10], [20, 0, 10]]
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading
from dataclasses import dataclass

import numpy as np

from primitives.attr import BIAS, DST, SRC, WEIGHTS, Sum, post_op_src1, scales, zero_points
from primitives.pipeline import column_compensation, dst_stage, output_plan
from primitives.base import Primitive, PrimitiveDesc, check_descs
from primitives.replay import Replay, pointing, restoring, view_maker
from jit.gemv_kernel import gemv_kernel, shifts_s8, takes
from jit.pack_kernel import VnniPacker, packed_bytes, packer_kernel, vnni_packs
from jit.repoint import repoint_kernel, repointer
from primitives.gemm import Choice, candidates, decide, gemm_kernel, pack_weights, runtime_choice
from jit.dot import widening_path
from primitives.gemm_driver import GemmKernels, Operand, OutputArgs, make_plan, point, refresh, run
from primitives.gemv_driver import (ChunkedRows, GemvPlan, chunk_kernels, reads_in_place, runs_in_place,
                                     walks_in_chunks)
from primitives.checks import check_no_zero_dim
from primitives.memory import RUNTIME_DIM, Memory, MemoryDesc, as_memory, desc, identity_tag, packed_desc
from primitives import verbose
from runtime import isa as isa_mod
from runtime.ffi import pointer_to
from runtime.pool import CallPlan
from runtime.threads import resolve_threads

_DST_TYPES = ("u8", "s8", "s32", "f32")
_ONE = np.ones(1, np.float32)


def _check(name: str, md, ok: bool, expected: str) -> None:
    if not ok:
        raise ValueError(f"{name}: expected {expected}, got {md}")


@dataclass(frozen=True)
class WeightsLayout:
    """The packed layout a GEMM-based primitive asks for (a ``packed`` desc's record).

    ``order`` permutes the logical weight dims into the (K..., N) order the kernel
    reads: matmul's weights are already (K, N); an inner product's (OC, C, spatial...)
    follow the source's memory order. The bytes are the packed B (fast or widening
    layout, whichever the overflow policy decides when the values are known) followed
    by the column sums (s32), the compensation oneDNN appends to its packed weights.
    """

    isa: str
    policy: str
    k: int
    n: int
    order: tuple  # logical weight dims in the order (K dims..., N)

    @staticmethod
    def nbytes(isa: str, k: int, n: int) -> int:
        choice = decide(isa, "faithful", None, n)
        tiles = -(-n // (choice.nr * choice.path.lanes))
        tile_n = choice.nr * choice.path.lanes
        widen = 1 if choice.path.kind == "vnni" else 2  # the widening layout holds s16
        return tiles * tile_n * (-(-k // 4) * 4) * widen + 4 * tiles * tile_n

    def b_kn(self, logical: np.ndarray) -> np.ndarray:
        # A view where one exists (an inner product's OC x K rows: its transpose), which
        # pack_b reads without a byte transpose; reshape copies only where it must.
        return np.transpose(logical, self.order).reshape(self.k, self.n)

    def pack(self, src_logical: np.ndarray, dst: Memory) -> None:
        """Pack the logical s8 weights into ``dst`` and attach (PackedB, Choice) as payload."""
        if src_logical.dtype != np.int8:
            raise ValueError(f"weights: expected s8 values to pack, got {src_logical.dtype}")
        packed, choice = pack_weights(self.b_kn(src_logical), self.isa, self.policy, proof=False)
        buf = dst.array.reshape(-1).view(np.uint8)
        size = packed.data.nbytes
        buf[:size] = packed.data
        comp = buf[size:size + 4 * packed.colsum.size].view(np.int32)
        comp[:] = packed.colsum.astype(np.int32)
        dst.payload = (dataclasses.replace(packed, data=buf[:size]), choice)


def _in_place_layout(md: MemoryDesc, kind: str, order) -> str | None:
    """How plain weights ``md`` hold their bytes for the in-place kernels: "columns"
    (each output column's K values contiguous: an inner product's OC x C... in the
    source's order, a matmul's ``ba``), "rows" (each K row's N values: a matmul's ``ab``,
    a 2-D inner product's ``ba``), or None (packed weights, or neither)."""
    if md.is_any or md.is_packed:
        return None
    if kind == "matmul":
        return "columns" if md.dims[-2] == 1 or md.strides[-2] == 1 else \
            "rows" if md.dims[-1] == 1 or md.strides[-1] == 1 else None
    if md.ndims == 2 and md.strides[0] == 1 and md.dims[1] > 1:
        return "rows"
    expected = 1
    for d in reversed(order[:-1]):  # the K dims, innermost first: dense, as one run
        if md.dims[d] != 1:
            if md.strides[d] != expected:
                return None
            expected *= md.dims[d]
    return "columns"


class _GemmBasedDesc(PrimitiveDesc):
    """What matmul and inner product share: attributes, output stage, weights layout."""

    _k_zero: "MatmulDesc | None" = None  # a matmul with K = 0: the K = 1 one it runs (_zero_k)
    weights_batch = src_batch = 1  # a batched matmul's: dst's batch, or 1 (broadcast)
    _item_binary = False  # a binary operand of one value or one per column per batch item
    _in_place = None  # the kernel that reads runtime weights in place (few rows), or None
    _in_place_layout, _in_place_rows = "columns", 1  # its layout, and its rows (the rows kernel's)
    _in_place_chunked = False  # the rows kernel's one row walks K in chunks (gemv_driver.ChunkedRows)

    def flat(self) -> bool:
        """One GEMM of batch*M rows: one weight matrix serves the batch, src has a matrix
        per item, and no binary operand varies by item but along rows (else a GEMM per
        item, a broadcast src's one matrix in each)."""
        return self.weights_batch == 1 and self.src_batch == self.batch and not self._item_binary

    def _start(self, attr, isa, threads, src_md, weights_md, dst_md, bias_md) -> None:
        """The checks both constructors begin with (each then checks its own dims)."""
        PrimitiveDesc.__init__(self, attr, isa)
        self.threads = resolve_threads(threads)
        check_descs({"src": src_md, "weights": weights_md, "dst": dst_md}, {"bias": bias_md})

    def _setup(self, M: int, K: int, N: int, src_md, weights_md, dst_md, bias_md, weights_order,
               batch: int) -> None:
        attr = self.attr
        self.M, self.K, self.N, self.batch = M, K, N, batch
        self.isa = verbose.planned_isa(self.kind, self.isa)
        policy = attr.policy
        if policy == "halve_weights":
            raise ValueError(f"attr policy: 'halve_weights' is convolution's; {self.kind} takes 'exact' or "
                             "'faithful'")
        _check("src", src_md, src_md.dt in ("u8", "s8"), "a u8 or s8 source")
        _check("weights", weights_md, weights_md.dt == "s8", "s8 weights")
        _check("dst", dst_md, dst_md.dt in _DST_TYPES, f"a dst of type {', '.join(_DST_TYPES)}")
        if bias_md is not None:
            _check("bias", bias_md, bias_md.dt in ("f32", "s32"), "an f32 or s32 bias")
            _check("bias", bias_md, bias_md.size == N and bias_md.dims[-1] == N, f"{N} values along the last dim")
        nd = dst_md.ndims
        col_mask = 1 << (nd - 1)
        descs = {SRC: src_md, WEIGHTS: weights_md, DST: dst_md}
        attr.validate(descs, self.kind, scales_masks={SRC: (0,), WEIGHTS: (0, 1 << (weights_md.ndims - 1))
                                                      if self.kind == "matmul" else (0, 1), DST: (0,)},
                      zero_points_args=(SRC, DST), zero_points_masks={SRC: (0,), DST: (0, col_mask)},
                      max_sums=1)
        plan = output_plan(attr, dst_md, bias_md, self._broadcast,
                           col_comp=column_compensation(attr, src_md.dt))
        self.output, self._scale_kind, self._binary = plan.spec, plan.scale_kind, list(plan.binary)
        self.src_s8 = src_md.dt == "s8"
        descs = {SRC: src_md, WEIGHTS: weights_md, DST: dst_md, BIAS: bias_md}
        if M * N * batch == 0:
            self.set_empty(descs, f"zero volume: dst {dst_md.dims} has no elements, so nothing is written")
            return
        if K == 0:  # (an inner product refuses it, as oneDNN's does)
            self._zero_k(descs)
            return
        isa_mod.require_path(self.isa)  # (a zero volume, above, runs no kernel; K = 0 its own matmul)
        # Every kernel the weights can take (exact without VNNI: VPMADDUBSW or widening),
        # made now, so creation pays the code generation (or the disk cache) and no
        # execution does.
        choices = self._choices = candidates(self.isa, policy, N)
        self.fast = choices[0]
        if weights_md.is_any:
            layout = WeightsLayout(self.isa, policy, K, N, tuple(weights_order))
            weights_md = packed_desc(weights_md.dims, "s8", layout, WeightsLayout.nbytes(self.isa, K, N))
        self._set_desc(SRC, src_md)
        self._set_desc(WEIGHTS, weights_md)
        self._set_desc(DST, dst_md)
        self._set_desc(BIAS, bias_md)
        self._weights_order = tuple(weights_order)
        # Runtime weights (columns of K or rows of N contiguous bytes) times 1-4 rows: read
        # in place (jit.gemv_kernel), not packed at every call. The step: VPDPBUSD; without
        # VNNI widened under exact (no proof per call), VPMADDUBSW under faithful
        # (saturating as the packed path does).
        rows = M * batch if self.flat() else M
        layout = _in_place_layout(weights_md, self.kind, weights_order)
        path = widening_path(self.isa) if self.fast.path.kind != "vnni" and policy == "exact" else self.fast.path
        # (the column sums: a zero point's, and an s8 source's +128 where it is shifted)
        comp = SRC in attr.zero_points or self.src_s8 and shifts_s8(path)
        # One row times weights' rows that a walk down K would find slow (aliasing in the
        # caches, or 8 MB or more: decode's 4096 x 4096): read in chunks of K, whose sums
        # the last chunk's output stage adds (gemv_driver.ChunkedRows).
        chunked = layout == "rows" and rows == 1 and walks_in_chunks(K, N) and takes(path, K, N, 1, comp, self.output)
        if layout is not None and (chunked or runs_in_place(
                path, rows, K, N if layout == "rows" else None, comp, self.output)):
            self._in_place_layout, self._in_place_rows, self._in_place_path = layout, rows, (path, comp)
            self._in_place_chunked = chunked
            self._in_place = self._gemv_for(self.output)
            if chunked:  # (the first two: the last is _in_place's, per output stage)
                self._chunk_sums = chunk_kernels(path, self.src_s8, comp, self.output)[:2]
        else:  # (an in-place primitive runs no GEMM kernel: impl_info makes the one it names)
            for choice in choices:
                self._kernel_for(choice)
            if layout is not None:  # runtime weights packed at every call: the packing kernel
                runtime = runtime_choice(self.isa, policy, N)
                items = weights_md.dims[0] if len(weights_md.dims) == 3 else 1
                packer_kernel(runtime.path, layout == "columns", packed_bytes(K, N, runtime.path, runtime.nr, items))
        # The per-column vectors (scales, bias, ...) in whole tiles of the GEMM kernel's
        # and blocks of the in-place kernel's: their output stages read whole vectors.
        whole = math.lcm(self.fast.nr * self.fast.path.lanes, 64)
        tiles = self._n_padded = -(-N // whole) * whole
        # (then a row's padded K in whole dwords, or the chunks' partial sums)
        self.scratchpad_nbytes = 4 * 4 * tiles + (4 * M * batch if K < 4 else 4 * tiles if self._in_place_chunked
                                                  else 0)
        verbose.dispatch(self.kind, self.impl_name(), "chosen: " + self.fast.reason) \
            if verbose.enabled("dispatch") else None

    def _zero_k(self, descs: dict) -> None:
        """K = 0: no product, so dst is the output stage applied to 0 (scales, bias,
        post-ops, zero point), as numpy's matmul and int8jit's GEMM take it (oneDNN's
        matmul writes nothing). It runs as a K = 1 matmul over zeros: the one output
        stage every matmul has, bits included."""
        self.set_plain_descs(descs)
        src, weights, dst = descs[SRC], descs[WEIGHTS], descs[DST]
        plain = identity_tag(src.ndims)
        with verbose.muted():  # (the user's matmul logs its lines, not this one)
            self._k_zero = MatmulDesc(desc(src.dims[:-1] + (1,), src.dt, plain),
                                      desc(weights.dims[:-2] + (1, self.N), "s8", plain), dst, descs[BIAS],
                                      attr=self.attr, isa=self.isa, threads=self.threads)
        # (a library scratchpad: the K = 1 primitive's own)
        self.scratchpad_nbytes = self._k_zero.scratchpad_nbytes if self.attr.scratchpad_mode == "user" else 0

    def _broadcast(self, src1: MemoryDesc, index: int) -> str:
        """A binary operand's kind (``jit.output``), its dims each dst's or 1 as oneDNN
        broadcasts them: one value, one per column, one per row, or full, for every
        batch item or one per item. An operand with one value, or one per
        column, per batch item makes the batch a GEMM per item (:meth:`flat`)."""
        if src1.dt != "f32":
            raise ValueError(f"post_ops[{index}]: binary operand of type {src1.dt!r}; {self.kind} takes f32 operands")
        dims = src1.dims  # (Attr.validate checked that they broadcast to dst's)
        kind = "common" if dims[-2:] == (1, 1) else "col" if dims[-2] == 1 else "row" if dims[-1] == 1 else "full"
        if kind in ("common", "col") and any(d > 1 for d in dims[:-2]):
            self._item_binary = True
        return kind

    def _kernel_for(self, choice: Choice, output=None):
        # One GEMM of all rows (flat) or one per item; threads split rows in whole
        # blocks, so only this remainder needs a tail block.
        rows = self.M * self.batch if self.flat() else self.M
        return gemm_kernel(choice, self.src_s8, output or self.output, (rows, self.N, self.K, self.threads))

    def _gemv_for(self, output):
        """The in-place kernel for the output stage ``output``."""
        path, comp = self._in_place_path
        return gemv_kernel(path, self.src_s8, comp, output, self._in_place_layout, self._in_place_rows,
                           partial=self._in_place_chunked)

    def _key_extra(self):
        return (self.kind,)

    def _impl_info(self) -> dict:
        if getattr(self, "_runtime", None) is not None:  # (M, and the batch, known at execution)
            info = self._probe.impl_info()
            names = ["batch" if i == 0 and len(self._templates[0].dims) == 3 else "M" for i in self._runtime]
            if "shape" not in info:  # (every shape empty: an N of 0, or a fixed batch or M of 0)
                return {**info, "runtime_dims": names}
            shape = tuple(RUNTIME_DIM if i in ("batch", "M") and i in names else v
                          for i, v in zip(("batch", "M", "N", "K"), info["shape"]))
            return {**info, "shape": shape, "runtime_dims": names,
                    "decision": f"{', '.join(names)} known at execution: each shape runs the matmul of its dims, "
                                f"made at its first call; for M = 1 (and batch 1): {info['decision']}"}
        if self._k_zero is not None:
            return {**self._k_zero.impl_info(), "shape": (self.batch, self.M, self.N, 0),
                    "decision": "K = 0: dst = the output stage of 0, run as a K = 1 matmul over zeros"}
        kspec = self._kernel_for(self.fast).meta["kspec"]
        return {"kind": self.kind, "impl": f"gemm:{kspec.path.isa}:{kspec.path.kind}", "isa": self.isa,
                "policy": self.attr.policy, "exact": self.fast.exact_under(self.attr.policy),
                "decision": self.fast.reason, "kernel": kspec.name,
                "tile": (kspec.mr, kspec.nr), "shape": (self.batch, self.M, self.N, self.K),
                "output": self.output, "kernels": [self._kernel_for(c).meta["kspec"].name for c in self._choices],
                **({"runtime_weights": f"read in place by {self._in_place.meta['gemv'].name}"}
                   if self._in_place is not None else {})}

    def _create_primitive(self):
        if getattr(self, "_runtime", None) is not None:
            return _RuntimeShapes(self)
        return _GemmBasedPrimitive(self) if self._k_zero is None else _ZeroK(self)


class MatmulDesc(_GemmBasedDesc):
    """Matmul ``dst = src @ weights`` (2-D, or batched 3-D) with int8 attributes.

    In a batched matmul src's and weights' batch dims are dst's or 1, as in oneDNN: a
    batch of 1 is broadcast (one weight matrix for every item runs as one GEMM of all
    the rows). ``weights_md`` with tag ``any`` (one weight matrix): :meth:`weights_desc`
    returns the packed layout; reorder the weights into it (``primitives.reorder``) once
    and pass that memory.

    M, and a batched matmul's batch, may be ``RUNTIME_DIM`` in src and dst alike, as in
    oneDNN: known at execution, from src's shape. The weights' packed layout does not
    depend on them; each shape met runs a matmul made for its dims at its first call
    (0.8-1.9 ms on a Zen 4 at 768 -> 768; 7-10 ms where its row tail needs a kernel
    generated, one per M % rows-per-block and thread split), kept for the next calls
    (the last 32 shapes), which cost about 1 us more than a fixed-M matmul's.

    >>> from primitives.memory import RUNTIME_DIM, desc
    >>> pd = MatmulDesc(desc((RUNTIME_DIM, 4), "u8", "ab"), desc((4, 2), "s8", "ab"),
    ...                 desc((RUNTIME_DIM, 2), "s32", "ab"))
    >>> p, w = pd.create(), np.ones((4, 2), np.int8)
    >>> for m in (1, 3):
    ...     dst = np.zeros((m, 2), np.int32)
    ...     p.execute({"src": np.full((m, 4), 2, np.uint8), "weights": w, "dst": dst})
    ...     print(dst.tolist())
    [[8, 8]]
    [[8, 8], [8, 8], [8, 8]]
    """

    kind = "matmul"
    _runtime: tuple[int, ...] | None = None  # the runtime dims' positions in src and dst, or None

    def __init__(self, src_md: MemoryDesc, weights_md: MemoryDesc, dst_md: MemoryDesc,
                 bias_md: MemoryDesc | None = None, attr=None, isa: str | None = None, threads: int | None = None):
        if isinstance(src_md, MemoryDesc) and isinstance(dst_md, MemoryDesc) and (src_md.runtime or dst_md.runtime):
            self._runtime_dims(src_md, weights_md, dst_md, bias_md, attr, isa, threads)
            return
        self._start(attr, isa, threads, src_md, weights_md, dst_md, bias_md)
        nd = src_md.ndims
        if nd not in (2, 3):
            raise ValueError(f"src: expected 2 or 3 dims, got {src_md.dims}")
        for name, md in (("weights", weights_md), ("dst", dst_md)):
            if md.ndims != nd:
                raise ValueError(f"{name}: expected {nd} dims like src, got {md.dims}")
        M, K = src_md.dims[-2:]
        N = weights_md.dims[-1]
        batch = dst_md.dims[0] if nd == 3 else 1
        if weights_md.dims[-2] != K:
            raise ValueError(f"weights: expected {K} rows to match src's K, got dims {weights_md.dims}")
        if dst_md.dims[-2:] != (M, N):
            raise ValueError(f"dst: expected dims (..., {M}, {N}), got {dst_md.dims}")
        # As oneDNN's: src's and weights' batch dims are dst's, or 1 (broadcast to it), and
        # dst's is what they broadcast to.
        if nd == 3:
            for name, md in (("src", src_md), ("weights", weights_md)):
                if md.dims[0] not in (1, batch):
                    raise ValueError(f"{name}: batch dim {md.dims[0]} is neither dst's ({batch}) nor 1 (broadcast)")
            if batch != 1 and src_md.dims[0] == weights_md.dims[0] == 1:
                raise ValueError(f"dst: batch dim {batch}; src's and weights' (1 and 1) broadcast to 1")
        if src_md.is_any:
            src_md = src_md.with_tag(identity_tag(nd))
        if dst_md.is_any:
            dst_md = dst_md.with_tag(identity_tag(nd))
        _check("src", src_md, src_md.is_plain and src_md.perm == tuple(range(nd)), "a row-major (ab/abc) source")
        _check("dst", dst_md, dst_md.is_plain and dst_md.perm == tuple(range(nd)), "a row-major (ab/abc) dst")
        if weights_md.is_any and nd == 3 and weights_md.dims[0] != 1:
            raise ValueError(f"weights: 'any' (packed once) takes one weight matrix; got batch {weights_md.dims[0]}")
        _check("weights", weights_md, weights_md.is_any or weights_md.is_plain, "a plain tag or 'any'")
        if nd == 3:
            self.weights_batch, self.src_batch = weights_md.dims[0], src_md.dims[0]
        # (the order names every dim: packed weights of dims (1, K, N) are read as (K, N))
        self._setup(M, K, N, src_md, weights_md, dst_md, bias_md, tuple(range(nd)), batch)

    def _runtime_dims(self, src_md, weights_md, dst_md, bias_md, attr, isa, threads) -> None:
        """src and dst with runtime dims: checked here, where they must be (M; a 3-D
        matmul's batch, with weights of batch 1), then everything else on a stand-in of 1
        for each (:meth:`concrete`), which gives the weights' descriptor too."""
        PrimitiveDesc.__init__(self, attr, isa)
        self.threads = resolve_threads(threads)
        nd = src_md.ndims
        if nd not in (2, 3):
            raise ValueError(f"src: expected 2 or 3 dims, got {src_md.verbose_str()}")
        if dst_md.ndims != nd:
            raise ValueError(f"dst: expected {nd} dims like src, got {dst_md.verbose_str()}")
        allowed = (0, 1) if nd == 3 else (0,)
        marked = []
        for name, md in (("src", src_md), ("dst", dst_md)):
            where = tuple(i for i, d in enumerate(md.dims) if d == RUNTIME_DIM)
            if any(i not in allowed for i in where):
                raise ValueError(f"{name}: {md.verbose_str()} has a runtime dim other than M"
                                 f"{' and the batch' if nd == 3 else ''}; only those may be RUNTIME_DIM")
            marked.append(where)
        if marked[0] != marked[1]:
            raise ValueError(f"dst: its runtime dims ({dst_md.verbose_str()}) are not src's ({src_md.verbose_str()}); "
                             "mark the same ones in both")
        self._runtime = marked[0]
        check_descs({"weights": weights_md}, {"bias": bias_md})
        # (the checks whose messages would otherwise show the stand-in's 1 for a runtime dim)
        for name, md in (("src", src_md), ("dst", dst_md)):
            if not (md.is_any or md.is_plain and md.perm == tuple(range(nd))):
                raise ValueError(f"{name}: expected a row-major ({identity_tag(nd)}) {name}, got {md.verbose_str()}")
        dims = lambda md: md.verbose_str().rpartition(":")[2]  # noqa: E731 (runtime dims as *)
        if weights_md.ndims == nd and weights_md.dims[-2] != src_md.dims[-1]:
            raise ValueError(f"weights: expected {src_md.dims[-1]} rows to match src's K, got dims {dims(weights_md)}")
        if weights_md.ndims == nd and dst_md.dims[-1] != weights_md.dims[-1]:
            raise ValueError(f"dst: expected dims ({'*, ' * (nd - 1)}{weights_md.dims[-1]}) (N from the weights), "
                             f"got {dims(dst_md)}")
        if nd == 3 and 0 in self._runtime and weights_md.dims[0] != 1:
            raise ValueError(f"weights: batch {weights_md.dims[0]} beside a runtime batch; such a matmul takes "
                             "one weight matrix (batch 1), broadcast to every item")
        if self.attr.scratchpad_mode == "user":
            raise ValueError("attr scratchpad_mode: 'user' asks for the scratchpad's size at creation, which runtime "
                             "dims leave unknown; use 'library'")
        for name, md in self.attr.post_ops.binary_args().items():
            if md.runtime or any(md.dims[i - nd + md.ndims] != 1 for i in self._runtime if i - nd + md.ndims >= 0):
                raise ValueError(f"{name}: dims {md.verbose_str().rpartition(':')[2]} beside runtime dims; the operand "
                                 "must be 1 along each of them (one value, or one per column)")
        self._templates = (src_md.with_tag(identity_tag(nd)) if src_md.is_any else src_md, weights_md,
                           dst_md.with_tag(identity_tag(nd)) if dst_md.is_any else dst_md, bias_md)
        self.isa = isa
        # (not muted: its dispatch lines are this descriptor's; and every shape's matmul then
        # plans for the ISA this one did, whatever the cap later becomes)
        probe = self._probe = self.concrete((1,) * len(self._runtime), quiet=False)
        self.isa, self.M, self.K, self.N, self.batch = probe.isa, RUNTIME_DIM, probe.K, probe.N, RUNTIME_DIM
        self._set_desc(SRC, self._templates[0])
        self._set_desc(WEIGHTS, probe.weights_desc())
        self._set_desc(DST, self._templates[2])
        self._set_desc(BIAS, probe.bias_desc())
        self.scratchpad_nbytes = 0  # (library mode: each shape's matmul holds its own)

    def concrete(self, values, quiet: bool = True) -> "MatmulDesc":
        """The matmul of this one's runtime dims set to ``values`` (in order: the batch,
        then M, of those that are runtime), on its ISA path, whose weights' descriptor is
        this one's (unless it has no rows: then the plain one)."""
        if self._runtime is None:
            raise ValueError("concrete: this matmul has no runtime dims")
        if len(values) != len(self._runtime):
            raise ValueError(f"values: expected {len(self._runtime)} (one per runtime dim), got {tuple(values)}")
        src_md, weights_md, dst_md, bias_md = self._templates

        def known(md: MemoryDesc) -> MemoryDesc:
            dims = list(md.dims)
            for i, v in zip(self._runtime, values):
                dims[i] = v
            return MemoryDesc(tuple(dims), md.dt, md.tag)

        with verbose.muted() if quiet else contextlib.nullcontext():  # (the user's runtime one logs its lines)
            return MatmulDesc(known(src_md), weights_md, known(dst_md), bias_md, attr=self.attr, isa=self.isa,
                              threads=self.threads)

    def runs_isa(self) -> str | None:
        if self._runtime is not None:  # (every shape's: "any" where they are all empty, an N of 0)
            return self._probe.runs_isa()
        return super().runs_isa()


class InnerProductDesc(_GemmBasedDesc):
    """Inner product forward inference: ``dst[n, oc] = sum_{c, spatial} src[n, c, ...] * wei[oc, c, ...]``.

    src N x C (x spatial) in any plain tag whose batch dim is outermost, weights
    OC x C (x spatial) plain or ``any``, dst N x OC.
    """

    kind = "inner_product"

    def __init__(self, src_md: MemoryDesc, weights_md: MemoryDesc, dst_md: MemoryDesc,
                 bias_md: MemoryDesc | None = None, attr=None, isa: str | None = None, threads: int | None = None):
        self._start(attr, isa, threads, src_md, weights_md, dst_md, bias_md)
        nd = src_md.ndims
        if nd < 2:
            raise ValueError(f"src: expected N x C (x spatial) dims, got {src_md.dims}")
        if weights_md.ndims != nd or weights_md.dims[1:] != src_md.dims[1:]:
            raise ValueError(f"weights: expected dims (OC, {', '.join(map(str, src_md.dims[1:]))}), got "
                             f"{weights_md.dims}")
        M, OC = src_md.dims[0], weights_md.dims[0]
        if dst_md.ndims != 2 or dst_md.dims != (M, OC):
            raise ValueError(f"dst: expected dims ({M}, {OC}), got {dst_md.dims}")
        if src_md.is_any:
            src_md = src_md.with_tag(identity_tag(nd))
        if dst_md.is_any:
            dst_md = dst_md.with_tag("ab")
        _check("src", src_md, src_md.is_plain and src_md.perm[0] == 0, "a plain tag with N outermost")
        _check("dst", dst_md, dst_md.is_plain and dst_md.perm == (0, 1), "a row-major (nc) dst")
        check_no_zero_dim("weights", weights_md, (), "inner_product takes a 0 only in the batch (src's dim 0), "
                          "as oneDNN's does")
        K = math.prod(src_md.dims[1:])
        # The kernel's K runs in src's memory order; the weights follow it, then OC last.
        order = tuple(src_md.perm[1:]) + (0,)
        self._setup(M, K, OC, src_md, weights_md, dst_md, bias_md, order, 1)


class _ZeroK(Primitive):
    """A matmul with K = 0 (``_GemmBasedDesc._zero_k``): its K = 1 matmul over zeros,
    made at creation, on the caller's dst and attribute arguments."""

    def __init__(self, pd: _GemmBasedDesc):
        super().__init__(pd)
        one = pd._k_zero
        with verbose.muted():
            self._one = one.create()
        self._zeros = {name: np.zeros(one.query(name).dims, one.query(name).numpy_dtype) for name in (SRC, WEIGHTS)}

    def _execute(self, mem: dict, scratchpad) -> None:
        args = {**mem, **self._zeros}
        if scratchpad is not None:  # (scratchpad mode user)
            args["scratchpad"] = scratchpad
        with verbose.muted():
            self._one.execute(args)


_SHAPES_KEPT = 32  # a runtime-dims matmul's matmuls of the shapes met: the oldest goes first


class _RuntimeShapes(Primitive):
    """A matmul with runtime dims (``MatmulDesc``: ``RUNTIME_DIM``): each call runs the
    matmul made for its src's shape (at that shape's first call), on the caller's
    arguments, which that matmul checks."""

    def __init__(self, pd: "MatmulDesc"):
        super().__init__(pd)
        self._made: dict = {}
        self._lock = threading.Lock()
        self._last = None

    def _for(self, args) -> Primitive:
        if not isinstance(args, dict):
            raise TypeError(f"args: expected a dict of argument name -> Memory or numpy array, "
                            f"got {type(args).__name__}")
        src = args.get(SRC)
        if src is None:
            raise ValueError(f"args: missing argument 'src' ({self.pd.src_desc()}) for matmul; its shape gives "
                             "the runtime dims")
        shape = src.desc.dims if isinstance(src, Memory) else getattr(src, "shape", None)
        if not isinstance(shape, tuple):
            raise TypeError(f"src: expected a Memory or a numpy array, got {type(src).__name__}")
        pd = self.pd
        if len(shape) != len(pd._templates[0].dims):
            raise ValueError(f"src: shape {shape} is not of {pd.src_desc()}'s {len(pd._templates[0].dims)} dims")
        key = tuple(shape[i] for i in pd._runtime)
        prim = self._made.get(key)
        if prim is not None and prim is not self._last:  # (put last: the least recently used goes first)
            with self._lock:
                if self._made.pop(key, None) is not None:
                    self._made[key] = prim
        if prim is None:
            with self._lock:
                prim = self._made.get(key)
                if prim is None:
                    with verbose.muted():  # (the matmul of this shape: the user's calls log its exec lines)
                        prim = pd.concrete(key).create()
                    if 0 in key:  # (no rows: its weights are this descriptor's, not the plain ones it asks for)
                        prim = _NoRows(prim, pd.weights_desc())
                    if len(self._made) >= _SHAPES_KEPT:
                        self._made.pop(next(iter(self._made)))
                    self._made[key] = prim
        self._last = prim
        return prim

    def execute(self, args) -> None:
        """Run the matmul of ``args["src"]``'s shape on ``args``."""
        self._for(args).execute(args)

    def bind(self, args):
        """The bound call (:meth:`Primitive.bind`) of the matmul of ``args["src"]``'s shape."""
        return self._for(args).bind(args)

    def impl_info(self) -> dict:
        """The descriptor's; and the kernels the last call's matmul ran."""
        last = self._last
        ran = last.impl_info().get("kernels_run") if last is not None and hasattr(last, "impl_info") else None
        return dict(self.pd.impl_info(), **({"kernels_run": ran} if ran else {}))


class _NoRows:
    """A runtime-dims matmul's calls with no rows (M or the batch 0): the zero-volume
    matmul of their dims checks every argument and writes nothing; the weights are
    checked against the runtime descriptor's (packed, where its weights are ``any``),
    which that matmul does not ask for."""

    def __init__(self, empty: Primitive, weights_md: MemoryDesc):
        self.empty, self.weights_md = empty, weights_md
        self.zeros = Memory(empty.pd.weights_desc())  # (in its layout: plain weights may be ba)

    def _args(self, args) -> dict:
        if WEIGHTS not in args:
            raise ValueError(f"args: missing argument 'weights' ({self.weights_md}) for matmul")
        as_memory(args[WEIGHTS], WEIGHTS, self.weights_md)
        return {**args, WEIGHTS: self.zeros}

    def execute(self, args) -> None:
        self.empty.execute(self._args(args))

    def bind(self, args):
        return self.empty.bind(self._args(args))

    def impl_info(self) -> dict:
        return self.empty.pd.impl_info()


_VIEWS_KEPT = 64  # scratchpads whose views (and runtime weights' buffers) a primitive keeps: one a slot


def _packed_with_the_first() -> None:
    """A batch item's runtime weights need no packing of their own: item 0's packed them all."""


def _read_in_place() -> None:
    """Runtime weights read in place need no packing: a replay runs the kernels alone."""


class _GemmBasedPrimitive(GemmKernels, Primitive):
    restores_scratchpad = True  # (its replays on a user scratchpad: restoring())

    def __init__(self, pd: _GemmBasedDesc):
        super().__init__(pd)
        self._plans: dict = {}
        self._sp_views: dict = {}
        self._repoint = repoint_kernel()  # (made now, not at a first moved call: _mover)

    def _weights(self, mem: Memory, src: np.ndarray | None, b: int, views: dict, per_item: bool = False):
        """(packed B, choice, repack) of batch item ``b`` (``src``: runtime weights' view,
        :meth:`_weights_view`; None for packed ones). Runtime weights are packed in
        machine code (``jit.pack_kernel``), every item in one call (at item 0), into
        buffers of this scratchpad's, the same at every call, so the items' plans are made
        once; ``repack`` packs the values they then hold again (for a replay; a no-op for
        the items after the first). ``per_item``: nothing is packed here; each item's
        plan runs ``views["packer"].item_call(b)`` first (``repack`` then only refreshes
        a padded copy). Without VNNI, ``exact`` widens them: the proof and the
        split that VPMADDUBSW would need cost more per call than widening does (weights
        packed once take them). Else ``repack`` is None: packed weights, or runtime ones
        laid out neither as rows of N nor columns of K (``vnni_packs``), packed anew per
        item by numpy (with the proof)."""
        pd = self.pd
        if mem.desc.is_packed:
            if not isinstance(mem.payload, tuple):
                raise ValueError("weights: this packed memory was not filled by a reorder into the layout "
                                 "weights_desc() asked for")
            return mem.payload + (None,)
        item = (b if src.shape[0] > 1 else 0) if src.ndim == 3 else None
        if not vnni_packs(src):
            return pack_weights(src if item is None else src[item], pd.isa, pd.attr.policy, proof=False) + (None,)
        choice = runtime_choice(pd.isa, pd.attr.policy, pd.N)
        packer = views.get("packer")
        if packer is None:
            items = src.shape[0] if src.ndim == 3 else 1
            packer = views["packer"] = VnniPacker(pd.K, pd.N, choice.path, choice.nr, items, pd.threads,
                                                  columns=src.strides[-1] != 1)
        repack = _packed_with_the_first
        if b == 0:
            (packer.point if per_item else packer)(src)
            repack = packer.refresh if per_item else packer.repeat
        return packer.packs[item or 0], choice, repack

    def _weights_view(self, mem: Memory) -> np.ndarray | None:
        """Plain weights as K x N, or (a batched matmul's) items x K x N: the views the
        packing, or the in-place kernel, reads (taken once a call); None for packed ones."""
        pd = self.pd
        if mem.desc.is_packed:
            return None
        logical = mem.logical()
        return logical if pd.kind == "matmul" and logical.ndim == 3 else \
            WeightsLayout(pd.isa, pd.attr.policy, pd.K, pd.N, pd._weights_order).b_kn(logical)

    def _in_place_weights(self, w: np.ndarray | None, b: int) -> np.ndarray | None:
        """Batch item ``b``'s K x N weights (of the view ``w``) where the in-place kernel
        reads them, else None."""
        if self.pd._in_place is None or w is None:
            return None
        if w.ndim == 3:
            w = w[b if w.shape[0] > 1 else 0]
        return w if reads_in_place(w, self.pd._in_place_layout) else None

    def _scratchpad_gone(self, address: int) -> None:
        self._sp_views.pop(address, None)

    def _views(self, sp: np.ndarray) -> dict:
        """The scratchpad's per-column vectors (and what was last written into them)."""
        key = sp.ctypes.data
        views = self._sp_views.get(key)
        if views is None:
            if len(self._sp_views) >= _VIEWS_KEPT:  # (a caller's new scratchpad at every call: not all kept)
                self._sp_views.pop(next(iter(self._sp_views)))
            n_pad = self.pd._n_padded
            cols = sp[: 16 * n_pad].view(np.float32).reshape(4, n_pad)
            views = self._sp_views[key] = {"col_comp": cols[0].view(np.int32), "scale": cols[1], "bias": cols[2],
                                           "dst_zp": cols[3], "columns": cols, "a4": sp[16 * n_pad:], "sp": sp,
                                           "last": {},
                                           "partial": sp[16 * n_pad:20 * n_pad].view(np.int32)}
        return views

    def _execute(self, mem: dict, scratchpad) -> Replay | None:
        pd = self.pd
        M, N, K, batch = pd.M, pd.N, pd.K, pd.batch
        views = self._views(scratchpad.view(np.uint8))
        # A library scratchpad belongs to this primitive (and thread) and keeps what was
        # written into it; a user's may have served another primitive since the last call.
        kept = pd.attr.scratchpad_mode != "user"
        if not kept:
            views["last"].clear()
        # Scales, bias and zero points of this call, into the scratchpad the plan points at.
        if pd._scale_kind != "none":
            s = mem[scales(SRC)].array if scales(SRC) in mem else _ONE
            w = mem[scales(WEIGHTS)].array if scales(WEIGHTS) in mem else _ONE

            def scale():
                views["scale"][:N] = s[0] * w
            refresh(views["last"], "scale", (s.tobytes(), w.tobytes()), scale)
        if BIAS in mem:
            bias = mem[BIAS].array

            def put_bias():
                views["bias"][:N] = bias.reshape(-1)
            refresh(views["last"], "bias", bias.tobytes(), put_bias)
        if zero_points(DST) in mem:
            zp = mem[zero_points(DST)].array

            def put_zp():
                views["dst_zp"][:N] = zp
            refresh(views["last"], "dst_zp", zp.tobytes(), put_zp)
        zp_src = int(mem[zero_points(SRC)].array[0]) if zero_points(SRC) in mem else 0
        dst_scale, output = dst_stage(pd.output, mem[scales(DST)].array if scales(DST) in mem else None,
                                      mem[zero_points(DST)].array if zero_points(DST) in mem else None)
        ao = zp_src + (128 if pd.src_s8 else 0)
        flat = pd.flat()
        rows = M * batch if flat else M
        a_all = mem[SRC].array.reshape(-1, rows, K)
        c_all = mem[DST].array.reshape(-1, rows, N)
        keep, runs = [], []
        items = c_all.shape[0]
        w_all = self._weights_view(mem[WEIGHTS])
        # Runtime weights whose view is a copy (an inner product's weights in another order
        # than its source's: OIHW beside NHWC) cannot be replayed: the kernels and the
        # packer would read this call's copy again, not the caller's new values.
        copied = w_all is not None and not np.may_share_memory(w_all, mem[WEIGHTS].array)
        batch_plan = self._in_place_batch(w_all, views, a_all, c_all, rows, output) if items > 1 else None
        if batch_plan is not None:  # every item in one call of the in-place kernel
            plan, w = batch_plan
            for st in plan.structs:
                st.dst_scale_inv = dst_scale
            plan.run(a_all, w, c_all, zp_src)
            if copied:
                return None
            replay = self._replay([(plan, None, a_all, _read_in_place, None)], keep, False)
            if replay is not None:
                replay.move = self._mover(None, mem[WEIGHTS], w_all, views, rows, zp_src, plan)
            return replay if kept else restoring(replay, views["columns"])
        # Items that need nothing of each other (runtime weights of their own; no shared
        # compensation, or none at all; no padded source) go whole to one thread each,
        # dealt to the threads: a small item split between threads pays for the split and
        # a hand-off (attention's 12 heads of 128x64x128 on two threads: 0.43 of oneDNN).
        spread = pd.threads > 1 and items >= 2 * pd.threads and K >= 4 and not mem[WEIGHTS].desc.is_packed \
            and (ao == 0 or pd._in_place is not None) and not pd._in_place_chunked  # (one partial sums' vector)
        item_threads = 1 if spread else pd.threads
        # Spread items with weights of their own packed at this call: each thread packs its
        # items' weights, then runs their products (one hand-off, not two; attention's 12
        # heads of 128x128x64 on two threads: 44.8 -> 42.0 us, 128x64x128 0.82 -> 0.97 of oneDNN).
        per_item = spread and w_all is not None and w_all.ndim == 3 and w_all.shape[0] == items
        first_calls = []  # per item, where per_item and packed: its weights' packing
        for b in range(items):
            a_b = a_all[b if pd.src_batch > 1 else 0]
            w = self._in_place_weights(w_all, b)
            comp = a4 = None
            if w is not None:  # read in place: no packing, the kernel subtracts the compensation
                plan, repack = self._gemv_plan(w, views, rows, output, b, item_threads), _read_in_place
            else:
                packed, choice, repack = self._weights(mem[WEIGHTS], w_all, b, views, per_item)
                if per_item:
                    first_calls.append([views["packer"].item_call(b)])

                def comp(packed=packed):  # -ao * column sums, wrapping as int32
                    views["col_comp"][:packed.colsum.size] = (-ao * packed.colsum).astype(np.uint32).view(np.int32)
                # Weights packed at this call: always recompute (but zeros stay zeros).
                refresh(views["last"], "col_comp", (id(packed), ao) if mem[WEIGHTS].desc.is_packed else
                        ("any weights", 0) if ao == 0 else None, comp)
                a, lda = a_b, K
                if K < 4:  # the kernel reads whole dwords of A: pad K to 4 in the scratchpad
                    a4 = views["a4"][: 4 * rows].reshape(rows, 4)
                    a4[:, :K] = a.view(np.uint8)
                    a, lda = a4.view(a.dtype), 4
                if spread and ao:  # pragma: no cover - a dense plain array is read in place
                    raise RuntimeError("internal: a batch item packed with a compensation while spread")
                # (spread items each need a plan of their own: their calls run together,
                # after every item's plan was pointed, even where they share the weights)
                plan = self._plan(packed, choice, views, lda, rows, output, item_threads, b if spread else None)
            for st in plan.structs:
                st.dst_scale_inv = dst_scale
            if pd._binary:
                # (each operand in logical dim order: a tag other than row-major is read as its
                # row-major copy, which _replay then declines to repeat)
                keep += self._point_binaries(plan, {post_op_src1(i): mem[post_op_src1(i)].logical()
                                                    for i, _ in pd._binary}, b)
            if w is not None:
                (plan.point if spread else plan.run)(a_b, w, c_all[b], zp_src)
            else:
                (point if spread else run)(plan, a, c_all[b])
            runs.append((plan, a4, a_b, repack, comp if repack is not None and ao else None))
        together = None
        if spread:
            together = CallPlan.spread([r[0].calls for r in runs], pd.threads, first_calls or None)
            together.run()
        if copied:
            return None
        replay = self._replay(runs, keep, mem[WEIGHTS].desc.is_packed, together)
        if replay is not None and all(r[1] is None for r in runs):
            # The kernels read the caller's arrays alone (no padded source; binary operands
            # read in place, as _replay requires): new arrays are pointed at (Replay.moves).
            replay.move = self._mover([(r[0], r[3]) for r in runs], mem[WEIGHTS], w_all, views, rows, zp_src,
                                      a_all=a_all, c_all=c_all)
        # (a user scratchpad: the per-column vectors written back at each run)
        return replay if kept else restoring(replay, views["columns"])

    def _point_binaries(self, plan, arrays: dict, b: int) -> list:
        """Batch item ``b``'s plan at the binary operands among ``arrays`` (name -> ndarray);
        returns (operand as the kernel reads it, the user's array) of each, which the
        caller keeps alive until the kernels return."""
        N, flat, keep = self.pd.N, self.pd.flat(), []
        for i, kind in self.pd._binary:
            src1 = self._operand(arrays[post_op_src1(i)], kind, b, flat)
            keep.append((src1, arrays[post_op_src1(i)]))
            base = pointer_to(src1)
            for st, (c0, r0) in zip(plan.structs, plan.chunks):
                st.po_src[i] = base + {"common": 0, "col": 4 * c0, "row": 4 * r0, "full": r0 * 4 * N + 4 * c0}[kind]
                st.po_ld[i] = 4 * N
        return keep

    def _mover(self, runs: list | None, wmem: Memory, w_view, views: dict, rows: int, zp_src: int, batch_plan=None,
               a_all=None, c_all=None):
        """:class:`Replay`'s ``move`` for the plans of ``runs`` ((plan, repack) per batch
        item: weights packed once, read in place, or packed at every call by the
        scratchpad's packer), or for ``batch_plan`` (every item in one in-place call):
        their structs, and the packer, pointed at new arrays as :meth:`_execute` points
        them. ``w_view``: runtime weights' view (:meth:`_weights_view`) of ``wmem``'s array;
        ``a_all``, ``c_all``: the set-up's views of the source and dst (item x rows x K or N),
        whose strides new arrays share (``Replay.moves``)."""
        pd = self.pd
        K, N, runtime = pd.K, pd.N, not wmem.desc.is_packed
        # (the weights' view of a new array, as w_view is of this one: 12 heads' decode 13 -> 9 us a call)
        take = (view_maker(w_view, wmem.array) or (lambda w: self._weights_view(Memory.trusted(wmem.desc, w)))) \
            if runtime else None
        # Each struct's addresses are the new arrays' first bytes plus what they were past
        # the set-up's: their entries taken here, a table of them (made at the first move)
        # written by one kernel call (jit.repoint; 12 heads of 128x128x64: 16.6 -> 4 us of
        # Python a moved call). The
        # weights' view (a transpose, a reshape) is addressed from the caller's array, a
        # cheaper address to take. Bases: the source, the dst, the weights.
        w_shift = w_view.ctypes.data - wmem.array.ctypes.data if runtime else 0
        entries, chunked = [], []
        if batch_plan is not None:
            runs = []  # (one in-place call for every item: no packer, no binary operand)
            for s, a_off, w_off, c_off in batch_plan.fields():
                entries += [(s, "a", 0, a_off), (s, "w", 2, w_shift + w_off), (s, "c", 1, c_off)]
        a_item = a_all.strides[0] if a_all is not None and pd.src_batch > 1 else 0
        for b, (plan, repack) in enumerate(runs):
            a_b, c_b = b * a_item, b * c_all.strides[0]
            if repack is not _read_in_place:
                for s, (a_off, c_off) in zip(plan.structs, plan.offsets):
                    entries += [(s, "a", 0, a_b + a_off), (s, "c", 1, c_b + c_off)]
            elif isinstance(plan, GemvPlan):  # (read in place; its ao stays: the zero point is by value)
                w_b = self._in_place_weights(w_view, b).ctypes.data - w_view.ctypes.data + w_shift
                for s, a_off, w_off, c_off in plan.fields():
                    entries += [(s, "a", 0, a_b + a_off), (s, "w", 2, w_b + w_off), (s, "c", 1, c_b + c_off)]
            else:  # (K in chunks: its pieces point as ChunkedRows.point does)
                chunked.append((b, plan))
        in_place = any(field == "w" for _, field, _, _ in entries)
        point = repointer(entries, 3 if in_place else 2) if entries else None
        packer = views.get("packer") if runtime and any(r is not _read_in_place for _, r in runs) else None
        repoint = packer.mover() if packer is not None else None

        def move(arrays: dict) -> None:
            if packer is not None:  # (the replay packs what it points at)
                repoint(arrays[WEIGHTS], pointer_to(arrays[WEIGHTS]) + w_shift, take)
            if point is not None:
                if in_place:
                    point(pointer_to(arrays[SRC]), pointer_to(arrays[DST]), pointer_to(arrays[WEIGHTS]))
                else:
                    point(pointer_to(arrays[SRC]), pointer_to(arrays[DST]))
            if chunked:
                w_all = take(arrays[WEIGHTS])
                a_all, c_all = arrays[SRC].reshape(-1, rows, K), arrays[DST].reshape(-1, rows, N)
                for b, plan in chunked:
                    plan.point(a_all[b if pd.src_batch > 1 else 0], self._in_place_weights(w_all, b), c_all[b], zp_src)
            if pd._binary:  # (each operand in logical dim order, as the set-up read it)
                operands = {post_op_src1(i): Memory(pd.query(post_op_src1(i)), arrays[post_op_src1(i)]).logical()
                            for i, _ in pd._binary}
                for b, (plan, _) in enumerate(runs):
                    self._point_binaries(plan, operands, b)
        # (addresses alone, the packer's reads of the weights in place too: a guard may move it)
        w_entries = None if chunked or pd._binary else [] if packer is None else packer.guard_entries(2, w_shift)
        if w_entries is not None:
            return pointing(move, entries + w_entries, (SRC, DST, WEIGHTS) if in_place or w_entries else (SRC, DST))
        return move

    def _replay(self, runs: list, keep: list, packed_weights: bool, together: CallPlan | None = None
                ) -> Replay | None:
        """What repeats the calls ``runs`` made (their plans, padded sources, runtime
        weights' packing and compensation), or None where they cannot be repeated as they
        are: a binary operand copied at set-up, or items that share one plan (packed
        weights for several batch items: set-up points it at each item in turn)."""
        if not all(np.may_share_memory(src1, user) for src1, user in keep):
            return None
        runtime = all(r[3] is not None for r in runs)
        if not (runtime and len({id(r[0]) for r in runs}) == len(runs) or packed_weights and len(runs) == 1):
            return None
        K = self.pd.K
        if len(runs) == 1 and runs[0][1] is None and runs[0][3] in (None, _read_in_place):
            # One GEMM on the caller's arrays is repeated by its kernel calls alone. (A
            # partial, not the bound method: a replay can outlive the plan's place in
            # self._plans, and keeps the plan, and what its structs point into, alive.)
            plan = runs[0][0]
            kernels = functools.partial(CallPlan.run, plan.calls)
            kernels.plan = plan
            return Replay(kernels, by_value=(BIAS,))
        steps = [(plan.calls, a4, a, repack, comp) for plan, a4, a, repack, comp in runs]
        if len(steps) > 1 and all(a4 is None and comp is None for _, a4, _, _, comp in steps):
            # Nothing to do between the items (no source to pad, no compensation: a u8
            # source without a zero point): the weights packed, then every item's calls
            # in one plan, one hand-off for the batch instead of one an item.
            first, joined = steps[0][3], together or CallPlan.joined([r[0].calls for r in runs])

            def at_once() -> None:
                first()
                joined.run()
            at_once.plans, at_once.joined = [r[0] for r in runs], joined
            return Replay(at_once, by_value=(BIAS,))

        def again() -> None:  # each item: its weights packed anew, its source padded anew, its calls
            for calls, a4, a, repack, comp in steps:
                if repack is not None:
                    repack()
                if comp is not None:
                    comp()
                if a4 is not None:
                    a4[:, :K] = a.view(np.uint8)
                calls.run()
        again.plans = [r[0] for r in runs]
        return Replay(again, by_value=(BIAS,))

    def _operand(self, src1: np.ndarray, kind: str, b: int, flat: bool) -> np.ndarray:
        """A binary operand as the kernel reads it for batch item ``b`` (all rows when flat)."""
        pd = self.pd
        if kind in ("common", "col"):  # (one per item: flat is False; an item's view may be strided)
            return np.ascontiguousarray(src1[b] if src1.ndim == 3 and src1.shape[0] == pd.batch > 1 else src1,
                                        np.float32)
        shape = (pd.batch, pd.M, pd.N if kind == "full" else 1)
        if src1.ndim == 3 and src1.shape[0] == pd.batch:
            src1 = src1 if flat else src1[b]
        elif flat and pd.batch > 1:  # one operand for every batch item: repeat it
            src1 = np.broadcast_to(src1.reshape(shape[1:]), shape)
        return np.ascontiguousarray(src1, np.float32)

    def _in_place_batch(self, w: np.ndarray | None, views: dict, a_all, c_all, rows: int, output):
        """(plan, weights) of one in-place call for every item of a batch (``w``: the
        weights' view), or None: where the weights are read in place and no binary
        post-op reads an operand per item."""
        pd = self.pd
        if pd._in_place is None or w is None or pd._binary or pd._in_place_chunked:
            return None
        if w.ndim != 3 or not reads_in_place(w[0], pd._in_place_layout):
            return None
        item = lambda x, many: x.strides[0] if many else 0  # noqa: E731 (a batch of 1: broadcast)
        strides = (item(a_all, pd.src_batch > 1), item(w, w.shape[0] > 1), c_all.strides[0])
        kernel = self._gemv_kernel(output)
        ldw = w.strides[2] if pd._in_place_layout == "columns" else w.strides[1]
        key = ("gemv items", kernel.address, views["sp"].ctypes.data, ldw, rows, strides)
        return self._kept_plan(key, lambda: GemvPlan(kernel, rows, pd.N, pd.K, pd.K, ldw, pd.N * pd.output.dst_bytes,
                                                     self._output_args(views, None), pd.threads, c_all.shape[0],
                                                     strides)), w

    def _kept_plan(self, key, make):
        """The plan kept under ``key``, or ``make()``'s, kept (a bounded number: a batch's
        runtime weights make a plan per item)."""
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 8 + 2 * self.pd.batch:
                self._plans.clear()
            plan = self._plans[key] = make()
        return plan

    def _gemv_kernel(self, output):
        """The in-place kernel for the output stage ``output`` (the descriptor's, or one a
        call's dst scale or zero point made)."""
        pd = self.pd
        if output == pd.output:
            return pd._in_place
        kernels = self.__dict__.setdefault("_gemv_kernels", {})
        return kernels.get(output) or kernels.setdefault(output, pd._gemv_for(output))

    def _gemv_plan(self, w: np.ndarray, views: dict, rows: int, output, b: int, threads: int) -> GemvPlan:
        """The in-place kernel's plan for item ``b`` (its own structs: a replay runs every
        item's calls without pointing them anew) on these weights' column stride."""
        pd = self.pd
        kernel = self._gemv_kernel(output)
        ldw = w.strides[1] if pd._in_place_layout == "columns" else w.strides[0]
        key = ("gemv", kernel.address, views["sp"].ctypes.data, ldw, rows, b, threads)
        if pd._in_place_chunked:
            return self._kept_plan(key, lambda: ChunkedRows(pd._chunk_sums + (kernel,), pd.N, pd.K, ldw,
                                                            pd.N * pd.output.dst_bytes, self._output_args(views, None),
                                                            threads, views["partial"]))
        return self._kept_plan(key, lambda: GemvPlan(kernel, rows, pd.N, pd.K, pd.K, ldw, pd.N * pd.output.dst_bytes,
                                                     self._output_args(views, None), threads))

    def _plan(self, packed, choice, views, lda, rows, output, threads: int, item: int | None = None):
        pd = self.pd
        kernel = self._kernel(choice, output)
        key = (id(packed), kernel.address, views["sp"].ctypes.data, lda, rows, threads, item)
        return self._kept_plan(key, lambda: make_plan(kernel, packed, rows, pd.N, pd.K, lda, pd.N * pd.output.dst_bytes,
                                                      self._output_args(views, views["col_comp"]), threads))

    def _output_args(self, views: dict, col_comp) -> OutputArgs:
        """The output stage's operands, in this scratchpad's per-column vectors."""
        pd = self.pd
        scale, bias, dst_zp = views["scale"], views["bias"], views["dst_zp"]
        attr = pd.attr
        out = OutputArgs(col_comp=col_comp)
        if pd._scale_kind != "none":
            out.scale = Operand(scale, pd._scale_kind)
        if pd.bias_desc() is not None:
            out.bias = Operand(bias, "col")
        if pd.output.dst_zp != "none":
            out.dst_zp = Operand(dst_zp, pd.output.dst_zp)
        for i, e in enumerate(attr.post_ops):
            out.po_scale.append(e.scale if isinstance(e, Sum) else 1.0)
            out.po_zp.append(float(e.zero_point) if isinstance(e, Sum) else 0.0)
        return out

