"""int8jit-bench: the interleaved timer, the markdown table and one quick end-to-end run."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import needs_a_path
from tools import bench, bench_timing

REPO = Path(__file__).resolve().parent.parent


def test_measure_calls_times_every_side():
    calls = {"a": 0, "b": 0}

    def a():
        calls["a"] += 1

    def b():
        calls["b"] += 1

    out = bench_timing.measure_calls({"a": a, "b": b}, min_time=0.0, window_s=1e-4, min_rounds=3)
    assert set(out) == {"a", "b"}
    for best, median in out.values():
        assert 0 < best <= median
    assert calls["a"] > 3 and calls["b"] > 3


def test_markdown_table_has_a_row_per_result():
    row = bench.Row("gemm", (2, 3, 4), "u8s8", "avx2", 1, "exact", "full", "widen",
                    int8jit_gops=10.0, peak_gops=20.0, onednn_gops=5.0, noise=0.05)
    text = bench.markdown_table([row, row])
    lines = text.strip().splitlines()
    assert len(lines) == 4 and lines[0].startswith("| shape")
    assert "| 2x3x4 | u8s8 | avx2 | 1 | exact | full | widen | 10.0 | 50% | 5.0 | 2.00 | 5% |" in lines[2]


@needs_a_path
def test_quick_run_writes_markdown(tmp_path):
    md = tmp_path / "gemm.md"
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench", "gemm", "--quick", "--min-time", "0.005", "--shapes", "8x16x32",
         "--types", "u8s8", "--threads", "1", "--markdown", str(md)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    table = md.read_text()
    assert "| 8x16x32 | u8s8 |" in table
    assert "int8jit error" not in table


def test_single_thread_rows_pin_every_side_to_one_core():
    """pin narrows this process (and the oneDNN child it starts next) to its first
    allowed CPUs; unpin restores the mask; all cores' rows are not pinned."""
    import os

    import pytest

    from tools import bench_timing as bt

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    allowed = os.sched_getaffinity(0)
    assert bt.pin(len(allowed)) is None and os.sched_getaffinity(0) == allowed
    if len(allowed) < 2:
        pytest.skip("one CPU: nothing to narrow")
    saved = bt.pin(1)
    try:
        assert os.sched_getaffinity(0) == {min(allowed)}
        child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                               capture_output=True, text=True, check=True)
        assert child.stdout.strip() == str([min(allowed)])
    finally:
        bt.unpin(saved)
    assert os.sched_getaffinity(0) == allowed


def test_host_steal_reads_the_cpus_asked_for(monkeypatch, tmp_path):
    """steal = the steal jiffies' share of all jiffies (user .. steal) of the row's CPUs."""
    import builtins

    from tools import bench_timing as bt

    stat = tmp_path / "stat"
    text = {"now": ("cpu  100 0 50 800 0 0 0 50 7 0\n"
                    "cpu0 60 0 30 400 0 0 0 10 7 0\n"
                    "cpu1 40 0 20 400 0 0 0 40 0 0\nintr 1 2 3\n")}
    real_open = builtins.open

    def fake_open(path, *args, **kwargs):
        if path == "/proc/stat":
            stat.write_text(text["now"])
            return real_open(stat, *args, **kwargs)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    assert bt.host_steal_counters() == (50, 1000)
    assert bt.host_steal_counters([1]) == (40, 500)
    before = bt.host_steal_counters([0, 1])
    text["now"] = text["now"].replace("cpu1 40 0 20 400 0 0 0 40", "cpu1 40 0 20 430 0 0 0 110")
    after = bt.host_steal_counters([0, 1])
    assert abs(bt.steal_fraction(before, after) - 70 / 100) < 1e-12
    assert bt.steal_fraction(after, after) is None and bt.steal_fraction(None, after) is None
    assert bt.host_steal_counters([5]) is None  # no such CPU in the file


