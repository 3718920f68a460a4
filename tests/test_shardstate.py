"""``drive.checkpoints.checkpoint``: a sharded state's blocks as a snapshot keeps them, and the global state
rebuilt from them, on 4 host CPU devices in a fresh interpreter (one process: each device's block
is this process's; tests/test_checkpoint_processes.py runs it over two processes), on a mesh of
explicit axes and on one of automatic axes."""

from __future__ import annotations

import pytest

from test_sharding import AXIS_TYPES, KINDS, _run_program

BODY = """
    from pytest_jaxlog.drive.checkpoints import checkpoint as shardstate
    from pytest_jaxlog.errors import JaxlogError

    x = jax.device_put(np.arange(32, dtype=np.float32).reshape(8, 4), sharded)  # rows over 4 devices
    t = jax.device_put(np.float32(3.5), NamedSharding(mesh, P()))  # replicated: one block
    key = jax.device_put(jax.random.key(7), NamedSharding(mesh, P()))
    blocks = {p: [b.to_json() for b in shardstate._blocks_of(v)]
              for p, v in shardstate.flatten_view("state", {"x": x, "t": t}).items()}
    info = {"shape": [8, 4], "dtype": "float32", "key_impl": None, "blocks": blocks["state/x"],
            "sharding": shardstate._sharding_json(x.sharding, "state/x")}
    parts = [{f"state/x@{b}": np.asarray(x)[2 * b:2 * b + 2] for b in range(4)}]
    back = shardstate.global_leaf("state/x", info, parts, "here")
    errors = {}
    for what, edit in (("missing", lambda i, p: (i, [{k: v for k, v in p[0].items() if k != "state/x@2"}])),
                       ("device", lambda i, p: ({**i, "sharding": {**i["sharding"], "devices": [0, 1, 2, 99]}}, p)),
                       ("types", lambda i, p: ({**i, "sharding": {**i["sharding"], "axis_types": ["Sideways"]}}, p))):
        try:
            shardstate.global_leaf("state/x", *edit(info, parts), "here")
        except JaxlogError as e:
            errors[what] = str(e)
    one = shardstate.snapshot({"x": x, "t": t, "k": key})  # one process: the whole state, as before
    print(json.dumps({"blocks": blocks, "equal": bool((np.asarray(back) == np.asarray(x)).all()),
                      "same_sharding": back.sharding == x.sharding, "errors": errors,
                      "axis_types": [str(t) for t in back.sharding.mesh.axis_types],
                      "one": sorted(one[0]), "impls": one[1], "json": info["sharding"]}))
"""


@pytest.mark.parametrize("kind", KINDS)
def test_blocks_and_the_state_rebuilt_from_them(kind):
    out = _run_program(BODY, devices=4, kind=kind)
    assert out["blocks"]["state/x"] == [{"index": [[2 * b, 2 * b + 2], [0, 4]], "owner": 0} for b in range(4)]
    assert out["blocks"]["state/t"] == [{"index": [], "owner": 0}]  # replicated: one block, written once
    assert out["equal"] and out["same_sharding"]
    assert out["axis_types"] == [AXIS_TYPES[kind]]  # the mesh's own axis types, not the default ones
    assert out["json"] == {"devices": [0, 1, 2, 3], "axes": ["d"], "spec": ["d"],
                           "axis_types": ["Explicit" if kind == "explicit" else "Auto"]}
    assert out["errors"]["missing"].startswith("[jaxlog] here: state/x: the block ((4, 6), (0, 4)) device 2 holds "
                                               "is in no part (part 0 lacks state/x@2)"), out["errors"]["missing"]
    assert "sharded over device 99, which this run does not have" in out["errors"]["device"]
    assert out["errors"]["types"].startswith("[jaxlog] here: state/x: the stored sharding's axis types ['Sideways'] "
                                             "are not one of ['Auto', 'Explicit', 'Manual'] per mesh axis ['d']")
    assert out["one"] == ["state/k", "state/t", "state/x"] and out["impls"] == {"state/k": "threefry2x32"}
