"""``dump-asm``: disassemble the bytes a kernel has in executable memory, per ISA path.

The bytes are read back from the W^X mapping (``Kernel.code()``, constant references
resolved) and decoded by iced-x86, not taken from PeachPy's own listing, so what is
printed is what the CPU executes. One line per instruction: offset, encoding (hex
bytes), instruction in Intel (default) or AT&T syntax.

Kernels (``--list``)::

    demo   the demo's 4-element dot product   [--kind vnni|maddubsw|widen] [--a-type u8|s8]
    peak   the register-only peak loop        [--kind vnni|maddubsw|widen]
    gemm   the GEMM microkernel(s) for a shape --m M --n N --k K [--policy exact|faithful]
           [--a-type u8|s8] [--weights uniform|trained] (B with seed 0, uniform over
           s8: on non-VNNI ISAs the exact policy then picks the widening path, since
           such weights saturate; trained: Laplacian per column, split into cells where few
           pairs are unsafe, else widened: the header line says which)
    conv   the kernel a convolution layer gets: --ic IC --oc OC --hw H [--window K]
           [--stride S] [--pad P] [--groups G] [--batch N] [--dst u8|s8|s32|f32] [--fused]
           (--fused: per-channel scales, bias and relu, as in an int8 ResNet)
    pool   the pooling kernel of a window: [--alg max|avg_include_padding|avg_exclude_padding]
           [--window K] [--depth D] [--a-type u8|s8] [--dst s32|f32|u8|s8] (avg: the dst
           type; max writes the source type; --depth: a 3-D window D slices deep)
    copy   the row copy a convolution's threads fill their padded source with
    pack   the kernels that pack B in machine code (runtime weights, reorders into any):
           from rows of N bytes and from columns of K, 256-bit into the VNNI layout
           (which VPMADDUBSW reads too) and the widening one, 512-bit into the VNNI one;
           and the column term a GEMM makes from the sums of a B packed at every call
    gemv   the kernel that reads an inner product's runtime weights in place (batch
           1-4) [--a-type u8|s8] [--dst u8|s8|s32|f32] [--fused] [--policy exact|faithful]
           (without VNNI: widened under exact, VPMADDUBSW under faithful); --chunks: the
           three a matmul's one row runs on 4096 x 4096 weights' rows, K in chunks (the
           s32 partial sums stored, then added, then the output stage adding them)

A path the CPU lacks is generated and disassembled all the same (mapping code needs no
CPU support); it is never executed. Examples::

    $ dump-asm demo --isa avx2
    $ dump-asm peak --isa avx512_core_vnni --syntax att -o peak.s --bin peak.bin
    $ dump-asm gemm --m 64 --n 64 --k 64 --isa avx2 --policy faithful
    $ dump-asm conv --ic 64 --oc 64 --hw 56 --window 3 --pad 1 --fused
    $ dump-asm pool --alg avg_exclude_padding --window 7 --isa avx512_core

Exit status 0, or 2 for a usage error (unknown kernel, unknown ISA, bad option: a size,
stride, window or group count below 1, a padding or depth below 0, a GEMM whose operands
would pass 1 GiB), with a one-line message on stderr; 0 too where stdout's reader stops
early (``dump-asm pack | head``).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Sequence

from tools.cli import int_at_least, quiet_on_closed_stdout, writable_file

PROG = "dump-asm"
KERNELS = {
    "demo": "the demo's 4-element u8/s8 dot product through one path's step (jit.demo_kernel)",
    "peak": "the register-only peak loop of one path (jit.peak)",
    "gemm": "the GEMM microkernel(s) for --m/--n/--k (primitives.gemm, jit.gemm_kernel)",
    "conv": "the kernel of a convolution layer (primitives.conv: batch-reduce GEMM, or depthwise)",
    "pool": "the pooling kernel of a --window (primitives.pooling, jit.pooling_kernel)",
    "copy": "the row copy of a convolution's padded source (jit.copy_kernel)",
    "pack": "the kernels packing B, from rows and from columns, VNNI and widened (jit.pack_kernel, pack_rows, pack_columns)",
    "gemv": "the kernel reading runtime weights in place, a few rows (jit.gemv_kernel)",
    "repoint": "the kernel that points a replay's structs at new arrays (jit.repoint)",
    "guard": "the kernel that tests a call's arrays against a replay's and points it at them (jit.guard)",
}


class UsageError(Exception):
    """A bad command line: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        raise UsageError(message)


