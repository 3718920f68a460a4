"""pytest-jaxlog: record, check and profile jitted JAX simulation kernels in regression tests.

Names are re-exported lazily so that ``import pytest_jaxlog`` (and the pytest plugin) does not
import jax, h5py or perfetto: users set ``XLA_FLAGS``/``JAX_*`` in conftest, after plugins load.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    # schedules and records
    "every": "_schedule",
    "at": "_schedule",
    "window": "_schedule",
    "Schedule": "_schedule",
    "Record": "_records",
    "Schema": "_frames",
    "LeafSpec": "_frames",
    "Frames": "_frames",
    # errors
    "JaxlogError": "_errors",
    "WriterError": "_errors",
    "JaxlogRuntimeWarning": "_errors",
    # drivers and loggers
    "run": "_run",
    "Run": "_run",
    "Recorder": "_recorder",
    "Logger": "_loggers",
    "CompositeLogger": "_loggers",
    "NullLogger": "_loggers",
    "ProgressLogger": "_loggers",
    "RingBuffer": "_loggers",
    # sinks and reading
    "Sink": "_sink",
    "HDF5Writer": "_hdf5",
    "MemorySink": "_sinks",
    "CSVWriter": "_sinks",
    "CallbackSink": "_sinks",
    "load": "_trajectory",
    "Trajectory": "_trajectory",
    # invariants
    "Invariant": "_invariants",
    "InvariantViolation": "_invariants",
    "finite": "_invariants",
    "bounded": "_invariants",
    "conserved": "_invariants",
    "monotonic": "_invariants",
    "invariant": "_invariants",
    # profiling and timings
    "ProfileWindow": "_profile",
    "Timeline": "_perfetto",
    "CompileTracker": "_timings",
    "Timings": "_timings",
    "Trace": "_trace",
    "load_trace": "_trace",
    # golden trajectories
    "assert_trajectory_close": "_golden",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_jaxlog' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # static re-exports for type checkers and IDEs
    from ._errors import JaxlogError, JaxlogRuntimeWarning, WriterError
    from ._frames import Frames, LeafSpec, Schema
    from ._golden import assert_trajectory_close
    from ._hdf5 import HDF5Writer
    from ._invariants import Invariant, InvariantViolation, bounded, conserved, finite, invariant, monotonic
    from ._loggers import CompositeLogger, Logger, NullLogger, ProgressLogger, RingBuffer
    from ._perfetto import Timeline
    from ._profile import ProfileWindow
    from ._recorder import Recorder
    from ._records import Record
    from ._run import Run, run
    from ._schedule import Schedule, at, every, window
    from ._sink import Sink
    from ._sinks import CSVWriter, CallbackSink, MemorySink
    from ._timings import CompileTracker, Timings
    from ._trace import Trace, load_trace
    from ._trajectory import Trajectory, load
