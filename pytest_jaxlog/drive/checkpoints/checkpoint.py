"""Checkpoints and resume: a run continues bit-for-bit from the newest checkpoint in its file.

A checkpoint at step ``k`` is an attachment ``checkpoint/<k>`` of the trajectory file: the full
state (key paths, typed keys noted) and, written last, ``jaxlog_checkpoint``: what else the run
needs to go on exactly as if it had not stopped (the key, the invariants' running state and first
violation, the ``until=`` flags, the run's settings to check a resume against). The writer
writes attachments after every frame handed over before them, and a checkpoint counts only once
its ``jaxlog_checkpoint`` entry is in the file, so a checkpoint that is visible has every frame up
to its step on disk.

Schedules are pure functions of the step number, and the step's key is ``fold_in(key, k)``:
nothing else about the run's progress needs saving. ``jl.resume`` copies the frames up to the
checkpoint into a new file that replaces the old one only once it holds them and that checkpoint
(``store.hdf5.journal``; the old one is read through a second name meanwhile), then runs from the
checkpoint into it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ...errors import JaxlogError
from ...record.frames import Block
from ...record.schedule import schedule_from_json
from ...store.hdf5.parts import PartTree
from ..prepare.schema import flatten_view, state_key_impls, state_paths
from ..prepare.sharding import _norm

META = "jaxlog_checkpoint"  # the attachment entry that completes a checkpoint (written last)
NAME = "checkpoint"
COPY_STEPS = 10_000  # frames copied per batch on resume (bounded memory)


@dataclass
class CheckpointMeta:
    """What a checkpoint holds besides the state, as JSON."""

    step: int
    step_fn: str
    key: list | None
    key_impl: str | None
    invariants: list[dict]
    active: list[int]  # invariants still checked (warn/record modes drop one at its violation)
    violation: dict | None
    done: list | bool | None  # until= flags
    systems_done: list | None
    state_leaves: dict[str, list]  # path -> [shape, dtype], for a resume's state check
    treedef: str
    x64: bool
    schema: dict = field(default_factory=dict)
    dt: float | None = None
    # what the step, views and predicates compute (drive.prepare.identity.fingerprints); None in older files
    programs: dict | None = None
    # what a resume takes from the file when not given again; None in older files
    checkpoint: dict | None = None  # the run's checkpoint schedule
    invariant_specs: list | None = None  # check.invariants.spec_of of each invariant (None: code, not stored)
    # the mesh the state was sharded over ({axis: size}), None on one device: a resume must be given it
    mesh: dict | None = None

    def encode(self) -> np.ndarray:
        return json_array(asdict(self))

    @classmethod
    def decode(cls, raw: np.ndarray, where: str) -> "CheckpointMeta":
        what = f"the checkpoint's {META} entry"
        data = array_json(raw, where, what)
        try:
            meta = cls(**data)
        except TypeError as e:
            raise JaxlogError(f"{where}: {what} is not valid ({type(e).__name__}: {e})") from None
        wrong = [f"{name} is {type(getattr(meta, name)).__name__}" for name, kinds in _META_TYPES.items()
                 if not isinstance(getattr(meta, name), kinds) or isinstance(getattr(meta, name), bool) and
                 bool not in kinds]
        if wrong:
            raise JaxlogError(f"{where}: the checkpoint's {META} entry is not valid ({', '.join(wrong)})")
        return meta


def json_array(data: Any) -> np.ndarray:
    """JSON as a uint8 array: how a snapshot (a checkpoint, a sharded state) stores a record of itself."""
    return np.frombuffer(json.dumps(data).encode(), dtype=np.uint8).copy()


def array_json(raw: Any, where: str, what: str) -> Any:
    """The JSON ``json_array`` stored; anything else is one JaxlogError naming ``what``."""
    try:
        return json.loads(bytes(np.asarray(raw, dtype=np.uint8)).decode())
    except (ValueError, TypeError, UnicodeDecodeError, RecursionError) as e:
        raise JaxlogError(f"{where}: {what} is not valid ({type(e).__name__}: {e})") from None


# the JSON types of CheckpointMeta's fields (what a file says is checked before it is used)
_META_TYPES: dict[str, tuple] = {
    "step": (int,), "step_fn": (str,), "key": (list, type(None)), "key_impl": (str, type(None)),
    "invariants": (list,), "active": (list,), "violation": (dict, type(None)), "done": (list, bool, type(None)),
    "systems_done": (list, type(None)), "state_leaves": (dict,), "treedef": (str,), "x64": (bool,),
    "schema": (dict,), "dt": (float, int, type(None)), "checkpoint": (dict, type(None)),
    "invariant_specs": (list, type(None)), "mesh": (dict, type(None)),
}


def mesh_of(state: Any) -> dict | None:
    """``{axis: size}`` of the mesh the state's first leaf sharded over several devices lies on,
    or None: what a resume must place the state on again (see ``drive.resume.placed_like``)."""
    for leaf in jax.tree_util.tree_leaves(state):
        sharding = getattr(leaf, "sharding", None)
        mesh = getattr(sharding, "mesh", None)
        if mesh is not None and len(sharding.device_set) > 1:
            return {str(name): int(size) for name, size in mesh.shape.items()}
    return None


def step_name(step: Any) -> str:
    """The step function's module and qualified name: how messages name it, and how a resume
    recognises it in files written before checkpoints held what it computes (``programs``)."""
    fn = getattr(step, "__wrapped__", step)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


@dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint of a file: the state's arrays by path (typed keys as key data,
    with their impls) and what else the run needs (``meta``)."""

    step: int
    state: dict[str, np.ndarray]
    key_impls: dict[str, str]
    meta: CheckpointMeta


