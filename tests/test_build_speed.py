"""Cold kernel generation: the lean back end (jit.backend) and jit.asm's PeachPy speed-ups.

The lean path must produce what PeachPy's own pipeline produces, byte for byte: each
kernel below is generated both ways (``jit.build.reference_backend``) and the code,
constants, relocations and listing compared. Listings are compared after renaming
labels in order of definition and dropping object addresses, the two things PeachPy
itself does not make reproducible (it numbers unnamed labels in set order and prints
masked registers as ``<... object at 0x...>``).

The set is small so it runs in seconds: one tile per ISA path and step kind, with output
stages that use scales, bias, eltwise post-ops, sum, binary and every dst type, plus a
depthwise, a pooling, a reorder, an eltwise, the thread pool's two kernels, the in-place and
packing kernels. ``INT8JIT_WIDE_BACKEND_CHECK=1``
adds a wider corpus (226 kernels at the library's own tile sizes; ~5 minutes), worth a
run after PeachPy changes. The same corpus, generated before the lean path existed,
matched the lean path's bytes and listings.
"""
from __future__ import annotations

import copy
import functools
import os
import re
from dataclasses import replace

import pytest

from jit import asm, backend, build
from jit import (copy_kernel, depthwise_kernel, eltwise, gemm_kernel, gemv_kernel, pack_kernel, pool_kernel,
                 pooling_kernel, reorder_kernel)
from jit.dot import path_for
from jit.output import BinaryOp, EltwiseOp, OutputSpec, SumOp


@pytest.fixture(autouse=True)
def _listings():
    """The tests compare listings with PeachPy's: kernels generated here carry theirs."""
    with build.listings():
        yield


_FULL = OutputSpec(float_mode=True, scale="col", bias="row",
                   post_ops=(EltwiseOp("gelu_erf"), SumOp("s8"), BinaryOp("mul", "full")), dst_zp="col", dst_dt="s8")
_CONV = OutputSpec(float_mode=True, scale="common", bias="col",
                   post_ops=(EltwiseOp("logistic"), BinaryOp("add", "col")), dst_scale=True, dst_dt="u8")
_PLAIN = OutputSpec(row_comp=True, accumulate=True)
_F32 = OutputSpec(float_mode=True, scale="col", post_ops=(EltwiseOp("relu"), BinaryOp("max", "row")), dst_dt="f32")


def _gemm(isa: str, kind: str | None, output: OutputSpec, mr: int, conv: bool, s8_src: bool = True):
    spec = gemm_kernel.GemmKernelSpec(path_for(isa, kind), mr, 1, s8_src, output, positions=conv, outer=conv,
                                      unroll_k=2, prefetch_next=conv)
    return lambda: gemm_kernel.generate(spec)


KERNELS = {
    "gemm-avx2-maddubsw": _gemm("avx2", "maddubsw", _FULL, 2, conv=True),
    "gemm-avx2-widen": _gemm("avx2", "widen", _PLAIN, 1, conv=False),
    "gemm-avx2_vnni": _gemm("avx2_vnni", None, _CONV, 2, conv=True, s8_src=False),
    "gemm-avx512_core-maddubsw": _gemm("avx512_core", "maddubsw", _F32, 2, conv=False),
    "gemm-avx512_core-widen": _gemm("avx512_core", "widen", _CONV, 1, conv=True),
    "gemm-avx512_core_vnni": _gemm("avx512_core_vnni", None, _FULL, 2, conv=True),
    "depthwise-avx2": lambda: depthwise_kernel.generate(depthwise_kernel.DwKernelSpec("avx2", "s8", "s16", _CONV)),
    "pooling-avx512": lambda: pooling_kernel.generate(
        pooling_kernel.PoolKernelSpec("avx512_core", "avg_exclude_padding", "u8", "f32", kw=3, kh=3, s16_sums=True)),
    "copy-rows": copy_kernel.generate,
    "pool-worker": pool_kernel.generate_worker,
    "pool-fork-join": pool_kernel.generate_fork_join,
    "reorder-avx512": lambda: reorder_kernel.generate(
        reorder_kernel.ReorderKernelSpec("avx512_core", "f32", "u8", ("row", "none", "none", "col"))),
    "eltwise-avx2": lambda: eltwise.generate_chain(path_for("avx2"), (("gelu_erf",), ("tanh",), ("relu", 0.1))),
    "gemv-columns-avx512_core_vnni": lambda: gemv_kernel.generate(gemv_kernel.GemvSpec(
        path_for("avx512_core_vnni"), True, True, replace(_CONV, col_comp=False))),
    "gemv-columns-avx2-widen": lambda: gemv_kernel.generate(gemv_kernel.GemvSpec(
        path_for("avx2", "widen"), False, True, replace(_F32, col_comp=False))),
    "gemv-rows-avx512_core-maddubsw": lambda: gemv_kernel.generate(gemv_kernel.GemvSpec(
        path_for("avx512_core", "maddubsw"), True, True, replace(_F32, col_comp=False), "rows", 2)),
    "gemv-rows-avx2_vnni": lambda: gemv_kernel.generate(gemv_kernel.GemvSpec(
        path_for("avx2_vnni"), False, False, replace(_CONV, col_comp=False), "rows", 1)),
    "pack-widen-columns256": lambda: pack_kernel.generate(True, 256, True),
    "pack-vnni-rows256": lambda: pack_kernel.generate(False, 256),
    "pack-vnni-rows512": lambda: pack_kernel.generate(False, 512, False, True),
    "pack-vnni-columns512-madd": lambda: pack_kernel.generate(True, 512),
}


