"""``int8jit-demo``: what each ISA path computes for the seeds' two worked examples.

Probes the CPU, builds the demo dot-product kernel (:mod:`jit.demo_kernel`) for every
ISA path (the fast path of each ladder level and, on non-VNNI levels, the exact
widening path), runs on each path the CPU can execute

* u8/s8  ``{255,255,0,0} x {127,127,0,0}``: exact 64770; VPMADDUBSW saturates to 32767
* s8/s8  ``{127,127,0,0} x {127,127,0,0}`` through the +128 shift with the
  ``-128*sum(b)`` compensation: exact 32258; VPMADDUBSW gives 255

and prints each result next to the exact one. Then the GEMM primitive does the same
products on each ISA with the ``exact`` and ``faithful`` overflow policies, and an int8
layer (a 3x3 convolution and a matmul with scales, bias and relu, u8 output) runs on each
ISA and policy, counting the outputs that differ from the exact numpy model. Paths the
CPU lacks (or that lie above the ISA cap, ``INT8JIT_MAX_ISA``) are generated and
reported with their code size, not executed.

Example::

    $ int8jit-demo
    $ INT8JIT_MAX_ISA=avx2 python -m tools.demo

Exit status 0; 1 when a path that ran disagrees with what its instructions must give.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

from tools.cli import quiet_on_closed_stdout

PROG = "int8jit-demo"
U8_A, U8_B = (255, 255, 0, 0), (127, 127, 0, 0)
S8_A, S8_B = (127, 127, 0, 0), (127, 127, 0, 0)


def exact_dot(a: Sequence[int], b: Sequence[int]) -> int:
    return sum(int(x) * int(y) for x, y in zip(a, b))


def expected(kind: str, a: Sequence[int], b: Sequence[int], s8_src: bool) -> int:
    """What the path's instructions compute (numpy-free model of VPMADDUBSW saturation)."""
    if kind != "maddubsw":
        return exact_dot(a, b)
    shifted = [(int(x) + 128) if s8_src else int(x) for x in a]
    total = 0
    for i in (0, 2):
        pair = shifted[i] * b[i] + shifted[i + 1] * b[i + 1]
        total += max(-32768, min(32767, pair))
    return total - (128 * sum(b) if s8_src else 0)


def _lacks(isa: str, info) -> list[str]:
    from runtime.isa import REQUIRES

    return [f.upper() for f in REQUIRES[isa] if not info.has(f)]


def _verdict(got: int, exact: int) -> str:
    return "exact" if got == exact else "saturated"


