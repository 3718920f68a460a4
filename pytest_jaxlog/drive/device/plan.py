"""A run planned before any step runs. What enters: the checked options (``drive.prepare.config``'s
``RunConfig``, read by name) and the state. What leaves: what the run records as lanes of the
chunk program (the views of ``record=``, the aux leaves ``aux=`` chooses, the values the step
logs with ``jl.log``), the plan and schema (:class:`Resolved`), the chunk capacity and the plan
laid out for it, the state as the program carries it."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ...errors import JaxlogError
from ...record.frames import Schema
from ...record.records import AUX, LOG, check_name, normalize_records
from ...record.schedule import Schedule, as_schedule
from ..prepare import identity
from ..prepare.config import DEFAULT_BUDGET, RunConfig
from ..prepare.identity import Cache
from ..prepare.schema import (AUX_SCHEDULE, LOG_SCHEDULE, Segments, ValueSource, Values, n_systems_of, resolve,
                              short_error, step_values, takes_values)
from . import program
from .program import Lane, Plan

__all__ = ['lanes_of', 'log_lanes', 'resolve_run', 'capacity_of', 'auto_chunk', 'laid_out', 'signature_of', 'as_arrays',
           'Resolved', 'CHUNK_CAP']


_LANES = Cache("lanes")  # (record's items, has_aux, aux) -> lanes: what the last runs asked for


def lanes_of(record: Any, has_aux: bool, aux: Any) -> tuple[Lane, ...]:
    """Views as lanes, then the aux leaves (all every step by default; ``aux=`` chooses which
    and on which schedule). Kept per ``record=`` contents (its views and records compared as
    the compiled program's cache compares them): a test suite's runs ask for the same ones
    again and again."""
    try:
        key = (None if record is None else tuple(record.items()), has_aux, aux)
        found = _LANES.get(key)
    except (TypeError, AttributeError):  # unhashable parts (an aux= dict), not a dict: made each time
        key, found = None, None
    if found is None:
        found = _make_lanes(record, has_aux, aux)
        if key is not None:
            _LANES.put(key, found)
    return found


def _make_lanes(record: Any, has_aux: bool, aux: Any) -> tuple[Lane, ...]:
    lanes = [Lane(s.name, s.schedule, view=s.view, when=s.when, when_values=takes_values(s.when, f"record {s.name!r}: when="))
             for s in normalize_records(record, reserved=(AUX, LOG))]
    if aux is not None and not has_aux:
        raise JaxlogError("aux= chooses aux leaves to record, but has_aux=False: the step returns only the state")
    if has_aux:
        if aux is None:
            lanes.append(Lane(AUX, AUX_SCHEDULE, aux_paths=(AUX,)))
        else:
            if isinstance(aux, str):
                aux = {aux: None}
            elif not isinstance(aux, Mapping):
                aux = {name: None for name in aux}
            by_schedule: dict[Schedule, list[str]] = {}
            for name, when in aux.items():
                if not isinstance(name, str) or not name or name.startswith("/") or name.endswith("/"):
                    raise JaxlogError(f"aux=: {name!r} is not an aux leaf name (e.g. 'acceptance_rate' or 'info/energy')")
                for part in name.split("/"):
                    check_name(part, "aux= name part")
                schedule = AUX_SCHEDULE if when is None else as_schedule(when, f"aux={{{name!r}: ...}}")
                by_schedule.setdefault(schedule, []).append(f"{AUX}/{name}")
            lanes += [Lane(AUX, s, aux_paths=tuple(paths)) for s, paths in by_schedule.items()]
    return tuple(lanes)


def log_lanes(lanes: tuple[Lane, ...], logs: tuple[tuple[str, Schedule], ...], logged: list[str]) -> tuple[Lane, ...]:
    """The run's lanes once the step's logs are known: its views and aux selections, then lanes
    for the names the step logs, grouped by schedule (``logs=``; the rest every step). Views
    that call ``jl.log`` are found (and wrapped) as they are resolved."""
    named = dict(logs)
    unknown = sorted(set(named) - set(logged))
    if unknown:
        raise JaxlogError(f"logs= names {unknown}, but the step never logs them with jl.log "
                          f"(it logs: {', '.join(logged) or 'nothing'})")
    by_schedule: dict[Schedule, list[str]] = {}
    for name in logged:
        by_schedule.setdefault(named.get(name, LOG_SCHEDULE), []).append(f"{LOG}/{name}")
    return (*lanes, *(Lane(LOG, sched, log_paths=tuple(paths)) for sched, paths in by_schedule.items()))

# ---------------------------------------------------------------------------------------------
# What a kernel, its records and its state's types make of a run, worked out before any step
# runs: the plan and schema (:func:`resolve_run`), the chunk capacity, the plan laid out for it,
# the chunk's argument signature. Each is kept per kernel (see ``drive.prepare.identity``): tracing the step
# and every view costs milliseconds, which matters for short runs.

CHUNK_CAP = 10_000

_RESOLVED = Cache("resolved runs")
_AUTO = Cache("auto chunk sizes")  # (id(schema), budget) -> (schema, auto_chunk)
_SIGNATURES = Cache("chunk signatures")  # (program, plan, id(resolved)) -> (resolved, an uncommitted run's Signature)
_LAID_OUT = Cache("laid-out plans")  # (resolved plan, capacity, its shapes, pack) -> (shapes, the plan laid out, interned)


def auto_chunk(schema: Schema, steps: int | None = None, budget_bytes: int = DEFAULT_BUDGET,
               cap: int = CHUNK_CAP) -> int:
    """The capacity ``chunk=None`` picks: most work steps per chunk.

    ``min(cap, budget_bytes // bytes_per_step)``, at least 2, where ``bytes_per_step`` is the
    recorded data one step adds (every-step leaves in full, sparser ones by their density). It
    does not depend on the run length (``steps`` is accepted and ignored), so runs of any length
    with the same kernel and records run one compiled program; a run shorter than the capacity
    runs one short chunk, and only its rows come to the host. The budget bounds device and host
    memory per chunk whatever the run length; the cap (10,000 steps) keeps the first frames and
    invariant checks coming while the run goes on; for long runs it gives a few hundred
    dispatches per million steps, which costs ~nothing.
    """
    per_step = 0.0
    for leaf in schema.leaves:
        nbytes = int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
        per_step += step_bytes(nbytes, leaf.schedule, cap)
    return capacity_for(per_step, budget_bytes, cap)


def step_bytes(nbytes: int, schedule, cap: int = CHUNK_CAP) -> float:
    """What a leaf of ``nbytes`` recorded on ``schedule`` adds per step, at most (by its density)."""
    return nbytes * schedule.max_in_span(cap) / cap


def capacity_for(per_step: float, budget_bytes: int = DEFAULT_BUDGET, cap: int = CHUNK_CAP) -> int:
    """The capacity of a chunk whose records add ``per_step`` bytes a step: as many steps as the
    budget holds, within ``cap``, at least 2."""
    limit = cap if per_step <= 0 else int(budget_bytes // per_step)
    return int(max(2, min(cap, limit)))


class Resolved(NamedTuple):
    """What a kernel, its records and its state's types make of a run, worked out before any
    step runs; cached per (step, records, state shapes) like jit caches (tracing the step and
    every view costs milliseconds, which matters for short runs)."""

    plan: Plan  # without its chunk layout (see ``laid_out``)
    schema: Schema
    shapes: tuple[dict, ...]  # per lane: leaf path -> frame ShapeDtypeStruct
    state_bytes: int  # device memory the state takes
    consts: tuple = ()  # the run's hoisted constants (the chunk's last argument, see drive.prepare.identity)


def check_when_values(plan: Plan, lanes: tuple, state, values: dict) -> None:
    """Each ``when=`` that takes the step's values, asked once on their shapes: a missing key or
    a flag of the wrong type is said before the run, with the record named."""
    for lane in lanes:
        if not lane.when_values:
            continue
        try:
            jax.eval_shape(lambda st, v, ln=lane: program.when_flag(ln, st, plan, values=v), state, values)
        except JaxlogError:
            raise
        except Exception as e:
            raise JaxlogError(f"record {lane.name!r}: when= failed on the state and the step's values: "
                              f"{short_error(e)}") from None


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
    """The run's :class:`Resolved`, from the cache when the step, records and state types were
    seen: ``record=`` and ``aux=`` made lanes (:func:`lanes_of`), the step and views traced once
    on the state's types, their logs added as lanes, the schema of every recorded leaf."""
    lanes = lanes_of(cfg.record, cfg.has_aux, cfg.aux)
    canon = identity.canonical(cfg.step, lanes, cfg.until, state, cfg.key,  # equal where they compute the same
                               lambda: n_systems_of(state, cfg.batched), cfg.log_capacity,
                               _value_source(cfg, lanes, state))
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


def _value_source(cfg: RunConfig, lanes: tuple[Lane, ...], state) -> ValueSource | None:
    """Where the run's predicates that take the step's values find their shapes (None: none
    takes them, nothing more is traced)."""
    if not cfg.until_values and not any(ln.when_values for ln in lanes):
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


def programs_of(resolved: Resolved) -> dict | None:
    """What the run's functions compute, as a checkpoint records it (see ``drive.prepare.identity``)."""
    plan = resolved.plan
    return identity.fingerprints(plan.step, plan.until, plan.lanes, resolved.consts)


def signature_of(fn: Callable, plan: Plan, resolved: Resolved, args: tuple, given: list) -> program.Signature:
    """The chunk's argument signature, for ``run.compiled_chunk()``. When none of the arrays the
    caller gave (``given``: the state's leaves and the key) is committed, it follows from the
    program and what was resolved (their types; the buffers, the scalars and the masks are the
    plan's, placed like them), so it is read from the arguments once per kernel; otherwise every
    time (the shardings are the caller's)."""
    if any(getattr(x, "committed", False) for x in given):
        return program.Signature.of(args)
    return _SIGNATURES.memo((fn, plan, id(resolved)), lambda: (resolved, program.Signature.of(args)))[1]


def laid_out(plan: Plan, capacity: int, shapes: tuple[dict, ...], pack: bool, block: int = 1) -> Plan:
    """``plan`` with the chunk layout for ``capacity`` and its blocks of ``block`` slots, interned;
    computed once per resolved plan and its leaves' shapes (a warm short run's host work is tens
    of microseconds a piece)."""
    return _LAID_OUT.memo((plan, capacity, id(shapes), pack, block), lambda: (shapes, program.intern(
        dataclasses.replace(plan, **program.layout(plan.lanes, capacity, shapes, pack, block)))))[1]


def as_arrays(state):
    """The state as device arrays with strong types; a leaf that cannot be one is an error
    naming it (jl.run carries the whole state through its device loop: configuration belongs in
    the step's closure). Weak types (Python scalars, ``jnp.asarray(1.0)``) are made strong once,
    here, so the first chunk and the later ones compile to one program. A traced state (``jl.run``
    called inside ``jax.jit``, ``vmap`` or ``make_jaxpr``) is refused: the driver dispatches its
    compiled loop from the host and reads the frames back, which a trace cannot do."""
    traced = [kp for kp, x in jax.tree_util.tree_flatten_with_path(state)[0] if isinstance(x, jax.core.Tracer)]
    if traced:
        raise JaxlogError(f"state leaf {jax.tree_util.keystr(traced[0]) or '(the state itself)'} is a tracer: jl.run "
                          "was called inside a JAX transformation (jit, vmap, grad, make_jaxpr); it runs its own "
                          "compiled loop from the host, so call it outside (for a record inside a jitted function, "
                          "use jl.log and jl.spool)")
    if all(isinstance(x, jax.Array) and not getattr(x, "weak_type", True) and not x.is_deleted()
           for x in jax.tree_util.tree_leaves(state)):
        return state  # (a test's runs mostly pass such states: nothing to look at leaf by leaf)
    pairs, treedef = jax.tree_util.tree_flatten_with_path(state)
    out = []
    for kp, leaf in pairs:
        if isinstance(leaf, jax.Array) and leaf.is_deleted():
            raise JaxlogError(f"state leaf {jax.tree_util.keystr(kp) or '(the state itself)'} was deleted (donated to "
                              f"an earlier jitted call?): pass a live array")
        if isinstance(leaf, jax.Array) and not getattr(leaf, "weak_type", True):  # already what the loop carries
            out.append(leaf)
            continue
        try:
            arr = jnp.asarray(leaf)
            out.append(jnp.asarray(arr, dtype=arr.dtype) if getattr(arr, "weak_type", False) else arr)
        except (TypeError, ValueError) as e:
            where = jax.tree_util.keystr(kp) or "(the state itself)"
            raise JaxlogError(
                f"state leaf {where} is {type(leaf).__name__} {leaf!r:.60}, not an array: jl.run carries the "
                f"state on the device, so every leaf must be a numeric array (keep configuration such as "
                f"names or settings out of the state, e.g. in the step function's closure) ({e})"
            ) from None
    return jax.tree_util.tree_unflatten(treedef, out)


def placed_alike(state, *others):
    """The state with every leaf committed to the one device that a leaf of it, or of ``others``
    (the key, the step's hoisted constants), is committed to (``jax.device_put(x, device)``;
    MJX's ``d.time`` is one), where its leaves are not all committed. A jitted computation's
    outputs are committed when any of its inputs is, and jit compiles a program for each mix of
    committed and uncommitted arguments: the first chunk's state would be uncommitted and the
    next chunk's (the first's output) committed, compiling the same program twice. Arrays
    sharded over several devices, or committed to different devices, leave the state as it is
    (jit places or refuses them)."""
    leaves = jax.tree_util.tree_leaves(state)
    committed = [x for x in (*leaves, *jax.tree_util.tree_leaves(others)) if isinstance(x, jax.Array) and x.committed]
    if not committed or all(isinstance(x, jax.Array) and x.committed for x in leaves):
        return state
    devices = {d for x in committed for d in x.sharding.device_set}
    if len(devices) != 1 or any(len(x.sharding.device_set) != 1 for x in committed):
        return state
    device = devices.pop()
    return jax.tree_util.tree_map(
        lambda x: x if isinstance(x, jax.Array) and x.committed else jax.device_put(x, device), state)


