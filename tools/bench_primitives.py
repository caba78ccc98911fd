"""int8jit-bench matmul / ip / conv / pool: int8jit's primitives beside oneDNN's own.

    int8jit-bench matmul                  # BERT-base, 64x4096x4096, ResNet-50 fc; 1 and 2 threads
    int8jit-bench ip --quick              # a smaller set, shorter timings
    int8jit-bench conv --batch 1 --threads 1
    int8jit-bench conv --policy exact,faithful  # int8jit's rows under each overflow policy
    int8jit-bench ip --weights trained    # Laplacian weights per channel (matmul, ip, conv): exact splits them
    int8jit-bench pool --csv pool.csv --markdown pool.md
    python -m tools.bench_primitives matmul ...   # the same, without the int8jit-bench script

What runs (the issues' "Performance" lists):

* ``matmul`` / ``ip``: u8 src, s8 weights packed once (both sides: weights ``any`` and a
  reorder into the layout the primitive asked for), per-channel weight scales, f32
  bias, relu, u8 dst with a dst scale. Each shape is also run *plain* (s32 dst, no
  attributes): ``ovh%`` is how much slower the fused pipeline is than that plain
  product, per side. A second table gives primitive creation times: int8jit cold (a
  fresh process, ``INT8JIT_DISK_CACHE=0``), int8jit from the disk cache (a fresh
  process, a cache folder that a previous process filled) and oneDNN (its primitive
  cache off; the library already initialised). Imports (every module of int8jit, PeachPy;
  libdnnl) and the first CPU probe (oneDNN: its engine) happen before the clock starts.
* ``conv``: ResNet-50 layers (stem, the 1x1 and 3x3 of each stage, the strided 1x1
  projections; torchvision's v1.5 layout, stride on the 3x3) and MobileNet-v2's
  depthwise 3x3 layers, NHWC u8 in, u8 out, bias, per-channel scales, relu; oneDNN's
  weights ``any``.
* ``pool``: max and average pooling on NHWC u8 (int8jit: ``primitives.pooling.bench_case``).

``--policy`` (conv, matmul, ip) runs int8jit's rows once per overflow policy, on the same
operands, the policy in the row's label. The weights are full range, so on ``avx2`` and
``avx512_core`` ``exact`` takes the widening path, while ``faithful`` computes what
oneDNN computes there (VPMADDUBSW saturation included: its check reads ``=``).
``--weights trained`` (matmul, ip, conv) gives both sides Laplacian weights quantized per
output channel to +-127 instead: with their few large values ``exact`` there splits the weights
into VPMADDUBSW pairs and residual cells (``primitives.gemm_pack``) rather than widening.

How it measures. The machine is shared and its clock moves, so the two sides run
interleaved, never one after the other. oneDNN fixes its ISA and thread count when it
loads, so it runs in one child process per thread count (``ONEDNN_MAX_CPU_ISA`` = the
path's name in upper case, ``OMP_NUM_THREADS``), a small server that creates and times
primitives on request; int8jit runs in this process. Per problem: one warm-up call per
side, then rounds; a round times one window (about 5 ms of back-to-back calls) of every
variant on each side (oneDNN's first; with 2+ threads a 3 ms pause follows them, until
libgomp's idle workers stop spinning), until ``--min-time`` seconds per side (0.1; 0.03 with ``--quick``)
and at least 5 rounds (3). A figure is the best window (the least disturbed one);
``noise`` is how much slower the median window was than the best (the worse side);
``steal`` is the hypervisor's share of the row's CPU time on the cores the row may use
(/proc/stat; a virtual machine's host running other work: above ~10%, read the row as
noise, whatever its ratio).
GOPS = 2 * MACs / s; ``%pk`` = GOPS / (the path's register-only peak per core times the
threads); the peak loop (:mod:`jit.peak`) gets a 2 ms window in every round too, and its
best window of the run is the peak (rows print with the best so far; the CSV and the
markdown use the final one). ``ratio`` = int8jit GOPS / oneDNN GOPS (above 1:
int8jit is faster). ``check`` compares the two outputs of the fused problem: ``=``
bit-identical, else how many elements differ and by at most how much.

``conv`` also times PyTorch's quantized conv2d (``torch.ops.quantized.conv2d_relu``,
engine ``x86``, channels_last quint8 activations with scale 1 and zero point 0, per-
channel qint8 weights, f32 bias, quint8 output with int8jit's dst scale) in this process,
``torch.set_num_threads`` = the row's threads, its windows first in each round like
oneDNN's: ``torch ms`` and ``/torch`` = int8jit GOPS / PyTorch GOPS (above 1: int8jit is
faster); its output check against int8jit goes in the note. ``-`` where torch cannot be
imported. PyTorch's bundled oneDNN (3.12 in 2.13) picks its own ISA, AMX where the CPU
has it, and is not capped at the row's ISA path; above 100 groups (MobileNet's wide
depthwise layers) the x86 engine runs fbgemm, whose depthwise kernel saturates s16 pair
sums on full-range weights (the note then shows differing outputs; see
tests/test_torch_conv.py).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
LADDER = ("avx2", "avx2_vnni", "avx512_core", "avx512_core_vnni")
WINDOW_S = 0.005


class Unavailable(RuntimeError):
    """A side that cannot run here (its column says why)."""


# ------------------------------------------------------------------ problems

def _fc(label, M, N, K):
    return {"label": label, "M": M, "N": N, "K": K}


GEMM_SHAPES = [
    _fc("BERT-128 qkv/out", 128, 768, 768), _fc("BERT-128 ffn1", 128, 3072, 768),
    _fc("BERT-128 ffn2", 128, 768, 3072), _fc("BERT-384 qkv/out", 384, 768, 768),
    _fc("BERT-384 ffn1", 384, 3072, 768), _fc("BERT-384 ffn2", 384, 768, 3072),
    _fc("64x4096x4096", 64, 4096, 4096), _fc("RN50 fc b1", 1, 1000, 2048),
    _fc("RN50 fc b32", 32, 1000, 2048),
]
GEMM_QUICK = ["BERT-128 qkv/out", "BERT-384 ffn1", "64x4096x4096", "RN50 fc b1"]


def _conv(label, ic, hw, oc, k, s, groups=1):
    return {"label": label, "IC": ic, "IH": hw, "IW": hw, "OC": oc, "KH": k, "KW": k, "S": s,
            "P": (k - 1) // 2 if k > 1 else 0, "G": groups}


CONV_LAYERS = [
    _conv("stem 7x7/2 3->64", 3, 224, 64, 7, 2),
    _conv("res2 1x1 64->64", 64, 56, 64, 1, 1),
    _conv("res2 3x3 64->64", 64, 56, 64, 3, 1),
    _conv("res2 1x1 64->256", 64, 56, 256, 1, 1),
    _conv("res2 1x1 256->64", 256, 56, 64, 1, 1),
    _conv("res3 1x1 256->128", 256, 56, 128, 1, 1),
    _conv("res3 3x3/2 128->128", 128, 56, 128, 3, 2),
    _conv("res3 1x1 128->512", 128, 28, 512, 1, 1),
    _conv("res3 proj 1x1/2 256->512", 256, 56, 512, 1, 2),
    _conv("res3 1x1 512->128", 512, 28, 128, 1, 1),
    _conv("res3 3x3 128->128", 128, 28, 128, 3, 1),
    _conv("res4 1x1 512->256", 512, 28, 256, 1, 1),
    _conv("res4 3x3/2 256->256", 256, 28, 256, 3, 2),
    _conv("res4 1x1 256->1024", 256, 14, 1024, 1, 1),
    _conv("res4 proj 1x1/2 512->1024", 512, 28, 1024, 1, 2),
    _conv("res4 1x1 1024->256", 1024, 14, 256, 1, 1),
    _conv("res4 3x3 256->256", 256, 14, 256, 3, 1),
    _conv("res5 1x1 1024->512", 1024, 14, 512, 1, 1),
    _conv("res5 3x3/2 512->512", 512, 14, 512, 3, 2),
    _conv("res5 1x1 512->2048", 512, 7, 2048, 1, 1),
    _conv("res5 proj 1x1/2 1024->2048", 1024, 14, 2048, 1, 2),
    _conv("res5 1x1 2048->512", 2048, 7, 512, 1, 1),
    _conv("res5 3x3 512->512", 512, 7, 512, 3, 1),
] + [
    _conv(f"mbv2 dw 3x3{'/2' if s == 2 else ''} {c}@{hw}", c, hw, c, 3, s, groups=c)
    for c, hw, s in [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1),
                     (192, 28, 2), (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1)]
]
# A BERT-base encoder layer's int8 linears, in order: the query, key, value and output
# projections (768->768 each), then the feed-forward pair; the model runs 12 such layers.
BERT_LAYER = ["qkv/out"] * 4 + ["ffn1", "ffn2"]
# ResNet-50 (v1.5) as a network runs its 53 convolutions: the stem, then each stage's
# first block (with its projection, here after the block's three) and its other blocks.
RESNET50_SEQUENCE = (
    ["stem 7x7/2 3->64"]
    + ["res2 1x1 64->64", "res2 3x3 64->64", "res2 1x1 64->256", "res2 1x1 64->256"]
    + ["res2 1x1 256->64", "res2 3x3 64->64", "res2 1x1 64->256"] * 2
    + ["res3 1x1 256->128", "res3 3x3/2 128->128", "res3 1x1 128->512", "res3 proj 1x1/2 256->512"]
    + ["res3 1x1 512->128", "res3 3x3 128->128", "res3 1x1 128->512"] * 3
    + ["res4 1x1 512->256", "res4 3x3/2 256->256", "res4 1x1 256->1024", "res4 proj 1x1/2 512->1024"]
    + ["res4 1x1 1024->256", "res4 3x3 256->256", "res4 1x1 256->1024"] * 5
    + ["res5 1x1 1024->512", "res5 3x3/2 512->512", "res5 1x1 512->2048", "res5 proj 1x1/2 1024->2048"]
    + ["res5 1x1 2048->512", "res5 3x3 512->512", "res5 1x1 512->2048"] * 2
)
CONV_QUICK = ["stem 7x7/2 3->64", "res2 3x3 64->64", "res2 1x1 256->64", "res4 proj 1x1/2 512->1024",
              "res5 3x3 512->512", "mbv2 dw 3x3 144@56", "mbv2 dw 3x3/2 576@14"]


def _pool(label, alg, n, c, hw, k, s, p):
    return {"label": label, "alg": alg, "N": n, "C": c, "H": hw, "W": hw, "K": k, "S": s, "P": p}


POOL_CASES = [
    _pool("max 3x3/2 64x112x112 b1", "max", 1, 64, 112, 3, 2, 1),
    _pool("max 3x3/2 64x112x112 b8", "max", 8, 64, 112, 3, 2, 1),
    _pool("avg_incl 3x3/2 64x112x112", "avg_include_padding", 1, 64, 112, 3, 2, 1),
    _pool("avg_excl 3x3/2 64x112x112", "avg_exclude_padding", 1, 64, 112, 3, 2, 1),
    _pool("global avg 7x7 2048 b1", "avg_exclude_padding", 1, 2048, 7, 7, 1, 0),
    _pool("global avg 7x7 2048 b8", "avg_exclude_padding", 8, 2048, 7, 7, 1, 0),
]
POOL_QUICK = ["max 3x3/2 64x112x112 b1", "avg_excl 3x3/2 64x112x112", "global avg 7x7 2048 b1"]


def conv_out(case) -> tuple[int, int]:
    oh = (case["IH"] + 2 * case["P"] - case["KH"]) // case["S"] + 1
    ow = (case["IW"] + 2 * case["P"] - case["KW"]) // case["S"] + 1
    return oh, ow


def pool_out(case) -> tuple[int, int]:
    return tuple((case[d] + 2 * case["P"] - case["K"]) // case["S"] + 1 for d in ("H", "W"))


def ops(case) -> int:
    """2 x multiply-adds of a problem (0 for pooling: it is reported in bytes)."""
    if case["prim"] in ("matmul", "ip"):
        return 2 * case["M"] * case["N"] * case["K"]
    if case["prim"] == "conv":
        oh, ow = conv_out(case)
        return 2 * case["N"] * oh * ow * case["OC"] * (case["IC"] // case["G"]) * case["KH"] * case["KW"]
    return 0


def pool_bytes(case) -> int:
    oh, ow = pool_out(case)
    return case["N"] * case["C"] * (case["H"] * case["W"] + oh * ow)


# ------------------------------------------------------------------ operands (both sides)

def _rng(case, what):
    # (the policy is int8jit's choice of computation, not the problem: the same operands)
    case = {k: v for k, v in case.items() if k != "policy"}
    key = [ord(c) for c in json.dumps(case, sort_keys=True)][:64] + [what]
    return np.random.default_rng(key)


def trained_weights(rng, shape: tuple, axis: int) -> np.ndarray:
    """Laplacian values quantized per output channel (``axis``) to +-127, as trained
    weights are: most small, a few large (on avx2/avx512_core exact splits them into
    residual cells, see ``--weights``)."""
    w = rng.laplace(size=shape)
    others = tuple(i for i in range(len(shape)) if i != axis)
    return np.round(w * (127 / np.abs(w).max(axis=others, keepdims=True))).astype(np.int8)


def _case_weights(case, rng, w: np.ndarray, axis: int) -> tuple[np.ndarray, float]:
    """The case's weights: ``w`` (uniform over s8), or trained-like ones of its shape
    under ``--weights trained``; with the standard deviation the scales assume."""
    if case.get("weights") == "trained":
        w = trained_weights(rng, w.shape, axis)
        return w, float(w.std())
    return w, 74.0


def gemm_operands(case):
    """u8 A (M, K), s8 W (K, N), bias, per-column weight scales, dst scale (src scale 1)."""
    M, N, K = case["M"], case["N"], case["K"]
    rng = _rng({k: case[k] for k in ("M", "N", "K")}, 0)
    A = rng.integers(0, 256, (M, K), dtype=np.uint8)
    W, w_std = _case_weights(case, rng, rng.integers(-128, 128, (K, N), dtype=np.int16).astype(np.int8), axis=1)
    # One standard deviation of the product maps to ~1; dst = relu(x) * 60: half the
    # outputs 0, a few saturated, most in between.
    wscale = (rng.uniform(0.5, 1.5, N) / (np.sqrt(K) * 74.0 * w_std)).astype(np.float32)
    bias = rng.normal(0.0, 0.5, N).astype(np.float32)
    return A, W, bias, wscale, np.float32([1.0 / 60.0])


def conv_operands(case):
    """NHWC u8 src, s8 weights (OC, IC/G, KH, KW) logical, bias, scales."""
    n, g = case["N"], case["G"]
    rng = _rng({k: v for k, v in case.items() if k != "label"}, 1)
    x = rng.integers(0, 256, (n, case["IH"], case["IW"], case["IC"]), dtype=np.uint8)
    icg = case["IC"] // g
    w, w_std = _case_weights(case, rng, rng.integers(-128, 128, (case["OC"], icg, case["KH"], case["KW"]),
                                                     dtype=np.int16).astype(np.int8), axis=0)
    k = icg * case["KH"] * case["KW"]
    wscale = (rng.uniform(0.5, 1.5, case["OC"]) / (np.sqrt(k) * 74.0 * w_std)).astype(np.float32)
    bias = rng.normal(0.0, 0.5, case["OC"]).astype(np.float32)
    return x, w, bias, wscale, np.float32([1.0 / 60.0])


def conv_weight_dims(case):
    oc, g = case["OC"], case["G"]
    icg = case["IC"] // g
    if g == 1:
        return (oc, icg, case["KH"], case["KW"]), "abcd", 1
    return (g, oc // g, icg, case["KH"], case["KW"]), "abcde", 3


def pool_src(case):
    # Exactly what primitives.pooling.bench_case draws for seed 0.
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (case["N"], case["H"], case["W"], case["C"]), dtype=np.uint8)


# ------------------------------------------------------------------ int8jit side

@dataclass
class Side:
    """One side's set-up problem: a zero-argument call, its output, what it ran."""

    call: object
    out: np.ndarray | None
    impl: str = ""
    create_ms: float | None = None
    bind: object = None  # int8jit: makes the bound call (Primitive.bind) of the same arguments


