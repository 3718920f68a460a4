"""A trajectory as a ``.npz`` (``jaxlog export TRAJ.h5 --npz OUT.npz``): each record's values,
steps and times as plain arrays, for tools that read numpy and not HDF5.

Keys are the record paths in three namespaces, ``values/<path>``, ``steps/<path>`` and
``times/<path>`` (times only where the run has a dt), so no record's name can collide with
another's steps: ``np.load(out)["values/energy"]`` is ``jl.load(traj)["energy"]``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import JaxlogError

__all__ = ["npz_arrays", "export_npz"]


def npz_arrays(traj: Any, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """``{"values/<path>": ..., "steps/<path>": ..., "times/<path>": ...}`` for the leaf paths
    ``names`` stands for (leaves or prefixes; default every record), read from ``traj``."""
    paths = traj.records if not names else tuple(dict.fromkeys(p for n in names for p in traj.schema.resolve(n)))
    out: dict[str, np.ndarray] = {}
    for path in paths:
        out[f"values/{path}"] = np.asarray(traj[path])
        out[f"steps/{path}"] = np.asarray(traj.steps(path))
        if traj.dt is not None:
            out[f"times/{path}"] = np.asarray(traj.time(path))
    return out


def export_npz(traj: Any, out: str | os.PathLike, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Write :func:`npz_arrays` to ``out`` (exactly that name: numpy would add ``.npz`` to a
    name without it), whole or not at all: written beside it and renamed into place."""
    out = Path(out)
    if out.is_dir():
        raise JaxlogError(f"{out} is a directory; name the .npz file to write, e.g. {out / 'trajectory.npz'}")
    if not out.parent.is_dir():
        raise JaxlogError(f"cannot write {out}: directory {out.parent} does not exist")
    arrays = npz_arrays(traj, names)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise JaxlogError(f"writing {out} failed: {exc}") from None
    return arrays
