"""A generated kernel: its machine code in W^X memory and a typed cffi entry point."""
from __future__ import annotations

from typing import Any

from runtime.execmem import ExecutableMemory, Relocation
from runtime.ffi import ffi


class Kernel:
    """Machine code plus the C signature it is called through.

    ``signature`` is a C function-pointer type such as
    ``"void (*)(const struct i8j_gemm_args *)"``; its types must have been declared
    with :func:`runtime.ffi.declare`. Calling the kernel goes through cffi, which checks
    argument types (a wrong type raises ``TypeError`` before any code runs) and releases
    the GIL for the duration of the call.

    Example::

        >>> k = Kernel("ret7", bytes([0xB8, 7, 0, 0, 0, 0xC3]), signature="int (*)(void)")
        >>> k()
        7
        >>> k.close()
    """

    def __init__(
        self,
        name: str,
        code: bytes,
        *,
        signature: str,
        const: bytes = b"",
        relocations: tuple[Relocation, ...] = (),
        listing: str = "",
        isa: str = "",
        meta: dict[str, Any] | None = None,
    ):
        self.name = name
        self.signature = signature
        self.listing = listing
        self.isa = isa
        self.meta = dict(meta or {})
        self.const = bytes(const)
        self._memory = ExecutableMemory(code, const, relocations)
        self._fn = ffi.cast(signature, self._memory.address)

    @property
    def address(self) -> int:
        return self._memory.address

    @property
    def size(self) -> int:
        return self._memory.code_size

    @property
    def function(self):
        """The raw cffi function pointer (for drivers that call it in a hot loop)."""
        if self._memory.closed:
            raise ValueError(f"kernel {self.name!r} was closed")
        return self._fn

    def code(self) -> bytes:
        """The bytes as they sit in executable memory, constant references resolved."""
        return self._memory.read_code()

    def __call__(self, *args):
        return self.function(*args)

    def close(self) -> None:
        """Unmap the code (a kept kernel's stays)."""
        self._memory.close()
        if self._memory.closed:
            self._fn = None

    def keep(self) -> "Kernel":
        """Never unmap this kernel's code (see ``ExecutableMemory.keep``); returns it."""
        self._memory.keep()
        return self

    @property
    def closed(self) -> bool:
        return self._memory.closed

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"at {self.address:#x}"
        return f"<Kernel {self.name} isa={self.isa} {self.size} bytes {state}>"
