"""CPU feature probe: executes CPUID and XGETBV, checks OS register-state support.

The probe runs two tiny hand-encoded functions through :class:`runtime.kernel.Kernel`
(W^X memory, cffi function pointer); it does not import PeachPy, so asking "what does
this CPU have" costs a few microseconds and no code generator.

A feature is *usable* only when the CPU reports it AND the operating system saves and
restores the register state it needs (XCR0, read with XGETBV, which itself may only run
when CPUID reports OSXSAVE):

* AVX, AVX2, FMA, F16C, AVX-VNNI need YMM state: OSXSAVE and XCR0 bits 1-2 (SSE, AVX).
* every AVX-512 feature needs ZMM state as well: XCR0 bits 5-7 (opmask, ZMM_Hi256,
  Hi16_ZMM) on top of bits 1-2.
* AMX needs OSXSAVE and XCR0 bits 17-18 (XTILECFG, XTILEDATA). On Linux a process must
  also ask for the tile state with ``arch_prctl(ARCH_REQ_XCOMP_PERM)`` before running a
  tile instruction; this probe reports what XCR0 says, not that per-process permission.

Both answers are kept: ``info.cpu_bits[name]`` is the raw CPUID bit and
``info.has(name)`` the usable value, so a tool can say "CPU yes, OS no".

Example::

    >>> from runtime.cpu import cpu_info
    >>> info = cpu_info()
    >>> isinstance(info.has("avx2"), bool) and info.has("avx512f") <= info.cpu_bits["avx512f"]
    True

The register-to-feature decoding is a pure function, so the masking rules are testable
with synthetic register values (:meth:`CpuInfo.from_registers`, :func:`encode_registers`)::

    >>> leaves = encode_registers(["osxsave", "avx", "avx2", "avx512f"])
    >>> info = CpuInfo.from_registers(leaves, xcr0=XCR0_YMM)   # OS saves YMM, not ZMM
    >>> info.has("avx2"), info.cpu_bits["avx512f"], info.has("avx512f")
    (True, True, False)
"""
from __future__ import annotations

import os
import platform
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

Regs = tuple[int, int, int, int]  # eax, ebx, ecx, edx
Leaves = Mapping[tuple[int, int], Regs]  # (leaf, subleaf) -> registers

# --------------------------------------------------------------------------------------
# Where each feature lives: name -> (leaf, subleaf, register index 0..3 = eax..edx, bit)
# --------------------------------------------------------------------------------------
EAX, EBX, ECX, EDX = range(4)
FEATURE_BITS: dict[str, tuple[int, int, int, int]] = {
    "sse4_1": (1, 0, ECX, 19),
    "sse4_2": (1, 0, ECX, 20),
    "fma": (1, 0, ECX, 12),
    "osxsave": (1, 0, ECX, 27),
    "avx": (1, 0, ECX, 28),
    "f16c": (1, 0, ECX, 29),
    "avx2": (7, 0, EBX, 5),
    "bmi2": (7, 0, EBX, 8),
    "avx512f": (7, 0, EBX, 16),
    "avx512dq": (7, 0, EBX, 17),
    "avx512cd": (7, 0, EBX, 28),
    "avx512bw": (7, 0, EBX, 30),
    "avx512vl": (7, 0, EBX, 31),
    "avx512_vnni": (7, 0, ECX, 11),
    "amx_bf16": (7, 0, EDX, 22),
    "amx_tile": (7, 0, EDX, 24),
    "amx_int8": (7, 0, EDX, 25),
    "avx_vnni": (7, 1, EAX, 4),
    "avx512_bf16": (7, 1, EAX, 5),
}
# Register state each feature needs from the OS (None: nothing beyond what x86-64 has).
NEEDS_STATE: dict[str, str | None] = {
    "sse4_1": None,
    "sse4_2": None,
    "osxsave": None,
    "bmi2": None,
    "fma": "ymm",
    "avx": "ymm",
    "f16c": "ymm",
    "avx2": "ymm",
    "avx_vnni": "ymm",
    "avx512f": "zmm",
    "avx512dq": "zmm",
    "avx512cd": "zmm",
    "avx512bw": "zmm",
    "avx512vl": "zmm",
    "avx512_vnni": "zmm",
    "avx512_bf16": "zmm",
    "amx_bf16": "amx",
    "amx_tile": "amx",
    "amx_int8": "amx",
}
# Display order (and the order of .features / .cpu_bits).
FEATURES: tuple[str, ...] = (
    "sse4_1", "sse4_2", "osxsave", "bmi2", "avx", "avx2", "fma", "f16c", "avx_vnni",
    "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vnni", "avx512_bf16",
    "amx_tile", "amx_int8", "amx_bf16",
)
OS_STATES: tuple[str, ...] = ("os_ymm", "os_zmm", "os_amx")
NAMES: tuple[str, ...] = FEATURES + OS_STATES

