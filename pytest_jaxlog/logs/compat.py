"""Every call into JAX whose spelling differs between the supported versions (0.10.2 .. 0.12).

The log layer reads jaxprs and rebinds primitives, so it touches more of JAX than the rest of the
package; what changed between versions (or has no public spelling) is kept here, one function per
question, so a new JAX version is adapted in one file.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
from jax.extend import core as jex_core
from jax.extend import source_info_util
from jax.interpreters import batching


def register_batcher(primitive: Any, rule: Callable) -> None:
    """``rule(size, args, dims, **params) -> (outs, out_dims)`` as ``primitive``'s vmap rule, with
    ``size`` the mapped axis's length. Through ``batching.fancy_primitive_batchers``, which JAX
    calls for every operand batching, all operands unmapped included: ``batching.primitive_batchers``
    is skipped then (the primitive is bound outside the vmap), so a log of a value shared by
    every system would lose its system axis there."""
    def batcher(axis_data: Any, args: Any, dims: Any, **params: Any) -> Any:
        return rule(axis_data.size, args, dims, **params)

    batching.fancy_primitive_batchers[primitive] = batcher


class ScanSplit(NamedTuple):
    """How a ``scan`` eqn's operands divide: ``consts`` first, then ``carry``, then the xs."""

    consts: int
    carry: int


def scan_split(params: dict) -> ScanSplit:
    if "ft_in" in params:  # jax >= 0.11: the operands' grouping is a flat tree of (consts, carry, xs)
        groups = params["ft_in"].unpack()
        return ScanSplit(len(groups[0]), len(groups[1]))
    return ScanSplit(params["num_consts"], params["num_carry"])


def remat_prevent_cse(params: dict) -> bool:
    """A ``checkpoint`` eqn's ``prevent_cse``, a bool (older) or one flag per output (newer)."""
    prevent = params["prevent_cse"]
    return bool(prevent) if isinstance(prevent, bool) else any(prevent)


def tracer_trace(x: Any) -> Any:
    """The trace a tracer belongs to (``None`` for anything else): no public accessor exists."""
    return getattr(x, "_trace", None) if isinstance(x, jax.core.Tracer) else None


def enclosing_traces(limit: int = 64) -> list:
    """The traces active where this is called, innermost first."""
    with jex_core.take_current_trace() as current:
        live: list = []
        t = current
        while t is not None and len(live) < limit:
            live.append(t)
            t = getattr(t, "parent_trace", None)
    return live


def eqn_context(eqn: Any) -> Any:
    """The source info (traceback, name stack) of ``eqn``, for what is bound while rebuilding it."""
    name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    return source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack)


def bind(eqn: Any, invals: list) -> list:
    """What ``jax.core.eval_jaxpr`` does for one equation: bind it again, with its source info."""
    params = eqn.primitive.get_bind_params(eqn.params)
    with eqn_context(eqn), eqn.ctx.manager:
        out = eqn.primitive.bind(*invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


class ShardMapParams(NamedTuple):
    """What a ``shard_map`` eqn says of its mapping, as ``jax.shard_map`` takes it again."""

    mesh: Any
    in_specs: tuple
    out_specs: tuple
    check_vma: bool
    axis_names: tuple  # the mesh axes it maps over (manual inside), in the mesh's order


def shard_map_params(params: dict) -> ShardMapParams:
    """A ``shard_map`` eqn's mapping: its parameters have no public spelling (``check_rep`` and
    ``auto`` in older JAX, ``check_vma`` and ``newly_manual_axes`` since)."""
    mesh = params["mesh"]
    manual = params.get("newly_manual_axes")
    if manual is None:  # older: every mesh axis not left automatic
        manual = frozenset(mesh.axis_names) - frozenset(params.get("auto", ()))
    return ShardMapParams(mesh, tuple(params["in_specs"]), tuple(params["out_specs"]),
                          bool(params.get("check_vma", params.get("check_rep", True))),
                          tuple(a for a in mesh.axis_names if a in manual))
