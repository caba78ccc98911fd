"""What ``int8jit-bench matmul / ip / conv / pool`` runs: the problems (BERT-base's and
ResNet-50's shapes, MobileNet-v2's depthwise layers, pooling), the command line's choice
among them, and their operands, the same values on every side and in every process.

>>> from tools.bench_problems import CONV_LAYERS, conv_out, ops
>>> case = dict(CONV_LAYERS[2], prim="conv", N=1)
>>> case["label"], conv_out(case), ops(case)
('res2 3x3 64->64', (56, 56), 231211008)
"""
from __future__ import annotations

import argparse
import json
from typing import Callable, Sequence

import numpy as np

from tools.cli import int_at_least


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


def _heads(label, M, N, K, wtag):
    """A batched matmul of BERT-base's 12 attention heads: runtime weights (keys or values,
    new at every input) with tag ``wtag`` (acb: the keys' rows, K contiguous; abc: the
    values' rows, N contiguous)."""
    return {"label": label, "M": M, "N": N, "K": K, "B": 12, "wtag": wtag, "runtime": True}


# (``int8jit-bench matmul --attention``: a sequence of 128 tokens, heads of 64)
ATTENTION = [
    _heads("attention QK^T 12x128", 128, 128, 64, "acb"), _heads("attention PV 12x128", 128, 64, 128, "abc"),
    _heads("decode q.K^T 12x1", 1, 128, 64, "acb"), _heads("decode p.V 12x1", 1, 64, 128, "abc"),
]


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


def _pool(label, alg, n, c, hw, k, s, p, d=None):
    """A pooling case: square windows (cubes where ``d``, the depth, is given: 3-D)."""
    case = {"label": label, "alg": alg, "N": n, "C": c, "H": hw, "W": hw, "K": k, "S": s, "P": p}
    return case if d is None else {**case, "D": d}


POOL_CASES = [
    _pool("max 3x3/2 64x112x112 b1", "max", 1, 64, 112, 3, 2, 1),
    _pool("max 3x3/2 64x112x112 b8", "max", 8, 64, 112, 3, 2, 1),
    _pool("avg_incl 3x3/2 64x112x112", "avg_include_padding", 1, 64, 112, 3, 2, 1),
    _pool("avg_excl 3x3/2 64x112x112", "avg_exclude_padding", 1, 64, 112, 3, 2, 1),
    _pool("global avg 7x7 2048 b1", "avg_exclude_padding", 1, 2048, 7, 7, 1, 0),
    _pool("global avg 7x7 2048 b8", "avg_exclude_padding", 8, 2048, 7, 7, 1, 0),
    # 3-D (video and volumetric networks: C3D's and 3-D U-Net's 2x2x2/2 max pooling)
    _pool("max 2x2x2/2 64x16x56x56", "max", 1, 64, 56, 2, 2, 0, d=16),
    _pool("avg_excl 3x3x3/2 32x16x56x56", "avg_exclude_padding", 1, 32, 56, 3, 2, 1, d=16),
]
POOL_QUICK = ["max 3x3/2 64x112x112 b1", "avg_excl 3x3/2 64x112x112", "global avg 7x7 2048 b1"]


def conv_out(case) -> tuple[int, int]:
    oh = (case["IH"] + 2 * case["P"] - case["KH"]) // case["S"] + 1
    ow = (case["IW"] + 2 * case["P"] - case["KW"]) // case["S"] + 1
    return oh, ow


def pool_spatial(case) -> tuple[int, ...]:
    """The source's spatial dims: (H, W), or (D, H, W) for a 3-D case."""
    return tuple(case[d] for d in ("D", "H", "W") if d in case)


