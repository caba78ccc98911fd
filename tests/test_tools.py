"""tools/: int8jit-demo, dump-asm, cpu-probe --peak (no timing is asserted, only positivity)."""
from __future__ import annotations

import re

import pytest

from jit.dot import fast_path, paths
from runtime import isa as isa_mod
from runtime.isa import LADDER, cpu_supports
from tools import demo as demo_tool
from tools import dump_asm

SUPPORTED = set(isa_mod.supported())


PATHS = [(path.isa, path.kind) for isa in LADDER for path in paths(isa)]


# -- int8jit-demo ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_output():
    import io

    mp = pytest.MonkeyPatch()
    mp.delenv(isa_mod.ENV_CAP, raising=False)
    try:
        buf = io.StringIO()
        status = demo_tool.run(buf)
    finally:
        mp.undo()
    return status, buf.getvalue()


def test_demo_exits_zero_and_names_the_cpu(demo_output):
    status, text = demo_output
    assert status == 0, text
    assert "CPU" in text and "effective ISA" in text and "ISA ladder" in text


@pytest.mark.parametrize("isa,kind", PATHS)
def test_demo_row_per_path(demo_output, isa, kind):
    _, text = demo_output
    rows = [line for line in text.splitlines() if line.startswith(f"{isa} {kind} ")]
    assert len(rows) == 1, text
    row = rows[0]
    if isa not in SUPPORTED:
        assert "not executable on this CPU" in row and "bytes" in row
        return
    if kind == "maddubsw":
        assert re.search(r"\b32767\s+255\s+64770/32258\s+saturated\b", row), row
    else:
        assert re.search(r"\b64770\s+32258\s+64770/32258\s+exact\b", row), row


def test_demo_gemm_exact_policy_is_exact_everywhere(demo_output):
    _, text = demo_output
    gemm_part = text.split("GEMM primitive", 1)[1].split("An int8 layer", 1)[0]
    for isa in SUPPORTED:
        exact = [ln for ln in gemm_part.splitlines() if ln.startswith(isa + " ") and " exact " in ln[:30]]
        assert len(exact) == 1, gemm_part
        assert re.search(r"\b64770\s+32258\b.*\bexact$", exact[0]), exact[0]
        faithful = [ln for ln in gemm_part.splitlines() if ln.startswith(isa + " ") and " faithful " in ln]
        assert len(faithful) == 1
        if fast_path(isa).kind == "maddubsw":
            assert re.search(r"\bmaddubsw\s+32767\s+255\b.*saturated$", faithful[0]), faithful[0]


def test_demo_int8_layer_exact_policy(demo_output):
    """The layer section: 0 outputs differ from the exact model under the exact policy on
    every runnable ISA, with uniform and trained-like weights; faithful differs only on
    VPMADDUBSW paths, where exact widens uniform weights and splits trained ones."""
    _, text = demo_output
    layer = text.split("An int8 layer", 1)[1]
    for isa in SUPPORTED:
        for policy in ("exact", "faithful"):
            for weights in ("uniform", "trained"):
                line = [ln for ln in layer.splitlines() if ln.split()[:3] == [isa, policy, weights]]
                assert len(line) == 1, layer
                conv, matmul = (int(v) for v in line[0].split()[3:5])
                if policy == "exact" or fast_path(isa).kind == "vnni":
                    assert conv == matmul == 0, line[0]
                else:
                    assert conv > 0 and matmul > 0, line[0]
                if policy == "exact" and fast_path(isa).kind == "maddubsw":
                    # (each row's primitive is its own: it lists only the kernels these weights took)
                    took, other = ("_widen_", "_cells_") if weights == "uniform" else ("_maddubsw_cells_", "_widen_")
                    assert took in line[0] and other not in line[0], line[0]


def test_demo_main_returns_zero(capsys, monkeypatch):
    monkeypatch.setenv(isa_mod.ENV_CAP, "avx2")
    assert demo_tool.main([]) == 0
    text = capsys.readouterr().out
    if "avx2" in SUPPORTED:
        assert "not run: above the cap avx2" in text or not (SUPPORTED - {"avx2"})
        # (a capped path is not "not executable on this CPU": it would run)
        assert all("not executable" not in line or "lacks" in line for line in text.splitlines()), text


