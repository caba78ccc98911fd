"""What repeats a primitive's last execution: :class:`Replay` and the tests it runs.

:meth:`primitives.base.Primitive.execute` keeps, per thread and argument set, the replay
that ``_execute`` returned, and runs it instead of checking and setting up again when the
next call passes the very same arrays (:meth:`Replay.matches`) or new ones laid out alike
(:meth:`Replay.moves`, which points the kernels' structs at them). Here are the replay, the
straight-line tests generated for each argument layout (:func:`_matcher`), the views a
set-up takes of the caller's arrays and how to take them again (:func:`view_maker`), and
the wrapper that restores a user scratchpad before a replay runs (:func:`restoring`).

Example, the view a plain ``ba`` tag's Memory takes of its logical-shape array, made again
of a new array laid out alike::

    >>> import numpy as np
    >>> x = np.zeros((3, 2), np.int8).T  # logical 2 x 3, memory order 3 x 2
    >>> again = view_maker(x.T, x)
    >>> y = np.ones((3, 2), np.int8).T
    >>> again(y).shape, again(y).flags.c_contiguous
    ((3, 2), True)
"""
from __future__ import annotations

import operator
import weakref
from typing import TYPE_CHECKING, Callable

import numpy as np

from jit.guard import Guard, guard_kernel, layout_ok
from primitives.attr import SCRATCHPAD
from primitives.memory import Memory
from runtime.ffi import ffi

if TYPE_CHECKING:
    from primitives.base import _ArgSpec