@needs_a_path
def test_conv_chain_quick_run(tmp_path):
    """``int8jit-bench conv --chain``: the layers called one after another, one row per
    batch and thread count, both sides timed (oneDNN where it is installed)."""
    from tools import onednn

    md = tmp_path / "chain.md"
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench", "conv", "--chain", "--quick", "--min-time", "0.005", "--threads", "1",
         "--layers", "res2 1x1 64->64,res3 1x1 512->128", "--batch", "1,2", "--markdown", str(md)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split(" | ") for line in md.read_text().splitlines() if line.startswith("| 2 layers, batch")]
    assert [row[0] for row in rows] == ["| 2 layers, batch 1", "| 2 layers, batch 2"]
    assert all(row[1:3] == ["2", "1"] for row in rows)  # calls, threads
    if onednn.available()[0]:
        assert all(row[4] != "n/a" and row[6] != "n/a" for row in rows), rows  # oneDNN, bound


def test_bert_chain_is_twelve_layers_of_six_linears():
    import argparse

    from tools import bench_problems as bp

    args = argparse.Namespace(shapes=None, layers=None)
    groups = bp.chain_groups("ip", [], args)
    assert [name for name, _ in groups] == ["BERT-base linears, 128 tokens", "BERT-base linears, 384 tokens"]
    cases = groups[0][1]
    assert len(cases) == 72 and [c["N"] for c in cases[:6]] == [768, 768, 768, 768, 3072, 768]
    assert len(bp.chain_groups("conv", [{"N": 1}], args)[0][1]) == 53


@needs_a_path
def test_conv_policy_rows_share_operands_and_faithful_equals_onednn(tmp_path):
    """``--policy exact,faithful``: one row per policy on the same operands; a faithful row
    computes what oneDNN computes on every path (VPMADDUBSW saturation included), so its
    check is ``=``."""
    import argparse

    from tools import bench_problems as bp
    from tools import onednn

    args = argparse.Namespace(layers="res2 1x1 64->64", quick=True, batch="1", policy="exact,faithful")
    exact, faithful = bp.problems_for("conv", args)
    assert (exact["label"], faithful["label"]) == ("res2 1x1 64->64", "res2 1x1 64->64 [faithful]")
    assert (exact["policy"], faithful["policy"]) == ("exact", "faithful")
    for a, b in zip(bp.conv_operands(exact), bp.conv_operands(faithful)):
        assert np.array_equal(a, b)
    with pytest.raises(SystemExit, match="--policy"):
        bp.problems_for("conv", argparse.Namespace(layers=None, quick=True, batch="1", policy="fast"))
    ip_args = argparse.Namespace(shapes="8x16x32", quick=True, policy="faithful")
    assert [c["label"] for c in bp.problems_for("ip", ip_args)] == ["8x16x32 [faithful]"]
    with pytest.raises(SystemExit, match="--policy"):  # convolution's alone
        bp.problems_for("ip", argparse.Namespace(shapes="8x16x32", quick=True, policy="halve_weights"))
    if not onednn.available()[0]:
        pytest.skip("oneDNN is not installed: no check column to read")
    md = tmp_path / "policy.md"
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench", "conv", "--quick", "--min-time", "0.005", "--threads", "1",
         "--layers", "res2 1x1 64->64", "--batch", "1", "--policy", "faithful", "--markdown", str(md)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split(" | ") for line in md.read_text().splitlines() if line.startswith("| res2 1x1")]
    header = next(line for line in md.read_text().splitlines() if line.startswith("| problem")).split(" | ")
    assert len(rows) == 1 and rows[0][0] == "| res2 1x1 64->64 [faithful]"
    assert rows[0][header.index("check")].strip() == "=", rows


