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
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runtime.isa import LADDER
from tools.bench_problems import (CONV_LAYERS, POOL_CASES, chain_groups, known_policies, names_among, pool_spatial,
                                  pool_src, positive_ints, positive_seconds, problems_for, runnable_isas, shape_list)
from tools.bench_report import Result, check_outputs, columns, fmt, format_header, format_row, markdown_table, write_csv
from tools.bench_sides import OneDNNServer, RemoteSide, Unavailable, int8jit_setup, onednn_setup, torch_conv_setup
from tools.bench_timing import (GOMP_SPINCOUNT, REPO_ROOT, Series, best_isa, cpu_brand, first_call_s, in_turn,
                                local_timed, make_peak, measure_with_steal, pin, supported_isas, unpin)
from tools.cli import writable_file


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
                series[("onednn", variant)] = Series(t, first_call_s(t), remote=True)
            except Unavailable as exc:
                r.notes.append(f"{exc}{tag}")
        try:
            side = int8jit_setup(case, variant, isa, threads)
            if variant == "fused":
                r.impl_int8jit = side.impl
                outputs["int8jit"] = side.out
            series[("int8jit", variant)] = Series.local(side.call)
        except Unavailable as exc:
            r.notes.append(f"{exc}{tag}")
        except Exception as exc:
            r.notes.append(f"int8jit error{tag}: {type(exc).__name__}: {exc}")
    torch_side = None
    if case["prim"] == "conv":
        try:
            torch_side = torch_conv_setup(case, threads)
            t = local_timed(torch_side.call)
            # remote=True: its windows run first and (2+ threads) the settle pause follows
            # them, as torch's own OpenMP workers spin after its calls like libgomp's do.
            series[("torch", "fused")] = Series(t, first_call_s(t), remote=True)
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
        r.check = check_outputs(outputs["int8jit"], outputs["onednn"].output())
    elif check and case["prim"] == "pool" and "onednn" in outputs:
        from primitives.pooling_ref import pooling_ref

        nd = len(pool_spatial(case))
        ref = pooling_ref(pool_src(case), case["alg"], (case["K"],) * nd, (case["S"],) * nd, (case["P"],) * nd,
                          (case["P"],) * nd)
        r.check = "ref " + check_outputs(ref, outputs["onednn"].output())
    if check and torch_side is not None and outputs.get("int8jit") is not None:
        r.notes.append(f"torch {check_outputs(outputs['int8jit'], torch_side.output())} ({torch_side.impl})")
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
    chains = {"int8jit": in_turn([side.call for side in sides])}
    if all(side.bind for side in sides):
        chains["bound"] = in_turn([side.bind() for side in sides])
    series = {who: Series.local(chain) for who, chain in chains.items()}
    if server is not None:
        ids = [f"chain{i}" for i in range(len(cases))]
        for ident, case in zip(ids, cases):
            RemoteSide(server, ident, case, "fused")

        def theirs(n):
            return server.request(op="chain", ids=ids, n=n)["s"]
        series["onednn"] = Series(theirs, first_call_s(theirs), remote=True)
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
        pinned = pin(nthreads)
        server, note = None, ""
        try:
            server = OneDNNServer(isa, nthreads)
        except Unavailable as exc:
            note = str(exc)
        try:
            for name, cases in groups:
                best, steal = run_chain(server, cases, isa, nthreads, min_time, min_rounds)
                ours, theirs, bound = best["int8jit"], best.get("onednn"), best.get("bound")
                cells = [fmt(ours * 1e3, ".3f"), fmt(theirs and theirs * 1e3, ".3f"), fmt(theirs and theirs / ours, ".2f"),
                         fmt(bound and bound * 1e3, ".3f"), fmt(theirs and bound and theirs / bound, ".2f"),
                         fmt(steal and 100 * steal, ".1f")]
                print(f"{name:<{width}}  {len(cases):>5}  {nthreads:>7}  {cells[0]:>10}  {cells[1]:>9}  {cells[2]:>5}  "
                      f"{cells[3]:>8}  {cells[4]:>5}  {cells[5]:>5}  {note}", flush=True)
                md.append(f"| {name} | {len(cases)} | {nthreads} | {' | '.join(cells)} |")
        finally:
            if server is not None:
                server.close()
            unpin(pinned)
    return md


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


