"""Executable memory that is never writable and executable at once (W^X).

Pages are mapped read+write, filled with code and constants, PeachPy's RIP-relative
constant references are patched, and then the code pages become read+execute and the
constant pages read-only. PeachPy's own ``loader`` maps pages RWX; we do not use it.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

from runtime.ffi import ffi, libc

PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4
MAP_PRIVATE, MAP_ANONYMOUS = 0x02, 0x20
_SC_PAGESIZE = 30
PAGE = int(libc.sysconf(_SC_PAGESIZE)) or 4096
MAP_FAILED = 2**64 - 1


@dataclass(frozen=True)
class Relocation:
    """A 32-bit RIP-relative displacement in the code that points into the constants.

    ``offset``: where the disp32 sits in the code; ``pc``: the code offset the CPU adds it
    to (the end of the instruction); ``target``: the offset inside the constant section.
    """

    offset: int
    pc: int
    target: int


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def map_pages(nbytes: int, what: str) -> int:
    """The address of a new private anonymous read+write mapping of ``nbytes`` rounded up
    to whole pages; ``what`` names it in the MemoryError when the system refuses."""
    nbytes = _round_up(nbytes, PAGE)
    ptr = libc.mmap(ffi.NULL, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    address = int(ffi.cast("uintptr_t", ptr))
    if address == MAP_FAILED:
        raise MemoryError(f"mmap of {nbytes} bytes for {what} failed (errno {ffi.errno})")
    return address


def _unmap(address: int, size: int) -> None:
    libc.munmap(ffi.cast("void *", address), size)


class ExecutableMemory:
    """Code (read+execute) followed by constants (read-only) in one private mapping."""

    def __init__(self, code: bytes, const: bytes = b"", relocations: tuple[Relocation, ...] = ()):
        if not code:
            raise ValueError("code: expected at least one byte of machine code, got none")
        self.code_size = len(code)
        code_span = _round_up(len(code), PAGE)
        const_span = _round_up(len(const), PAGE) if const else 0
        self.size = code_span + const_span
        address = map_pages(self.size, "executable memory")
        self.address = address
        self.const_address = address + code_span
        self._finalizer = weakref.finalize(self, _unmap, address, self.size)
        # Not unmapped at exit: a daemon thread may still be inside this code while the
        # interpreter shuts down (a segfault at exit, 10 runs in 10); the OS reclaims it.
        self._finalizer.atexit = False
        self._kept = False

        patched = bytearray(code)
        for r in relocations:
            if not 0 <= r.target < len(const):
                raise ValueError(f"relocation target {r.target} outside the {len(const)}-byte constant section")
            old = int.from_bytes(patched[r.offset:r.offset + 4], "little", signed=True)
            new = old + (self.const_address + r.target) - (address + r.pc)
            patched[r.offset:r.offset + 4] = new.to_bytes(4, "little", signed=True)
        ffi.memmove(ffi.cast("char *", address), bytes(patched), len(patched))
        if const:
            ffi.memmove(ffi.cast("char *", self.const_address), const, len(const))
        # Flip to the final protections: the mapping is never W and X at the same time.
        self._protect(address, code_span, PROT_READ | PROT_EXEC)
        if const_span:
            self._protect(self.const_address, const_span, PROT_READ)

    def _protect(self, address: int, size: int, prot: int) -> None:
        if libc.mprotect(ffi.cast("void *", address), size, prot) != 0:
            err = ffi.errno
            self.close()
            raise OSError(err, f"mprotect(prot={prot}) failed")

    def read_code(self) -> bytes:
        """The bytes exactly as they sit in executable memory (relocations applied)."""
        self._check_open()
        return bytes(ffi.buffer(ffi.cast("char *", self.address), self.code_size))

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("executable memory was already released")

    @property
    def closed(self) -> bool:
        return not (self._kept or self._finalizer.alive)

    def close(self) -> None:
        if not self._kept:
            self._finalizer()

    def keep(self) -> None:
        """Never unmap this mapping: for code that threads outside Python's control may
        still be running after its owner is gone, the thread pool's workers."""
        self._finalizer.detach()
        self._kept = True