class Replay:
    """The last execution, ready to run again: what ``_execute`` may return.

    A primitive's execution mostly sets things up (argument structs pointing at the
    arrays, per-column scales and bias written into the scratchpad, a thread split);
    ``run()`` is the rest (copies that depend on the source's values, the kernel calls).
    :meth:`~primitives.base.Primitive.execute` keeps the replay of each argument set's last call on each
    thread (a set: its packed weights, see :func:`~primitives.base.slot_key`; up to ``base._SLOTS`` sets, each
    with its own library scratchpad) and runs it instead of checking and setting up again when the
    next call passes the very same objects, unchanged in shape and type, with the same
    values in the small arguments read at set-up (scales, zero points, and the names in
    ``by_value``, such as a bias copied into the scratchpad).

    ``move(arrays)``, where the primitive gives one, points the calls at other arrays
    laid out as the recorded ones (``arrays``: name -> ndarray as the set-up took it, a
    Memory's array for a Memory). :meth:`moves` takes a call whose ndarrays are new
    objects of the recorded shapes, dtypes and strides (plain Memory objects: new ones of
    the same descriptor around such arrays; the by-value ones holding the recorded
    values; packed Memory objects, such as weights, the same), checks that no output
    overlaps another argument, then moves the replay to them: a loop that makes its
    arrays anew (a 128-token BERT linear's execute 204 -> 175 us, its kernels 168).
    Anything else takes the full path.

    ``check``, where the primitive gives one, is ``(name, test)``: both routes also need
    ``test(array)`` to hold for that argument as the set-up took it (a convolution's plain
    weights: the bytes it packed, compared at every call; their packs are not redone).

    ``move`` marked by :func:`pointing` (it only writes addresses into structs) gives the
    replay a guard (:func:`_guarded`, ``jit.guard``): one kernel call that does both
    routes' tests and the move on the same or new arrays, and says no, having done nothing,
    where they would fail; :meth:`matches` is then that call, and :meth:`moves` (in Python)
    takes only what it refuses. The guard is built when a Python route first takes a call
    (the second call that repeats the set-up's layout), so a set-up that is never
    replayed (new scales at every call) does not pay for one.

    ``valid``, set for a call on a user scratchpad (:meth:`~primitives.base.Primitive._claim`), is a test
    both routes also need: that no set-up on that scratchpad (another thread's) has since
    pointed the state the replay runs on at other arrays.

    A replay keeps none of the caller's arrays alive: its record holds them (and plain
    Memory objects) by weak reference, and ``_execute`` gets arrays over their memory
    that do not keep them (:func:`~primitives.base._unowned`), so its structs and closures hold bare
    addresses. That is safe because a replay runs only where :meth:`matches` found the
    recorded objects alive or :meth:`moves` pointed it at the call's own arrays; a bound
    call (:meth:`~primitives.base.Primitive.bind`) holds its arrays itself. Packed weights and a user
    scratchpad are held as given.
    """

    __slots__ = ("run", "by_value", "move", "check", "valid", "_record", "_matches", "_moved", "_views", "_guard",
                 "_unguarded")

    def __init__(self, run, by_value: tuple[str, ...] = (), move=None, check=None) -> None:
        self.run = run
        self.by_value = by_value
        self.move = move
        self.check = check  # (name, test): test(that argument as the set-up took it) must hold too
        self.valid = None  # or a test of the primitive's state that both routes need (Primitive._claim)
        self._record: tuple = ()
        self._matches = self._moved = None
        self._views: tuple = ()  # (name, view_maker()): arguments the set-up took as a view
        self._guard = None  # or both routes in one kernel call (_guarded)
        self._unguarded = None  # or (layout, points): a guard to build where a Python route first takes a call

    def record(self, args: dict, mem: dict, spec: "_ArgSpec") -> bool:
        """Remember ``args`` (``mem``: what ``_execute`` got) as the call this replay repeats;
        False if they cannot be told apart cheaply."""
        by_value = set(self.by_value) | set(spec.quant)
        views = []
        for name, value in args.items():
            array = value.array if type(value) is Memory else value
            if name not in by_value and name in mem and mem[name].array is not array:
                view = mem[name].array
                if not _view_of(view, array):
                    return False  # execute() copied it: the set-up points at the copy
                views.append((name, view_maker(view, array)))
        if any(make is None for _, make in views):
            self.move = None  # (a view the move could not take again)
        self._views = tuple(views)
        return self.remember(args, by_value, spec.outputs)

    def remember(self, args: dict, by_value, outputs) -> bool:
        """Remember ``args`` as they are: identities, shapes and dtypes; the bytes of the
        names in ``by_value``; ``outputs`` must stay writable. False if one is no ndarray
        (or Memory of one)."""
        layout, record = [], []
        for name, value in args.items():
            memory = type(value) is Memory
            array = value.array if memory else value
            if type(array) is not np.ndarray:
                return False
            # The caller's arrays are held weakly: a replay does not keep the last call's
            # arrays alive, and it only runs on arrays its test found alive (or moved to).
            # Packed weights and a user scratchpad are held as given.
            weak = name != SCRATCHPAD and (not memory or value.payload is None and not value.desc.is_packed)
            # (a plain Memory moves too: a new one of the same descriptor around a new array)
            movable = self.move is not None and weak and name not in by_value
            # (a user scratchpad is written as an output is: it must stay writable and
            # overlap no new argument, as the full path's checks require)
            written = name in outputs or name == SCRATCHPAD
            layout.append((name, memory, name in by_value, written, movable, weak))
            if weak:
                record += (_ref(value), _ref(array), None) if memory else (_ref(value),)
            else:
                record += (value, array, value.payload) if memory else (value,)
            record += (array.shape, array.dtype)
            if movable:
                record += (value.desc, array.strides) if memory else (array.strides,)
            if name in by_value:
                record.append(array.tobytes())
        self._record = tuple(record)
        self._matches, self._moved = _matcher(tuple(layout))
        points = getattr(self.move, "points", None)
        # (the guard is built where a Python route first takes a call, not here: a caller
        # that sets up at every call, its scales new each time, would build one each time,
        # about 50 us, and never use it)
        self._guard = None
        self._unguarded = (tuple(layout), points) if points is not None and self.check is None \
            and self.valid is None else None
        return True

    def claim(self, valid: Callable[[], bool]) -> None:
        """Set :attr:`valid` (a call on a user scratchpad, see the class docstring): both
        routes test it at every call, in Python."""
        self.valid, self._guard, self._unguarded = valid, None, None

    def matches(self, args: dict) -> bool:
        """``args`` holds the recorded objects, unchanged (see the class docstring); or,
        for a replay with a guard (:func:`_guarded`), arrays laid out alike, which the
        guard has pointed the replay at."""
        guard = self._guard
        if guard is not None:
            return guard(args)
        if not (self._matches is not None and self._matches(args, self._record)
                and (self.check is None or self._checked(args)) and (self.valid is None or self.valid())):
            return False
        if self._unguarded is not None:
            self._arm(args)
        return True

    def moves(self, args: dict) -> bool:
        """Re-point the calls at ``args`` if they are arrays laid out as the recorded ones
        (see the class docstring), and record them; False, with nothing done, if not."""
        if self.move is None or self._matches is None or self.valid is not None and not self.valid():
            return False
        moved = self._moved(args, self._record)
        if not moved:
            return False
        arrays, record = moved
        for name, make in self._views:  # (as the Memory the set-up made of each holds it)
            arrays[name] = make(arrays[name])
        if self.check is not None and not self.check[1](arrays[self.check[0]]):
            return False
        # The record names the new arrays only once the structs point at them: a move cut
        # short (Ctrl-C, an error) leaves no record, so no call matches the half-moved
        # replay (which would run on the old arrays' addresses); the next call sets up.
        matches, self._matches = self._matches, None
        self.move(arrays)
        self._record, self._matches = record, matches
        if self._unguarded is not None:
            self._arm(args)
        return True

    def _arm(self, args: dict) -> None:
        """Build the guard (:func:`_guarded`) from ``args``, a call a Python route has just
        taken (laid out as the recorded one): the next calls take the guard's route."""
        layout, points = self._unguarded
        self._unguarded = None
        self._guard = _guarded(args, layout, points)

    def _checked(self, args: dict) -> bool:
        """Whether ``check``'s test holds for its argument in ``args`` (the recorded objects,
        :meth:`matches`), taken as the set-up took it (a Memory's array; a view of it where
        the set-up made one)."""
        name, test = self.check
        value = args[name]
        array = value.array if type(value) is Memory else value
        for view_of, make in self._views:
            if view_of == name:
                array = make(array)
        return test(array)


