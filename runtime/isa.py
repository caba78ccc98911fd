"""The ISA ladder and its cap.

Levels, by rank (the order oneDNN's ``ONEDNN_MAX_CPU_ISA`` uses):
``avx2`` < ``avx2_vnni`` < ``avx512_core`` < ``avx512_core_vnni``.
Each level is the set of levels it implies: ``avx512_core_vnni`` contains
``avx512_core`` and ``avx2`` but not ``avx2_vnni`` (an AVX512-VNNI CPU need not have
AVX-VNNI). The effective ISA is the highest-ranked level the CPU supports whose rank
is not above the cap; a cap above what the CPU has is no error.
"""
from __future__ import annotations

import threading

from runtime import cpu as _cpu  # (runtime.cpu imports nothing of ours)
from runtime.env import env_raw

LADDER: tuple[str, ...] = ("avx2", "avx2_vnni", "avx512_core", "avx512_core_vnni")
IMPLIES: dict[str, frozenset[str]] = {
    "avx2": frozenset({"avx2"}),
    "avx2_vnni": frozenset({"avx2", "avx2_vnni"}),
    "avx512_core": frozenset({"avx2", "avx512_core"}),
    "avx512_core_vnni": frozenset({"avx2", "avx512_core", "avx512_core_vnni"}),
}
# CPU features (names of runtime.cpu) each level needs, OS state checks included there.
# BMI2 (SHRX, BZHI) is on every AVX2 CPU made; kernels use it for K tails.
_AVX2 = ("avx2", "fma", "bmi2")
_AVX512 = _AVX2 + ("avx512f", "avx512bw", "avx512vl", "avx512dq")
REQUIRES: dict[str, tuple[str, ...]] = {
    "avx2": _AVX2,
    "avx2_vnni": _AVX2 + ("avx_vnni",),
    "avx512_core": _AVX512,
    "avx512_core_vnni": _AVX512 + ("avx512_vnni",),
}
ENV_CAP = "INT8JIT_MAX_ISA"
# ONEDNN_MAX_CPU_ISA's other values, as caps: each level the ladder's highest that it
# implies (ALL, the newer AVX-512 and AMX levels: every path; AVX2_VNNI_2: avx2_vnni).
# Those below AVX2 (SSE41, AVX) name no int8jit path and stay refused.
ONEDNN_CAPS: dict[str, str] = {
    "all": "avx512_core_vnni", "avx2_vnni_2": "avx2_vnni", "avx512_core_bf16": "avx512_core_vnni",
    "avx512_core_fp16": "avx512_core_vnni", "avx10_1_512": "avx512_core_vnni",
    "avx512_core_amx": "avx512_core_vnni", "avx512_core_amx_fp16": "avx512_core_vnni",
    "avx10_1_512_amx": "avx512_core_vnni", "avx10_1_512_amx_fp16": "avx512_core_vnni",
}

_cap_override: str | None = None
_lock = threading.Lock()


class IsaError(ValueError):
    """An ISA name that is not on the ladder, or no usable ISA at all."""


class NoIsaPathError(IsaError):
    """No level of the ladder is usable on this CPU: it lacks AVX2, FMA or BMI2, or its
    OS does not enable the YMM state (every level needs them, so no cap can cause this).
    Kernels can still be generated and disassembled for any path; none can run."""


def check_name(name: str, argument: str = "isa") -> str:
    """Return the canonical ISA name or raise naming the valid ones."""
    if type(name) is str and name in IMPLIES:  # (already canonical: one-off calls ask at every call)
        return name
    canon = str(name).strip().lower()
    canon = ONEDNN_CAPS.get(canon, canon)
    if canon not in LADDER:
        below = " (below avx2, int8jit's lowest path)" if canon in ("sse41", "avx") else ""
        raise IsaError(f"{argument}: unknown ISA {name!r}{below}; expected one of {', '.join(LADDER)}, "
                       "or a higher ONEDNN_MAX_CPU_ISA value (all, avx512_core_amx, ...)")
    return canon


def rank(name: str) -> int:
    return LADDER.index(check_name(name))


_supports_seen: dict = {}  # name -> (the probe result asked, the answer): per-call checks ask often