_positive = int_at_least(1, "a positive integer")  # (a size, a stride, a group count)
_non_negative = int_at_least(0, "an integer >= 0")  # (a padding; --depth, where 0 means 2-D)


# dump-asm gemm allocates A, B and C and runs the GEMM once (it lists the kernel that run
# took): sizes whose operands pass this are refused up front, not left to numpy's MemoryError.
GEMM_MAX_BYTES = 1 << 30


def build_parser() -> argparse.ArgumentParser:
    from runtime.isa import LADDER

    p = _Parser(prog=PROG, description="Disassemble int8jit kernels as they sit in executable memory.")
    p.add_argument("kernel", nargs="?", help=f"kernel name: {', '.join(KERNELS)}")
    p.add_argument("--list", action="store_true", help="list the kernel names and exit")
    p.add_argument("--isa", default=None, help=f"ISA path: one of {', '.join(LADDER)} (default: the effective ISA)")
    p.add_argument("--kind", default=None, choices=("vnni", "maddubsw", "widen"),
                   help="dot-product step for demo/peak (default: the ISA's fast path)")
    p.add_argument("--a-type", default="u8", choices=("u8", "s8"), help="source type: demo, gemm, gemv, pool")
    p.add_argument("--m", type=_positive, default=None, help="gemm: rows of A and C")
    p.add_argument("--n", type=_positive, default=None, help="gemm: columns of B and C")
    p.add_argument("--k", type=_positive, default=None, help="gemm: reduction length")
    p.add_argument("--policy", default="exact", choices=("exact", "faithful", "halve_weights"),
                   help="gemm/conv: overflow policy (halve_weights: conv only)")
    p.add_argument("--weights", default="uniform", choices=("uniform", "trained"),
                   help="gemm: B uniform over s8, or trained-like (as int8jit-bench --weights)")
    for name, default, what in (("ic", None, "input channels"), ("oc", None, "output channels"),
                                ("hw", None, "input height = width"), ("window", 1, "window height = width"),
                                ("stride", 1, "stride"), ("pad", 0, "padding on every side"),
                                ("groups", 1, "groups"), ("batch", 1, "batch")):
        # every one >= 1 but the padding (a batch of 0 is a valid convolution, but it runs no
        # kernel: nothing to list)
        p.add_argument(f"--{name}", type=_non_negative if name == "pad" else _positive, default=default,
                       help=f"conv: {what}" + (" (pool: the window)" if name == "window" else ""))
    p.add_argument("--dst", default=None, choices=("u8", "s8", "s32", "f32"),
                   help="dst data type: conv, gemv (default u8), average pool (default the source's; max "
                        "pooling writes the source's)")
    p.add_argument("--fused", action="store_true", help="conv/gemv: per-channel scales, bias and relu")
    p.add_argument("--chunks", action="store_true",
                   help="gemv: the rows kernels of one row by 4096 x 4096 weights, K in chunks")
    p.add_argument("--depth", type=_non_negative, default=0,
                   help="pool: a 3-D window this many slices deep (the depth loop's kernel); 0: 2-D")
    p.add_argument("--alg", default="max", choices=("max", "avg_include_padding", "avg_exclude_padding"),
                   help="pool: algorithm")
    p.add_argument("--syntax", default="intel", choices=("intel", "att"), help="assembly syntax")
    p.add_argument("-o", "--output", metavar="FILE", default=None, type=writable_file,
                   help="write the listing to FILE")
    p.add_argument("--bin", metavar="FILE", default=None, type=writable_file,
                   help="also write the raw code bytes to FILE (several kernels: FILE, FILE.1, ...)")
    return p


def _isa(name: str | None) -> str:
    from runtime import isa as isa_mod

    if name is None:  # (where no path runs, the lowest: its kernels are generated and shown all the same)
        return isa_mod.planning_isa()
    return isa_mod.check_name(name, "--isa")


def _demo(args, isa: str):
    from jit.demo_kernel import demo_kernel, instruction_sequence
    from jit.dot import path_for

    path = path_for(isa, args.kind)
    kernel = demo_kernel(isa, args.kind, s8_src=args.a_type == "s8")
    header = [f"demo kernel {kernel.name}: {args.a_type}/s8 4-element dot product, path {path.name}",
              f"step: {instruction_sequence(path)}"]
    return header, [kernel]


