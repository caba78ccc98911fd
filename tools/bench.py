"""int8jit-bench: int8jit and oneDNN side by side, per ISA path, thread count and policy.

    int8jit-bench gemm                    # every shape, u8s8 and s8s8, every ISA path
    int8jit-bench gemm --quick            # a fast smoke run (short timings)
    int8jit-bench gemm --isa avx2,avx512_core_vnni --threads 1 --shapes 1024x1024x1024
    int8jit-bench gemm --csv gemm.csv     # also save the rows

For each problem the table shows int8jit's GOPS (2*M*N*K / s), its percentage of the
machine's peak (the register-only loop of the path the kernel uses, from
:func:`jit.peak.measure_peak`, times the thread count), oneDNN's GOPS on the same ISA
path and thread count, and the ratio int8jit / oneDNN.

How it measures:

* Each measurement is one warm-up call, then single calls timed back to back until
  ``--min-time`` seconds (0.2; 0.02 with ``--quick``) and at least 3 calls; the median
  call time counts. Inputs are full-range random, B is constant: int8jit packs it once
  at creation (a reusable ``primitives.gemm.Gemm``); oneDNN's GEMM API takes B as is
  on every call.
* oneDNN fixes its ISA when it loads, so its timings run in one child process per (ISA,
  thread count), started with ``ONEDNN_MAX_CPU_ISA`` (AVX2, AVX2_VNNI, AVX512_CORE,
  AVX512_CORE_VNNI: the path's name in upper case; the VNNI row is capped too, since on
  a CPU with AMX oneDNN's default is AMX) and ``OMP_NUM_THREADS``; int8jit runs in this
  process, just after, on the same data. A child that ends up on another ISA says so.
* Policies: VNNI paths are exact, one ``exact`` row. On the VPMADDUBSW paths two rows:
  ``faithful`` (computes what oneDNN computes there) and ``exact`` (with full-range
  weights the proof fails and int8jit takes the widening path; its peak is that path's).

Adding a primitive: write a class like :class:`GemmBench` (shapes, types, the int8jit
and oneDNN callables) and register it in :data:`BENCHES`; the driver does the rest.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
LADDER = ("avx2", "avx2_vnni", "avx512_core", "avx512_core_vnni")


class Unavailable(RuntimeError):
    """A side of the comparison that cannot run here (printed in its column)."""


# ------------------------------------------------------------------ timing

def measure(fn, min_time: float, min_calls: int = 3, max_calls: int = 100_000) -> float:
    """Median seconds of one ``fn()`` call after a warm-up call."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_calls or (time.perf_counter() - start < min_time and len(times) < max_calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ------------------------------------------------------------------ GEMM

class GemmBench:
    """``gemm_u8s8s32`` / ``gemm_s8s8s32``: row-major, no transposes, no offsets."""

    name = "gemm"
    shapes = [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048),
              (1, 4096, 4096), (64, 4096, 4096), (3136, 64, 576)]
    types = ("u8s8", "s8s8")

    @staticmethod
    def ops(shape) -> int:
        M, N, K = shape
        return 2 * M * N * K

    @staticmethod
    def operands(shape, kind):
        """Full-range random A (u8 or s8) and B (s8), the same in every process."""
        M, N, K = shape
        rng = np.random.default_rng([M, N, K, kind == "s8s8"])
        A = rng.integers(0, 256, (M, K), dtype=np.uint8)
        if kind == "s8s8":
            A = A.view(np.int8)
        B = rng.integers(-128, 128, (K, N), dtype=np.int16).astype(np.int8)
        return A, B, np.zeros((M, N), np.int32)

    @classmethod
    def int8jit_callable(cls, shape, kind, isa, threads, policy):
        """(one-call callable, impl_info) for int8jit on a reusable primitive."""
        A, B, C = cls.operands(shape, kind)
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


from tools import bench_primitives  # noqa: E402  (the primitive benches, each with its own main)

BENCHES = {"gemm": GemmBench, "matmul": bench_primitives.MatmulCommand, "ip": bench_primitives.IpCommand,
           "conv": bench_primitives.ConvCommand, "pool": bench_primitives.PoolCommand}


# ------------------------------------------------------------------ the machine

def cpu_brand() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"


def supported_isas() -> list[str]:
    """The ISA paths this CPU executes (runtime.isa), else read from /proc/cpuinfo."""
    try:
        from runtime.isa import supported

        return list(supported())
    except ImportError:
        from runtime.isa import REQUIRES

        flags: set[str] = set()
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
        return [isa for isa in LADDER if all(f in flags for f in REQUIRES[isa])]


