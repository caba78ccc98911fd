"""PeachPy's back end, lean, for kernels that name physical registers only.

PeachPy turns an emitted ``Function`` into machine code in three stages built for
virtual registers: leaving ``with Function`` runs liveness analysis, register
allocation and live-register checks over every instruction; ``finalize`` deep-copies
the instruction list, allocates registers and lowers the ABI pseudo-instructions;
``encode`` deep-copies the list again and encodes every instruction anew on each pass
of branch relaxation. For a GEMM kernel of ~3000 instructions that was 1-2 s, almost
all of it work whose outcome is known in advance when every register is physical.

:func:`assemble` keeps the steps whose outcome matters, on the one instruction list (no
copies), calling PeachPy's own methods where they are cheap:

* labels: PeachPy's default entry label, undefined-label check, unused-label removal
  and naming (``Function`` methods);
* the forward SSE/AVX state pass, which decides whether a RETURN gets a VZEROUPPER
  (:func:`_propagate_avx_state`, PeachPy's algorithm for code without SSE instructions);
* the callee-saved registers the code writes (:func:`_scan`), then PeachPy's own
  argument and RETURN lowering (prologue and epilogue) through ``ABIFunction`` methods
  (:class:`_LeanABIFunction`);
* PeachPy's constant layout, encoding, branch relaxation and relocations
  (:func:`_encode`), each distinct instruction encoded once, then its listing.

Anything outside that case (virtual registers, local variables, stack arguments, a
return value, SSE instructions, other pseudo-instructions, another ABI) goes through
PeachPy's pipeline unchanged (:func:`assemble_reference`), which the tests also use to
check that both produce the same bytes (tests/test_build_speed.py).
"""
from __future__ import annotations

import bisect
import copy
import os
from dataclasses import dataclass

import peachpy.x86_64.function as _function
import peachpy.x86_64.options as _options
from peachpy.encoder import Encoder
from peachpy.literal import Constant
from peachpy.x86_64.abi import system_v_x86_64_abi
from peachpy.x86_64.avx import VZEROALL, VZEROUPPER
from peachpy.x86_64.generic import RET
from peachpy.x86_64.instructions import BranchInstruction, Instruction
from peachpy.x86_64.operand import MemoryAddress, MemoryOperand, RIPRelativeOffset, get_operand_registers
from peachpy.x86_64.pseudo import LABEL, LOAD, RETURN
from peachpy.x86_64.registers import GeneralPurposeRegister, MaskedRegister, Register, rsp

_GPR_MASK = 0xF  # register-mask bits of the general-purpose (sub)registers
_MAX_REGISTER_ARGUMENTS = 6  # System V: rdi, rsi, rdx, rcx, r8, r9
_PSEUDO_MODULE = LABEL.__module__
# Pseudo-instructions the forward SSE/AVX pass gives the state it reaches them with.
_STATE_TAKERS = (LOAD.ARGUMENT, RETURN, RET, LABEL)
_ATOMIC = (int, bool, str, type(None))  # hashable values an encoding key holds as they are
# PeachPy's methods the lean path calls; checked on import so a different PeachPy fails loudly.
_USES = {
    _function.Function: ("_add_default_labels", "_check_undefined_labels", "_remove_unused_labels", "attach",
                         "detach"),
    _function.ABIFunction: ("_setup_unix_arguments", "_update_argument_loads", "_update_stack_frame",
                            "_update_argument_addresses", "_lower_argument_loads", "_lower_pseudoinstructions"),
    Instruction: ("encode", "relocation", "format"),
    BranchInstruction: ("_encode_label_branch", "label_name"),
}
_missing = [f"{cls.__name__}.{name}" for cls, names in _USES.items() for name in names if not hasattr(cls, name)]
if _missing:
    raise ImportError(f"PeachPy lacks what jit.backend uses: {', '.join(_missing)}")