def run(out=None) -> int:
    """Print the demo to ``out`` (default stdout); return the exit status."""
    out = out or sys.stdout
    started = time.perf_counter()
    from jit import cache
    from runtime import isa as isa_mod
    from runtime.cpu import cpu_info

    say = lambda line="": print(line.rstrip(), file=out)  # noqa: E731
    stats0 = dict(cache.stats)
    info = cpu_info()
    cpu = info.as_dict()
    supported = isa_mod.supported()
    cap = isa_mod.max_isa()
    say("int8jit demo: int8 dot products on every ISA path")
    say()
    say(f"CPU            {cpu.get('vendor') or '?'}  {cpu.get('brand') or '(no brand string)'}")
    ladder = ", ".join(f"{name} {'yes' if name in supported else 'no'}" for name in isa_mod.LADDER)
    say(f"ISA ladder     {ladder}")
    say(f"cap            {cap}  [{isa_mod.cap_source()}]")
    try:
        effective = isa_mod.effective_isa()
        say(f"effective ISA  {effective}")
    except isa_mod.IsaError as exc:
        effective = None
        say(f"effective ISA  none: {exc}")
    say()

    from jit.demo_kernel import demo_kernel, dot4, instruction_sequence
    from jit.dot import paths

    u8_exact, s8_exact = exact_dot(U8_A, U8_B), exact_dot(S8_A, S8_B)
    say("Dot-product kernel, one per path (jit.demo_kernel), on the seeds' worked examples:")
    say(f"  u8/s8  a={{{','.join(map(str, U8_A))}}} b={{{','.join(map(str, U8_B))}}}    exact {u8_exact}")
    say(f"  s8/s8  a={{{','.join(map(str, S8_A))}}} b={{{','.join(map(str, S8_B))}}}    exact {s8_exact}"
        "  (a+128 as u8, then -128*sum(b) compensation)")
    say()
    header = f"{'path':<22} {'instructions':<44} {'u8/s8':>7} {'s8/s8':>7} {'exact':>13}  result"
    say(header)
    say("-" * len(header))
    status = 0
    runnable = []
    for name in isa_mod.LADDER:
        executable = name in supported and isa_mod.rank(name) <= isa_mod.rank(cap)
        if executable:
            runnable.append(name)
        for path in paths(name):
            label = f"{path.isa} {path.kind}"
            seq = instruction_sequence(path)
            exact_col = f"{u8_exact}/{s8_exact}"
            if not executable:
                size = demo_kernel(name, path.kind).size
                say(f"{label:<22} {seq:<44} {'-':>7} {'-':>7} {exact_col:>13}  "
                    f"{_not_run(name, supported, cap, info)}; generated, {size} bytes")
                continue
            u8 = dot4(name, U8_A, U8_B, path.kind)
            s8 = dot4(name, S8_A, S8_B, path.kind, s8_src=True)
            verdict = "exact" if (u8, s8) == (u8_exact, s8_exact) else "saturated"
            if (u8, s8) != (expected(path.kind, U8_A, U8_B, False), expected(path.kind, S8_A, S8_B, True)):
                verdict += "  UNEXPECTED"
                status = 1
            say(f"{label:<22} {seq:<44} {u8:>7} {s8:>7} {exact_col:>13}  {verdict}")
    say()

    import numpy as np

    from primitives.gemm import Gemm

    say("GEMM primitive (primitives.gemm), the same products as 1x4 @ 4x1, per ISA and overflow policy:")
    header = f"{'isa':<18} {'policy':<9} {'path':<9} {'u8/s8':>7} {'s8/s8':>7} {'exact':>13}  result"
    say(header)
    say("-" * len(header))
    for name in isa_mod.LADDER:
        if name not in runnable:
            say(f"{name:<18} {_not_run(name, supported, cap, info)}")
            continue
        for policy in ("exact", "faithful"):
            results, kinds = [], []
            for a_vals, b_vals, dtype in ((U8_A, U8_B, np.uint8), (S8_A, S8_B, np.int8)):
                a = np.array([a_vals], dtype)
                b = np.array(b_vals, np.int8).reshape(4, 1)
                g = Gemm(1, 1, 4, a_type="u8" if dtype is np.uint8 else "s8", B=b, policy=policy, isa=name)
                c = np.zeros((1, 1), np.int32)
                g.execute(a, c)
                results.append(int(c[0, 0]))
                kinds.append(g.impl_info()["path"])
            u8, s8 = results
            kind = "/".join(dict.fromkeys(kinds))
            verdict = "exact" if (u8, s8) == (u8_exact, s8_exact) else "saturated"
            if policy == "exact" and verdict != "exact":
                verdict += "  WRONG (policy exact)"
                status = 1
            say(f"{name:<18} {policy:<9} {kind:<9} {u8:>7} {s8:>7} {f'{u8_exact}/{s8_exact}':>13}  {verdict}")
    say()
    status |= _layers(say, runnable)
    generated = cache.stats["generated"] - stats0.get("generated", 0)
    from_disk = cache.stats["disk_hits"] - stats0.get("disk_hits", 0)
    say(f"{generated} kernels generated with PeachPy, {from_disk} loaded from the disk cache "
        f"({cache.cache_dir()}); {time.perf_counter() - started:.2f} s")
    return status


