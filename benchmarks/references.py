"""The references pytest-jaxlog is measured against, shared by the benchmark scripts: what a
user would write by hand to get the same records without it."""

from __future__ import annotations

from typing import Any, Callable

import jax
from jax import lax


def scan_with_records(step: Callable, energy: Callable, positions: Callable, steps: int, every: int = 10,
                      initial: bool = False) -> Callable[[Any], Any]:
    """The limit: one jitted nested ``lax.scan`` computing the same records (``energy`` every
    step, ``positions`` every ``every`` steps; with ``initial``, both on the initial state too),
    kept on the device. The structure ``jl.spool`` of a kernel logging in the same places
    compiles to (``benchmarks/log.py`` checks it)."""

    @jax.jit
    def run(s):
        def inner(c, _):
            c = step(c)
            return c, energy(c)

        def outer(c, _):
            c, e = lax.scan(inner, c, None, length=every)
            return c, (e, positions(c))

        if initial:
            first = (energy(s), positions(s))
            return first, lax.scan(outer, s, None, length=steps // every)
        return lax.scan(outer, s, None, length=steps // every)

    return run


def bare_scan(step: Callable, steps: int) -> Callable[[Any], Any]:
    """The bare kernel: one jitted ``lax.scan`` of the step, recording nothing."""

    @jax.jit
    def run(s):
        return lax.scan(lambda c, _: (step(c), None), s, None, length=steps)[0]

    return run


def write_records(path: Any, out: Any, every: int = 10) -> None:
    """What a user writes by hand to keep ``scan_with_records(..., initial=True)``'s records in a
    file once the run is done: pulled to the host, one plain h5py dataset per record and its
    steps, no streaming, locking or crash safety."""
    import h5py
    import numpy as np

    (e0, x0), (_, (e, xs)) = jax.device_get(out)
    xs = np.concatenate([np.asarray(x0)[None], xs])
    with h5py.File(path, "w") as f:
        for name, first in e0.items():
            f[f"energy/{name}/value"] = np.concatenate([np.asarray(first)[None], np.asarray(e[name]).reshape(-1)])
        f["energy/step"] = np.arange(len(f["energy/total/value"]))
        f["positions/value"] = xs
        f["positions/step"] = np.arange(len(xs)) * every


def write_bytes(path: Any, out: Any) -> None:
    """The bound for big records: the bytes of ``out`` (records kept on the device) moved to the
    host, into pinned memory where the device has it, and written to one raw file on the same
    disk, synced once: no format, no schema, no commits, no crash safety. A run that records them
    can at best hide its steps and its file's work under this."""
    import os

    import numpy as np

    host = [jax.device_put(x, x.sharding.with_memory_kind("pinned_host")) if _pinned(x) else x
            for x in jax.tree_util.tree_leaves(out)]
    with open(path, "wb") as f:
        for x in host:
            f.write(np.ascontiguousarray(np.asarray(x)).data)
        f.flush()
        os.fsync(f.fileno())


def _pinned(x: Any) -> bool:
    return any(m.kind == "pinned_host" for d in x.devices() for m in d.addressable_memories())
