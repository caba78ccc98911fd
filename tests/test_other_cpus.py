"""The test suite on a CPU with fewer paths than this one (conftest's INT8JIT_TEST_CPU).

CI may run on another x86-64 CPU. Capping the ISA runs every path this machine has;
this checks what a machine that lacks the upper paths does: the probe's answer picks the
best path it has, the tests of the others skip with the missing feature named, and
their kernels are still generated and disassembled. A subset of the suite (the
convolution's tests and ``dump-asm conv``) runs in a child pytest for each lower level,
and another as an x86-64 CPU without AVX2, where no path runs.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runtime import isa as isa_mod

ROOT = Path(__file__).resolve().parent.parent
LOWER = list(isa_mod.supported()[:-1])  # the paths under this CPU's best


@pytest.mark.parametrize("level", LOWER or [pytest.param("none", marks=pytest.mark.skip(
    reason="this CPU runs one path only: there is no lower level to pretend"))])
def test_suite_subset_on_a_cpu_with_fewer_paths(level):
    env = dict(os.environ, INT8JIT_TEST_CPU=level, PYTHONDONTWRITEBYTECODE="1")
    env.pop(isa_mod.ENV_CAP, None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-rs",
                           "tests/test_conv.py", "tests/test_dump_asm_conv.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    above = isa_mod.LADDER[isa_mod.LADDER.index(level) + 1:]
    for path in above:  # each path above the pretended CPU's was skipped, saying why
        assert "CPU lacks" in out and f"(needed by the {path} path)" in out, (path, out[-3000:])
    assert f"(needed by the {level} path)" not in out


def test_convolution_tests_with_a_zen4_cores_caches():
    """The convolution's blocking follows the core's caches (``primitives.conv_blocking``'s
    budgets, from sysfs). Its tests run here as on an AMD Zen 4 core, 32 KB of L1 data
    and 1 MB of L2 (conftest's INT8JIT_TEST_CACHES), where other tiles and plans are
    chosen (res2's 3x3: blocks of 4 rows, not 6): exact all the same, and the tests of
    the model's picks pin the caches they were measured with."""
    env = dict(os.environ, INT8JIT_TEST_CACHES="32K,1M", PYTHONDONTWRITEBYTECODE="1")
    env.pop("INT8JIT_TEST_CPU", None)
    probe = subprocess.run([sys.executable, "-c", "import tests.conftest, primitives.conv_blocking as c; "
                            "print(c.L1_BUDGET, c.L2_BUDGET)"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert probe.stdout.split() == [str(32 * 1024 * 5 // 6), str(512 * 1024)], probe.stdout + probe.stderr
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           "tests/test_conv.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def test_suite_subset_on_a_cpu_without_avx2():
    """On an x86-64 CPU without AVX2 no path runs (``runtime.isa.NoIsaPathError``): the
    tests that need one skip, saying so, and the rest pass (kernels generated and
    disassembled for every path, argument checks, the docstrings whose examples run no
    kernel). Without conftest's hooks, such a machine's run fails by the hundreds."""
    env = dict(os.environ, INT8JIT_TEST_CPU="none", PYTHONDONTWRITEBYTECODE="1")
    env.pop(isa_mod.ENV_CAP, None)
    files = ["tests/test_gemm.py", "tests/test_zero_volume.py", "tests/test_dump_asm_conv.py",
             "tests/test_docstrings.py", "tests/test_readme.py", "tests/test_bench.py"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *files],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "no kernel can run here" in out and "(needed by the avx2 path)" in out, out[-3000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) >= 50, out[-3000:]


def test_a_cpu_without_avx2_names_bad_arguments_and_runs_what_needs_no_kernel(monkeypatch):
    """Where no path runs, a descriptor still plans (on ``avx2``) and checks every
    argument first, so bad input gets the error that names it, as on any CPU; what
    needs no kernel works, as oneDNN's reference code would take it (a zero-volume
    problem; a reorder, through its numpy model, bit for bit); the rest raise
    ``NoIsaPathError`` at creation, before any kernel is made."""
    import numpy as np

    from primitives.attr import Attr
    from primitives.conv import ConvolutionDesc
    from primitives.conv_depthwise import DepthwiseConvDesc
    from primitives.gemm import Gemm
    from primitives.matmul import MatmulDesc
    from primitives.memory import desc
    from primitives.pooling import PoolingDesc
    from primitives.reorder import ReorderDesc, quantize
    from primitives.reorder_ref import reorder_ref
    from runtime import cpu
    from tests.conftest import cpu_without_avx2

    monkeypatch.setattr(cpu, "_cached", cpu_without_avx2("synthetic SSE4.2"))
    assert isa_mod.supported() == ()

    def conv(n=1, attr=None):
        return ConvolutionDesc(desc((n, 8, 5, 5), "u8", "nhwc"), desc((16, 8, 3, 3), "s8", "any"),
                               desc((n, 16, 3, 3), "u8", "nhwc"), attr=attr)

    # bad arguments: the error that names them
    with pytest.raises(ValueError, match="^attr scales:weights: convolution supports masks"):
        conv(attr=Attr(scales={"weights": 4}))
    with pytest.raises(TypeError, match="^B: "):
        Gemm(4, 4, 4, B=np.zeros((4, 4), np.uint8))
    with pytest.raises(ValueError, match="^bias: "):
        MatmulDesc(desc((4, 8), "u8", "ab"), desc((8, 4), "s8", "ab"), desc((4, 4), "u8", "ab"),
                   desc((5,), "f32", "a"))
    # zero volume: no kernel, so it runs
    c = np.full((0, 4), 7, np.int32)
    Gemm(0, 4, 4, B=np.ones((4, 4), np.int8)).execute(np.zeros((0, 4), np.uint8), c)
    empty = conv(n=0)
    assert empty.impl_info()["impl"] == "zero_volume" and empty.impl_info()["isa"] == "any"
    empty.create().execute({"src": np.zeros((0, 5, 5, 8), np.uint8), "weights": np.zeros((16, 8, 3, 3), np.int8),
                            "dst": np.zeros((0, 3, 3, 16), np.uint8)})
    assert PoolingDesc("max", desc((0, 8, 4, 4), "u8", "nhwc"), desc((0, 8, 2, 2), "u8", "nhwc"), (2, 2), (2, 2),
                       (0, 0), (0, 0)).impl_info()["impl"] == "zero_volume"
    # a reorder: the numpy model, the same bits
    x = np.random.default_rng(3).normal(0, 40, (3, 37)).astype(np.float32)
    pd = ReorderDesc(desc(x.shape, "f32", "ab"), desc(x.shape, "u8", "ab"), Attr(scales={"dst": 0}))
    info = pd.impl_info()
    assert info["impl"] == "numpy:convert" and "lacks AVX2" in info["reason"] and info["isa"] == "any"
    got = quantize(x, 0.5, zero_point=100)
    assert np.array_equal(got, reorder_ref(x, "f32", "u8", dst_scale=np.float32([0.5]), dst_zp=np.int32([100])))
    # anything that needs a kernel: refused at creation
    for make in (conv, lambda: Gemm(4, 4, 4), lambda: Gemm(4, 4, 0),
                 lambda: MatmulDesc(desc((4, 8), "u8", "ab"), desc((8, 4), "s8", "any"), desc((4, 4), "u8", "ab")),
                 lambda: PoolingDesc("max", desc((1, 8, 4, 4), "u8", "nhwc"), desc((1, 8, 2, 2), "u8", "nhwc"),
                                     (2, 2), (2, 2), (0, 0), (0, 0)),
                 lambda: DepthwiseConvDesc(desc((1, 8, 5, 5), "u8", "nhwc"), desc((8, 1, 1, 3, 3), "s8", "any"),
                                           desc((1, 8, 3, 3), "u8", "nhwc"))):
        with pytest.raises(isa_mod.NoIsaPathError) as caught:
            make()
        # (outside the with: conftest would skip a failure met while handling the error)
        assert "needs AVX2, FMA, BMI2" in str(caught.value)
