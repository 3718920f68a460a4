"""What each view returns for a given state, found before any step runs (the schema), the
predicates that see what the step computed (``until=``, ``when=``), and ragged batches
(``segments=``)."""

from __future__ import annotations

import collections
import dataclasses
import functools
import inspect
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ...errors import JaxlogError
from ...logs import Shapes, collect, has_logs, shapes_and_logs
from ...logs.primitive import check_log_name
from ...record.frames import LeafSpec, Schema
from ...record.records import AUX, LOG, WHEN, leaf_paths
from ...record.schedule import Every, Schedule, as_schedule
from ...record.values import check_dt

__all__ = ['Segments', 'as_segments', 'Values', 'ValueSource', 'takes_values', 'step_values', 'ask']

@dataclasses.dataclass(frozen=True)
class Segments:
    """A ragged batch by its graphs' sizes (rows per graph, graphs in order): equal sizes, equal
    batches, so it hashes and compares as part of a compiled program's plan."""

    counts: tuple[int, ...]

    @property
    def n_graphs(self) -> int:
        return len(self.counts)

    @property
    def n_rows(self) -> int:
        return sum(self.counts)

    @functools.cached_property
    def ids(self) -> np.ndarray:
        """Each row's graph (int32), read only."""
        out = np.repeat(np.arange(self.n_graphs, dtype=np.int32), self.counts)
        out.flags.writeable = False
        return out

    def rows_of(self, graph: int) -> slice:
        start = sum(self.counts[:graph])
        return slice(start, start + self.counts[graph])

    def leading(self, n: int) -> str | None:
        """What a leaf leading with ``n`` is in this batch: ``"graphs"``, ``"rows"`` or None
        (neither: shared by all graphs). Where every graph has one row, rows are graphs."""
        if n == self.n_graphs:
            return "graphs"
        return "rows" if n == self.n_rows else None


def as_segments(ids: Any, batched: Any) -> Segments:
    """``segments=`` checked once, before anything is traced: one clear error per way it can be
    wrong (what it must be, where it is not). ``batched``: ``jl.run``'s, which may say nothing
    more than the ids do."""
    if isinstance(ids, jax.core.Tracer):
        raise JaxlogError("segments= is a tracer: the graph of each row must be known on the host when the run is "
                          "set up (pass a concrete numpy or jax array)")
    try:
        arr = np.asarray(jax.device_get(ids))
    except Exception as e:  # noqa: BLE001  (any object that is no array: said as such)
        raise JaxlogError(f"segments= must be an int array of each row's graph, got {type(ids).__name__} ({e})") from None
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise JaxlogError(f"segments= must be an int array of each row's graph (shape [rows], values 0..G-1), "
                          f"got dtype {arr.dtype}")
    if arr.ndim != 1 or arr.size == 0:
        raise JaxlogError(f"segments= must be one graph id per row, shape [rows] with rows >= 1, "
                          f"got shape {list(arr.shape)}")
    arr = arr.astype(np.int64)
    if arr[0] != 0:
        raise JaxlogError(f"segments=: graphs are numbered from 0, and the first row's graph is {int(arr[0])} "
                          f"(every graph 0..G-1 needs at least one row)")
    step = np.diff(arr)
    back = np.flatnonzero(step < 0)
    if back.size:
        r = int(back[0]) + 1
        raise JaxlogError(f"segments= must be sorted (each graph's rows together, graph 0 first): row {r} is of "
                          f"graph {int(arr[r])} after row {r - 1} of graph {int(arr[r - 1])}; order the packed "
                          f"leaves by graph (a stable argsort of the ids)")
    gap = np.flatnonzero(step > 1)
    if gap.size:
        r = int(gap[0]) + 1
        raise JaxlogError(f"segments=: graph {int(arr[r - 1]) + 1} has no rows (row {r - 1} is of graph "
                          f"{int(arr[r - 1])}, row {r} of graph {int(arr[r])}); every graph 0..G-1 needs at least "
                          f"one row")
    counts = tuple(int(n) for n in np.bincount(arr))
    if batched is not True and batched is not False and batched is not None and int(batched) != len(counts):
        raise JaxlogError(f"segments= holds {len(counts)} graphs, but batched={batched!r} says {int(batched)} "
                          f"systems: segments= makes each graph a system; leave batched= out")
    return Segments(counts)