class KernelFunction(_function.Function):
    """PeachPy's ``Function`` with an ``add_instruction`` that finds an instruction's constant
    without ``Instruction.constant`` (a generator and two imports per instruction), and
    :meth:`add_shared` for the instructions ``jit.asm`` shares between places."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._checked: set[int] = set()  # ids of shared instructions add_instruction accepted
        self._shared_here: dict = {}  # jit.asm's shared instructions that name a constant

    def add_shared(self, instruction) -> None:
        """Add an instruction ``jit.asm`` shares: through :meth:`add_instruction` the first
        time in this function, appended after that (its target checks passed, its
        indentation is part of its sharing key and it has no label or constant)."""
        if id(instruction) in self._checked:
            self._instructions.append(instruction)
        else:
            self.add_instruction(instruction)
            self._checked.add(id(instruction))

    def add_instruction(self, instruction) -> None:
        # The steps of PeachPy's add_instruction, in its order and with its errors.
        if instruction is None:
            return
        if not isinstance(instruction, Instruction):
            raise TypeError("Instruction object expected")
        if isinstance(instruction, LABEL):
            self._scope.add_scoped_name(instruction.identifier)
            self._label_names.add(instruction.identifier)
        constant = _constant_of(instruction)
        if constant is not None:
            self._scope.add_scoped_name(constant.name)
        for extension in instruction.isa_extensions:
            if self.target is not None and extension not in self.target.extensions:
                raise ValueError("{0} is not supported on the target microarchitecture".format(extension))
        instruction._indent_level = self._indent_level
        self._instructions.append(instruction)


@dataclass(frozen=True)
class Assembled:
    """Machine code of one function, the way ``jit.build`` stores it."""

    code: bytes
    const: bytes
    relocations: tuple[tuple[int, int, int], ...]  # (offset, program counter, constant offset)
    listing: str


def assemble(function: _function.Function, abi=system_v_x86_64_abi, listing: bool = True) -> Assembled:
    """Finish an emitted, still attached ``function`` (as leaving ``with`` would) and encode
    it: the lean path where :func:`_scan` lets it, else PeachPy's. ``listing``: print
    the instructions too (else ``Assembled.listing`` is empty)."""
    written = _scan(function, abi)
    if written is None:
        _unshare(function._instructions)
        return assemble_reference(function, abi, listing)
    function.detach()
    function._add_default_labels()
    function._check_undefined_labels()
    function._remove_unused_labels()
    _propagate_avx_state(function._instructions, *_control_flow(function))
    function._scope.assign_names()
    return _encode(_LeanABIFunction(function, abi, written)._instructions, abi, listing)


def assemble_reference(function: _function.Function, abi=system_v_x86_64_abi, listing: bool = True) -> Assembled:
    """PeachPy's own pipeline: ``with`` exit, ``finalize`` and ``encode``."""
    function.__exit__(None, None, None)
    abi_function = function.finalize(abi)
    encoded = abi_function.encode()
    return Assembled(
        code=bytes(encoded.code_section.content),
        const=bytes(encoded.const_section.content),
        relocations=tuple((r.offset, r.program_counter, r.symbol.offset) for r in encoded.code_section.relocations),
        listing=abi_function.format() if listing else "",
    )


def _unshare(instructions: list) -> None:
    """Give each place its own copy of the instructions ``jit.asm`` shares between places
    (``_int8jit_shared``): PeachPy's pipeline records per-place state (liveness) on them."""
    for i, instruction in enumerate(instructions):
        if getattr(instruction, "_int8jit_shared", False):
            # The copies keep the constant the function's scope named (as when a template
            # uses one Constant twice).
            constant = _constant_of(instruction)
            instructions[i] = copy.deepcopy(instruction, {} if constant is None else {id(constant): constant})
            del instructions[i]._int8jit_shared


