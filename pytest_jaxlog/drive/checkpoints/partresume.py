"""``jl.resume`` of a run over several processes: each process continues its own part.

A checkpoint of such a run is complete only where every part holds it (each process attached
its blocks of the state and, last, its copy of the checkpoint's record) and the frames up to it
read in every part: one process killed while the others went on leaves checkpoints that only
some parts hold, and those are not used. Every process reads the parts' checkpoints newest
first, each only as far as it needs (all see the same files: nothing is written before the
processes agree), checks its own part's frames, and the processes agree
(``drive.prepare.sharding.gather``) on the newest checkpoint all of them can continue from. Each then
rebuilds the global state from the blocks its devices held (``drive.checkpoints.checkpoint``) and continues
its part into a new file that replaces the old part once it holds that checkpoint; the resumed
run keeps the old run's id, so the index and every part agree at each instant of the resume.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

import jax

from ...errors import JaxlogError
from ...store.hdf5.parts import PART_META, part_name, processes_of
from ..prepare.sharding import gather
from .checkpoint import (
    BLOCKS,
    NAME,
    RESUME_MARK,
    Checkpoint,
    Resumable,
    ResumePoint,
    _check_no_gap,
    checkpoint_at,
    copy_frames,
    global_state,
    recover_interrupted,
)


def recorded_processes(path: Path) -> int:
    """How many processes wrote the trajectory at ``path`` (1 for a file of one process)."""
    from ...store.hdf5.trajectory import load

    try:
        procs = processes_of(load(path).description) if path.exists() else None
    except JaxlogError:  # not a trajectory that opens: the resume's own checks say why
        return 1
    return 1 if procs is None else int(procs.get("count", 1))


def _parts(path: Path, from_step: int | None) -> list[Any]:
    """Every part of the run whose index is ``path``, opened; refused (the same way in every
    process: each reads the same files) unless they are as many as this run's processes."""
    from ...store.hdf5.trajectory import load

    count, me = jax.process_count(), jax.process_index()
    if not path.exists():
        raise JaxlogError(f"{path}: no such trajectory to resume")
    recorded = recorded_processes(path)
    if recorded != count:
        raise JaxlogError(f"{path} was recorded by {recorded} process{'es' if recorded > 1 else ''}; this run has "
                          f"{count}: resume it in {recorded} process{'es' if recorded > 1 else ''} (each continues "
                          f"its own part, with the devices it had)")
    parts = [load(path.with_name(part_name(path.name, i))) for i in range(count)]
    ids = {str((p.description.get(PART_META) or {}).get("run_id")) for p in parts}
    if len(ids) != 1:
        raise JaxlogError(f"{path}: its parts belong to different runs (run ids {sorted(ids)}); refusing to resume")
    if from_step is None and all(p.status == "complete" and p.stop_reason in (None, "steps", "until") for p in parts):
        raise JaxlogError(f"{path}: the run ended complete at step {parts[me].steps_done}: there is nothing to resume")
    return parts


class _Checkpoints:
    """The parts' checkpoints, each read at most once and only when asked for: a resume reads the
    newest checkpoint every part holds whole, not every checkpoint of every part."""

    def __init__(self, parts: list[Any]):
        self.parts = parts
        self._read: dict[tuple[int, int], Checkpoint | None] = {}

    def named(self) -> list[int]:
        """The checkpoint steps every part names (its attachments; whole or not), newest first."""
        common = None
        for part in self.parts:
            have = set(part.attachment_steps(NAME))
            common = have if common is None else common & have
        return sorted(common or (), reverse=True)

    def at(self, i: int, step: int) -> Checkpoint | None:
        if (i, step) not in self._read:
            self._read[i, step] = checkpoint_at(self.parts[i], step)
        return self._read[i, step]

    def whole(self, step: int) -> bool:
        """Every part holds its checkpoint at ``step`` whole (its blocks and its record)."""
        return all(self.at(i, step) is not None for i in range(len(self.parts)))


def _frames_read(part: Any, step: int) -> bool:
    try:
        copy_frames(Path(part.path), step, part.schema, lambda frames: None)
        return True
    except JaxlogError:
        return False