# ---------------------------------------------------------------------------------------------
# Schema resolution: what each view returns for a given state, found before any step runs.
#
# Views are traced abstractly (``jax.eval_shape``), so a bad view (non-array leaves, strings,
# a shape that does not fit ``batched=True``) fails with the record path named, before the run.
# The same flattening (``flatten_view``) is used inside the jitted drivers, so the paths in the
# schema and the paths in the frames cannot disagree.

AUX_SCHEDULE = Every(1, start=1)  # aux comes out of the application k -> k+1: recorded at k+1
LOG_SCHEDULE = AUX_SCHEDULE  # so do the step's logs


@dataclasses.dataclass(frozen=True)
class LoggingView:
    """A view that calls ``jl.log``: evaluated under :func:`collect`, returning ``(out, logs)``;
    its logs are recorded as ``"log/<name>"`` on the view's schedule."""

    view: Callable
    capacity: int | None = None

    def __call__(self, state: Any) -> tuple[Any, dict]:
        return collect(self.view, capacity=self.capacity)(state)


@dataclasses.dataclass(frozen=True)
class BroadcastView:
    """A view of a batched state some of whose leaves are plain scalars (a temperature shared by
    all systems): each scalar is broadcast to the ``n_systems`` systems, so every record has its
    row per system as the rest do, not refused for lacking a system axis."""

    view: Callable
    n_systems: int

    def __call__(self, state: Any) -> Any:
        return jax.tree_util.tree_map(self._broadcast, self.view(state))

    def _broadcast(self, x: Any) -> Any:
        return jnp.broadcast_to(x, (self.n_systems,)) if jnp.shape(x) == () else x




@dataclasses.dataclass(frozen=True)
class WhenFlags:
    """The view of a batched record's ``when=`` that returns one bool per system: recorded as
    ``"when/<record>"`` beside the record, on its schedule and with its ``when=``, so each kept
    row also says which systems it was kept for (a row is kept where any system's flag holds;
    ``traj.system(i)`` reads back only system i's own rows)."""

    when: Callable

    def __call__(self, state: Any, values: Any = None) -> Any:
        """The flags; ``values``: the step's, for a ``when=`` that takes them."""
        return self.when(state) if values is None else self.when(state, values)


def _when_lanes(lane: Any, state: Any, n_systems: int | None, names: set[str],
                values: Callable[[Any], dict] | None = None) -> list:
    """The ``"when/<record>"`` lane of a batched view lane whose ``when=`` returns one bool per
    system (none otherwise: one bool keeps or drops a row for every system alike). ``values``:
    ``state -> the step's values``, for a ``when=`` that takes them."""
    if n_systems is None or lane.when is None or lane.aux_paths is not None or lane.log_paths is not None:
        return []
    try:
        if lane.when_values:
            flag = jax.eval_shape(lambda st: lane.when(st, values(st)), state)
        else:
            flag = jax.eval_shape(lane.when, state)
    except Exception:  # the program reports a when= that fails, with the record named
        return []
    if getattr(flag, "shape", None) != (n_systems,) or getattr(flag, "dtype", None) != jnp.bool_:
        return []
    if WHEN in names:
        raise JaxlogError(f"record name {WHEN!r} is taken: in a batched run, {WHEN}/<record> holds which systems "
                          f"each row of a per-system when= record was kept for (record {lane.name!r}); rename it")
    return [dataclasses.replace(lane, name=f"{WHEN}/{lane.name}", view=WhenFlags(lane.when))]


def view_values(name: str, view: Callable, state: Any, *, keys_as_data: bool = True) -> dict[str, Any]:
    """``{record path: value}`` of one view on ``state``, what it logs (``"log/<name>"``) included."""
    if isinstance(view, BroadcastView):
        values = view_values(name, view.view, state, keys_as_data=keys_as_data)
        return {p: view._broadcast(v) for p, v in values.items()}
    if isinstance(view, LoggingView):
        out, logs = view(state)
        values = flatten_view(name, out, keys_as_data=keys_as_data)
        values.update(flatten_view(LOG, logs, keys_as_data=keys_as_data))
        return values
    return flatten_view(name, view(state), keys_as_data=keys_as_data)