def test_demo_on_a_cpu_without_avx2(monkeypatch):
    """Where no path runs, the demo still probes, generates every path's kernels and says
    that none can run, and exits 0 (the main job works on any x86-64 CPU)."""
    import io

    from runtime import cpu
    from tests.conftest import cpu_without_avx2

    monkeypatch.setattr(cpu, "_cached", cpu_without_avx2("a CPU without AVX2"))
    monkeypatch.delenv(isa_mod.ENV_CAP, raising=False)
    buf = io.StringIO()
    assert demo_tool.run(buf) == 0, buf.getvalue()
    text = buf.getvalue()
    assert "effective ISA  none: no int8jit ISA path is usable" in text, text
    for isa, kind in PATHS:
        row = [line for line in text.splitlines() if line.startswith(f"{isa} {kind} ")]
        assert len(row) == 1 and "not executable on this CPU (lacks AVX2" in row[0] and "bytes" in row[0], text
    assert text.split("An int8 layer", 1)[1].count("(none: no path executes on this CPU)") == 1, text


def test_demo_expected_model():
    assert demo_tool.expected("maddubsw", (255, 255, 0, 0), (127, 127, 0, 0), False) == 32767
    assert demo_tool.expected("maddubsw", (127, 127, 0, 0), (127, 127, 0, 0), True) == 255
    assert demo_tool.expected("vnni", (127, 127, 0, 0), (127, 127, 0, 0), True) == 32258


# -- dump-asm ----------------------------------------------------------------------------------
def _dump(capsys, *argv):
    status = dump_asm.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _check_step(text: str, kind: str) -> None:
    low = text.lower()
    if kind == "vnni":
        assert "vpdpbusd" in low
        assert "vpmaddubsw" not in low
    elif kind == "maddubsw":
        assert "vpmaddubsw" in low and "vpmaddwd" in low
    else:
        assert "vpmaddwd" in low and "vpmaddubsw" not in low and "vpdpbusd" not in low


def _vpdpbusd_encodings(code: bytes) -> set[str]:
    from jit.disasm import decode, encoding_name

    return {encoding_name(i) for i in decode(code) if str(i).startswith("vpdpbusd")}


@pytest.mark.parametrize("isa,kind", PATHS)
@pytest.mark.parametrize("name", ["demo", "peak"])
def test_dump_asm_demo_and_peak_on_every_path(capsys, name, isa, kind):
    status, out, err = _dump(capsys, name, "--isa", isa, "--kind", kind)
    assert status == 0, err
    assert re.search(r"^0000  [0-9a-f]+ +\S", out, re.M), out[:500]
    _check_step(out, kind)
    if name == "demo":
        from jit.demo_kernel import demo_kernel

        code = demo_kernel(isa, kind).code()
    else:
        from jit.peak import peak_kernel

        code = peak_kernel(isa, kind).code()
    if kind == "vnni":
        assert _vpdpbusd_encodings(code) == {"vex" if isa == "avx2_vnni" else "evex"}
        assert ("zmm" in out) == (isa == "avx512_core_vnni")


@pytest.mark.parametrize("isa", LADDER)
def test_dump_asm_gemm_every_isa(capsys, isa):
    status, out, err = _dump(capsys, "gemm", "--m", "7", "--n", "20", "--k", "13", "--isa", isa,
                             "--policy", "faithful")
    assert status == 0, err
    _check_step(out, fast_path(isa).kind)
    if isa in SUPPORTED:
        assert "impl_info" in out and f"isa: {isa}" in out


@pytest.mark.parametrize("isa", LADDER)
@pytest.mark.parametrize("a_type", ["u8", "s8"])
def test_dump_asm_gemm_generated_where_cpu_lacks_it(capsys, monkeypatch, isa, a_type):
    """A path the CPU lacks is generated and disassembled, never executed (simulated here)."""
    monkeypatch.setattr(isa_mod, "cpu_supports", lambda name: False)
    status, out, err = _dump(capsys, "gemm", "--m", "5", "--n", "9", "--k", "16", "--isa", isa, "--a-type", a_type)
    assert status == 0, err
    assert "not executable on this CPU" in out and "generated and disassembled only" in out
    # exact policy with random weights: VNNI stays fast, the others widen
    _check_step(out, "vnni" if isa.endswith("vnni") else "widen")
    assert f"gemm_{a_type}s8s32_{isa}_" in out