def _agreed_step(path: Path, checkpoints: _Checkpoints, from_step: int | None) -> int:
    """The newest checkpoint every part holds whole and every process's own part reads up to.
    Wholeness is the same in every process (each reads the same files); whether a part's frames
    read up to a step only its own process asks, so the processes agree step by step."""
    me = jax.process_index()
    steps = checkpoints.named()
    if from_step is not None:
        if int(from_step) not in steps or not checkpoints.whole(int(from_step)):
            raise JaxlogError(f"{path} has no checkpoint at step {from_step} that every part holds (checkpoints "
                              f"every part holds: {sorted(s for s in steps if checkpoints.whole(s))})")
        steps = [int(from_step)]
    seen = gather([len(steps), zlib.crc32(repr(steps).encode())])
    if len({tuple(row) for row in seen}) != 1:
        raise JaxlogError(f"{path}: the processes read different checkpoints from the parts (changed while read?)")
    pos = 0
    while True:  # each round: the oldest of every process's newest usable checkpoint, from pos on
        mine = next((i for i in range(pos, len(steps))
                     if checkpoints.whole(steps[i]) and _frames_read(checkpoints.parts[me], steps[i])), len(steps))
        picks = gather([mine])[:, 0]
        pos = int(picks.max())
        if pos == len(steps) or int(picks.min()) == pos:
            break
    if pos >= len(steps):
        whole = sorted(s for s in steps if checkpoints.whole(s))
        raise JaxlogError(f"{path} holds no checkpoint that every part holds with its frames intact, nothing to resume "
                          f"from (run with checkpoint=jl.every(n); checkpoints every part holds: {whole})")
    return steps[pos]


def _check_part(part: Any, found: Checkpoint, filtered: frozenset[str]) -> str | None:
    """Why this process's part cannot continue from ``found`` (None: it can)."""
    where = f"{part.path}: the checkpoint at step {found.step}"
    if found.meta.step != found.step:
        return f"{where} holds the checkpoint of step {found.meta.step}: its groups were renamed or swapped"
    if BLOCKS not in found.state:
        return f"{where} holds no {BLOCKS} entry: it is not a checkpoint of a run over several processes"
    try:
        _check_no_gap(part, found.step, filtered, where)
    except JaxlogError as exc:
        return str(exc)
    return None


def prepare_parts(path: str | os.PathLike, from_step: int | None, *,
                  filtered: frozenset[str] = frozenset()) -> tuple[Resumable, dict[str, Any]]:
    """This process's side of a resume over several processes: where the run goes on (its own
    part read through a second name) and the state's leaves, global, by path."""
    path = Path(path)
    me = jax.process_index()
    # what a resume of this process killed mid-way left (its part's second name), undone before any
    # process reads the parts
    recover_interrupted(path.with_name(part_name(path.name, me)))
    gather([0])
    parts = _parts(path, from_step)
    checkpoints = _Checkpoints(parts)
    step = _agreed_step(path, checkpoints, from_step)
    found = [checkpoints.at(i, step) for i in range(len(parts))]
    problem = _check_part(parts[me], found[me], filtered) if found[me] is not None else f"part {me} lost step {step}"
    refused = gather([problem is not None])[:, 0]
    if refused.any():
        raise JaxlogError(problem or f"{path}: process {int(refused.argmax())} refused its part's checkpoint at step "
                                     f"{step} (its error says why)")
    own = found[me]
    assert own is not None
    where = f"{path} checkpoint at step {step}"
    leaves = global_state([f.state if f is not None else {} for f in found], where)
    old = Path(parts[me].path)
    source = old.with_name(f".{old.name}{RESUME_MARK}{os.getpid()}")
    if source.exists():
        source.unlink()
    os.link(old, source)
    run_id = str((parts[me].description.get(PART_META) or {}).get("run_id"))
    point = ResumePoint(source=source, step=step, meta=own.meta, run_meta=parts[me].meta, run_id=run_id)
    return Resumable(point=point, checkpoint=own), leaves