def _view_logs(view: Callable, state: Any) -> bool:
    try:
        return has_logs(view, state)
    except JaxlogError:
        raise
    except Exception:  # a view that cannot be traced (a hand-written loop's view of any object) runs
        return False  # eagerly, where jl.log does nothing: there is nothing to collect


class LeftOut(Schedule):
    """``logs={"x": False}``: the log ``x`` is not recorded (its lane is dropped when the run's
    lanes are resolved). A schedule so that it travels where the others do; it names no step."""

    def steps_between(self, lo: int, hi: int) -> np.ndarray:
        return np.zeros(0, np.int64)

    def mask(self, steps: np.ndarray) -> np.ndarray:
        return np.zeros(np.shape(steps), bool)

    def max_in_span(self, length: int) -> int:
        return 0

    def to_json(self) -> dict:
        return {"kind": "left out"}

    def __repr__(self) -> str:
        return "False"


LEFT_OUT = LeftOut()


def log_schedules(logs: Any) -> tuple[tuple[str, Schedule], ...]:
    """``jl.run(logs=...)``: (log name, schedule) pairs. As ``aux=``: a dict of name -> schedule
    (an int n means every n steps; None: the default, every step; False: left out, not recorded),
    or a name or list of names (each every step). Names not listed are recorded every step. Logs
    come out of the application k -> k+1, like aux, so "every step" means steps 1, 2, ..."""
    if logs is None:
        return ()
    if isinstance(logs, str):
        logs = {logs: None}
    elif isinstance(logs, (list, tuple)):
        logs = {name: None for name in logs}
    if not isinstance(logs, Mapping):
        raise JaxlogError(f"logs= must be a dict of log name -> schedule (False leaves a log out) or a list of "
                          f"log names, got {type(logs).__name__}")
    out: list[tuple[str, Any]] = []
    for name, sched in logs.items():
        check_log_name(name, "logs=")
        if sched is False:
            out.append((name, LEFT_OUT))
            continue
        sched = as_schedule(sched, f"logs={name!r}")
        out.append((name, LOG_SCHEDULE if sched.is_every_step else sched))
    return tuple(out)


def is_key(dtype: Any) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _numeric(dtype: Any) -> bool:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return False
    return dt == np.bool_ or bool(jnp.issubdtype(dt, jnp.number))


def flatten_view(name: str, tree: Any, *, keys_as_data: bool = True) -> dict[str, Any]:
    """A view's output as ``{record path: array}``; typed PRNG keys become their key data
    (``keys_as_data=False`` keeps them, so resolution can read their impl).

    Works on concrete arrays and on tracers (used inside the jitted chunk functions)."""
    pairs, _ = jax.tree_util.tree_flatten_with_path(tree)
    paths = leaf_paths(name, [kp for kp, _ in pairs])
    out = {}
    for path, (_, leaf) in zip(paths, pairs):
        if keys_as_data and hasattr(leaf, "dtype") and is_key(leaf.dtype):
            leaf = jax.random.key_data(leaf)
        out[path] = leaf
    return out


class LaneLeaves(NamedTuple):
    """A lane's schema leaves. ``logs``: its view calls ``jl.log``, so there are none yet: its
    leaves are those of the view wrapped to collect what it logs (``LoggingView``)."""

    leaves: tuple[LeafSpec, ...]
    logs: bool = False
    broadcast: bool = False  # some scalar leaves were taken as broadcast to every system (see BroadcastView)