def view_maker(view: np.ndarray, array: np.ndarray) -> Callable[[np.ndarray], np.ndarray] | None:
    """A function that makes of an array laid out as ``array`` what ``view`` is of
    ``array``: itself, a transpose (a plain tag's logical-shape array, its memory order),
    or a reshape of a contiguous array; None where ``view`` is none of these (a copy, or
    another view of the bytes)."""
    if view is array:
        return _same
    if not _view_of(view, array):
        return None
    if view.ndim == array.ndim:  # each axis of view: an axis of array, of the same length and stride
        pairs, axes = list(zip(array.shape, array.strides)), []
        for pair in zip(view.shape, view.strides):
            axes.append(next((i for i, p in enumerate(pairs) if p == pair and i not in axes), -1))
        if -1 not in axes:
            return operator.methodcaller("transpose", tuple(axes))
    if array.flags.c_contiguous and view.flags.c_contiguous:
        return operator.methodcaller("reshape", view.shape)
    return None


def _same(array: np.ndarray) -> np.ndarray:
    return array


def _view_of(view, array) -> bool:
    """Whether ``view`` is ``array``'s own bytes in another order (a logical-shape array of
    a plain tag, as Memory takes it: its transpose into memory order), which the same
    array gives again at every call."""
    # (numpy makes a view's base the array that owns the bytes, or the last array before
    # an object that is none, such as runtime.ffi.unowned's buffer: array itself)
    return type(view) is np.ndarray and type(array) is np.ndarray and view.base is not None \
        and (view.base is array or view.base is array.base) and view.ctypes.data == array.ctypes.data


_MATCHERS: dict = {}  # layout -> generated (matches, moved)
_ref = weakref.ref
# numpy's own test behind may_share_memory's dispatcher, which first looks for an
# __array_function__ override: moved() passes it only exact ndarrays, which have none,
# and an attention call's six overlap tests take 0.5 us, not 1 (numpy >= 1.25 has it).
_may_share = getattr(np.may_share_memory, "_implementation", np.may_share_memory)


