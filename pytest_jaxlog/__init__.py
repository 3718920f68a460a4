"""pytest-jaxlog: record, check and profile jitted JAX simulation kernels in regression tests.

Names are re-exported lazily so that ``import pytest_jaxlog`` (and the pytest plugin) does not
import jax, h5py or perfetto: users set ``XLA_FLAGS``/``JAX_*`` in conftest, after plugins load.

PYTEST_DONT_REWRITE
"""

import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

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
    "Recorder": "drive.recorder",
    "resume": "drive.resume",
    "from_arrays": "drive.arrays",
    "ArraysRun": "drive.arrays",
    "Logger": "drive.loggers",
    "CompositeLogger": "drive.loggers",
    "NullLogger": "drive.loggers",
    "ProgressLogger": "drive.loggers",
    "RingBuffer": "drive.loggers",
    # logging from inside the kernel
    "log": "logs",
    "spool": "logs",
    "tap": "logs",
    "LogEvent": "logs",
    # sinks and reading
    "Sink": "store.sink",
    "HDF5Writer": "store.hdf5",
    "MemorySink": "store.sinks",
    "CSVWriter": "store.sinks",
    "CallbackSink": "store.sinks",
    "TensorBoardWriter": "store.tensorboard",
    "LoggingSink": "store.logsink",
    "WandbSink": "store.wandbsink",
    "MLflowSink": "store.mlflowsink",
    "load": "store.trajectory",
    "Trajectory": "store.trajectory",
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
    "ess": "check.ess",
    "EffectiveSampleSize": "check.ess",
    "EssRate": "check.ess",
    "convergence_order": "check.convergence",
    "calibrate": "drive.calibrate",
    "assert_statistically_close": "check.ensemble",
    "EnsembleMismatch": "check.ensemble",
    "Calibration": "drive.calibrate",
    "ConvergenceOrder": "check.convergence",
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
    "assert_trajectory_close": "golden",
    "TrajectoryMismatch": "golden",
    "diff_trajectories": "golden",
    "Diff": "golden",
    "RecordDiff": "golden",
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
    from .errors import CostRegression, JaxlogAssertionError, JaxlogError, JaxlogRuntimeWarning, Terminated, WriterError
    from .profiling.cost import Cost, cost
    from .drive.benchmark import Benchmark, benchmark
    from .record.frames import Frames, LeafSpec, Schema
    from .golden import Diff, RecordDiff, TrajectoryMismatch, assert_trajectory_close, diff_trajectories
    from .store.hdf5 import HDF5Writer
    from .check.invariants import (Invariant, InvariantViolation, aggregate, bounded, conserved, finite, invariant,
                                   monotonic)
    from .logs import LogEvent, log, spool, tap
    from .check.ess import EffectiveSampleSize, EssRate, ess
    from .check.convergence import ConvergenceOrder, convergence_order
    from .drive.calibrate import Calibration, calibrate
    from .check.ensemble import EnsembleMismatch, assert_statistically_close
    from .drive.loggers import CompositeLogger, Logger, NullLogger, ProgressLogger, RingBuffer
    from .profiling.timeline import Timeline
    from .profiling.window import ProfileWindow
    from .drive.recorder import Recorder
    from .drive.resume import resume
    from .drive.arrays import ArraysRun, from_arrays
    from .record.records import Record
    from .drive.run import Run, run
    from .record.schedule import Schedule, at, every, window
    from .store.sink import Sink
    from .store.sinks import CSVWriter, CallbackSink, MemorySink
    from .store.logsink import LoggingSink
    from .store.mlflowsink import MLflowSink
    from .store.wandbsink import WandbSink
    from .store.tensorboard import TensorBoardWriter
    from .profiling.timings import CompileTracker, TimingAssertionError, Timings
    from .profiling.trace import Trace, load_trace
    from .store.trajectory import Trajectory, load
