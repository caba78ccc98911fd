"""dump-asm conv: the kernel a convolution layer gets, on every ISA (generated where the CPU lacks it)."""
from __future__ import annotations

import io

import pytest

from runtime.isa import LADDER
from tools.dump_asm import UsageError, run

STEP = {"avx512_core_vnni": "vpdpbusd zmm", "avx2_vnni": "vpdpbusd ymm", "avx512_core": "vpmaddubsw zmm",
        "avx2": "vpmaddubsw ymm"}


@pytest.mark.parametrize("isa", LADDER)
def test_conv_kernel_listing(isa):
    out = io.StringIO()
    assert run(["conv", "--ic", "16", "--oc", "24", "--hw", "9", "--window", "3", "--pad", "1", "--fused",
                "--policy", "faithful", "--isa", isa], out) == 0
    text = out.getvalue().lower()
    assert "brgemm_u8s8u8" in text
    assert STEP[isa] in text
    # the u8 store of the output pipeline (after relu VPMOVUSDB saturates; AVX2 packs)
    assert "vpmovusdb" in text if isa.startswith("avx512") else "vpackuswb" in text


@pytest.mark.parametrize("isa", ["avx2", "avx512_core", "avx512_core_vnni"])
def test_conv_exact_lists_every_kernel_the_weights_can_take(isa):
    """Under exact without VNNI the weights, when packed, pick VPMADDUBSW (every pair
    proven safe, or the unsafe ones split into residual cells: the ``cells`` kernel) or
    the widening kernel: both are made at creation and both are listed; with VNNI there
    is one."""
    out = io.StringIO()
    assert run(["conv", "--ic", "16", "--oc", "32", "--hw", "9", "--window", "3", "--pad", "1", "--fused",
                "--isa", isa], out) == 0
    names = [line.split()[1] for line in out.getvalue().splitlines() if line.startswith("; brgemm_")]
    steps = ["_vnni_"] if isa.endswith("vnni") else ["_maddubsw_cells_", "_widen_"]  # (GemmKernelSpec.name)
    assert len(names) == len(steps) and all(step in name for step, name in zip(steps, names)), names


@pytest.mark.parametrize("isa", LADDER)
def test_depthwise_layer_listing(isa):
    """The depthwise kernel on every path, generated where the CPU lacks it: u8 on
    avx512_core_vnni multiplies by VPDPBUSD; the others widen to s16 pairs, multiplied
    by VPDPWSSD where VNNI has it, by VPMADDWD where not."""
    out = io.StringIO()
    assert run(["conv", "--ic", "32", "--oc", "32", "--groups", "32", "--hw", "14", "--window", "3", "--pad", "1",
                "--isa", isa], out) == 0
    text = out.getvalue().lower()
    assert "; dw_u8s8" in text and f"_{isa}_" in text and "impl: depthwise:" in text
    register = "zmm" if isa.startswith("avx512") else "ymm"
    step = {"avx2": "vpmaddwd", "avx512_core": "vpmaddwd", "avx2_vnni": "vpdpwssd", "avx512_core_vnni": "vpdpbusd"}
    assert f"{step[isa]} {register}" in text


def test_conv_usage_errors():
    with pytest.raises(UsageError, match="--ic"):
        run(["conv", "--oc", "8", "--hw", "8"], io.StringIO())
    with pytest.raises(UsageError, match="--groups"):
        run(["conv", "--ic", "6", "--oc", "8", "--hw", "8", "--groups", "4"], io.StringIO())
    with pytest.raises(UsageError, match="--window"):
        run(["conv", "--ic", "8", "--oc", "8", "--hw", "2", "--window", "5"], io.StringIO())


@pytest.mark.parametrize("isa", LADDER)
def test_pool_kernel_listing(isa):
    """dump-asm pool: average windows of 7x7 sum in s16 lanes on AVX-512, in s32 on AVX2."""
    out = io.StringIO()
    assert run(["pool", "--alg", "avg_exclude_padding", "--window", "7", "--isa", isa], out) == 0
    text = out.getvalue().lower()
    assert "pool_avg_exclude_padding_u8u8" in text
    assert ("vpmovzxbw zmm" in text and "vpaddw" in text) if isa.startswith("avx512") else "vpmovzxbd ymm" in text
    out = io.StringIO()
    assert run(["pool", "--window", "3", "--a-type", "s8", "--isa", isa], out) == 0
    assert "vpmaxsb" in out.getvalue().lower()
    # --depth: the 3-D kernel, its depth loop counted in r15 (the 2-D kernel uses no r15)
    out = io.StringIO()
    assert run(["pool", "--window", "3", "--depth", "2", "--isa", isa], out) == 0
    text = out.getvalue()
    assert "pool_max_u8u8_3d_kh3_kw3" in text and "2x3x3" in text and "dec r15" in text.lower()
    out = io.StringIO()
    assert run(["pool", "--window", "3", "--isa", isa], out) == 0
    assert "r15" not in out.getvalue().lower()
    with pytest.raises(UsageError, match="--depth"):
        run(["pool", "--depth", "-1"], io.StringIO())


def test_pack_kernels_listing():
    """dump-asm pack: every packing kernel, the 512-bit ones generated on any CPU."""
    out = io.StringIO()
    assert run(["pack"], out) == 0
    text = out.getvalue()
    names = [f"; pack_b_{layout}_{source}{bits}{sums} [{isa}]" for source in ("rows", "columns")
             for layout, bits, sums, isa in (("vnni", 256, "", "avx2"), ("widen", 256, "", "avx2"),
                                             ("vnni", 512, "", "avx512_core_vnni"), ("vnni", 512, "_madd", "avx512_core"),
                                             ("widen", 512, "", "avx512_core"))]
    names += [name.replace(" [", "_nt [") for name in names if "512" in name]  # (streaming stores)
    names.append("; column_term [avx2]")
    assert all(name in text for name in names), [name for name in names if name not in text]
    lower = text.lower()
    assert all(op in lower for op in ("vpermd zmm", "vpermd ymm", "vmovdqu8 zmm", "vpmaskmovd ymm", "vpdpbusd zmm",
                                      "vpmaddubsw zmm", "vpmovsxbw ymm", "vshufi64x2 zmm", "vperm2i128 ymm",
                                      "vpermi2d zmm", "vpermt2d zmm", "vmovntdq [", "sfence"))
    # Only the _nt kernels stream, and each ends its stores with an SFENCE.
    for block in text.split("\n; ")[1:]:
        streaming = block.split(" ", 1)[0].endswith("_nt")
        assert ("vmovntdq" in block.lower()) == streaming == ("sfence" in block.lower()), block.split("\n", 1)[0]


def test_copy_kernel_listing():
    out = io.StringIO()
    assert run(["copy"], out) == 0
    assert "copy_rows" in out.getvalue() and "vmovdqu ymm" in out.getvalue().lower()
