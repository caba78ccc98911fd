"""Turn a PeachPy function body into a :class:`runtime.kernel.Kernel`, through the cache.

A template supplies a *key* (everything that changes the code: ISA, types, tile shape,
policy, attribute structure; never M, N, K or strides) and an *emit* callable that
creates the PeachPy arguments and instructions. Generation runs once per key per
process, and once per key per library version on disk (see ``jit.cache``).
"""
from __future__ import annotations

import contextlib
import functools
import gc
import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from runtime.execmem import Relocation
from runtime.kernel import Kernel


@dataclass(frozen=True)
class GeneratedCode:
    """Everything needed to map a kernel again without PeachPy."""

    name: str
    isa: str
    signature: str
    code: bytes
    const: bytes
    relocations: tuple[Relocation, ...]
    listing: str  # "" unless generated inside listings()
    meta: dict = field(default_factory=dict)


def generate(
    name: str,
    isa: str,
    signature: str,
    arguments: Sequence,
    emit: Callable[[], None],
    meta: dict | None = None,
) -> GeneratedCode:
    """Run ``emit()`` inside a PeachPy ``Function`` targeting ``isa`` and encode it.

    ``jit.backend.assemble`` finishes the function: a lean path for code that names
    physical registers only (every kernel here), PeachPy's own pipeline otherwise.
    """
    with _collector_paused():
        assembled = _assemble(name, isa, tuple(arguments), emit)  # the function is freed on return
    return GeneratedCode(
        name=name,
        isa=isa,
        signature=signature,
        code=assembled.code,
        const=assembled.const,
        relocations=tuple(Relocation(*r) for r in assembled.relocations),
        listing=assembled.listing,
        meta=dict(meta or {}),
    )


def _assemble(name: str, isa: str, arguments: tuple, emit: Callable[[], None]):
    from jit import asm, backend

    if _reference_backend:
        function_type, assemble = asm.Function, backend.assemble_reference
    else:
        function_type, assemble = backend.KernelFunction, backend.assemble
    function = function_type(name, arguments, None, target=_target(isa))
    function.attach()  # what `with function:` does, with the exit left to `assemble`
    try:
        emit()
    except BaseException:
        function.detach()
        raise
    return assemble(function, asm.abi.system_v_x86_64_abi, listing=_listings_wanted)


_collector_lock = threading.Lock()
_collector_depth = 0
_collector_was_enabled = False


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a kernel is generated.

    Generation allocates tens of thousands of short-lived objects (PeachPy operands,
    instructions, encodings), which set off 5-20 young collections per kernel and, every
    few kernels, a collection of the whole process (40-50k objects once numpy and PeachPy
    are imported: ~15 ms), for objects that reference counting frees anyway. Paused, a
    generation costs the collector one young collection, on the first allocation after
    the outermost generation ends (even on an error) and its objects are gone; the
    collector is switched back on only if it was on.
    """
    global _collector_depth, _collector_was_enabled
    with _collector_lock:
        if _collector_depth == 0:
            _collector_was_enabled = gc.isenabled()
            gc.disable()
        _collector_depth += 1
    try:
        yield
    finally:
        with _collector_lock:
            _collector_depth -= 1
            if _collector_depth == 0 and _collector_was_enabled:
                gc.enable()


@functools.lru_cache(maxsize=None)
def _target(isa: str):
    """``jit.isa_targets.target_for``, built once per ISA."""
    from jit.isa_targets import target_for

    return target_for(isa)


_reference_backend = False
# GeneratedCode.listing (PeachPy's text of the instructions) only inside listings(): the
# tests compare it with PeachPy's own; dump-asm and INT8JIT_JIT_DUMP disassemble the
# mapped bytes instead. Printing it was 2-3 ms of a 35-45 ms cold kernel.
_listings_wanted = False


@contextlib.contextmanager
def listings() -> Iterator[None]:
    """Kernels generated inside the block carry their PeachPy-syntax listing."""
    global _listings_wanted
    saved, _listings_wanted = _listings_wanted, True
    try:
        yield
    finally:
        _listings_wanted = saved


@contextlib.contextmanager
def reference_backend() -> Iterator[None]:
    """Generate through PeachPy's own ``Function`` and pipeline inside the block (tests
    compare its bytes with :func:`jit.backend.assemble`'s)."""
    global _reference_backend
    saved, _reference_backend = _reference_backend, True
    try:
        yield
    finally:
        _reference_backend = saved


def load(generated: GeneratedCode) -> Kernel:
    """Map generated code into W^X memory; dump it when ``INT8JIT_JIT_DUMP=1``."""
    kernel = Kernel(
        generated.name,
        generated.code,
        signature=generated.signature,
        const=generated.const,
        relocations=generated.relocations,
        listing=generated.listing,
        isa=generated.isa,
        meta=generated.meta,
    )
    if os.environ.get("INT8JIT_JIT_DUMP", "") not in ("", "0"):
        _dump(kernel)
    return kernel


def _dump(kernel: Kernel) -> None:
    from jit.disasm import disassemble

    folder = os.path.expanduser(os.environ.get("INT8JIT_JIT_DUMP_DIR", "").strip() or "jit-dump")
    stem = os.path.join(folder, f"{kernel.name}.{kernel.isa}.{os.getpid()}.{int(time.time() * 1e6)}")
    code = kernel.code()
    try:
        os.makedirs(folder, exist_ok=True)
        with open(stem + ".bin", "wb") as f:
            f.write(code)
        with open(stem + ".s", "w") as f:
            f.write(disassemble(code, kernel.address))
    except OSError as exc:  # (a dump that cannot be written must not stop the computation)
        warnings.warn(f"INT8JIT_JIT_DUMP: cannot write {stem}.bin/.s: {exc}", RuntimeWarning, stacklevel=2)