# XCR0 (XFEATURE_ENABLED_MASK) bits.
XCR0_X87, XCR0_SSE, XCR0_AVX = 1 << 0, 1 << 1, 1 << 2
XCR0_OPMASK, XCR0_ZMM_HI256, XCR0_HI16_ZMM = 1 << 5, 1 << 6, 1 << 7
XCR0_XTILECFG, XCR0_XTILEDATA = 1 << 17, 1 << 18
XCR0_YMM = XCR0_X87 | XCR0_SSE | XCR0_AVX  # what an OS with AVX but no AVX-512 enables
XCR0_ZMM = XCR0_OPMASK | XCR0_ZMM_HI256 | XCR0_HI16_ZMM
XCR0_AMX = XCR0_XTILECFG | XCR0_XTILEDATA

_LEAF_VENDOR, _LEAF_FEATURES, _LEAF_EXT7, _LEAF_XSAVE = 0x0, 0x1, 0x7, 0xD
_LEAF_EXT_MAX, _LEAF_BRAND = 0x80000000, (0x80000002, 0x80000003, 0x80000004)

_ZERO: Regs = (0, 0, 0, 0)


def _regs_bytes(regs: Regs, order: tuple[int, ...]) -> bytes:
    return b"".join((regs[i] & 0xFFFFFFFF).to_bytes(4, "little") for i in order)


