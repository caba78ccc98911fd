"""Disassembly of machine code through iced-x86 (an independent decoder, not PeachPy).

``dump-asm`` and ``INT8JIT_JIT_DUMP=1`` show the bytes that actually sit in executable
memory; decoding them with iced-x86 shows what the CPU will execute, which is the point
when checking hand-defined encodings such as the VNNI instructions.

Example::

    >>> print(disassemble(bytes([0xB8, 7, 0, 0, 0, 0xC3])))
    0000  b807000000              mov eax,7
    0005  c3                      ret
    >>> print(disassemble(bytes([0xB8, 7, 0, 0, 0, 0xC3]), syntax="att"))
    0000  b807000000              mov $7,%eax
    0005  c3                      ret
"""
from __future__ import annotations

from typing import Iterator

SYNTAXES = ("intel", "att")
_HEX_WIDTH = 22  # 11 bytes; longer instructions simply push the text to the right


def _formatter(syntax: str):
    import iced_x86

    if syntax == "intel":
        return iced_x86.Formatter(iced_x86.FormatterSyntax.INTEL)
    if syntax in ("att", "gas"):
        return iced_x86.Formatter(iced_x86.FormatterSyntax.GAS)
    raise ValueError(f"syntax: expected one of {', '.join(SYNTAXES)}, got {syntax!r}")


def decode(code: bytes, address: int = 0) -> Iterator:
    """The iced-x86 ``Instruction`` objects of ``code`` (``ip`` starts at ``address``)."""
    import iced_x86

    yield from iced_x86.Decoder(64, bytes(code), ip=address)


def encoding_name(instruction) -> str:
    """``"legacy"``, ``"vex"``, ``"evex"``, ... for a decoded instruction."""
    import iced_x86

    for name in ("LEGACY", "VEX", "EVEX", "XOP", "D3NOW", "MVEX"):
        if instruction.encoding == getattr(iced_x86.EncodingKind, name, None):
            return name.lower()
    return str(instruction.encoding)


def disassemble(code: bytes, address: int = 0, syntax: str = "intel") -> str:
    """One line per instruction: offset from the start, the bytes in hex, the text.

    ``address`` is where the code sits in memory: branch targets and RIP-relative
    operands are shown as the absolute addresses they resolve to there.
    """
    formatter = _formatter(syntax)
    code = bytes(code)
    lines = []
    for instruction in decode(code, address):
        offset = instruction.ip - address
        raw = code[offset:offset + instruction.len].hex()
        text = formatter.format(instruction)
        if instruction.is_invalid:
            text = "(bad)"
        lines.append(f"{offset:04x}  {raw:<{_HEX_WIDTH}}  {text}")
    return "\n".join(lines)
