"""``cpu-probe``: what this CPU and OS offer int8jit, and which kernels it will run.

Prints the CPU (vendor, brand, family/model/stepping), every feature the probe knows
with its CPUID bit and the OS register-state check (XCR0), the ISA ladder levels this
CPU supports, the cap in force (``INT8JIT_MAX_ISA``, ``--max-isa`` or the default), the
effective ISA, and the kernel family each primitive uses on it. ``--json`` prints the
same as one JSON object; ``--peak`` adds the measured single-thread int8 peak (GOPS) of
every ISA path the CPU supports.

Example::

    $ cpu-probe
    $ INT8JIT_MAX_ISA=avx2 cpu-probe --json | python -m json.tool
    $ python -m tools.cpu_probe --peak

Exit status: 0, or 2 for a usage error (an unknown ISA name in ``INT8JIT_MAX_ISA`` or
``--max-isa``), reported in one line on stderr; 0 too where stdout's reader stops early
(``cpu-probe --json | head``: no traceback, see :func:`quiet_on_closed_stdout`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any, Sequence

from runtime import isa as isa_mod
from runtime.caches import data_caches
from runtime.cpu import FEATURES, CpuInfo, cpu_info
from tools.cli import quiet_on_closed_stdout

PROG = "cpu-probe"

# The kernel family (dot-product step) of each ladder level. Kept here, not in runtime/:
# this is what the tool reports; jit/ owns the templates themselves.
_WIDEN = ("exact policy, where saturation is possible: VPSHUFB-widened A, VPMADDWD+VPADDD on weights "
          "widened to s16 when packed")
KERNEL_FAMILY: dict[str, str] = {
    "avx512_core_vnni": "VPDPBUSD zmm (EVEX)",
    "avx2_vnni": "VPDPBUSD ymm (VEX, AVX-VNNI)",
    "avx512_core": f"VPMADDUBSW+VPMADDWD+VPADDD zmm ({_WIDEN})",
    "avx2": f"VPMADDUBSW+VPMADDWD+VPADDD ymm ({_WIDEN})",
}
# primitive -> (kind, what): "dot" primitives run the level's dot-product family (what:
# how they map onto it); "own" ones have a kernel of their own (what: its description).
PRIMITIVES: dict[str, tuple[str, str]] = {
    "gemm_u8s8s32": ("dot", ""),
    "gemm_s8s8s32": ("dot", "s8 source shifted by +128 with compensation"),
    "matmul": ("dot", "batch-reduce GEMM, batch of one"),
    "inner_product": ("dot", "as matmul"),
    "convolution": ("dot", "batch-reduce GEMM over the kernel positions; depthwise (groups == IC == OC) "
                           "has a kernel of its own, bytes widened to s16/s32, exact under every policy"),
    "pooling": ("own", "a kernel of its own: VPMAXUB/VPMAXSB (max); s16 or s32 sums and an f32 division (average)"),
    "reorder": ("own", "a kernel of its own: f32 scales and zero points, VCVTPS2DQ, saturating packs "
                       "(transpositions in numpy)"),
}
_STATE_LABEL = {"ymm": "YMM", "zmm": "ZMM", "amx": "AMX"}


def kernel_family(isa: str) -> str:
    """The dot-product kernel family int8jit uses on ladder level ``isa``."""
    return KERNEL_FAMILY[isa_mod.check_name(isa)]


def primitive_kernels(isa: str | None) -> dict[str, dict[str, str | None]]:
    """Per primitive: status and the kernel it runs on ``isa`` (None: no usable ISA)."""
    out: dict[str, dict[str, str | None]] = {}
    for name, (kind, what) in PRIMITIVES.items():
        if isa is None:
            kernel = None
        elif kind == "own":
            kernel = what
        else:
            kernel = kernel_family(isa) + (f"; {what}" if what else "")
        out[name] = {"status": "available", "kernel": kernel}
    return out


def _cap_source(cli_cap: str | None) -> str:
    if cli_cap is not None:
        return "--max-isa"
    return {"api": "set_max_isa()", "env": isa_mod.ENV_CAP, "default": "default (top of the ladder)"}[
        isa_mod.cap_source()]


def _feature_rows(info: CpuInfo) -> list[dict[str, Any]]:
    rows = []
    for name in FEATURES:
        state = info.state_check(name)
        rows.append({
            "name": name,
            "cpu": info.cpu_bits[name],
            "os_state": state,
            "os_ok": True if state is None else info.has(f"os_{state}"),
            "usable": info.has(name),
        })
    return rows


def _measure_peaks(isas: Sequence[str]) -> dict[str, Any]:
    """``{"gops": {isa: float}, "errors": {isa: str}, "unavailable": str | None}``."""
    result: dict[str, Any] = {"gops": {}, "errors": {}, "unavailable": None}
    try:
        from jit.peak import measure_peak  # lazy: PeachPy and code generation only here
    except ModuleNotFoundError as exc:
        if exc.name in ("jit.peak", "jit"):
            result["unavailable"] = "jit.peak is not available in this build yet: no peak measurement"
        else:
            result["unavailable"] = f"jit.peak could not be imported: {exc}"
        return result
    except Exception as exc:  # a broken module must not take the probe down
        result["unavailable"] = f"jit.peak could not be imported: {type(exc).__name__}: {exc}"
        return result
    for name in isas:
        try:
            result["gops"][name] = float(measure_peak(name))
        except Exception as exc:
            result["errors"][name] = f"{type(exc).__name__}: {exc}"
    return result


def collect(cap: str | None = None, peak: bool = False) -> dict[str, Any]:
    """Everything the tool reports, as a JSON-ready dict.

    ``cap`` overrides the cap in force (it is validated; :class:`runtime.isa.IsaError`
    for an unknown name, as for an unknown ``INT8JIT_MAX_ISA``).
    """
    source = _cap_source(cap)
    cap_in_force = isa_mod.check_name(cap, "--max-isa") if cap is not None else isa_mod.max_isa()
    info = cpu_info()
    supported = isa_mod.supported()
    try:
        effective: str | None = isa_mod.effective_isa(cap_in_force)
        effective_error = None
    except isa_mod.IsaError as exc:
        effective, effective_error = None, str(exc)
    report: dict[str, Any] = {
        "cpu": info.as_dict(),
        "feature_table": _feature_rows(info),
        "isa": {
            "ladder": list(isa_mod.LADDER),
            "supported": list(supported),
            "requires": {k: list(v) for k, v in isa_mod.REQUIRES.items()},
            "cap": cap_in_force,
            "cap_source": source,
            "effective": effective,
            "effective_error": effective_error,
        },
        "kernel_families": dict(KERNEL_FAMILY),
        "primitives": primitive_kernels(effective),
        "caches": dataclasses.asdict(data_caches()),
    }
    if peak:
        report["peak"] = _measure_peaks(supported)
    return report


def _yn(flag: bool) -> str:
    return "yes" if flag else "no"


def format_text(report: dict[str, Any]) -> str:
    """The human-readable report."""
    cpu, isa = report["cpu"], report["isa"]
    lines = []
    if not cpu["probed"]:
        lines.append(f"CPU       not probed: {cpu['note']}")
    lines.append(f"CPU       {cpu['vendor'] or '?'}  {cpu['brand'] or '(no brand string)'}")
    lines.append(f"          family {cpu['family']} ({cpu['family']:#x})  model {cpu['model']} ({cpu['model']:#x})"
                 f"  stepping {cpu['stepping']}")
    st = cpu["os_state"]
    xcr0 = cpu["xcr0"] or "not readable (OSXSAVE clear)"
    lines.append(f"XCR0      {xcr0}  (CPU can save {cpu['xcr0_supported']})  OS saves: YMM {_yn(st['os_ymm'])},"
                 f" ZMM {_yn(st['os_zmm'])}, AMX tiles {_yn(st['os_amx'])}")
    caches = report["caches"]
    l3 = f", L3 {caches['l3'] >> 20} MB" if caches["l3"] else ""
    lines.append(f"caches    L1 data {caches['l1d'] >> 10} KB, L2 {caches['l2'] >> 10} KB a core{l3}  ({caches['source']})")
    lines.append("")
    lines.append(f"{'feature':<13} {'CPU':<4} {'OS state':<10} {'usable':<7}")
    for row in report["feature_table"]:
        state = "-" if row["os_state"] is None else f"{_STATE_LABEL[row['os_state']]} {_yn(row['os_ok'])}"
        note = "   CPU yes, OS no" if row["cpu"] and not row["usable"] else ""
        lines.append(f"{row['name'].upper():<13} {_yn(row['cpu']):<4} {state:<10} {_yn(row['usable']):<7}{note}")
    lines.append("")
    lines.append("ISA ladder (lowest first)")
    for name in isa["ladder"]:
        mark = "supported" if name in isa["supported"] else "not supported (needs " + \
            ", ".join(f.upper() for f in isa["requires"][name]) + ")"
        lines.append(f"  {name:<17} {mark}")
    lines.append(f"cap           {isa['cap']}  [{isa['cap_source']}]")
    if isa["effective"] is not None:
        lines.append(f"effective ISA {isa['effective']}")
        lines.append(f"kernel family {KERNEL_FAMILY[isa['effective']]}")
    else:
        lines.append(f"effective ISA none: {isa['effective_error']}")
    lines.append("")
    lines.append(f"primitives on {isa['effective'] or 'no usable ISA'}")
    for name, p in report["primitives"].items():
        what = p["kernel"] if p["status"] == "available" and p["kernel"] else p["status"]
        if p["status"] == "available" and not p["kernel"]:
            what = "unavailable (no usable ISA)"
        lines.append(f"  {name:<14} {what}")
    if "peak" in report:
        peak = report["peak"]
        lines.append("")
        lines.append("measured int8 peak, one thread")
        if peak["unavailable"]:
            lines.append(f"  {peak['unavailable']}")
        for name in isa["supported"]:
            if name in peak["gops"]:
                lines.append(f"  {name:<17} {peak['gops'][name]:9.1f} GOPS")
            elif name in peak["errors"]:
                lines.append(f"  {name:<17} failed: {peak['errors'][name]}")
    return "\n".join(line.rstrip() for line in lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Show the CPU features, the OS register-state checks, the int8jit ISA ladder, "
                    "the cap in force and the kernel each primitive uses.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--peak", action="store_true",
                        help="measure the single-thread int8 peak (GOPS) of every ISA path the CPU supports")
    parser.add_argument("--max-isa", metavar="ISA", default=None,
                        help=f"cap for this report only (overrides {isa_mod.ENV_CAP}); one of {', '.join(isa_mod.LADDER)}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``cpu-probe``; returns the exit status."""
    return quiet_on_closed_stdout(lambda: _run(argv))


def _run(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        report = collect(cap=args.max_isa, peak=args.peak)
    except isa_mod.IsaError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_text(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