def int8jit_setup(case, variant: str, isa: str, threads: int) -> Side:
    prim = case["prim"]
    if prim in ("matmul", "ip"):
        return _int8jit_gemm(case, variant, isa, threads)
    if prim == "conv":
        return _int8jit_conv(case, isa, threads)
    return _int8jit_pool(case, isa, threads)


def _int8jit_gemm(case, variant, isa, threads) -> Side:
    from primitives.attr import Attr, PostOps
    from primitives.matmul import InnerProductDesc, MatmulDesc
    from primitives.memory import Memory, desc
    from primitives.reorder import reorder_desc

    M, N, K = case["M"], case["N"], case["K"]
    A, W, bias, wscale, dscale = gemm_operands(case)
    fused = variant == "fused"
    ip = case["prim"] == "ip"
    # The logical weights the reorder reads (an inner product's OC x K): the user's data,
    # made before the clock as on oneDNN's side (the 16 MB transpose of 64x4096x4096 took
    # 100-200 ms, more than the creation it was counted in).
    w_dims, w_logical = ((N, K), np.ascontiguousarray(W.T)) if ip else ((K, N), W)
    t0 = time.perf_counter()
    policy = case.get("policy", "exact")
    if fused:
        attr = Attr(scales={"src": 0, "weights": 1 if ip else 2, "dst": 0}, policy=policy).set_post_ops(
            PostOps().eltwise("relu"))
        bias_md = desc((N,), "f32", "a") if ip else desc((1, N), "f32", "ab")
    else:
        attr, bias_md = Attr(policy=policy), None
    dst_dt = "u8" if fused else "s32"
    cls = InnerProductDesc if ip else MatmulDesc
    pd = cls(desc((M, K), "u8", "ab"), desc(w_dims, "s8", "any"), desc((M, N), dst_dt, "ab"), bias_md,
             attr=attr, isa=isa, threads=threads)
    p = pd.create()
    create_ms = 1e3 * (time.perf_counter() - t0)
    wmem = Memory(pd.weights_desc())
    reorder_desc(desc(w_dims, "s8", "ab"), pd.weights_desc()).create().execute({"src": w_logical, "dst": wmem})
    C = np.zeros((M, N), np.uint8 if fused else np.int32)
    args = {"src": A, "weights": wmem, "dst": C}
    if fused:
        args.update({"bias": bias if ip else bias.reshape(1, N), "scales:src": np.float32([1.0]),
                     "scales:weights": wscale, "scales:dst": dscale})
    execute = p.execute

    def call():
        execute(args)

    info = pd.impl_info()
    return Side(call, C, f"{info.get('impl', '')}", create_ms, bind=lambda: p.bind(args))


