"""Kernels are made when a primitive is created: its first execution only looks up the
kernels its creation made (the brief: blocking choice and code generation at creation,
Python off the hot path). Before, a matmul or inner product whose shape wanted a B
prefetch generated that variant of its kernel at the first call (19-27 ms), and a padded
convolution its row copy.

The benchmark's own set-ups are used (``tools.bench_primitives``): the shapes a user
meets, on every ISA path this CPU runs, one thread (a second thread's pool is the
process's, made once at its first parallel call). The exact policy's widening kernel,
on paths without VNNI, is made at the first call whose weights need it.
"""
from __future__ import annotations

import pytest

from jit import cache
from tests.conftest import isa_params
from tools import bench_primitives as bp


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
    side = bp.int8jit_setup(case, "fused", isa, 1)
    made = set(asked)
    assert made, "the creation made no kernel"
    asked.clear()
    side.call()
    side.call()
    later = set(asked) - made
    # The one exception: on a path without VNNI the exact policy takes the widening
    # kernel where the weights (known at the first call) could saturate VPMADDUBSW.
    assert all(key[0] == "gemm" and key[1].path.kind == "widen" for key in later), f"generated at execution: {later}"