def _layers(say, runnable) -> int:
    """An int8 ResNet-style layer (3x3 conv 16 -> 24, u8 output with per-channel scales,
    bias and relu) and a matmul with the same attributes, on every runnable ISA and both
    policies, against the numpy models; full-range weights (VPMADDUBSW saturates, exact
    widens) and trained-like ones (a few large values: exact splits them into residual
    cells, a few outputs still saturate under faithful)."""
    import numpy as np

    from primitives import primitive_cache
    from primitives.attr import Attr, PostOps
    from primitives.conv import ConvolutionDesc
    from primitives.conv_ref import conv_sum
    from primitives.matmul import MatmulDesc
    from primitives.memory import desc
    from primitives.reference import gemm_sum, output_pipeline
    from tools.bench_problems import trained_weights

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (1, 16, 9, 9)).astype(np.uint8)
    w = rng.integers(-128, 128, (24, 16, 3, 3)).astype(np.int8)
    a = rng.integers(0, 256, (7, 40)).astype(np.uint8)
    b = rng.integers(-128, 128, (40, 24)).astype(np.int8)
    weights = {"uniform": (w, b), "trained": (trained_weights(rng, w.shape, axis=0),
                                              trained_weights(rng, b.shape, axis=1))}
    ws = rng.uniform(0.001, 0.004, 24).astype(np.float32)
    bias = rng.uniform(-20, 20, 24).astype(np.float32)
    say("An int8 layer per ISA, policy and weights: u8 out = relu(0.05 * w_scale[oc] * acc + bias), 3x3 conv "
        "16->24 at 9x9 (pad 1) and a 7x40 @ 40x24 matmul; outputs differing from the exact model:")
    header = f"{'isa':<18} {'policy':<9} {'weights':<8} {'conv':>6} {'matmul':>7}  kernel"
    say(header)
    say("-" * len(header))
    status = 0
    for name, policy, kind in ((n, p, k) for n in runnable for p in ("exact", "faithful") for k in weights):
        w, b = weights[kind]
        attr = Attr(scales={"src": 0, "weights": 1}, policy=policy).set_post_ops(PostOps().eltwise("relu"))
        pd = ConvolutionDesc(desc(x.shape, "u8", "nchw"), desc(w.shape, "s8", "oihw"),
                             desc((1, 24, 9, 9), "u8", "nchw"), desc((24,), "f32", "a"),
                             padding_l=(1, 1), padding_r=(1, 1), attr=attr, isa=name)
        y = np.zeros((1, 24, 9, 9), np.uint8)
        # A primitive of its own for each kind of weights (the cache would hand back the
        # one the other kind ran), so that the kernels it lists are the ones these took.
        primitive_cache.clear()
        conv = pd.create()
        conv.execute({"src": x, "weights": w, "dst": y, "bias": bias, "scales:src": np.float32([0.05]),
                      "scales:weights": ws})
        scale = np.float32(0.05) * ws
        post = [("eltwise", "relu", 0.0, 0.0)]
        rows = np.moveaxis(conv_sum(x, w, (1, 1), (1, 1), (1, 1), (0, 0)), 1, -1).reshape(-1, 24)
        exact = np.moveaxis(output_pipeline(rows, dst_dt="u8", scale=scale, bias=bias, post_ops=post)
                            .reshape(1, 9, 9, 24), -1, 1)
        mattr = Attr(scales={"src": 0, "weights": 2}, policy=policy).set_post_ops(PostOps().eltwise("relu"))
        mpd = MatmulDesc(desc(a.shape, "u8", "ab"), desc(b.shape, "s8", "ab"), desc((7, 24), "u8", "ab"),
                         desc((1, 24), "f32", "ab"), attr=mattr, isa=name)
        z = np.zeros((7, 24), np.uint8)
        mpd.create().execute({"src": a, "weights": b, "dst": z, "bias": bias, "scales:src": np.float32([0.05]),
                              "scales:weights": ws})
        mexact = output_pipeline(gemm_sum(a, b, 0, 0, False), dst_dt="u8", scale=scale, bias=bias, post_ops=post)
        conv_diff, mm_diff = int((y != exact).sum()), int((z != mexact).sum())
        verdict = ""
        if policy == "exact" and (conv_diff or mm_diff):
            verdict, status = "  WRONG (policy exact)", 1
        ran = " + ".join(conv.impl_info()["kernels_run"])
        say(f"{name:<18} {policy:<9} {kind:<8} {conv_diff:>6} {mm_diff:>7}  {ran}{verdict}")
    if not runnable:
        say("(none: no path executes on this CPU)")
    say()
    return status


def _not_run(name: str, supported, cap: str, info) -> str:
    """Why the path ``name`` does not run here: the CPU lacks it, or the cap leaves it out
    (it would run)."""
    if name not in supported:
        return f"not executable on this CPU (lacks {', '.join(_lacks(name, info))})"
    return f"not run: above the cap {cap}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``int8jit-demo``; returns the exit status (0 where its reader closes
    the pipe early, ``int8jit-demo | head``)."""
    return quiet_on_closed_stdout(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.parse_args(argv)
    from runtime.isa import IsaError

    try:
        return run()
    except IsaError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