def _int8jit_conv(case, isa, threads) -> Side:
    try:
        from primitives.conv import ConvolutionDesc
    except ImportError as exc:
        raise Unavailable(f"int8jit conv not available yet ({exc})") from None
    from primitives.attr import Attr, PostOps
    from primitives.memory import Memory, desc
    from primitives.reorder import reorder_desc

    x, w, bias, wscale, dscale = conv_operands(case)
    n, oc = case["N"], case["OC"]
    oh, ow = conv_out(case)
    w_dims, w_tag, w_mask = conv_weight_dims(case)
    attr = Attr(scales={"weights": w_mask, "dst": 0}, policy=case.get("policy", "exact")).set_post_ops(
        PostOps().eltwise("relu"))
    t0 = time.perf_counter()
    pd = ConvolutionDesc(desc((n, case["IC"], case["IH"], case["IW"]), "u8", "nhwc"), desc(w_dims, "s8", "any"),
                         desc((n, oc, oh, ow), "u8", "nhwc"), desc((oc,), "f32", "a"),
                         strides=(case["S"], case["S"]), padding_l=(case["P"], case["P"]),
                         padding_r=(case["P"], case["P"]), attr=attr, isa=isa, threads=threads)
    p = pd.create()
    create_ms = 1e3 * (time.perf_counter() - t0)
    wmem = Memory(pd.weights_desc())
    reorder_desc(desc(w_dims, "s8", w_tag), pd.weights_desc()).create().execute(
        {"src": w.reshape(w_dims), "dst": wmem})
    y = np.zeros((n, oh, ow, oc), np.uint8)
    args = {"src": x, "weights": wmem, "bias": bias, "dst": y, "scales:weights": wscale, "scales:dst": dscale}
    execute = p.execute

    def call():
        execute(args)

    info = pd.impl_info() if hasattr(pd, "impl_info") else {}
    return Side(call, y, str(info.get("impl", "")), create_ms, bind=lambda: p.bind(args))


def _int8jit_pool(case, isa, threads) -> Side:
    from primitives.pooling import bench_case

    t0 = time.perf_counter()
    run, _, _ = bench_case(case["N"], case["C"], case["H"], case["W"], case["K"], case["S"], case["P"],
                           case["alg"], "u8", isa=isa, threads=threads, seed=0)
    return Side(run, None, "", 1e3 * (time.perf_counter() - t0))


# ------------------------------------------------------------------ oneDNN side (child)

def onednn_setup(case, variant: str) -> Side:
    from tools import onednn_prim as dp

    prim = case["prim"]
    if prim in ("matmul", "ip"):
        M, N, K = case["M"], case["N"], case["K"]
        A, W, bias, wscale, dscale = gemm_operands(case)
        fused = variant == "fused"
        ip = prim == "ip"
        attr = dp.Attr(scales={"src": 0, "weights": 1 if ip else 2, "dst": 0},
                       post_ops=[("eltwise", "relu", 0.0, 0.0)]) if fused else None
        w_dims, w_logical = ((N, K), np.ascontiguousarray(W.T)) if ip else ((K, N), W)
        bias_md = (dp.md((N,), "f32", "a") if ip else dp.md((1, N), "f32", "ab")) if fused else None
        make = dp.inner_product if ip else dp.matmul
        t0 = time.perf_counter()
        p = make(dp.md((M, K), "u8", "ab"), dp.md(w_dims, "s8", "any"), dp.md((M, N), "u8" if fused else "s32", "ab"),
                 bias_md, attr=attr)
        create_ms = 1e3 * (time.perf_counter() - t0)
        wp = p.reorder_weights(w_logical, "ab")
        C = np.zeros((M, N), np.uint8 if fused else np.int32)
        args = {"src": A, "weights": wp, "dst": C}
        if fused:
            args.update({"bias": bias, "scales:src": np.float32([1.0]), "scales:weights": wscale,
                         "scales:dst": dscale})
        return Side(p.bind(args), C, p.impl_info(), create_ms)
    if prim == "conv":
        x, w, bias, wscale, dscale = conv_operands(case)
        n, oc = case["N"], case["OC"]
        oh, ow = conv_out(case)
        w_dims, w_tag, w_mask = conv_weight_dims(case)
        attr = dp.Attr(scales={"weights": w_mask, "dst": 0}, post_ops=[("eltwise", "relu", 0.0, 0.0)])
        t0 = time.perf_counter()
        p = dp.convolution(dp.md((n, case["IC"], case["IH"], case["IW"]), "u8", "nhwc"), dp.md(w_dims, "s8", "any"),
                           dp.md((n, oc, oh, ow), "u8", "nhwc"), dp.md((oc,), "f32", "a"),
                           strides=(case["S"],) * 2, padding_l=(case["P"],) * 2, padding_r=(case["P"],) * 2,
                           attr=attr)
        create_ms = 1e3 * (time.perf_counter() - t0)
        wp = p.reorder_weights(w.reshape(w_dims), w_tag)
        y = np.zeros((n, oh, ow, oc), np.uint8)
        run = p.bind({"src": x, "weights": wp, "bias": bias, "dst": y, "scales:weights": wscale,
                      "scales:dst": dscale})
        return Side(run, y, p.impl_info(), create_ms)
    x = pool_src(case)
    oh, ow = pool_out(case)
    n, c = case["N"], case["C"]
    t0 = time.perf_counter()
    p = dp.pooling(case["alg"], dp.md((n, c, case["H"], case["W"]), "u8", "nhwc"), dp.md((n, c, oh, ow), "u8", "nhwc"),
                   strides=(case["S"],) * 2, kernel=(case["K"],) * 2, padding_l=(case["P"],) * 2,
                   padding_r=(case["P"],) * 2)
    create_ms = 1e3 * (time.perf_counter() - t0)
    y = np.zeros((n, oh, ow, c), np.uint8)
    return Side(p.bind({"src": x, "dst": y}), y, p.impl_info(), create_ms)