# -- which functions qualify ---------------------------------------------------------------
def _scan(function: _function.Function, abi) -> set[int] | None:
    """Physical ids of the general-purpose registers the code writes, or None when the
    function is outside the lean path's case."""
    if abi is not system_v_x86_64_abi or function.result_type is not None or function.avx_environment:
        return None
    if _options.abi is not None or _options.rtl_dump_file:  # PeachPy's writers and dumps want its own path
        return None
    arguments = function.arguments
    if len(arguments) > _MAX_REGISTER_ARGUMENTS or not all(a.is_integer or a.is_pointer for a in arguments):
        return None
    written: set[int] = set()
    seen: set[int] = set()  # instructions jit.asm shares appear many times; one look each
    for instruction in function._instructions:
        if id(instruction) in seen:
            continue
        seen.add(id(instruction))
        if instruction.avx_mode is False:
            return None
        if type(instruction).__module__ == _PSEUDO_MODULE and not _plain_pseudo(instruction):
            return None
        # Written registers as PeachPy's clobber analysis reads them (output_registers_masks).
        outputs = instruction.out_regs
        for k, operand in enumerate(instruction.operands):
            output = k < len(outputs) and outputs[k]
            if isinstance(operand, Register):  # most operands: checked without building lists
                if operand.physical_id is None:
                    return None
                if output and operand.mask & _GPR_MASK:
                    written.add(operand.physical_id)
            elif not _physical(operand):
                return None
            elif output:
                written.update(r.physical_id for r in get_operand_registers(operand) if r.mask & _GPR_MASK)
        if instruction._implicit_out_regs:
            written.update(i for i, mask in instruction._implicit_out_regs.items() if mask & _GPR_MASK)
    return written


def _plain_pseudo(instruction) -> bool:
    """False for the pseudo-instructions the lean path does not lower."""
    kind = type(instruction)
    if kind is LABEL:
        return True
    if kind is RETURN:
        return not instruction.operands
    if kind is LOAD.ARGUMENT:
        return isinstance(instruction.operands[0], GeneralPurposeRegister)
    return False


def _physical(operand) -> bool:
    """No virtual register in the operand and no local variable behind it."""
    if isinstance(operand, MemoryOperand):
        if isinstance(operand.symbol, _function.LocalVariable):
            return False
        if operand.mask is not None and operand.mask.mask_register.physical_id is None:
            return False
    return all(r.physical_id is not None for r in get_operand_registers(operand))


# -- the SSE/AVX state ------------------------------------------------------------------------
def _control_flow(function: _function.Function) -> tuple[int, list[tuple[int, int]], list[list[int]]]:
    """(entry block, block bounds, successor blocks) as PeachPy's ``_analize`` cuts them."""
    instructions = function._instructions
    labels = {ins.identifier: i for i, ins in enumerate(instructions) if isinstance(ins, LABEL)}
    entry = labels[function.entry.name] if function.entry.name in function._label_names else 0
    starts = {entry}
    ends = []
    for i, ins in enumerate(instructions):
        if isinstance(ins, BranchInstruction) and ins.label_name:
            starts.add(labels[ins.label_name])
            if ins.is_conditional:
                starts.add(i + 1)
        if isinstance(ins, LABEL):
            ends.append(i)
        elif isinstance(ins, (BranchInstruction, RETURN, RET)):
            ends.append(i + 1)
    starts = sorted(starts)
    bounds = []
    for start in starts:
        k = bisect.bisect_right(ends, start)
        if k == len(ends):
            raise _falls_off(function)
        bounds.append((start, ends[k]))
    index = {start: b for b, start in enumerate(starts)}
    successors = []
    for b, (_, end) in enumerate(bounds):
        last = instructions[end - 1]
        if isinstance(last, (RET, RETURN)):
            successors.append([])
            continue
        following = [b + 1] if b + 1 < len(bounds) else None
        if isinstance(last, BranchInstruction) and last.label_name:
            targets = [index[labels[last.label_name]]]
            if last.is_conditional:
                if following is None:
                    raise _falls_off(function)
                targets += following
            successors.append(targets)
        elif following is None:
            raise _falls_off(function)
        else:
            successors.append(following)
    return index[entry], bounds, successors


def _falls_off(function: _function.Function) -> ValueError:
    # PeachPy's own analysis fails here with an IndexError.
    return ValueError(f"function {function.name}: execution can run past the last instruction (no RETURN)")