_peaks: dict = {}


def peak_gops(isa: str, path: str | None):
    """Single-core GOPS of the register-only loop of ``path`` on ``isa`` (None if n/a)."""
    key = (isa, path)
    if key not in _peaks:
        try:
            from jit.peak import measure_peak

            _peaks[key] = measure_peak(isa, path)
        except Exception as exc:  # not built yet, or this CPU lacks the path
            print(f"  (peak of {isa}/{path} unavailable: {exc})", file=sys.stderr)
            _peaks[key] = None
    return _peaks[key]


# ------------------------------------------------------------------ oneDNN children

def onednn_times(bench, isa: str, threads: int, problems, min_time: float) -> dict:
    """{(shape, kind): GOPS or error text} from a child capped at ``isa``."""
    from tools import onednn

    ok, why = onednn.available()
    if not ok:
        return {"_error": f"oneDNN unavailable: {why}"}
    spec = {"bench": bench.name, "min_time": min_time,
            "problems": [[list(shape), kind] for shape, kind in problems]}
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench", "_onednn-worker", json.dumps(spec)],
        env=onednn.child_env(isa, threads), cwd=REPO_ROOT, capture_output=True, text=True,
    )
    if proc.returncode != 0:
        return {"_error": f"oneDNN child failed ({proc.returncode}): {proc.stderr.strip()[-300:]}"}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    result = {(tuple(s), k): v for s, k, v in out["results"]}
    if out["isa"] != isa:
        result["_note"] = f"oneDNN ran {out['isa']}"
    return result


def _onednn_worker(spec_json: str) -> None:
    """Child side: time each problem with oneDNN, print one JSON line, exit hard."""
    from tools import onednn

    spec = json.loads(spec_json)
    bench = BENCHES[spec["bench"]]
    results = []
    for shape, kind in spec["problems"]:
        shape = tuple(shape)
        try:
            seconds = measure(bench.onednn_callable(shape, kind), spec["min_time"])
            results.append([shape, kind, bench.ops(shape) / seconds / 1e9])
        except Exception as exc:
            results.append([shape, kind, f"error: {exc}"])
    print(json.dumps({"isa": onednn.effective_isa(), "version": onednn.version(),
                      "threads": onednn.max_threads(), "results": results}))
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown under OpenMP's idle threads


# ------------------------------------------------------------------ the table

@dataclass
class Row:
    bench: str
    shape: tuple
    kind: str
    isa: str
    threads: int
    policy: str
    path: str = ""
    int8jit_gops: float | None = None
    peak_gops: float | None = None
    onednn_gops: float | None = None
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


COLUMNS = [("shape", 16), ("type", 5), ("ISA", 16), ("thr", 3), ("policy", 8), ("path", 8),
           ("int8jit", 8), ("% peak", 7), ("oneDNN", 8), ("ratio", 6), ("note", 0)]


def _fmt(value, spec):
    return "n/a" if value is None else format(value, spec)


def print_header():
    print("  ".join(name.rjust(w) if w and name not in ("shape", "type", "ISA", "policy", "path")
                    else name.ljust(w) for name, w in COLUMNS).rstrip())


def print_row(row: Row):
    M, N, K = row.shape
    cells = [f"{M}x{N}x{K}", row.kind, row.isa, str(row.threads), row.policy, row.path,
             _fmt(row.int8jit_gops, ".1f"), _fmt(row.pct_peak, ".0f"),
             _fmt(row.onednn_gops, ".1f"), _fmt(row.ratio, ".2f"), "; ".join(row.notes)]
    out = []
    for (name, w), cell in zip(COLUMNS, cells):
        left = name in ("shape", "type", "ISA", "policy", "path", "note")
        out.append(cell.ljust(w) if left else cell.rjust(w))
    print("  ".join(out).rstrip(), flush=True)


def write_csv(path: str, rows: list[Row]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["bench", "M", "N", "K", "type", "isa", "threads", "policy", "path",
                    "int8jit_gops", "peak_gops_per_core", "pct_peak", "onednn_gops", "ratio", "note"])
        for r in rows:
            numbers = [None if x is None else round(x, 3)
                       for x in (r.int8jit_gops, r.peak_gops, r.pct_peak, r.onednn_gops, r.ratio)]
            w.writerow([r.bench, *r.shape, r.kind, r.isa, r.threads, r.policy, r.path,
                        *numbers, "; ".join(r.notes)])


# ------------------------------------------------------------------ driver

