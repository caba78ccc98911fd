"""Base classes of every primitive: a descriptor that validates and chooses, a primitive that runs.

A :class:`PrimitiveDesc` subclass validates its descriptors and attributes in its
constructor (raising errors that name the offending argument), chooses an
implementation, records its memory descriptors with :meth:`PrimitiveDesc._set_desc`
(or overrides the queries) and builds its :class:`Primitive` in
``_create_primitive()``. :meth:`PrimitiveDesc.create` goes through the primitive
cache, so an identical descriptor (same :meth:`PrimitiveDesc.key`) returns the same
primitive object, kernels included.

A :class:`Primitive` subclass implements ``_execute(mem, scratchpad)``, which may
return a :class:`~primitives.replay.Replay` so that a repeated call with the same arrays (or new ones laid
out alike: :meth:`Replay.moves`) skips the checks and the set-up; on a user scratchpad,
one that writes back what its set-up left there (:func:`~primitives.replay.restoring`), since other
primitives may set up in it between two calls. Before it, :meth:`Primitive.execute` has

* checked that ``args`` holds every argument the descriptor needs (:meth:`PrimitiveDesc.exec_arg_names`)
  and nothing else, naming the missing or unexpected one,
* wrapped each ndarray in a :class:`~primitives.memory.Memory` (no copy) checked
  against the descriptor's query for that name, and each output checked writable and
  apart from every other argument (:func:`~primitives.checks.check_disjoint`: no
  primitive runs in place),
* turned ``scales:<arg>`` / ``zero_points:<arg>`` into contiguous f32 / s32 arrays of
  exactly the count the attribute's mask asks for (:func:`~primitives.attr.check_scales`),
* found the scratchpad: with scratchpad mode ``user``, ``args["scratchpad"]`` must
  hold at least ``scratchpad_desc().nbytes`` bytes; with ``library`` the primitive
  allocates one buffer per thread and argument set (:func:`slot_key`: a network's
  layers of one shape share the primitive), once, so one primitive may run on several
  threads at once. ``_execute`` gets it as a flat ``uint8`` array of exactly the bytes asked
  for, or ``None`` when the descriptor needs none.

It then times the call and prints a verbose line (``INT8JIT_VERBOSE``).

Example, a primitive that adds one to a u8 tensor::

    >>> import numpy as np
    >>> from primitives.memory import desc
    >>> class AddOneDesc(PrimitiveDesc):
    ...     kind = "add_one"
    ...     def __init__(self, src_md, attr=None):
    ...         super().__init__(attr)
    ...         self._set_desc("src", src_md)
    ...         self._set_desc("dst", src_md)
    ...     def _create_primitive(self):
    ...         return AddOne(self)
    >>> class AddOne(Primitive):
    ...     def _execute(self, mem, scratchpad):
    ...         np.add(mem["src"].array, 1, out=mem["dst"].array)
    >>> pd = AddOneDesc(desc((2, 3), "u8", "ab"))
    >>> prim = pd.create()
    >>> dst = np.zeros((2, 3), np.uint8)
    >>> prim.execute({"src": np.full((2, 3), 41, np.uint8), "dst": dst})
    >>> int(dst[1, 2]), pd.create() is prim
    (42, True)
    >>> prim.execute({"src": dst})
    Traceback (most recent call last):
    ...
    ValueError: args: missing argument 'dst' (u8:ab:2x3) for add_one; it takes dst, src
"""
from __future__ import annotations

import functools
import threading
import time
import weakref
from typing import Any, Callable, Hashable, Mapping

import numpy as np

from primitives import primitive_cache, verbose
from primitives.attr import (BIAS, DST, SCRATCHPAD, SRC, WEIGHTS, Attr, check_scales,
                             check_zero_points, expected_count)
from primitives.checks import check_disjoint, check_known_dims
from primitives.memory import Memory, MemoryDesc, aligned_zeros, as_memory, bytes_desc, identity_tag
from primitives.replay import Replay, guard_code
from runtime.ffi import unowned
from runtime.isa import planning_isa
from runtime.pool import prepare_single_runs
from runtime.settings import stamp as settings_stamp
from runtime.threads import resolve_threads

_TENSOR_ARGS = (SRC, WEIGHTS, BIAS, DST)
# Argument sets a thread keeps set up per primitive: identical descriptors share one
# primitive (the primitive cache), so a network's layers of one shape call it in turn,
# each with its own arrays: up to 6 in ResNet-50, 48 in BERT-base (four 768->768
# linears in each of 12 layers). Past this many, sets take turns being set up again.
_SLOTS = 64
_S32 = (-(2 ** 31), 2 ** 31 - 1)


