"""Kernels are made when a primitive is created: its first execution only looks up the
kernels its creation made (the brief: blocking choice and code generation at creation,
Python off the hot path). Before, a matmul or inner product whose shape wanted a B
prefetch generated that variant of its kernel at the first call (19-27 ms), and a padded
convolution its row copy.

The benchmark's own set-ups are used (``tools.bench_sides``): the shapes a user
meets, on every ISA path this CPU runs, one thread (a second thread's pool is the
process's, made once at its first parallel call). The benchmark's weights are full
range, so on paths without VNNI the exact policy runs the widening kernel: creation,
which has not seen the weights, makes both kernels they could take. Before, the
widening one was made at the first call (res2 3x3 on a Zen 3: 46 ms). Likewise the
kernel that packs runtime weights (given at every call) is made at creation: it was
made at the first call.

Nor does a creation or a first execution parse C: cffi parses a declaration or a type
string with pycparser the first time a process meets it (0.15-1 ms each), and the
argument structs, call arrays and pointer casts are declared at import
(``runtime.ffi.declare``). Before, BERT-128's 768->768 inner product parsed four types at
its first call (2.2 of its 4.3 ms) and the re-pointing struct at its creation.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jit import cache
from tests.conftest import isa_params, needs_a_path
from tools import bench_problems as bp
from tools.bench_sides import int8jit_setup


def _gemm(label, M, N, K, prim="ip"):
    return {"label": label, "M": M, "N": N, "K": K, "prim": prim}


def _layer(label, N=1):
    return dict(next(c for c in bp.CONV_LAYERS if c["label"] == label), N=N, prim="conv")


def _pool(label):
    return dict(next(c for c in bp.POOL_CASES if c["label"] == label), prim="pool")


CASES = [
    _gemm("BERT-128 768->768: prefetch of the next tile", 128, 768, 768),
    _gemm("fc at batch 1: B prefetched ahead", 1, 1000, 2048),
    _gemm("odd matmul: a tail block, K % 4", 67, 130, 75, prim="matmul"),
    dict(_gemm("runtime weights (ip, columns of K): their packing kernel", 32, 1000, 2048), runtime=True),
    dict(_gemm("runtime weights (matmul, rows of N)", 16, 96, 70, prim="matmul"), runtime=True),
    _layer("stem 7x7/2 3->64"),
    _layer("res2 3x3 64->64"),
    _layer("res3 proj 1x1/2 256->512"),
    _layer("mbv2 dw 3x3/2 96@112"),
    _pool("max 3x3/2 64x112x112 b1"),
    _pool("global avg 7x7 2048 b1"),
]


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("case", CASES, ids=[c["label"] for c in CASES])
def test_first_execution_generates_nothing(isa, case, monkeypatch):
    asked = []
    real = cache.get_kernel

    def recorded(key, generate):
        asked.append(key)
        return real(key, generate)
    monkeypatch.setattr(cache, "get_kernel", recorded)
    side = int8jit_setup(case, "fused", isa, 1)
    made = set(asked)
    assert made, "the creation made no kernel"
    asked.clear()
    side.call()
    side.call()
    assert set(asked) <= made, f"made at execution: {set(asked) - made}"


_FRESH_PROCESS = """
import importlib, json, pkgutil, sys
import cffi.cparser
for pkg in ("runtime", "jit", "primitives"):  # (the modules a user's program has imported)
    for mod in pkgutil.iter_modules([pkg]):
        importlib.import_module(pkg + "." + mod.name)
from runtime.isa import supported
from tools.bench_sides import int8jit_setup
supported()  # (the CPU probe: once a process, before its first creation, as oneDNN's engine)
parsed, real = [], cffi.cparser.Parser._parse

def counted(self, text):
    parsed.append(" ".join(text.split())[:80])
    return real(self, text)
cffi.cparser.Parser._parse = counted
out = {}
for case in json.loads(sys.argv[1]):
    del parsed[:]
    side = int8jit_setup(case, "fused", None, 1)
    made = list(parsed)
    side.call()
    side.call()
    out[case["label"]] = {"creation": made, "execution": parsed[len(made):]}
print(json.dumps(out))
"""


@needs_a_path
def test_creation_and_first_execution_parse_no_c(tmp_path):
    """In a fresh process (the types an earlier test parsed would hide a miss here) with
    the library imported, neither the creation of each set-up (its kernels from the disk
    cache, as a second process finds them) nor its first two executions, on this CPU's
    best path, makes cffi parse C: the argument structs, call arrays and pointer casts are
    declared at import. Before, the re-pointing struct's declaration was 1.3 of the 1.8 ms
    of an inner product's creation from the disk cache."""
    import cffi.cparser

    if not hasattr(cffi.cparser.Parser, "_parse"):
        pytest.skip("this cffi parses elsewhere")
    env = dict(os.environ, INT8JIT_CACHE_DIR=str(tmp_path), INT8JIT_DISK_CACHE="1")
    run = [sys.executable, "-c", _FRESH_PROCESS, json.dumps(CASES)]
    root = Path(__file__).resolve().parents[1]
    for _ in range(2):  # the first fills the disk cache (generating kernels parses their struct's offsets)
        proc = subprocess.run(run, capture_output=True, text=True, cwd=root, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert parsed == {case["label"]: {"creation": [], "execution": []} for case in CASES}


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("policy", ["exact", "faithful"])
def test_impl_info_names_every_kernel_made(isa, policy):
    """impl_info()["kernels"] names what creation made: under exact on a path without VNNI
    the VPMADDUBSW (with residual cells) and the widening kernel (the packed weights pick
    one), else one."""
    from primitives.attr import Attr
    from primitives.conv import ConvolutionDesc
    from primitives.matmul import MatmulDesc
    from primitives.memory import desc

    conv = ConvolutionDesc(desc((1, 16, 9, 9), "u8", "nhwc"), desc((32, 16, 3, 3), "s8", "any"),
                           desc((1, 32, 9, 9), "u8", "nhwc"), padding_l=(1, 1), padding_r=(1, 1),
                           attr=Attr(policy=policy), isa=isa)
    matmul = MatmulDesc(desc((8, 64), "u8", "ab"), desc((64, 32), "s8", "any"), desc((8, 32), "s32", "ab"),
                        attr=Attr(policy=policy), isa=isa)
    both = policy == "exact" and not isa.endswith("vnni")
    # (the VPMADDUBSW kernel also adds the residual cells of split weights)
    for pd in (conv, matmul):
        specs = [pd._kernel_for(c).meta["kspec"] for c in pd._choices]
        kinds = ["cells" if ks.residual else ks.path.kind for ks in specs]
        assert kinds == (["cells", "widen"] if both else [pd.fast.path.kind]), kinds
        assert pd.impl_info()["kernels"] == [ks.name for ks in specs]
        assert pd.impl_info()["kernel"] == pd.impl_info()["kernels"][0]