def _normalised_listing(listing: str) -> str:
    lines = re.sub(r" object at 0x[0-9a-f]+", " object", listing).splitlines()
    names: dict[str, str] = {}
    for line in lines:
        label = re.fullmatch(r"(\S+):", line)
        if label:
            names.setdefault(label.group(1), f"L{len(names)}")
    if not names:
        return "\n".join(lines)
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")\b")
    return "\n".join(pattern.sub(lambda m: names[m.group(1)], line) for line in lines)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_lean_backend_matches_peachpy(kernel):
    lean = KERNELS[kernel]()
    with build.reference_backend():
        reference = KERNELS[kernel]()
    assert lean.code == reference.code
    assert lean.const == reference.const
    assert lean.relocations == reference.relocations
    assert _normalised_listing(lean.listing) == _normalised_listing(reference.listing)


def _refuse(*_):
    raise AssertionError("the function went through PeachPy's own pipeline")


@functools.lru_cache(maxsize=None)
def _wide_corpus() -> dict:
    """Kernels at the library's own tile sizes: GEMM and convolution tiles on every path with
    several output stages and both source types, and the other templates' variants."""
    from jit.dot import paths

    def outputs(dst: str) -> list:
        return [
            OutputSpec(),
            OutputSpec(row_comp=True, accumulate=True),
            OutputSpec(float_mode=True, scale="col", bias="col", post_ops=(EltwiseOp("relu"),), dst_dt=dst),
            OutputSpec(float_mode=True, scale="common", bias="row", dst_scale=True, dst_zp="col", dst_dt=dst,
                       post_ops=(EltwiseOp("gelu_erf"), SumOp(dst), BinaryOp("mul", "col"))),
            OutputSpec(float_mode=True, scale="col", dst_zp="common", dst_dt=dst,
                       post_ops=(EltwiseOp("logistic"), BinaryOp("add", "full"), BinaryOp("max", "row"),
                                 BinaryOp("sub", "common"))),
        ]

    corpus = {}
    for isa in ("avx2", "avx2_vnni", "avx512_core", "avx512_core_vnni"):
        for path in paths(isa):
            nr = 3 if path.bits == 512 else 2
            for j, output in enumerate(outputs("u8") + outputs("s8")[2:3] + outputs("f32")[3:4]):
                for s8_src in (False, True):
                    for conv in (False, True):
                        if (j + s8_src + conv) % 2 and j not in (2, 3):
                            continue
                        try:
                            spec = gemm_kernel.choose_tile(path, s8_src, output, nr, positions=conv, outer=conv,
                                                           prefetch_next=conv)
                        except ValueError:
                            continue
                        corpus[f"gemm {spec!r}"] = lambda spec=spec: gemm_kernel.generate(spec)
        for src in ("u8", "s8"):
            for zp in ("none", "s16", "s32"):
                for output in (outputs("u8")[2], OutputSpec(float_mode=True, scale="common", dst_dt="f32")):
                    spec = depthwise_kernel.DwKernelSpec(isa, src, zp, output)
                    corpus[f"dw {spec!r}"] = lambda spec=spec: depthwise_kernel.generate(spec)
        for alg in pooling_kernel.ALGS:
            for kw, kh in ((0, 0), (3, 3), (2, 0)):
                for dst in ("u8",) if alg == "max" else ("u8", "f32"):
                    for s16 in (False, True) if alg != "max" and isa.startswith("avx512") else (False,):
                        spec = pooling_kernel.PoolKernelSpec(isa, alg, "u8", dst, kw, kh, s16)
                        corpus[f"pool {spec!r}"] = lambda spec=spec: pooling_kernel.generate(spec)
    for isa in ("avx2", "avx512_core"):
        for src, dst, modes in (("f32", "u8", ("row", "none", "none", "col")),
                                ("s8", "f32", ("col", "row", "row", "none")),
                                ("u8", "s8", ("none",) * 4),
                                ("s32", "s32", ("none", "col", "col", "row"))):
            spec = reorder_kernel.ReorderKernelSpec(isa, src, dst, modes)
            corpus[f"reorder {spec!r}"] = lambda spec=spec: reorder_kernel.generate(spec)
        path = path_for(isa, "maddubsw")
        ops = (("gelu_erf",), ("logistic",), ("tanh",), ("relu", 0.1))
        corpus[f"eltwise {isa}"] = lambda path=path: eltwise.generate_chain(path, ops)
    return corpus


