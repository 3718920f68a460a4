"""The ``jaxlog_log`` primitive: returns its operands, and carries a log's static facts.

Its effect is that of ``jax.debug.callback`` only while a collector traces (``COLLECTING``):
effects are what JAX keeps through every transformation (partial evaluation under ``grad``,
``checkpoint``, ``scan`` linearization prune unused values otherwise). Otherwise it has no effect
and no user, so dead-code elimination drops it, and its lowering emits nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core
from jax.interpreters import ad, mlir

from .compat import register_batcher

__all__ = ["Site", "log_p", "COLLECTING", "SHARD_REDUCTIONS"]

# how a log inside jax.shard_map comes out: "gather" one row per shard, or one value reduced over them
SHARD_REDUCTIONS = ("gather", "sum", "mean", "max", "min", "first")

# jit-cache-sensitive: kernels traced while collecting never share a jaxpr with kernels traced
# without (the primitive's effects differ between the two).
COLLECTING = jax.make_user_context(default_value=False)


@dataclasses.dataclass(frozen=True)
class Site:
    """Static facts about one ``jl.log`` call: its name, where it was called, what it carries."""

    name: str
    where: str
    capacity: int | None
    value_tree: Any  # treedef of the value
    index_names: tuple[str, ...]
    shards: str = "gather"  # inside jax.shard_map: one row per shard, or reduced over them (SHARD_REDUCTIONS)

    @property
    def n_value(self) -> int:
        return self.value_tree.num_leaves

    def __repr__(self) -> str:  # shows in printed jaxprs
        return f"{self.name}@{self.where}"


_EFFECTS: set | None = None


def _debug_effects() -> set:
    """The effect of ``jax.debug.callback``, taken from a traced callback (public API only): JAX
    keeps eqns with it through DCE, partial evaluation, remat and control flow, and never
    duplicates them into a recomputation."""
    global _EFFECTS
    if _EFFECTS is None:
        _EFFECTS = set(jax.make_jaxpr(lambda: jax.debug.callback(_noop))().effects)
    return _EFFECTS


def _noop(*_: Any) -> None:
    return None


log_p = jex_core.Primitive("jaxlog_log")
log_p.multiple_results = True


@log_p.def_impl
def _log_impl(*args, site, vmapped):
    del site, vmapped
    return args


@log_p.def_effectful_abstract_eval
def _log_abstract_eval(*avals, site, vmapped):
    del site, vmapped
    return avals, (_debug_effects() if COLLECTING.value else set())


def _log_lowering(ctx, *args, site, vmapped):
    del ctx, site, vmapped
    return args


mlir.register_lowering(log_p, _log_lowering)


def _log_jvp(primals, tangents, *, site, vmapped):
    return log_p.bind(*primals, site=site, vmapped=vmapped), tangents


ad.primitive_jvps[log_p] = _log_jvp


def _log_transpose(cts, *args, site, vmapped):
    del args, site, vmapped  # a log of a tangent: the cotangent passes through, nothing is logged
    return cts


ad.primitive_transposes[log_p] = _log_transpose


def _log_batch(size, args, dims, *, site, vmapped):
    """Mapped axis first on every operand (unmapped ones broadcast, those of a log that no operand
    of is mapped too): one row per system whatever the value depends on, so ``jl.spool(jax.vmap(f))``
    and a batched ``jl.run`` of ``jax.vmap(f)`` agree, and the collector knows where the system
    axes are (``vmapped`` leading axes, outermost vmap first)."""
    moved = [jnp.moveaxis(x, d, 0) if d is not None else jnp.broadcast_to(x, (size, *jnp.shape(x)))
             for x, d in zip(args, dims)]
    outs = log_p.bind(*moved, site=site, vmapped=vmapped + 1)
    return outs, [0] * len(outs)


register_batcher(log_p, _log_batch)