def _propagate_avx_state(instructions: list, entry: int, bounds: list, successors: list) -> None:
    """Give LABEL, LOAD.ARGUMENT and RETURN the SSE/AVX state they are reached with.

    PeachPy's forward pass, for code without SSE instructions (the state is then True
    after an AVX instruction, None after VZEROUPPER/VZEROALL): a depth-first walk from
    the entry block that follows each control-flow edge once, carrying the state at the
    end of the block it leaves. A pseudo-instruction keeps the first True it is reached
    with and then counts as an AVX instruction itself. RETURN's state decides whether its
    epilogue starts with VZEROUPPER. (PeachPy's two backward passes only fill states
    still None from the code after an instruction, which for these functions can change
    no lowering: argument loads go to general-purpose registers.)
    """
    def run(block: int, state):
        start, end = bounds[block]
        for ins in instructions[start:end]:
            if isinstance(ins, (VZEROUPPER, VZEROALL)):
                state = None
            elif ins.avx_mode is None:
                if isinstance(ins, _STATE_TAKERS):
                    ins.avx_mode = state
            else:  # True: the scan let no SSE instruction (False) through
                state = True
        return state

    followed = [set() for _ in bounds]
    stack = [(entry, run(entry, None), iter(successors[entry]))]
    while stack:
        block, state, pending = stack[-1]
        for successor in pending:
            if successor not in followed[block]:
                followed[block].add(successor)
                stack.append((successor, run(successor, state), iter(successors[successor])))
                break
        else:
            stack.pop()


# -- ABI lowering ----------------------------------------------------------------------------
class _LeanABIFunction(_function.ABIFunction):
    """``ABIFunction`` on the function's own instruction list, without register allocation.

    Sets what PeachPy's ``__init__`` sets for a System V function with register arguments
    and no local variables, then runs PeachPy's argument and pseudo-instruction lowering
    (``PUSH``/``POP`` of the clobbered callee-saved registers, ``VZEROUPPER`` and ``RET``
    for each RETURN). Left out, as they only concern virtual registers: liveness
    analysis, the live-register limits check, register allocation and binding.
    """

    def __init__(self, function: _function.Function, abi, written: set[int]):  # noqa: D107
        # ABIFunction.__init__ is not called: it deep-copies and allocates registers.
        self.name = function.name
        self.arguments = [_function.Argument(argument, abi) for argument in function.arguments]
        self.result_type = function.result_type
        self.result_offset = None
        self.package = function.package
        self.target = function.target
        self.abi = abi
        self.c_signature = function.c_signature
        self.avx_environment = function.avx_environment
        self._avx_prolog = None  # used only to save xmm registers, which System V never does
        self._stack_base = rsp
        self._stack_frame_size = 0
        self._stack_frame_alignment = abi.stack_alignment
        self._local_variables_size = 0
        self._instructions = function._instructions
        self._setup_unix_arguments()
        self._update_argument_loads(function.arguments)
        self._clobbered_registers = sorted(r for r in abi.callee_save_registers if r.physical_id in written)
        self._update_stack_frame()
        self._update_argument_addresses()
        self._lower_argument_loads()
        self._lower_pseudoinstructions()
        # PeachPy's _filter_instruction_encodings is left out: Instruction.encode filters
        # again, and branch encodings have no accumulator forms to filter.


# -- encoding ----------------------------------------------------------------------------------
def _encode(instructions: list, abi, listing: bool = True) -> Assembled:
    """What PeachPy's ``EncodedFunction`` and ``ABIFunction.format`` make of the lowered
    instructions, on the list itself (PeachPy deep-copies it), asking each instruction for
    its constant once (PeachPy asks four times, through a generator with imports)."""
    constants = [_constant_of(ins) for ins in instructions]
    const, offsets = _layout_constants([c for c in constants if c is not None], abi)
    kinds = [_kind(ins) for ins in instructions]
    keys = _encode_once(instructions, kinds)
    _relax_branches(instructions, kinds)
    code, relocations = _link(instructions, constants, keys, offsets)
    return Assembled(code, const, relocations, _listing(instructions, keys) if listing else "")


def _layout_constants(constants: list, abi) -> tuple[bytes, dict]:
    """PeachPy's ``_layout_literal_constants``: each distinct value once, in order of first
    use, all of one size and alignment. Returns the section and the offset of each
    constant's name (its first use wins)."""
    offsets: dict = {}
    if not constants:
        return b"", offsets
    size = max(c.size for c in constants)
    alignment = max(c.alignment for c in constants)
    encoder = Encoder(abi.endianness)
    encoded: dict[tuple, bytes] = {}  # integer data -> bytes: kernels repeat their constants
    placed: dict[bytes, int] = {}
    content = bytearray()
    for constant in constants:
        data = constant.data
        key = (constant.size, constant.repeats, data) if all(type(x) is int for x in data) else None
        value = encoded.get(key) if key else None
        if value is None:
            value = bytes(constant.encode(encoder))
            if key:
                encoded[key] = value
        if value not in placed:
            if constant.size != size or constant.alignment != alignment:
                raise ValueError(f"constant {constant}: PeachPy lays out constants of one size and alignment only")
            placed[value] = len(content)
            content += value
        offsets.setdefault(constant.name, placed[value])
    return bytes(content), offsets


