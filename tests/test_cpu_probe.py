"""CPU probe (runtime.cpu), the ISA ladder's use of it, and the cpu-probe tool.

Nothing here assumes a particular CPU: checks against the live CPU compare with
/proc/cpuinfo (Linux) and skip with a reason where the CPU lacks what they need; the
OS-state masking rules are tested with synthetic register values.
"""
from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import runtime.cpu as cpu
import runtime.isa as isa
from runtime.cpu import (
    FEATURES, XCR0_AMX, XCR0_AVX, XCR0_OPMASK, XCR0_SSE, XCR0_X87, XCR0_YMM, XCR0_ZMM,
    CpuInfo, cpu_info, encode_registers,
)
from tools import cpu_probe

ROOT = Path(__file__).resolve().parents[1]
X86_64 = cpu.is_x86_64()
needs_x86 = pytest.mark.skipif(not X86_64, reason=f"CPUID needs an x86-64 POSIX host, this is {platform.machine()}")

# Checks of the probe's answer against this machine (conftest's INT8JIT_TEST_CPU makes
# the probe answer for a synthetic CPU instead).
live_cpu = pytest.mark.skipif(bool(os.environ.get("INT8JIT_TEST_CPU", "").strip()),
                              reason="INT8JIT_TEST_CPU: the probe answers for a synthetic CPU, not this machine")

ALL_XCR0 = XCR0_YMM | XCR0_ZMM | XCR0_AMX
AVX512_CORE = ["avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"]


@pytest.fixture(autouse=True)
def _clean_cap(monkeypatch):
    """No cap from the environment or a previous test leaks into a test."""
    monkeypatch.delenv(isa.ENV_CAP, raising=False)
    isa.set_max_isa(None)
    yield
    isa.set_max_isa(None)


def fake_cpu(monkeypatch, features, xcr0=ALL_XCR0, **kw) -> CpuInfo:
    """Make runtime.cpu.cpu_info() answer for a synthetic CPU for this test."""
    info = CpuInfo.from_registers(encode_registers(features, **kw), xcr0)
    monkeypatch.setattr(cpu, "_cached", info)
    return info