class PrimitiveDesc:
    """What a primitive computes and how: descriptors, attributes, ISA and the chosen implementation.

    Subclasses set ``kind`` (``"matmul"``, ...), call ``super().__init__(attr, isa)``,
    and implement ``_create_primitive()`` (or set ``primitive_class``). Anything that
    changes what the primitive computes but is not a query'd descriptor, the attributes
    or the ISA must be returned by ``_key_extra()``, or the cache would confuse two
    different descriptors; set ``cacheable = False`` to bypass the cache.
    """

    kind: str = "primitive"
    cacheable: bool = True
    primitive_class: type | None = None
    attr: Attr
    isa: str | None = None
    scratchpad_nbytes: int = 0  # bytes of scratchpad the implementation needs
    empty: str | None = None  # why the primitive has nothing to compute (set_empty), or None

    def __init__(self, attr: Attr | None = None, isa: str | None = None) -> None:
        if attr is None:
            attr = Attr()
        elif not isinstance(attr, Attr):
            raise TypeError(f"attr: expected an Attr or None, got {type(attr).__name__}")
        # A copy, as oneDNN does: the caller may change or reuse its Attr afterwards.
        self.attr = attr.copy()
        self.isa = isa
        self._descs: dict[str, MemoryDesc] = {}
        self.create_ms: float | None = None

    # -- descriptors --------------------------------------------------------------------
    def _set_desc(self, name: str, md: MemoryDesc | None) -> None:
        """Record the (concrete) descriptor of argument ``name`` for the queries."""
        if md is not None and not isinstance(md, MemoryDesc):
            raise TypeError(f"{name}: expected a MemoryDesc, got {type(md).__name__}")
        if md is None:
            self._descs.pop(name, None)
        else:
            self._descs[name] = md

    def _desc(self, name: str) -> MemoryDesc | None:
        return getattr(self, "_descs", {}).get(name)

    def src_desc(self) -> MemoryDesc | None:
        return self._desc(SRC)

    def weights_desc(self) -> MemoryDesc | None:
        return self._desc(WEIGHTS)

    def bias_desc(self) -> MemoryDesc | None:
        return self._desc(BIAS)

    def dst_desc(self) -> MemoryDesc | None:
        return self._desc(DST)

    def scratchpad_desc(self) -> MemoryDesc:
        """The scratchpad's size as a 1-D ``u8`` descriptor (``dims == (0,)`` when none is needed).

        Unlike oneDNN, this reports the bytes needed in both scratchpad modes; in
        ``library`` mode they are what each executing thread holds.
        """
        return bytes_desc(int(self.scratchpad_nbytes))

    def _attr(self) -> Attr:
        return getattr(self, "attr", None) or Attr()

    def query(self, name: str) -> MemoryDesc | None:
        """The descriptor of an execute argument, by name (``"src"``, ``"post_op:0:src_1"``...)."""
        if name == SRC:
            return self.src_desc()
        if name == WEIGHTS:
            return self.weights_desc()
        if name == BIAS:
            return self.bias_desc()
        if name == DST:
            return self.dst_desc()
        if name == SCRATCHPAD:
            return self.scratchpad_desc()
        attr = self._attr()
        binary = attr.post_ops.binary_args()
        if name in binary:
            return binary[name]
        kind, _, arg = name.partition(":")
        table = attr.scales if kind == "scales" else attr.zero_points if kind == "zero_points" else {}
        if arg in table:
            md = self.query(arg)
            if md is not None:
                return MemoryDesc((expected_count(table[arg], md.dims),), "f32" if kind == "scales" else "s32", "a")
        return self._desc(name)

    # -- execute arguments -----------------------------------------------------------------
    def exec_arg_names(self) -> tuple[str, ...]:
        """The arguments ``execute`` requires (scratchpad aside).

        Default: src, weights, bias, dst where the query is not None, each scales and
        zero-points argument the attributes ask for, and each binary post-op operand.
        """
        names = [n for n in _TENSOR_ARGS if self.query(n) is not None]
        attr = self._attr()
        names += [f"scales:{a}" for a in attr.scales]
        names += [f"zero_points:{a}" for a in attr.zero_points]
        names += list(attr.post_ops.binary_args())
        return tuple(names)

    def optional_arg_names(self) -> tuple[str, ...]:
        """Arguments ``execute`` accepts but does not require (none by default)."""
        return ()

    def output_names(self) -> tuple[str, ...]:
        """Arguments written by ``execute`` (checked writable)."""
        return (DST,)

    def zero_point_range(self, arg: str) -> tuple[int, int]:
        """Allowed zero points of ``arg`` (s32 by default)."""
        return _S32

    def set_empty(self, descs: Mapping[str, MemoryDesc | None], why: str) -> None:
        """A zero-volume problem, as oneDNN takes one: record ``descs`` (an ``any`` tag
        becomes the row-major one: there is nothing to pack), ask for no scratchpad, and
        let ``create()`` give an :class:`EmptyPrimitive`, which checks its arguments and
        writes nothing. Call it after every check of the descriptors and attributes."""
        self.set_plain_descs(descs)
        self.scratchpad_nbytes = 0
        self.empty = why

    def set_plain_descs(self, descs: Mapping[str, MemoryDesc | None]) -> None:
        """Record ``descs``, an ``any`` tag made the row-major one."""
        for name, md in descs.items():
            if md is not None and md.is_any:
                md = md.with_tag(identity_tag(md.ndims))
            self._set_desc(name, md)

    # -- implementation -----------------------------------------------------------------
    def impl_info(self) -> dict[str, Any]:
        """Which implementation was chosen and why (:meth:`empty_info` for a zero-volume
        problem, else the subclass's :meth:`_impl_info`)."""
        return self.empty_info() if self.empty is not None else self._impl_info()

    def _impl_info(self) -> dict[str, Any]:
        """The implementation's details; subclasses add theirs."""
        return {"kind": self.kind, "impl": type(self).__name__, "isa": self.isa}

    def runs_isa(self) -> str | None:
        """The ISA path whose machine code the primitive runs, or ``"any"`` (oneDNN's
        word for an implementation with none) where it runs none: a zero-volume problem,
        a numpy reorder. ``isa`` stays the path it planned for (a cache key)."""
        return "any" if self.empty is not None else self.isa

    def empty_info(self) -> dict[str, Any]:
        """``impl_info()`` of a zero-volume descriptor (see :meth:`set_empty`)."""
        return {"kind": self.kind, "impl": "zero_volume", "isa": self.runs_isa(), "exact": True,
                "decision": self.empty}

    def impl_name(self) -> str:
        info = self.impl_info() or {}
        for k in ("impl", "name", "kernel"):
            if info.get(k):
                return str(info[k])
        return type(self).__name__

    def _verbose_desc(self) -> str:
        """The descs field of verbose lines; override to add the problem's own terms."""
        parts = []
        for name in _TENSOR_ARGS:
            md = self.query(name)
            if md is not None:
                parts.append(f"{name}:{md.verbose_str()}")
        return " ".join(parts)

    # -- caching and creation ---------------------------------------------------------
    def _key_extra(self) -> Hashable:
        """Whatever else distinguishes two descriptors of this class (none by default)."""
        return ()

    def key(self) -> tuple:
        """Hashable identity: class, kind, the queried descriptors, attributes, ISA, thread
        count (a primitive splits its work when it is created), extras."""
        cls = type(self)
        descs = tuple((n, self.query(n)) for n in _TENSOR_ARGS)
        return (cls.__module__, cls.__qualname__, self.kind, descs, self.scratchpad_desc(),
                self._attr().key(), self.isa, getattr(self, "threads", None), self._key_extra())

    def _create_primitive(self) -> "Primitive":
        if self.primitive_class is None:
            raise NotImplementedError(f"{type(self).__name__} implements neither _create_primitive() "
                                      "nor primitive_class")
        return self.primitive_class(self)

    def _build(self) -> "Primitive":
        prim = EmptyPrimitive(self) if self.empty is not None else self._create_primitive()
        if not isinstance(prim, Primitive):
            raise TypeError(f"{type(self).__name__}._create_primitive() returned {type(prim).__name__}, "
                            "expected a Primitive")
        if getattr(prim, "pd", None) is None:
            prim.pd = self
        return prim

    def create(self) -> "Primitive":
        """The primitive for this descriptor: from the primitive cache when an identical one exists."""
        t0 = time.perf_counter()
        prepare_single_runs()
        if self.cacheable:
            prim, _hit = primitive_cache.get_or_create(self.key(), self._build)
        else:
            prim = self._build()
        self.create_ms = (time.perf_counter() - t0) * 1e3
        if verbose.enabled("create"):
            verbose.create(self.kind, self.impl_name(), self.runs_isa(), self._verbose_desc(),
                           self._attr().verbose_str(), self.create_ms)
        return prim

    primitive = create

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind} {self.impl_name()} isa={self.runs_isa()} {self._verbose_desc()}>"