def lane_leaves(name: str, record: str, schedule: Schedule, read: Callable[..., dict], args: tuple,
                n_systems: int | None, what: str, *, find_logs: bool = False,
                shared: Callable[[], frozenset] | None = None, rows: int | None = None) -> LaneLeaves:
    """The schema leaves of one lane: ``read(*args)`` gives its ``{path: value}`` (typed keys
    kept), traced abstractly with ``args`` as tracers, as in the run; a bad leaf is named.
    ``find_logs``: the same trace also says whether ``read`` calls ``jl.log`` (then no leaves).
    ``shared``: in a batched run, the paths of the leaves computed from no per-system state leaf
    (asked once, where a leaf is a scalar): such a scalar is shared by all systems and recorded
    broadcast to each (the caller reads it through :class:`BroadcastView`). ``rows``: a ragged
    batch's row count (``segments=``): a leaf may lead with its rows instead of its graphs."""
    impls: dict[str, str] = {}

    def traced(*args):
        out = read(*args)
        for path, leaf in out.items():
            if isinstance(leaf, jax.Array) and is_key(leaf.dtype):
                impls[path] = str(jax.random.key_impl(leaf))
        return out

    try:
        found = shapes_and_logs(traced, *args) if find_logs else Shapes(jax.eval_shape(traced, *args), logs=False)
    except JaxlogError:
        raise
    except Exception as e:  # the user's view failed while tracing: name it
        raise JaxlogError(f"{what} {name!r} failed on the state: {short_error(e)}") from None
    if found.logs:
        return LaneLeaves((), logs=True)
    shapes = found.shapes
    if not shapes:
        raise JaxlogError(f"{what} {name!r} returned no arrays")
    specs, broadcast, shared_paths = [], False, None
    for path, leaf in shapes.items():
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            raise JaxlogError(f"record {path!r}: leaf {leaf!r} is not an array")
        shape, dtype, key_impl = tuple(leaf.shape), leaf.dtype, None
        if is_key(dtype):
            key_impl = impls.get(path, "unknown")
            data = jax.eval_shape(jax.random.key_data, leaf)
            shape, dtype = tuple(data.shape), data.dtype
        elif not _numeric(dtype):
            raise JaxlogError(f"record {path!r}: dtype {dtype} is not numeric (recordable: bool, int, float, complex, keys)")
        if n_systems is not None and shared is not None and not leaf.shape:
            shared_paths = shared() if shared_paths is None else shared_paths
        if n_systems is not None and not leaf.shape and path in (shared_paths or ()):
            shape, broadcast = (n_systems, *shape), True
        elif n_systems is not None and (not leaf.shape or leaf.shape[0] not in (n_systems, rows)):
            raise JaxlogError(
                f"record {path!r}: batched runs record one row per system, so it needs a leading system axis of "
                f"size {n_systems}"
                + ("" if rows is None else f" (or, in this ragged batch, the {rows} rows of the graphs)")
                + f", got shape {tuple(leaf.shape)}"
                + (" (a scalar is recorded for every system only when it is computed from shared state leaves, "
                   "like a temperature; this one is computed from per-system leaves, e.g. a sum over the systems)"
                   if shared_paths is not None and not leaf.shape else "")
                + (f" (a value logged inside the jax.vmap'ed per-system function is recorded for every system, "
                   f"shared or not; log it there, or log jnp.broadcast_to(value, ({n_systems},)))"
                   if record == LOG and not leaf.shape else "")
            )
        specs.append(LeafSpec(path, record, shape, np.dtype(dtype), schedule, key_impl))
    return LaneLeaves(tuple(specs), broadcast=broadcast)


def n_systems_of(state: Any, batched: bool | int | Segments) -> int | None:
    """The number of systems of a batched state: ``batched=<int>`` says it; ``batched=True`` takes
    the leading axis size most non-scalar leaves share (scalars and other leaves are shared by
    all systems: a step counter, a box, a temperature). A ragged batch (``segments=``): its graphs."""
    if batched is False or batched is None:
        return None
    if isinstance(batched, Segments):
        return _graphs_of(state, batched)
    pairs = [(jax.tree_util.keystr(kp) or "(the state)", tuple(getattr(leaf, "shape", ())))
             for kp, leaf in jax.tree_util.tree_flatten_with_path(state)[0]]
    by_size: dict[int, list[str]] = {}
    for where, shape in pairs:
        if shape:
            by_size.setdefault(shape[0], []).append(where)
    if batched is not True:
        n = int(batched)
        if n not in by_size:
            raise JaxlogError(f"batched={n}: no state leaf has a leading system axis of size {n} "
                              f"(leading sizes: {_sizes(by_size)})")
        return n
    if not by_size:
        raise JaxlogError("batched=True needs state leaves with a leading system axis (every leaf is a scalar)")
    most = max(len(v) for v in by_size.values())
    winners = [n for n, v in by_size.items() if len(v) == most]
    if len(winners) > 1:
        raise JaxlogError(f"batched=True cannot tell the number of systems: state leaves disagree on the leading "
                          f"axis ({_sizes(by_size)}); pass batched=<number of systems>")
    return int(winners[0])