def test_dump_asm_gemm_exact_picks_widening_on_random_weights(capsys):
    isa = next((i for i in ("avx2", "avx512_core") if i in SUPPORTED), None)
    if isa is None:
        pytest.skip("the CPU has neither avx2 nor avx512_core")
    status, out, _ = _dump(capsys, "gemm", "--m", "4", "--n", "16", "--k", "32", "--isa", isa)
    assert status == 0
    assert "path: widen" in out
    _check_step(out, "widen")


@pytest.mark.parametrize("isa", LADDER)
@pytest.mark.parametrize("a_type", ["u8", "s8"])
@pytest.mark.parametrize("policy", ["exact", "faithful"])
def test_dump_asm_gemv(capsys, isa, a_type, policy):
    """The in-place kernel of runtime weights on every path (generated where the CPU
    lacks one): VPDPBUSD in its path's encoding, widened under exact without VNNI,
    VPMADDUBSW under faithful; the lanes added across, masked K tails; an s8 source's
    compensation (the column sums by ones; none widened) in the kernel's name."""
    status, out, err = _dump(capsys, "gemv", "--isa", isa, "--a-type", a_type, "--fused", "--policy", policy)
    assert status == 0, err
    vnni, wide = isa.endswith("vnni"), isa.startswith("avx512")
    kind = "vnni" if vnni else "widen" if policy == "exact" else "maddubsw"
    _check_step(out, kind)
    low = out.lower()
    assert "vpunpckhqdq" in low and ("vshufi64x2" if wide else "vperm2i128") in low
    assert ("vmovdqu8" if wide else "vpmaskmovd") in low
    comp = "_comp" if a_type == "s8" and kind != "widen" else ""
    assert f"gemv_{a_type}s8u8_{isa}{'_widen' if kind == 'widen' else ''}{comp} [{isa}]" in out


@pytest.mark.parametrize("isa", LADDER)
def test_dump_asm_gemv_chunks(capsys, isa):
    """--chunks: the three rows kernels of one row walking K in chunks, the last one's
    output stage adding the partial sums (a VPADDD from memory before the conversion)."""
    status, out, err = _dump(capsys, "gemv", "--isa", isa, "--chunks", "--fused")
    assert status == 0, err
    names = [line.split()[1] for line in out.splitlines() if line.startswith(";   gemv_rows1_")]
    assert len(names) == 3 and names[2].endswith("_partial") and not names[0].endswith("_partial"), out
    assert "chunks of 8 rows" in out and "vcvtdq2ps" in out.lower()


def test_dump_asm_att_syntax(capsys):
    status, out, _ = _dump(capsys, "peak", "--isa", "avx512_core_vnni", "--syntax", "att")
    assert status == 0
    assert "%zmm" in out and "vpdpbusd %zmm" in out
    assert out.startswith("#")


def test_dump_asm_output_file_and_bin(capsys, tmp_path):
    from jit.peak import peak_kernel

    listing, raw = tmp_path / "peak.s", tmp_path / "peak.bin"
    status, out, _ = _dump(capsys, "peak", "--isa", "avx2", "-o", str(listing), "--bin", str(raw))
    assert status == 0 and out == ""
    assert raw.read_bytes() == peak_kernel("avx2").code()
    text = listing.read_text()
    assert "vpmaddubsw" in text
    from jit.disasm import decode

    # one listing line per decoded instruction (plus the comment header)
    body = [ln for ln in text.splitlines() if not ln.startswith(";")]
    assert len(body) == len(list(decode(raw.read_bytes())))


def test_dump_asm_list(capsys):
    status, out, _ = _dump(capsys, "--list")
    assert status == 0
    assert {"demo", "peak", "gemm"} <= {ln.split()[0] for ln in out.splitlines()}


