"""The instruction namespace kernel templates are written in (``from jit.asm import *``).

Importing this module imports PeachPy (slow-ish, so only templates import it), mends two
PeachPy defects, adds the VNNI instructions PeachPy lacks (``jit.vnni``) and replaces
PeachPy's ``Label`` with one that is named cheaply (:class:`Label`).
"""
from __future__ import annotations

import linecache
import sys

try:
    import peachpy.x86_64.registers as _registers
except ImportError as exc:  # pragma: no cover - depends on the machine's set-up
    raise ImportError(
        "PeachPy is not importable. Install Debian's python3-peachpy and use a virtual "
        "environment with system site packages (tools/setup.sh does both)."
    ) from exc


def _mend_mask_register_reconstruction() -> None:
    """PeachPy's Register._reconstruct forgets physical k-registers (k1..k7).

    Any instruction that reads a fixed opmask register (``zmm0(k1)``) then trips an
    assertion during liveness analysis. Add the missing case.
    """
    original = _registers.Register._reconstruct
    if getattr(original, "_int8jit_mended", False):
        return

    def reconstruct(internal_id, mask):
        extra = set()
        if internal_id >= 0 and mask & 0x40:
            mask &= ~0x40
            extra.add(_registers.KRegister(physical_id=internal_id))
        return original(internal_id, mask) | extra

    reconstruct._int8jit_mended = True
    _registers.Register._reconstruct = staticmethod(reconstruct)


def _mend_live_register_limit() -> None:
    """PeachPy's live-register check assumes 16 vector registers; AVX-512 has 32.

    Kernels here name physical registers; an AVX2 kernel that named ymm16+ would still
    fail to encode (VEX cannot express them), so lifting the limit hides no error.
    """
    import six
    from peachpy import RegisterAllocationError
    from peachpy.x86_64 import function as _function
    from peachpy.x86_64.registers import GeneralPurposeRegister, KRegister, MMXRegister, XMMRegister

    if getattr(_function.Function._check_live_registers, "_int8jit_mended", False):
        return
    limits = {GeneralPurposeRegister._kind: 15, MMXRegister._kind: 8, XMMRegister._kind: 32, KRegister._kind: 8}

    def check_live_registers(self):
        for instruction in self._instructions:
            left = dict(limits)
            for reg in instruction.live_registers:
                left[reg.kind] -= 1
            if any(count < 0 for count in six.itervalues(left)):
                raise RegisterAllocationError(
                    "The number of live virtual registers exceeds physical constraints %s" % str(instruction))

    check_live_registers._int8jit_mended = True
    _function.Function._check_live_registers = check_live_registers


_mend_mask_register_reconstruction()
_mend_live_register_limit()

from peachpy import *  # noqa: E402,F401,F403
from peachpy.x86_64 import *  # noqa: E402,F401,F403
from jit.vnni import *  # noqa: E402,F401,F403


class Label(Label):  # noqa: F405 - PeachPy's, from the star import above
    """PeachPy's ``Label``, pre-named from the caller's line without ``inspect.stack()``.

    An unnamed PeachPy label takes its pre-name from the assignment it is created in
    (``skip = Label()`` is "skip") by calling ``inspect.stack()``, which reads the source
    context of every frame up the stack: 1-3 ms per label, a third of a kernel's emit
    time. This reads the caller's one line and hands it to PeachPy's own parser, so the
    pre-name is the same.
    """

    def __init__(self, name=None):
        if name is None:
            from peachpy.name import Name

            name = (Name(prename=_assigned_name(sys._getframe(1), "Label")),)
        super().__init__(name)


def _assigned_name(frame, constructor: str) -> str | None:
    """What PeachPy's ``parse_assigned_variable_name(inspect.stack(), constructor)``
    returns when called one frame below ``frame``."""
    from peachpy.parse import parse_assigned_variable_name

    code = frame.f_code
    line = linecache.getline(code.co_filename, frame.f_lineno)
    # The shape of inspect.stack()'s entries: (frame, file, line number, function, context lines, index)
    caller = (frame, code.co_filename, frame.f_lineno, code.co_name, [line] if line else None, 0)
    return parse_assigned_variable_name([None, caller], constructor)