def _graphs_of(state: Any, segments: Segments) -> int:
    """A ragged batch's graph count, once some state leaf is laid out by it (its rows or its
    graphs): ids that describe no leaf are another state's."""
    sizes = {tuple(getattr(leaf, "shape", ()))[:1] for leaf in jax.tree_util.tree_leaves(state)}
    if (segments.n_rows,) not in sizes and (segments.n_graphs,) not in sizes:
        raise JaxlogError(f"segments= gives {segments.n_rows} rows in {segments.n_graphs} graphs, but no state leaf "
                          f"leads with {segments.n_rows} (rows) or {segments.n_graphs} (graphs) (leading sizes: "
                          f"{sorted(s[0] for s in sizes if s)})")
    return segments.n_graphs


def check_system_axes(state: Any, n_systems: int, segments: Segments | None = None) -> None:
    """Refuse per-system ``until=`` where a state leaf's system axis cannot be known: a finished
    system is frozen by keeping its index along the leading axis of every leaf, so each
    non-scalar leaf must have that axis (scalars are shared by all systems and go on). A leaf
    with another leading size is a ragged batch (graphs of different sizes concatenated) or an
    array shared by all systems: freezing could neither pick a system's part of it nor leave it
    running without the finished system moving on. A ragged batch given as one (``segments=``)
    freezes a graph's rows too: a leaf may lead with its rows."""
    for kp, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        shape = tuple(getattr(leaf, "shape", ()))
        if shape and segments is not None and segments.leading(shape[0]) is None:
            where = jax.tree_util.keystr(kp) or "(the state)"
            raise JaxlogError(
                f"until= per graph (segments=, {segments.n_graphs} graphs of {segments.n_rows} rows): state leaf "
                f"{where} has leading axis {shape[0]}, neither the rows ({segments.n_rows}) nor the graphs "
                f"({segments.n_graphs}), so a finished graph cannot be frozen in it (an array shared by all graphs, "
                f"or edges: lay such a leaf out by rows or graphs, or keep it out of the state, in the step's "
                f"closure or recomputed each step)")
        if shape and segments is None and shape[0] != n_systems:
            where = jax.tree_util.keystr(kp) or "(the state)"
            raise JaxlogError(
                f"until= per system (batched, {n_systems} systems): state leaf {where} has leading axis {shape[0]}, "
                f"not the system axis, so a finished system cannot be frozen in it (a ragged batch of systems "
                f"of different sizes, or an array shared by all systems, whose rows are not one per system); "
                f"per-system until= needs every non-scalar state leaf to lead with the {n_systems} systems "
                f"(give a ragged batch's graph of each row as segments=ids, or pad ragged systems to one "
                f"size), or run it with batched=False and an until= that returns one bool")


def _sizes(by_size: dict[int, list[str]]) -> str:
    return "; ".join(f"{n}: {', '.join(v)}" for n, v in sorted(by_size.items()))


@dataclasses.dataclass(frozen=True)
class Resolution:
    """What a run's or a Recorder's lanes produce on a state."""

    lanes: tuple[Any, ...]  # the lanes, views that call jl.log wrapped in LoggingView
    schema: Schema
    per_lane: tuple[tuple[LeafSpec, ...], ...]  # each lane's leaves, in lane order (what the record buffers hold)