def cpu_supports(name: str) -> bool:
    """Whether this CPU (and OS register-state support) can execute the ISA path."""
    info = _cpu.cpu_info()
    seen = _supports_seen.get(name)
    if seen is not None and seen[0] is info:  # (a new probe result, a test's synthetic CPU: asked anew)
        return seen[1]
    answer = all(info.has(f) for f in REQUIRES[check_name(name)])
    _supports_seen[name] = (info, answer)
    return answer


def supported() -> tuple[str, ...]:
    """The ladder levels this CPU can execute, lowest first."""
    return tuple(name for name in LADDER if cpu_supports(name))


def set_max_isa(name: str | None) -> None:
    """Cap the ISA for this process from the API (``None`` returns to the environment)."""
    global _cap_override
    with _lock:
        _cap_override = None if name is None else check_name(name, "max_isa")


def cap_source() -> str:
    """Where the cap in force comes from: ``"api"``, ``"env"`` or ``"default"``."""
    if _cap_override is not None:
        return "api"
    return "env" if env_raw(ENV_CAP).strip() else "default"


def max_isa() -> str:
    """The cap in force: the API's, else ``INT8JIT_MAX_ISA``, else the top of the ladder."""
    if _cap_override is not None:
        return _cap_override
    env = env_raw(ENV_CAP).strip()
    return check_name(env, ENV_CAP) if env else LADDER[-1]


def _no_path() -> NoIsaPathError:
    return NoIsaPathError(
        f"no int8jit ISA path is usable on this CPU: every one ({', '.join(LADDER)}) needs "
        f"{', '.join(f.upper() for f in REQUIRES['avx2'])} and the OS's YMM state; "
        "kernels can still be generated and disassembled (dump-asm gemm --isa ...)"
    )


_effective_seen: dict = {}  # cap -> (probe result, supported, cpu_supports, answer): one-off GEMM calls ask every call


def effective_isa(cap: str | None = None) -> str:
    """Best ISA the CPU supports at or under ``cap`` (default: :func:`max_isa`)."""
    cap = check_name(cap) if cap is not None else max_isa()
    # (a new probe result, or a test's stand-in for supported() or cpu_supports(): asked anew)
    info = _cpu.cpu_info()
    seen = _effective_seen.get(cap)
    if seen is not None and seen[0] is info and seen[1] is supported and seen[2] is cpu_supports:  # (~0.3 us, not 6)
        return seen[3]
    limit = rank(cap)
    usable = [name for name in supported() if rank(name) <= limit]
    if not usable:  # every level needs avx2's features: no cap empties this on a CPU that has them
        raise _no_path()
    _effective_seen[cap] = (info, supported, cpu_supports, usable[-1])
    return usable[-1]


def planning_isa(isa: str | None = None) -> str:
    """The path a primitive descriptor plans for, given its ``isa`` argument (a cap,
    checked by name; None: :func:`max_isa`): :func:`effective_isa`, or, on a CPU where no
    path runs, the lowest level. There the descriptor still checks every argument (so bad
    input is named, not met with the CPU's lack) and takes what needs no kernel (a
    zero-volume problem, a numpy reorder); :func:`require_path` refuses the rest before
    any kernel is made."""
    cap = None if isa is None else check_name(isa, "isa")
    try:
        return effective_isa(cap)
    except NoIsaPathError:
        return LADDER[0]


def passed_over(chosen: str, isa: str | None = None) -> list[tuple[str, str]]:
    """The levels ranked above ``chosen`` (what :func:`planning_isa` gave for the argument
    ``isa``), each with why it was not taken: the CPU's missing features, or the cap and
    where it came from. For ``INT8JIT_VERBOSE=dispatch``'s lines."""
    cap = check_name(isa, "isa") if isa is not None else max_isa()
    source = {"api": "set_max_isa()", "env": ENV_CAP, "default": "the ladder"}[cap_source()] \
        if isa is None else "the isa argument"
    info = _cpu.cpu_info()
    answer = []
    for name in LADDER[rank(chosen) + 1:]:
        missing = [f.upper() for f in REQUIRES[name] if not info.has(f)]
        answer.append((name, f"CPU lacks {', '.join(missing)}" if missing else f"above the cap {cap} ({source})"))
    return answer


def require_path(isa: str) -> None:
    """Raise :class:`NoIsaPathError` unless this CPU runs the path ``isa`` (one that
    :func:`planning_isa` gave)."""
    if isa not in supported():
        raise _no_path()