@dataclass(frozen=True)
class CpuInfo:
    """What the CPU reports and what the OS lets a process use.

    ``features[name]`` / :meth:`has` are the usable values; ``cpu_bits[name]`` the raw
    CPUID bits; ``os_state`` holds ``os_ymm``, ``os_zmm``, ``os_amx`` (XCR0 checks);
    ``xcr0`` is ``None`` when XGETBV could not be executed (OSXSAVE clear).
    ``probed`` is False where no CPUID was executed (not x86-64, or a failure, see
    ``note``): then every feature reads False.

    Example::

        >>> info = CpuInfo.from_registers(encode_registers(["avx2"]), xcr0=None)
        >>> info.cpu_bits["avx2"], info.has("avx2")       # no OSXSAVE: no AVX at all
        (True, False)
    """

    vendor: str = ""
    brand: str = ""
    family: int = 0
    model: int = 0
    stepping: int = 0
    max_leaf: int = 0
    max_ext_leaf: int = 0
    xcr0: int | None = None
    cpu_bits: dict[str, bool] = field(default_factory=dict)
    features: dict[str, bool] = field(default_factory=dict)
    os_state: dict[str, bool] = field(default_factory=dict)
    raw: dict[tuple[int, int], Regs] = field(default_factory=dict)
    probed: bool = True
    note: str = ""

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_registers(cls, leaves: Leaves, xcr0: int | None, *, probed: bool = True, note: str = "") -> "CpuInfo":
        """Decode raw CPUID results and XCR0 into a :class:`CpuInfo` (a pure function).

        ``leaves`` maps ``(leaf, subleaf)`` to ``(eax, ebx, ecx, edx)``; a missing leaf
        reads as zeros (as it does on a CPU whose maximum leaf is below it). ``xcr0`` is
        the value XGETBV(0) returned, or ``None`` when it was not read; it is ignored
        unless leaf 1 reports OSXSAVE (XGETBV faults without it).

        Example::

            >>> regs = encode_registers(["osxsave", "avx", "avx512f", "avx512_vnni"])
            >>> CpuInfo.from_registers(regs, XCR0_YMM | XCR0_ZMM).has("avx512_vnni")
            True
        """
        raw = {(int(k[0]), int(k[1])): tuple(int(r) & 0xFFFFFFFF for r in v) for k, v in leaves.items()}

        def leaf(n: int, sub: int = 0) -> Regs:
            return raw.get((n, sub), _ZERO)  # type: ignore[return-value]

        l0 = leaf(_LEAF_VENDOR)
        vendor = _regs_bytes(l0, (EBX, EDX, ECX)).rstrip(b"\0").decode("ascii", "replace")
        brand_bytes = b"".join(_regs_bytes(leaf(n), (EAX, EBX, ECX, EDX)) for n in _LEAF_BRAND)
        brand = brand_bytes.split(b"\0", 1)[0].decode("ascii", "replace").strip()

        sig = leaf(_LEAF_FEATURES)[EAX]
        stepping = sig & 0xF
        base_model, base_family = (sig >> 4) & 0xF, (sig >> 8) & 0xF
        ext_model, ext_family = (sig >> 16) & 0xF, (sig >> 20) & 0xFF
        family = base_family + ext_family if base_family == 0xF else base_family
        model = (ext_model << 4) + base_model if base_family in (0x6, 0xF) else base_model

        cpu_bits = {name: bool((leaf(lf, sub)[reg] >> bit) & 1) for name, (lf, sub, reg, bit) in FEATURE_BITS.items()}
        cpu_bits = {name: cpu_bits[name] for name in FEATURES}

        osxsave = cpu_bits["osxsave"]
        x = int(xcr0) if (osxsave and xcr0 is not None) else 0
        os_ymm = osxsave and (x & (XCR0_SSE | XCR0_AVX)) == (XCR0_SSE | XCR0_AVX)
        os_zmm = os_ymm and (x & XCR0_ZMM) == XCR0_ZMM
        os_amx = osxsave and (x & XCR0_AMX) == XCR0_AMX
        os_state = {"os_ymm": os_ymm, "os_zmm": os_zmm, "os_amx": os_amx}
        state_ok = {None: True, "ymm": os_ymm, "zmm": os_zmm, "amx": os_amx}
        features = {name: cpu_bits[name] and state_ok[NEEDS_STATE[name]] for name in FEATURES}

        return cls(
            vendor=vendor,
            brand=brand,
            family=family,
            model=model,
            stepping=stepping,
            max_leaf=l0[EAX],
            max_ext_leaf=leaf(_LEAF_EXT_MAX)[EAX],
            xcr0=int(xcr0) if (osxsave and xcr0 is not None) else None,
            cpu_bits=cpu_bits,
            features=features,
            os_state=os_state,
            raw=dict(sorted(raw.items())),  # type: ignore[arg-type]
            probed=probed,
            note=note,
        )

    # ---------------------------------------------------------------- queries
    def has(self, name: str) -> bool:
        """Whether feature ``name`` is usable (CPU bit and OS state), or an OS-state fact.

        Valid names: :data:`FEATURES` and :data:`OS_STATES`; any other raises ValueError.

        Example::

            >>> CpuInfo.from_registers({}, None).has("avx2")
            False
        """
        key = str(name).strip().lower()
        if key in self.features:
            return self.features[key]
        if key in self.os_state:
            return self.os_state[key]
        raise ValueError(f"unknown CPU feature {name!r}; expected one of {', '.join(NAMES)}")

    def cpu_has(self, name: str) -> bool:
        """The raw CPUID bit of ``name`` (no OS-state check); ValueError for unknown names."""
        key = str(name).strip().lower()
        if key not in FEATURES:
            raise ValueError(f"unknown CPU feature {name!r}; expected one of {', '.join(FEATURES)}")
        return self.cpu_bits.get(key, False)

    def state_check(self, name: str) -> str | None:
        """The OS register state ``name`` needs: ``'ymm'``, ``'zmm'``, ``'amx'`` or None."""
        self.cpu_has(name)
        return NEEDS_STATE[name.strip().lower()]

    @property
    def xcr0_supported(self) -> int:
        """State components the CPU can save (CPUID leaf 0xD sub-leaf 0, EDX:EAX).

        Compare with :attr:`xcr0` (what the OS enabled) to tell "CPU yes, OS no".
        """
        eax, _, _, edx = self.raw.get((_LEAF_XSAVE, 0), _ZERO)
        return (edx << 32) | eax

    @property
    def signature(self) -> str:
        """``family-model-stepping`` in hex, as vendors print it (e.g. ``6-8f-8``)."""
        return f"{self.family:x}-{self.model:x}-{self.stepping:x}"

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (raw leaves as hex strings ``"leaf.subleaf"``)."""
        return {
            "probed": self.probed,
            "note": self.note,
            "vendor": self.vendor,
            "brand": self.brand,
            "family": self.family,
            "model": self.model,
            "stepping": self.stepping,
            "max_leaf": self.max_leaf,
            "max_ext_leaf": self.max_ext_leaf,
            "xcr0": None if self.xcr0 is None else f"{self.xcr0:#x}",
            "xcr0_supported": f"{self.xcr0_supported:#x}",
            "os_state": dict(self.os_state),
            "features": dict(self.features),
            "cpu_bits": dict(self.cpu_bits),
            "raw_cpuid": {f"{lf:#x}.{sub}": [f"{r:#010x}" for r in regs] for (lf, sub), regs in self.raw.items()},
        }

    def __repr__(self) -> str:
        usable = [n for n in FEATURES if self.features.get(n)]
        return (f"CpuInfo(vendor={self.vendor!r}, brand={self.brand!r}, family={self.family}, "
                f"model={self.model}, stepping={self.stepping}, usable={usable})")


def encode_registers(
    features: Iterable[str],
    *,
    vendor: str = "GenuineIntel",
    brand: str = "",
    family: int = 6,
    model: int = 0x8F,
    stepping: int = 0,
) -> dict[tuple[int, int], Regs]:
    """Synthetic CPUID results for the given raw feature bits (a test hook).

    The inverse of :meth:`CpuInfo.from_registers` for the fields it decodes: vendor,
    brand, family/model/stepping (encoded with the extended-field rules) and the
    :data:`FEATURES` bits. Combine with any XCR0 value to test the OS-state masking.

    Example::

        >>> info = CpuInfo.from_registers(encode_registers(["osxsave", "avx2"], family=0x19, model=0x61), XCR0_YMM)
        >>> (info.family, info.model, info.has("avx2"))
        (25, 97, True)
    """
    regs: dict[tuple[int, int], list[int]] = {}

    def reg(leaf: int, sub: int = 0) -> list[int]:
        return regs.setdefault((leaf, sub), [0, 0, 0, 0])

    vb = vendor.encode("ascii")[:12].ljust(12, b"\0")
    l0 = reg(_LEAF_VENDOR)
    l0[EAX] = 0xD
    l0[EBX], l0[EDX], l0[ECX] = (int.from_bytes(vb[i:i + 4], "little") for i in (0, 4, 8))

    if family >= 0xF:
        base_family, ext_family = 0xF, family - 0xF
    else:
        base_family, ext_family = family, 0
    if base_family in (0x6, 0xF):
        base_model, ext_model = model & 0xF, (model >> 4) & 0xF
    else:
        base_model, ext_model = model & 0xF, 0
    reg(_LEAF_FEATURES)[EAX] = (stepping & 0xF) | (base_model << 4) | (base_family << 8) | (ext_model << 16) | (ext_family << 20)
    reg(_LEAF_EXT7, 0)[EAX] = 1  # max sub-leaf of leaf 7
    reg(_LEAF_EXT7, 1)

    for name in features:
        key = str(name).strip().lower()
        if key not in FEATURE_BITS:
            raise ValueError(f"features: unknown CPU feature {name!r}; expected names from {', '.join(FEATURES)}")
        lf, sub, r, bit = FEATURE_BITS[key]
        reg(lf, sub)[r] |= 1 << bit

    reg(_LEAF_EXT_MAX)[EAX] = _LEAF_BRAND[-1]
    bb = brand.encode("ascii")[:47].ljust(48, b"\0")
    for i, lf in enumerate(_LEAF_BRAND):
        chunk = bb[16 * i:16 * i + 16]
        reg(lf)[:] = [int.from_bytes(chunk[j:j + 4], "little") for j in (0, 4, 8, 12)]
    return {k: tuple(v) for k, v in regs.items()}  # type: ignore[misc]


# --------------------------------------------------------------------------------------
# Executing CPUID / XGETBV
# --------------------------------------------------------------------------------------
# void i8j_cpuid(uint32_t leaf /*edi*/, uint32_t subleaf /*esi*/, struct i8j_cpuid_regs *out /*rdx*/)
CPUID_CODE = bytes([
    0x53,                    # push rbx            (rbx is callee-saved; CPUID writes it)
    0x49, 0x89, 0xD0,        # mov  r8, rdx        (out pointer; CPUID writes rdx)
    0x89, 0xF8,              # mov  eax, edi       (leaf)
    0x89, 0xF1,              # mov  ecx, esi       (sub-leaf)
    0x0F, 0xA2,              # cpuid
    0x41, 0x89, 0x00,        # mov  [r8], eax
    0x41, 0x89, 0x58, 0x04,  # mov  [r8+4], ebx
    0x41, 0x89, 0x48, 0x08,  # mov  [r8+8], ecx
    0x41, 0x89, 0x50, 0x0C,  # mov  [r8+12], edx
    0x5B,                    # pop  rbx
    0xC3,                    # ret
])
# uint64_t i8j_xgetbv(uint32_t xcr /*edi*/)
XGETBV_CODE = bytes([
    0x89, 0xF9,              # mov  ecx, edi
    0x0F, 0x01, 0xD0,        # xgetbv              (edx:eax = XCR[ecx])
    0x48, 0xC1, 0xE2, 0x20,  # shl  rdx, 32
    0x89, 0xC0,              # mov  eax, eax       (clear the upper half of rax)
    0x48, 0x09, 0xD0,        # or   rax, rdx
    0xC3,                    # ret
])
_REGS_CDEF = "struct i8j_cpuid_regs { uint32_t eax, ebx, ecx, edx; };"
CPUID_SIGNATURE = "void (*)(uint32_t, uint32_t, struct i8j_cpuid_regs *)"
XGETBV_SIGNATURE = "uint64_t (*)(uint32_t)"

_kernels: dict[str, Any] = {}
_kernel_lock = threading.Lock()


def is_x86_64() -> bool:
    """Whether this process runs x86-64 code under a System V (POSIX) ABI."""
    return os.name == "posix" and platform.machine().lower() in ("x86_64", "amd64")


def _kernel(name: str):
    with _kernel_lock:
        k = _kernels.get(name)
        if k is None:
            from runtime.ffi import declare
            from runtime.kernel import Kernel

            declare(_REGS_CDEF)
            if name == "cpuid":
                k = Kernel("i8j_cpuid", CPUID_CODE, signature=CPUID_SIGNATURE, isa="x86_64")
            else:
                k = Kernel("i8j_xgetbv", XGETBV_CODE, signature=XGETBV_SIGNATURE, isa="x86_64")
            _kernels[name] = k
        return k


def cpuid(leaf: int, subleaf: int = 0) -> Regs:
    """Execute CPUID and return ``(eax, ebx, ecx, edx)``.

    Example::

        >>> eax, ebx, ecx, edx = cpuid(0)
        >>> eax >= 1
        True
    """
    from runtime.ffi import ffi

    if not is_x86_64():
        raise OSError(f"CPUID needs an x86-64 POSIX process; this is {platform.machine()} / {os.name}")
    k = _kernel("cpuid")
    out = ffi.new("struct i8j_cpuid_regs *")
    k(leaf & 0xFFFFFFFF, subleaf & 0xFFFFFFFF, out)
    return (out.eax, out.ebx, out.ecx, out.edx)


def xgetbv(xcr: int = 0) -> int:
    """Execute XGETBV (read extended control register ``xcr``; 0 is XCR0).

    Only valid when CPUID.1:ECX.OSXSAVE[bit 27] is set: otherwise the CPU raises #UD
    and the process dies. :func:`read_registers` checks that before calling it.
    """
    if not is_x86_64():
        raise OSError(f"XGETBV needs an x86-64 POSIX process; this is {platform.machine()} / {os.name}")
    return int(_kernel("xgetbv")(xcr & 0xFFFFFFFF))


def read_registers(
    cpuid_fn: Callable[[int, int], Regs] = cpuid,
    xgetbv_fn: Callable[[int], int] = xgetbv,
) -> tuple[dict[tuple[int, int], Regs], int | None]:
    """Query the leaves the probe decodes; returns ``(leaves, xcr0 or None)``.

    Leaves above the maximum (standard, extended, or leaf-7 sub-leaf) are not executed.
    XGETBV runs only when OSXSAVE is set. The callables are parameters so a test can
    check this protocol with a fake CPU.
    """
    leaves: dict[tuple[int, int], Regs] = {}
    l0 = leaves[(0, 0)] = tuple(cpuid_fn(0, 0))  # type: ignore[assignment]
    max_leaf = l0[EAX]
    if max_leaf >= _LEAF_FEATURES:
        leaves[(1, 0)] = tuple(cpuid_fn(1, 0))  # type: ignore[assignment]
    if max_leaf >= _LEAF_EXT7:
        l7 = leaves[(7, 0)] = tuple(cpuid_fn(7, 0))  # type: ignore[assignment]
        if l7[EAX] >= 1:
            leaves[(7, 1)] = tuple(cpuid_fn(7, 1))  # type: ignore[assignment]
    if max_leaf >= _LEAF_XSAVE:
        # Sub-leaf 0: XCR0 bits the CPU supports (EDX:EAX) and XSAVE area sizes.
        leaves[(0xD, 0)] = tuple(cpuid_fn(0xD, 0))  # type: ignore[assignment]
    lx = leaves[(_LEAF_EXT_MAX, 0)] = tuple(cpuid_fn(_LEAF_EXT_MAX, 0))  # type: ignore[assignment]
    max_ext = lx[EAX]
    if not (_LEAF_EXT_MAX <= max_ext <= _LEAF_EXT_MAX + 0xFFFF):
        # Not a valid extended-range answer (very old CPUs echo data of the highest
        # standard leaf): drop it so nothing decodes garbage.
        del leaves[(_LEAF_EXT_MAX, 0)]
        max_ext = 0
    if max_ext >= _LEAF_BRAND[-1]:
        for lf in _LEAF_BRAND:
            leaves[(lf, 0)] = tuple(cpuid_fn(lf, 0))  # type: ignore[assignment]
    osxsave = bool((leaves.get((1, 0), _ZERO)[ECX] >> FEATURE_BITS["osxsave"][3]) & 1)
    xcr0 = int(xgetbv_fn(0)) if osxsave else None
    return leaves, xcr0


def probe() -> CpuInfo:
    """Execute CPUID/XGETBV now (uncached); on a non-x86-64 host every feature is False."""
    if not is_x86_64():
        return CpuInfo.from_registers({}, None, probed=False,
                                      note=f"not an x86-64 POSIX host ({platform.machine()}, {os.name}): no CPUID")
    leaves, xcr0 = read_registers()
    return CpuInfo.from_registers(leaves, xcr0)


_cached: CpuInfo | None = None
_cache_lock = threading.Lock()


def cpu_info(refresh: bool = False) -> CpuInfo:
    """The probe result for this process, computed once and cached.

    Example::

        >>> cpu_info() is cpu_info()
        True
    """
    global _cached
    cached = _cached
    if cached is not None and not refresh:  # (no lock to read a reference: every call asks)
        return cached
    with _cache_lock:
        if _cached is None or refresh:
            _cached = probe()
        return _cached