def resolve(lanes: Sequence[Any], state: Any, *, aux: Callable[[Any], Any] | None = None,
            logs: Callable[[Any], Any] | None = None, batched: bool | int | Segments = False,
            dt: float | None = None,
            abstract: bool = True, log_capacity: int | None = None,
            values: Callable[[Any], Any] | None = None) -> Resolution:
    """The schema of ``lanes`` (``drive.device.program.Lane``: views, aux leaves of ``aux(state)``, the
    step's aux output, or logged values of ``logs(state)``, what the step logs) evaluated on
    ``state``: traced with the state abstract, as the run will (``abstract=False``: a Recorder
    state that is not a pytree of arrays, which its views see as it is). A view that calls
    ``jl.log`` is found by the trace that gives its shapes (each view is traced once unless it
    logs) and wrapped in :class:`LoggingView` with ``log_capacity``: its logs are recorded too.
    ``values``: ``state -> the step's values`` as a ``when=`` that takes them gets them."""
    n_sys = n_systems_of(state, batched)
    segments = batched if isinstance(batched, Segments) else None
    rows = None if segments is None else segments.n_rows
    if abstract:  # a run may store its state (checkpoints, post-mortem): under paths a file can hold
        leaf_paths("state", [kp for kp, _ in jax.tree_util.tree_flatten_with_path(state)[0]])
    args = (state,) if abstract else ()
    out_lanes: list = []
    per_lane: list[tuple[LeafSpec, ...]] = []
    if abstract:
        names = {ln.name for ln in lanes}
        lanes = [x for ln in lanes for x in (ln, *_when_lanes(ln, state, n_sys, names, values))]
    for lane in lanes:
        if lane.log_paths is not None and lane.schedule is LEFT_OUT:  # logs={"x": False}: not recorded
            continue
        if lane.log_paths is not None:
            mine = lane_leaves(lane.name, LOG, lane.schedule,
                               lambda st=state, ln=lane: ln.read(None, None, logs(st)), args, n_sys, "log",
                               rows=rows).leaves
        elif isinstance(lane.view, WhenFlags) and lane.when_values:  # per-system flags from the step's values
            mine = lane_leaves(lane.name, lane.name, lane.schedule,
                               lambda st=state, ln=lane: flatten_view(ln.name, ln.view(st, values(st))), args, n_sys,
                               "record").leaves
        elif lane.from_aux:
            if aux is None:
                raise JaxlogError("aux= selects aux leaves, but the step has no aux output (has_aux=True)")
            mine = lane_leaves(lane.name, AUX, lane.schedule,
                               lambda st=state, ln=lane: _aux_read(ln, aux(st)), args, n_sys, "step aux output",
                               rows=rows).leaves
        else:
            if not abstract and not isinstance(lane.view, LoggingView) and _view_logs(lane.view, state):
                lane = dataclasses.replace(lane, view=LoggingView(lane.view, log_capacity))
            can_share = n_sys is not None and abstract and not isinstance(lane.view, BroadcastView)
            found = lane_leaves(lane.name, lane.name, lane.schedule, _view_read(lane, state), args, n_sys, "record",
                                find_logs=abstract and not isinstance(lane.view, LoggingView),
                                shared=_shared_leaves(lane, state, n_sys, rows) if can_share else None, rows=rows)
            if found.logs:
                lane = dataclasses.replace(lane, view=LoggingView(lane.view, log_capacity))
                found = lane_leaves(lane.name, lane.name, lane.schedule, _view_read(lane, state), args, n_sys, "record",
                                    shared=_shared_leaves(lane, state, n_sys, rows) if can_share else None, rows=rows)
            if found.broadcast:
                lane = dataclasses.replace(lane, view=BroadcastView(lane.view, n_sys))
            mine = found.leaves
        out_lanes.append(lane)
        per_lane.append(mine)
    seen = collections.Counter(leaf.path for mine in per_lane for leaf in mine)
    dupes = sorted(p for p, n in seen.items() if n > 1 and p.startswith(LOG + "/"))
    if dupes:
        raise JaxlogError(f"{dupes[0]!r} is logged by more than one of: the step, the record views "
                          f"(give the logs different names)")
    schema = Schema(tuple(leaf for mine in per_lane for leaf in mine), batched=n_sys is not None,
                    dt=check_dt(dt), segments=None if segments is None else segments.counts)
    return Resolution(lanes=tuple(out_lanes), schema=schema, per_lane=tuple(per_lane))


