"""The instruction namespace kernel templates are written in (``from jit.asm import *``).

Importing this module imports PeachPy (slow-ish, so only templates import it), mends one
PeachPy defect, and adds the VNNI instructions PeachPy lacks (``jit.vnni``).
"""
from __future__ import annotations

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
