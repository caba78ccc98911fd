"""Creation-time speed-ups: shared instructions (jit.asm), fast addresses, the collector pause
(jit.build). Their bytes are checked against PeachPy's own pipeline in test_build_speed.py;
these tests pin the mechanisms themselves."""
from __future__ import annotations

import copy
import gc
import os
import re

import pytest

from jit import asm, backend, build


@pytest.fixture(autouse=True)
def _listings():
    """The tests compare listings with PeachPy's: kernels generated here carry theirs."""
    with build.listings():
        yield


def _function(emit, arguments=(), isa="avx512_core"):
    return build.generate("f", isa, "void (*)(void)", arguments, emit)


def _capture(monkeypatch):
    """The instruction list each lean assembly sees."""
    seen = []
    original = backend._encode

    def encode(instructions, abi, listing=True):
        seen.append(list(instructions))
        return original(instructions, abi, listing)

    monkeypatch.setattr(backend, "_encode", encode)
    return seen


def test_classes_stay_peachpys():
    import peachpy.x86_64 as px

    from jit import vnni

    assert asm.MOV is px.MOV and asm.VPADDD is px.VPADDD and asm.VPDPBUSD is vnni.VPDPBUSD
    assert isinstance(asm.MOV, type)


def test_equal_instructions_are_one_object_in_a_kernel_function(monkeypatch):
    seen = _capture(monkeypatch)
    made = []

    def emit():
        made.append(asm.VPADDD(asm.zmm1, asm.zmm2, asm.zmm3))
        made.append(asm.VPADDD(asm.zmm1, asm.zmm2, asm.zmm3))
        made.append(asm.VPADDD(asm.zmm1, asm.zmm2, asm.zmm4))  # another operand: another object
        made.append(asm.MOV(asm.rax, [asm.rdi + 8]))
        made.append(asm.MOV(asm.rax, [asm.rdi + 8]))
        made.append(asm.MOV(asm.rax, asm.qword[asm.rdi + 8]))  # another operand form
        made.append(asm.VPDPBUSD(asm.zmm0, asm.zmm1, asm.zmm2, vex=False))
        made.append(asm.VPDPBUSD(asm.zmm0, asm.zmm1, asm.zmm2, vex=False))
        asm.RETURN()

    _function(emit, isa="avx512_core_vnni")
    a, b, c, d, e, f, g, h = made
    assert a is b and a is not c and d is e and d is not f and g is h
    instructions = seen[0]
    assert sum(i is a for i in instructions) == 2 and sum(i is d for i in instructions) == 2


def test_instructions_are_not_shared_outside_kernel_functions():
    made = []

    def emit():
        made.append(asm.VPADDD(asm.zmm1, asm.zmm2, asm.zmm3))
        made.append(asm.VPADDD(asm.zmm1, asm.zmm2, asm.zmm3))
        asm.RETURN()

    with build.reference_backend():  # PeachPy's own Function
        _function(emit)
    assert made[0] is not made[1]
    assert asm.VPADDD(asm.zmm1, asm.zmm2, asm.zmm3) is not asm.VPADDD(asm.zmm1, asm.zmm2, asm.zmm3)


def test_shared_instructions_are_reused_across_kernels_with_the_same_bytes():
    made = []

    def emit():
        made.append(asm.VPMADDWD(asm.zmm5, asm.zmm6, [asm.rsi + asm.rcx * 4 + 64]))
        asm.RETURN()

    first = _function(emit)
    second = _function(emit)
    assert made[0] is made[1]
    assert first.code == second.code and first.listing == second.listing


def test_operands_without_a_key_are_not_shared():
    from peachpy.x86_64.operand import RIPRelativeOffset

    made = []

    def emit():
        for _ in range(2):
            made.append(asm.MOV(asm.rax, 1 == 1))  # a bool immediate has no key
        for _ in range(2):
            made.append(asm.VPADDD(asm.zmm1, asm.zmm1, asm.zword[RIPRelativeOffset(64)]))  # rip-relative: no key
        asm.RETURN()

    _function(emit)
    assert made[0] is not made[1] and made[2] is not made[3]