def _timed(call, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    return time.perf_counter() - t0


def _in_turn(calls):
    """One call that makes ``calls`` one after another (a chain of layers)."""
    def chain():
        for call in calls:
            call()
    return chain


def _server() -> None:
    """Child side: JSON requests on stdin, one JSON answer line each on stdout."""
    from tools import onednn, onednn_prim as dp

    out = sys.stdout
    sys.stdout = sys.stderr  # nothing else may write to the answer channel
    sides: dict = {}
    dp.engine()

    def answer(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    answer({"isa": onednn.effective_isa(), "version": onednn.version(), "threads": onednn.max_threads()})
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        try:
            if op == "setup":
                side = sides[req["id"]] = onednn_setup(req["case"], req["variant"])
                side.call()
                answer({"impl": side.impl, "create_ms": side.create_ms})
            elif op == "time":
                answer({"s": _timed(sides[req["id"]].call, req["n"])})
            elif op == "chain":  # the layers one after another, as a network calls them
                answer({"s": _timed(_in_turn([sides[i].call for i in req["ids"]]), req["n"])})
            elif op == "save":
                np.save(req["path"], sides[req["id"]].out)
                answer({})
            elif op == "free":
                sides.clear()
                answer({})
            elif op == "creation":  # cold creations: oneDNN's primitive cache off
                dp.set_primitive_cache_capacity(0)
                times = []
                for _ in range(req.get("repeats", 3)):
                    times.append(onednn_setup(req["case"], req["variant"]).create_ms)
                dp.set_primitive_cache_capacity(1024)
                answer({"ms": min(times)})
            elif op == "quit":
                break
            else:
                answer({"error": f"unknown op {op}"})
        except Exception as exc:
            answer({"error": f"{type(exc).__name__}: {exc}"})
    out.flush()
    os._exit(0)  # no interpreter teardown under OpenMP's idle threads


class OneDNNServer:
    """A oneDNN child capped at ``isa`` with ``threads`` OpenMP threads."""

    def __init__(self, isa: str, threads: int):
        from tools import onednn

        ok, why = onednn.available()
        if not ok:
            raise Unavailable(f"oneDNN unavailable: {why}")
        self.err = tempfile.TemporaryFile(mode="w+")  # a file: a chatty child never blocks on it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tools.bench_primitives", "_onednn-server"], env=onednn.child_env(isa, threads),
            cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True)
        self.info = self._read()
        self.note = "" if self.info.get("isa") == isa else f"oneDNN ran {self.info.get('isa')}"

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=10)
            self.err.seek(0)
            err = self.err.read()[-400:]
            raise Unavailable(f"oneDNN child ended ({self.proc.poll()}): {err.strip()}")
        return json.loads(line)

    def request(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        got = self._read()
        if "error" in got:
            raise Unavailable(f"oneDNN: {got['error']}")
        return got

    def close(self) -> None:
        try:
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except Exception:
            self.proc.kill()


class RemoteSide:
    def __init__(self, server: OneDNNServer, ident: str, case, variant):
        self.server, self.id = server, ident
        got = server.request(op="setup", id=ident, case=case, variant=variant)
        self.impl, self.create_ms = got["impl"], got["create_ms"]

    def timed(self, n: int) -> float:
        return self.server.request(op="time", id=self.id, n=n)["s"]

    def output(self) -> np.ndarray:
        with tempfile.TemporaryDirectory(prefix="int8jit-bench-") as tmp:
            path = os.path.join(tmp, "out.npy")
            self.server.request(op="save", id=self.id, path=path)
            return np.load(path)


# ------------------------------------------------------------------ PyTorch side (conv)

def torch_conv_setup(case, threads: int) -> Side:
    """PyTorch's quantized conv2d + relu on ``conv_operands(case)`` (x86 engine, NHWC)."""
    try:
        import torch
    except ImportError as exc:
        raise Unavailable(f"torch unavailable ({exc})") from None
    import warnings

    engines = torch.backends.quantized.supported_engines
    engine = next((e for e in ("x86", "fbgemm", "onednn") if e in engines), None)
    if engine is None:
        raise Unavailable(f"torch has no x86 quantized engine ({engines})")
    torch.backends.quantized.engine = engine
    torch.set_num_threads(threads)
    x, w, bias, wscale, dscale = conv_operands(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensor creation is deprecated in torch 2.13
        # x is NHWC: permuting to NCHW logical dims gives a channels_last tensor without a copy.
        qx = torch._make_per_tensor_quantized_tensor(torch.from_numpy(x), 1.0, 0).permute(0, 3, 1, 2)
        qw = torch._make_per_channel_quantized_tensor(torch.from_numpy(w), torch.from_numpy(wscale.astype(np.float64)),
                                                      torch.zeros(case["OC"], dtype=torch.int64), 0)
        t0 = time.perf_counter()
        packed = torch.ops.quantized.conv2d_prepack(qw, torch.from_numpy(bias), [case["S"]] * 2, [case["P"]] * 2,
                                                    [1, 1], case["G"])
        create_ms = 1e3 * (time.perf_counter() - t0)
    conv, scale = torch.ops.quantized.conv2d_relu, float(dscale[0])
    out = {}

    def call():
        out["y"] = conv(qx, packed, scale, 0)

    call()
    side = Side(call, None, f"torch {torch.__version__} {engine}", create_ms)
    # The NHWC u8 output of the last call (the tensor is channels_last: the permute is a view).
    side.output = lambda: out["y"].int_repr().permute(0, 2, 3, 1).numpy()
    return side


# ------------------------------------------------------------------ measurement

class Series:
    """Windows of one side of one variant: per-call seconds of each window."""

    def __init__(self, timed, first_call_s: float, remote: bool = False):
        self.timed, self.remote = timed, remote
        self.n = max(1, int(WINDOW_S / max(first_call_s, 1e-7)))
        self.windows: list[float] = []
        self.total = 0.0

    def window(self) -> None:
        s = self.timed(self.n)
        self.total += s
        self.windows.append(s / self.n)

    @property
    def best(self):
        return min(self.windows) if self.windows else None

    @property
    def noise(self):
        return statistics.median(self.windows) / self.best - 1.0 if self.windows else None


# libgomp's idle workers spin (GOMP_SPINCOUNT, PAUSE loops) after oneDNN's last call; with
# 2+ threads they would steal a core from int8jit's next window. With the count below they
# sleep within about a millisecond, so the pause is kept that short: on a VM whose host
# slows a vCPU that has idled for tens of ms (a Zen 3 here), 30 ms made int8jit's two-thread windows start on a
# slowed vCPU (ResNet-50 rows 0.51-0.93 at up to 233% noise, against 0.89-1.03 at 5-15%
# with 3 ms, two runs each; oneDNN's own rows no slower).
SETTLE_S = 0.003
# libgomp's default spin (300,000 PAUSE loops) outlasted SETTLE_S here: in interleaved
# windows on two cores, oneDNN's and PyTorch's idle workers took a core from int8jit's
# next window (two-thread rows at 0.3-0.7x that ran 0.9-1.3x without it). This count
# keeps a side's workers awake between its own back-to-back calls (microseconds apart)
# and asleep within about a millisecond of its window's end. A user's setting stays.
GOMP_SPINCOUNT = "10000"


def measure_interleaved(series: list[Series], min_time: float, min_rounds: int, peak=None,
                        settle: float = 0.0) -> None:
    """Rounds of one window per series (oneDNN's first), then the peak loop's window."""
    series = sorted(series, key=lambda s: not s.remote)
    rounds = 0
    while rounds < min_rounds or min(s.total for s in series) < min_time:
        for i, s in enumerate(series):
            if settle and i and series[i - 1].remote and not s.remote:
                time.sleep(settle)
            s.window()
        if peak is not None:
            if settle and series[-1].remote:
                time.sleep(settle)
            peak.window()
        rounds += 1
        if rounds >= 1000:
            break


def _local_timed(call):
    return lambda n: _timed(call, n)


def _first_call_s(timed) -> float:
    timed(1)  # warm-up
    return timed(1)


# ------------------------------------------------------------------ results

@dataclass
class Result:
    bench: str
    case: dict
    threads: int
    isa: str
    int8jit_s: float | None = None
    onednn_s: float | None = None
    int8jit_plain_s: float | None = None
    onednn_plain_s: float | None = None
    peak: float | None = None  # GOPS per core
    noise: float | None = None
    check: str = ""
    impl_int8jit: str = ""
    impl_onednn: str = ""
    notes: list = field(default_factory=list)
    torch_s: float | None = None  # conv: PyTorch's quantized conv2d
    steal: float | None = None  # the hypervisor's share of the row's CPU time (host_steal_counters)

    @property
    def torch_ratio(self):
        return None if self.int8jit_s is None or self.torch_s is None else self.torch_s / self.int8jit_s

    def gops(self, seconds):
        n = ops(self.case)
        return None if seconds is None or not n else n / seconds / 1e9

    def gbs(self, seconds):
        return None if seconds is None else pool_bytes(self.case) / seconds / 1e9

    def pct(self, seconds):
        g = self.gops(seconds)
        return None if g is None or not self.peak else 100.0 * g / (self.peak * self.threads)

    @property
    def ratio(self):
        if self.int8jit_s is None or self.onednn_s is None:
            return None
        return self.onednn_s / self.int8jit_s

    @staticmethod
    def overhead(fused, plain):
        return None if fused is None or plain is None else 100.0 * (fused / plain - 1.0)


def _f(value, spec):
    return "n/a" if value is None else format(value, spec)


def columns(bench: str, label_width: int = 26):
    """(header, width, right-aligned, getter) of each printed column."""
    ms = lambda s: _f(None if s is None else 1e3 * s, ".3f")  # noqa: E731
    cols = [("problem", label_width, False, lambda r: r.case["label"])]
    if bench in ("matmul", "ip"):
        cols.append(("MxNxK", 15, False, lambda r: f"{r.case['M']}x{r.case['N']}x{r.case['K']}"))
    else:
        cols.append(("N", 2, True, lambda r: str(r.case["N"])))
    cols.append(("thr", 3, True, lambda r: str(r.threads)))
    cols += [("int8jit ms", 10, True, lambda r: ms(r.int8jit_s))]
    if bench == "pool":
        cols += [("GB/s", 6, True, lambda r: _f(r.gbs(r.int8jit_s), ".1f")),
                 ("oneDNN ms", 9, True, lambda r: ms(r.onednn_s)),
                 ("GB/s", 6, True, lambda r: _f(r.gbs(r.onednn_s), ".1f"))]
    else:
        cols += [("GOPS", 6, True, lambda r: _f(r.gops(r.int8jit_s), ".1f")),
                 ("%pk", 4, True, lambda r: _f(r.pct(r.int8jit_s), ".0f")),
                 ("oneDNN ms", 9, True, lambda r: ms(r.onednn_s)),
                 ("GOPS", 6, True, lambda r: _f(r.gops(r.onednn_s), ".1f")),
                 ("%pk", 4, True, lambda r: _f(r.pct(r.onednn_s), ".0f"))]
    cols.append(("ratio", 5, True, lambda r: _f(r.ratio, ".2f")))
    if bench == "conv":
        cols += [("torch ms", 8, True, lambda r: "-" if r.torch_s is None else ms(r.torch_s)),
                 ("/torch", 6, True, lambda r: "-" if r.torch_ratio is None else _f(r.torch_ratio, ".2f"))]
    if bench in ("matmul", "ip"):
        cols += [("s32 ms", 7, True, lambda r: ms(r.int8jit_plain_s)),
                 ("ovh%", 5, True, lambda r: _f(r.overhead(r.int8jit_s, r.int8jit_plain_s), "+.0f")),
                 ("dnn ovh%", 8, True, lambda r: _f(r.overhead(r.onednn_s, r.onednn_plain_s), "+.0f"))]
    cols += [("noise", 5, True, lambda r: _f(None if r.noise is None else 100 * r.noise, ".0f") + "%"),
             ("steal", 5, True, lambda r: _f(None if r.steal is None else 100 * r.steal, ".0f") + "%"),
             ("check", 10, False, lambda r: r.check),
             ("note", 0, False, lambda r: "; ".join(r.notes))]
    return cols


def format_row(cols, r) -> str:
    cells = []
    for name, w, right, get in cols:
        cell = get(r)
        cells.append(cell.rjust(w) if right else cell.ljust(w))
    return "  ".join(cells).rstrip()


def format_header(cols) -> str:
    return "  ".join(name.rjust(w) if right else name.ljust(w) for name, w, right, _ in cols).rstrip()


def write_csv(path, bench, results) -> None:
    keys = sorted({k for r in results for k in r.case if k != "label"})
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["bench", "problem", *keys, "threads", "isa", "int8jit_ms", "onednn_ms", "int8jit_gops",
                    "onednn_gops", "int8jit_gbs", "onednn_gbs", "peak_gops_per_core", "int8jit_pct_peak",
                    "onednn_pct_peak", "ratio", "int8jit_plain_ms", "onednn_plain_ms", "int8jit_overhead_pct",
                    "onednn_overhead_pct", "noise_pct", "steal_pct", "check", "int8jit_impl", "onednn_impl", "note"]
                   + (["torch_ms", "int8jit_over_torch"] if bench == "conv" else []))
        rnd = lambda x, d=4: None if x is None else round(x, d)  # noqa: E731
        ms = lambda s: rnd(None if s is None else 1e3 * s, 5)  # noqa: E731
        for r in results:
            pool = bench == "pool"
            w.writerow([bench, r.case["label"], *[r.case.get(k) for k in keys], r.threads, r.isa, ms(r.int8jit_s),
                        ms(r.onednn_s), rnd(r.gops(r.int8jit_s)), rnd(r.gops(r.onednn_s)),
                        rnd(r.gbs(r.int8jit_s)) if pool else None, rnd(r.gbs(r.onednn_s)) if pool else None,
                        rnd(r.peak), rnd(r.pct(r.int8jit_s)), rnd(r.pct(r.onednn_s)), rnd(r.ratio),
                        ms(r.int8jit_plain_s), ms(r.onednn_plain_s),
                        rnd(r.overhead(r.int8jit_s, r.int8jit_plain_s)), rnd(r.overhead(r.onednn_s, r.onednn_plain_s)),
                        rnd(None if r.noise is None else 100 * r.noise),
                        rnd(None if r.steal is None else 100 * r.steal), r.check, r.impl_int8jit, r.impl_onednn,
                        "; ".join(r.notes)] + ([ms(r.torch_s), rnd(r.torch_ratio)] if bench == "conv" else []))


def markdown_table(cols, results) -> list[str]:
    names = [c[0] for c in cols]
    lines = ["| " + " | ".join(names) + " |",
             "| " + " | ".join("---:" if c[2] else "---" for c in cols) + " |"]
    for r in results:
        lines.append("| " + " | ".join(c[3](r).replace("|", "/") for c in cols) + " |")
    return lines


# ------------------------------------------------------------------ the machine

def best_isa() -> str:
    from tools.bench import supported_isas

    isas = supported_isas()
    return isas[-1] if isas else "avx2"


class Peak:
    """The path's register-only loop (:mod:`jit.peak`), timed in short windows between
    the problems' windows; the best window so far is the machine's single-core peak."""

    WINDOW_S = 0.002

    def __init__(self, isa: str):
        from jit.dot import path_for
        from jit.peak import ops_per_iteration, peak_kernel
        from runtime.isa import cpu_supports

        if not cpu_supports(isa):
            raise Unavailable(f"this CPU cannot run the {isa} peak loop")
        self.kernel = peak_kernel(isa)  # held: self.fn is its bare function pointer
        self.fn = self.kernel.function
        self.per_iteration = ops_per_iteration(path_for(isa, None))
        self.fn(1000)
        n = 1000
        while True:  # calibrate one window
            t0 = time.perf_counter()
            self.fn(n)
            dt = time.perf_counter() - t0
            if dt > self.WINDOW_S / 4:
                break
            n *= 4
        self.n = max(1, int(n * self.WINDOW_S / dt))
        self.best = 0.0
        for _ in range(5):
            self.window()

    def window(self) -> None:
        t0 = time.perf_counter()
        self.fn(self.n)
        self.best = max(self.best, self.n * self.per_iteration / (time.perf_counter() - t0) / 1e9)


def make_peak(isa: str):
    try:
        return Peak(isa)
    except Exception as exc:
        print(f"  (peak of {isa} unavailable: {exc})", file=sys.stderr)
        return None


# ------------------------------------------------------------------ driver

def _check_outputs(a: np.ndarray, b: np.ndarray) -> str:
    if a.shape != b.shape:
        return f"shape {a.shape}/{b.shape}"
    d = np.abs(a.astype(np.int64) - b.astype(np.int64))
    bad = int(np.count_nonzero(d))
    return "=" if bad == 0 else f"{bad} (<={int(d.max())})"


def host_steal_counters(cpus=None) -> tuple[int, int] | None:
    """(steal, total) jiffies of ``cpus`` (default: all) from /proc/stat, None where the
    kernel does not say. On a virtual machine, steal is the time the hypervisor ran
    something else while a vCPU wanted to run: a row timed under heavy steal measures the
    host's other tenants as much as the code (here, at times, 20-60% of both vCPUs)."""
    try:
        with open("/proc/stat") as f:
            lines = [line.split() for line in f if line.startswith("cpu")]
    except OSError:
        return None
    wanted = {f"cpu{c}" for c in cpus} if cpus is not None else {"cpu"}
    steal = total = 0
    for fields in lines:
        if fields[0] in wanted and len(fields) > 8:
            values = [int(v) for v in fields[1:9]]  # user .. steal (guest time is inside user)
            steal += values[7]
            total += sum(values)
    return (steal, total) if total else None


def steal_fraction(before, after) -> float | None:
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def measure_with_steal(series, min_time, min_rounds, peak, threads) -> float | None:
    """:func:`measure_interleaved` (with the settle pause of rows of several threads);
    returns the host's steal over the rounds on the cores this process may use."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    before = host_steal_counters(cpus)
    measure_interleaved(series, min_time, min_rounds, peak, SETTLE_S if threads > 1 else 0.0)
    return steal_fraction(before, host_steal_counters(cpus))


def run_problem(server, case, variants, isa, threads, min_time, min_rounds, check: bool, peak=None) -> Result:
    r = Result(case["prim"], case, threads, isa)
    series = {}
    outputs = {}
    for variant in variants:
        tag = "" if variant == "fused" else f" ({variant})"
        if server is not None:
            try:
                remote = RemoteSide(server, f"{variant}", case, variant)
                if variant == "fused":
                    r.impl_onednn = remote.impl
                    outputs["onednn"] = remote
                t = remote.timed
                series[("onednn", variant)] = Series(t, _first_call_s(t), remote=True)
            except Unavailable as exc:
                r.notes.append(f"{exc}{tag}")
        try:
            side = int8jit_setup(case, variant, isa, threads)
            if variant == "fused":
                r.impl_int8jit = side.impl
                outputs["int8jit"] = side.out
            t = _local_timed(side.call)
            series[("int8jit", variant)] = Series(t, _first_call_s(t))
        except Unavailable as exc:
            r.notes.append(f"{exc}{tag}")
        except Exception as exc:
            r.notes.append(f"int8jit error{tag}: {type(exc).__name__}: {exc}")
    torch_side = None
    if case["prim"] == "conv":
        try:
            torch_side = torch_conv_setup(case, threads)
            t = _local_timed(torch_side.call)
            # remote=True: its windows run first and (2+ threads) the settle pause follows
            # them, as torch's own OpenMP workers spin after its calls like libgomp's do.
            series[("torch", "fused")] = Series(t, _first_call_s(t), remote=True)
        except Unavailable:
            pass
        except Exception as exc:
            r.notes.append(f"torch error: {type(exc).__name__}: {exc}")
    if series:
        r.steal = measure_with_steal(list(series.values()), min_time, min_rounds, peak, threads)
    r.peak = None if peak is None else peak.best
    for (who, variant), s in series.items():
        attr = f"{who}_s" if variant == "fused" else f"{who}_plain_s"
        setattr(r, attr, s.best)
    fused = [s.noise for (who, v), s in series.items() if v == "fused" and who != "torch"]
    r.noise = max(fused) if fused else None
    if check and "onednn" in outputs and outputs.get("int8jit") is not None:
        # int8jit's call just ran last; oneDNN's output is the one of its last call too.
        r.check = _check_outputs(outputs["int8jit"], outputs["onednn"].output())
    elif check and case["prim"] == "pool" and "onednn" in outputs:
        from primitives.pooling_ref import pooling_ref

        ref = pooling_ref(pool_src(case), case["alg"], (case["K"],) * 2, (case["S"],) * 2, (case["P"],) * 2,
                          (case["P"],) * 2)
        r.check = "ref " + _check_outputs(ref, outputs["onednn"].output())
    if check and torch_side is not None and outputs.get("int8jit") is not None:
        r.notes.append(f"torch {_check_outputs(outputs['int8jit'], torch_side.output())} ({torch_side.impl})")
    if server is not None:
        try:
            server.request(op="free")
        except Unavailable:
            pass
        if server.note and server.note not in r.notes:
            r.notes.append(server.note)
    return r


def run_chain(server, cases, isa, threads, min_time, min_rounds) -> tuple[dict, float | None]:
    """({side: best seconds of one pass}, steal) for ``cases`` called one after another,
    as a network calls its layers: each call follows another layer's, which has pushed
    this one's code, Python objects and weights out of the caches. A loop over one layer
    keeps them all warm; per-call costs that only show cold show here."""
    sides = [int8jit_setup(case, "fused", isa, threads) for case in cases]
    chains = {"int8jit": _in_turn([side.call for side in sides])}
    if all(side.bind for side in sides):
        chains["bound"] = _in_turn([side.bind() for side in sides])
    series = {who: Series(_local_timed(chain), _first_call_s(_local_timed(chain))) for who, chain in chains.items()}
    if server is not None:
        ids = [f"chain{i}" for i in range(len(cases))]
        for ident, case in zip(ids, cases):
            RemoteSide(server, ident, case, "fused")

        def theirs(n):
            return server.request(op="chain", ids=ids, n=n)["s"]
        series["onednn"] = Series(theirs, _first_call_s(theirs), remote=True)
    steal = measure_with_steal(list(series.values()), min_time, min_rounds, None, threads)
    if server is not None:
        server.request(op="free")
    return {who: s.best for who, s in series.items()}, steal


def chain_table(groups, isa, threads, min_time, min_rounds) -> list[str]:
    """Print (and return as markdown) one row per chain (``groups``: (name, cases)) and
    thread count."""
    print(f"\nchains (ISA path {isa}): the layers called one after another, best pass of interleaved windows")
    print("  bound: the same int8jit chain through Primitive.bind's calls (set up once, no per-call checks)")
    width = max(len(name) for name, _ in groups)
    print(f"{'chain':<{width}}  {'calls':>5}  {'threads':>7}  {'int8jit ms':>10}  {'oneDNN ms':>9}  {'ratio':>5}  "
          f"{'bound ms':>8}  {'ratio':>5}  {'steal':>5}  note")
    md = ["", f"chains, ISA path {isa}", "", "| chain | calls | threads | int8jit ms | oneDNN ms | ratio | "
          "int8jit bound ms | ratio | steal |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for nthreads in threads:
        pinned = _pin(nthreads)
        server, note = None, ""
        try:
            server = OneDNNServer(isa, nthreads)
        except Unavailable as exc:
            note = str(exc)
        try:
            for name, cases in groups:
                best, steal = run_chain(server, cases, isa, nthreads, min_time, min_rounds)
                ours, theirs, bound = best["int8jit"], best.get("onednn"), best.get("bound")
                cells = [_f(ours * 1e3, ".3f"), _f(theirs and theirs * 1e3, ".3f"), _f(theirs and theirs / ours, ".2f"),
                         _f(bound and bound * 1e3, ".3f"), _f(theirs and bound and theirs / bound, ".2f"),
                         _f(steal and 100 * steal, ".1f")]
                print(f"{name:<{width}}  {len(cases):>5}  {nthreads:>7}  {cells[0]:>10}  {cells[1]:>9}  {cells[2]:>5}  "
                      f"{cells[3]:>8}  {cells[4]:>5}  {cells[5]:>5}  {note}", flush=True)
                md.append(f"| {name} | {len(cases)} | {nthreads} | {' | '.join(cells)} |")
        finally:
            if server is not None:
                server.close()
            _unpin(pinned)
    return md


def chain_groups(bench, problems, args) -> list[tuple[str, list]]:
    """The chains ``--chain`` times: the selected layers in order (per policy, and per
    batch for conv), or by default a network's, per policy asked for: ResNet-50's 53
    convolutions, BERT-base's 72 linears."""
    weights = getattr(args, "weights", "uniform")
    named = lambda what, p: what + ("" if p == "exact" else f", {p}") + (  # noqa: E731
        "" if weights == "uniform" else f", {weights} weights")
    if bench == "conv" and not args.layers:
        by = {c["label"]: c for c in CONV_LAYERS}
        return [(named(f"ResNet-50 convolutions, batch {n}", p),
                 [with_policy(dict(by[label], prim="conv", N=n), p, weights) for label in RESNET50_SEQUENCE])
                for p in policies(bench, args) for n in sorted({c["N"] for c in problems})]
    if bench != "conv" and not args.shapes:
        by = {c["label"]: c for c in GEMM_SHAPES}
        return [(named(f"BERT-base linears, {t} tokens", p),
                 [with_policy(dict(by[f"BERT-{t} {part}"], prim=bench), p, weights) for part in BERT_LAYER]
                 * 12)
                for p in policies(bench, args) for t in (128, 384)]
    groups: dict[tuple, list] = {}
    for c in problems:
        groups.setdefault((c.get("policy", "exact"), c["N"] if bench == "conv" else None), []).append(c)
    return [(named(f"{len(cases)} layers, batch {n}" if bench == "conv" else f"{len(cases)} products", p), cases)
            for (p, n), cases in groups.items()]


def policies(bench, args) -> list[str]:
    """The overflow policies ``--policy`` names (default: exact alone)."""
    from primitives.attr import POLICIES

    known = POLICIES if bench == "conv" else tuple(p for p in POLICIES if p != "halve_weights")
    wanted = [p.strip() for p in (getattr(args, "policy", None) or "exact").split(",") if p.strip()]
    bad = [p for p in wanted if p not in known]
    if bad or not wanted:
        raise SystemExit(f"--policy: unknown {bad}; expected some of {', '.join(known)}")
    return wanted


def with_policy(case: dict, policy: str, weights: str = "uniform") -> dict:
    """``case`` run under int8jit's ``policy`` on ``weights`` (matmul, ip): labelled with
    each unless it is the default (exact, uniform)."""
    tags = ([] if policy == "exact" else [policy]) + ([] if weights == "uniform" else [f"{weights} weights"])
    label = case["label"] + (f" [{', '.join(tags)}]" if tags else "")
    return dict(case, policy=policy, label=label, **({} if weights == "uniform" else {"weights": weights}))


def _select(items, wanted, what):
    if not wanted:
        return items
    names = [w.strip() for w in wanted.split(",") if w.strip()]
    by = {c["label"]: c for c in items}
    bad = [n for n in names if n not in by]
    if bad:
        raise SystemExit(f"unknown {what} {bad}; expected some of: {'; '.join(by)}")
    return [by[n] for n in names]


def problems_for(bench, args) -> list[dict]:
    weights = getattr(args, "weights", "uniform")  # (pool has no --weights)
    if bench in ("matmul", "ip"):
        if args.shapes:
            items = []
            for text in args.shapes.split(","):
                try:
                    M, N, K = (int(x) for x in text.lower().split("x"))
                except ValueError:
                    raise SystemExit(f"--shapes: expected MxNxK, got {text!r}") from None
                items.append(_fc(f"{M}x{N}x{K}", M, N, K))
        else:
            items = [c for c in GEMM_SHAPES if not args.quick or c["label"] in GEMM_QUICK]
        return [with_policy(dict(c, prim=bench), p, weights) for p in policies(bench, args) for c in items]
    if bench == "conv":
        items = _select(CONV_LAYERS, args.layers, "layer") if args.layers else \
            [c for c in CONV_LAYERS if not args.quick or c["label"] in CONV_QUICK]
        batches = [int(b) for b in args.batch.split(",")] if args.batch else ([1] if args.quick else [1, 8])
        return [with_policy(dict(c, prim="conv", N=n), p, weights)
                for p in policies(bench, args) for n in batches for c in items]
    items = _select(POOL_CASES, args.layers, "case") if args.layers else \
        [c for c in POOL_CASES if not args.quick or c["label"] in POOL_QUICK]
    return [dict(c, prim="pool") for c in items]


def creation_times(bench, problems, isa, server, quick) -> list[tuple]:
    """[(case, {column: ms}, notes)] for the fused problems: int8jit cold and from the disk
    cache, oneDNN's first creation in a fresh process and with its primitive cache off."""
    from tools import onednn

    rows = []
    with tempfile.TemporaryDirectory(prefix="int8jit-bench-cache-") as cache:
        env_disk = dict(os.environ, INT8JIT_CACHE_DIR=cache, INT8JIT_DISK_CACHE="1")
        env_cold = dict(os.environ, INT8JIT_DISK_CACHE="0")
        fill = _worker_run("_create-worker", {"cases": problems, "isa": isa}, env_disk)  # fills the folder
        for case in problems:
            notes, ms = [], {}
            one = {"cases": [case], "isa": isa}
            disk = _worker_run("_create-worker", one, env_disk)
            if not isinstance(disk, str) and disk[-1]:
                # A kernel missing from the folder (a jit/ source changed since it was
                # filled: the key holds their digest): this run filled it, time another.
                disk = _worker_run("_create-worker", one, env_disk)
                if not isinstance(disk, str) and disk[-1]:
                    notes.append(f"disk: {disk[-1]} kernels generated (not found in the cache)")
            got = {"cold": _worker_run("_create-worker", one, env_cold), "disk": disk,
                   "dnn fresh": _worker_run("_onednn-create", one, onednn.child_env(isa, 1)),
                   "fill": fill}
            for what, value in got.items():
                if isinstance(value, str):
                    notes.append(f"{what}: {value}")
                elif what != "fill":
                    ms[what] = value[0]
            if server is not None:
                try:
                    ms["dnn warm"] = server.request(op="creation", case=case, variant="fused",
                                                    repeats=2 if quick else 3)["ms"]
                except Unavailable as exc:
                    notes.append(str(exc))
            rows.append((case, ms, notes))
    return rows


def _worker_run(mode, spec, env):
    env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "tools.bench_primitives", mode, json.dumps(spec)],
                          env=env, cwd=REPO_ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        return f"worker failed ({proc.returncode}): {proc.stderr.strip()[-200:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out.get("error"):
        return out["error"]
    return out["ms"] + [out.get("generated", 0)]


