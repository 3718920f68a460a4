"""pytest-jaxlog: record, check and profile jitted JAX simulation kernels in regression tests.

Names are re-exported lazily so that ``import pytest_jaxlog`` (and the pytest plugin) does not
import jax, h5py or perfetto: users set ``XLA_FLAGS``/``JAX_*`` in conftest, after plugins load.

PYTEST_DONT_REWRITE
"""

import importlib as _importlib
import typing as _typing

from .version import __version__

_EXPORTS = {
    # schedules and records
    "every": "record.schedule",
    "at": "record.schedule",
    "window": "record.schedule",
    "Schedule": "record.schedule",
    "Record": "record.records",
    "Schema": "record.frames",
    "LeafSpec": "record.frames",
    "Frames": "record.frames",
    # errors
    "JaxlogError": "errors",
    "WriterError": "errors",
    "JaxlogRuntimeWarning": "errors",
    "Terminated": "errors",
    "JaxlogAssertionError": "errors",
    "CostRegression": "errors",
    # drivers and loggers
    "run": "drive.run",
    "Run": "drive.run",
    "Recorder": "drive.host.recorder",
    "resume": "drive.resume",
    "from_arrays": "drive.arrays",
    "ArraysRun": "drive.arrays",
    "Logger": "drive.host.loggers",
    "CompositeLogger": "drive.host.loggers",
    "NullLogger": "drive.host.loggers",
    "ProgressLogger": "drive.host.loggers",
    "RingBuffer": "drive.host.loggers",
    # logging from inside the kernel
    "log": "logs",
    "spool": "logs",
    "tap": "logs",
    "LogEvent": "logs",
    # sinks and reading
    "Sink": "store.protocol",
    "HDF5Writer": "store.hdf5.writer",
    "MemorySink": "store.sinks",
    "CSVWriter": "store.sinks",
    "CallbackSink": "store.sinks",
    "TensorBoardWriter": "store.dashboards",
    "LoggingSink": "store.sinks",
    "WandbSink": "store.dashboards",
    "MLflowSink": "store.dashboards",
    "load": "store.hdf5.trajectory",
    "Trajectory": "store.hdf5.trajectory",
    # invariants
    "Invariant": "check.invariants",
    "InvariantViolation": "check.invariants",
    "finite": "check.invariants",
    "bounded": "check.invariants",
    "conserved": "check.invariants",
    "monotonic": "check.invariants",
    "aggregate": "check.invariants",
    "invariant": "check.invariants",
    # sampler quality and stepper order
    "ess": "check.statistics",
    "EffectiveSampleSize": "check.statistics",
    "EssRate": "check.statistics",
    "convergence_order": "check.statistics",
    "calibrate": "drive.calibrate",
    "assert_statistically_close": "check.statistics",
    "EnsembleMismatch": "check.statistics",
    "Calibration": "drive.calibrate",
    "ConvergenceOrder": "check.statistics",
    # profiling and timings
    "ProfileWindow": "profiling.window",
    "Timeline": "profiling.timeline",
    "CompileTracker": "profiling.timings",
    "Timings": "profiling.timings",
    "TimingAssertionError": "profiling.timings",
    "Trace": "profiling.trace",
    "load_trace": "profiling.trace",
    # compiled costs and benchmarks
    "Cost": "profiling.cost",
    "cost": "profiling.cost",
    "benchmark": "drive.benchmark",
    "Benchmark": "drive.benchmark",
    # golden trajectories
    "assert_trajectory_close": "compare.golden",
    "TrajectoryMismatch": "compare.golden",
    "diff_trajectories": "compare.golden",
    "Diff": "compare.golden",
    "RecordDiff": "compare.golden",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> _typing.Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_jaxlog' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return [*__all__, "__version__"]


if _typing.TYPE_CHECKING:  # static re-exports for type checkers and IDEs
    from .check.invariants import (
        Invariant,
        InvariantViolation,
        aggregate,
        bounded,
        conserved,
        finite,
        invariant,
        monotonic,
    )
    from .check.statistics import (
        ConvergenceOrder,
        EffectiveSampleSize,
        EnsembleMismatch,
        EssRate,
        assert_statistically_close,
        convergence_order,
        ess,
    )
    from .compare.golden import Diff, RecordDiff, TrajectoryMismatch, assert_trajectory_close, diff_trajectories
    from .drive.arrays import ArraysRun, from_arrays
    from .drive.benchmark import Benchmark, benchmark
    from .drive.calibrate import Calibration, calibrate
    from .drive.host.loggers import CompositeLogger, Logger, NullLogger, ProgressLogger, RingBuffer
    from .drive.host.recorder import Recorder
    from .drive.resume import resume
    from .drive.run import Run, run
    from .errors import CostRegression, JaxlogAssertionError, JaxlogError, JaxlogRuntimeWarning, Terminated, WriterError
    from .logs import LogEvent, log, spool, tap
    from .profiling.cost import Cost, cost
    from .profiling.timeline import Timeline
    from .profiling.timings import CompileTracker, TimingAssertionError, Timings
    from .profiling.trace import Trace, load_trace
    from .profiling.window import ProfileWindow
    from .record.frames import Frames, LeafSpec, Schema
    from .record.records import Record
    from .record.schedule import Schedule, at, every, window
    from .store.dashboards import MLflowSink, TensorBoardWriter, WandbSink
    from .store.hdf5.trajectory import Trajectory, load
    from .store.hdf5.writer import HDF5Writer
    from .store.protocol import Sink
    from .store.sinks import CallbackSink, CSVWriter, LoggingSink, MemorySink