def test_copies_of_a_shared_instruction_are_new_objects():
    made = []

    def emit():
        made.append(asm.VPADDD(asm.zmm1, asm.zmm2, asm.zmm3))
        made.append(copy.deepcopy(made[0]))  # copy calls cls.__new__(cls): no sharing
        made.append(copy.copy(made[0]))
        asm.RETURN()

    _function(emit)
    shared, deep, shallow = made
    assert deep is not shared and shallow is not shared
    assert str(deep) == str(shared) == str(shallow)


def test_fallback_to_peachpy_unshares(monkeypatch):
    """A kernel function PeachPy's pipeline must finish (a virtual register) gets its own
    copy of each shared instruction, and its bytes are PeachPy's."""
    used = []
    original = backend.assemble_reference
    monkeypatch.setattr(backend, "assemble_reference", lambda f, abi, listing=True: used.append(list(f._instructions))
                        or original(f, abi, listing))
    made = []

    def emit():
        value = asm.GeneralPurposeRegister64()
        for _ in range(3):
            made.append(asm.ADD(asm.rax, [asm.rdi + 16]))
        asm.MOV(value, asm.rax)
        asm.ADD(value, value)
        asm.MOV([asm.rdi], value)
        asm.RETURN()

    lean = _function(emit)
    with build.reference_backend():
        reference = _function(emit)
    assert lean.code == reference.code
    listed = used[0]
    adds = [i for i in listed if str(i) == "ADD rax, [rdi + 16]"]
    assert len(adds) == 3 and len({id(i) for i in adds}) == 3 and not any(i is made[0] for i in adds)
    assert not any(getattr(i, "_int8jit_shared", False) for i in listed)


def test_instructions_with_constants_are_shared_within_their_function(monkeypatch):
    from jit.dot import path_for, vector_constant

    path = path_for("avx512_core")
    made = []

    def emit():
        for value in (1, 1, 2, 1):  # new Constant objects; equal values share
            made.append(asm.VPADDD(asm.zmm1, asm.zmm1, vector_constant(path, [value], "c")))
        asm.RETURN()

    lean = _function(emit)
    with build.reference_backend():
        reference = _function(emit)
    a, b, c, d = made[:4]
    assert a is b is d and a is not c
    assert made[4] is not a  # the next function builds its own
    assert (lean.code, lean.const, lean.relocations) == (reference.code, reference.const, reference.relocations)
    assert len(lean.const) == 2 * 64 and [r.target for r in lean.relocations] == [0, 0, 64, 0]


def test_fallback_keeps_constants_named(monkeypatch):
    from jit.dot import path_for, vector_constant

    path = path_for("avx512_core")

    def emit():
        value = asm.GeneralPurposeRegister64()
        for v in (3, 3, 4):
            asm.VPADDD(asm.zmm1, asm.zmm1, vector_constant(path, [v], "c"))
        asm.MOV(value, asm.rax)
        asm.MOV([asm.rdi], value)
        asm.RETURN()

    lean = _function(emit)
    with build.reference_backend():
        reference = _function(emit)
    assert (lean.code, lean.const, lean.relocations) == (reference.code, reference.const, reference.relocations)