def _create_worker(spec_json) -> None:
    """Fresh process: import first, then time the creation of each case's fused primitive."""
    import gc
    import importlib
    import pkgutil

    spec = json.loads(spec_json)
    # Imports are not creation (oneDNN's side loads its library before the clock too):
    # every module of the library, PeachPy, and the CPU probe's first answer.
    for pkg in ("runtime", "jit", "primitives"):
        for mod in pkgutil.iter_modules([str(REPO_ROOT / pkg)]):
            try:
                importlib.import_module(f"{pkg}.{mod.name}")
            except Exception:  # noqa: BLE001  (a module under construction elsewhere)
                pass
    try:
        import peachpy.x86_64  # noqa: F401
    except ImportError:
        pass
    from runtime.isa import supported

    supported()
    from jit import cache

    # Nor is the collection the imports' 50k objects are due for: without this, whatever
    # allocates first pays a full collection (~15 ms), here the first creation.
    gc.collect()
    times = []
    try:
        for case in spec["cases"]:
            times.append(int8jit_setup(case, "fused", spec["isa"], 1).create_ms)
        print(json.dumps({"ms": times, "generated": cache.stats.get("generated", 0)}))
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
    sys.stdout.flush()


def _onednn_create(spec_json) -> None:
    """Fresh oneDNN process: engine first (library start-up), then time each creation."""
    from tools import onednn_prim as dp

    spec = json.loads(spec_json)
    try:
        dp.engine()
        import gc

        gc.collect()  # as on int8jit's side: the imports' collection is not creation
        times = [onednn_setup(case, "fused").create_ms for case in spec["cases"]]
        print(json.dumps({"ms": times}))
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
    sys.stdout.flush()
    os._exit(0)


