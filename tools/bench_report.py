"""How ``int8jit-bench matmul / ip / conv / pool`` reports: one :class:`Result` per row
(ms, GOPS, percent of peak, the ratio to oneDNN and to PyTorch, noise, steal, the
output check), printed as a table and written as CSV or markdown.

>>> from tools.bench_problems import GEMM_SHAPES
>>> from tools.bench_report import Result, columns, format_row
>>> r = Result("ip", dict(GEMM_SHAPES[0], prim="ip"), 1, "avx2", int8jit_s=1e-3, onednn_s=1.1e-3, peak=200.0)
>>> round(r.ratio, 2), round(r.gops(r.int8jit_s), 1), round(r.pct(r.int8jit_s), 1)
(1.1, 151.0, 75.5)
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field

import numpy as np

from tools.bench_problems import ops, pool_bytes

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


def fmt(value, spec):
    return "n/a" if value is None else format(value, spec)


def columns(bench: str, label_width: int = 26):
    """(header, width, right-aligned, getter) of each printed column."""
    ms = lambda s: fmt(None if s is None else 1e3 * s, ".3f")  # noqa: E731
    cols = [("problem", label_width, False, lambda r: r.case["label"])]
    if bench in ("matmul", "ip"):
        cols.append(("MxNxK", 15, False, lambda r: f"{r.case['M']}x{r.case['N']}x{r.case['K']}"))
    else:
        cols.append(("N", 2, True, lambda r: str(r.case["N"])))
    cols.append(("thr", 3, True, lambda r: str(r.threads)))
    cols += [("int8jit ms", 10, True, lambda r: ms(r.int8jit_s))]
    if bench == "pool":
        cols += [("GB/s", 6, True, lambda r: fmt(r.gbs(r.int8jit_s), ".1f")),
                 ("oneDNN ms", 9, True, lambda r: ms(r.onednn_s)),
                 ("GB/s", 6, True, lambda r: fmt(r.gbs(r.onednn_s), ".1f"))]
    else:
        cols += [("GOPS", 6, True, lambda r: fmt(r.gops(r.int8jit_s), ".1f")),
                 ("%pk", 4, True, lambda r: fmt(r.pct(r.int8jit_s), ".0f")),
                 ("oneDNN ms", 9, True, lambda r: ms(r.onednn_s)),
                 ("GOPS", 6, True, lambda r: fmt(r.gops(r.onednn_s), ".1f")),
                 ("%pk", 4, True, lambda r: fmt(r.pct(r.onednn_s), ".0f"))]
    cols.append(("ratio", 5, True, lambda r: fmt(r.ratio, ".2f")))
    if bench == "conv":
        cols += [("torch ms", 8, True, lambda r: "-" if r.torch_s is None else ms(r.torch_s)),
                 ("/torch", 6, True, lambda r: "-" if r.torch_ratio is None else fmt(r.torch_ratio, ".2f"))]
    if bench in ("matmul", "ip"):
        cols += [("s32 ms", 7, True, lambda r: ms(r.int8jit_plain_s)),
                 ("ovh%", 5, True, lambda r: fmt(r.overhead(r.int8jit_s, r.int8jit_plain_s), "+.0f")),
                 ("dnn ovh%", 8, True, lambda r: fmt(r.overhead(r.onednn_s, r.onednn_plain_s), "+.0f"))]
    cols += [("noise", 5, True, lambda r: fmt(None if r.noise is None else 100 * r.noise, ".0f") + "%"),
             ("steal", 5, True, lambda r: fmt(None if r.steal is None else 100 * r.steal, ".0f") + "%"),
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


def check_outputs(a: np.ndarray, b: np.ndarray) -> str:
    """``=`` where ``a`` and ``b`` are equal, else how many elements differ and by at most how much."""
    if a.shape != b.shape:
        return f"shape {a.shape}/{b.shape}"
    d = np.abs(a.astype(np.int64) - b.astype(np.int64))
    bad = int(np.count_nonzero(d))
    return "=" if bad == 0 else f"{bad} (<={int(d.max())})"