def checkpoint_at(traj: Any, step: int) -> Checkpoint | None:
    """The file's checkpoint at ``step``, read alone; None where there is none. A checkpoint
    group a killed writer left half-written does not read: it is no checkpoint."""
    try:
        snap = traj.snapshot(NAME, step)
    except JaxlogError:
        return None
    if snap is None or META not in snap.arrays:
        return None
    meta = CheckpointMeta.decode(snap.arrays[META], f"{traj.path} checkpoint at step {step}")
    return Checkpoint(step=step, state={p: v for p, v in snap.arrays.items() if p != META},
                      key_impls=snap.key_impls, meta=meta)


@dataclass(frozen=True)
class ResumePoint:
    """Where ``jl.resume`` continues a run: the old file (read through ``source``) up to ``step``."""

    source: Path
    step: int
    meta: CheckpointMeta
    run_meta: dict = field(default_factory=dict)  # the run's meta= (traj.meta), kept by the resumed run
    # a run over several processes: the old run's id, which the resumed one keeps (``source`` is
    # this process's part), so the index and every part agree at each instant of the resume
    run_id: str | None = None


@dataclass(frozen=True)
class Resumable:
    """What ``prepare`` found: where the run goes on, and the checkpoint it goes on from."""

    point: ResumePoint
    checkpoint: Checkpoint


def prepare(path: str | os.PathLike, from_step: int | None, *, filtered: frozenset[str] = frozenset()) -> Resumable:
    """Open the trajectory at ``path`` for a resume: the checkpoint to continue from (the newest
    whose frames all read, or ``from_step``), read alone, newest first, and checked against the
    file (:func:`check_consistent`; ``filtered``: records taken with ``when=``). The old file
    gets a second name, so it can be read while the resumed run's new file replaces it."""
    from ...store.hdf5.trajectory import load

    path = Path(path)
    recover_interrupted(path)
    traj = load(path)
    stored = traj.attachment_steps(NAME)
    if traj.status == "complete" and traj.stop_reason in (None, "steps", "until") and from_step is None:
        raise JaxlogError(f"{path}: the run ended complete at step {traj.steps_done} "
                          f"({traj.stop_reason or 'steps'}): there is nothing to resume")
    damage, found = None, None
    for step in reversed(stored) if from_step is None else [int(from_step)]:
        found = checkpoint_at(traj, step)
        if found is None:
            continue
        try:  # every frame up to it must read: a kill while a chunk holding them was rewritten damages it
            copy_frames(path, step, traj.schema, lambda frames: None)
            break
        except JaxlogError as exc:
            damage, found = exc, None
    if found is None:
        if from_step is not None and damage is None:
            complete = [s for s in stored if checkpoint_at(traj, s) is not None]
            raise JaxlogError(f"{path} has no checkpoint at step {from_step} (checkpoints: {complete})")
        if damage is None:
            raise JaxlogError(_no_checkpoint(path, traj))
        raise JaxlogError(f"{path}: no checkpoint has all its frames intact, nothing to resume from ({damage})")
    check_consistent(traj, found, filtered=filtered)
    source = path.with_name(f".{path.name}{RESUME_MARK}{os.getpid()}")
    if source.exists():
        source.unlink()
    os.link(path, source)
    return Resumable(point=ResumePoint(source=source, step=found.step, meta=found.meta, run_meta=traj.meta), checkpoint=found)