def _pin(nthreads: int):
    """Pin this process, and so the oneDNN child started next, to its first ``nthreads``
    allowed CPUs; returns the mask to restore (None: nothing pinned).

    On a shared host the cores are not alike: a neighbour's load lands on one core and
    not the other. Unpinned, the two sides of a single-thread row could run on different
    cores, and their ratio moved by up to 0.3 between runs; on one core it moves by a few
    percent.
    """
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if nthreads >= len(allowed):
        return None
    os.sched_setaffinity(0, allowed[:nthreads])
    return allowed


def _unpin(allowed) -> None:
    if allowed is not None:
        os.sched_setaffinity(0, allowed)


def run(bench: str, argv=None) -> int:
    ap = argparse.ArgumentParser(prog=f"int8jit-bench {bench}", description=COMMAND_HELP[bench])
    ap.add_argument("--isa", help=f"comma-separated ISA paths ({', '.join(LADDER)}); default: the CPU's best")
    ap.add_argument("--threads", help="comma-separated thread counts (default: 1 and all cores)")
    if bench in ("matmul", "ip"):
        ap.add_argument("--shapes", help="comma-separated MxNxK (default: the issue's list)")
        ap.add_argument("--no-creation", action="store_true", help="skip the creation-time table")
    else:
        ap.add_argument("--layers", help="comma-separated problem names (default: the whole list)")
    if bench == "conv":
        ap.add_argument("--batch", help="comma-separated batch sizes (default 1,8; --quick: 1)")
    if bench in ("conv", "matmul", "ip"):
        ap.add_argument("--weights", choices=("uniform", "trained"), default="uniform",
                        help="the weights both sides get: uniform over the s8 range (default), or trained-like "
                             "(Laplacian, quantized per output channel to +-127: a few large values, which exact "
                             "splits into residual cells on avx2 and avx512_core instead of widening)")
        ap.add_argument("--policy", help="comma-separated overflow policies of int8jit's rows (exact, faithful"
                                         + (", halve_weights" if bench == "conv" else "") + "; default exact). On "
                                         "avx2 and avx512_core oneDNN saturates: faithful computes what it "
                                         "computes, exact widens (the weights are full range); a policy other "
                                         "than exact is named in the row's label")
        ap.add_argument("--chain", action="store_true",
                        help="time the layers called one after another, as a network calls them, instead of each "
                             "on its own (default: ResNet-50's 53 convolutions in order; BERT-base's 72 linears)")
    ap.add_argument("--min-time", type=float, help="seconds of timed calls per side and problem")
    ap.add_argument("--quick", action="store_true", help="a smaller set and shorter timings")
    ap.add_argument("--no-check", action="store_true", help="do not compare the two sides' outputs")
    ap.add_argument("--csv", metavar="FILE", help="also write the rows as CSV")
    ap.add_argument("--markdown", metavar="FILE", help="also write the tables as markdown")
    args = ap.parse_args(argv)
    # (before PyTorch's libgomp starts, and copied into the oneDNN children's environment)
    os.environ.setdefault("GOMP_SPINCOUNT", GOMP_SPINCOUNT)

    from tools import onednn
    from tools.bench import cpu_brand, supported_isas

    cores = os.cpu_count() or 1
    threads = [int(t) for t in args.threads.split(",")] if args.threads else sorted({1, cores})
    isas = [i.strip() for i in args.isa.split(",")] if args.isa else [best_isa()]
    bad = [i for i in isas if i not in LADDER]
    if bad:
        raise SystemExit(f"unknown ISA {bad}; expected some of {', '.join(LADDER)}")
    min_time = args.min_time if args.min_time is not None else (0.03 if args.quick else 0.1)
    min_rounds = 3 if args.quick else 5
    problems = problems_for(bench, args)
    variants = ["fused", "plain"] if bench in ("matmul", "ip") else ["fused"]
    ok, why = onednn.available()
    head = [f"machine: {cpu_brand()}, {cores} cores; ISA paths here: {', '.join(supported_isas())}; "
            f"load average {os.getloadavg()[0]:.2f} (other work on the cores skews the figures)",
            f"oneDNN:  {onednn.version() + ' from ' + str(onednn.library_path()) if ok else why}",
            f"timing:  interleaved windows, best of >= {min_rounds} and >= {min_time:g} s per side; "
            f"ratio = int8jit GOPS / oneDNN GOPS; rows of fewer threads than cores run every side (and the peak) "
            f"on the same first cores; GOMP_SPINCOUNT={os.environ['GOMP_SPINCOUNT']} for oneDNN's and PyTorch's "
            f"OpenMP workers"]
    for line in head:
        print(line)
    md = [f"`int8jit-bench {bench}`", "", *[f"- {line}" for line in head]]
    results: list[Result] = []
    cols = columns(bench, max([26] + [len(c["label"]) for c in problems]))
    t_start = time.perf_counter()
    if getattr(args, "chain", False):
        groups = chain_groups(bench, problems, args)
        for isa in isas:
            md += chain_table(groups, isa, threads, min_time, min_rounds)
        if args.markdown:
            Path(args.markdown).write_text("\n".join(md) + "\n")
            print(f"wrote {args.markdown}")
        return 0
    for isa in isas:
        peak = make_peak(isa) if bench != "pool" else None
        print(f"\nISA path {isa}: oneDNN capped at {isa.upper()}; peak so far "
              f"{_f(peak and peak.best, '.1f')} GOPS per core (register-only loop, timed between windows)\n")
        print(format_header(cols), flush=True)
        block: list[Result] = []
        for nthreads in threads:
            server = None
            pinned = _pin(nthreads)
            try:
                server = OneDNNServer(isa, nthreads)
            except Unavailable as exc:
                server_note = str(exc)
            else:
                server_note = ""
            try:
                for case in problems:
                    r = run_problem(server, case, variants, isa, nthreads, min_time, min_rounds, not args.no_check,
                                    peak)
                    if server_note:
                        r.notes.append(server_note)
                    print(format_row(cols, r), flush=True)
                    block.append(r)
            finally:
                if server is not None:
                    server.close()
                _unpin(pinned)
        if peak is not None:  # the best window of the whole run counts in the CSV and markdown
            changed = any(r.peak != peak.best for r in block)
            for r in block:
                r.peak = peak.best
            if changed:
                print(f"(peak, best window of the run: {peak.best:.1f} GOPS per core; rows above used the best "
                      "so far, the CSV and markdown use this one)")
        results += block
        md += ["", f"ISA path {isa}, peak {_f(peak and peak.best, '.1f')} GOPS per core", "",
               *markdown_table(cols, block)]
        if bench in ("matmul", "ip") and not args.no_creation:
            md += creation_table(bench, problems, isa, args.quick)
    print(f"\n({time.perf_counter() - t_start:.0f} s)")
    if args.csv:
        write_csv(args.csv, bench, results)
        print(f"wrote {len(results)} rows to {args.csv}")
    if args.markdown:
        Path(args.markdown).write_text("\n".join(md) + "\n")
        print(f"wrote {args.markdown}")
    return 0


