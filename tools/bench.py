"""int8jit-bench: int8jit and oneDNN side by side, per ISA path, thread count and policy.

    int8jit-bench gemm                    # every shape, u8s8 and s8s8, every ISA path
    int8jit-bench gemm --quick            # a fast smoke run (short timings)
    int8jit-bench gemm --isa avx2,avx512_core_vnni --threads 1 --shapes 1024x1024x1024
    int8jit-bench gemm --csv gemm.csv --markdown gemm.md   # also save the rows

For each problem the table shows int8jit's GOPS (2*M*N*K / s), its percentage of the
machine's peak (the register-only loop of the path the kernel uses, from
:func:`jit.peak.measure_peak`, times the thread count), oneDNN's GOPS on the same ISA
path and thread count, and the ratio int8jit / oneDNN.

How it measures (the machine's clock and its other tenants move figures by 20-40%
within seconds, so the two sides and the peak are measured interleaved, never one
after the other):

* One child process per (ISA, thread count), started with ``ONEDNN_MAX_CPU_ISA`` (AVX2,
  AVX2_VNNI, AVX512_CORE, AVX512_CORE_VNNI: the path's name in upper case; the VNNI row
  is capped too, since on a CPU with AMX oneDNN's default is AMX) and
  ``OMP_NUM_THREADS``, runs oneDNN, int8jit and the peak loops. A child whose oneDNN
  ends up on another ISA says so.
* Per problem: one warm-up call of each side, then rounds; each round times one window
  (about 5 ms of back-to-back calls) of oneDNN, of every int8jit row and of the peak
  loop of every path involved, until ``--min-time`` seconds per side (0.3; 0.03 with
  ``--quick``) and at least 5 rounds. A figure is the best window (the least disturbed);
  the ``noise`` column is how much slower int8jit's median window was than its best,
  ``steal`` the hypervisor's share of the problem's CPU time (see
  ``bench_timing.host_steal_counters``).
* Inputs are full-range random, B is constant: int8jit packs it once at creation (a
  reusable ``primitives.gemm.Gemm``); oneDNN's GEMM API takes B as is on every call.
  The row with ``B`` ``call`` is int8jit's own one-off call (``gemm_u8s8s32`` /
  ``gemm_s8s8s32``: B packed at every call, as oneDNN's call takes it; the kept GEMM of
  its signature), the like-for-like comparison: the same arrays at every call, as
  oneDNN's side gets them, which int8jit replays. ``B`` ``new``: the same call with new
  array objects (views) of the same memory at every call, to which the replay moves (by
  its guard, where it has one).
* Policies: VNNI paths are exact, one ``exact`` row. On the VPMADDUBSW paths three rows:
  ``faithful`` (computes what oneDNN computes there), ``exact`` with full-range weights
  (the proof fails, int8jit takes the widening path; % peak is of that path's peak) and
  ``exact`` with weights in [-64, 64] (``B`` column ``safe``: every pair proven safe,
  the fast VPMADDUBSW path). The oneDNN figure is the same for the three rows.

Adding a primitive: write a class like :class:`GemmBench` (shapes, types, the int8jit
and oneDNN callables) and register it in :data:`BENCHES`; the driver does the rest.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from runtime.isa import LADDER
from tools import bench_primitives, conv_sources  # the primitive benches, each with its own main
from tools.bench_problems import names_among, positive_ints, positive_seconds, runnable_isas, shape_list
from tools.bench_timing import (GOMP_SPINCOUNT, REPO_ROOT, SETTLE_S, WINDOW_S, Unavailable, cpu_brand,
                                host_steal_counters, measure_calls, peak_callable, steal_fraction, supported_isas)
from tools.cli import quiet_on_closed_stdout, writable_file


# ------------------------------------------------------------------ GEMM

class GemmBench:
    """``gemm_u8s8s32`` / ``gemm_s8s8s32``: row-major, no transposes, no offsets."""

    name = "gemm"
    shapes = [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048),
              (1, 4096, 4096), (64, 4096, 4096), (3136, 64, 576)]
    types = ("u8s8", "s8s8")
    SAFE_WEIGHT = 64  # 255 * (64 + 64) = 32640 <= 32767: every pair proven safe

    @staticmethod
    def ops(shape) -> int:
        M, N, K = shape
        return 2 * M * N * K

    @classmethod
    def operands(cls, shape, kind, weights: str = "full"):
        """Random A (u8 or s8, full range) and B (s8: full range, or |w| <= 64 for
        ``weights="safe"``), the same in every process."""
        M, N, K = shape
        rng = np.random.default_rng([M, N, K, kind == "s8s8"])
        A = rng.integers(0, 256, (M, K), dtype=np.uint8)
        if kind == "s8s8":
            A = A.view(np.int8)
        lim = 128 if weights == "full" else cls.SAFE_WEIGHT
        B = rng.integers(-lim, lim + (0 if weights == "full" else 1), (K, N), dtype=np.int16).astype(np.int8)
        return A, B, np.zeros((M, N), np.int32)

    @staticmethod
    def rows(isa: str, policies=None) -> list[tuple[str, str]]:
        """(policy, weights) rows of int8jit per problem on ``isa``, of ``policies`` (None:
        the default set, whose one-off rows are ``faithful``, what oneDNN's call computes).
        VNNI paths are exact under every policy: their ``exact`` rows answer any."""
        if isa.endswith("vnni"):
            return [("exact", "full"), ("exact", "call"), ("exact", "new")]
        if policies is None:
            return [("faithful", "full"), ("exact", "full"), ("exact", "safe"), ("faithful", "call"),
                    ("faithful", "new")]
        return ([("faithful", "full")] if "faithful" in policies else []) \
            + ([("exact", "full"), ("exact", "safe")] if "exact" in policies else []) \
            + [(p, w) for p in ("faithful", "exact") if p in policies for w in ("call", "new")]

    @classmethod
    def int8jit_callable(cls, shape, kind, isa, threads, policy, weights="full"):
        """(one-call callable, impl_info) for int8jit on a reusable primitive, or
        (``weights`` "call") its one-off call, or ("new") that call with new array objects
        each time (views of the same memory: checked and set up at every call, no replay)."""
        A, B, C = cls.operands(shape, kind, "full" if weights in ("call", "new") else weights)
        if weights in ("call", "new"):
            return int8jit_one_off_callable(kind, *shape, isa, threads, policy, A, B, C, new=weights == "new")
        return int8jit_gemm_callable(kind, *shape, isa, threads, policy, A, B, C)

    @classmethod
    def onednn_callable(cls, shape, kind):
        from tools import onednn

        A, B, C = cls.operands(shape, kind)
        M, N, K = shape
        return onednn.prepare_gemm(kind, "N", "N", "F", M, N, K, 1.0, A, K, 0, B, N, 0, 0.0,
                                   C, N, np.zeros(1, np.int32))


def int8jit_gemm_callable(kind, M, N, K, isa, threads, policy, A, B, C):
    """A zero-argument callable doing one int8jit GEMM on a reusable primitive, and its
    ``impl_info()``. B is constant (packed once, at creation)."""
    try:
        from primitives.gemm import Gemm
    except ImportError as exc:
        raise Unavailable(f"int8jit gemm not available yet ({exc})") from None
    g = Gemm(M, N, K, a_type=kind[:2], B=B, policy=policy, isa=isa, threads=threads)

    def call():
        g.execute(A, C)

    call()  # builds (or loads) the kernel, so impl_info names it
    return call, g.impl_info()


def int8jit_one_off_callable(kind, M, N, K, isa, threads, policy, A, B, C, new: bool = False):
    """A zero-argument callable making one-off calls of ``gemm_u8s8s32`` (``gemm_s8s8s32``)
    with B given at every call, as oneDNN's, and the kept GEMM's ``impl_info()``. The same
    arrays at every call (replayed: ``Gemm.execute``), or (``new``) new views of them."""
    from primitives import gemm

    fn = gemm.gemm_u8s8s32 if kind == "u8s8" else gemm.gemm_s8s8s32
    co = np.zeros(1, np.int32)

    if new:
        def call():
            fn("N", "N", "F", M, N, K, 1.0, A.view(), K, 0, B.view(), N, 0, 0.0, C.view(), N, co.view(), policy=policy,
               isa=isa, threads=threads)
    else:
        def call():
            fn("N", "N", "F", M, N, K, 1.0, A, K, 0, B, N, 0, 0.0, C, N, co, policy=policy, isa=isa, threads=threads)

    g = gemm._gemm_call(kind[:2], "N", "N", "F", M, N, K, 1.0, A, K, 0, B, N, 0, 0.0, C, N, co, policy, isa, threads)
    return call, g.impl_info()


BENCHES = {"gemm": GemmBench, "matmul": bench_primitives.MatmulCommand, "ip": bench_primitives.IpCommand,
           "conv": bench_primitives.ConvCommand, "pool": bench_primitives.PoolCommand,
           "conv-sources": conv_sources}


# ------------------------------------------------------------------ the child

def _worker(spec_json: str) -> None:
    """Child side: per problem, oneDNN, every int8jit row and the peaks, interleaved.

    Prints one JSON line per problem as it finishes, then exits hard.
    """
    spec = json.loads(spec_json)
    bench = BENCHES[spec["bench"]]
    isa, threads, min_time = spec["isa"], spec["threads"], spec["min_time"]
    onednn_ok, onednn_why, onednn_isa = False, "not tried", None
    try:
        from tools import onednn

        onednn_ok, onednn_why = onednn.available()
        if onednn_ok:
            onednn_isa = onednn.effective_isa()
    except Exception as exc:  # noqa: BLE001 - report any failure to load the peer
        onednn_why = f"{type(exc).__name__}: {exc}"
    for shape, kind in spec["problems"]:
        shape = tuple(shape)
        out = {"shape": shape, "kind": kind, "onednn": None, "onednn_isa": onednn_isa, "rows": []}
        fns, ops = {}, {}
        if onednn_ok:
            try:
                fns["onednn"], ops["onednn"] = bench.onednn_callable(shape, kind), bench.ops(shape)
            except Exception as exc:  # noqa: BLE001
                out["onednn"] = f"error: {exc}"
        else:
            out["onednn"] = f"unavailable: {onednn_why}"
        for policy, weights in bench.rows(isa, spec.get("policies")):
            row = {"policy": policy, "weights": weights, "path": "", "gops": None, "error": None}
            try:
                name = f"int8jit/{policy}/{weights}"
                fn, info = bench.int8jit_callable(shape, kind, isa, threads, policy, weights)
                fns[name], ops[name] = fn, bench.ops(shape)
                row.update(name=name, path=info.get("path", ""), isa_ran=info.get("isa", isa),
                           kernel=(info.get("kernels") or [""])[0])
                peak_name = f"peak/{row['path']}"
                if peak_name not in fns:
                    try:
                        fns[peak_name], ops[peak_name] = peak_callable(row["isa_ran"], row["path"] or None)
                    except Exception as exc:  # noqa: BLE001
                        row["peak_error"] = str(exc)
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {exc}"
            out["rows"].append(row)
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        before = host_steal_counters(cpus)
        # (oneDNN's idle OpenMP workers spin after its window: GOMP_SPINCOUNT and a pause)
        times = measure_calls(fns, min_time, peers=("onednn",), settle=SETTLE_S if threads > 1 else 0.0) \
            if fns else {}
        out["steal"] = steal_fraction(before, host_steal_counters(cpus))
        gops = {name: (ops[name] / best / 1e9, ops[name] / median / 1e9) for name, (best, median) in times.items()}
        if "onednn" in gops:
            out["onednn"] = gops["onednn"][0]
        for row in out["rows"]:
            if row.get("name") in gops:
                row["gops"], row["gops_median"] = gops[row["name"]]
                row["peak"] = gops.get(f"peak/{row['path']}", (None,))[0]
        print(json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown under OpenMP's idle threads


def child_results(bench, isa: str, threads: int, problems, min_time: float, policies=None):
    """Yield the child's result per problem (dicts; one {"_error": ...} if it failed)."""
    from tools import onednn

    spec = {"bench": bench.name, "isa": isa, "threads": threads, "min_time": min_time, "policies": policies,
            "problems": [[list(shape), kind] for shape, kind in problems]}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.bench", "_worker", json.dumps(spec)],
        env=onednn.child_env(isa, threads), cwd=REPO_ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    got = 0
    for line in proc.stdout:
        if line.startswith("{"):
            got += 1
            yield json.loads(line)
    err = proc.stderr.read()
    if proc.wait() != 0 or got < len(problems):
        yield {"_error": f"child for {isa} x{threads} failed ({proc.returncode}): {err.strip()[-300:]}"}


# ------------------------------------------------------------------ the table

@dataclass
class Row:
    bench: str
    shape: tuple
    kind: str
    isa: str
    threads: int
    policy: str
    weights: str = "full"
    path: str = ""
    int8jit_gops: float | None = None
    peak_gops: float | None = None
    onednn_gops: float | None = None
    noise: float | None = None  # int8jit's median window vs its best, as a fraction
    steal: float | None = None  # the hypervisor's share of the problem's CPU time (bench_timing)
    notes: list = field(default_factory=list)

    @property
    def pct_peak(self):
        if self.int8jit_gops is None or not self.peak_gops:
            return None
        return 100.0 * self.int8jit_gops / (self.peak_gops * self.threads)

    @property
    def ratio(self):
        if self.int8jit_gops is None or not self.onednn_gops:
            return None
        return self.int8jit_gops / self.onednn_gops


COLUMNS = [("shape", 16), ("type", 5), ("ISA", 16), ("thr", 3), ("policy", 8), ("B", 4), ("path", 8),
           ("int8jit", 8), ("% peak", 7), ("oneDNN", 8), ("ratio", 6), ("noise", 6), ("steal", 6), ("note", 0)]
LEFT = ("shape", "type", "ISA", "policy", "B", "path", "note")


def _fmt(value, spec):
    return "n/a" if value is None else format(value, spec)


def _cells(row: Row) -> list[str]:
    M, N, K = row.shape
    return [f"{M}x{N}x{K}", row.kind, row.isa, str(row.threads), row.policy, row.weights, row.path,
            _fmt(row.int8jit_gops, ".1f"), _fmt(row.pct_peak, ".0f"),
            _fmt(row.onednn_gops, ".1f"), _fmt(row.ratio, ".2f"),
            "n/a" if row.noise is None else f"{100 * row.noise:.0f}%",
            "n/a" if row.steal is None else f"{100 * row.steal:.0f}%", "; ".join(row.notes)]


def print_header():
    print("  ".join(name.ljust(w) if name in LEFT else name.rjust(w) for name, w in COLUMNS).rstrip())


def print_row(row: Row):
    out = []
    for (name, w), cell in zip(COLUMNS, _cells(row)):
        out.append(cell.ljust(w) if name in LEFT else cell.rjust(w))
    print("  ".join(out).rstrip(), flush=True)


def write_csv(path: str, rows: list[Row]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["bench", "M", "N", "K", "type", "isa", "threads", "policy", "weights", "path",
                    "int8jit_gops", "peak_gops_per_core", "pct_peak", "onednn_gops", "ratio", "noise", "steal",
                    "note"])
        for r in rows:
            numbers = [None if x is None else round(x, 3)
                       for x in (r.int8jit_gops, r.peak_gops, r.pct_peak, r.onednn_gops, r.ratio, r.noise, r.steal)]
            w.writerow([r.bench, *r.shape, r.kind, r.isa, r.threads, r.policy, r.weights, r.path,
                        *numbers, "; ".join(r.notes)])


def markdown_table(rows: list[Row], preamble: str = "") -> str:
    """The rows as a GitHub markdown table (what the README shows)."""
    names = ["shape (MxNxK)", "type", "ISA path", "threads", "policy", "B", "kernel path",
             "int8jit GOPS", "% of peak", "oneDNN GOPS", "int8jit / oneDNN", "noise", "steal", "note"]
    lines = [preamble] if preamble else []
    lines.append("| " + " | ".join(names) + " |")
    lines.append("|" + "|".join(" --- " if n in ("shape (MxNxK)", "type", "ISA path", "policy", "B", "kernel path",
                                                  "note") else " ---: " for n in names) + "|")
    for r in rows:
        cells = _cells(r)
        cells[8] = cells[8] + "%" if cells[8] != "n/a" else cells[8]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ driver

def run_bench(bench, args) -> tuple[list[Row], str]:
    # (the options' values were checked and joined by their argparse types: bench_problems')
    cores = os.cpu_count() or 1
    threads = [int(x) for x in args.threads.split(",")] if args.threads else sorted({1, cores})
    isas = args.isa.split(",") if args.isa else supported_isas()
    shapes = [tuple(int(x) for x in s.lower().split("x")) for s in args.shapes.split(",")] if args.shapes \
        else bench.shapes
    kinds = args.types.split(",") if args.types else list(bench.types)
    wanted = args.policy.split(",") if args.policy else None
    min_time = args.min_time if args.min_time is not None else (0.03 if args.quick else 0.3)
    problems = [(shape, kind) for shape in shapes for kind in kinds]

    # libgomp's default spin (300,000 PAUSEs) after oneDNN's window took a core from the
    # int8jit row timed next: 2048^3 on two threads at 0.73 of oneDNN for whichever row
    # came first, 0.99-1.02 for the next (the children inherit this setting)
    os.environ.setdefault("GOMP_SPINCOUNT", GOMP_SPINCOUNT)
    from tools import onednn

    ok, why = onednn.available()
    lines = [
        f"machine: {cpu_brand()}, {cores} cores; ISA paths here: {', '.join(supported_isas())}; "
        f"load average {os.getloadavg()[0]:.2f} at the start (other work on the cores skews the figures)",
        f"oneDNN:  {onednn.version() + ' from ' + str(onednn.library_path()) if ok else why}",
        f"timing:  oneDNN, int8jit and the peak loop in alternating ~{1000 * WINDOW_S:g} ms windows, "
        f">= {min_time:g} s each, best window; GOPS = 2*M*N*K/s; % peak = int8jit / (path's "
        "register-only peak per core, measured alongside, x threads); noise = int8jit's median "
        "window vs its best; steal = the hypervisor's share of the problem's CPU time; "
        f"GOMP_SPINCOUNT={os.environ['GOMP_SPINCOUNT']} for oneDNN's OpenMP workers",
    ]
    for line in lines:
        print(line)
    print()
    print_header()
    rows: list[Row] = []
    for isa in isas:
        for nthreads in threads:
            for result in child_results(bench, isa, nthreads, problems, min_time, wanted):
                if "_error" in result:
                    print(f"  {isa} x{nthreads}: {result['_error']}", flush=True)
                    continue
                shape, kind = tuple(result["shape"]), result["kind"]
                for r in result["rows"]:
                    row = Row(bench.name, shape, kind, isa, nthreads, r["policy"], r["weights"], r["path"])
                    if wanted is not None and r["policy"] not in wanted:  # (a VNNI path's exact row)
                        row.notes.append(f"{'/'.join(wanted)}: the same on VNNI")
                    got = result["onednn"]
                    if isinstance(got, float):
                        row.onednn_gops = got
                    else:
                        row.notes.append(f"oneDNN: {got}")
                    if result.get("onednn_isa") not in (None, isa):
                        row.notes.append(f"oneDNN ran {result['onednn_isa']}")
                    if r.get("error"):
                        row.notes.append(f"int8jit error: {r['error']}")
                    if r.get("isa_ran", isa) != isa:
                        row.notes.append(f"int8jit ran {r['isa_ran']}")
                    row.int8jit_gops, row.peak_gops = r.get("gops"), r.get("peak")
                    if r.get("gops") and r.get("gops_median"):
                        row.noise = r["gops"] / r["gops_median"] - 1.0
                    row.steal = result.get("steal")
                    if r.get("peak_error"):
                        row.notes.append(f"peak: {r['peak_error']}")
                    print_row(row)
                    rows.append(row)
    return rows, "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_worker"]:  # (a child: its pipe is the parent's, and it ends in os._exit)
        _worker(argv[1])
        return 0
    # `int8jit-bench gemm | head`: stop quietly, status 0 (the children end at their next line)
    return quiet_on_closed_stdout(lambda: _main(argv))