def _peak(args, isa: str):
    from jit.peak import ops_per_iteration, peak_kernel
    from jit.dot import path_for

    path = path_for(isa, args.kind)
    kernel = peak_kernel(isa, args.kind)
    header = [f"peak loop {kernel.name}: path {path.name}, {kernel.meta.get('chains')} chains x "
              f"{kernel.meta.get('unroll')} steps, {ops_per_iteration(path)} int8 ops per iteration"]
    return header, [kernel]


def _gemm(args, isa: str):
    import numpy as np

    from primitives.gemm import POLICIES as GEMM_POLICIES
    from runtime.isa import cpu_supports

    for name in ("m", "n", "k"):  # (each positive: the parser's type)
        if getattr(args, name) is None:
            raise UsageError(f"gemm needs --{name}")
    if args.policy not in GEMM_POLICIES:  # (as Gemm refuses it, on a path the CPU lacks too)
        raise UsageError(f"gemm: --policy {args.policy} is convolution's; a GEMM takes "
                         f"{' or '.join(GEMM_POLICIES)}")
    M, N, K = args.m, args.n, args.k
    # A (u8/s8), B (s8; trained: drawn as float64 first) and C (s32), roughly
    need = M * K + K * N * (9 if args.weights == "trained" else 1) + 4 * M * N
    if need > GEMM_MAX_BYTES:
        raise UsageError(f"--m {M} --n {N} --k {K}: A, B and C would take {need / 2**30:.1f} GiB; dump-asm "
                         f"runs the GEMM to list its kernel and takes at most {GEMM_MAX_BYTES >> 30} GiB")
    rng = np.random.default_rng(0)
    if args.weights == "trained":
        from tools.bench_problems import trained_weights

        b = trained_weights(rng, (K, N), axis=1)
    else:
        b = rng.integers(-128, 128, size=(K, N), dtype=np.int8)
    if cpu_supports(isa):
        from primitives.gemm import Gemm

        dtype = np.uint8 if args.a_type == "u8" else np.int8
        a = rng.integers(np.iinfo(dtype).min, int(np.iinfo(dtype).max) + 1, size=(M, K), dtype=dtype)
        g = Gemm(M, N, K, a_type=args.a_type, B=b, policy=args.policy, isa=isa)
        g.execute(a, np.zeros((M, N), np.int32))
        info = g.impl_info()
        # The kernel the execution ran: the plan may take a tuned variant of the decision's
        # kernel (next-tile prefetch, s8 A shifted once per call), see impl_info's blocking.
        kernels = [g._plan_cache[1].kernel] if g._plan_cache is not None else list(g._kernels.values())
        header = ["impl_info:"] + [f"  {key}: {value}" for key, value in info.items()]
        return header, kernels
    return _gemm_generated(args, isa, b)


def _gemm_generated(args, isa: str, b):
    """Generate (not execute) the kernel the Gemm primitive would pick on ``isa``.

    The primitive refuses an ISA the CPU lacks, so this takes its decision
    (``primitives.gemm.decide``) and kernel (``gemm_kernel``) without executing.
    """
    from jit.output import OutputSpec
    from primitives.gemm import decide, gemm_kernel
    from runtime.cpu import cpu_info
    from runtime.isa import REQUIRES

    lacks = [f.upper() for f in REQUIRES[isa] if not cpu_info().has(f)]
    choice = decide(isa, args.policy, b)
    path, reason = choice.path, choice.reason
    kernel = gemm_kernel(choice, args.a_type == "s8", OutputSpec())
    kspec = kernel.meta["kspec"]
    header = [
        f"not executable on this CPU (lacks {', '.join(lacks)}): "
        "generated and disassembled only",
        f"gemm_{args.a_type}s8s32 {args.m}x{args.n}x{args.k} isa {isa} policy {args.policy}: {path.kind} ({reason})",
        f"kernel {kspec.name}: tile {kspec.mr}x{kspec.nr}",
    ]
    return header, [kernel]