def pool_out(case) -> tuple[int, ...]:
    return tuple((i + 2 * case["P"] - case["K"]) // case["S"] + 1 for i in pool_spatial(case))


def ops(case) -> int:
    """2 x multiply-adds of a problem (0 for pooling: it is reported in bytes)."""
    if case["prim"] in ("matmul", "ip"):
        return 2 * case.get("B", 1) * case["M"] * case["N"] * case["K"]
    if case["prim"] == "conv":
        oh, ow = conv_out(case)
        return 2 * case["N"] * oh * ow * case["OC"] * (case["IC"] // case["G"]) * case["KH"] * case["KW"]
    return 0


def pool_bytes(case) -> int:
    return case["N"] * case["C"] * (int(np.prod(pool_spatial(case))) + int(np.prod(pool_out(case))))


# ------------------------------------------------------------------ the command line's choice

def chain_groups(bench, problems, args) -> list[tuple[str, list]]:
    """The chains ``--chain`` times: the selected layers in order (per policy, and per
    batch for conv), or by default a network's, per policy asked for: ResNet-50's 53
    convolutions, BERT-base's 72 linears."""
    weights = getattr(args, "weights", "uniform")
    new = {"new_arrays": True} if getattr(args, "new_arrays", False) else {}  # (--new-arrays)
    named = lambda what, p: what + ("" if p == "exact" else f", {p}") + (  # noqa: E731
        "" if weights == "uniform" else f", {weights} weights") + (", new arrays" if new else "")
    if bench == "conv" and not args.layers:
        by = {c["label"]: c for c in CONV_LAYERS}
        return [(named(f"ResNet-50 convolutions, batch {n}", p),
                 [with_policy(dict(by[label], prim="conv", N=n, **new), p, weights) for label in RESNET50_SEQUENCE])
                for p in policies(bench, args) for n in sorted({c["N"] for c in problems})]
    if bench != "conv" and not args.shapes:
        by = {c["label"]: c for c in GEMM_SHAPES}
        return [(named(f"BERT-base linears, {t} tokens", p),
                 [with_policy(dict(by[f"BERT-{t} {part}"], prim=bench, **new), p, weights) for part in BERT_LAYER]
                 * 12)
                for p in policies(bench, args) for t in (128, 384)]
    groups: dict[tuple, list] = {}
    for c in problems:
        groups.setdefault((c.get("policy", "exact"), c["N"] if bench == "conv" else None), []).append(c)
    return [(named(f"{len(cases)} layers, batch {n}" if bench == "conv" else f"{len(cases)} products", p), cases)
            for (p, n), cases in groups.items()]


def known_policies(bench) -> tuple[str, ...]:
    """The overflow policies ``bench``'s int8jit rows take (halve_weights: convolution's)."""
    from primitives.attr import POLICIES

    return POLICIES if bench == "conv" else tuple(p for p in POLICIES if p != "halve_weights")


def policies(bench, args) -> list[str]:
    """The overflow policies ``--policy`` names (default: exact alone)."""
    known = known_policies(bench)
    wanted = [p.strip() for p in (getattr(args, "policy", None) or "exact").split(",") if p.strip()]
    bad = [p for p in wanted if p not in known]
    if bad or not wanted:
        raise SystemExit(f"--policy: unknown {bad}; expected some of {', '.join(known)}")
    return wanted


# argparse types of the commands' options (int8jit-bench, every command): a bad value is
# refused by the parser, in a line naming the option, exit status 2, before a child process
# starts or a row is timed (a thread count of 0 had timed rows of errors). The lists come
# back as text, blank items dropped, which the drivers split themselves.

def _items(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return items


def positive_ints(text: str) -> str:
    """``--threads 1,2``, ``--batch 1,8``: comma-separated integers >= 1."""
    items = _items(text)
    for item in items:
        _POSITIVE_ITEM(item)
    return ",".join(items)


_POSITIVE_ITEM = int_at_least(1, "comma-separated positive integers")


def shape_list(text: str) -> str:
    """``--shapes 64x4096x4096,...``: comma-separated MxNxK, each size >= 1 (a zero-volume
    problem runs no kernel: nothing to time)."""
    items = _items(text)
    for item in items:
        try:
            dims = [int(x) for x in item.lower().split("x")]
        except ValueError:
            dims = []
        if len(dims) != 3:
            raise argparse.ArgumentTypeError(f"expected MxNxK, got {item!r}")
        if min(dims) < 1:
            raise argparse.ArgumentTypeError(f"expected sizes >= 1 in MxNxK, got {item!r}")
    return ",".join(items)


def positive_seconds(text: str) -> float:
    """``--min-time``: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text}")
    return value


def names_among(known: Sequence[str], what: str) -> Callable[[str], str]:
    """An argparse type: comma-separated names among ``known`` (``--isa``, ``--policy``, ...)."""
    def parse(text: str) -> str:
        items = _items(text)
        bad = [x for x in items if x not in known]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(map(repr, bad))}; expected some of "
                                             f"{', '.join(known)}")
        return ",".join(items)
    return parse


def runnable_isas(text: str) -> str:
    """``--isa``: comma-separated ISA paths, each one this CPU runs (a path it lacks had
    run the next lower one under its name)."""
    from runtime.isa import LADDER, cpu_supports, supported

    items = names_among(LADDER, "ISA")(text).split(",")
    lacking = [x for x in items if not cpu_supports(x)]
    if lacking:
        raise argparse.ArgumentTypeError(f"this CPU cannot run {', '.join(lacking)} (it runs "
                                         f"{', '.join(supported()) or 'no int8jit path'})")
    return ",".join(items)


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
    problems = _problems_for(bench, args)
    if getattr(args, "new_arrays", False):  # int8jit's calls get new array objects (the same memory)
        problems = [dict(c, label=c["label"] + " [new arrays]", new_arrays=True) for c in problems]
    return problems


def _problems_for(bench, args) -> list[dict]:
    weights = getattr(args, "weights", "uniform")  # (pool has no --weights)
    if getattr(args, "attention", False):
        return [with_policy(dict(c, prim=bench), p, weights) for p in policies(bench, args) for c in ATTENTION]
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
        if getattr(args, "runtime_weights", False):  # plain weights passed at every call, on both sides
            items = [dict(c, label=c["label"] + " [runtime weights]", runtime=True) for c in items]
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


# ------------------------------------------------------------------ operands (the same on every side)

def _rng(case, what):
    # (the policy, and new array objects, are int8jit's choices, not the problem: the same operands)
    case = {k: v for k, v in case.items() if k not in ("policy", "new_arrays", "label")}
    key = [ord(c) for c in json.dumps(case, sort_keys=True)][:64] + [what]
    return np.random.default_rng(key)


def trained_weights(rng, shape: tuple, axis: int) -> np.ndarray:
    """Laplacian values quantized per output channel (``axis``) to +-127, as trained
    weights are: most small, a few large (on avx2/avx512_core exact splits them into
    residual cells, see ``--weights``)."""
    w = rng.laplace(size=shape)
    axis %= len(shape)
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
    """u8 A (M, K), s8 W (K, N) (a batch's: (B, M, K), (B, K, N)), bias, per-column
    weight scales, dst scale (src scale 1)."""
    M, N, K = case["M"], case["N"], case["K"]
    batch = (case["B"],) if "B" in case else ()
    rng = _rng({k: case[k] for k in ("M", "N", "K", "B") if k in case}, 0)
    A = rng.integers(0, 256, batch + (M, K), dtype=np.uint8)
    W, w_std = _case_weights(case, rng, rng.integers(-128, 128, batch + (K, N), dtype=np.int16).astype(np.int8),
                             axis=-1)
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
    return rng.integers(0, 256, (case["N"],) + pool_spatial(case) + (case["C"],), dtype=np.uint8)