CREATION_COLUMNS = ("cold", "disk", "dnn fresh", "dnn warm")


def creation_table(bench, problems, isa, quick) -> list[str]:
    """Print (and return as markdown) the creation-time table of ``problems``."""
    if quick:
        problems = problems[:2]
    print("\nprimitive creation (the fused problem; pd + primitive, weights reorder excluded; imports and the CPU\n"
          "probe / oneDNN's engine before the clock), ms:\n"
          "  cold: int8jit in a fresh process, INT8JIT_DISK_CACHE=0;  disk: a fresh process, the disk cache\n"
          "  filled by another;  dnn fresh: oneDNN's first creation in a fresh process (after its engine);\n"
          "  dnn warm: oneDNN in a process that made others, its primitive cache off (best of 3)")
    server = None
    try:
        server = OneDNNServer(isa, 1)
    except Unavailable as exc:
        print(f"  ({exc})")
    try:
        rows = creation_times(bench, problems, isa, server, quick)
    finally:
        if server is not None:
            server.close()
    print(f"{'problem':<26}  {'MxNxK':<15}  " + "  ".join(f"{c:>9}" for c in CREATION_COLUMNS) + "  note")
    md = ["", "primitive creation, ms", "", "| problem | MxNxK | int8jit cold | int8jit disk cache | oneDNN fresh "
          "process | oneDNN warm, cache off | note |", "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for case, ms, notes in rows:
        shape = f"{case['M']}x{case['N']}x{case['K']}"
        cells = [_f(ms.get(c), ".2f") for c in CREATION_COLUMNS]
        print(f"{case['label']:<26}  {shape:<15}  " + "  ".join(f"{c:>9}" for c in cells) + f"  {'; '.join(notes)}",
              flush=True)
        md.append(f"| {case['label']} | {shape} | {' | '.join(cells)} | {'; '.join(notes)} |")
    return md


COMMAND_HELP = {
    "matmul": "int8 matmul (u8 x s8 -> u8, fused scales/bias/relu) vs oneDNN's matmul",
    "ip": "int8 inner product (u8 x s8 -> u8, fused scales/bias/relu) vs oneDNN's inner product",
    "conv": "int8 convolution (ResNet-50, MobileNet-v2 depthwise; NHWC u8) vs oneDNN's",
    "pool": "int8 max/avg pooling (NHWC u8) vs oneDNN's",
}


def bench_matmul(argv=None) -> int:
    return run("matmul", argv)


def bench_ip(argv=None) -> int:
    return run("ip", argv)


def bench_conv(argv=None) -> int:
    return run("conv", argv)


def bench_pool(argv=None) -> int:
    return run("pool", argv)


class _Command:
    """A registry entry for tools.bench's BENCHES: ``main(argv)`` runs the command."""

    types: tuple = ()

    def __init__(self, name):
        self.name = name
        self.__doc__ = COMMAND_HELP[name]

    def main(self, argv=None) -> int:
        return run(self.name, argv)

    @property
    def shapes(self):
        # Reached only when tools.bench's main() hands this entry to its GEMM driver
        # (run_bench) instead of calling main(argv): say what is missing.
        raise SystemExit(f"int8jit-bench {self.name}: tools/bench.py's main() must dispatch entries that have a "
                         f"main(argv) to it (BENCHES[name].main(argv[1:])); meanwhile run "
                         f"`python -m tools.bench_primitives {self.name} ...`")


MatmulCommand, IpCommand, ConvCommand, PoolCommand = (_Command(n) for n in ("matmul", "ip", "conv", "pool"))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_onednn-server"]:
        _server()
        return 0
    if argv[:1] == ["_create-worker"]:
        _create_worker(argv[1])
        return 0
    if argv[:1] == ["_onednn-create"]:
        _onednn_create(argv[1])
        return 0
    if not argv or argv[0] not in COMMAND_HELP:
        print(f"usage: python -m tools.bench_primitives {{{','.join(COMMAND_HELP)}}} [options]", file=sys.stderr)
        return 2
    return run(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