def _conv(args, isa: str):
    """The layer's descriptor on ``isa`` (or, where the CPU lacks it, the kernel it would get)."""
    from primitives.attr import Attr, PostOps
    from primitives.conv import ConvolutionDesc
    from primitives.memory import desc
    from runtime.isa import cpu_supports, effective_isa

    for name in ("ic", "oc", "hw"):
        if getattr(args, name) is None:
            raise UsageError(f"conv needs --{name}")
    g, k, st, pad = args.groups, args.window, args.stride, args.pad
    if args.ic % g or args.oc % g:
        raise UsageError(f"--groups {g} must divide --ic {args.ic} and --oc {args.oc}")
    oh = (args.hw + 2 * pad - k) // st + 1
    if oh < 1:
        raise UsageError(f"--window {k} is larger than the padded input {args.hw + 2 * pad}")
    wdims = ((g, args.oc // g, args.ic // g) if g > 1 else (args.oc, args.ic)) + (k, k)
    attr = Attr(policy=args.policy)
    if args.fused:
        attr = Attr(scales={"src": 0, "weights": 3 if g > 1 else 1}, policy=args.policy,
                    post_ops=PostOps().eltwise("relu"))
    run_isa = isa if cpu_supports(isa) else effective_isa()
    pd = ConvolutionDesc(desc((args.batch, args.ic, args.hw, args.hw), "u8", "nhwc"),
                         desc(wdims, "s8", "any"), desc((args.batch, args.oc, oh, oh), args.dst or "u8", "nhwc"),
                         desc((args.oc,), "f32", "a") if args.fused else None, strides=(st, st),
                         padding_l=(pad, pad), padding_r=(pad, pad), attr=attr, isa=run_isa)
    info = pd.impl_info()
    header = ["impl_info:"] + [f"  {key}: {value}" for key, value in info.items()]
    if hasattr(pd, "kernel_spec"):  # depthwise
        kernel = pd._kernel(pd.kernel_spec("none", isa=isa))  # (where the CPU lacks isa: generated, never called)
        if run_isa == isa:
            return header, [kernel]
        return [f"not executable on this CPU: the {isa} depthwise kernel, generated and disassembled only "
                f"(impl_info below is for {run_isa})"] + header, [kernel]
    # Every kernel the layer can run: under exact without VNNI the weights decide, when
    # packed, between VPMADDUBSW with residual cells (none where every pair is proven
    # safe) and widening; both are listed.
    choices = replace(pd._layout, isa=isa).candidates()
    kernels = [pd._kernel_for(c) for c in choices]  # (where the CPU lacks isa: generated, never called)
    if run_isa == isa:
        return header, kernels
    paths = " and ".join(c.path.kind for c in choices)
    return [f"not executable on this CPU: the {isa} kernels, generated and disassembled only "
            f"(path {paths}; impl_info below is for {run_isa})"] + header, kernels


def _pool(args, isa: str):
    """The kernel a --window x --window pooling gets on ``isa`` (generated; run only by
    the primitive where the CPU has the ISA)."""
    from jit import cache
    from jit.pooling_kernel import generate
    from primitives.pooling import kernel_spec

    if args.alg == "max" and args.dst not in (None, args.a_type):
        raise UsageError(f"--dst: max pooling writes the source's type ({args.a_type}), not {args.dst}")
    dst = args.dst or args.a_type
    spec = kernel_spec(isa, args.alg, args.a_type, dst, args.window, args.window, args.depth or None)
    window = f"{args.depth}x" * bool(args.depth) + f"{args.window}x{args.window}"
    header = [f"pooling {args.alg} {window}, {args.a_type} -> {dst}: {spec}"]
    return header, [cache.get_kernel(("pooling", spec), lambda: generate(spec))]


def _copy(args, isa: str):
    from jit.copy_kernel import ISA, copy_kernel

    return [f"the convolution's padded-source row copy ({ISA}: every ISA path runs it)"], [copy_kernel()]


def _pack(args, isa: str):
    from jit import cache
    from jit.pack_kernel import all_kernel_keys, generate, kernel_key

    # (generated, not run: the 512-bit ones are listed on any CPU)
    from jit.column_term import column_term_kernel

    kernels = [cache.get_kernel(kernel_key(*key), lambda key=key: generate(*key)) for key in all_kernel_keys()]
    return ["B packed from rows of N and from columns of K: 256-bit code (every ISA path runs it) into the VNNI "
            "layout and the widening one, 512-bit code into the VNNI layout on the 512-bit paths (sums by "
            "VPDPBUSD with VNNI); last, the column term a GEMM's threads make from the sums they packed (an s8 "
            "A or a zero point: -ao' * colsum + co)"], kernels + [column_term_kernel()]


def _repoint(args, isa: str):
    from jit.repoint import ISA, repoint_kernel

    return [f"a moved replay's struct fields written from a table: base + offset ({ISA}: every ISA path runs "
            "it)"], [repoint_kernel()]


def _guard(args, isa: str):
    from jit.guard import ISA, guard_kernel

    return [f"a replay's test of a call's arrays (type, dtype, shape, strides, writability, the values read at "
            f"set-up, the outputs' overlaps), then its struct fields written as repoint's ({ISA}: every ISA path "
            f"runs it)"], [guard_kernel()]


def _gemv(args, isa: str):
    """The in-place kernel of a batch-1 inner product 2048 -> 1000 with plain weights on
    ``isa``: its output stage made by ``output_plan``, as the descriptor makes it (no
    descriptor: it would need the ISA on this CPU; the kernel is generated, not run)."""
    from jit.dot import fast_path, widening_path
    from jit.gemv_kernel import gemv_kernel, shifts_s8
    from primitives.attr import Attr, PostOps
    from primitives.gemv_driver import CHUNK_ROWS, chunk_kernels
    from primitives.memory import desc
    from primitives.pipeline import output_plan

    if args.policy == "halve_weights":
        raise UsageError("gemv: --policy halve_weights is convolution's; an inner product takes exact or faithful")
    path = fast_path(isa)
    if path.kind != "vnni" and args.policy == "exact":  # (widened: exact without a proof)
        path = widening_path(isa)
    attr = Attr(scales={"src": 0, "weights": 1}, post_ops=PostOps().eltwise("relu"), policy=args.policy) \
        if args.fused else Attr(policy=args.policy)
    s8, dst = args.a_type == "s8", args.dst or "u8"
    output = output_plan(attr, desc((1, 1000), dst, "ab"), desc((1000,), "f32", "a") if args.fused else None,
                         None, col_comp=s8).spec
    comp = s8 and shifts_s8(path)
    if args.chunks:
        output = output_plan(attr, desc((1, 4096), dst, "ab"), desc((4096,), "f32", "a") if args.fused else None,
                             None, col_comp=s8).spec
        kernels = chunk_kernels(path, s8, comp, output)
        return [f"matmul 1x4096 by 4096x4096 (ab), {args.a_type} -> {dst}, weights read in place, K in "
                f"chunks of {CHUNK_ROWS} rows: the first chunk's s32 sums, the next ones added, the last through "
                "the output stage"] + [f"  {k.meta['gemv'].name}" for k in kernels], kernels
    kernel = gemv_kernel(path, s8, comp, output)
    return [f"inner product 1x2048 -> 1000, {args.a_type} -> {dst}, weights read in place: "
            f"{kernel.meta['gemv']}"], [kernel]


def render(kernels, header: Sequence[str], syntax: str = "intel") -> str:
    """The listing: a comment header, then per kernel its name, size and instructions."""
    from jit.disasm import disassemble

    comment = "#" if syntax == "att" else ";"
    lines = [f"{comment} {line}" for line in header]
    for kernel in kernels:
        code = kernel.code()
        lines.append(f"{comment} {kernel.name} [{kernel.isa}] {len(code)} bytes at {kernel.address:#x}, "
                     f"signature {kernel.signature}")
        lines.append(disassemble(code, kernel.address, syntax))
    return "\n".join(lines) + "\n"


def run(argv: Sequence[str] | None = None, out=None) -> int:
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    if args.list:
        for name, what in KERNELS.items():
            print(f"{name:<6} {what}", file=out)
        return 0
    if args.kernel is None:
        raise UsageError(f"name a kernel ({', '.join(KERNELS)}) or use --list")
    if args.kernel not in KERNELS:
        raise UsageError(f"unknown kernel {args.kernel!r}; expected one of {', '.join(KERNELS)}")
    isa = _isa(args.isa)
    header, kernels = {"demo": _demo, "peak": _peak, "gemm": _gemm, "conv": _conv, "pool": _pool,
                       "copy": _copy, "pack": _pack, "gemv": _gemv,
                       "repoint": _repoint, "guard": _guard}[args.kernel](args, isa)
    text = render(kernels, header, args.syntax)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        out.write(text)
    if args.bin:
        for i, kernel in enumerate(kernels):
            with open(args.bin if i == 0 else f"{args.bin}.{i}", "wb") as f:
                f.write(kernel.code())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``dump-asm``; returns the exit status."""
    # (`dump-asm pack | head` is no failure: status 0, no traceback)
    return quiet_on_closed_stdout(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    from runtime.isa import IsaError

    try:
        return run(argv)
    except BrokenPipeError:  # (before OSError: quiet_on_closed_stdout's)
        raise
    except MemoryError:  # (the GEMM's sizes are bounded; a machine short of memory still gets a line)
        print(f"{PROG}: error: out of memory (numpy could not allocate the operands)", file=sys.stderr)
        return 1
    except (UsageError, IsaError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # e.g. --kind widen on a VNNI level
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
