"""The primitive cache: creating an identical primitive descriptor again returns the same primitive.

An LRU map from a primitive descriptor's :meth:`~primitives.base.PrimitiveDesc.key`
to the :class:`~primitives.base.Primitive` created for it, so its kernels, packed
constants and plans are reused. Its capacity is
``INT8JIT_PRIMITIVE_CACHE_CAPACITY`` (default 1024, read at each lookup; 0 disables
the cache) unless :func:`set_capacity` set one from the API.

It is thread-safe, and when two threads ask for the same missing key at once only
one creates the primitive; the other waits for it and counts a hit (JIT code
generation is the expensive part, so doing it twice would be the waste to avoid).

Example::

    >>> cache = PrimitiveCache(capacity=2)
    >>> cache.get_or_create(("k", 1), lambda: "first")
    ('first', False)
    >>> cache.get_or_create(("k", 1), lambda: "second")
    ('first', True)
    >>> cache.stats()["hits"], cache.stats()["misses"]
    (1, 1)
"""
from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Callable, Hashable

from runtime.env import env_int

ENV_CAPACITY = "INT8JIT_PRIMITIVE_CACHE_CAPACITY"
DEFAULT_CAPACITY = 1024


def _check_capacity(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: expected a non-negative integer, got {value!r}")
    return value


def env_capacity() -> int:
    """``INT8JIT_PRIMITIVE_CACHE_CAPACITY`` if set, else the default (1024)."""
    return env_int(ENV_CAPACITY, DEFAULT_CAPACITY, 0, "a non-negative integer")


class PrimitiveCache:
    """A thread-safe LRU cache of created primitives, keyed by hashable descriptor keys."""

    def __init__(self, capacity: int | None = None) -> None:
        self._override = None if capacity is None else _check_capacity("capacity", capacity)
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._pending: dict[Hashable, Future] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        _instances.add(self)

    def _after_fork(self) -> None:
        """In a child of ``os.fork``: the lock and the creations other threads had under
        way, which no thread here will finish, start afresh (a child forked while another
        thread created a primitive had waited forever)."""
        self._lock = threading.Lock()
        self._pending = {}

    def capacity(self) -> int:
        return self._override if self._override is not None else env_capacity()

    def set_capacity(self, capacity: int | None) -> None:
        """Set the capacity from the API (``None``: back to the environment); evicts to fit."""
        with self._lock:
            self._override = None if capacity is None else _check_capacity("capacity", capacity)
            self._evict(self.capacity())

    def _evict(self, capacity: int) -> None:
        while len(self._entries) > capacity:
            self._entries.popitem(last=False)

    def get_or_create(self, key: Hashable, factory: Callable[[], Any]) -> tuple[Any, bool]:
        """``(value, hit)``: the cached value for ``key``, or ``factory()`` stored under it."""
        try:
            hash(key)
        except TypeError:
            raise TypeError(f"key: a primitive descriptor key must be hashable, got {type(key).__name__}") from None
        future: Future | None = None
        with self._lock:
            capacity = self.capacity()
            if capacity == 0:
                self.misses += 1
                waiting = None
            elif key in self._entries:
                self._entries.move_to_end(key)
                self.hits += 1
                return self._entries[key], True
            elif key in self._pending:
                waiting = self._pending[key]
                self.hits += 1
            else:
                waiting = None
                self.misses += 1
                future = Future()
                self._pending[key] = future
        try:  # (at once: an interrupt must not leave the pending entry for others to wait on)
            if capacity == 0:
                return factory(), False
            if waiting is not None:
                return waiting.result(), True  # re-raises the creator's exception, if any
            value = factory()
        except BaseException as exc:
            if future is not None:
                with self._lock:
                    self._pending.pop(key, None)
                future.set_exception(exc)
            raise
        with self._lock:
            self._pending.pop(key, None)
            self._entries[key] = value
            self._entries.move_to_end(key)
            self._evict(self.capacity())
        future.set_result(value)
        return value, False

    def lookup(self, key: Hashable) -> Any | None:
        """The cached value for ``key`` or ``None`` (does not count as a hit or miss)."""
        with self._lock:
            return self._entries.get(key)

    def clear(self) -> None:
        """Drop every entry and reset the statistics."""
        with self._lock:
            self._entries.clear()
            self.hits = 0
            self.misses = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    def stats(self) -> dict[str, int]:
        """``{"hits", "misses", "size", "capacity"}``."""
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "size": len(self._entries),
                    "capacity": self.capacity()}


_instances: "weakref.WeakSet[PrimitiveCache]" = weakref.WeakSet()


def _after_fork() -> None:
    for cache in list(_instances):
        cache._after_fork()


os.register_at_fork(after_in_child=_after_fork)

_cache = PrimitiveCache()


def get_cache() -> PrimitiveCache:
    """The process-wide cache that :meth:`PrimitiveDesc.create` uses."""
    return _cache


def get_or_create(key: Hashable, factory: Callable[[], Any]) -> tuple[Any, bool]:
    return _cache.get_or_create(key, factory)


def lookup(key: Hashable) -> Any | None:
    return _cache.lookup(key)


def clear() -> None:
    _cache.clear()


def stats() -> dict[str, int]:
    return _cache.stats()


def capacity() -> int:
    return _cache.capacity()


def set_capacity(value: int | None) -> None:
    _cache.set_capacity(value)


__all__ = ["ENV_CAPACITY", "DEFAULT_CAPACITY", "env_capacity", "PrimitiveCache", "get_cache", "get_or_create",
           "lookup", "clear", "stats", "capacity", "set_capacity"]
