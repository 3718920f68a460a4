"""Device time: how long the accelerator worked on a call, read from a JAX profiler trace of it.

Why: a wall-clock timing on a shared machine moves with the load, the Python around the call,
dispatch and host round trips; the time the GPU spends in the call's kernels and copies moves
much less, and it is what a change to the kernel's own code changes. The trace's device tracks
say it (``Trace.device_busy_s``). The CPU backend has none: there the call's device time is not
known, and saying so is better than passing wall time off as it.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any, Callable

from ..errors import JaxlogError
from .trace import find_jax_trace, load_trace
from .window import active_window

__all__ = ["device_seconds"]


def device_seconds(call: Callable[[], Any]) -> float:
    """Run ``call()`` under the JAX profiler, wait for its result, and return the seconds its
    devices were busy. ``JaxlogError`` where the trace has no device track (the CPU backend)
    or another profiler session is running."""
    import jax

    window = active_window()
    if window is not None:
        raise JaxlogError(f"device time: profile window {window.describe()} is capturing (one profiler session "
                          f"per process); time device work outside it")
    where = tempfile.mkdtemp(prefix="jaxlog-device-time-")
    try:
        try:
            jax.profiler.start_trace(where, create_perfetto_trace=True)
        except RuntimeError as e:
            raise JaxlogError(f"device time: another profiler session is running in this process: {e}") from e
        try:
            jax.block_until_ready(call())
        finally:
            jax.profiler.stop_trace()
        files = find_jax_trace(where)
        if "jax_trace" not in files:
            raise JaxlogError(f"device time: the profiler wrote no trace under {where}")
        busy = load_trace(files["jax_trace"]).device_busy_s()
    finally:
        shutil.rmtree(where, ignore_errors=True)
    if busy is None:
        raise JaxlogError(f"device time: the trace has no device track (JAX's backend is {jax.default_backend()!r}: "
                          f"its programs run on host threads); time wall-clock instead")
    return busy