def _no_checkpoint(path: Path, traj: Any) -> str:
    """Why a file holds no checkpoint: a run without ``checkpoint=``, or one that died (or was
    stopped) before its first checkpoint reached the disk; the last commit says how far it got."""
    run = traj.description.get("run")
    planned = isinstance(run, dict) and run.get("checkpoint") is not None
    if not planned:
        return f"{path} holds no checkpoint to resume from: its run kept none (run with checkpoint=jl.every(n))"
    try:
        schedule = f"jl.{schedule_from_json(run['checkpoint'])!r}"
    except JaxlogError:
        schedule = "a schedule"
    return (f"{path} holds no checkpoint to resume from: its run (checkpoint={schedule}) ended "
            f"{traj.status!r} at its last commit, step {traj.steps_done}, before its first checkpoint was committed; "
            f"start it again with jl.run")


RESUME_MARK = ".resume-"  # the old file's second name during a resume: .<name>.resume-<pid>


def interrupted_copies(path: Path) -> list[Path]:
    """The second names of ``path`` that resumes killed before they ended left (their process is
    gone), newest first."""
    from ...store.hdf5.guards import process_alive

    prefix = f".{path.name}{RESUME_MARK}"
    found = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return []
    for entry in entries:
        pid = entry.name[len(prefix):] if entry.name.startswith(prefix) else ""
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            try:
                found.append((entry.stat(follow_symlinks=False).st_mtime_ns, Path(entry.path)))
            except OSError:
                pass
    return [p for _, p in sorted(found, reverse=True)]


def _resumable(path: Path) -> bool:
    """Whether ``path`` opens and holds a whole checkpoint (what a resume needs)."""
    from ...store.hdf5.trajectory import load

    try:
        traj = load(path)
        return any(checkpoint_at(traj, step) is not None for step in reversed(traj.attachment_steps(NAME)))
    except JaxlogError:
        return False


def recover_interrupted(path: Path) -> None:
    """Undo what a resume killed mid-way left: its second name of the old file, and (a resume of
    an earlier version, which put its new file in place before it held a checkpoint) an empty
    ``running`` file at the path. The old file comes back where the path holds no checkpoint;
    the second names of dead processes are removed."""
    copies = [c for c in interrupted_copies(path) if not c.is_symlink() and c.is_file()]
    if not copies:
        return
    same = [c for c in copies if path.exists() and os.path.samefile(path, c)]
    if not same and not _resumable(path):
        for c in copies:
            if _resumable(c):
                os.replace(c, path)  # atomic: the path holds one of the two files at every instant
                break
    for c in copies:
        c.unlink(missing_ok=True)


def check_consistent(traj: Any, found: Checkpoint, *, filtered: frozenset[str] = frozenset()) -> None:
    """Refuse a checkpoint that does not agree with itself or with the file's frames, naming the
    cause: a resume from it would go on from another step, with other dtypes, or leave a gap.

    - its own record names the step of its group (groups renamed or swapped are caught here);
    - its stored state has the paths, shapes and dtypes its record lists (what the run saved);
    - every record not filtered by ``when=`` has, from its first frame up to the checkpoint,
      every frame its schedule names (the writer puts them all in the file before the
      checkpoint: fewer means the file was cut back)."""
    where = f"{traj.path}: the checkpoint at step {found.step}"
    meta = found.meta
    if meta.step != found.step:
        raise JaxlogError(f"{where} holds the checkpoint of step {meta.step} (its own record says so): the file's "
                          f"checkpoint groups were renamed or swapped; refusing to resume from it")
    stored = {p: [list(np.shape(v)), str(np.dtype(v.dtype))] for p, v in found.state.items()}
    if stored != meta.state_leaves:
        diff = sorted(set(stored) ^ set(meta.state_leaves)) + sorted(
            p for p in set(stored) & set(meta.state_leaves) if stored[p] != meta.state_leaves[p])
        shown = "; ".join(f"{p} is {_leaf_text(stored.get(p))}, its record says {_leaf_text(meta.state_leaves.get(p))}"
                          for p in diff[:4])
        raise JaxlogError(f"{where}: its stored state does not match its own record ({shown}); refusing to resume")
    _check_no_gap(traj, found.step, filtered, where)