@pytest.mark.parametrize("argv,needle", [
    (["bogus"], "unknown kernel 'bogus'"),
    (["demo", "--isa", "avx9"], "unknown ISA 'avx9'"),
    (["peak", "--isa", "avx2_vnni", "--kind", "widen"], "no widening path"),
    (["gemm", "--m", "4", "--isa", "avx2"], "--n"),
    (["gemv", "--isa", "avx2", "--policy", "halve_weights"], "halve_weights is convolution's"),
    ([], "--list"),
    (["demo", "--syntax", "nasm"], "invalid choice"),
])
def test_dump_asm_usage_errors(capsys, argv, needle):
    status, out, err = _dump(capsys, *argv)
    assert status == 2
    assert needle in err and err.startswith("dump-asm: error:")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv,option", [
    (["conv", "--ic", "8", "--oc", "8", "--hw", "8", "--stride", "0"], "--stride"),  # (was ZeroDivisionError)
    (["conv", "--ic", "8", "--oc", "8", "--hw", "8", "--stride", "-1"], "--stride"),
    (["conv", "--ic", "8", "--oc", "8", "--hw", "8", "--groups", "0"], "--groups"),  # (was ZeroDivisionError)
    (["conv", "--ic", "8", "--oc", "8", "--hw", "8", "--groups", "-2"], "--groups"),  # (was taken as 1)
    (["conv", "--ic", "8", "--oc", "8", "--hw", "8", "--batch", "0"], "--batch"),  # (was "max() arg ...")
    (["conv", "--ic", "0", "--oc", "8", "--hw", "8"], "--ic"),
    (["conv", "--ic", "8", "--oc", "-8", "--hw", "8"], "--oc"),
    (["conv", "--ic", "8", "--oc", "8", "--hw", "-8"], "--hw"),
    (["conv", "--ic", "8", "--oc", "8", "--hw", "8", "--window", "0"], "--window"),
    (["conv", "--ic", "8", "--oc", "8", "--hw", "8", "--pad", "-1"], "--pad"),
    (["conv", "--ic", "8", "--oc", "8", "--hw", "8", "--stride", "two"], "--stride"),
    (["pool", "--window", "-3"], "--window"),  # (was a "max -3x-3" listing)
    (["pool", "--window", "0"], "--window"),
    (["pool", "--depth", "-1"], "--depth"),
    (["gemm", "--m", "0", "--n", "4", "--k", "4"], "--m"),
    (["gemm", "--m", "4", "--n", "-4", "--k", "4"], "--n"),
    (["gemm", "--m", "4", "--n", "4", "--k", "1.5"], "--k"),
    (["gemm", "--m", "100000000", "--n", "100000", "--k", "1"], "--m 100000000"),  # (was numpy's MemoryError)
    (["gemm", "--m", "16", "--n", "16000", "--k", "16000", "--weights", "trained"], "GiB"),
    # halve_weights is convolution's, on every path (avx2_vnni's generated GEMM took it)
    (["gemm", "--m", "4", "--n", "4", "--k", "4", "--policy", "halve_weights", "--isa", "avx2_vnni"], "--policy"),
    (["gemm", "--m", "4", "--n", "4", "--k", "4", "--policy", "halve_weights", "--isa", "avx2"], "--policy"),
    (["gemm", "--m", "4", "--n", "4", "--k", "4", "--policy", "halve_weights", "--isa", "avx512_core_vnni"],
     "--policy"),
    # (an unwritable file: status 1 after the listing was printed, or written in part)
    (["gemm", "--m", "4", "--n", "4", "--k", "4", "-o", "/nonexistent/x.s"], "--output"),
    (["gemm", "--m", "4", "--n", "4", "--k", "4", "--bin", "/nonexistent/x.bin"], "--bin"),
    (["pool", "--dst", "f32"], "--dst"),  # (max pooling writes the source's type: it dumped u8 -> u8)
    (["pool", "--a-type", "s8", "--dst", "u8"], "--dst"),
])
def test_dump_asm_bad_numbers_and_policies(capsys, argv, option):
    """A bad value is a usage error naming its option (exit 2, one line), before anything
    is generated or allocated: never a traceback, never a listing of nonsense."""
    status, out, err = _dump(capsys, *argv)
    assert status == 2 and out == "", err
    assert err.startswith("dump-asm: error:") and option in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv,option", [
    (["gemm", "--threads", "abc"], "--threads"),  # (was a ValueError traceback)
    (["gemm", "--threads", "0"], "--threads"),  # (was a table of "int8jit error" rows)
    (["gemm", "--threads", "1,,0"], "--threads"),
    (["gemm", "--threads", ","], "--threads"),
    (["gemm", "--shapes", "4x4x0"], "--shapes"),
    (["gemm", "--shapes", "4x0x4"], "--shapes"),  # (was "unknown ISA 'any'" rows)
    (["gemm", "--shapes=-4x4x4"], "--shapes"),
    (["gemm", "--shapes", "4x4"], "--shapes"),
    (["gemm", "--min-time", "-1"], "--min-time"),
    (["gemm", "--min-time", "0"], "--min-time"),
    (["gemm", "--min-time", "nan"], "--min-time"),
    (["gemm", "--isa", "avx9"], "--isa"),
    (["gemm", "--types", "u8u8"], "--types"),
    (["gemm", "--policy", "halve_weights"], "--policy"),
    (["matmul", "--threads", "0"], "--threads"),
    (["matmul", "--shapes", "4x0x4"], "--shapes"),
    (["matmul", "--min-time", "-1"], "--min-time"),
    (["ip", "--policy", "halve_weights"], "--policy"),
    (["ip", "--layers", "x"], "--layers"),  # (ip's problems are --shapes: it was ignored)
    (["conv", "--batch", "0"], "--batch"),
    (["conv", "--batch", "x"], "--batch"),
    (["conv", "--layers", "nope"], "--layers"),
    (["conv", "--policy", "fast"], "--policy"),
    (["pool", "--threads=-1"], "--threads"),
    (["conv-sources", "--threads", "0"], "--threads"),  # (was a traceback: it parsed its own)
    (["conv-sources", "--batch", "1.5"], "--batch"),
    (["conv-sources", "--seconds", "0"], "--seconds"),
    (["conv-sources", "--isa", "avx9"], "--isa"),
    (["conv-sources", "--policy", "fast"], "--policy"),
    (["conv-sources", "--variants", "model,fast"], "--variants"),
    (["conv-sources", "--layers", "nosuch"], "--layers"),  # (printed a header, status 0)
    (["gemm", "--csv", "/nonexistent/x.csv"], "--csv"),  # (a traceback after the whole run)
    (["ip", "--markdown", "/nonexistent/x.md"], "--markdown"),
])
def test_bench_bad_arguments(capsys, argv, option):
    """int8jit-bench refuses a bad option value at parsing (argparse's error: usage, then
    one error line naming the option; exit 2), before any child process or timed row."""
    from tools import bench

    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith(f"int8jit-bench {argv[0]}: error:") and option in last, captured.err
    assert "Traceback" not in captured.err and captured.out == ""