def _shared_leaves(lane: Any, state: Any, n_systems: int, rows: int | None = None) -> Callable[[], frozenset]:
    """``() -> the paths of the view's leaves that no per-system state leaf flows into``: a
    temperature read from a shared leaf is the same for every system, while a total summed over
    the systems is not one system's value and stays refused. Found from the view's jaxpr, each
    equation's outputs taken to depend on all its inputs (a nested loop or call as a whole)."""
    def find() -> frozenset:
        try:
            closed, out = jax.make_jaxpr(lambda st: view_values(lane.name, lane.view, st), return_shape=True)(state)
        except Exception:  # not traceable as a whole: nothing is known to be shared, so nothing is broadcast
            return frozenset()
        per_system = [bool(getattr(x, "ndim", 0)) and x.shape[0] in (n_systems, rows)
                      for x in jax.tree_util.tree_leaves(state)]
        flows = {id(v) for v, sys in zip(closed.jaxpr.invars, per_system) if sys}
        for eqn in closed.jaxpr.eqns:
            if any(id(v) in flows for v in eqn.invars):
                flows.update(id(v) for v in eqn.outvars)
        paths = [kp[0].key for kp, _ in jax.tree_util.tree_flatten_with_path(out)[0]]  # out is {path: value}
        return frozenset(p for p, v in zip(paths, closed.jaxpr.outvars) if id(v) not in flows)
    return find


def _view_read(lane: Any, state: Any) -> Callable[..., dict]:
    """A view lane's values with typed keys kept (resolution reads their impl); called on the
    traced state, or on none (``abstract=False``: the state it closes over)."""
    return lambda st=state: view_values(lane.name, lane.view, st, keys_as_data=False)


def short_error(e: Exception, limit: int = 1500) -> str:
    """An exception raised while tracing user code, once and not pages long (JAX's tracer errors
    repeat themselves and can print a whole state)."""
    text = f"{type(e).__name__}: {e}"
    text = text.split("\n\nThe above exception")[0]
    return text if len(text) <= limit else text[:limit] + f" ... [{len(text) - limit} more characters]"


def _aux_read(lane: Any, aux_out: Any) -> dict:
    flat = flatten_view(AUX, aux_out, keys_as_data=False)
    got = {p: v for p, v in flat.items() if any(p == q or p.startswith(q + "/") for q in lane.aux_paths)}
    missing = [q for q in lane.aux_paths if not any(p == q or p.startswith(q + "/") for p in flat)]
    if missing:
        raise JaxlogError(f"aux= names {', '.join(repr(q.removeprefix(AUX + '/')) for q in missing)}, which the "
                          f"step's aux output does not have (it has: "
                          f"{', '.join(p.removeprefix(AUX + '/') for p in flat) or 'nothing'})")
    return got


def state_paths(state: Any) -> dict[str, Any]:
    """Host copies of the state's leaves as ``{"state/<keypath>": np.ndarray}`` (post-mortem)."""
    flat = flatten_view("state", state)
    return {p: np.array(jax.device_get(v)) for p, v in flat.items()}


def state_key_impls(state: Any) -> dict[str, str]:
    """``{"state/<keypath>": impl name}`` for the typed PRNG key leaves of ``state`` (the
    post-mortem stores their key data; sinks note the impl so the keys can be wrapped again)."""
    pairs, _ = jax.tree_util.tree_flatten_with_path(state)
    paths = leaf_paths("state", [kp for kp, _ in pairs])
    return {p: str(jax.random.key_impl(leaf)) for p, (_, leaf) in zip(paths, pairs)
            if hasattr(leaf, "dtype") and is_key(leaf.dtype)}