def check_descs(required: Mapping[str, Any], optional: Mapping[str, Any] | None = None) -> None:
    """A descriptor constructor's first check: each argument is a MemoryDesc (``optional``
    ones may be None) with every dim known, or an error naming it."""
    for name, md in required.items():
        if not isinstance(md, MemoryDesc):
            raise TypeError(f"{name}: expected a MemoryDesc, got {type(md).__name__}")
        check_known_dims(name, md)
    for name, md in (optional or {}).items():
        if md is not None and not isinstance(md, MemoryDesc):
            raise TypeError(f"{name}: expected a MemoryDesc or None, got {type(md).__name__}")
        if md is not None:
            check_known_dims(name, md)


class Primitive:
    """An executable primitive; subclasses implement ``_execute(mem, scratchpad)``."""

    # Whether the replays ``_execute`` returns on a user scratchpad write back what their
    # set-up left there (:func:`~primitives.replay.restoring`): then the argument sets that share it keep
    # their replays; else a call that sets up there forgets them all.
    restores_scratchpad = False

    def __init__(self, pd: PrimitiveDesc) -> None:
        if not isinstance(pd, PrimitiveDesc):
            raise TypeError(f"pd: expected a PrimitiveDesc, got {type(pd).__name__}")
        self.pd = pd
        # Per executing thread: its argument sets' slots (library scratchpad and replay).
        self._local = threading.local()
        # (a user scratchpad's address, an argument set's slot key) -> the token of the
        # replay whose set-up (or move) last pointed the state kept for them at its arrays:
        # see _claim.
        self._owners: dict = {}
        self.last_exec_ms: float | None = None
        guard_code()  # (made now, not at a first execution: its replay's guard, see primitives.replay)

    @property
    def kind(self) -> str:
        return self.pd.kind

    def _verbose_desc(self) -> str:
        return self.pd._verbose_desc()

    def _execute(self, mem: dict[str, Memory], scratchpad: np.ndarray | None) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not implement _execute")

    # -- argument handling ------------------------------------------------------------
    def _spec(self) -> "_ArgSpec":
        # A descriptor's arguments never change: work them out once, not per execute().
        spec = getattr(self, "_arg_spec", None)
        if spec is None:
            spec = self._arg_spec = _ArgSpec(self.pd)
        return spec

    def _convert(self, name: str, value: Any, spec: "_ArgSpec") -> Memory:
        quant = spec.quant.get(name)
        if quant is None:
            return as_memory(value, name, spec.descs.get(name))
        md, mask, dims, bounds = quant
        values = value.array if isinstance(value, Memory) else value
        if bounds is None:
            checked = check_scales(name, values, mask, dims)
        else:
            checked = check_zero_points(name, values, mask, dims, *bounds)
        return Memory(md, checked, name=name)

    def _scratchpad(self, args: Mapping[str, Any], spec: "_ArgSpec", slot: "_Slot | None" = None) -> np.ndarray | None:
        need = spec.scratch_need
        if spec.user_scratchpad:
            if SCRATCHPAD not in args:
                if need == 0:
                    return None
                raise ValueError(f"args: missing argument 'scratchpad' ({need} bytes, scratchpad_mode 'user') "
                                 f"for {spec.kind}")
            buf = args[SCRATCHPAD]
            array = buf.array if isinstance(buf, Memory) else buf
            if not isinstance(array, np.ndarray):
                raise TypeError(f"scratchpad: expected a Memory or a numpy array, got {type(buf).__name__}")
            if array.dtype.hasobject:
                raise TypeError(f"scratchpad: expected a buffer of bytes (a numeric dtype), got dtype {array.dtype}")
            if not array.flags.c_contiguous:
                raise ValueError(f"scratchpad: expected a contiguous buffer, got strides {array.strides}")
            if not array.flags.writeable:
                raise ValueError("scratchpad: the buffer is read-only; the primitive writes to it")
            if array.nbytes < need:
                raise ValueError(f"scratchpad: buffer of {array.nbytes} bytes is smaller than the {need} bytes "
                                 f"scratchpad_desc() asks for")
            return None if need == 0 else array.reshape(-1).view(np.uint8)[:need]
        if SCRATCHPAD in args:
            raise ValueError("scratchpad: passed to a primitive whose scratchpad_mode is 'library'; "
                             "pass none, or create it with Attr(scratchpad_mode='user')")
        if need == 0:
            return None
        slot = slot or self._slot(args)
        if slot.scratchpad is None:
            # Once per thread, primitive and argument set: concurrent executions never
            # share one, and each set's replay finds its own set-up where it left it.
            slot.scratchpad = aligned_zeros(need, np.uint8)
            self._scratchpad_gone(slot.scratchpad.ctypes.data)  # (a freed one's address, reused)
            # What the primitive keeps about it (views, what was written) goes with the slot,
            # also when its thread ends: it had been kept, and the scratchpad with it.
            weakref.finalize(slot, _forget_scratchpad, weakref.ref(self), slot.scratchpad.ctypes.data)
        return slot.scratchpad

    def _slot(self, args: Mapping[str, Any], create: bool = True) -> "_Slot | None":
        """This thread's slot for the argument set ``args`` belongs to (a replay still
        checks every argument). At most ``_SLOTS``: a new one retires the oldest."""
        slots = getattr(self._local, "slots", None)
        if slots is None:
            if not create:
                return None
            slots = self._local.slots = {}
        if not create:
            return slots.get(slot_key(args))
        return keyed_slot(slots, slot_key(args), _Slot, self._retire)

    def _retire(self, slot: "_Slot") -> None:
        if slot.scratchpad is not None:
            self._scratchpad_gone(slot.scratchpad.ctypes.data)

    def _scratchpad_gone(self, address: int) -> None:
        """The library scratchpad at ``address`` is let go, or a new one starts there:
        forget whatever was kept about its contents (subclasses that skip rewriting
        unchanged values in a scratchpad keep such records)."""

    def _replay_for(self, args: Mapping[str, Any]) -> "Replay | None":
        """The replay this thread keeps for ``args``' argument set, if any."""
        slot = self._slot(args, create=False)
        return None if slot is None else slot.replay

    def execute(self, args: Mapping[str, Memory | np.ndarray]) -> None:
        """Run the primitive on ``args`` (name -> Memory or numpy array); see the module docstring."""
        quiet = verbose.exec_quiet()
        if type(args) is dict:
            local = self._local
            # This thread's last replay first: a network calls a layer with one argument
            # set, and finding its slot costs about as much as the test (Zen 4: a 1x16x4
            # inner product's execute 2.2-2.4 -> 1.8-2.0 us, the fc at batch 1 -0.3-0.8 us).
            last = getattr(local, "last", None)
            if last is not None and quiet and (last.matches(args) or last.moves(args)):
                last.run()
                return
            slot = self._slot(args, create=False)
            if slot is not None:
                replay = slot.replay
                if replay is not None and quiet and (replay.matches(args) or replay is not last and replay.moves(args)):
                    local.last = replay
                    replay.run()  # the same arrays as this set's last call on this thread (or moved: new ones)
                    return
                slot.replay = None  # the set-up below rewrites this set's scratchpad
        self._full(args, quiet)

    def bind(self, args: dict[str, Memory | np.ndarray]) -> Callable[[], None]:
        """``execute(args)`` made ready to run again and again: the arguments are checked
        and the kernels set up once, here (one execution runs), and the returned call
        runs the kernel calls (and any copies they need) alone, on whatever the arrays
        then hold, with no checks: about 1 us of Python a call, cold or hot.

        The call keeps the scales, zero points and bias as they were here (bind again
        after changing them), has a library scratchpad of its own, holds the arrays (they
        live as long as the call), and is for one thread at a time; the arrays must stay
        as they are (no in-place reshape or retype). Packed weights that a reorder has
        written anew since are set up for again, as ``bind`` would (their compensation, and
        without VNNI their kernel, follow the values).
        Where a primitive cannot run ``args`` without setting up again (an argument it
        had to copy, a user scratchpad) or without a test at every call (a convolution's
        plain weights), the call is ``execute(args)`` itself.

        Example::

            >>> import numpy as np
            >>> from primitives.matmul import InnerProductDesc
            >>> from primitives.memory import desc
            >>> ip = InnerProductDesc(desc((2, 8), "u8", "ab"), desc((3, 8), "s8", "ab"),
            ...                       desc((2, 3), "s32", "ab")).create()
            >>> x, w, y = np.ones((2, 8), np.uint8), np.ones((3, 8), np.int8), np.zeros((2, 3), np.int32)
            >>> run = ip.bind({"src": x, "weights": w, "dst": y})
            >>> x[...] = 2
            >>> run()
            >>> y.tolist()
            [[16, 16, 16], [16, 16, 16]]
        """
        if type(args) is not dict:
            raise TypeError(f"args: expected a dict of argument name -> Memory or numpy array, "
                            f"got {type(args).__name__}")
        args = dict(args)  # the set bound: later changes to the caller's dict do not count
        bound, replayed = self._bound(args)
        packed = [m for m in args.values() if type(m) is Memory and m.desc.is_packed]
        return self._rebinding(bound, args, packed) if packed and replayed else bound

    def _bound(self, args: dict) -> tuple[Callable[[], None], bool]:
        """:meth:`bind`'s call for ``args`` (executed once here), and whether it replays
        (else it is ``execute(args)``)."""
        spec, slot = self._spec(), _Slot()
        shared = spec.user_scratchpad and spec.scratch_need  # the caller's: others may set up there
        replay = self._full(args, verbose.exec_quiet(), slot)  # (a scratchpad it makes goes with the slot)
        if replay is None or shared or replay.check is not None:  # (check: a test at every call)
            return functools.partial(self.execute, args), False  # (verbose: each call prints its line)
        bound = functools.partial(replay.run)
        bound.arrays = args  # (its kernels run on them with no test: they live as long as the call)
        bound.slot = slot  # its scratchpad lives as long as the call
        # So do the primitive and its kernels: the replay's call lists hold bare function
        # pointers, and jit.cache.clear_memory() lets a dropped primitive's code be unmapped.
        bound.primitive = self
        return bound, True

    def _rebinding(self, bound: Callable[[], None], args: dict, packed: list) -> Callable[[], None]:
        """``bound``, bound again where a reorder has written new weights into one of the
        ``packed`` memories since (a new payload: its compensation, even its kernel's
        layout, may differ; the old set-up would mix them with the new bytes)."""
        state = [bound, [m.payload for m in packed]]

        def run() -> None:
            if any(m.payload is not p for m, p in zip(packed, state[1])):
                state[1] = [m.payload for m in packed]
                state[0] = self._bound(args)[0]  # (which runs the call once)
                run.func = state[0].func
                return
            state[0]()
        run.arrays, run.state, run.func = args, state, bound.func  # (func: what it runs, as a partial says)
        return run

    def _full(self, args: Mapping, quiet: bool, slot: "_Slot | None" = None) -> "Replay | None":
        """The checked path of ``execute``; returns the replay it recorded (in ``slot``,
        or in this thread's slot for ``args``), if any."""
        spec = self._spec()
        self._local.last = None  # (a replay of this thread's slots only, never one a set-up may have left stale)
        if spec.user_scratchpad and spec.scratch_need and not self.restores_scratchpad:
            self._forget_replays()  # argument sets may share the caller's scratchpad
        mem = spec.fast(args) if quiet else None
        if mem is not None:  # dense arrays of exactly the expected shapes: checked already
            check_disjoint(mem, spec.outputs, spec.kind, args.get(SCRATCHPAD))
            scratchpad = self._scratchpad(args, spec, slot)
            return self._remember(self._execute(_unowned(mem, spec), scratchpad), args, mem, spec, slot, scratchpad)
        if not isinstance(args, Mapping):
            raise TypeError(f"args: expected a dict of argument name -> Memory or numpy array, "
                            f"got {type(args).__name__}")
        for name in args:
            if name not in spec.accepted and name != SCRATCHPAD:
                if not isinstance(name, str):
                    raise TypeError(f"args: argument names are strings such as 'src', got {name!r}")
                raise ValueError(f"args: unexpected argument {name!r} for {spec.kind}; it takes {spec.listing}")
        for name in spec.required:
            if name not in args:
                md = spec.descs.get(name)
                what = f" ({md})" if md is not None else ""
                raise ValueError(f"args: missing argument {name!r}{what} for {spec.kind}; it takes {spec.listing}")
        mem = {name: self._convert(name, value, spec) for name, value in args.items() if name != SCRATCHPAD}
        for name in spec.outputs:
            if name in mem and not mem[name].array.flags.writeable:
                raise ValueError(f"{name}: the array is read-only but the primitive writes to it")
        check_disjoint(mem, spec.outputs, spec.kind, args.get(SCRATCHPAD))
        scratchpad = self._scratchpad(args, spec, slot)
        t0 = time.perf_counter()
        replay = self._execute(_unowned(mem, spec), scratchpad)
        ms = (time.perf_counter() - t0) * 1e3
        self.last_exec_ms = ms
        if quiet:
            return self._remember(replay, args, mem, spec, slot, scratchpad)
        pd = self.pd
        verbose.execution(pd.kind, pd.impl_name(), pd.runs_isa(), self._verbose_desc(), pd._attr().verbose_str(), ms)
        return None

    def _remember(self, replay: "Replay | None", args: Mapping, mem: dict, spec: "_ArgSpec",
                  slot: "_Slot | None" = None, scratchpad: np.ndarray | None = None) -> "Replay | None":
        if isinstance(replay, Replay) and type(args) is dict and replay.record(args, mem, spec):
            if spec.user_scratchpad and scratchpad is not None:
                replay.claim(self._claim(scratchpad, args))
            (slot or self._slot(args)).replay = replay
            if slot is None:  # (a bound call's slot is its own: execute never runs its replay)
                self._local.last = replay
            return replay
        return None

    def _claim(self, scratchpad: np.ndarray, args: dict) -> Callable[[], bool]:
        """Make the replay of this set-up on the user's ``scratchpad`` the one that may run
        there; returns the test that it still is. A primitive keeps, per scratchpad address
        and argument set (its packed weights, :func:`slot_key`), state that a set-up points
        at its arrays (a convolution's or matmul's plans and structs). A user scratchpad
        can serve several threads in turn, each with replays of its own, so another
        thread's set-up there leaves this thread's replay pointing at that thread's arrays
        (it ran on them: wrong results, and writes into another call's dst). With the test
        such a replay takes the full path instead. A library scratchpad is the thread's
        own, so its replays need none."""
        key = (scratchpad.__array_interface__["data"][0], slot_key(args))
        owners = self._owners
        owners.pop(key, None)  # (a new token, at the newest end)
        # (a new scratchpad at every call: not all kept; a dropped key's replays set up again)
        token = keyed_slot(owners, key, object)
        return lambda: owners.get(key) is token

    def _forget_replays(self) -> None:
        self._local.last = None
        for slot in getattr(self._local, "slots", {}).values():
            slot.replay = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self.pd!r}>"


