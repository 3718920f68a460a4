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
from ...record.frames import Schema
from ...record.schedule import as_schedule, check_count
from ..checkpoints.checkpoint import ResumePoint
from ..device import program
from ..device.plan import DEFAULT_BUDGET, Resolved, auto_chunk, check_when_values, lanes_of, log_lanes
from ..device.program import Plan
from ..prepare import identity
from ..prepare.identity import Cache
from ..device.program import Lane
from ..prepare.schema import (Segments, ValueSource, Values, as_segments, log_schedules, n_systems_of, resolve, short_error,
                              step_values, takes_values)

__all__ = ['RunConfig', 'configure', 'OPTIONS']

_NOT_AN_OPTION = {"option": False}  # a field of the run that jl.run takes no keyword for


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """``jl.run``'s options, declared once: by their public names, with the defaults ``jl.run``'s
    signature shows (``tests/test_run_options.py`` holds the two equal). Made once from what the
    caller gave (``drive.run``), then :func:`configure` checks it and returns it normalized, the
    same fields (``batched`` a ragged batch's :class:`Segments` where ``segments=`` is given, ``logs``
    ``(name, schedule)`` pairs, ``checkpoint`` a :class:`Schedule`, ``meta`` a dict) with what the
    checks derive (``lanes``, ``until_values``): what the rest of the driver reads by name."""

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
    resume: ResumePoint | None = field(default=None, metadata=_NOT_AN_OPTION)  # set by jl.resume
    lanes: tuple[Lane, ...] = field(default=(), metadata=_NOT_AN_OPTION)  # from record=, has_aux= and aux=
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


def configure(given: RunConfig, state: Any, resume: ResumePoint | None = None) -> RunConfig:
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
        given, steps=steps, start_step=start_step, lanes=lanes_of(given.record, bool(given.has_aux), given.aux),
        invariants=as_list(given.invariants), key=None if given.key is None else as_key(given.key, shape),
        chunk=chunk, has_aux=bool(given.has_aux), batched=shape, on_violation=check_on_violation(given.on_violation),
        postmortem=int(given.postmortem), chunk_budget_bytes=int(given.chunk_budget_bytes), donate=bool(given.donate),
        logs=log_schedules(given.logs), log_capacity=log_capacity,
        checkpoint=None if given.checkpoint is None else as_schedule(given.checkpoint, "checkpoint="), resume=resume,
        until_values=takes_values(given.until, "until="), meta=_meta(given.meta, resume))


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


# ---------------------------------------------------------------------------------------------
# What the checked options make of a run before any step runs: the plan and schema, the chunk
# capacity (``device.plan`` lays the plan out for it).

_RESOLVED = Cache("resolved runs")
_AUTO = Cache("auto chunk sizes")  # (id(schema), budget) -> (schema, auto_chunk)
def _aval_key(tree):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple((tuple(x.shape), x.dtype, bool(getattr(x, "weak_type", False))) for x in leaves)


def capacity_of(cfg: RunConfig, schema: Schema) -> int:
    """The program's capacity: :func:`auto_chunk`, whatever ``chunk=`` is (``chunk=`` is the number
    of steps per dispatch; short chunks fill one set of buffers together, see ``drive.device.chunks``), so
    runs with any chunk size and length share one executable. A ``chunk=`` beyond it (more steps
    per dispatch than the memory budget holds) gets a program of its own, of the chunk size or the
    run length if shorter; at least 2 rows either way (XLA folds a loop over one-row buffers into
    straight-line code, which changes the last bits of reductions)."""
    # schemas come from resolve_run's cache: computed once
    auto = _AUTO.memo((id(schema), cfg.budget), lambda: (schema, auto_chunk(schema, budget_bytes=cfg.budget)))[1]
    if cfg.chunk is None or cfg.chunk <= auto:
        return auto
    return max(2, min(cfg.chunk, cfg.steps))


