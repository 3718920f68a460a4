"""``jl.run``'s arguments, checked once (errors before anything is traced) and kept by name."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import jax.numpy as jnp

from ..check.invariants import as_list, check_on_violation
from ..errors import JaxlogError
from ..record.runmeta import check_meta
from ..record.schedule import Schedule, as_schedule, check_count
from .checkpoint import ResumePoint
from .lanes import lanes_of
from .predicates import takes_values
from .program import Lane
from .ragged import Segments, as_segments
from .resolve import log_schedules

__all__ = ["RunConfig", "configure"]


@dataclass(frozen=True)
class RunConfig:
    """``jl.run``'s arguments, checked once: what the rest of the driver reads by name."""

    step: Callable
    steps: int
    start_step: int
    lanes: tuple[Lane, ...]
    invariants: tuple
    sinks: Any
    key: Any
    dt: float | None
    chunk: int | None
    profile: Any
    has_aux: bool
    batched: bool | int | Segments  # segments=: the ragged batch, each graph a system
    until: Callable | None
    on_violation: str
    postmortem: int
    progress: Any
    budget: int
    timeline: Any
    donate: bool
    checkpoint: Schedule | None = None
    resume: ResumePoint | None = None  # set by jl.resume
    logs: tuple[tuple[str, Schedule], ...] = ()  # logs=: (name, schedule); names not listed: every step
    log_capacity: int | None = None
    until_values: bool = False  # until= takes (state, values): the step's aux and logs (see drive.predicates)
    meta: dict = field(default_factory=dict)  # meta=: the run's JSON metadata (see record.runmeta)

    @property
    def keyed(self) -> bool:
        return self.key is not None

    @property
    def end(self) -> int:
        return self.start_step + self.steps


def configure(step: Callable, state: Any, steps: int, *, record: Any, invariants: Any, sinks: Any, key: Any, dt: float | None,
              chunk: int | None, profile: Any, has_aux: bool, aux: Any, batched: bool | int, until: Callable | None,
              on_violation: str, postmortem: int, progress: Any, chunk_budget_bytes: int, timeline: Any,
              donate: bool, start_step: int, logs: Any, log_capacity: int | None, checkpoint: Any,
              resume: ResumePoint | None = None, meta: Any = None, segments: Any = None) -> RunConfig:
    """``jl.run``'s arguments (its defaults are in its signature) checked, as a :class:`RunConfig`;
    ``state`` only to say when it looks swapped with ``step``; ``resume``: the checkpoint
    ``jl.resume`` continues from; ``segments``: a ragged batch's graph of each row (it makes the
    run batched, one system per graph)."""
    steps = check_count(steps, "steps", minimum=0)
    start_step = check_count(start_step, "start_step", minimum=0)
    if start_step + steps >= 2**31:
        raise JaxlogError(f"step numbers up to {start_step + steps} do not fit the int32 step counter")
    if chunk is not None:
        chunk = check_count(chunk, "chunk", minimum=1, none="or None")
    if not callable(step):
        swapped = " (step and state look swapped: jl.run(step, state, steps))" if callable(state) else ""
        raise JaxlogError(f"step must be callable, got {type(step).__name__}{swapped}")
    if until is not None and not callable(until):
        raise JaxlogError(f"until= must be a callable state -> bool, got {until!r}")
    if not isinstance(batched, bool):
        batched = check_count(batched, "batched (the number of systems, or True/False)", minimum=1)
    shape: bool | int | Segments = batched if segments is None else as_segments(segments, batched)
    if log_capacity is not None:
        log_capacity = check_count(log_capacity, "log_capacity", minimum=1, none="or None")
    return RunConfig(step=step, steps=steps, start_step=start_step, lanes=lanes_of(record, bool(has_aux), aux),
                     invariants=as_list(invariants), sinks=sinks, key=None if key is None else as_key(key, shape), dt=dt,
                     chunk=chunk, profile=profile, has_aux=bool(has_aux), batched=shape, until=until,
                     on_violation=check_on_violation(on_violation), postmortem=int(postmortem), progress=progress,
                     budget=int(chunk_budget_bytes), timeline=timeline, donate=bool(donate),
                     logs=log_schedules(logs), log_capacity=log_capacity,
                     checkpoint=None if checkpoint is None else as_schedule(checkpoint, "checkpoint="), resume=resume,
                     until_values=takes_values(until, "until="), meta=_meta(meta, resume))


def _meta(meta: Any, resume: ResumePoint | None) -> dict:
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

