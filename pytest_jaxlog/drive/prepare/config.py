"""``jl.run``'s options, declared once (:class:`RunConfig`: names, types, defaults), checked once
(:func:`configure`: errors before anything is traced) and kept by name."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import jax.numpy as jnp

from ...check.invariants import as_list, check_on_violation
from ...errors import JaxlogError
from ...record.records import check_meta
from ...record.schedule import as_schedule, check_count
from .schema import Segments, as_segments, log_schedules, takes_values

__all__ = ['RunConfig', 'configure', 'OPTIONS', 'DEFAULT_BUDGET']

DEFAULT_BUDGET = 64 * 2**20  # chunk_budget_bytes=: device memory for one chunk's record buffers (drive.device.plan)
_NOT_AN_OPTION = {"option": False}  # a field of the run that jl.run takes no keyword for


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """``jl.run``'s options, declared once: by their public names, with the defaults ``jl.run``'s
    signature shows (``tests/test_run_options.py`` holds the two equal). Made once from what the
    caller gave (``drive.run``), then :func:`configure` checks it and returns it normalized, the
    same fields (``batched`` a ragged batch's :class:`Segments` where ``segments=`` is given, ``logs``
    ``(name, schedule)`` pairs, ``checkpoint`` a :class:`Schedule`, ``meta`` a dict) with what the
    checks derive (``until_values``): what the rest of the driver reads by name. What the run
    records (``record=``, ``aux=``) becomes the program's lanes where the run is planned
    (``drive.device.plan``)."""

    step: Callable
    steps: int
    record: Any = None
    invariants: Any = ()
    sinks: Any = ()
    key: Any = None
    dt: float | None = None
    chunk: int | None = None
    profile: Any = None
    has_aux: bool = False
    aux: Any = None
    batched: bool | int | Segments = False
    until: Callable | None = None
    on_violation: str = "raise"
    postmortem: int = 3
    progress: Any = None
    chunk_budget_bytes: int = DEFAULT_BUDGET
    timeline: Any = None
    donate: bool = True
    start_step: int = 0
    logs: Any = None  # checked: ((name, schedule), ...); names not listed: every step
    log_capacity: int | None = None
    checkpoint: Any = None  # checked: a Schedule or None
    meta: Any = None  # checked: the run's JSON metadata as a dict (see record.records)
    segments: Any = None
    # set by jl.resume: the drive.checkpoints.ResumePoint it continues from (a later phase: named, not imported)
    resume: Any = field(default=None, metadata=_NOT_AN_OPTION)
    # until= takes (state, values): the step's aux and logs (see drive.prepare.schema)
    until_values: bool = field(default=False, metadata=_NOT_AN_OPTION)

    @property
    def keyed(self) -> bool:
        return self.key is not None

    @property
    def end(self) -> int:
        return self.start_step + self.steps

    @property
    def budget(self) -> int:
        return self.chunk_budget_bytes


OPTIONS = frozenset(f.name for f in dataclasses.fields(RunConfig)
                    if f.metadata.get("option", True) and f.name not in ("step", "steps"))


def configure(given: RunConfig, state: Any, resume: Any = None) -> RunConfig:
    """``given`` checked and normalized (see :class:`RunConfig`); ``state`` only to say when it
    looks swapped with ``step``; ``resume``: the checkpoint ``jl.resume`` continues from."""
    step, batched, log_capacity, chunk = given.step, given.batched, given.log_capacity, given.chunk
    steps = check_count(given.steps, "steps", minimum=0)
    start_step = check_count(given.start_step, "start_step", minimum=0)
    if start_step + steps >= 2**31:
        raise JaxlogError(f"step numbers up to {start_step + steps} do not fit the int32 step counter")
    if chunk is not None:
        chunk = check_count(chunk, "chunk", minimum=1, none="or None")
    if not callable(step):
        swapped = " (step and state look swapped: jl.run(step, state, steps))" if callable(state) else ""
        raise JaxlogError(f"step must be callable, got {type(step).__name__}{swapped}")
    if given.until is not None and not callable(given.until):
        raise JaxlogError(f"until= must be a callable state -> bool, got {given.until!r}")
    if not isinstance(batched, bool):
        batched = check_count(batched, "batched (the number of systems, or True/False)", minimum=1)
    shape: bool | int | Segments = batched if given.segments is None else as_segments(given.segments, batched)
    if log_capacity is not None:
        log_capacity = check_count(log_capacity, "log_capacity", minimum=1, none="or None")
    return dataclasses.replace(
        given, steps=steps, start_step=start_step, invariants=as_list(given.invariants),
        key=None if given.key is None else as_key(given.key, shape), chunk=chunk, has_aux=bool(given.has_aux),
        batched=shape, on_violation=check_on_violation(given.on_violation), postmortem=int(given.postmortem),
        chunk_budget_bytes=int(given.chunk_budget_bytes), donate=bool(given.donate), logs=log_schedules(given.logs),
        log_capacity=log_capacity,
        checkpoint=None if given.checkpoint is None else as_schedule(given.checkpoint, "checkpoint="), resume=resume,
        until_values=takes_values(given.until, "until="), meta=_meta(given.meta, resume))


def _meta(meta: Any, resume: Any) -> dict:
    """``meta=`` checked; a resumed run keeps the file's (a ``meta=`` that differs is refused)."""
    mine = None if meta is None else check_meta(meta)
    if resume is None:
        return mine or {}
    if mine is not None and mine != resume.run_meta:
        raise JaxlogError(f"resume(): meta= differs from the metadata of the run in the file ({resume.run_meta!r}): "
                          f"a resumed run keeps the file's; leave meta= out")
    return dict(resume.run_meta)


def as_key(key: Any, batched: bool | int | Segments = False) -> Any:
    """``key=`` as a key array: a typed key (``jax.random.key``) or raw key data
    (``jax.random.PRNGKey``: uint32, trailing axis the default impl's); anything else is one
    JaxlogError saying what a key is, not JAX's error from deep inside the first trace. One key:
    the run derives every step's (and in a batched run every system's) from it, so an array of
    keys (``jax.random.split(key, n)``, a key per system) is refused saying so."""
    try:
        arr = jnp.asarray(key)
    except (TypeError, ValueError) as e:
        raise JaxlogError(f"key= must be a PRNG key (jax.random.key(seed)), got {type(key).__name__} "
                          f"{key!r:.60} ({e})") from None
    typed = jax.dtypes.issubdtype(arr.dtype, jax.dtypes.prng_key)
    width = _raw_key_width()
    if not typed and (arr.dtype != jnp.uint32 or arr.ndim < 1 or arr.shape[-1] != width):
        raise JaxlogError(f"key= must be a PRNG key: a typed key (jax.random.key(seed)) or raw key data "
                          f"(jax.random.PRNGKey(seed): uint32[..., {width}]), got {arr.dtype}{list(arr.shape)}")
    keys = arr.shape if typed else arr.shape[:-1]
    if keys:
        batch = (" (this batched run makes one key per system itself: fold_in(step key, system), handed to "
                 "step(key, state) stacked, one row per system)" if batched is not False
                 else " (to run several systems with one key per system, pass batched=True: the run makes "
                      "them from the one key)")
        raise JaxlogError(f"key= must be one PRNG key, got an array of {math.prod(keys)} keys (shape {list(keys)}): "
                          f"jl.run derives each step's key from it, fold_in(key, step){batch}; pass one key, "
                          f"jax.random.key(seed)")
    return arr


@functools.cache
def _raw_key_width() -> int:
    return int(jax.random.key_data(jax.random.key(0)).shape[-1])