@pytest.mark.parametrize("command", ["gemm", "matmul", "pool", "conv-sources"])
def test_bench_refuses_a_path_the_cpu_lacks(capsys, monkeypatch, command):
    """``--isa avx512_core`` on an AVX2-only CPU is refused at parsing, naming the paths it
    runs (gemm, matmul and pool had run avx2's kernels in a row labelled avx512_core)."""
    from runtime import cpu
    from tools import bench

    regs = cpu.encode_registers(("osxsave", "avx", "avx2", "fma", "bmi2"), brand="synthetic AVX2 CPU")
    monkeypatch.setattr(cpu, "_cached", cpu.CpuInfo.from_registers(regs, cpu.XCR0_YMM))
    with pytest.raises(SystemExit) as exc:
        bench.main([command, "--isa", "avx2,avx512_core"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "this CPU cannot run avx512_core (it runs avx2)" in err, err


def test_gemm_bench_rows_of_the_policies_asked():
    """``int8jit-bench gemm --policy``: VNNI paths' exact rows answer any policy (they are
    the same there; the filter had left an empty table), and without VNNI the one-off
    rows follow the policies asked (``--policy exact`` had dropped them)."""
    from tools.bench import GemmBench

    assert GemmBench.rows("avx512_core_vnni", ["faithful"]) == [("exact", w) for w in ("full", "call", "new")]
    assert GemmBench.rows("avx2", ["exact"]) == [("exact", "full"), ("exact", "safe"), ("exact", "call"),
                                                ("exact", "new")]
    assert GemmBench.rows("avx2", ["faithful"]) == [("faithful", "full"), ("faithful", "call"), ("faithful", "new")]
    assert GemmBench.rows("avx2") == [("faithful", "full"), ("exact", "full"), ("exact", "safe"),
                                      ("faithful", "call"), ("faithful", "new")]


@pytest.mark.parametrize("buffered", [True, False])
@pytest.mark.parametrize("argv", [
    ["tools.cpu_probe", "--json"], ["tools.cpu_probe", "--help"], ["tools.dump_asm", "--list"],
    ["tools.bench", "gemm", "--help"], ["tools.demo"],  # (the demo's had been a traceback, status 1)
])
def test_tools_exit_quietly_on_a_closed_pipe(argv, buffered):
    """``cpu-probe --json | head -c 10``: stdout's reader gone before the tool writes, the
    tool ends with status 0 and no traceback (buffered: at the flush; unbuffered: at the
    write), not BrokenPipeError's traceback or "Exception ignored" and status 120."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    read, write = os.pipe()
    os.close(read)  # (the reader is gone before the tool starts: every write fails)
    try:
        proc = subprocess.run([sys.executable, "-m", *argv], cwd=root, env=env, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_dump_asm_as_a_process():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "tools.dump_asm", "nope"], cwd=root, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "unknown kernel" in proc.stderr and "Traceback" not in proc.stderr


# -- peak --------------------------------------------------------------------------------------
@pytest.fixture
def short_peak(monkeypatch):
    import jit.peak

    monkeypatch.setattr(jit.peak, "DURATION_S", 0.002)
    monkeypatch.setattr(jit.peak, "REPEATS", 1)
    return jit.peak


def test_cpu_probe_peak_prints_a_number_per_supported_path(capsys, short_peak, monkeypatch):
    from tools import cpu_probe

    monkeypatch.delenv(isa_mod.ENV_CAP, raising=False)
    assert cpu_probe.main(["--peak"]) == 0
    out = capsys.readouterr().out
    section = out.split("measured int8 peak", 1)[1]
    for isa in SUPPORTED:
        m = re.search(rf"^\s+{isa}\s+([0-9.]+) GOPS$", section, re.M)
        assert m, section
        assert float(m.group(1)) > 0


@pytest.mark.parametrize("isa,kind", PATHS)
def test_measure_peak_positive_or_refused(short_peak, isa, kind):
    if not cpu_supports(isa):
        with pytest.raises(RuntimeError, match="cannot execute"):
            short_peak.measure_peak(isa, kind)
        return
    assert short_peak.measure_peak(isa, kind) > 0


def test_measure_peak_refuses_what_the_cpu_lacks(short_peak, monkeypatch):
    monkeypatch.setattr(short_peak, "cpu_supports", lambda name: False)
    with pytest.raises(RuntimeError, match="cannot execute"):
        short_peak.measure_peak("avx2")


def test_peak_op_counting():
    from jit.dot import widening_path
    from jit.peak import ops_per_step

    assert ops_per_step(fast_path("avx512_core_vnni")) == 128
    assert ops_per_step(fast_path("avx512_core")) == 128
    assert ops_per_step(widening_path("avx512_core")) == 64
    assert ops_per_step(fast_path("avx2_vnni")) == 64
    assert ops_per_step(fast_path("avx2")) == 64
    assert ops_per_step(widening_path("avx2")) == 32


@pytest.mark.parametrize("isa", ["avx2", "avx512_core"])
def test_dump_asm_gemm_trained_weights_show_the_cells_kernel(capsys, isa):
    """``--weights trained``: exact keeps VPMADDUBSW and adds residual cells, whose loop
    (each cell's A offset read after its weights' vector) the listing shows; generated
    and disassembled where the CPU lacks the path."""
    status, out, err = _dump(capsys, "gemm", "--m", "13", "--n", "40", "--k", "256", "--isa", isa,
                             "--weights", "trained")
    assert status == 0, err
    assert f"gemm_u8s8s32_{isa}_maddubsw_cells_" in out and "residual cells" in out
    vb = "20h" if isa == "avx2" else "40h"
    assert any(line.endswith(f"mov rdx,[rbx+{vb}]") for line in out.splitlines())
