"""The driver's bounded caches: what a kernel's runs work out again and again (lanes, resolved
plans, layouts, readers, signatures) is kept per kernel, for the kernels a test module runs.

Why bounded and oldest-first: a suite runs hundreds of kernels, each with its traced step in the
keys; keeping them all would hold every closure's arrays for the whole session. Why some keys
name an object by ``id()`` (cached shapes, schemas, resolved runs: unhashable, or costly to
hash): the entry's value keeps that object, so while the entry lives its id is its own.

Why a lock: tests run ``jl.run`` from several threads (a thread pool of kernels, a server under
test); evicting the oldest entry while another thread adds one raised ``KeyError`` and
"dictionary changed size during iteration". Lookups take no lock (a dict lookup is atomic and
stays correct while another thread changes the dict; it is the hot path of a warm run); every
change does. A value is made outside the lock (tracing a step takes milliseconds and may run
another run's code): two threads asking for the same new key both make it, and one is kept.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Protocol, TypeVar

__all__ = ["Cache", "KEEP", "caches", "clear_caches", "register"]

KEEP = 64  # entries per cache


class Clearable(Protocol):
    def clear(self) -> None: ...


C = TypeVar("C", bound=Clearable)


_ALL: list[Clearable] = []  # every cache of the driver, for clear_caches()
_ALL_LOCK = threading.Lock()


def register(cache: C) -> C:
    """Have :func:`clear_caches` clear ``cache`` too (a pool kept another way than :class:`Cache`)."""
    with _ALL_LOCK:
        _ALL.append(cache)
    return cache


def caches() -> list[Clearable]:
    """Every cache of the driver (to bound or inspect them)."""
    with _ALL_LOCK:
        return list(_ALL)


def clear_caches() -> None:
    """Forget everything the driver kept between runs (resolved kernels, layouts, readers, spare
    buffers...): the next run of each kernel works it out again. For memory held by kernels no
    longer run, and for tests of the caches themselves."""
    for cache in caches():
        cache.clear()


class Cache:
    """A map of at most ``keep`` entries, the oldest dropped first, safe to use from several
    threads. ``get`` and ``memo`` raise ``TypeError`` for an unhashable key, as a dict does
    (callers with keys that may not hash catch it and go without the cache)."""

    __slots__ = ("name", "keep", "_data", "_lock")

    def __init__(self, name: str, keep: int = KEEP):
        self.name = name
        self.keep = keep
        self._data: dict = {}
        self._lock = threading.Lock()
        register(self)

    def get(self, key: Any, default: Any = None) -> Any:
        return self._data.get(key, default)

    def put(self, key: Any, value: Any) -> Any:
        """``self[key] = value``, the oldest entries dropped past ``keep``; returns ``value``."""
        with self._lock:
            data = self._data
            if key not in data:
                while len(data) >= self.keep:
                    del data[next(iter(data))]
            data[key] = value
        return value

    def memo(self, key: Any, make: Callable[[], Any]) -> Any:
        """``self[key]``, made by ``make()`` and kept the first time it is asked for."""
        hit = self._data.get(key)
        return self.put(key, make()) if hit is None else hit

    def intern(self, value: Any) -> Any:
        """The one equal value kept already, or ``value`` (then kept): equal objects made
        again and again become the same one."""
        hit = self._data.get(value)
        if hit is not None:
            return hit
        with self._lock:
            hit = self._data.get(value)
            if hit is not None:
                return hit
            data = self._data
            while len(data) >= self.keep:
                del data[next(iter(data))]
            data[value] = value
        return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Cache({self.name!r}, {len(self._data)}/{self.keep})"