def run(bench: str, argv=None) -> int:
    ap = argparse.ArgumentParser(prog=f"int8jit-bench {bench}", description=COMMAND_HELP[bench])
    # (bad values refused here, exit status 2: see bench_problems' argument types)
    ap.add_argument("--isa", type=runnable_isas,
                    help=f"comma-separated ISA paths ({', '.join(LADDER)}); default: the CPU's best")
    ap.add_argument("--threads", type=positive_ints, help="comma-separated thread counts (default: 1 and all cores)")
    if bench in ("matmul", "ip"):
        ap.add_argument("--shapes", type=shape_list, help="comma-separated MxNxK (default: the issue's list)")
        ap.add_argument("--no-creation", action="store_true", help="skip the creation-time table")
        ap.add_argument("--runtime-weights", action="store_true",
                        help="plain weights passed at every call (tag ab on both sides: each packs them per "
                             "call, or reads them in place at 1-4 rows) instead of packed once through 'any'")
    if bench == "matmul":
        ap.add_argument("--attention", action="store_true",
                        help="BERT-base's attention instead: 12 heads of 64, 128 tokens, the keys and values "
                             "given at every call (acb and abc), prefill (128 rows) and decode (1 row)")
    elif bench in ("conv", "pool"):  # (ip's problems are --shapes: a --layers there was ignored)
        labels = [c["label"] for c in (CONV_LAYERS if bench == "conv" else POOL_CASES)]
        ap.add_argument("--layers", type=names_among(labels, "layer" if bench == "conv" else "case"),
                        help="comma-separated problem names (default: the whole list)")
    if bench == "conv":
        ap.add_argument("--batch", type=positive_ints, help="comma-separated batch sizes (default 1,8; --quick: 1)")
    if bench in ("conv", "matmul", "ip"):
        ap.add_argument("--weights", choices=("uniform", "trained"), default="uniform",
                        help="the weights both sides get: uniform over the s8 range (default), or trained-like "
                             "(Laplacian, quantized per output channel to +-127: a few large values, which exact "
                             "splits into residual cells on avx2 and avx512_core instead of widening)")
        ap.add_argument("--policy", type=names_among(known_policies(bench), "policy"),
                        help="comma-separated overflow policies of int8jit's rows (exact, faithful"
                             + (", halve_weights" if bench == "conv" else "") + "; default exact). On "
                             "avx2 and avx512_core oneDNN saturates: faithful computes what it "
                             "computes, exact widens (the weights are full range); a policy other "
                             "than exact is named in the row's label")
        ap.add_argument("--new-arrays", action="store_true",
                        help="int8jit's calls get new array objects (views of the same memory) at every call, as "
                             "a loop that makes its arrays anew passes them, instead of the same ones (replayed); "
                             "oneDNN's C calls take the same pointers either way")
        ap.add_argument("--chain", action="store_true",
                        help="time the layers called one after another, as a network calls them, instead of each "
                             "on its own (default: ResNet-50's 53 convolutions in order; BERT-base's 72 linears)")
    ap.add_argument("--min-time", type=positive_seconds, help="seconds of timed calls per side and problem")
    ap.add_argument("--quick", action="store_true", help="a smaller set and shorter timings")
    ap.add_argument("--no-check", action="store_true", help="do not compare the two sides' outputs")
    ap.add_argument("--csv", metavar="FILE", type=writable_file, help="also write the rows as CSV")
    ap.add_argument("--markdown", metavar="FILE", type=writable_file, help="also write the tables as markdown")
    args = ap.parse_args(argv)
    # (before PyTorch's libgomp starts, and copied into the oneDNN children's environment)
    os.environ.setdefault("GOMP_SPINCOUNT", GOMP_SPINCOUNT)

    from tools import onednn

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
              f"{fmt(peak and peak.best, '.1f')} GOPS per core (register-only loop, timed between windows)\n")
        print(format_header(cols), flush=True)
        block: list[Result] = []
        for nthreads in threads:
            server = None
            pinned = pin(nthreads)
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
                unpin(pinned)
        if peak is not None:  # the best window of the whole run counts in the CSV and markdown
            changed = any(r.peak != peak.best for r in block)
            for r in block:
                r.peak = peak.best
            if changed:
                print(f"(peak, best window of the run: {peak.best:.1f} GOPS per core; rows above used the best "
                      "so far, the CSV and markdown use this one)")
        results += block
        md += ["", f"ISA path {isa}, peak {fmt(peak and peak.best, '.1f')} GOPS per core", "",
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
        cells = [fmt(ms.get(c), ".2f") for c in CREATION_COLUMNS]
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
