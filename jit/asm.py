"""The instruction namespace kernel templates are written in (``from jit.asm import *``).

Importing this module imports PeachPy (slow-ish, so only templates import it), mends two
PeachPy defects, adds the VNNI instructions PeachPy lacks (``jit.vnni``), and takes the
Python overhead out of building instructions: operand copies (:func:`_speed_up_operand_copies`,
:func:`_speed_up_check_operand`), addresses (:func:`_speed_up_addresses`), the
debug-level query (:func:`_speed_up_debug_level`) and label naming (:class:`Label`).
Each speed-up returns what PeachPy's code returns and fails on import if PeachPy's
internals are not what it was written against. Inside a kernel function an instruction
equal to one built before is that object again (:func:`_make_shared`), and one of a form
built before is a copy of it (:func:`_clone`), so PeachPy's constructors run once per
form. The rest of cold generation's speed is in ``jit.backend``.
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
    ``copy.deepcopy(operand)``, an immediate or a label as it is, and a constant as a memory
    operand of its copy (the name deep-copied through the function's memo). The front end
    returns exactly those for those (the copies made directly, as ``copy`` would through
    the methods :func:`_speed_up_operand_copies` gave the classes) and hands everything
    else to PeachPy's function. The instruction
    modules bound the function at import, so each binding (PeachPy's and jit.vnni's) is
    replaced.
    """
    from peachpy.x86_64 import operand, registers

    original = operand.check_operand
    if getattr(original, "_int8jit_mended", False):
        return
    import peachpy.common.function as active
    from peachpy.literal import Constant
    from peachpy.x86_64.pseudo import Label as label_type

    register_types = frozenset(_with_subclasses((registers.Register,)))
    deep_types = frozenset((registers.MaskedRegister, operand.MemoryOperand))
    passed_types = frozenset(_with_subclasses((label_type,)))  # returned as they are
    memory_operand = operand.MemoryOperand

    def check_operand(value):
        kind = type(value)
        if kind in register_types:
            return _copy_instance(value)
        if kind is list and len(value) == 1:
            return memory_operand(value[0])
        if kind in deep_types:
            return _deepcopy_instance(value, {})
        if kind is int and -2**63 <= value < 2**64:  # an immediate PeachPy's is_int64 accepts
            return value
        if kind in passed_types:
            return value
        if kind is Constant:  # a copy, its name copied through the function's memo
            constant = _copy_instance(value)
            function = active.active_function
            if function:
                constant.name = _copy.deepcopy(constant.name, function._names_memo)
            return memory_operand(constant)
        if isinstance(value, label_type):  # jit.asm.Label, defined after this ran
            return value
        return original(value)

    check_operand._int8jit_mended = True
    modules = [m for m in list(_sys.modules.values()) if getattr(m, "check_operand", None) is original]
    if "peachpy.x86_64.avx" not in {m.__name__ for m in modules}:
        raise ImportError("PeachPy's instruction modules no longer bind operand.check_operand: "
                          "jit.asm's front end would not be used")
    for module in modules:
        module.check_operand = check_operand


_speed_up_check_operand()


def _speed_up_addresses() -> None:
    """Build ``register + displacement`` and ``register * scale`` addresses without
    PeachPy's per-call imports and duplicate objects.

    ``rdi + 8`` makes ``MemoryAddress(rdi)`` and then, in ``MemoryAddress.__add__``, a second
    one with the displacement, each ``__init__`` running two ``import`` statements and an
    ``isinstance`` ladder: ~1,200 addresses per GEMM kernel. The replacements build the
    address PeachPy's code builds for the common cases (a 64-bit base register, an int in
    the signed 32-bit range, a scale of 1, 2, 4 or 8, registers that PeachPy accepts as
    index) and call PeachPy's own code for everything else, errors included.
    """
    from peachpy.x86_64 import operand, registers

    address, gpr64 = operand.MemoryAddress, registers.GeneralPurposeRegister64
    if getattr(address.__init__, "_int8jit_mended", False):
        return
    for cls, names in ((address, ("__init__", "__add__")), (gpr64, ("__add__", "__mul__"))):
        for name in names:
            if name not in vars(cls):
                raise ImportError(f"PeachPy's {cls.__qualname__}.{name} is not where jit.asm's fast addresses expect it")
    init, add, reg_add, reg_mul = address.__init__, address.__add__, gpr64.__add__, gpr64.__mul__
    index_types = frozenset((gpr64, registers.XMMRegister, registers.YMMRegister, registers.ZMMRegister))
    low, high = -2**31, 2**31 - 1

    def address_init(self, base=None, index=None, scale=None, displacement=0):
        if type(displacement) is int and low <= displacement <= high and (base is None or type(base) is gpr64):
            if index is None and scale is None and base is not None:
                self.base, self.index, self.scale, self.displacement = base, None, None, displacement
                return
            if type(index) in index_types and type(scale) is int and scale in (1, 2, 4, 8):
                self.base, self.index, self.scale, self.displacement = base, index, scale, displacement
                return
        init(self, base, index, scale, displacement)

    def address_add(self, addend):
        if type(addend) is int and low <= addend <= high:
            return address(self.base, self.index, self.scale, self.displacement + addend)
        return add(self, addend)

    def register_add(self, offset):
        if type(offset) is int and low <= offset <= high:
            return address(self, None, None, offset)
        if type(offset) is address and offset.base is None:  # rbx + rbp * 2 (+ 64)
            return address(self, offset.index, offset.scale, offset.displacement)
        return reg_add(self, offset)

    def register_mul(self, scale):
        if type(scale) is int and scale in (1, 2, 4, 8):
            return address(index=self, scale=scale)
        return reg_mul(self, scale)

    for function in (address_init, address_add, register_add, register_mul):
        function._int8jit_mended = True
    address.__init__, address.__add__ = address_init, address_add
    gpr64.__add__, gpr64.__mul__ = register_add, register_mul