class EmptyPrimitive(Primitive):
    """The primitive of a zero-volume descriptor: ``execute`` checks the arguments as
    every primitive's does (shapes, types, scales, zero points), then writes nothing."""

    def _execute(self, mem: dict[str, Memory], scratchpad: np.ndarray | None) -> "Replay":
        return Replay(_nothing)


def _nothing() -> None:
    pass


def slot_key(args: Mapping[str, Any]) -> int | None:
    """Which slot an argument set takes: its packed weights' identity (a network's layer:
    its constant weights, packed once), or None, one slot shared by every other set
    (runtime weights, none). A slot holds a scratchpad and a replay, so a caller that
    passes new arrays on every call must not leave one set behind per call."""
    weights = args.get(WEIGHTS)
    return id(weights) if type(weights) is Memory and weights.desc.is_packed else None


def keyed_slot(table: dict, key: Hashable, make: Callable[[], Any], retire: Callable[[Any], None] | None = None):
    """``table[key]`` (a thread's argument sets, :func:`slot_key`), made by ``make()`` on a
    miss: at most ``_SLOTS`` entries, a new one retiring the oldest (``retire(entry)``)."""
    entry = table.get(key)
    if entry is None:
        if len(table) >= _SLOTS:
            gone = table.pop(next(iter(table)))
            if retire is not None:
                retire(gone)
        entry = table[key] = make()
    return entry


