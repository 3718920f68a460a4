"""What ``jl.resume`` takes from the file when the caller does not say it again: the key, ``dt``,
the checkpoint schedule and the built-in invariants (their running state comes from the
checkpoint either way). What a file cannot hold (the step function, the views, predicates,
custom invariants, a custom pytree's type) the caller gives; a value given that differs from the
file's is refused by ``checkpoint.check_against``, naming both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..check.specs import from_spec
from ..errors import JaxlogError
from ..record.schedule import schedule_from_json
from ..store.dtypes import wrap_key_data
from .checkpoint import CheckpointMeta

__all__ = ["from_file"]


def from_file(kwargs: dict, meta: CheckpointMeta, where: str) -> dict:
    """``kwargs`` (``jl.run``'s, as given to ``jl.resume``) with the key, ``dt``, ``checkpoint``
    and ``invariants`` the file's run had, for those not given."""
    out = dict(kwargs)
    if "key" not in out and meta.key is not None:
        out["key"] = _key(meta, where)
    if "dt" not in out:
        out["dt"] = meta.dt if meta.dt is not None else meta.schema.get("dt")
    if "checkpoint" not in out:
        out["checkpoint"] = _checkpoint(meta, where)
    if "invariants" not in out:
        out["invariants"] = _invariants(meta, where)
    return out


def _key(meta: CheckpointMeta, where: str) -> Any:
    try:
        data = np.asarray(meta.key, dtype=np.uint32)
    except (ValueError, TypeError, OverflowError) as exc:
        raise JaxlogError(f"{where}: the file's key is not key data ({exc}); pass key= to jl.resume") from None
    return data if meta.key_impl is None else wrap_key_data(data, meta.key_impl, f"{where}: the run's key")


def _checkpoint(meta: CheckpointMeta, where: str) -> Any:
    if meta.checkpoint is None:
        raise JaxlogError(f"{where}: the file does not say its run's checkpoint schedule (it was written before "
                          "checkpoints kept it): pass checkpoint=jl.every(n) (or checkpoint=None for no more "
                          "checkpoints) to jl.resume")
    try:
        return schedule_from_json(meta.checkpoint)
    except JaxlogError as exc:
        raise JaxlogError(f"{where}: the file's checkpoint schedule is not valid ({str(exc).removeprefix('[jaxlog] ')}); "
                          "pass checkpoint= to jl.resume") from None


def _invariants(meta: CheckpointMeta, where: str) -> list:
    names = [str(s.get("invariant")) if isinstance(s, dict) else "?" for s in meta.invariants]
    if not names:
        return []
    specs = meta.invariant_specs
    if specs is None or len(specs) != len(names):
        raise JaxlogError(f"{where}: the file does not say how to rebuild the invariants its run checked (it was "
                          f"written before checkpoints kept them): pass invariants= to jl.resume, the same "
                          f"{len(names)} in the same order ({', '.join(names)})")
    code = [name for name, spec in zip(names, specs) if spec is None]
    if code:
        raise JaxlogError(f"{where}: the file's run checked {', '.join(code)}, a function the file does not hold: "
                          f"pass invariants= to jl.resume, all {len(names)} in the same order ({', '.join(names)})")
    return [from_spec(spec, name, where) for name, spec in zip(names, specs)]