@pytest.mark.parametrize("make", [
    lambda: asm.rdi + 8, lambda: asm.rdi + 0, lambda: asm.rdi - 8, lambda: asm.rdi + (-2**31),
    lambda: asm.rdi + (2**31 - 1), lambda: asm.rcx * 4, lambda: asm.rcx * 1 + 12, lambda: asm.rbx + asm.rbp * 2,
    lambda: asm.rbx + asm.rbp * 8 + 64, lambda: asm.rbx + (asm.rbp * 2 + 16),
    lambda: asm.rsi + asm.zmm3 * 4, lambda: (asm.rdi + 8) + 8, lambda: (asm.rdi + 8) + asm.rcx * 2,
])
def test_fast_addresses_equal_peachpys(make):
    from peachpy.x86_64 import operand, registers

    fast = make()
    mended = (operand.MemoryAddress.__init__, operand.MemoryAddress.__add__,
              registers.GeneralPurposeRegister64.__add__, registers.GeneralPurposeRegister64.__mul__)
    originals = [f.__closure__ for f in mended]
    assert all(getattr(f, "_int8jit_mended", False) for f in mended) and all(originals)
    try:
        # PeachPy's own methods, found in the closures of the replacements
        operand.MemoryAddress.__init__ = _closed_over(mended[0], "init")
        operand.MemoryAddress.__add__ = _closed_over(mended[1], "add")
        registers.GeneralPurposeRegister64.__add__ = _closed_over(mended[2], "reg_add")
        registers.GeneralPurposeRegister64.__mul__ = _closed_over(mended[3], "reg_mul")
        slow = make()
    finally:
        (operand.MemoryAddress.__init__, operand.MemoryAddress.__add__,
         registers.GeneralPurposeRegister64.__add__, registers.GeneralPurposeRegister64.__mul__) = mended
    assert type(fast) is type(slow) and vars(fast) == vars(slow)
    assert str(fast) == str(slow)


@pytest.mark.parametrize("bad", [
    lambda: asm.rdi + 2**31, lambda: asm.rdi + 1.5, lambda: asm.rcx * 3, lambda: asm.rcx * 2.0,
    lambda: (asm.rdi + 2**31 - 8) + 8, lambda: asm.rbx + (asm.rcx + 4), lambda: asm.rbx + asm.ecx,
    lambda: asm.rbx + asm.rcx,
])
def test_fast_addresses_keep_peachpys_errors(bad):
    with pytest.raises((TypeError, ValueError)):
        bad()


@pytest.mark.parametrize("make", [
    lambda: asm.dword[asm.rdi + 8], lambda: asm.oword[asm.rdi], lambda: asm.zword[asm.rsi + asm.rcx * 2 + 64],
    lambda: asm.oword[asm.rdi + 16](asm.k1), lambda: asm.zword[asm.rbx](asm.k2.z), lambda: asm.qword[asm.rdi + 0],
])
def test_fast_memory_operands_equal_peachpys(make):
    from peachpy.x86_64 import operand

    mended = operand.MemoryOperand.__init__
    assert getattr(mended, "_int8jit_mended", False)
    fast = make()
    try:
        operand.MemoryOperand.__init__ = _closed_over(mended, "init")
        slow = make()
    finally:
        operand.MemoryOperand.__init__ = mended
    assert type(fast) is type(slow) and vars(fast).keys() == vars(slow).keys()
    assert str(fast) == str(slow) and fast.size == slow.size and fast.symbol is slow.symbol
    assert vars(fast.address) == vars(slow.address)
    if slow.mask is None:
        assert fast.mask is None
    else:
        assert type(fast.mask) is type(slow.mask) and vars(fast.mask) == vars(slow.mask)


@pytest.mark.parametrize("bad", [lambda: asm.dword[asm.ecx], lambda: asm.operand.MemoryOperand(asm.rdi, size=3)])
def test_fast_memory_operands_keep_peachpys_errors(bad):
    with pytest.raises((AssertionError, TypeError, ValueError)):
        bad()


def _closed_over(function, name):
    cells = dict(zip(function.__code__.co_freevars, function.__closure__))
    return cells[name].cell_contents


def test_collector_is_paused_during_generation_and_restored():
    states = []

    def emit():
        states.append(gc.isenabled())
        asm.RETURN()

    assert gc.isenabled()
    _function(emit)
    assert states == [False] and gc.isenabled()


def test_collector_comes_back_after_an_error():
    def emit():
        raise RuntimeError("template bug")

    with pytest.raises(RuntimeError, match="template bug"):
        _function(emit)
    assert gc.isenabled()


def test_collector_stays_off_when_the_program_turned_it_off():
    gc.disable()
    try:
        _function(lambda: asm.RETURN())
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_nested_pauses_restore_once():
    with build._collector_paused():
        with build._collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