_speed_up_addresses()


def _speed_up_memory_operands() -> None:
    """Build ``[address]``, ``dword[address]`` and ``oword[address](k1)`` operands without
    PeachPy's per-call imports and assertions.

    ``MemoryOperand.__init__`` runs three ``import`` statements and an ``isinstance``
    ladder for each operand (every instruction's memory operand is built again by
    ``check_operand``): 3-4% of a first kernel's generation. The replacement stores what
    PeachPy's code stores for an address that is a ``MemoryAddress`` (its index not a
    masked register) or a 64-bit register, and an int size PeachPy knows; anything else
    goes to PeachPy's own code, its assertions included.
    """
    from peachpy.x86_64 import operand, registers

    memory_operand = operand.MemoryOperand
    if getattr(memory_operand.__init__, "_int8jit_mended", False):
        return
    if "__init__" not in vars(memory_operand):
        raise ImportError("PeachPy's MemoryOperand.__init__ is not where jit.asm's fast operands expect it")
    init, address_type, gpr64 = memory_operand.__init__, operand.MemoryAddress, registers.GeneralPurposeRegister64
    masked, sizes = registers.MaskedRegister, frozenset(operand.SizeSpecification._size_name_map)

    def operand_init(self, address, size=None, mask=None, broadcast=None):
        kind = type(address)
        if (kind is gpr64 or kind is address_type and type(address.index) is not masked) and \
                (size is None or type(size) is int and size in sizes):
            self.symbol, self.size, self.mask, self.broadcast = None, size, mask, broadcast
            self.address = address if kind is address_type else address_type(address)
            return
        init(self, address, size, mask, broadcast)

    operand_init._int8jit_mended = True
    memory_operand.__init__ = operand_init


_speed_up_memory_operands()


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


# -- instruction sharing ---------------------------------------------------------------------
# A kernel repeats most of its instructions (the same K-loop step and output-stage lines in
# every block of rows): a 6x4 VNNI GEMM kernel emits ~900 ordinary instructions of which
# ~390 differ. Built through PeachPy each costs ~20 us of operand checks and encoder set-up.
_OPTION_TYPES = frozenset((bool, int, str, type(None)))
_SHARED_LIMIT = 4096  # distinct instructions kept (~2 KB each, ~10 kernels' worth); the table restarts when full
_shared: dict = {}


def _share_instructions() -> None:
    """Make this namespace's ordinary instruction classes hand back one object per distinct
    instruction while a :class:`jit.backend.KernelFunction` is being emitted (see
    :func:`_make_shared`). The classes stay PeachPy's (``asm.MOV is
    peachpy.x86_64.MOV``); only their ``__new__`` and ``__init__`` gain the sharing.
    Labels, branches and the ABI pseudo-instructions are left alone: the back end gives
    each of those per-place state (label addresses, branch sizes, the SSE/AVX state,
    lowering)."""
    from peachpy.x86_64 import pseudo
    from peachpy.x86_64.generic import RET
    from peachpy.x86_64.instructions import BranchInstruction, Instruction

    classes = {value for value in globals().values()
               if isinstance(value, type) and issubclass(value, Instruction) and not issubclass(value, BranchInstruction)
               and value.__module__ != pseudo.__name__ and value is not RET}
    for cls in classes:
        if "__new__" in vars(cls) and not getattr(cls.__new__, "_int8jit_mended", False):
            raise ImportError(f"PeachPy's {cls.__name__} defines __new__: jit.asm cannot share its instructions")
    for cls in classes:
        if cls not in _SHARED_CLASSES:
            _make_shared(cls)
            _SHARED_CLASSES.add(cls)