def _matcher(layout: tuple):
    """``(matches, moved)`` for one argument layout ((name, memory, by value, output,
    movable, held weakly) per argument), generated once as straight expressions: a loop
    over a table of the same checks costs about twice as much, and on a small layer the
    test is most of the call's Python.

    ``matches(args, record)``: the same objects, unchanged. dtypes compare by identity (an
    unchanged array returns its own), so a dtype set in place to an equal one only takes
    the full path. ``moved(args, record)``, where movable names hold ndarrays of the
    recorded shape, dtype and strides, by-value ones ndarrays of the recorded values, the
    rest the same objects, and no output overlaps another argument: ``(arrays, record)``,
    the arrays by name (a Memory's array) and the record of ``args``; else None."""
    made = _MATCHERS.get(layout)
    if made is not None:
        return made
    names, tests, contents, loose, fresh, arrays = [], [], [], [], [], []
    for i, (name, memory, by_value, output, movable, weak) in enumerate(layout):
        o, a = f"o{i}", f"a{i}" if memory else f"o{i}"
        names += [o, a, f"p{i}"] if memory else [o]
        names += [f"s{i}", f"t{i}"]
        v, w = f"v{i}", f"w{i}"  # (the argument; a Memory's array)
        if weak:  # (o, a: weak references; a dead one gives None, never the argument)
            same = [f"({v} := get({name!r}, miss)) is not {o}()"]
            if memory:
                same.append(f"({w} := {v}.array) is not {a}() or {v}.payload is not None")
            held = w if memory else v
        else:
            same = [f"get({name!r}) is not {o}"]
            if memory:  # re-pointed, or re-packed by another reorder
                same.append(f"{o}.array is not {a} or {o}.payload is not p{i}")
            held = a
        tests += same
        tests.append(f"{held}.shape != s{i} or {held}.dtype is not t{i}")
        if output:
            tests.append(f"not {held}.flags.writeable")
        new_object = movable or by_value and not memory  # (moved: any ndarray of the layout or values)
        if memory and movable:
            loose.append(f"type({v} := get({name!r})) is not Memory or {v}.payload is not None "
                         f"or ({v}.desc is not d{i} and {v}.desc != d{i}) "
                         f"or ({w} := {v}.array).shape != s{i} or {w}.dtype != t{i}")
            array = w
        elif new_object:
            loose.append(f"type({v} := get({name!r})) is not ndarray or {v}.shape != s{i} or {v}.dtype != t{i}")
            array = v
        else:
            loose += same
            array = held
        if output:
            loose.append(f"not {array}.flags.writeable")
        new = [(f"ref({v})" if weak else v) if new_object else o]
        new += ([f"ref({w})", "None"] if movable else [a, f"p{i}"]) if memory else []
        new += [f"s{i}", f"t{i}"]
        arrays.append(array)
        if movable:
            if memory:
                names.append(f"d{i}")
                new.append(f"d{i}")
            names.append(f"r{i}")
            loose.append(f"{array}.strides != r{i}")
            new.append(f"r{i}")
        if by_value:  # (its values now: a Memory's too, changed in place)
            names.append(f"b{i}")
            contents.append(f"{held}.tobytes() != b{i}")
            loose.append(f"{array}.tobytes() != b{i}")
            new.append(f"b{i}")
        fresh += new
    # (check_disjoint's test; the full path names the overlap)
    overlaps = [f"may({arrays[j]}, {arrays[i]})" for j, e in enumerate(layout) if e[3]
                for i in range(len(layout)) if i != j] or ["False"]
    head = (f"    if len(args) != {len(layout)}:\n"
            f"        return {{no}}\n"
            f"    {', '.join(names)}, = record\n"
            f"    get = args.get\n")
    source = (f"def matches(args, record):\n{head.format(no=False)}"
              f"    return not ({' or '.join(tests + contents)})\n"
              f"def moved(args, record):\n{head.format(no=None)}"
              f"    if {' or '.join(loose)}:\n"
              f"        return None\n"
              f"    if {' or '.join(overlaps)}:\n"
              f"        return None\n"
              f"    return {{{', '.join(f'{e[0]!r}: {x}' for e, x in zip(layout, arrays))}}}, ({', '.join(fresh)},)\n")
    namespace: dict = {"ndarray": np.ndarray, "Memory": Memory, "may": _may_share, "ref": _ref,
                       "miss": object()}
    exec(compile(source, "<int8jit replay matcher>", "exec"), namespace)  # noqa: S102 - our own text
    made = _MATCHERS[layout] = namespace["matches"], namespace["moved"]
    return made


def guard_code():
    """The guards' kernel (``jit.guard``), where this process has guards, else None: a
    primitive asks for it when created, so that no execution makes it."""
    return guard_kernel() if layout_ok() else None


def pointing(move: Callable[[dict], None], entries: list, bases: tuple[str, ...]) -> Callable[[dict], None]:
    """``move`` (a replay's, see :class:`Replay`), said to write nothing but ``entries``:
    (struct, field, which base, offset) fields, each the first byte of the argument named
    ``bases[base]`` plus the offset, as ``jit.repoint.repointer`` takes them. Such a
    replay gets a guard (:func:`_guarded`) that tests a call and moves it in one kernel
    call. Returns ``move``, marked."""
    move.points = list(entries), tuple(bases)
    return move