# ---------------------------------------------------------------------------------------------
# Predicates that see what the step computed: ``until=`` and ``when=`` called as
# ``pred(state, values)``.
#
# Why: an optimiser's gradient norm, a Metropolis step's acceptance, a solver's residual are
# computed by the step, not held in the state; copying them into the state changes its structure
# and every view of it. A predicate that takes a second argument gets them instead: ``values`` is
# a read-only mapping of the step's aux and ``jl.log`` values by the record paths a run gives them
# (``"aux/gnorm"``, ``"log/residual"``), for the step that produced the state, evaluated on the
# device like a state predicate.
#
# - The arity is read once from the callable's signature: two required positional parameters
#   mean ``(state, values)``; one (or ``*args``) means ``(state)``, as before, so such predicates
#   give the very same programs (parameters with defaults, as in ``lambda s, tol=1e-6: ...``,
#   do not count).
# - :class:`Values` is a pytree (its keys are its structure), so a predicate traced with it has a
#   program identity like any other function (``drive.prepare.identity``): runs whose predicates compute
#   the same share one program, others never do.
# - The initial state was computed by no step: a values predicate is first asked about step 1
#   (``until=`` is not checked on the initial state, ``when=`` does not keep its frame).

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def takes_values(fn: Callable | None, what: str) -> bool:
    """Whether ``fn`` is a ``(state, values)`` predicate (``what``: ``"until="``, ``"record 'x':
    when="``, for the error of one that requires more arguments)."""
    if fn is None:
        return False
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a callable without a signature (some builtins): called as (state)
        return False
    required = [p for p in sig.parameters.values() if p.kind in _POSITIONAL and p.default is p.empty]
    if len(required) > 2:
        raise JaxlogError(f"{what} {_name(fn)} requires {len(required)} arguments ({', '.join(p.name for p in required)}); "
                          f"a predicate takes (state) or (state, values), values being the step's aux and logs "
                          f"by record path")
    return len(required) == 2


def _name(fn: Callable) -> str:
    """A predicate's name for messages: a canonical callable's (``drive.prepare.identity``), or the
    function's own qualified name."""
    name = getattr(fn, "name", None)
    if isinstance(name, str):
        return name
    fn = getattr(fn, "func", fn)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


class Values(Mapping):
    """The step's aux and ``jl.log`` values by record path, as a predicate sees them: read only;
    a missing key is one :class:`JaxlogError` naming it, the predicate and the keys there are."""

    __slots__ = ("_items", "_what")

    def __init__(self, items: Mapping[str, Any], what: str = "a predicate"):
        self._items = dict(items)
        self._what = what

    def __getitem__(self, key: str) -> Any:
        try:
            return self._items[key]
        except (KeyError, TypeError):
            pass
        have = ", ".join(repr(k) for k in sorted(self._items)) or (
            "none: the step returns no aux (has_aux=True records it) and logs nothing with jl.log")
        hint = ""
        if isinstance(key, str) and not key.startswith((AUX + "/", LOG + "/")) and key not in (AUX, LOG):
            hint = f" (values are keyed by record path: 'aux/{key}' or 'log/{key}')"
        raise JaxlogError(f"{self._what}: the step computed no value {key!r}{hint}; it has: {have}")

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: str, default: Any = None) -> Any:
        return self._items.get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Values({', '.join(sorted(self._items))})"


def _flatten(v: Values) -> tuple[tuple, tuple]:
    keys = tuple(sorted(v._items))
    return tuple(v._items[k] for k in keys), keys


jax.tree_util.register_pytree_node(Values, _flatten, lambda keys, leaves: Values(dict(zip(keys, leaves))))


def step_values(aux: Any, logs: Any) -> dict[str, Any]:
    """``{record path: value}`` of what one step returned beside the state (``aux``, None
    without ``has_aux``) and logged (``logs``), with the paths its records get."""
    out = {} if aux is None else flatten_view(AUX, aux)
    if logs:
        out.update(flatten_view(LOG, logs))
    return out


def ask(pred: Callable, state: Any, values: Mapping[str, Any] | None, what: str) -> Any:
    """``pred(state, values)`` where the predicate takes values (``values`` not None), else
    ``pred(state)``."""
    if values is None:
        return pred(state)
    return pred(state, Values(values, f"{what} {_name(pred)}"))


class ValueSource(NamedTuple):
    """Where a run's predicates find the shapes of the step's values while they are traced for
    their program identity: ``shapes()`` (None where the step cannot be traced: the run reports
    that), ``key`` (what else they depend on, for caches), ``until``: whether ``until=`` takes them."""

    shapes: Callable[[], dict | None]
    key: Any
    until: bool