def _parse_list(text, allowed=None, convert=str, what="value"):
    items = [convert(x.strip()) for x in text.split(",") if x.strip()]
    if allowed is not None:
        bad = [x for x in items if x not in allowed]
        if bad:
            raise SystemExit(f"unknown {what} {bad}; expected some of {', '.join(map(str, allowed))}")
    return items


def _parse_shape(text):
    try:
        M, N, K = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--shapes: expected MxNxK, got {text!r}") from None
    return (M, N, K)


def run_bench(bench, args) -> list[Row]:
    cores = os.cpu_count() or 1
    threads = _parse_list(args.threads, convert=int) if args.threads else sorted({1, cores})
    isas = _parse_list(args.isa, LADDER, what="ISA") if args.isa else supported_isas()
    shapes = [_parse_shape(s) for s in args.shapes.split(",")] if args.shapes else bench.shapes
    kinds = _parse_list(args.types, bench.types, what="type") if args.types else list(bench.types)
    wanted = _parse_list(args.policy, ("exact", "faithful"), what="policy") if args.policy else None
    min_time = args.min_time if args.min_time is not None else (0.02 if args.quick else 0.2)
    problems = [(shape, kind) for shape in shapes for kind in kinds]

    from tools import onednn

    ok, why = onednn.available()
    print(f"machine: {cpu_brand()}, {cores} cores; ISA paths here: {', '.join(supported_isas())}; "
          f"load average {os.getloadavg()[0]:.2f} (other work on the cores skews the figures)")
    print(f"oneDNN:  {onednn.version() + ' from ' + str(onednn.library_path()) if ok else why}")
    print(f"timing:  median of calls over >= {min_time:g} s after a warm-up; GOPS = 2*M*N*K/s; "
          f"% peak = int8jit / (path's register-only peak per core x threads)")
    print()
    print_header()
    rows: list[Row] = []
    for isa in isas:
        vnni = isa.endswith("vnni")
        policies = [p for p in (["exact"] if vnni else ["faithful", "exact"])
                    if wanted is None or p in wanted]
        for nthreads in threads:
            peer = onednn_times(bench, isa, nthreads, problems, min_time)
            for shape, kind in problems:
                for policy in policies:
                    row = Row(bench.name, shape, kind, isa, nthreads, policy)
                    got = peer.get((shape, kind), peer.get("_error", "no result"))
                    if isinstance(got, float):
                        row.onednn_gops = got
                    else:
                        row.notes.append(f"oneDNN: {got}")
                    if "_note" in peer:
                        row.notes.append(peer["_note"])
                    try:
                        call, info = bench.int8jit_callable(shape, kind, isa, nthreads, policy)
                        row.path = info.get("path", "")
                        if info.get("isa", isa) != isa:
                            row.notes.append(f"int8jit ran {info['isa']}")
                        row.int8jit_gops = bench.ops(shape) / measure(call, min_time) / 1e9
                        row.peak_gops = peak_gops(info.get("isa", isa), row.path or None)
                    except Unavailable as exc:
                        row.notes.append(str(exc))
                    except Exception as exc:
                        row.notes.append(f"int8jit error: {type(exc).__name__}: {exc}")
                    print_row(row)
                    rows.append(row)
    return rows


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_onednn-worker"]:
        _onednn_worker(argv[1])
        return 0
    if argv[:1] and hasattr(BENCHES.get(argv[0]), "main"):  # matmul, ip, conv, pool: their own drivers
        return BENCHES[argv[0]].main(argv[1:])
    ap = argparse.ArgumentParser(prog="int8jit-bench", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="bench", required=True, metavar="{" + ",".join(BENCHES) + "}")
    for name, bench in BENCHES.items():
        p = sub.add_parser(name, help=bench.__doc__.split("\n")[0])
        p.add_argument("--isa", help=f"comma-separated ISA paths ({', '.join(LADDER)}); "
                                     "default: every path this CPU executes")
        p.add_argument("--threads", help="comma-separated thread counts (default: 1 and all cores)")
        p.add_argument("--shapes", help="comma-separated MxNxK (default: the issue's list)")
        p.add_argument("--types", help=f"comma-separated types ({', '.join(bench.types)})")
        p.add_argument("--policy", help="only these int8jit policies (exact, faithful)")
        p.add_argument("--min-time", type=float, help="seconds of timed calls per measurement")
        p.add_argument("--quick", action="store_true", help="short timings (a smoke run)")
        p.add_argument("--csv", metavar="FILE", help="also write the rows as CSV")
    args = ap.parse_args(argv)
    rows = run_bench(BENCHES[args.bench], args)
    if args.csv:
        write_csv(args.csv, rows)
        print(f"\nwrote {len(rows)} rows to {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
