"""Schema resolution: what each view returns for a given state, found before any step runs.

Views are traced abstractly (``jax.eval_shape``), so a bad view (non-array leaves, strings,
a shape that does not fit ``batched=True``) fails with the record path named, before the run.
The same flattening (``flatten_view``) is used inside the jitted drivers, so the paths in the
schema and the paths in the frames cannot disagree.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ._errors import JaxlogError
from ._frames import LeafSpec, Schema
from ._records import AUX, RecordSpec, leaf_paths
from ._schedule import Every, Schedule

AUX_SCHEDULE = Every(1, start=1)  # aux comes out of the application k -> k+1: recorded at k+1


def is_key(dtype: Any) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _numeric(dtype: Any) -> bool:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return False
    return dt == np.bool_ or bool(jnp.issubdtype(dt, jnp.number))


def flatten_view(name: str, tree: Any) -> dict[str, Any]:
    """A view's output as ``{record path: array}``; typed PRNG keys become their key data.

    Works on concrete arrays and on tracers (used inside the jitted chunk functions)."""
    pairs, _ = jax.tree_util.tree_flatten_with_path(tree)
    paths = leaf_paths(name, [kp for kp, _ in pairs])
    out = {}
    for path, (_, leaf) in zip(paths, pairs):
        if hasattr(leaf, "dtype") and is_key(leaf.dtype):
            leaf = jax.random.key_data(leaf)
        out[path] = leaf
    return out


def _leaves(name: str, record: str, schedule: Schedule, fn: Callable[[], Any], batched: bool,
            n_systems: int | None, what: str) -> list[LeafSpec]:
    impls: dict[str, str] = {}

    def traced():
        out = fn()
        pairs, _ = jax.tree_util.tree_flatten_with_path(out)
        paths = leaf_paths(name, [kp for kp, _ in pairs])
        for path, (_, leaf) in zip(paths, pairs):
            if isinstance(leaf, jax.Array) and is_key(leaf.dtype):
                impls[path] = str(jax.random.key_impl(leaf))
        return out

    try:
        shapes = jax.eval_shape(traced)
    except JaxlogError:
        raise
    except Exception as e:  # the user's view failed while tracing: name it
        raise JaxlogError(f"{what} {name!r} failed on the state: {type(e).__name__}: {e}") from e
    pairs, _ = jax.tree_util.tree_flatten_with_path(shapes)
    paths = leaf_paths(name, [kp for kp, _ in pairs])
    if not paths:
        raise JaxlogError(f"{what} {name!r} returned no arrays (got {shapes!r})")
    specs = []
    for path, (_, leaf) in zip(paths, pairs):
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            raise JaxlogError(f"record {path!r}: leaf {leaf!r} is not an array")
        shape, dtype, key_impl = tuple(leaf.shape), leaf.dtype, None
        if is_key(dtype):
            key_impl = impls.get(path, "unknown")
            data = jax.eval_shape(jax.random.key_data, leaf)
            shape, dtype = tuple(data.shape), data.dtype
        elif not _numeric(dtype):
            raise JaxlogError(f"record {path!r}: dtype {dtype} is not numeric (recordable: bool, int, float, complex, keys)")
        if batched and (not leaf.shape or leaf.shape[0] != n_systems):
            raise JaxlogError(
                f"record {path!r}: batched=True needs a leading system axis of size {n_systems}, got shape {tuple(leaf.shape)}"
            )
        specs.append(LeafSpec(path, record, shape, np.dtype(dtype), schedule, key_impl))
    return specs


def n_systems_of(state: Any, batched: bool) -> int | None:
    if not batched:
        return None
    leaves = jax.tree_util.tree_leaves(state)
    if not leaves or not getattr(leaves[0], "shape", ()):
        raise JaxlogError("batched=True needs state leaves with a leading system axis")
    n = leaves[0].shape[0]
    for kp_leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        kp, leaf = kp_leaf
        if not getattr(leaf, "shape", ()) or leaf.shape[0] != n:
            raise JaxlogError(
                f"batched=True: state leaf {jax.tree_util.keystr(kp)} has shape {getattr(leaf, 'shape', None)}, "
                f"expected leading system axis {n}"
            )
    return int(n)


def resolve_schema(specs: Sequence[RecordSpec], state: Any, *, aux: Callable[[], Any] | None = None,
                   batched: bool = False, dt: float | None = None) -> Schema:
    """The schema for ``specs`` evaluated on ``state`` (and ``aux()``, the traced aux output)."""
    n_sys = n_systems_of(state, batched)
    leaves: list[LeafSpec] = []
    for spec in specs:
        leaves += _leaves(spec.name, spec.name, spec.schedule, lambda v=spec.view: v(state), batched, n_sys, "record")
    if aux is not None:
        leaves += _leaves(AUX, AUX, AUX_SCHEDULE, aux, batched, n_sys, "step aux output")
    return Schema(tuple(leaves), batched=batched, dt=None if dt is None else float(dt))


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