_KEPT_SETUPS = threading.local()  # per thread: kind -> {signature: set-up}, least recently used first


def kept_setups(kind: str) -> dict:
    """This thread's kept set-ups of ``kind`` (:func:`kept_setup`), least recently used first."""
    kinds = _KEPT_SETUPS.__dict__
    table = kinds.get(kind)  # (not setdefault: its default dict would be made at every call)
    if table is None:
        table = kinds[kind] = {}
    return table


_FORCED: dict = {}  # (isa, threads) -> (runtime.settings.stamp(), in_force's answer)


def in_force(isa, threads) -> tuple:
    """The ISA path and thread count a descriptor made now takes from its ``isa`` and
    ``threads`` arguments (the environment's cap and count where they are None; as given
    where they are no name or count, which the descriptor refuses): a kept set-up's key
    holds them, so a changed ``INT8JIT_MAX_ISA`` or thread count makes a new one. An
    answer is kept while the settings' stamp stays (0.6-0.85 -> 0.3 us a call)."""
    now = settings_stamp()
    try:
        seen = _FORCED.get((isa, threads))
    except TypeError:  # (not hashable: the descriptor says what is wrong with it)
        seen = None
    if seen is not None and seen[0] == now:
        return seen[1]
    answer = (planning_isa(isa) if isinstance(isa, (str, type(None))) else isa,
              resolve_threads(threads) if isinstance(threads, (int, type(None))) else threads)
    if seen is not None or len(_FORCED) < 64:  # (a few argument pairs in practice; bounded anyway)
        try:
            _FORCED[(isa, threads)] = (now, answer)
        except TypeError:
            pass
    return answer


