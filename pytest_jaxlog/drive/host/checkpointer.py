"""A run's checkpoints: what each one attaches to the file sinks, and how a resumed run's file
starts as the old one up to the checkpoint (``checkpoint`` reads and checks the checkpoints)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from ...check.invariants import spec_of
from ...record.frames import Schema
from ...store.hdf5.parts import PartsWriter, PartTree
from ...store.hdf5.trajectory import load
from ..checkpoints.checkpoint import (
    META,
    CheckpointMeta,
    check_placed,
    copy_attachments,
    copy_frames,
    key_record,
    mesh_of,
    snapshot,
    state_leaves,
    step_name,
)
from ..checkpoints.checkpoint import NAME as CHECKPOINT
from ..prepare.config import RunConfig
from .pipeline import Pipeline

__all__ = ['Checkpointer', 'resume_into']

@dataclasses.dataclass(frozen=True)
class Checkpointer:
    """What every checkpoint of a run says the same (the key, the step function, the state's
    structure, the schema), worked out once per run: a checkpoint adds only what changed."""

    pipe: Pipeline
    template: CheckpointMeta
    until: bool

    @classmethod
    def of(cls, cfg: RunConfig, pipe: Pipeline, schema: Schema, state: Any, programs: dict | None) -> "Checkpointer":
        check_placed(state)
        key_data, key_impl = (None, None) if cfg.key is None else key_record(cfg.key)
        template = CheckpointMeta(step=0, step_fn=step_name(cfg.step), key=key_data, key_impl=key_impl,
                                  invariants=[], active=[], violation=None, done=None, systems_done=None,
                                  state_leaves=state_leaves(state), treedef=str(jax.tree_util.tree_structure(state)),
                                  x64=bool(jax.config.read("jax_enable_x64")), schema=schema.to_json(), dt=cfg.dt,
                                  programs=programs,
                                  checkpoint=None if cfg.checkpoint is None else cfg.checkpoint.to_json(),
                                  invariant_specs=[spec_of(inv) for inv in cfg.invariants], mesh=mesh_of(state))
        return cls(pipe, template, cfg.until is not None)

    def save(self, step: int, state: Any, stopped: Any, systems_done: np.ndarray | None) -> int:
        """Attach a checkpoint at ``step`` (every frame up to it was handed to the sinks already);
        ``stopped``: where until= stopped the run (each system), -1 while it goes on, at that step."""
        saved = self.pipe.watch.save()
        meta = dataclasses.replace(
            self.template, step=step, invariants=saved["invariants"], active=saved["active"],
            violation=saved["violation"],
            done=None if stopped is None or not self.until else (np.asarray(stopped) >= 0).tolist(),
            systems_done=None if systems_done is None else systems_done.tolist())
        # over several processes each process attaches its blocks of the state, and its own copy of
        # the record: a checkpoint counts where every part holds that record (drive.checkpoints.partresume)
        tree, impls = snapshot(state)
        tree[META] = meta.encode()  # written last: the checkpoint is complete once it is in the file
        self.pipe.sinks.attach(CHECKPOINT, step, tree, key_impls=impls)
        return step


def resume_into(cfg: RunConfig, pipe: Pipeline, schema: Schema, stopped: np.ndarray,
                systems_done: np.ndarray | None) -> np.ndarray:
    """A resumed run's file starts as the old one up to the checkpoint: its frames, checkpoints and
    post-mortem states, the invariants' running state; returns where ``until`` had stopped the run
    (each system) there, -1 where it goes on."""
    point = cfg.resume
    if point.run_id is None:
        copy_frames(point.source, point.step, schema, pipe.sinks.write)
        copy_attachments(point.source, point.step, pipe.sinks.attach)
    else:  # over several processes: this process's part, as it is, into its new part
        parts = [s for s in pipe.sinks.opened if isinstance(s, PartsWriter)]
        copy_frames(point.source, point.step, load(point.source).schema, parts[0].write_part)
        copy_attachments(point.source, point.step, lambda name, step, tree, key_impls=None: pipe.sinks.attach(
            name, step, PartTree(tree), key_impls=key_impls))
    if pipe.watch:
        pipe.watch.restore({"invariants": point.meta.invariants, "active": point.meta.active,
                            "violation": point.meta.violation})
    if systems_done is not None and point.meta.systems_done is not None:
        systems_done[:] = point.meta.systems_done
    if point.meta.done is None:
        return stopped
    done = np.asarray(point.meta.done, bool)
    at = np.asarray(point.meta.systems_done if point.meta.systems_done is not None else np.full(done.shape, point.step))
    return np.where(done, at, -1).astype(np.int32).reshape(stopped.shape)

# ---------------------------------------------------------------------------------------------
# The post-mortem of a violation: the full states of the last few steps up to the violating
# one, replayed with the run's own program from a kept chunk-start state and attached to the sinks
# (over several processes each process attaches its shards of them: ``drive.checkpoints.checkpoint``).

def replay(violation: Any, k0: int, chunk_state: Any, starts: list, one_step: Callable, n: int, sinks: Any,
           state_of: Callable[[Any], Any] = lambda carry: carry) -> Any:
    """Replay from the newest kept chunk-start carry early enough for ``n`` states (the violating
    chunk's own start ``k0``, or an earlier one in ``starts`` when the violating step is fewer than
    ``n`` steps past it); attach the last ``n`` states. ``one_step(carry, k)`` advances the
    driver's carry (the state, and what else the program threads through), ``state_of`` reads
    the state out of it. Returns the carry at the violating step."""
    need = violation.step - n + 1
    if k0 > need and starts:
        early = [ks for ks in starts if ks[0] <= need]
        k0, chunk_state = early[-1] if early else starts[0]
    target = violation.step
    st = chunk_state
    keep = set(range(max(k0, target - n + 1), target + 1)) if n > 0 else set()
    snaps = {}
    if k0 in keep:
        snaps[k0] = snapshot(state_of(st))
    for k in range(k0, target):
        st = one_step(st, k)
        if k + 1 in keep:
            snaps[k + 1] = snapshot(state_of(st))
    for k in sorted(snaps):
        tree, impls = snaps[k]
        sinks.attach("postmortem", k, tree, key_impls=impls)
    return st
