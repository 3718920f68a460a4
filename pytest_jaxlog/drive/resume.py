"""What ``jl.resume`` takes from the file when the caller does not say it again: the key, ``dt``,
the checkpoint schedule and the built-in invariants (their running state comes from the
checkpoint either way). What a file cannot hold (the step function, the views, predicates,
custom invariants, a custom pytree's type) the caller gives; a value given that differs from the
file's is refused by ``checkpoint.check_against``, naming both.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

from ..check.invariants import from_spec
from ..errors import JaxlogError, hide_frame_from_checks
from ..record.records import normalize_records
from ..record.schedule import check_count, schedule_from_json
from ..store.dtypes import beyond_dicts, template, wrap_key_data
from .checkpoints.checkpoint import RESUME_MARK, CheckpointMeta, prepare, rebuild_state
from .checkpoints.partresume import prepare_parts, recorded_processes
from .run import Run, resume_run

__all__ = ['from_file']

def from_file(kwargs: dict, meta: CheckpointMeta, where: str) -> dict:
    """``kwargs`` (``jl.run``'s, as given to ``jl.resume``) with the key, ``dt``, ``checkpoint``
    and ``invariants`` the file's run had, for those not given."""
    out = dict(kwargs)
    if "key" not in out and meta.key is not None:
        out["key"] = _key(meta, where)
    if "dt" not in out:
        out["dt"] = meta.dt if meta.dt is not None else meta.schema.get("dt")
    if "checkpoint" not in out:
        out["checkpoint"] = _checkpoint(meta, where)
    if "invariants" not in out:
        out["invariants"] = _invariants(meta, where)
    return out


def _key(meta: CheckpointMeta, where: str) -> Any:
    try:
        data = np.asarray(meta.key, dtype=np.uint32)
    except (ValueError, TypeError, OverflowError) as exc:
        raise JaxlogError(f"{where}: the file's key is not key data ({exc}); pass key= to jl.resume") from None
    return data if meta.key_impl is None else wrap_key_data(data, meta.key_impl, f"{where}: the run's key")


def _checkpoint(meta: CheckpointMeta, where: str) -> Any:
    if meta.checkpoint is None:
        raise JaxlogError(f"{where}: the file does not say its run's checkpoint schedule (it was written before "
                          "checkpoints kept it): pass checkpoint=jl.every(n) (or checkpoint=None for no more "
                          "checkpoints) to jl.resume")
    try:
        return schedule_from_json(meta.checkpoint)
    except JaxlogError as exc:
        raise JaxlogError(f"{where}: the file's checkpoint schedule is not valid ({str(exc).removeprefix('[jaxlog] ')}); "
                          "pass checkpoint= to jl.resume") from None


def _invariants(meta: CheckpointMeta, where: str) -> list:
    names = [str(s.get("invariant")) if isinstance(s, dict) else "?" for s in meta.invariants]
    if not names:
        return []
    specs = meta.invariant_specs
    if specs is None or len(specs) != len(names):
        raise JaxlogError(f"{where}: the file does not say how to rebuild the invariants its run checked (it was "
                          f"written before checkpoints kept them): pass invariants= to jl.resume, the same "
                          f"{len(names)} in the same order ({', '.join(names)})")
    code = [name for name, spec in zip(names, specs) if spec is None]
    if code:
        raise JaxlogError(f"{where}: the file's run checked {', '.join(code)}, a function the file does not hold: "
                          f"pass invariants= to jl.resume, all {len(names)} in the same order ({', '.join(names)})")
    return [from_spec(spec, name, where) for name, spec in zip(names, specs)]

# ---------------------------------------------------------------------------------------------
# ``jl.resume``: continue a checkpointed run in its own file, bit-for-bit.

def placed_like(state: Any, like: Any) -> Any:
    """The checkpoint's state placed as ``like``'s arrays are (a state sharded over a mesh resumes
    on that mesh: on one device its reductions would differ in their last bits from the
    uninterrupted run's); leaves ``like`` has no array for stay where they are."""
    if like is None:
        return state
    try:
        return jax.tree_util.tree_map(
            lambda x, t: jax.device_put(x, t.sharding) if isinstance(t, jax.Array)
            and (t.committed or len(t.sharding.device_set) > 1) else x, state, like)
    except ValueError:  # like= of another structure: the check against the file names what differs
        return state


def resume(path: str | os.PathLike, step: Callable, steps: int, *, like: Any = None, from_step: int | None = None,
           sinks: Any = (), writer: dict | None = None, **kwargs: Any) -> Run:
    """Continue the run recorded in ``path`` from its newest checkpoint (or ``from_step=``) up to
    step ``steps`` (the run's total), appending to the same file.

    Takes ``jl.run``'s keyword arguments (``record``, ``invariants``, ``key``, ``dt``,
    ``checkpoint``, ``until``, ...): they must describe the run in the file, and a resume whose
    step function, records, schedules, state structure, dtypes, key, dt, invariants or x64
    setting differ is refused, naming what differs (the given value and the file's). What the
    file holds need not be given again: the key, ``dt``, the checkpoint schedule and the built-in
    invariants (``drive.resume``); the step and the views (``record=``, ``until=``, ...)
    are code, which the file does not hold. ``like``: a state of the kernel's own type (e.g. the
    initial state), so the checkpoint comes back as namedtuples or dataclasses; states of dicts,
    tuples and lists need none. ``run.resumed_from``: the checkpoint's step.

    The resumed file equals, bit for bit, the one an uninterrupted run writes: the frames up to
    the checkpoint are copied into a new file (under a temporary name) that replaces the old one
    only once it holds them and the checkpoint, and the run goes on from the checkpoint's state
    and step: a resume killed at any instant leaves a path that resumes. ``writer``: keyword
    arguments of the file's ``jl.HDF5Writer``; ``sinks``: more sinks, which get the whole
    trajectory too. The run's ``meta=`` is the file's (``traj.meta``): one given that differs is
    refused.
    """
    from ..store.hdf5.writer import HDF5Writer

    __tracebackhide__ = hide_frame_from_checks
    steps = check_count(steps, "steps", minimum=0)
    for taken in ("state", "start_step"):
        if taken in kwargs:
            raise JaxlogError(f"resume(): {taken}= comes from the file's checkpoint, not from the caller")
    filtered = frozenset(r.name for r in normalize_records(kwargs.get("record")) if r.when is not None)
    leaves = None  # over several processes: the state's leaves, global, rebuilt from every part's blocks
    if jax.process_count() > 1:
        if sinks not in ((), [], None):
            raise JaxlogError(f"resume({path}): in a run over several processes the resumed run writes its parts of "
                              "the trajectory only; sinks= is not taken")
        found, leaves = prepare_parts(path, from_step, filtered=filtered)
    else:
        try:
            found = prepare(path, from_step, filtered=filtered)
        except JaxlogError:
            count = recorded_processes(Path(path))  # an index of parts holds no checkpoint of its own
            if count > 1:
                raise JaxlogError(f"{path} was recorded by {count} processes; this run has 1: resume it in as many "
                                  f"processes (jax.distributed), each continuing its own part") from None
            raise
    point = found.point
    try:
        if steps < point.step:
            raise JaxlogError(f"resume({path}, steps={steps}): the checkpoint is at step {point.step}, past the "
                              "run's total: steps is the whole run's length")
        where = f"{path} checkpoint at step {point.step}"
        kwargs = from_file(kwargs, point.meta, where)
        if like is None and point.meta.mesh is not None and leaves is None:
            mesh = ", ".join(f"{a!r}: {n}" for a, n in point.meta.mesh.items())
            raise JaxlogError(f"{where}: the run's state was sharded over a mesh ({mesh}); pass like=<a state placed "
                              "on that mesh> (e.g. the initial state) so the run resumes on it (on one device its "
                              "reductions would differ in their last bits from the uninterrupted run's)")
        if like is None:  # a state of tuples and lists (or one array) comes back without like=
            plain = template(point.meta.treedef)
            like = plain if beyond_dicts(plain) else None
        state = (placed_like(rebuild_state(found.checkpoint.state, found.checkpoint.key_impls, like, point.meta,
                                           where), like)
                 if leaves is None else rebuild_state(leaves, {}, like, point.meta, where))
        extra = list(sinks) if isinstance(sinks, (list, tuple)) else [sinks]
        file_sink = HDF5Writer(Path(path), **{"replace_at_checkpoint": point.step, **(writer or {})})
        result = resume_run(step, state, steps - point.step, point, start_step=point.step,
                            sinks=[file_sink, *extra], **kwargs)
    except BaseException as exc:
        partial = getattr(exc, "jaxlog_run", None)
        if isinstance(partial, Run):
            partial.resumed_from = point.step
        own = Path(path) if leaves is None else point.source.with_name(point.source.name[1:].split(RESUME_MARK)[0])
        if own.exists() and os.path.samefile(own, point.source):
            point.source.unlink()  # refused or failed before the file was replaced: it is as it was
        elif point.source.exists():  # replaced: the old trajectory stays readable under its second name
            exc.add_note(f"[jaxlog] the trajectory as it was before this resume is kept as {point.source}")
        raise
    point.source.unlink(missing_ok=True)
    result.resumed_from = point.step
    return result
