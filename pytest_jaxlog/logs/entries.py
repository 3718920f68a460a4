"""Logged values on their way out of a jaxpr, and the structure they are handed over in."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import JaxlogError
from .primitive import Site

__all__ = ["Entry", "Shape", "flat", "finish"]


@dataclasses.dataclass
class Entry:
    """One log occurrence on its way out: ``tree`` is ``{"value": ..., <index>: ..., "valid",
    "count" (tuple), "overflow"}``; ``lead`` the loop axes added so far (outermost first), and
    ``vmapped`` the number of system axes right after them on the value and index leaves."""

    site: Site
    tree: dict
    lead: tuple[int, ...] = ()
    vmapped: int = 0


@dataclasses.dataclass(frozen=True)
class Shape:
    """An entry with its arrays flattened (what crosses a loop or branch boundary)."""

    site: Site
    treedef: Any
    lead: tuple[int, ...]
    vmapped: int
    avals: tuple  # ((shape, dtype), ...) of the leaves

    @classmethod
    def of(cls, e: Entry) -> "Shape":
        leaves = jax.tree_util.tree_leaves(e.tree)
        return cls(e.site, jax.tree_util.tree_structure(e.tree), e.lead, e.vmapped,
                   tuple((tuple(jnp.shape(x)), np.dtype(x.dtype)) for x in leaves))

    def build(self, leaves: list, lead: tuple[int, ...] | None = None) -> Entry:
        return Entry(self.site, jax.tree_util.tree_unflatten(self.treedef, list(leaves)),
                     self.lead if lead is None else lead, self.vmapped)

    def same(self, other: "Shape") -> bool:
        return (self.treedef == other.treedef and self.lead == other.lead and self.vmapped == other.vmapped
                and self.avals == other.avals)

    def describe(self) -> str:
        return ", ".join(f"{d}{list(s)}" for s, d in self.avals)


def flat(entries: list[Entry]) -> tuple[list[Shape], list]:
    shapes, leaves = [], []
    for e in entries:
        shapes.append(Shape.of(e))
        leaves.append(jax.tree_util.tree_leaves(e.tree))
    return shapes, leaves


def _check_same(name: str, group: list[Entry]) -> None:
    ref = Shape.of(group[0])
    for other in group[1:]:
        s = Shape.of(other)
        if not s.same(ref):
            raise JaxlogError(
                f"log {name!r} is logged with two different shapes or dtypes in one call: "
                f"{ref.describe()} at {group[0].site.where} (loop axes {list(ref.lead)}) and "
                f"{s.describe()} at {other.site.where} (loop axes {list(s.lead)}); use two names")


def finish(entries: list[Entry]) -> dict[str, Any]:
    """Group occurrences by name (stacked in program order), put system axes first, and give each
    name its documented structure."""
    groups: dict[str, list[Entry]] = {}
    for e in entries:
        groups.setdefault(e.site.name, []).append(e)
    out: dict[str, Any] = {}
    for name, group in groups.items():
        e = group[0]
        tree, lead = e.tree, e.lead
        if len(group) > 1:
            _check_same(name, group)
            tree = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[g.tree for g in group])
            lead = (len(group), *lead)
        tree = dict(tree)
        if e.vmapped:
            n, v = len(lead), e.vmapped
            front = functools.partial(jnp.moveaxis, source=list(range(n, n + v)), destination=list(range(v)))
            tree["value"] = jax.tree_util.tree_map(front, tree["value"])
            for k in e.site.index_names:
                tree[k] = front(tree[k])
        if "count" in tree and len(tree["count"]) == 1:
            tree["count"] = tree["count"][0]
        out[name] = tree["value"] if set(tree) == {"value"} else tree
    return out