def kept_setup(kind: str, key, make: Callable[[], Any], size: int = _SLOTS):
    """What a numpy-style function (``quantize``, ``pool2d``, the one-off GEMM) set up for
    a call of signature ``key`` (its primitive or GEMM, how it takes the arrays), kept per
    thread and ``kind`` (at most ``size``, the least recently used dropped): ``make()`` on
    a miss, and each time for a key that cannot be hashed. The primitive then replays,
    or moves to the call's new arrays."""
    table = kept_setups(kind)
    try:
        entry = table.pop(key, None)  # (put back last: the least recently used goes first)
        if entry is None:
            hash(key)  # (an empty table's pop hashes nothing)
    except TypeError:  # (an argument that is not hashable: make() says what is wrong with it)
        return make()
    if entry is None:
        entry = make()
        if len(table) >= size:
            table.pop(next(iter(table)))
    table[key] = entry
    return entry


def _unowned(mem: dict, spec: "_ArgSpec") -> dict:
    """``mem`` as ``_execute`` gets it: the caller's arrays (not packed weights) as
    arrays over the same memory that do not keep them alive (:func:`runtime.ffi.unowned`),
    so that nothing a set-up leaves behind (plans, closures, a replay) holds the caller's
    memory once the caller lets it go. About 1 us an array, at set-up only."""
    out = {}
    for name, m in mem.items():
        if m.payload is None and not m.desc.is_packed:
            m = Memory.trusted(m.desc, unowned(m.array))
        out[name] = m
    return out


