"""The instruction namespace kernel templates are written in (``from jit.asm import *``).

Importing this module imports PeachPy (slow-ish, so only templates import it), mends two
PeachPy defects, adds the VNNI instructions PeachPy lacks (``jit.vnni``), and takes the
Python overhead out of building instructions: operand copies (:func:`_speed_up_operand_copies`,
:func:`_speed_up_check_operand`), the debug-level query (:func:`_speed_up_debug_level`)
and label naming (:class:`Label`). Each speed-up returns what PeachPy's code returns and
fails on import if PeachPy's internals are not what it was written against. The rest of
cold generation's speed is in ``jit.backend``.
"""
from __future__ import annotations

import copy as _copy
import linecache as _linecache
import sys as _sys

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


_ATOMIC = (int, bool, str, float, type(None))  # copy.deepcopy returns these as they are


def _copy_instance(self):
    """What ``copy.copy`` does for a plain instance: a new one with the same attributes."""
    new = object.__new__(type(self))
    new.__dict__.update(self.__dict__)
    return new


def _deepcopy_instance(self, memo):
    """What ``copy.deepcopy`` does for a plain instance: a new one (in the memo first), its
    attributes deep-copied with the memo."""
    new = object.__new__(type(self))
    memo[id(self)] = new
    new.__dict__.update({key: value if type(value) in _ATOMIC else _copy.deepcopy(value, memo)
                         for key, value in self.__dict__.items()})
    return new


def _speed_up_operand_copies() -> None:
    """Give PeachPy's operand classes ``__copy__`` and ``__deepcopy__``.

    Every instruction copies its operands (``operand.check_operand``: ``copy.copy`` of a
    register, ``copy.deepcopy`` of a masked register, memory operand or constant name),
    which without these methods goes through ``__reduce_ex__``, Python's slowest route
    (a quarter of a kernel's emit time before). :func:`_copy_instance` and
    :func:`_deepcopy_instance` do what that route does for these plain classes. Fails
    loudly if a class gained state handling of its own (slots, ``__new__``, pickling or
    copy methods), where that would no longer hold.
    """
    from peachpy.literal import Constant
    from peachpy.name import Name
    from peachpy.x86_64 import operand, registers

    roots = (registers.Register, registers.RegisterMask, registers.MaskedRegister, operand.MemoryOperand,
             operand.MemoryAddress, Constant, Name)
    if roots[0].__dict__.get("__copy__") is _copy_instance:
        return
    for cls in _with_subclasses(roots):
        own = {"__slots__", "__new__", "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__copy__",
               "__deepcopy__"}.intersection(vars(cls))
        if own:
            raise ImportError(f"PeachPy's {cls.__qualname__} defines {', '.join(sorted(own))}: "
                              "jit.asm's fast operand copies would not copy it the way copy.copy does")
    for cls in roots:
        cls.__copy__ = _copy_instance
        cls.__deepcopy__ = _deepcopy_instance


def _with_subclasses(roots) -> list:
    found, pending = [], list(roots)
    while pending:
        cls = pending.pop()
        if cls not in found:
            found.append(cls)
            pending.extend(cls.__subclasses__())
    return found


def _speed_up_debug_level() -> None:
    """Every instruction constructor asks ``options.get_debug_level()``, which imports the
    active function on each call; read the same two values without the import."""
    import peachpy.common.function as active
    from peachpy.x86_64 import options

    if getattr(options.get_debug_level, "_int8jit_mended", False):
        return
    if not hasattr(active, "active_function") or not hasattr(options, "debug_level"):
        raise ImportError("PeachPy's options.get_debug_level reads state jit.asm does not find")

    def get_debug_level():
        function = active.active_function
        return options.debug_level if function is None else function.debug_level

    get_debug_level._int8jit_mended = True
    options.get_debug_level = get_debug_level


_mend_mask_register_reconstruction()
_mend_live_register_limit()
_speed_up_operand_copies()
_speed_up_debug_level()

from peachpy import *  # noqa: E402,F401,F403
from peachpy.x86_64 import *  # noqa: E402,F401,F403
from jit.vnni import *  # noqa: E402,F401,F403


def _speed_up_check_operand() -> None:
    """Route the commonest operands around PeachPy's ``check_operand``.

    Instruction constructors pass every operand through ``operand.check_operand``, which
    runs seven ``import`` statements before an ``isinstance`` ladder: a register (three of
    four operands) comes back as ``copy.copy(register)``, a ``[address]`` list as
    ``MemoryOperand(address)`` and a masked register or memory operand as
    ``copy.deepcopy(operand)``. The front end returns exactly those for those (the copies
    made directly, as ``copy`` would through the methods :func:`_speed_up_operand_copies`
    gave the classes) and hands everything else to PeachPy's function. The instruction
    modules bound the function at import, so each binding (PeachPy's and jit.vnni's) is
    replaced.
    """
    from peachpy.x86_64 import operand, registers

    original = operand.check_operand
    if getattr(original, "_int8jit_mended", False):
        return
    register_types = frozenset(_with_subclasses((registers.Register,)))
    deep_types = frozenset((registers.MaskedRegister, operand.MemoryOperand))
    memory_operand = operand.MemoryOperand

    def check_operand(value):
        kind = type(value)
        if kind in register_types:
            return _copy_instance(value)
        if kind is list and len(value) == 1:
            return memory_operand(value[0])
        if kind in deep_types:
            return _deepcopy_instance(value, {})
        return original(value)

    check_operand._int8jit_mended = True
    modules = [m for m in list(_sys.modules.values()) if getattr(m, "check_operand", None) is original]
    if "peachpy.x86_64.avx" not in {m.__name__ for m in modules}:
        raise ImportError("PeachPy's instruction modules no longer bind operand.check_operand: "
                          "jit.asm's front end would not be used")
    for module in modules:
        module.check_operand = check_operand


_speed_up_check_operand()


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

            name = (Name(prename=_assigned_name(_sys._getframe(1), "Label")),)
        super().__init__(name)


def _assigned_name(frame, constructor: str) -> str | None:
    """What PeachPy's ``parse_assigned_variable_name(inspect.stack(), constructor)``
    returns when called one frame below ``frame``."""
    from peachpy.parse import parse_assigned_variable_name

    code = frame.f_code
    line = _linecache.getline(code.co_filename, frame.f_lineno)
    # The shape of inspect.stack()'s entries: (frame, file, line number, function, context lines, index)
    caller = (frame, code.co_filename, frame.f_lineno, code.co_name, [line] if line else None, 0)
    return parse_assigned_variable_name([None, caller], constructor)
