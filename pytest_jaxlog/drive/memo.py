"""The driver's bounded caches: what a kernel's runs work out again and again (lanes, resolved
plans, layouts, readers, signatures) is kept per kernel, for the kernels a test module runs.

Why bounded and oldest-first: a suite runs hundreds of kernels, each with its traced step in the
keys; keeping them all would hold every closure's arrays for the whole session.
"""

from __future__ import annotations

from typing import Any

KEEP = 64  # entries per cache


def remember(cache: dict, key: Any, value: Any, keep: int = KEEP) -> Any:
    """``cache[key] = value``, the oldest entry dropped past ``keep``; returns ``value``."""
    if len(cache) >= keep:
        cache.pop(next(iter(cache)))
    cache[key] = value
    return value