def _leaf_text(leaf: list | None) -> str:
    return "absent" if leaf is None else f"{leaf[1]}{leaf[0]}"


def _check_no_gap(traj: Any, step: int, filtered: frozenset[str], where: str) -> None:
    """Every scheduled frame of each unfiltered record, from its first up to ``step``, is in the file."""
    steps = {leaf.path: np.asarray(traj.steps(leaf.path), np.int64) for leaf in traj.schema.leaves}
    firsts = [int(s[0]) for s in steps.values() if len(s)]
    if not firsts:
        return
    start = min(firsts)  # the run's first recorded step
    for leaf in traj.schema.leaves:
        if leaf.record in filtered:
            continue
        s = steps[leaf.path]
        s = s[s <= step]
        first = int(s[0]) if len(s) else start + 1  # none yet: aux and logs begin one step after the state
        want = leaf.schedule.count_between(first, step)
        if len(s) != want:
            last = int(s[-1]) if len(s) else None
            after = f"after step {last}" if last is not None else "all of them"
            raise JaxlogError(
                f"{where}: record {leaf.path!r} ({leaf.schedule!r}) has {len(s)} frames up to it where its schedule "
                f"names {want} ({after} missing): the file's frames were cut back below the checkpoint; a resume "
                f"from it would leave a gap, refusing")


def check_against(point: ResumePoint, *, step_fn: Any, schema: Any, state: Any, key: Any, dt: Any,
                  invariants: Any, programs: dict | None = None) -> None:
    """Refuse a resume whose arguments differ from the run the file holds, naming what differs
    (``schema=None``: before the step is traced, all but the records and what the functions
    compute). The step is recognised by its name and, where the file and the run both have them,
    by what the step, views and predicates compute (``programs``: ``drive.prepare.identity.fingerprints``;
    files written before had only the name)."""
    import jax

    from ..prepare.identity import differences

    meta = point.meta
    where = f"resume from {point.source.name.split('.resume-')[0].lstrip('.')} step {point.step}"
    problems = []
    if step_name(step_fn) != meta.step_fn:
        problems.append(f"step function {step_name(step_fn)} (the file's run used {meta.step_fn})")
    if programs is not None and meta.programs is not None:
        problems += differences(meta.programs, programs)
    if bool(jax.config.jax_enable_x64) != meta.x64:
        problems.append(f"x64 is {'on' if jax.config.jax_enable_x64 else 'off'} (the file's run had it "
                        f"{'on' if meta.x64 else 'off'})")
    if schema is not None and schema.to_json() != meta.schema:
        old = {leaf["path"]: leaf for leaf in meta.schema.get("leaves", [])}
        new = {leaf["path"]: leaf for leaf in schema.to_json().get("leaves", [])}
        diff = sorted(set(old) ^ set(new)) + sorted(p for p in set(old) & set(new) if old[p] != new[p])
        problems.append(f"records differ ({', '.join(diff) or 'batched or dt'}: record set, shape, dtype or schedule)")
    if (dt is None) != (meta.dt is None) or (dt is not None and float(dt) != meta.dt):
        problems.append(f"dt={dt} (the file's run had dt={meta.dt})")
    leaves = state_leaves(state)
    if leaves != meta.state_leaves:
        diff = sorted(set(leaves) ^ set(meta.state_leaves)) + sorted(
            p for p in set(leaves) & set(meta.state_leaves) if leaves[p] != meta.state_leaves[p])
        problems.append(f"the state differs in {', '.join(diff[:6])} (structure, shape or dtype)")
    problems += _key_differs(key, meta)
    problems += _invariants_differ(invariants, meta)
    if problems:
        raise JaxlogError(f"{where}: refused, it does not match the run in the file: " + "; ".join(problems))