def _forget_scratchpad(owner: "weakref.ref[Primitive]", address: int) -> None:
    """A slot's finalizer: its primitive (if alive) forgets the scratchpad at ``address``."""
    primitive = owner()
    if primitive is not None:
        primitive._scratchpad_gone(address)


class _Slot:
    """One argument set's library scratchpad and replay, on one thread."""

    __slots__ = ("scratchpad", "replay", "__weakref__")

    def __init__(self) -> None:
        self.scratchpad: np.ndarray | None = None
        self.replay: Replay | None = None


class _ArgSpec:
    """What execute() checks, taken from a descriptor once.

    :meth:`fast` is the hot path: when every argument is a writable-where-needed, C-contiguous
    ndarray of exactly the descriptor's physical shape and dtype (scales finite, zero
    points in range), or a packed Memory of the descriptor, the checks are done in a few
    comparisons and the arrays wrapped without more; anything else takes the general path,
    which names what is wrong.
    """

    def __init__(self, pd: PrimitiveDesc) -> None:
        self.kind = pd.kind
        self.required = tuple(pd.exec_arg_names())
        optional = tuple(n for n in pd.optional_arg_names() if n not in self.required)
        self.accepted = frozenset(self.required + optional)
        self.listing = ", ".join(sorted(self.accepted)) or "no arguments"
        self.descs = {name: pd.query(name) for name in self.accepted}
        self.outputs = tuple(pd.output_names())
        attr = pd._attr()
        self.user_scratchpad = attr.scratchpad_mode == "user"
        self.scratch_need = pd.scratchpad_desc().nbytes
        # name -> (desc of the checked values, mask, dims of the argument, zero-point bounds or None)
        self.quant: dict[str, tuple] = {}
        for kind, table in (("scales", attr.scales), ("zero_points", attr.zero_points)):
            for arg, mask in table.items():
                name = f"{kind}:{arg}"
                if name not in self.accepted:
                    continue
                md = self.descs[arg] if arg in self.descs else pd.query(arg)  # (queried above: a new desc each time)
                if md is None:
                    continue
                bounds = None if kind == "scales" else tuple(pd.zero_point_range(arg))
                self.quant[name] = (self.descs[name], mask, md.dims, bounds)

    def fast(self, args) -> dict | None:
        if type(args) is not dict:
            return None
        table = self._fast_table()
        mem = {}
        n = 0
        for name, value in args.items():
            if name == SCRATCHPAD:
                continue
            want = table.get(name)
            if want is None:
                return None
            shape, dtype, kind, md, lo, hi = want
            if type(value) is np.ndarray:
                if value.shape != shape or value.dtype != dtype or not value.flags.c_contiguous:
                    return None
                if kind == "scales" and not np.isfinite(value).all():
                    return None
                if kind == "zero_points" and value.size and (value.min() < lo or value.max() > hi):
                    return None
                if kind == "output" and not value.flags.writeable:
                    return None
                mem[name] = Memory.trusted(md, value)
            elif type(value) is Memory and kind == "packed" and value.desc == md:
                mem[name] = value
            else:
                return None
            n += 1
        return mem if n == len(self.required) and all(r in mem for r in self.required) else None

    def _fast_table(self) -> dict:
        table = getattr(self, "_table", None)
        if table is None:
            table = {}
            for name, md in self.descs.items():
                if md is None:
                    continue
                quant = self.quant.get(name)
                if quant is not None:
                    qmd, _mask, _dims, bounds = quant
                    kind = "scales" if bounds is None else "zero_points"
                    lo, hi = bounds or (0, 0)
                    table[name] = ((qmd.dims[0],), qmd.numpy_dtype, kind, qmd, lo, hi)
                elif md.is_packed:
                    table[name] = (None, None, "packed", md, 0, 0)
                elif md.is_plain:
                    kind = "output" if name in self.outputs else "tensor"
                    table[name] = (md.physical_shape, md.numpy_dtype, kind, md, 0, 0)
            self._table = table
        return table


__all__ = ["PrimitiveDesc", "Primitive", "EmptyPrimitive", "check_descs"]