def _guarded(args: dict, layout: tuple, points: tuple):
    """Both of a replay's routes in one kernel call (``jit.guard``), where its move only
    writes addresses into structs: ``points`` = (entries, bases), the entries (struct,
    field, which base, offset) of ``jit.repoint.repointer`` and the names of the arguments
    whose first bytes the bases are. The function returned takes a call's ``args`` and
    says whether they are laid out as ``args`` (the recorded call; ``layout`` as
    :func:`_matcher` takes it) are, having pointed the structs at them, or says False
    with nothing done: what :meth:`Replay.moves` tests and does, and the held arguments'
    identities in Python (12 heads' decode with new arrays: 8.7 -> 4.1 us a call).

    None (the replay tests in Python) where this process has no guards
    (``jit.guard.layout_ok``), or an argument is a Memory the call may replace (the guard
    reads ndarrays), a by-value one is no dense ndarray or a Memory, or there is a user
    scratchpad."""
    entries, bases = points
    if len(layout) < 2 or not layout_ok() or any(type(args.get(name)) is not np.ndarray for name in bases):
        return None
    names = tuple(name for name, *_ in layout)
    checks, held, regions, outputs = [], [], [], []
    for pos, (name, memory, by_value, output, movable, weak) in enumerate(layout):
        value = args[name]
        if name == SCRATCHPAD or memory and (weak or by_value) or not memory and not weak:
            return None
        if memory:  # (held: the same object at every call, as matches() tests it)
            held += [value, value.array, value.payload, value.array.shape, value.array.dtype]
            regions.append((None, value.array))
            continue
        if by_value and not value.flags.c_contiguous:
            return None
        checks.append((pos, value, output, value.tobytes() if by_value else None))
        regions.append((pos, value))
        if output:
            outputs.append(pos)
    pairs = [(regions[j], regions[i]) for j in outputs for i in range(len(layout)) if i != j]
    guard = Guard(len(names), checks, pairs,
                  [(ffi.addressof(struct, field), names.index(bases[base]), offset)
                   for struct, field, base, offset in entries], keep=[entry[0] for entry in entries])
    make = _guard_maker(len(names), tuple(pos for pos, (_, memory, *_) in enumerate(layout) if memory))
    function = make(operator.itemgetter(*names), guard.function, guard.args, *held)
    function.guard = guard  # (its tables, and the structs' owners, live as long as the function)
    return function


_GUARD_MAKERS: dict = {}  # (argument count, held positions) -> generated make()


def _guard_maker(count: int, held: tuple[int, ...]):
    """``make(pick, call, table, *held values)`` -> a guard's caller for ``count``
    arguments, those at the positions ``held`` being Memory objects held by identity (five
    values each: the object, its array, payload, shape and dtype); generated once per
    form, as :func:`_matcher`'s tests are (compiling per set-up was 60% of building a
    guard)."""
    made = _GUARD_MAKERS.get((count, held))
    if made is not None:
        return made
    values = [f"{x}{pos}" for pos in held for x in "oapst"]
    tests = "".join(f"        if (v := t[{pos}]) is not o{pos} or v.array is not a{pos} or v.payload is not p{pos} "
                    f"or a{pos}.shape != s{pos} or a{pos}.dtype is not t{pos}:\n            return False\n"
                    for pos in held)
    source = (f"def make({', '.join(['pick', 'call', 'table'] + values)}):\n"
              "    def guard(args):\n"
              f"        if len(args) != {count}:\n"
              "            return False\n"
              "        try:\n"
              "            t = pick(args)\n"
              "        except KeyError:\n"
              "            return False\n"
              f"{tests}"
              "        return call(table, id(t)) == 1\n"
              "    return guard\n")
    namespace: dict = {}
    exec(compile(source, "<int8jit replay guard>", "exec"), namespace)  # noqa: S102 - our own text
    made = _GUARD_MAKERS[(count, held)] = namespace["make"]
    return made


def restoring(replay: "Replay | None", region: np.ndarray, restore_rest: Callable[[], None] | None = None
              ) -> "Replay | None":
    """``replay`` of a call on a user scratchpad, made to write back before each run what
    its set-up left in ``region`` of that scratchpad (a copy taken now), and to call
    ``restore_rest`` (a padded source's borders): another primitive, or another argument
    set, may have set up there since. (A primitive whose replays do this in user mode says
    so by ``restores_scratchpad``.)"""
    if replay is None:
        return None
    saved, run = region.copy(), replay.run

    def restore_and_run() -> None:
        np.copyto(region, saved)
        if restore_rest is not None:
            restore_rest()
        run()
    restore_and_run.plan = getattr(run, "plan", None)  # (keeps what the calls point into alive, as run did)
    replay.run = restore_and_run
    return replay
