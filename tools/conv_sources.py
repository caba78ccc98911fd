"""int8jit-bench conv-sources: a convolution's ways of reading its source, timed in one process.

int8jit alone, the blocking model's A/B:

    int8jit-bench conv-sources --isa avx2 --layers 3x3 --variants model,copy,edges,strips
    int8jit-bench conv-sources --policy exact --layers "res5 3x3 512" --threads 2

For each ResNet-50 layer of ``int8jit-bench conv`` whose name contains one of
``--layers`` (comma-separated; depthwise layers left out), one primitive per variant:

* ``model``: what ``primitives.conv_blocking`` picks for this machine's caches;
* ``copy``: the padded copy of the whole source;
* ``strips``: the inside columns in place, the edge columns from padded strips;
* ``edges``: every column in place, the edge columns' windows cut at the padding.

A variant the layer cannot take (a 1x1 layer has no padding) falls back to what the
layer can do, as the primitive would. Each round times a window (about 5 ms of calls) of
each variant in turn (``tools.bench_timing.measure_calls``); a figure is the best window
(the least disturbed by the host), and the ratio is the first variant's time over this
one's (above 1: faster than the first). The outputs are compared: "OUTPUTS DIFFER" would
be a bug. This is how the README's edge and strip measurements were taken.
"""
from __future__ import annotations

import argparse
from contextlib import contextmanager

VARIANTS = ("model", "copy", "strips", "edges")


@contextmanager
def variant(name: str):
    """Make the convolutions created inside take ``name``'s way of reading the source."""
    import primitives.conv as conv

    patches = {"model": {}, "copy": {"strips_pay": False, "edges_pay": False},
               "strips": {"strips_pay": True, "edges_pay": False}, "edges": {"strips_pay": True, "edges_pay": True}}
    if name not in patches:
        raise ValueError(f"--variants: {name!r} is not one of {', '.join(VARIANTS)}")
    saved = {attr: getattr(conv, attr) for attr in patches[name]}
    for attr, answer in patches[name].items():
        setattr(conv, attr, lambda *args, _answer=answer: _answer)
    try:
        yield
    finally:
        for attr, value in saved.items():
            setattr(conv, attr, value)


def main(argv=None) -> int:
    import numpy as np

    from primitives import primitive_cache
    from runtime.isa import LADDER, effective_isa
    from tools.bench_problems import CONV_LAYERS, known_policies, names_among, positive_seconds, runnable_isas
    from tools.bench_sides import int8jit_setup
    from tools.bench_timing import measure_calls
    from tools.cli import int_at_least

    ap = argparse.ArgumentParser(prog="int8jit-bench conv-sources", description=__doc__.split("\n")[0])
    ap.add_argument("--isa", type=runnable_isas, help=f"the ISA path ({', '.join(LADDER)}; default: the CPU's best)")
    ap.add_argument("--policy", default="faithful", choices=known_policies("conv"),
                    help="overflow policy (default faithful)")
    ap.add_argument("--layers", default="3x3", help="comma-separated parts of layer names (default 3x3)")
    ap.add_argument("--variants", default="model,copy,edges,strips", type=names_among(VARIANTS, "variant"),
                    help=f"comma-separated, the first the reference ({', '.join(VARIANTS)})")
    ap.add_argument("--threads", type=int_at_least(1, "a positive thread count"), default=1)
    ap.add_argument("--batch", type=int_at_least(1, "a positive batch"), default=1)
    ap.add_argument("--seconds", type=positive_seconds, default=3.0, help="timed seconds per layer (default 3)")
    args = ap.parse_args(argv)
    if args.isa and "," in args.isa:
        ap.error(f"argument --isa: expected one ISA path, got {args.isa!r}")
    isa = args.isa or effective_isa()
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    parts = [p.strip() for p in args.layers.split(",") if p.strip()]
    if not any(" dw " not in c["label"] and any(p in c["label"] for p in parts) for c in CONV_LAYERS):
        ap.error(f"argument --layers: no ResNet-50 layer's name holds any of {parts}")
    print(f"ISA path {isa}, policy {args.policy}, {args.threads} thread(s), batch {args.batch}; "
          f"ratio = {names[0]}'s time / the variant's")
    for layer in CONV_LAYERS:
        if " dw " in layer["label"] or not any(p in layer["label"] for p in parts):
            continue
        case = dict(layer, prim="conv", N=args.batch, policy=args.policy)
        sides = []
        for name in names:
            with variant(name):
                primitive_cache.clear()  # each variant its own primitive
                sides.append(int8jit_setup(case, "fused", isa, args.threads))
        outs = []
        for side in sides:
            side.call()
            outs.append(side.out.copy())
        same = all(np.array_equal(o, outs[0]) for o in outs[1:])
        timed = measure_calls({i: side.call for i, side in enumerate(sides)}, args.seconds / len(sides))
        best = [timed[i][0] for i in range(len(sides))]
        cells = " ".join(f"{n}={b * 1e3:.3f}ms({best[0] / b:.3f})" for n, b in zip(names, best))
        print(f"{layer['label']:28s} {cells}" + ("" if same else "  OUTPUTS DIFFER"), flush=True)
    return 0
