"""``jl.from_arrays``: a trajectory computed elsewhere, checked and stored as a run's.

A ``lax.scan``'s stacked output, a diffrax solve saved at ``SaveAt(ts=...)``, a sampler's
``run_inference_algorithm`` states: arrays with a leading frame axis, already computed. They go
through the same path as a run's frames (``drive.host.pipeline``: invariants, the first bad step
named, sinks, the same file), so goldens, plots and reports work on them as on ``jl.run``'s.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import jax
import numpy as np

from ..errors import JaxlogError
from ..record import records as runmeta
from ..record.frames import Frames, Schema
from ..record.records import check_name
from ..record.schedule import Schedule, at, window
from ..record.values import check_dt
from .host.pipeline import Pipeline
from .prepare.schema import flatten_view, lane_leaves, n_systems_of

__all__ = ["from_arrays", "ArraysRun"]


@dataclass
class ArraysRun:
    """What ``jl.from_arrays`` returns: the interface of ``jl.run``'s ``Run`` where it applies
    (``trajectory``, ``violation``, ``status``, ``stop_reason``, ``steps_done``, ``artifacts``,
    ``schema``). Nothing ran here: ``state``, ``timings`` and ``chunk`` are None."""

    steps_done: int
    violation: Any = None
    artifacts: dict = field(default_factory=dict)
    schema: Schema | None = None
    status: str = "complete"
    stop_reason: str = "steps"
    state: Any = None
    timings: Any = None
    chunk: int | None = None
    systems_done: np.ndarray | None = None
    meta: dict = field(default_factory=dict)  # meta=: the run's JSON metadata, as the file keeps it
    _pipe: Any = field(default=None, repr=False)
    _trajectory: Any = field(default=None, repr=False)

    @property
    def trajectory(self) -> Any:
        """The stored trajectory: loaded from the file sink if any, else in memory."""
        if self._trajectory is None:
            self._trajectory = self._pipe.trajectory()
        return self._trajectory

    def compiled_chunk(self) -> None:
        return None


def from_arrays(records: Mapping[str, Any], *, steps: Any = None, time: Any = None, invariants: Any = (),
                sinks: Any = (), batched: bool | int = False, on_violation: str = "raise",
                meta: dict | None = None) -> ArraysRun:
    """Check and store ``records`` (``{name: pytree of arrays}``, each leaf with a leading frame
    axis) as a run's trajectory: the invariants see them as a run's frames (a violation names
    the first bad step and system), the sinks write the same file. ``steps``: the step number of
    each frame (default 0, 1, ...); ``time``: the time of each frame, stored as given (read back
    bit for bit as float64); the steps must space them evenly, to a thousandth of a step
    (``SaveAt(ts=jnp.linspace(...))`` does; without ``steps``, they are the times over their
    spacing), and the file's dt is that spacing. ``batched``: the axis after the frames is
    the system axis. ``on_violation``: ``"raise"`` (the file ends at the bad step), ``"warn"``,
    ``"record"``, as for ``jl.run``. ``meta={...}``: the run's metadata as JSON, as for ``jl.run``
    (read back as ``traj.meta`` and ``result.meta``)."""
    meta = {} if meta is None else runmeta.check_meta(meta)
    trees = _trees(records)
    n_frames = _frame_count(trees, steps, time)
    steps, dt = _steps_and_dt(n_frames, steps, time)
    times = None if time is None else np.asarray(time, np.float64)  # stored as given, not as step × dt
    first = {name: jax.tree_util.tree_map(lambda x: x[0], tree) for name, tree in trees.items()}
    n_sys = n_systems_of(first, batched) if batched else None
    schedule = _schedule(steps)
    leaves, frames = [], Frames()
    for name, tree in trees.items():
        found = lane_leaves(name, name, schedule, lambda t, name=name: flatten_view(name, t, keys_as_data=False),
                            (first[name],), n_sys, "record")
        values = {path: np.asarray(jax.device_get(v)) for path, v in flatten_view(name, tree).items()}
        # stored as given (a float64 numpy array stays float64 where jax, without x64, would make it float32)
        leaves += [dataclasses.replace(leaf, dtype=values[leaf.path].dtype) for leaf in found.leaves]
        for path, value in values.items():
            frames.add(path, steps, value, times)
    schema = Schema(tuple(leaves), batched=n_sys is not None, dt=check_dt(dt))
    pipe = Pipeline(sinks=sinks, invariants=invariants, on_violation=on_violation)
    described = {"driver": "from_arrays", "frames": n_frames, "batched": n_sys is not None, "dt": dt}
    if meta:
        described[runmeta.KEY] = meta
    pipe.open(schema, described)
    try:
        new = pipe.feed(frames, f"frames {int(steps[0]) if n_frames else 0}..{int(steps[-1]) if n_frames else 0}")
        if not (new and on_violation == "raise"):
            pipe.finish()
    except BaseException as exc:
        pipe.close("stopped" if isinstance(exc, KeyboardInterrupt) else "failed",
                   steps_done=int(steps[-1]) if n_frames else 0, raise_errors=False, reason=exc,
                   summary={"stop_reason": "interrupted"})
        raise
    violation = pipe.first
    cut = violation is not None and on_violation == "raise"
    done = int(violation.step) if cut else (int(steps[-1]) if n_frames else 0)
    reason = "violation" if cut else "steps"
    pipe.close("violated" if violation is not None else "complete", steps_done=done,
               summary={"stop_reason": reason, "systems_done": None})
    result = ArraysRun(done, violation, dict(pipe.artifacts), schema, "violated" if violation is not None else "complete",
                       reason, meta=meta, _pipe=pipe)
    if violation is not None:
        violation.jaxlog_run = result
        if on_violation == "raise":
            raise violation
    return result


def _trees(records: Any) -> dict[str, Any]:
    """The records by name, each leaf an array with a leading frame axis (typed keys kept)."""
    if not isinstance(records, Mapping) or not records:
        raise JaxlogError(f"from_arrays: records must be a non-empty dict of name -> arrays with a leading frame axis, "
                          f"got {type(records).__name__}")
    out = {}
    for name, tree in records.items():
        check_name(name)
        for path, leaf in flatten_view(name, tree, keys_as_data=False).items():
            if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
                raise JaxlogError(f"record {path!r}: {type(leaf).__name__} is not an array (from_arrays records "
                                  f"arrays with a leading frame axis)")
            if not leaf.shape:
                raise JaxlogError(f"record {path!r}: a scalar has no frame axis (from_arrays takes arrays whose "
                                  f"leading axis is the frames, e.g. a lax.scan's stacked output)")
        out[name] = tree
    return out


def _frame_count(trees: dict[str, Any], steps: Any, time: Any) -> int:
    """The number of frames every leaf, ``steps`` and ``time`` agree on; the first that does not is named."""
    counts = {path: int(leaf.shape[0]) for name, tree in trees.items()
              for path, leaf in flatten_view(name, tree, keys_as_data=False).items()}
    for what, given in (("steps=", steps), ("time=", time)):
        if given is not None:
            counts[what] = len(np.atleast_1d(np.asarray(given)))
    first = next(iter(counts))
    for what, n in counts.items():
        if n != counts[first]:
            raise JaxlogError(f"from_arrays: {what} has {n} frames but {first} has {counts[first]} (every record, "
                              f"steps= and time= have one entry per frame)")
    if counts[first] == 0:
        raise JaxlogError("from_arrays: the records have no frames")
    return counts[first]


def _steps_and_dt(n: int, steps: Any, time: Any) -> tuple[np.ndarray, float | None]:
    """Each frame's step, and the dt that makes ``time`` step × dt, to a thousandth of a step
    (None without ``time``): the times themselves are stored as given, the steps and dt say how
    they are spaced."""
    if steps is not None:
        steps_arr = np.asarray(steps)
        if steps_arr.ndim != 1 or steps_arr.dtype.kind not in "iu":
            raise JaxlogError(f"from_arrays: steps= must be a 1-d array of step numbers, got {steps_arr.dtype}"
                              f"{list(steps_arr.shape)}")
        steps_arr = steps_arr.astype(np.int64)
        bad = np.flatnonzero(np.diff(steps_arr) <= 0)
        if (steps_arr < 0).any() or len(bad):
            where = int(bad[0]) + 1 if len(bad) else int(np.flatnonzero(steps_arr < 0)[0])
            raise JaxlogError(f"from_arrays: steps= must be increasing step numbers >= 0; frame {where} has step "
                              f"{int(steps_arr[where])}")
    if time is None:
        return (np.arange(n, dtype=np.int64) if steps is None else steps_arr), None
    t = np.asarray(time, np.float64)
    if t.ndim != 1 or not np.isfinite(t).all():
        raise JaxlogError("from_arrays: time= must be a 1-d array of finite times, one per frame")
    if steps is None:
        spacing = np.diff(t)
        if n > 1 and not (spacing > 0).all():
            raise JaxlogError("from_arrays: time= must increase from frame to frame")
        dt = float(np.median(spacing)) if n > 1 else (float(t[0]) or 1.0)
        steps_arr = np.rint(t / dt).astype(np.int64)
    span = int(steps_arr[-1] - steps_arr[0])
    if span:  # over the whole span: the spacing of float32 times is off in its last bits
        dt = float((t[-1] - t[0]) / span)
    elif steps is not None:
        dt = float(t[0] / steps_arr[0]) if steps_arr[0] else 1.0
    tol = 1e-3 * abs(dt) + 1e-6 * float(np.abs(t).max())
    off = np.flatnonzero(np.abs(steps_arr * dt - t) > tol)
    if len(off) or not (math.isfinite(dt) and dt > 0) or (steps_arr < 0).any():
        i = int(off[0]) if len(off) else 0
        raise JaxlogError(f"from_arrays: time= must be evenly spaced over the frames' steps (step × dt); it is not "
                          f"(frame {i}: time {t[i]!r}, step {int(steps_arr[i])} × dt {dt!r}); give steps= that make it "
                          f"so, or record the times as a record of their own (records={{'t': ts, ...}})")
    return steps_arr, dt


def _schedule(steps: np.ndarray) -> Schedule:
    """The frames' steps as a schedule: a window when evenly spaced, else the steps themselves."""
    gaps = np.unique(np.diff(steps))
    if len(steps) == 1:
        return at(int(steps[0]))
    if len(gaps) == 1:
        return window(int(steps[0]), int(steps[-1]), every=int(gaps[0]))
    return at(*(int(s) for s in steps))