def _key_text(data: Any, impl: str | None) -> str:
    return f"{impl or 'raw key'} {json.dumps(data)[:120]}"


def _key_differs(key: Any, meta: CheckpointMeta) -> list[str]:
    """How ``key=`` differs from the file's run's key, both shown (key data and impl)."""
    if key is None and meta.key is None:
        return []
    if key is None:
        return [f"no key= (the file's run had one: {_key_text(meta.key, meta.key_impl)}; leave key= out to take it)"]
    data, impl = key_record(key)
    if meta.key is None:
        return [f"key= given ({_key_text(data, impl)}; the file's run had none)"]
    if data != meta.key or impl != meta.key_impl:
        return [f"a different key= than the file's run (given {_key_text(data, impl)}, the file's "
                f"{_key_text(meta.key, meta.key_impl)})"]
    return []


def _invariants_differ(invariants: Any, meta: CheckpointMeta) -> list[str]:
    """How ``invariants=`` differs from those the file's run checked, both listed by name."""
    given = [str(getattr(inv, "name", inv)) for inv in invariants]
    stored = [str(s.get("invariant")) if isinstance(s, dict) else "?" for s in meta.invariants]
    if len(given) != len(stored):
        return [f"{len(given)} invariants (the file's run checked {len(stored)}): given [{', '.join(given)}], the "
                f"file's [{', '.join(stored)}]"]
    if given != stored:
        return [f"invariants= differ (given [{', '.join(given)}], the file's [{', '.join(stored)}])"]
    return []


def state_leaves(state: Any) -> dict[str, list]:
    """``{"state/<path>": [shape, dtype]}`` of a state (typed keys as their key data)."""
    from ..prepare.schema import flatten_view

    return {p: [list(np.shape(v)), str(np.dtype(v.dtype))] for p, v in flatten_view("state", state).items()}


def key_record(key: Any) -> tuple[list, str | None]:
    """A run's key as JSON-able data and impl (typed or raw uint32 keys)."""
    import jax

    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(key)).tolist(), str(jax.random.key_impl(key))
    return np.asarray(key).tolist(), None


def rebuild_state(flat: dict, impls: dict, like: Any, meta: CheckpointMeta, where: str) -> Any:
    """The checkpoint's state: as ``like``'s pytree when given, else from the stored key paths
    (nested dicts, which is exact for states made of dicts)."""
    from ...store.dtypes import wrap_key_data
    from ...store.hdf5.trajectory import _nest, _rebuild

    if like is not None:
        return _rebuild(flat, impls, like, where=where)
    if not meta.treedef.startswith("PyTreeDef({") or any(c in meta.treedef for c in ("CustomNode", "namedtuple")):
        raise JaxlogError(f"{where}: the state is not a dict of arrays ({meta.treedef[:80]}...): pass like=<a state "
                          "of the kernel's own type>, e.g. the initial state")

    out = {}
    for p, v in flat.items():
        impl = impls.get(p)
        out[p] = wrap_key_data(v, impl, f"{where}: {p}") if impl else v
    return out.get("state") if "state" in out else _nest(out, "state")


def copy_frames(source: Path, upto: int, schema: Any, write) -> None:
    """Hand the old file's frames at steps ``<= upto`` to ``write`` in step order, in batches of
    ``COPY_STEPS`` steps (memory stays bounded for any file)."""
    from ...record.frames import Frames
    from ...store.hdf5.trajectory import load

    old = load(source)
    steps = {p: old.steps(p) for p in schema.paths}
    ends = {p: int(np.searchsorted(s, upto, side="right")) for p, s in steps.items()}
    lo = 0
    while True:
        hi = lo + COPY_STEPS
        batch = Frames()
        for p in schema.paths:
            s = steps[p][: ends[p]]
            a, b = np.searchsorted(s, lo, side="left"), np.searchsorted(s, hi, side="left")
            if b > a:
                batch.add(p, s[a:b], old[p, slice(int(a), int(b))])
        if len(batch):
            write(batch)
        if all(len(steps[p]) == 0 or steps[p][: ends[p]].size == 0 or steps[p][ends[p] - 1] < hi for p in schema.paths):
            break
        lo = hi