def test_conv_sources_times_each_way_with_equal_outputs(capsys):
    """``int8jit-bench conv-sources``: one primitive per way of reading the source, their
    outputs compared, a time and ratio each; the conv module's rules are restored after."""
    import primitives.conv as conv
    from tools import conv_sources

    rules = conv.strips_pay, conv.edges_pay
    assert bench.main(["conv-sources", "--layers", "res5 3x3 512", "--variants", "copy,edges,strips",
                       "--seconds", "0.01"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("res5 3x3 512->512")]
    assert len(lines) == 1 and "OUTPUTS DIFFER" not in lines[0], lines
    assert all(f"{name}=" in lines[0] for name in ("copy", "edges", "strips")) and "(1.000)" in lines[0]
    assert (conv.strips_pay, conv.edges_pay) == rules
    with pytest.raises(ValueError, match="--variants"):
        with conv_sources.variant("mirror"):
            pass


def test_trained_weights_rows_take_the_split_path():
    """``--weights trained``: labelled rows whose weights, per-channel quantized Laplacian
    values, are what exact splits into residual cells on a path without VNNI (the rows
    then time that kernel, not the widening one); the uniform default widens."""
    import argparse

    from primitives.gemm import decide
    from tools import bench_problems as bp

    args = argparse.Namespace(shapes="128x768x768", quick=True, policy="exact,faithful", weights="trained")
    exact, faithful = bp.problems_for("ip", args)
    assert (exact["label"], faithful["label"]) == ("128x768x768 [trained weights]",
                                                   "128x768x768 [faithful, trained weights]")
    _, W, _, _, _ = bp.gemm_operands(exact)
    assert np.array_equal(np.abs(W).max(axis=0), np.full(768, 127))  # per channel to +-127
    assert decide("avx2", "exact", W).residual
    _, uniform, _, _, _ = bp.gemm_operands(dict(exact, weights="uniform"))
    assert decide("avx2", "exact", uniform).path.kind == "widen"
    names = [name for name, _ in bp.chain_groups("ip", [], argparse.Namespace(shapes=None, weights="trained"))]
    assert names == ["BERT-base linears, 128 tokens, trained weights", "BERT-base linears, 384 tokens, trained weights"]


@needs_a_path
def test_attention_quick_run(tmp_path):
    """``int8jit-bench matmul --attention``: BERT-base's 12 heads (prefill and decode,
    keys and values given at every call), both sides' outputs equal where oneDNN runs."""
    import argparse

    from tools import bench_problems as bp
    from tools import onednn

    cases = bp.problems_for("matmul", argparse.Namespace(attention=True, policy=None, weights="uniform"))
    assert [c["label"] for c in cases][:2] == ["attention QK^T 12x128", "attention PV 12x128"]
    assert bp.ops(dict(cases[0])) == 2 * 12 * 128 * 128 * 64 and all(c["runtime"] for c in cases)
    md = tmp_path / "attention.md"
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench", "matmul", "--attention", "--quick", "--min-time", "0.005",
         "--threads", "1", "--no-creation", "--markdown", str(md)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in md.read_text().splitlines() if line.startswith("| decode") or "attention" in line]
    assert len(rows) == 4 and "int8jit error" not in md.read_text()
    if onednn.available()[0]:
        assert all(" | = | " in row for row in rows), rows  # (the check column: equal outputs)


@needs_a_path
def test_new_arrays_quick_run(tmp_path):
    """``--new-arrays``: int8jit's calls get new array objects (views of the same memory)
    at every call; the rows are labelled, the operands are the other rows', and the
    outputs equal oneDNN's where it runs."""
    import argparse

    from tools import bench_problems as bp
    from tools import onednn

    plain = bp.problems_for("conv", argparse.Namespace(layers="res2 1x1 64->64", quick=True, batch="1", policy=None,
                                                        weights="uniform"))
    new = bp.problems_for("conv", argparse.Namespace(layers="res2 1x1 64->64", quick=True, batch="1", policy=None,
                                                      weights="uniform", new_arrays=True))
    assert [c["label"] for c in new] == ["res2 1x1 64->64 [new arrays]"] and new[0]["new_arrays"]
    chains = bp.chain_groups("conv", new, argparse.Namespace(layers=None, policy=None, weights="uniform",
                                                              new_arrays=True))
    assert chains[0][0] == "ResNet-50 convolutions, batch 1, new arrays"
    assert all(c["new_arrays"] for c in chains[0][1]) and len(chains[0][1]) == 53
    assert all(np.array_equal(a, b) for a, b in zip(bp.conv_operands(plain[0]), bp.conv_operands(new[0])))
    md = tmp_path / "new.md"
    for bench_args in (["conv", "--layers", "res2 1x1 64->64", "--batch", "1"],
                       ["matmul", "--attention", "--no-creation"]):
        proc = subprocess.run(
            [sys.executable, "-m", "tools.bench", *bench_args, "--new-arrays", "--quick", "--min-time", "0.005",
             "--threads", "1", "--markdown", str(md)],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        rows = [line for line in md.read_text().splitlines() if "[new arrays]" in line]
        assert rows and "int8jit error" not in md.read_text()
        if onednn.available()[0]:
            assert all(" | = | " in row for row in rows), rows