def _main(argv: list[str]) -> int:
    if argv[:1] and hasattr(BENCHES.get(argv[0]), "main"):  # matmul, ip, conv, pool: their own drivers
        return BENCHES[argv[0]].main(argv[1:])
    ap = argparse.ArgumentParser(prog="int8jit-bench", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="bench", required=True, metavar="{" + ",".join(BENCHES) + "}")
    for name, bench in BENCHES.items():
        p = sub.add_parser(name, help=bench.__doc__.split("\n")[0])
        if hasattr(bench, "main"):
            continue
        # (bad values refused here, exit status 2: see bench_problems' argument types)
        p.add_argument("--isa", type=runnable_isas,
                       help=f"comma-separated ISA paths ({', '.join(LADDER)}); default: every path this CPU executes")
        p.add_argument("--threads", type=positive_ints, help="comma-separated thread counts (default: 1 and all cores)")
        p.add_argument("--shapes", type=shape_list, help="comma-separated MxNxK (default: the issue's list)")
        p.add_argument("--types", type=names_among(bench.types, "type"),
                       help=f"comma-separated types ({', '.join(bench.types)})")
        p.add_argument("--policy", type=names_among(("exact", "faithful"), "policy"),
                       help="only these int8jit policies (exact, faithful)")
        p.add_argument("--min-time", type=positive_seconds, help="seconds of timed windows per side and problem")
        p.add_argument("--quick", action="store_true", help="short timings (a smoke run)")
        p.add_argument("--csv", metavar="FILE", type=writable_file, help="also write the rows as CSV")
        p.add_argument("--markdown", metavar="FILE", type=writable_file, help="also write the rows as a markdown table")
    args = ap.parse_args(argv)
    command = "int8jit-bench " + " ".join(argv)
    rows, preamble = run_bench(BENCHES[args.bench], args)
    if args.csv:
        write_csv(args.csv, rows)
        print(f"\nwrote {len(rows)} rows to {args.csv}")
    if args.markdown:
        text = "`" + command + "`\n\n" + "\n".join(f"- {line}" for line in preamble.splitlines()) + "\n\n"
        Path(args.markdown).write_text(text + markdown_table(rows))
        print(f"wrote {len(rows)} rows to {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