def copy_attachments(source: Path, upto: int, attach) -> None:
    """The old file's checkpoints and post-mortem states at steps ``<= upto``."""
    from ...store.hdf5.trajectory import load

    old = load(source)
    for name in (NAME, "postmortem"):
        for snap in old.snapshots(name, skip_damaged=True):  # oldest first: none past upto is read
            if snap.step > upto:
                break
            attach(name, snap.step, snap.arrays, key_impls=snap.key_impls or None)

# ---------------------------------------------------------------------------------------------
# A state sharded across processes, as a snapshot (a checkpoint, a post-mortem state) keeps it.
#
# No process holds such a state whole, so each process stores the blocks of each leaf it owns
# (as for records: each distinct block once, by the lowest process holding it) in its own part
# file, as ``<path>@<block>``, with ``jaxlog_blocks``: every leaf's global shape, dtype, blocks
# and sharding (its mesh's device ids, axis names and axis types, and partition spec), the same
# in every part.
# A resume in as many processes rebuilds each leaf from the blocks its own devices need (read
# from whichever part holds them) with ``jax.make_array_from_single_device_arrays``, on the
# sharding the state had: every process gets back exactly the shards it had.

BLOCKS = "jaxlog_blocks"  # a sharded snapshot's entry describing its leaves' blocks and shardings


def block_name(path: str, block: int) -> str:
    return f"{path}@{block}"


def _sharding_json(sharding: Any, path: str) -> dict:
    from jax.sharding import NamedSharding

    if not isinstance(sharding, NamedSharding):
        raise JaxlogError(f"state leaf {path!r} is laid out as {type(sharding).__name__}; a checkpoint or post-mortem "
                          "state over several processes keeps states whose leaves are placed with a NamedSharding "
                          "(jax.sharding.NamedSharding(mesh, spec))")
    spec = [list(a) if isinstance(a, tuple) else a for a in sharding.spec]
    ids = np.vectorize(lambda d: d.id, otypes=[np.int64])(sharding.mesh.devices)
    # the axis types too: a state on explicit axes (``jax.make_mesh``'s default) rebuilt on automatic
    # ones would be another type to the step, and its sharding no longer the one it was run with
    types = [t.name for t in getattr(sharding.mesh, "axis_types", ())]
    return {"devices": ids.tolist(), "axes": list(sharding.mesh.axis_names), "spec": spec, "axis_types": types}


def check_placed(state: Any) -> None:
    """Before a run over several processes that checkpoints: every leaf's sharding can be stored
    (a ``NamedSharding``), or the run is refused naming the leaf, in every process alike."""
    if jax.process_count() > 1:
        for path, x in flatten_view("state", state).items():
            _sharding_json(x.sharding, path)


def _blocks_of(x: Any) -> list[Block]:
    """The distinct blocks of a global array, each owned by the lowest process holding it."""
    owners: dict[tuple, int] = {}
    for device, index in x.sharding.devices_indices_map(tuple(x.shape)).items():
        at = _norm(index, tuple(x.shape))
        owners[at] = min(owners.get(at, device.process_index), device.process_index)
    return [Block(at, owner) for at, owner in sorted(owners.items())]


def snapshot(state: Any) -> tuple[dict, dict[str, str]]:
    """The state as this process stores it: ``(tree, key_impls)`` for ``Sink.attach``. In one
    process, the whole state's host copies; over several, a ``PartTree`` of the blocks this
    process owns and the ``jaxlog_blocks`` entry (every process writes its own)."""
    if jax.process_count() == 1:
        return state_paths(state), state_key_impls(state)
    me = jax.process_index()
    impls = state_key_impls(state)
    tree, leaves = PartTree(), {}
    for path, x in flatten_view("state", state).items():
        blocks = _blocks_of(x)
        leaves[path] = {"shape": list(x.shape), "dtype": str(np.dtype(x.dtype)), "key_impl": impls.get(path),
                        "blocks": [b.to_json() for b in blocks], "sharding": _sharding_json(x.sharding, path)}
        mine = {b.index: i for i, b in enumerate(blocks) if b.owner == me}
        for shard in x.addressable_shards:
            i = mine.pop(_norm(shard.index, tuple(x.shape)), None)
            if i is not None:
                tree[block_name(path, i)] = np.array(shard.data)
    tree[BLOCKS] = json_array({"count": jax.process_count(), "process": me, "leaves": leaves})
    return tree, {}


