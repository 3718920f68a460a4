"""The small host values a dispatch passes (step numbers, lengths, offsets, flags), kept on the device.

Why: every numpy argument of a jitted call is a host-to-device transfer on every call, several
microseconds each on the CPU (more through a GPU's driver), and a chunk's dispatch passes six or
more: half the cost of dispatching a one-step chunk, which a ``chunk=1`` run, a profile window's
steps and a post-mortem replay pay per step. The values repeat (chunk lengths, offsets into a set of
buffers, flags, zero counts, and the step numbers of every run of the same length), so each is
transferred once per placement and reused. The programs never donate them (only the state and
the buffers), so a kept copy stays valid.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from .program import Control, control

KEEP = 4096  # values kept per placement; past it the older half is dropped
_SMALL = 64  # elements: larger host arrays (per-system masks of a long chunk) are transferred, not kept


class Scalars:
    """Device copies of small host values for one placement (``put`` places a host value)."""

    __slots__ = ("_put", "_kept", "_controls")

    def __init__(self, put: Callable[[np.ndarray], Any]):
        self._put = put
        self._kept: dict[tuple, Any] = {}
        self._controls: dict[tuple, Control] = {}

    def control(self, k0: int, n: int, row0: int, flags: int) -> Control:
        """:func:`~.program.control` with its values on the device, the whole tuple kept."""
        key = (k0, n, row0, flags)
        found = self._controls.get(key)
        if found is None:
            _make_room(self._controls)
            found = self._controls[key] = Control(*map(self.one, control(k0, n, row0, flags)))
        return found

    def __call__(self, values: tuple) -> tuple:
        """``values`` with every host value on the device; device arrays (counts chained from the
        previous chunk) pass through."""
        return tuple(map(self.one, values))

    def one(self, x: Any) -> Any:
        if isinstance(x, jax.Array):
            return x
        x = np.asarray(x)
        if x.size > _SMALL:
            return self._put(x)
        key = (x.dtype.str, x.shape, x.tobytes())
        kept = self._kept.get(key)
        if kept is None:
            _make_room(self._kept)
            kept = self._kept[key] = self._put(x)
        return kept


def _make_room(kept: dict) -> None:
    """Past ``KEEP`` entries, the older half goes (another thread may be dropping them too)."""
    if len(kept) >= KEEP:
        for old in list(kept)[:KEEP // 2]:
            kept.pop(old, None)


_PLACEMENTS: dict[Any, Scalars] = {}


def scalars_on(device: Any, committed: bool, sharding: Any = None) -> Scalars:
    """The kept values of one placement, as a dispatch's other arguments are placed: replicated
    on ``sharding`` (a sharded state's mesh), committed to ``device``, or uncommitted on the
    default device (a committed value there would make jit compile the program again for a mix
    of committed and uncommitted arguments)."""
    if sharding is not None:
        key: tuple = ("sharded", sharding)
        put: Callable = lambda x: jax.device_put(x, sharding)  # noqa: E731
    elif committed:
        key, put = ("committed", device), (lambda x: jax.device_put(x, device))
    else:  # where jax puts an uncommitted value depends on the default device in force
        key, put = ("uncommitted", device, jax.config.jax_default_device), jax.device_put
    found = _PLACEMENTS.get(key)
    if found is None:
        found = _PLACEMENTS[key] = Scalars(put)
    return found
