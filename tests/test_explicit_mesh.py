"""States sharded on meshes of explicit axes (``jax.make_mesh``'s default since jax 0.10) run
under ``jl.run``: the record buffers are laid out as the views' values (their frame axis
unsharded), so nothing is gathered, and the records and state equal a plain ``lax.scan`` on the
same mesh, bit for bit; the same on a mesh of automatic axes and under ``jax.set_mesh``."""

from __future__ import annotations

import textwrap

import pytest

from test_sharding import _run_program

KERNEL = """
    from jax.sharding import AxisType
    import contextlib

    def step(s):
        x, v = s
        v = v - 0.01 * jnp.sin(x)
        return (x + 0.01 * v, v)

    def energy(s):
        x, v = s
        return 0.5 * (v ** 2).sum() - jnp.cos(x).sum()

    def make(kind):
        types = (AxisType.Explicit,) if kind != "auto" else (AxisType.Auto,)
        mesh = jax.make_mesh((4,), ("d",), axis_types=types)
        put = lambda a: jax.device_put(a, NamedSharding(mesh, P("d")))
        state = (put(np.linspace(0.1, 1.0, 64, dtype=np.float32)), put(np.zeros(64, np.float32)))
        return mesh, state

    @jax.jit
    def scan(s):
        def inner(c, _):
            c = step(c)
            return c, energy(c)
        def outer(c, _):
            c, e = lax.scan(inner, c, None, length=50)
            return c, (e, c[0])
        end, (e, x) = lax.scan(outer, s, None, length=4)
        return end, jnp.concatenate([energy(s)[None], e.reshape(-1)]), jnp.concatenate([s[0][None], x])
"""


@pytest.mark.parametrize("kind", ["explicit", "auto", "set_mesh"])
def test_a_state_on_a_mesh_runs_as_a_plain_scan_does(kind):
    out = _run_program(textwrap.dedent(KERNEL) + textwrap.dedent(f"""
        kind = {kind!r}
        mesh, state = make(kind)
        scope = jax.set_mesh(mesh) if kind == "set_mesh" else contextlib.nullcontext()
        with scope:
            run = jl.run(step, state, 200, record={{"e": energy, "x": jl.Record(lambda s: s[0], every=50)}},
                         chunk=100, progress=False)
            end, e, x = scan(state)
        traj = run.trajectory
        outs = run.compiled.output_shardings
        print(json.dumps({{
            "axis_types": [str(t) for t in mesh.axis_types],
            "e": bool(np.array_equal(traj["e"], np.asarray(e))),
            "x": bool(np.array_equal(traj["x"], np.asarray(x))),
            "steps": traj.steps("x").tolist(),
            "state": all(bool(np.array_equal(np.asarray(a), np.asarray(b))) for a, b in zip(run.state, end)),
            "state_spec": [spec(a.sharding) for a in run.state],
            "x_buffer": spec(outs["bufs"]["compact"][0][0]["x"]),
        }}))
    """))
    assert out["axis_types"] == (["AxisType.Auto"] if kind == "auto" else ["AxisType.Explicit"])
    assert out["steps"] == [0, 50, 100, 150, 200]
    assert out["e"] and out["x"] and out["state"], out
    assert out["state_spec"] == [["d"], ["d"]]
    assert out["x_buffer"] == [None, "d"]  # laid out as the view's values: no gather to one device