# ------------------------------------------------------------------ /proc/cpuinfo
def _proc_cpuinfo() -> dict[str, str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # first processor only
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


PROC = _proc_cpuinfo()
needs_proc = pytest.mark.skipif(
    not (X86_64 and "flags" in PROC), reason="needs Linux /proc/cpuinfo with a 'flags' line on x86-64"
)


def _kernel_version() -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", platform.release())
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


# probe name -> (/proc/cpuinfo flag, first Linux release that both names the flag and
# enables the register state it needs; older kernels may lack the flag, or list AMX
# without enabling tile state, so there only "flag listed => CPU bit set" is checked).
PROC_FLAGS: dict[str, tuple[str, tuple[int, int]]] = {
    "sse4_1": ("sse4_1", (3, 0)),
    "sse4_2": ("sse4_2", (3, 0)),
    "avx": ("avx", (3, 0)),
    "avx2": ("avx2", (3, 10)),
    "fma": ("fma", (3, 0)),
    "f16c": ("f16c", (3, 0)),
    "avx512f": ("avx512f", (4, 4)),
    "avx512bw": ("avx512bw", (4, 4)),
    "avx512vl": ("avx512vl", (4, 4)),
    "avx512dq": ("avx512dq", (4, 4)),
    "avx512cd": ("avx512cd", (4, 4)),
    "avx512_vnni": ("avx512_vnni", (5, 0)),
    "avx512_bf16": ("avx512_bf16", (5, 3)),
    "avx_vnni": ("avx_vnni", (5, 15)),
    "amx_tile": ("amx_tile", (5, 17)),
    "amx_int8": ("amx_int8", (5, 17)),
    "amx_bf16": ("amx_bf16", (5, 17)),
}


@live_cpu
@needs_proc
@pytest.mark.parametrize("name", sorted(PROC_FLAGS))
def test_features_agree_with_proc_cpuinfo(name):
    flag, since = PROC_FLAGS[name]
    listed = flag in PROC["flags"].split()
    info = cpu_info()
    if _kernel_version() >= since:
        assert info.has(name) == listed, (
            f"{name}: probe says usable={info.has(name)} (CPU bit {info.cpu_bits[name]}, XCR0 {info.xcr0 and hex(info.xcr0)}),"
            f" /proc/cpuinfo {'lists' if listed else 'does not list'} {flag!r}"
            " (a clearcpuid= boot option also hides flags from /proc)"
        )
    elif listed:
        assert info.cpu_bits[name], f"/proc/cpuinfo lists {flag!r} but CPUID bit is clear"


@live_cpu
@needs_proc
def test_vendor_matches_proc_cpuinfo():
    if "vendor_id" not in PROC:
        pytest.skip("/proc/cpuinfo has no vendor_id")
    assert cpu_info().vendor == PROC["vendor_id"]


@live_cpu
@needs_proc
def test_brand_matches_proc_model_name():
    info = cpu_info()
    if not info.brand:
        pytest.skip("CPU has no brand string (leaves 0x80000002-4); Linux then names it from a table")
    if "model name" not in PROC:
        pytest.skip("/proc/cpuinfo has no 'model name'")
    assert " ".join(info.brand.split()) == " ".join(PROC["model name"].split())


@live_cpu
@needs_proc
def test_family_model_stepping_match_proc_cpuinfo():
    info = cpu_info()
    for key, value in (("cpu family", info.family), ("model", info.model), ("stepping", info.stepping)):
        if PROC.get(key, "").isdigit():
            assert int(PROC[key]) == value, key


# ------------------------------------------------------------------ the live probe
@live_cpu
@needs_x86
def test_cpu_info_is_cached_and_consistent():
    info = cpu_info()
    assert info is cpu_info()
    assert info.probed
    assert set(info.features) == set(FEATURES) == set(info.cpu_bits)
    for name in FEATURES:
        assert info.has(name) <= info.cpu_bits[name], name  # usable implies the CPU bit
    if info.has("osxsave"):
        assert info.xcr0 is not None and info.xcr0 & XCR0_X87
        assert info.xcr0 & ~info.xcr0_supported == 0, "OS enabled state the CPU cannot save"
    json.dumps(info.as_dict())
    assert info.max_leaf >= 1 and re.fullmatch(r"[\x20-\x7e]{12}", info.vendor)


@live_cpu
@needs_x86
def test_cpuid_leaf0_vendor_and_xgetbv():
    eax, ebx, ecx, edx = cpu.cpuid(0)
    vendor = b"".join(r.to_bytes(4, "little") for r in (ebx, edx, ecx)).decode()
    assert vendor == cpu_info().vendor and eax == cpu_info().max_leaf
    if cpu_info().cpu_bits["osxsave"]:
        assert cpu.xgetbv(0) == cpu_info().xcr0


def test_hand_encoded_machine_code_decodes_as_intended():
    iced = pytest.importorskip("iced_x86")

    def listing(code: bytes) -> list[str]:
        decoder = iced.Decoder(64, code)
        formatter = iced.Formatter(iced.FormatterSyntax.INTEL)
        out = []
        for ins in decoder:
            assert not ins.is_invalid, code.hex()
            out.append(" ".join(formatter.format(ins).split()))
        assert decoder.position == len(code)
        return out

    assert listing(cpu.CPUID_CODE) == [
        "push rbx", "mov r8,rdx", "mov eax,edi", "mov ecx,esi", "cpuid",
        "mov [r8],eax", "mov [r8+4],ebx", "mov [r8+8],ecx", "mov [r8+0Ch],edx", "pop rbx", "ret",
    ]
    assert listing(cpu.XGETBV_CODE) == ["mov ecx,edi", "xgetbv", "shl rdx,20h", "mov eax,eax", "or rax,rdx", "ret"]


# ------------------------------------------------------------------ synthetic registers
def test_avx512_bits_without_zmm_state_are_not_usable():
    info = CpuInfo.from_registers(encode_registers(["osxsave", "avx", "avx2", "fma", "bmi2", *AVX512_CORE, "avx512_vnni"]),
                                  XCR0_YMM)
    assert info.has("avx2") and info.has("fma") and info.has("os_ymm")
    assert not info.has("os_zmm")
    for name in AVX512_CORE + ["avx512_vnni"]:
        assert info.cpu_bits[name] and not info.has(name), name


def test_osxsave_clear_means_no_avx_at_all():
    everything = list(FEATURES)
    everything.remove("osxsave")
    info = CpuInfo.from_registers(encode_registers(everything), ALL_XCR0)  # XCR0 must be ignored
    assert info.xcr0 is None
    assert not info.has("os_ymm") and not info.has("os_zmm") and not info.has("os_amx")
    for name in FEATURES:
        expected = name in ("sse4_1", "sse4_2", "bmi2")  # no OS state needed
        assert info.has(name) == expected, name
        assert info.cpu_bits[name] == (name != "osxsave")


@pytest.mark.parametrize(
    "xcr0, ymm, zmm",
    [
        (0, False, False),
        (XCR0_X87 | XCR0_SSE, False, False),  # SSE only
        (XCR0_YMM, True, False),
        (XCR0_YMM | XCR0_OPMASK, True, False),  # partial AVX-512 state
        (XCR0_X87 | XCR0_SSE | XCR0_ZMM, False, False),  # ZMM bits without the AVX bit
        (XCR0_X87 | XCR0_AVX | XCR0_ZMM, False, False),  # ... without the SSE bit
        (XCR0_YMM | XCR0_ZMM, True, True),
    ],
)
def test_xcr0_state_rules(xcr0, ymm, zmm):
    info = CpuInfo.from_registers(encode_registers(["osxsave", "avx", "avx2", "avx_vnni", "avx512f", "avx512_bf16"]), xcr0)
    assert (info.has("os_ymm"), info.has("os_zmm")) == (ymm, zmm)
    assert info.has("avx2") == info.has("avx_vnni") == info.has("avx") == ymm
    assert info.has("avx512f") == info.has("avx512_bf16") == zmm


@pytest.mark.parametrize("xcr0, amx", [(XCR0_YMM | XCR0_ZMM, False), (XCR0_YMM | (1 << 17), False),
                                       (XCR0_YMM | XCR0_AMX, True), (XCR0_X87 | XCR0_SSE | XCR0_AMX, True)])
def test_amx_needs_tile_state(xcr0, amx):
    info = CpuInfo.from_registers(encode_registers(["osxsave", "amx_tile", "amx_int8", "amx_bf16"]), xcr0)
    assert info.has("os_amx") == amx
    assert info.has("amx_tile") == info.has("amx_int8") == info.has("amx_bf16") == amx


def test_leaf7_subleaf1_bits():
    info = CpuInfo.from_registers(encode_registers(["osxsave", "avx_vnni"]), ALL_XCR0)
    assert info.has("avx_vnni") and not info.has("avx512_bf16")
    raw = encode_registers(["osxsave"])
    raw[(7, 1)] = (1 << 5, 0, 0, 0)
    assert CpuInfo.from_registers(raw, ALL_XCR0).has("avx512_bf16")
    assert not CpuInfo.from_registers(raw, ALL_XCR0).has("avx_vnni")


@pytest.mark.parametrize(
    "sig, family, model, stepping",
    [
        (0x000806F8, 6, 0x8F, 8),  # Sapphire Rapids
        (0x000C06F2, 6, 0xCF, 2),  # Emerald Rapids
        (0x00A10F11, 0x19, 0x11, 1),  # AMD Zen 4 (Genoa): extended family added
        (0x00000F29, 0xF, 0x2, 9),  # Pentium 4: family 0xF, extended family 0
        (0x00010543, 5, 4, 3),  # family 5: extended model is ignored
    ],
)
def test_family_model_stepping_rules(sig, family, model, stepping):
    raw = {(0, 0): (1, 0, 0, 0), (1, 0): (sig, 0, 0, 0)}
    info = CpuInfo.from_registers(raw, None)
    assert (info.family, info.model, info.stepping) == (family, model, stepping)


def test_vendor_and_brand_round_trip():
    brand = "AMD EPYC 9654 96-Core Processor"
    info = CpuInfo.from_registers(encode_registers([], vendor="AuthenticAMD", brand=brand + "   ",
                                                   family=0x19, model=0x11, stepping=1), None)
    assert (info.vendor, info.brand, info.signature) == ("AuthenticAMD", brand, "19-11-1")


def test_unknown_feature_name_raises_naming_valid_ones():
    info = CpuInfo.from_registers({}, None)
    with pytest.raises(ValueError, match=r"avx512_vnni.*os_zmm"):
        info.has("avx512vnni")
    with pytest.raises(ValueError, match="avx512_vnni"):
        info.cpu_has("vnni")
    with pytest.raises(ValueError, match="avx512_vnni"):
        encode_registers(["bogus"])
    assert info.has(" AVX2 ") is False  # names are case- and space-insensitive


def test_read_registers_respects_max_leaves_and_osxsave():
    calls: list[tuple[int, int]] = []
    leaves = encode_registers(["avx2", "avx512f"])  # OSXSAVE clear
    leaves[(0, 0)] = (1,) + leaves[(0, 0)][1:]  # max standard leaf 1: leaf 7 not available

    def fake_cpuid(leaf, sub):
        calls.append((leaf, sub))
        return leaves.get((leaf, sub), (0, 0, 0, 0))

    def no_xgetbv(xcr):
        raise AssertionError("XGETBV executed although OSXSAVE is clear (#UD on real hardware)")

    got, xcr0 = cpu.read_registers(fake_cpuid, no_xgetbv)
    assert xcr0 is None
    assert (7, 0) not in calls and (0xD, 0) not in calls
    assert (0x80000002, 0) in calls
    info = CpuInfo.from_registers(got, xcr0)
    assert not info.cpu_bits["avx2"] and not info.has("avx2")

    calls.clear()
    leaves = encode_registers(["osxsave", "avx2", "avx_vnni"])
    leaves[(7, 0)] = (0,) + leaves[(7, 0)][1:]  # no sub-leaf 1
    got, xcr0 = cpu.read_registers(fake_cpuid, lambda xcr: XCR0_YMM if xcr == 0 else 0)
    assert (7, 1) not in calls and xcr0 == XCR0_YMM
    info = CpuInfo.from_registers(got, xcr0)
    assert info.has("avx2") and not info.has("avx_vnni")


# ------------------------------------------------------------------ ISA ladder
@needs_x86
def test_effective_isa_of_each_supported_cap_is_that_cap():
    supported = isa.supported()
    if not supported:
        pytest.skip("this CPU supports no int8jit ISA path (needs at least AVX2 with YMM state)")
    for cap in supported:
        assert isa.effective_isa(cap) == cap
    assert isa.effective_isa() == max(supported, key=isa.rank)


def test_ladder_on_a_zen4_like_cpu(monkeypatch):
    # AVX512-VNNI without AVX-VNNI: avx2_vnni is not implied by avx512_core_vnni.
    fake_cpu(monkeypatch, ["osxsave", "avx", "avx2", "fma", "bmi2", "f16c", *AVX512_CORE, "avx512_vnni", "avx512_bf16"],
             vendor="AuthenticAMD", family=0x19, model=0x11)
    assert isa.supported() == ("avx2", "avx512_core", "avx512_core_vnni")
    assert isa.effective_isa("avx2_vnni") == "avx2"
    assert isa.effective_isa() == "avx512_core_vnni"


def test_cap_above_the_cpu_is_no_error(monkeypatch):
    fake_cpu(monkeypatch, ["osxsave", "avx", "avx2", "fma", "bmi2"])
    assert isa.effective_isa("avx512_core_vnni") == "avx2"
    monkeypatch.setenv(isa.ENV_CAP, "avx512_core_vnni")
    assert isa.effective_isa() == "avx2"


@pytest.mark.parametrize("value, cap", [("ALL", "avx512_core_vnni"), ("avx512_core_amx", "avx512_core_vnni"),
                                        ("AVX10_1_512", "avx512_core_vnni"), ("avx2_vnni_2", "avx2_vnni"),
                                        ("sse41", None), ("avx", None)])
def test_onednn_cap_values(monkeypatch, value, cap):
    """INT8JIT_MAX_ISA takes ONEDNN_MAX_CPU_ISA's values: a higher level caps at the
    ladder's highest it implies; one below AVX2 names no path and is refused, saying so."""
    monkeypatch.setenv(isa.ENV_CAP, value)
    if cap is None:
        with pytest.raises(isa.IsaError, match=f"INT8JIT_MAX_ISA: unknown ISA '{value}' \\(below avx2"):
            isa.max_isa()
    else:
        assert isa.max_isa() == cap


def test_paths_passed_over_say_why(monkeypatch, capsys):
    """INT8JIT_VERBOSE=dispatch names each path above the chosen one: what the CPU lacks,
    or the cap and where it came from (the environment, set_max_isa, an isa argument)."""
    from primitives import verbose

    fake_cpu(monkeypatch, ["osxsave", "avx", "avx2", "fma", "bmi2", *AVX512_CORE])  # no VNNI of either kind
    monkeypatch.setenv(isa.ENV_CAP, "avx2")
    assert isa.passed_over("avx2") == [("avx2_vnni", "CPU lacks AVX_VNNI"),
                                       ("avx512_core", "above the cap avx2 (INT8JIT_MAX_ISA)"),
                                       ("avx512_core_vnni", "CPU lacks AVX512_VNNI")]
    isa.set_max_isa("avx2_vnni")
    assert isa.passed_over("avx2")[1] == ("avx512_core", "above the cap avx2_vnni (set_max_isa())")
    assert isa.passed_over("avx512_core", "avx512_core_vnni") == [("avx512_core_vnni", "CPU lacks AVX512_VNNI")]
    isa.set_max_isa(None)
    monkeypatch.delenv(isa.ENV_CAP)
    assert isa.passed_over("avx512_core") == [("avx512_core_vnni", "CPU lacks AVX512_VNNI")]
    monkeypatch.setenv(verbose.ENV, "dispatch")
    assert verbose.planned_isa("matmul", "avx2") == "avx2"
    assert capsys.readouterr().err.splitlines() == [
        "int8jit_verbose,dispatch,matmul,avx2_vnni,CPU lacks AVX_VNNI",
        "int8jit_verbose,dispatch,matmul,avx512_core,above the cap avx2 (the isa argument)",
        "int8jit_verbose,dispatch,matmul,avx512_core_vnni,CPU lacks AVX512_VNNI"]
    monkeypatch.setenv(verbose.ENV, "1")
    assert verbose.planned_isa("matmul", "avx2") == "avx2" and capsys.readouterr().err == ""


def test_no_usable_isa_is_an_isa_error(monkeypatch):
    fake_cpu(monkeypatch, ["avx", "avx2"])  # OSXSAVE clear: AVX2 unusable
    assert isa.supported() == ()
    for cap in isa.LADDER:  # no cap helps: the message says what every path needs
        try:
            isa.effective_isa(cap)
        except isa.NoIsaPathError as exc:
            message = str(exc)
        else:
            pytest.fail(f"effective_isa({cap!r}) returned on a CPU without AVX2")
        # (checked outside the except: conftest skips a failure raised while handling this
        # error on a machine where no path runs, and this check must fail there too)
        assert re.search("no int8jit ISA path .* needs AVX2, FMA, BMI2", message), message
    assert issubclass(isa.NoIsaPathError, isa.IsaError)


def test_check_name_bogus_lists_valid_names():
    with pytest.raises(isa.IsaError) as excinfo:
        isa.check_name("bogus")
    for name in isa.LADDER:
        assert name in str(excinfo.value)
    assert isa.check_name(" AVX2 ") == "avx2"


def test_set_max_isa_overrides_environment(monkeypatch):
    monkeypatch.setenv(isa.ENV_CAP, "avx2")
    assert isa.max_isa() == "avx2"
    isa.set_max_isa("avx512_core")
    assert isa.max_isa() == "avx512_core"
    isa.set_max_isa(None)
    assert isa.max_isa() == "avx2"
    with pytest.raises(isa.IsaError, match="max_isa"):
        isa.set_max_isa("avx512")
    monkeypatch.setenv(isa.ENV_CAP, "bogus")
    with pytest.raises(isa.IsaError, match=isa.ENV_CAP):
        isa.max_isa()
    isa.set_max_isa("avx2")  # the API cap wins even over a bad environment value
    assert isa.max_isa() == "avx2"


# ------------------------------------------------------------------ cpu-probe tool
def run_main(capsys, *argv):
    status = cpu_probe.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def _subprocess(*argv, cap=None):
    env = {k: v for k, v in os.environ.items() if k != isa.ENV_CAP}
    if cap is not None:
        env[isa.ENV_CAP] = cap
    return subprocess.run([sys.executable, "-m", "tools.cpu_probe", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def _need(level: str) -> None:
    if not X86_64 or level not in isa.supported():
        have = ", ".join(isa.supported()) if X86_64 else "nothing (not x86-64)"
        pytest.skip(f"this CPU lacks the {level} path (it supports: {have or 'none'})")


def test_tool_names_vnni_and_effective_isa(capsys):
    _need("avx512_core_vnni")
    status, out, _ = run_main(capsys)
    assert status == 0
    assert re.search(r"^AVX512_VNNI\s+yes\s+ZMM yes\s+yes", out, re.M)
    assert re.search(r"^effective ISA\s+avx512_core_vnni$", out, re.M)
    assert re.search(r"^\s+gemm_u8s8s32\s+VPDPBUSD zmm \(EVEX\)", out, re.M)
    assert re.search(r"^\s+convolution\s+VPDPBUSD zmm \(EVEX\); batch-reduce GEMM", out, re.M)
    assert re.search(r"^\s+pooling\s+a kernel of its own: VPMAXUB", out, re.M)


def test_tool_as_subprocess(capsys):
    _need("avx512_core_vnni")
    proc = _subprocess()
    assert proc.returncode == 0, proc.stderr
    assert "AVX512_VNNI" in proc.stdout
    assert re.search(r"^effective ISA\s+avx512_core_vnni$", proc.stdout, re.M)


def test_tool_under_avx2_cap(capsys, monkeypatch):
    _need("avx2")
    monkeypatch.setenv(isa.ENV_CAP, "avx2")
    status, out, _ = run_main(capsys)
    assert status == 0
    assert re.search(r"^cap\s+avx2\s+\[INT8JIT_MAX_ISA\]", out, re.M)
    assert re.search(r"^effective ISA\s+avx2$", out, re.M)
    assert re.search(r"^\s+gemm_u8s8s32\s+VPMADDUBSW\+VPMADDWD\+VPADDD ymm", out, re.M)
    monkeypatch.delenv(isa.ENV_CAP)  # the flag, with no environment
    status, out, _ = run_main(capsys, "--max-isa", "avx2")
    assert status == 0 and re.search(r"^effective ISA\s+avx2$", out, re.M)


def test_tool_json_parses(capsys):
    status, out, _ = run_main(capsys, "--json")
    assert status == 0
    report = json.loads(out)
    assert set(report) >= {"cpu", "feature_table", "isa", "primitives", "kernel_families"}
    assert report["isa"]["supported"] == list(isa.supported())
    assert report["cpu"]["features"] == cpu_info().features
    if isa.supported():
        eff = isa.effective_isa()
        assert report["isa"]["effective"] == eff
        assert report["primitives"]["gemm_u8s8s32"]["kernel"] == cpu_probe.KERNEL_FAMILY[eff]
        assert "+128" in report["primitives"]["gemm_s8s8s32"]["kernel"]
    for name, p in report["primitives"].items():  # every primitive exists, on every usable ISA
        assert p["status"] == "available" and (p["kernel"] is not None) == bool(isa.supported()), name
    if isa.supported():
        assert report["primitives"]["convolution"]["kernel"].startswith(cpu_probe.KERNEL_FAMILY[eff])
        assert report["primitives"]["reorder"]["kernel"] == cpu_probe.PRIMITIVES["reorder"][1]
    assert "peak" not in report


def test_tool_unknown_cap_exits_2_in_process(capsys, monkeypatch):
    monkeypatch.setenv(isa.ENV_CAP, "avx512")
    status, out, err = run_main(capsys)
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and isa.ENV_CAP in err and "'avx512'" in err
    for name in isa.LADDER:
        assert name in err
    status, _, err = run_main(capsys, "--json", "--max-isa", "sse41")
    assert status == 2 and "--max-isa" in err and "avx512_core_vnni" in err


def test_tool_unknown_cap_exits_2_as_subprocess():
    proc = _subprocess(cap="bogus")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert "bogus" in proc.stderr and all(name in proc.stderr for name in isa.LADDER)


def test_tool_shows_cpu_yes_os_no(capsys, monkeypatch):
    fake_cpu(monkeypatch, ["osxsave", "avx", "avx2", "fma", "bmi2", *AVX512_CORE, "avx512_vnni"], xcr0=XCR0_YMM)
    status, out, _ = run_main(capsys)
    assert status == 0
    assert re.search(r"^AVX512_VNNI\s+yes\s+ZMM no\s+no\s+CPU yes, OS no$", out, re.M)
    assert re.search(r"^AVX2\s+yes\s+YMM yes\s+yes$", out, re.M)
    assert re.search(r"^effective ISA\s+avx2$", out, re.M)


def test_tool_without_usable_isa_still_reports(capsys, monkeypatch):
    fake_cpu(monkeypatch, ["sse4_1", "sse4_2"], xcr0=None)
    status, out, _ = run_main(capsys)
    assert status == 0
    assert "effective ISA none" in out and "unavailable (no usable ISA)" in out


def test_tool_peak_without_jit_peak(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "jit.peak", None)  # as if the module did not exist
    status, out, _ = run_main(capsys, "--peak")
    assert status == 0
    assert "jit.peak is not available" in out
    status, out, _ = run_main(capsys, "--peak", "--json")
    assert status == 0 and "not available" in json.loads(out)["peak"]["unavailable"]


def test_tool_peak_calls_measure_peak_per_supported_isa(capsys, monkeypatch):
    fake_cpu(monkeypatch, ["osxsave", "avx", "avx2", "fma", "bmi2", *AVX512_CORE])
    asked: list[str] = []

    def measure_peak(name: str) -> float:
        asked.append(name)
        if name == "avx512_core":
            raise RuntimeError("simulated failure")
        return 123.4

    monkeypatch.setitem(sys.modules, "jit.peak", types.SimpleNamespace(measure_peak=measure_peak))
    status, out, _ = run_main(capsys, "--peak")
    assert status == 0 and asked == ["avx2", "avx512_core"]
    assert re.search(r"^\s+avx2\s+123\.4 GOPS$", out, re.M)
    assert re.search(r"^\s+avx512_core\s+failed: RuntimeError: simulated failure$", out, re.M)


# ------------------------------------------------------------------ data caches
def _sysfs(root, caches):
    for i, (level, kind, size) in enumerate(caches):
        folder = root / f"index{i}"
        folder.mkdir(parents=True)
        (folder / "level").write_text(f"{level}\n")
        (folder / "type").write_text(f"{kind}\n")
        (folder / "size").write_text(f"{size}\n")
    return root


def test_caches_read_from_sysfs(tmp_path):
    from runtime.caches import read

    root = _sysfs(tmp_path, [(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"),
                             (3, "Unified", "32768K")])
    caches = read(root)
    assert (caches.l1d, caches.l2, caches.l3, caches.source) == (32 << 10, 1 << 20, 32 << 20, str(root))


@pytest.mark.parametrize("broken", ["missing", "no_l1", "garbage"])
def test_caches_fall_back_to_the_default(tmp_path, broken):
    from runtime.caches import DEFAULT, read

    if broken == "no_l1":
        _sysfs(tmp_path, [(2, "Unified", "2048K")])
    elif broken == "garbage":
        _sysfs(tmp_path, [(1, "Data", "lots")])
    assert read(tmp_path / "nothing" if broken == "missing" else tmp_path) == DEFAULT


def test_conv_budgets_follow_the_caches():
    """The convolution's blocking budgets come from this machine's caches."""
    import primitives.conv_blocking as blocking
    from runtime.caches import data_caches

    caches = data_caches()
    assert blocking.L1_BUDGET == caches.l1d * 5 // 6
    assert blocking.L2_BUDGET == max(caches.l2 // 2, blocking.L1_BUDGET)


def test_cpu_probe_reports_the_caches():
    report = cpu_probe.collect()
    assert set(report["caches"]) == {"l1d", "l2", "l3", "source"}
    text = cpu_probe.format_text(report)
    assert "L1 data" in text and ("L3" in text) == bool(report["caches"]["l3"])