def _sharding(data: dict, where: str) -> Any:
    """The NamedSharding a snapshot names, on this run's devices (found by id)."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    by_id = {d.id: d for d in jax.devices()}
    types = _axis_types(data, where)
    try:
        ids = np.asarray(data["devices"], dtype=np.int64)
        devices = np.vectorize(lambda i: by_id[int(i)], otypes=[object])(ids)
        spec = PartitionSpec(*(tuple(a) if isinstance(a, list) else a for a in data["spec"]))
        mesh = Mesh(devices, tuple(data["axes"])) if types is None else Mesh(devices, tuple(data["axes"]),
                                                                            axis_types=types)
        return NamedSharding(mesh, spec)
    except KeyError as e:
        raise JaxlogError(f"{where}: the state was sharded over device {e}, which this run does not have "
                          f"(devices {sorted(by_id)}): resume in as many processes with as many devices each") from None
    except (TypeError, ValueError) as e:
        raise JaxlogError(f"{where}: the stored sharding {data!r} is not valid ({e})") from None


def _axis_types(data: dict, where: str) -> tuple | None:
    """The stored mesh's axis types (None where the snapshot names none: its mesh's default)."""
    from jax.sharding import AxisType

    names = data.get("axis_types") if isinstance(data, dict) else None
    if names is None:
        return None
    known = {t.name: t for t in AxisType}
    valid = isinstance(names, list) and all(isinstance(n, str) and n in known for n in names)
    if not valid or len(names) != len(data.get("axes", [])):
        raise JaxlogError(f"{where}: the stored sharding's axis types {names!r} are not one of {sorted(known)} per "
                          f"mesh axis {data.get('axes')!r}")
    return tuple(known[n] for n in names)


def global_leaf(path: str, info: dict, parts: list[dict], where: str) -> Any:
    """One leaf of the state, global: this process's devices get the blocks they held, read
    from the parts (``parts[i]``: part ``i``'s snapshot arrays)."""
    shape = tuple(int(n) for n in info["shape"])
    sharding = _sharding(info["sharding"], f"{where}: {path}")
    blocks = {Block.from_json(b).index: (i, Block.from_json(b).owner) for i, b in enumerate(info["blocks"])}
    arrays = []
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        found = blocks.get(_norm(index, shape))
        name = None if found is None else block_name(path, found[0])
        data = None if found is None else parts[found[1]].get(name)
        if data is None:
            raise JaxlogError(f"{where}: {path}: the block {_norm(index, shape)} device {device.id} holds is in no "
                              f"part (part {found[1] if found else '?'} lacks {name})")
        arrays.append(jax.device_put(np.asarray(data, dtype=np.dtype(info["dtype"])), device))
    x = jax.make_array_from_single_device_arrays(shape, sharding, arrays)
    impl = info.get("key_impl")
    return x if impl is None else jax.random.wrap_key_data(x, impl=impl)


def global_state(parts: list[dict], where: str) -> dict[str, Any]:
    """The state's leaves as global arrays, by path (``"state/<key path>"``), from every part's
    snapshot arrays; the parts must describe one layout."""
    described = [array_json(p.get(BLOCKS), f"{where}, part {i}", f"its {BLOCKS} entry") if BLOCKS in p else None
                 for i, p in enumerate(parts)]
    if any(d is None for d in described):
        missing = [i for i, d in enumerate(described) if d is None]
        raise JaxlogError(f"{where}: part(s) {missing} hold no {BLOCKS} entry (not a snapshot of a run over several "
                          f"processes)")
    layouts = [d.get("leaves") if isinstance(d, dict) else None for d in described]
    if not isinstance(layouts[0], dict) or any(lay != layouts[0] for lay in layouts[1:]):
        raise JaxlogError(f"{where}: the parts describe the state's blocks differently; they are not one snapshot")
    return {path: global_leaf(path, info, parts, where) for path, info in layouts[0].items()}
