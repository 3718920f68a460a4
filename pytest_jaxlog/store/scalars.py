"""Which records are scalars (one number per step, per system when batched), shared by the sinks
written for people and simple tools: CSV rows, TensorBoard, log lines, row callbacks."""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from ..errors import JaxlogError
from ..record.frames import Frames, Schema


def scalar_paths(schema: Schema, records: Iterable[str] | None, who: str, *, kind: str = "CSV",
                 advice: str = "write it with HDF5Writer") -> tuple[str, ...]:
    """The leaf paths a scalar sink writes: ``records=None`` takes every scalar record (none is an
    error), named records must all be scalar (``who`` and ``kind`` name the sink in the message)."""
    base = () if not schema.batched else (schema.n_systems,)

    def scalar(path: str) -> bool:
        return tuple(schema[path].shape) == base

    if records is None:
        paths = tuple(p for p in schema.paths if scalar(p))
        if not paths:
            raise JaxlogError(f"{who}: no scalar records to write (recorded: {', '.join(schema.paths) or '(none)'})")
        return paths
    paths = tuple(p for name in records for p in _resolve(schema, name, who, kind, scalar))
    for p in paths:
        if not scalar(p):
            per = "per system " if schema.batched else ""
            raise JaxlogError(
                f"{who}: record {p!r} has shape {tuple(schema[p].shape)}; {kind} takes "
                f"scalar records only ({per}shape {base}); {advice}"
            )
    return paths


def _resolve(schema: Schema, name: str, who: str, kind: str, scalar: Any) -> tuple[str, ...]:
    """The leaf paths ``name`` stands for; an unknown name is refused naming the argument that gave
    it (``who``) and the names it could take instead."""
    try:
        return schema.resolve(name)
    except JaxlogError as e:
        valid = ", ".join(p for p in schema.paths if scalar(p)) or "(none: record a scalar)"
        cause = str(e).removeprefix("[jaxlog] ")
        raise JaxlogError(f"{who}: {cause}; {kind} takes the names of scalar records: {valid}") from None


def real_paths(schema: Schema, paths: tuple[str, ...], who: str) -> tuple[str, ...]:
    """Keep the paths of real numbers; a named complex or key record is an error."""
    for p in paths:
        leaf = schema[p]
        if leaf.key_impl is not None or np.dtype(leaf.dtype).kind not in "biuf":
            raise JaxlogError(f"{who}: record {p!r} has dtype {leaf.dtype}; only real numbers can be shown")
    return paths


def rows_by_step(frames: Frames, paths: tuple[str, ...], n_systems: int | None) -> list[tuple[int, list[dict]]]:
    """The batch as ``(step, rows)`` in step order: one row (``{path: value}``, Python numbers) per
    system, holding the records scheduled at that step."""
    present = [p for p in paths if p in frames.values and len(frames.steps[p])]
    if not present:
        return []
    steps = np.unique(np.concatenate([frames.steps[p] for p in present]))
    width = n_systems or 1
    table: list[list[dict[str, Any]]] = [[{} for _ in range(width)] for _ in steps]
    for p in present:
        pos = np.searchsorted(steps, frames.steps[p])
        values = frames.values[p].reshape(len(pos), width).tolist()
        for i, row in zip(pos.tolist(), values):
            for system, value in enumerate(row):
                table[i][system][p] = value
    return list(zip(steps.tolist(), table))
