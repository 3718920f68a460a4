"""The driver's bounded caches: what a kernel's runs work out again and again (lanes, resolved
plans, layouts, readers, signatures) is kept per kernel, for the kernels a test module runs.

Why bounded and oldest-first: a suite runs hundreds of kernels, each with its traced step in the
keys; keeping them all would hold every closure's arrays for the whole session. Why some keys
name an object by ``id()`` (cached shapes, schemas, resolved runs: unhashable, or costly to
hash): the entry's value keeps that object, so while the entry lives its id is its own.
"""

from __future__ import annotations

from typing import Any, Callable

KEEP = 64  # entries per cache


def memo(cache: dict, key: Any, make: Callable[[], Any]) -> Any:
    """``cache[key]``, made by ``make()`` and remembered the first time it is asked for."""
    hit = cache.get(key)
    return remember(cache, key, make()) if hit is None else hit


def remember(cache: dict, key: Any, value: Any, keep: int = KEEP) -> Any:
    """``cache[key] = value``, the oldest entry dropped past ``keep``; returns ``value``."""
    if len(cache) >= keep:
        cache.pop(next(iter(cache)))
    cache[key] = value
    return value