_SHARED_CLASSES: set = set()


def _make_shared(cls) -> None:
    """``cls(*args)`` inside a :class:`jit.backend.KernelFunction` returns the object built
    before for an equal instruction (same class, listing indentation, keyword options and
    operands: :func:`_operand_key`), added to the function again; else it builds one, as
    a copy of an earlier instruction of the same form where there is one (:func:`_clone`).

    PeachPy never changes an ordinary instruction after building it except to store its
    bytes, which for these instructions (physical registers, no constant, label or local
    variable: those have no key) do not depend on where the instruction sits, so one
    object serves every place it appears; ``jit.backend`` then scans, encodes and prints
    it once. Outside a kernel function (PeachPy's own ``Function``, which the reference
    pipeline uses, PeachPy's lowering streams, or no function), with PeachPy's debug
    information on, without operands (``copy`` and ``pickle`` call ``cls.__new__(cls)``)
    or with an operand or option that has no key, ``cls(*args, **kwargs)`` is what it
    always was. ``__new__`` finds the shared object or marks a new one with its key;
    ``__init__`` runs PeachPy's constructor for a new one (which adds it to the function)
    and records it, or adds a shared one to the function.
    """
    import peachpy.stream as stream
    from jit.backend import KernelFunction

    original_init = cls.__init__

    def __new__(klass, *args, **kwargs):
        function = stream.active_stream
        if klass is not cls or not args or type(function) is not KernelFunction or function.debug_level:
            return object.__new__(klass)
        options = ()
        if kwargs:  # options such as jit.vnni's vex=: plain values only (not origin/prototype)
            for value in kwargs.values():
                if type(value) not in _OPTION_TYPES:
                    return object.__new__(klass)
            options = tuple(sorted(kwargs.items()))
        key = [cls, function._indent_level, options]
        memo = _shared
        for arg in args:
            part = _operand_key(arg)
            if part is None:
                return object.__new__(klass)
            if part[0] is _Constant:  # the constant's name belongs to this function's scope
                memo = function._shared_here
            key.append(part)
        key = tuple(key)
        instruction = memo.get(key)
        if instruction is None:
            instruction = object.__new__(klass)
            instruction._int8jit_key = (memo, key)
        return instruction

    def __init__(self, *args, **kwargs):
        state = self.__dict__
        if "_int8jit_shared" in state:  # handed back by __new__: built before
            stream.active_stream.add_shared(self)
            return
        memo_key = state.pop("_int8jit_key", None)
        if memo_key is None:
            original_init(self, *args, **kwargs)  # PeachPy adds it to the active function
            return
        memo, key = memo_key
        form = _form_key(key)
        template = _forms.get(form)
        if template is None:
            original_init(self, *args, **kwargs)
            if len(_forms) >= _SHARED_LIMIT:
                _forms.clear()
            _forms[form] = self
        else:
            _clone(template, self, args)
            stream.active_stream.add_instruction(self)
        if len(memo) >= _SHARED_LIMIT:
            memo.clear()
        memo[key] = self
        self._int8jit_shared = key  # jit.backend encodes, prints and scans it once
        stream.active_stream._checked.add(id(self))

    __new__._int8jit_mended = __init__._int8jit_mended = True
    __init__.__doc__ = original_init.__doc__
    cls.__new__, cls.__init__ = __new__, __init__


# -- instruction forms ---------------------------------------------------------------------
# A PeachPy constructor picks its instruction's form (encoders, register roles, extensions,
# names) from its operands through operand.py's is_* predicates and, for shifts, whether an
# immediate is 1; jit.vnni's also reads a memory operand's broadcast and whether a write
# mask is k0. Those read: the operand's class, a register's kind and mask and whether its
# number is 0, 1, under 4 or under 16; a memory operand's size, broadcast, mask (zeroing,
# k0) and whether its address has a base, a rip-relative offset, or an index (of which
# kind, and whether under 16); a constant's size. Two instructions of one class whose
# operands agree on all that (:func:`_form_key`) get the same form, so the second is
# built as a copy of the first with its own operands (:func:`_clone`): the constructors'
# operand checks and encoder set-up run once per form (a GEMM kernel has ~50 forms among
# its ~400 distinct instructions). tests/test_build_speed.py compares the bytes and
# listings with PeachPy's own pipeline.
_forms: dict = {}


def _form_key(key: tuple) -> tuple:
    """The form part of a sharing key ``(class, indentation, options, operand keys...)``."""
    return key[0], key[2], tuple(_operand_form(part) for part in key[3:])