_WIDE = os.environ.get("INT8JIT_WIDE_BACKEND_CHECK", "") == "1"


@pytest.mark.skipif(not _WIDE, reason="the wide corpus runs with INT8JIT_WIDE_BACKEND_CHECK=1 (~5 minutes)")
@pytest.mark.parametrize("kernel", list(_wide_corpus()) if _WIDE else ["wide corpus"])
def test_wide_corpus_matches_peachpy(kernel):
    make = _wide_corpus()[kernel]
    lean = make()
    with build.reference_backend():
        reference = make()
    assert (lean.code, lean.const, lean.relocations) == (reference.code, reference.const, reference.relocations)
    assert _normalised_listing(lean.listing) == _normalised_listing(reference.listing)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_kernels_take_the_lean_path(kernel, monkeypatch):
    monkeypatch.setattr(backend, "assemble_reference", _refuse)
    assert KERNELS[kernel]().code


def _function(emit, arguments=()):
    """GeneratedCode of a small avx512_core function ``emit`` writes."""
    return build.generate("f", "avx512_core", "void (*)(void)", arguments, emit)


def _both(emit, arguments=()):
    lean = _function(emit, arguments)
    with build.reference_backend():
        reference = _function(emit, arguments)
    return lean, reference


def _flow_shapes():
    """Control flow the SSE/AVX pass must treat as PeachPy does: VZEROUPPER before RETURN
    where AVX state reaches it, through branches, loops and several returns. ``loop_back``
    shows PeachPy's walk following each edge once: the RETURN, first reached before the
    loop body ran, gets no VZEROUPPER though AVX state can reach it."""
    A = asm

    def straight():
        A.VPADDD(A.ymm0, A.ymm1, A.ymm2)
        A.RETURN()

    def zeroed():
        A.VPADDD(A.ymm0, A.ymm1, A.ymm2)
        A.VZEROUPPER()
        A.RETURN()

    def gpr_only():
        A.MOV(A.rax, 1)
        A.RETURN()

    def two_returns():
        skip = A.Label()
        A.TEST(A.rdi, A.rdi)
        A.JZ(skip)
        A.VPXORD(A.zmm3, A.zmm3, A.zmm3)
        A.RETURN()
        A.LABEL(skip)
        A.ADD(A.rbx, 1)  # rbx: callee-saved, so a PUSH/POP pair
        A.RETURN()

    def loop_back():
        top, done = A.Label(), A.Label()
        A.LABEL(top)
        A.SUB(A.rdi, 1)
        A.JZ(done)
        A.VPADDD(A.zmm0, A.zmm0, A.zmm1)
        A.JMP(top)
        A.LABEL(done)
        A.RETURN()

    def far_branch():
        over = A.Label()
        A.CMP(A.rdi, 0)
        A.JE(over)
        for i in range(40):  # > 127 bytes: the branch needs rel32
            A.VPADDD(A.zmm0, A.zmm1, [A.rsi + 64 * i])
        A.LABEL(over)
        A.MOV(A.r12, A.rdi)
        A.RETURN()

    return {f.__name__: f for f in (straight, zeroed, gpr_only, two_returns, loop_back, far_branch)}