def _encode_once(instructions: list, kinds: list) -> list:
    """Set the bytes of the instructions that are not labels or branches, encoding each
    distinct one once; return their encoding keys (None for the rest).

    These instructions do not depend on their address (rip-relative constants are
    encoded with displacement 0 and get relocations). ``Instruction.encode`` is a function
    of the instruction's encoders and its operands' fields, both in :func:`_encoding_key`;
    a kernel repeats most of its instructions (one in six to ten is distinct), so the
    bytes of an equal key are reused. An instruction ``jit.asm`` shares is one object at
    all its places, keyed by the key it was shared under (class, indentation, operands
    as given), which no ``_encoding_key`` equals (those hold a tuple of encoders where it
    holds the indentation).
    """
    keys = []
    done: dict[tuple, bytes] = {}
    for ins, kind in zip(instructions, kinds):
        if kind is not None:
            keys.append(None)
            continue
        shared = ins.__dict__.get("_int8jit_shared")
        if shared is not None:
            # One object wherever jit.asm shares it, keyed by what it was built from; its
            # bytes (perhaps from an earlier kernel) are valid at any address.
            keys.append(shared)
            if ins.bytecode is None:
                ins.bytecode = bytearray(ins.encode())
            continue
        key = _encoding_key(ins)
        keys.append(key)
        if key is None:
            ins.bytecode = ins.encode()
            continue
        code = done.get(key)
        if code is None:
            code = done[key] = bytes(ins.encode())
        ins.bytecode = bytearray(code)  # its own copy: relocations zero constant displacements in place
    return keys


def _encoding_key(instruction) -> tuple | None:
    """Everything ``Instruction.encode`` reads, or None where an operand or encoder is of a
    kind this does not describe (the instruction is then encoded on its own).

    ``encode`` calls each encoder (``instruction.encodings``, filtered by the operands'
    register numbers) on the operands and keeps the first shortest result. An encoder is
    its code, its defaults and, for jit.vnni's, the values it closes over.
    """
    encoders = []
    for flags, encode in instruction.encodings:
        defaults, closure = encode.__defaults__, encode.__closure__
        if encode.__kwdefaults__ or defaults and not _atomic(defaults):
            return None
        cells = closure and tuple(cell.cell_contents for cell in closure)
        if cells and not _atomic(cells):
            return None
        encoders.append((flags, encode.__code__, defaults, cells))
    operands = []
    for operand in instruction.operands:
        key = _operand_key(operand)
        if key is None:
            return None
        operands.append(key)
    return type(instruction), tuple(encoders), tuple(operands)


def _atomic(values: tuple) -> bool:
    for value in values:
        if type(value) not in _ATOMIC:
            return False
    return True


def _operand_key(operand) -> tuple | None:
    """The fields of an operand the encoders read (register numbers and kinds, address
    parts, masks, broadcast, immediates); None for other operand kinds."""
    kind = type(operand)
    if kind is int:
        return (int, operand)
    if isinstance(operand, Register):
        return _register_key(operand)
    if kind is MemoryOperand:
        address = operand.address
        if type(address) is MemoryAddress:
            where = (_register_key(address.base), _register_key(address.index), address.scale, address.displacement)
        elif type(address) is RIPRelativeOffset:
            where = ("rip", address.offset)
        else:
            return None
        symbol = operand.symbol
        if symbol is not None and not isinstance(symbol, Constant):
            return None  # a local variable
        # Which constant does not matter: its rip-relative displacement is encoded as 0.
        mask = operand.mask and (_register_key(operand.mask.mask_register), operand.mask.is_zeroing)
        return (kind, operand.size, operand.broadcast, mask, where, symbol is not None)
    if kind is MaskedRegister:
        return (kind, _register_key(operand.register), _register_key(operand.mask.mask_register),
                operand.mask.is_zeroing)
    return None