def _number_class(number: int) -> int:
    """What the predicates ask of a register number: 0 (al, xmm0...), 1 (cl), 2-3, 4-15
    (an 8-bit register that needs REX), 16-31 (EVEX only)."""
    return number if number < 2 else 2 if number < 4 else 4 if number < 16 else 16


def _register_form(key):
    return None if key is None else (key[0], key[1], _number_class(key[2]))


def _operand_form(part):
    kind = part[0]
    if kind is int:
        return part  # immediates by value (range checks, "is it 1")
    if kind in _REGISTER_TYPES:
        return (kind, part[1], _number_class(part[2]))
    if kind is _Constant:
        return (kind, part[1])
    if kind is _MaskedRegister:  # (kind, register, mask register, zeroing)
        return (kind, _register_form(part[1]), part[2][2] == 0, part[3])
    if type(kind) is tuple:  # a memory operand: (address, size, mask, broadcast)
        address, size, mask, broadcast = part
        mask = mask and (mask[0][2] == 0, mask[1])
        return (_MemoryOperand, _address_form(address), size, mask, broadcast)
    return (list, _address_form(part))  # [address]


def _address_form(address):
    if len(address) == 2:  # (tag, base register)
        return (True, None)
    return (address[1] is not None, _register_form(address[2]))


def _clone(template, instruction, args) -> None:
    """Make ``instruction`` what ``template``'s constructor made, with ``args`` as operands
    (passed through ``check_operand`` as a constructor passes them)."""
    from peachpy.x86_64 import operand

    state = dict(template.__dict__)
    state.pop("_int8jit_shared", None)
    state["operands"] = tuple(map(operand.check_operand, args))
    state["bytecode"] = None
    state["encodings"] = list(template.encodings)
    state["_implicit_in_regs"] = dict(template._implicit_in_regs)
    state["_implicit_out_regs"] = dict(template._implicit_out_regs)
    state["_available_registers"] = {}
    state["_live_registers"] = {}
    instruction.__dict__.update(state)


def _operand_key(value):
    """What an instruction's constructor reads of an operand as given (register kinds and
    numbers, address parts, size, mask, broadcast, immediate, a constant's type and
    values), or None for operands that are not shared (virtual registers, labels, local
    variables, anything else).

    A constant is keyed by its values, not its name: equal constants share one place in
    the constant section (``jit.backend._layout_constants``, as PeachPy lays them out) and
    listings print them as ``[rip+0]``; an instruction with a constant is shared within
    its function only (``jit.backend.KernelFunction._shared_here``), since PeachPy
    names the constant in the function's scope."""
    kind = type(value)
    if kind in _REGISTER_TYPES:
        return (kind, value.mask, value.physical_id) if value.virtual_id is None else None
    if kind is int:
        return (int, value)
    if kind is list:
        return _address_key(value[0], list) if len(value) == 1 else None
    if kind is _MemoryOperand:
        if value.symbol is not None:
            return None
        address = _address_key(value.address, kind)
        mask = value.mask
        if mask is not None:
            if type(mask) is not _RegisterMask:
                return None
            register = _register_key(mask.mask_register)
            if register is None:
                return None
            mask = (register, mask.is_zeroing)
        return address and (address, value.size, mask, value.broadcast)
    if kind is _Constant:  # what its encoding and its place among the constants depend on
        if value.label is not None or value.prefix is not None:
            return None
        return (kind, value.size, value.repeats, value.data, id(value.element_ctype))
    if kind is _MaskedRegister:
        register, mask = _register_key(value.register), value.mask
        if register is None or type(mask) is not _RegisterMask:
            return None
        mask_register = _register_key(mask.mask_register)
        return mask_register and (kind, register, mask_register, mask.is_zeroing)
    return None


def _register_key(register):
    if type(register) in _REGISTER_TYPES and register.virtual_id is None:
        return (type(register), register.mask, register.physical_id)
    return None


def _address_key(address, tag):
    kind = type(address)
    if kind is _MemoryAddress:
        base, index = address.base, address.index
        base_key = None if base is None else _register_key(base)
        index_key = None if index is None else _register_key(index)
        if base is not None and base_key is None or index is not None and index_key is None:
            return None
        return (tag, base_key, index_key, address.scale, address.displacement)
    register = _register_key(address)
    return register and (tag, register)


from peachpy.literal import Constant as _Constant  # noqa: E402
from peachpy.x86_64.operand import MemoryAddress as _MemoryAddress, MemoryOperand as _MemoryOperand  # noqa: E402
from peachpy.x86_64.registers import MaskedRegister as _MaskedRegister, RegisterMask as _RegisterMask  # noqa: E402

_REGISTER_TYPES = frozenset(_with_subclasses((_registers.Register,)))
_share_instructions()