def resolve_run(cfg: RunConfig, state) -> Resolved:
    """The run's :class:`Resolved`, from the cache when the step, records and state types were seen."""
    canon = identity.canonical(cfg.step, cfg.lanes, cfg.until, state, cfg.key,  # equal where they compute the same
                               lambda: n_systems_of(state, cfg.batched), cfg.log_capacity, _value_source(cfg, state))
    ck = (canon.step, canon.lanes, _aval_key(state), _aval_key(cfg.key), cfg.has_aux, cfg.batched, canon.until,
          cfg.dt, cfg.logs, cfg.log_capacity)
    try:
        hit = _RESOLVED.get(ck)
    except TypeError:  # an unhashable view: no cache
        ck, hit = None, None
    if hit is not None:
        return hit if hit.consts is canon.consts else hit._replace(consts=canon.consts)
    plan = Plan(step=canon.step, lanes=canon.lanes, dense=(), compact=(), initial=(), host_masks=(),
                has_aux=cfg.has_aux, keyed=cfg.keyed, n_systems=n_systems_of(state, cfg.batched), until=canon.until,
                length=0, collect=True, log_capacity=cfg.log_capacity, until_values=cfg.until_values,
                segments=cfg.batched if isinstance(cfg.batched, Segments) else None)

    def traced_step(st):  # through the collector: the step's output and what it logs
        return program.apply_logged(plan, cfg.key, jnp.int32(0), st)

    try:
        out_shape = program.logged_shapes(plan, cfg.key, jnp.int32(0), state)
    except JaxlogError:
        raise
    except Exception as e:
        raise JaxlogError(f"the step function failed on the state: {short_error(e)}{_hint(cfg)}") from None
    check_carry(state, out_shape[0], cfg)
    values = step_values(out_shape[1], out_shape[2])
    if cfg.until is not None:
        try:
            jax.eval_shape(lambda st, v: program.until_flags(plan, st, v), state, values)
        except JaxlogError:
            raise
        except Exception as e:
            raise JaxlogError(f"until= failed on the state: {short_error(e)}") from None
    check_when_values(plan, canon.lanes, state, values)
    plan = dataclasses.replace(plan, lanes=log_lanes(canon.lanes, cfg.logs, sorted(out_shape[2])),
                               collect=bool(out_shape[2]))
    aux_fn = (lambda st: traced_step(st)[1]) if cfg.has_aux else None
    found = resolve(plan.lanes, state, aux=aux_fn, logs=lambda st: traced_step(st)[2], batched=cfg.batched,
                    dt=cfg.dt, log_capacity=cfg.log_capacity,
                    values=lambda st: Values(step_values(*traced_step(st)[1:])))
    plan, schema = dataclasses.replace(plan, lanes=found.lanes), found.schema
    shapes = tuple({leaf.path: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for leaf in mine} for mine in found.per_lane)
    resolved = Resolved(plan, schema, shapes, sum(x.nbytes for x in jax.tree_util.tree_leaves(state)), canon.consts)
    return resolved if ck is None else _RESOLVED.put(ck, resolved)


def _value_source(cfg: RunConfig, state) -> ValueSource | None:
    """Where the run's predicates that take the step's values find their shapes (None: none
    takes them, nothing more is traced)."""
    if not cfg.until_values and not any(ln.when_values for ln in cfg.lanes):
        return None

    def shapes() -> dict | None:
        plan = Plan(step=cfg.step, lanes=(), dense=(), compact=(), initial=(), host_masks=(), has_aux=cfg.has_aux,
                    keyed=cfg.keyed, n_systems=n_systems_of(state, cfg.batched), until=None, length=0,
                    collect=True, log_capacity=cfg.log_capacity)
        try:
            _, aux, logs = program.logged_shapes(plan, cfg.key, jnp.int32(0), state)
        except Exception:  # the step does not trace: resolving the run says why
            return None
        return step_values(aux, logs)
    return ValueSource(shapes=shapes, key=cfg.has_aux, until=cfg.until_values)


def _hint(cfg: RunConfig) -> str:
    """What commonly goes wrong calling the step, said once."""
    if cfg.keyed:
        return " (with key=, the step is called as step(key, state))"
    return ""


def check_carry(state, new_shape, cfg: RunConfig) -> None:
    """The step returns a state of the same structure, shapes and dtypes (the device loop carries it)."""
    a, ta = jax.tree_util.tree_flatten_with_path(state)
    if not cfg.has_aux and isinstance(new_shape, tuple) and len(new_shape) == 2:
        if jax.tree_util.tree_structure(new_shape[0]) == ta:  # type: ignore[operator]  # jaxlib's stub
            raise JaxlogError("the step function returns a pair (state, something): pass has_aux=True to record "
                              "the second part as aux, or return only the state")
    b, tb = jax.tree_util.tree_flatten_with_path(new_shape)
    if ta != tb:  # type: ignore[operator]  # jaxlib's stub: PyTreeDef compares
        raise JaxlogError(f"the step function changed the state's structure: {ta} -> {tb}")
    for (kp, x), (_, y) in zip(a, b):
        if tuple(x.shape) != tuple(y.shape) or x.dtype != y.dtype:
            raise JaxlogError(f"the step function changed state leaf {jax.tree_util.keystr(kp)}: "
                              f"{x.dtype}{list(x.shape)} -> {y.dtype}{list(y.shape)}")