# -- the disk cache's digest of the sources ----------------------------------------------------
def _sources(folder, files: dict) -> None:
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def test_source_digest_is_stable_while_the_sources_are(tmp_path):
    from jit import cache

    src = tmp_path / "jit"
    _sources(src, {"a.py": "x = 1\n", "b.py": "y = 2\n"})
    digest = cache._source_stamp_digest(str(src))
    (src / "notes.txt").write_text("not a source")
    assert cache._source_stamp_digest(str(src)) == digest
    other = tmp_path / "copy"
    _sources(other, {"a.py": "x = 1\n", "b.py": "y = 2\n"})
    for name in ("a.py", "b.py"):  # same names, sizes and times, another folder
        st = os.stat(src / name)
        os.utime(other / name, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache._source_stamp_digest(str(other)) != digest


@pytest.mark.parametrize("change", ["edit", "touch", "add", "remove"])
def test_source_digest_follows_the_sources(tmp_path, change):
    from jit import cache

    src = tmp_path / "jit"
    _sources(src, {"a.py": "x = 1\n", "b.py": "y = 2\n"})
    before = cache._source_stamp_digest(str(src))
    if change == "edit":  # the same size: only the time tells
        (src / "a.py").write_text("x = 3\n")
        os.utime(src / "a.py", ns=(1, 10**18))
    elif change == "touch":  # unchanged text: generated once more, never stale
        os.utime(src / "b.py", ns=(1, 10**18))
    elif change == "add":
        (src / "c.py").write_text("z = 1\n")
    else:
        (src / "b.py").unlink()
    after = cache._source_stamp_digest(str(src))
    assert after != before


def test_source_digest_of_a_missing_folder_matches_nothing(tmp_path):
    from jit import cache

    folder = tmp_path / "jit"
    folder.mkdir()
    empty = cache._source_stamp_digest(str(folder))
    folder.rmdir()
    assert cache._source_stamp_digest(str(folder)) != empty
    assert cache._code_digest() == cache._DIGEST  # taken once, with the imports


# -- instruction forms -----------------------------------------------------------------------
def _form_variants():
    """Instructions whose forms turn on what jit.asm's form key must tell apart: register
    numbers 0, 1, 2-3, 4-15 and 16-31, 8-bit high registers, immediates (1 for shifts,
    ranges), memory sizes, broadcasts, masks (k0 or not, zeroing), VSIB-free addresses with
    and without base or index, constants; each after an instruction of the same class
    that would have served as its template under a coarser key."""
    from jit.dot import path_for, vector_constant

    A = asm
    path = path_for("avx512_core")
    return [
        lambda: A.ADD(A.eax, 5), lambda: A.ADD(A.ecx, 5), lambda: A.ADD(A.r9d, 5), lambda: A.ADD(A.rax, 5),
        lambda: A.ADD(A.rax, 300), lambda: A.ADD(A.rax, -1), lambda: A.ADD(A.al, 1), lambda: A.ADD(A.ah, 1),
        lambda: A.ADD(A.bl, 1), lambda: A.ADD(A.sil, 1), lambda: A.ADD(A.r10b, 1),
        lambda: A.SHL(A.rax, 1), lambda: A.SHL(A.rax, 2), lambda: A.SHL(A.rdx, A.cl), lambda: A.SHL(A.r11, 1),
        lambda: A.MOV(A.rax, 2**40), lambda: A.MOV(A.rcx, 2**40), lambda: A.MOV(A.rcx, 7), lambda: A.MOV(A.ecx, 7),
        lambda: A.MOV(A.eax, [A.rsi]), lambda: A.MOV(A.eax, [A.rsi + A.rcx * 4]), lambda: A.MOV(A.eax, [A.rcx * 4]),
        lambda: A.MOV(A.r12, [A.r13 + 8]), lambda: A.MOV([A.r14 + 8], A.r8), lambda: A.MOV(A.al, [A.rdi]),
        lambda: A.MOV(A.sil, [A.rdi]), lambda: A.LEA(A.rcx, [A.rdx + A.rdx * 2]),
        lambda: A.VPADDD(A.ymm1, A.ymm2, A.ymm3), lambda: A.VPADDD(A.ymm17, A.ymm2, A.ymm3),
        lambda: A.VPADDD(A.ymm1, A.ymm18, A.ymm3), lambda: A.VPADDD(A.ymm1, A.ymm2, A.ymm19),
        lambda: A.VPADDD(A.zmm1, A.zmm2, A.zmm3), lambda: A.VPADDD(A.zmm30, A.zmm2, A.zmm31),
        lambda: A.VPADDD(A.zmm1(A.k1), A.zmm2, A.zmm3), lambda: A.VPADDD(A.zmm1(A.k2.z), A.zmm2, A.zmm3),
        lambda: A.VPADDD(A.zmm1, A.zmm2, [A.rsi + 64]), lambda: A.VPADDD(A.zmm1, A.zmm2, A.zword[A.rsi + 64]),
        lambda: A.VPADDD(A.zmm1, A.zmm2, A.dword[A.rsi + 4]), lambda: A.VPADDD(A.xmm1, A.xmm2, A.xmm3),
        lambda: A.VPADDD(A.xmm16, A.xmm2, A.xmm3), lambda: A.VPADDD(A.ymm1, A.ymm2, [A.rsi]),
        lambda: A.VPADDD(A.zmm1, A.zmm1, vector_constant(path, [5], "five")),
        lambda: A.VPADDD(A.zmm2, A.zmm2, vector_constant(path, [6], "six")),
        lambda: A.VPBROADCASTD(A.zmm1, A.xmm1), lambda: A.VPBROADCASTD(A.zmm1, A.eax),
        lambda: A.VPBROADCASTD(A.zmm1, A.dword[A.rdx]), lambda: A.VPBROADCASTD(A.ymm1, A.xmm0),
        lambda: A.VMOVDQU32(A.zmm1, [A.rbx]), lambda: A.VMOVDQU32([A.rbx], A.zmm1),
        lambda: A.VMOVDQU32(A.zmm1(A.k3.z), [A.rbx]), lambda: A.VMOVDQU32(A.zword[A.rbx](A.k3), A.zmm1),
        lambda: A.VMOVUPS(A.zmm4(A.k1.z), [A.r8]), lambda: A.VMOVUPS(A.zword[A.r8](A.k2), A.zmm4),
        lambda: A.VPMOVDB(A.oword[A.rcx](A.k1), A.zmm3), lambda: A.VPMOVDB(A.xmm1, A.zmm3),
        lambda: A.VPCMPGTD(A.k1, A.zmm31, A.zmm2), lambda: A.VPCMPGTD(A.k2, A.zmm1, [A.rax]),
        lambda: A.KXNORW(A.k1, A.k1, A.k1), lambda: A.KXNORW(A.k5, A.k6, A.k7),
        lambda: A.VPDPBUSD(A.zmm0, A.zmm1, A.zmm2), lambda: A.VPDPBUSD(A.zmm20, A.zmm1, A.zmm2),
        lambda: A.VPDPBUSD(A.zmm0, A.zmm1, A.zword[A.rbx + 64]),
        lambda: A.VPDPBUSD(A.zmm0, A.zmm1, A.dword[A.rbx + 4], vex=False),
        lambda: A.VPDPBUSD(A.zmm0(A.k1), A.zmm1, A.zmm2), lambda: A.VPDPBUSD(A.ymm0, A.ymm1, A.ymm2, vex=True),
        lambda: A.VPDPBUSD(A.ymm3, A.ymm1, [A.rsi], vex=True), lambda: A.VPDPBUSD(A.ymm3, A.ymm1, A.ymm2),
        lambda: A.VPMADDUBSW(A.ymm1, A.ymm2, A.ymm3), lambda: A.VPMADDUBSW(A.zmm1, A.zmm2, A.zmm3),
        lambda: A.VPSHUFB(A.zmm1, A.zmm2, A.zmm3), lambda: A.VPMOVZXBW(A.zmm1, [A.rsi]),
        lambda: A.VCVTDQ2PS(A.zmm1, A.zmm1), lambda: A.VMULPS(A.zmm1, A.zmm1, A.zmm30),
        lambda: A.VMAXPS(A.ymm1, A.ymm1, A.ymm15), lambda: A.VMINPS(A.ymm1, A.ymm2, [A.rax + 32]),
        lambda: A.VMOVD(A.xmm1, A.eax), lambda: A.VMOVD(A.eax, A.xmm1), lambda: A.VMOVD(A.xmm17, A.eax),
        lambda: A.VEXTRACTI128(A.xmm1, A.ymm2, 1), lambda: A.VEXTRACTI128(A.xmm1, A.ymm2, 0),
        lambda: A.PREFETCHT1([A.rbx + A.rbp * 1 + 64]), lambda: A.PREFETCHT1([A.rbx]),
        lambda: A.VMASKMOVPS(A.ymm1, A.ymm2, [A.rdi]), lambda: A.VMASKMOVPS([A.rdi], A.ymm2, A.ymm1),
        lambda: A.VPBLENDVB(A.ymm1, A.ymm2, A.ymm3, A.ymm0), lambda: A.VPBLENDVB(A.ymm1, A.ymm2, A.ymm3, A.ymm4),
    ]


@pytest.mark.parametrize("isa", ["avx512_core_vnni", "avx2_vnni"])
def test_instruction_forms_match_peachpy(isa):
    """Each variant built as a copy of an earlier same-class instruction where jit.asm's form
    key allows it; the bytes and listing equal PeachPy's own in one function (templates
    from earlier variants), and a variant PeachPy refuses is refused the same way."""
    asm._forms.clear()
    variants = []
    for variant in _form_variants():
        refused = _refusal(variant, isa, reference=True)
        assert _refusal(variant, isa, reference=False) == refused
        if refused is None:
            variants.append(variant)
    assert len(variants) > (60 if isa == "avx512_core_vnni" else 35)

    def emit_all():
        for v in variants:
            v()
        asm.RETURN()

    asm._forms.clear()
    lean = _function(emit_all, isa=isa)
    with build.reference_backend():
        reference = _function(emit_all, isa=isa)
    assert (lean.code, lean.const, lean.relocations) == (reference.code, reference.const, reference.relocations)
    assert _no_addresses(lean.listing) == _no_addresses(reference.listing)


def _no_addresses(listing: str) -> str:
    return re.sub(r" object at 0x[0-9a-f]+", " object", listing)  # masked registers print their address


def _refusal(variant, isa: str, reference: bool):
    """The exception type building ``variant`` alone raises on ``isa``, or None."""
    def emit():
        variant()
        asm.RETURN()

    try:
        if reference:
            with build.reference_backend():
                _function(emit, isa=isa)
        else:
            _function(emit, isa=isa)
    except (ValueError, SyntaxError, TypeError) as exc:
        return type(exc)
    return None


def test_clones_are_built_without_peachpys_constructor(monkeypatch):
    import peachpy.x86_64 as px

    asm._forms.clear()
    asm._shared.clear()  # else an equal instruction an earlier test built is handed back
    calls = []
    wrapper = px.VPADDD.__init__
    cells = dict(zip(wrapper.__code__.co_freevars, wrapper.__closure__))
    original = cells["original_init"].cell_contents

    def counting(self, *args, **kwargs):
        calls.append(args)
        original(self, *args, **kwargs)

    monkeypatch.setattr(cells["original_init"], "cell_contents", counting)

    def emit():
        asm.VPADDD(asm.zmm4, asm.zmm5, asm.zmm6)
        asm.VPADDD(asm.zmm7, asm.zmm8, asm.zmm9)  # same form (registers 4-15): a copy
        asm.VPADDD(asm.zmm20, asm.zmm5, asm.zmm6)  # register 16-31: its own form
        asm.RETURN()

    lean = _function(emit)
    assert len(calls) == 2
    with build.reference_backend():
        reference = _function(emit)
    assert lean.code == reference.code
