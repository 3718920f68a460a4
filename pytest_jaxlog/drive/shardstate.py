"""A state sharded across processes, as a snapshot (a checkpoint, a post-mortem state) keeps it.

No process holds such a state whole, so each process stores the blocks of each leaf it owns
(as for records: each distinct block once, by the lowest process holding it) in its own part
file, as ``<path>@<block>``, with ``jaxlog_blocks``: every leaf's global shape, dtype, blocks
and sharding (its mesh's device ids, axis names and axis types, and partition spec), the same
in every part.
A resume in as many processes rebuilds each leaf from the blocks its own devices need (read
from whichever part holds them) with ``jax.make_array_from_single_device_arrays``, on the
sharding the state had: every process gets back exactly the shards it had.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ..errors import JaxlogError
from ..record.frames import Block
from ..store.parts import PartTree
from .checkpoint import array_json, json_array
from .resolve import flatten_view, state_key_impls, state_paths
from .shards import _norm

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