def _register_key(register) -> tuple | None:
    return register and (type(register), register.mask, register.physical_id)


def _constant_of(instruction):
    """``Instruction.constant`` without its generator and imports."""
    for operand in instruction.operands:
        if type(operand) is MemoryOperand and isinstance(operand.symbol, Constant):
            return operand.symbol
    return None


def _kind(instruction) -> str | None:
    if isinstance(instruction, LABEL):
        return "label"
    if isinstance(instruction, BranchInstruction) and instruction.label_name:
        return "branch"
    return None


def _relax_branches(instructions: list, kinds: list) -> None:
    """PeachPy's branch relaxation: passes over the code until every label is placed and no
    branch had to grow from rel8 to rel32 (a grown branch stays long); a forward branch is
    encoded against the label's address from the pass before. The other instructions'
    sizes are fixed, so a pass only visits labels and branches, adding the bytes between."""
    points = []  # (index, instruction, label name or None for a LABEL, bytes since the previous point)
    gap = 0
    for i, (ins, kind) in enumerate(zip(instructions, kinds)):
        if kind is None:
            gap += len(ins.bytecode) if ins.bytecode else 0
        else:
            points.append((i, ins, ins.label_name if kind == "branch" else None, gap))
            gap = 0
    label_address = {}
    long_branches = set()
    changed = unresolved = True
    while changed or unresolved:
        address = 0
        changed = unresolved = False
        for i, ins, target_name, gap in points:
            address += gap
            if target_name is None:
                label_address[ins.identifier] = address
                continue
            target = label_address.get(target_name)
            unresolved |= target is None
            was_long = i in long_branches
            is_long, ins.bytecode = ins._encode_label_branch(address, target, long_encoding=was_long)
            if is_long and not was_long:
                long_branches.add(i)
                changed = True
            address += len(ins.bytecode) if ins.bytecode else 0


def _link(instructions: list, constants: list, keys: list, offsets: dict) -> tuple[bytes, tuple]:
    """The code, and a relocation (disp32 offset, program counter, constant offset) for each
    rip-relative constant, whose displacement is zeroed as PeachPy does. Where the
    displacement sits follows from the bytes, so it is found once per encoding key."""
    content = []
    relocations = []
    size = 0
    places: dict[tuple, tuple[int, int]] = {}
    for ins, constant, key in zip(instructions, constants, keys):
        if constant is not None:
            place = places.get(key) if key is not None else None
            if place is None:
                relocation = ins.relocation  # PeachPy finds the ModR/M byte in the bytes
                place = (relocation.offset, relocation.program_counter)
                if key is not None:
                    places[key] = place
            offset, end = place
            ins.bytecode[offset:offset + 4] = bytes(4)
            relocations.append((size + offset, size + end, offsets[constant.name]))
        if ins.bytecode:
            content.append(ins.bytecode)
            size += len(ins.bytecode)
    return bytes(bytearray().join(content)), tuple(relocations)


def _listing(instructions: list, keys: list) -> str:
    """``ABIFunction.format()``: each instruction's PeachPy-syntax line.

    An instruction with an encoding key prints what its key's fields print (mnemonic,
    registers, address parts, immediates), so its line is reused for an equal key at the
    same indentation; a masked register prints as its object's address and is never reused.
    """
    lines = []
    done: dict[tuple, str] = {}
    shared: dict[int, str] = {}  # an instruction jit.asm shares prints the same line at every place
    for number, (ins, key) in enumerate(zip(instructions, keys), start=1):
        line = shared.get(id(ins))
        if line is not None:
            lines.append(line)
            continue
        if getattr(ins, "_int8jit_shared", False):
            line = shared[id(ins)] = ins.format("peachpy", indent=True, line_number=number)
            lines.append(line)
            continue
        if key is None or any(type(operand) is MaskedRegister for operand in ins.operands):
            lines.append(ins.format("peachpy", indent=True, line_number=number))
            continue
        key = (key, ins.name, ins._indent_level)
        line = done.get(key)
        if line is None:
            line = done[key] = ins.format("peachpy", indent=True, line_number=number)
        lines.append(line)
    return os.linesep.join(lines)