@pytest.mark.parametrize("shape", list(_flow_shapes()))
def test_control_flow_shapes_match_peachpy(shape, monkeypatch):
    argument = asm.Argument(asm.ptr(asm.uint8_t), "p")

    def emit():
        asm.LOAD.ARGUMENT(asm.rdi, argument)
        _flow_shapes()[shape]()

    with build.reference_backend():
        reference = _function(emit, (argument,))
    monkeypatch.setattr(backend, "assemble_reference", _refuse)
    lean = _function(emit, (argument,))
    assert lean.code == reference.code
    assert _normalised_listing(lean.listing) == _normalised_listing(reference.listing)


def test_virtual_registers_go_through_peachpy(monkeypatch):
    used = []
    original = backend.assemble_reference
    monkeypatch.setattr(backend, "assemble_reference", lambda *a, **k: used.append(1) or original(*a, **k))

    def emit():
        value = asm.GeneralPurposeRegister64()
        asm.MOV(value, 7)
        asm.ADD(value, value)
        asm.RETURN()

    lean, reference = _both(emit)
    assert used == [1, 1] and lean.code == reference.code


def test_code_running_off_the_end_is_an_error():
    with pytest.raises(ValueError, match="run past the last instruction"):
        _function(lambda: asm.MOV(asm.rax, 1))


def _labels(Label) -> list:  # noqa: N803 - the pre-name is read from the text "x = Label()"
    """Labels made the ways templates make them, by ``Label``."""
    skip = Label()
    first, second = Label(), Label()
    holder = type("Holder", (), {})()
    holder.done = Label()
    loop = Label() if skip else None
    return [skip, first, second, holder.done, loop, Label("named")]


def test_label_pre_names_are_peachpys():
    from peachpy.x86_64.pseudo import Label as PeachPyLabel

    ours, theirs = _labels(asm.Label), _labels(PeachPyLabel)
    assert [(n.name, n.prename) for label in ours for n in label.name] == \
        [(n.name, n.prename) for label in theirs for n in label.name] == \
        [(None, "skip"), (None, None), (None, None), (None, "done"), (None, "loop"), ("named", None)]


def _same_structure(a, b, seen=None) -> bool:
    """Equal attribute trees, with no object shared between them (a deep copy)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (int, str, float, type(None))):
        return a == b
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same_structure(x, y) for x, y in zip(a, b))
    return a is not b and vars(a).keys() == vars(b).keys() and \
        all(_same_structure(vars(a)[k], vars(b)[k]) for k in vars(a))


@pytest.mark.parametrize("operand", ["register", "masked", "memory", "masked_memory", "constant"])
def test_operand_copies_are_deep_and_equal(operand):
    from jit.dot import vector_constant

    value = {
        "register": lambda: asm.zmm7,
        "masked": lambda: asm.zmm1(asm.k2.z),
        "memory": lambda: asm.dword[asm.rax + asm.rbx * 4 + 8],
        "masked_memory": lambda: asm.zword[asm.r9 + 64](asm.k3),
        "constant": lambda: vector_constant(path_for("avx2"), [1, 2, 3, 4, 5, 6, 7, 8], "c"),
    }[operand]()
    assert _same_structure(copy.deepcopy(value), value)
    shallow = copy.copy(value)
    assert shallow is not value and vars(shallow) == vars(value)


def test_targets_equal_peachpys_step_by_step_construction():
    """jit.isa_targets builds each target in one step; adding its extensions one at a
    time, as PeachPy's own ``uarch.default + isa.avx + ...`` does, gives the same set."""
    from jit.isa_targets import extensions_for, target_for
    from runtime.isa import LADDER

    for isa in LADDER:
        stepwise = asm.uarch.default
        for extension in extensions_for(isa):
            stepwise = stepwise + extension
        assert {e.name for e in target_for(isa).extensions} == {e.name for e in stepwise.extensions}, isa
        assert target_for(isa).name == stepwise.name
