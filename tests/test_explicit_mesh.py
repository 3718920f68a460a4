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


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_a_resume_continues_on_the_mesh_and_equals_the_uninterrupted_run(kind, tmp_path):
    """Stopped after its checkpoint at step 100 and resumed with like= (the initial state): the
    state comes back on the mesh and the file equals the uninterrupted run's frames bit for bit;
    without like= the resume is refused, naming the mesh."""
    out = _run_program(textwrap.dedent(KERNEL) + textwrap.dedent(f"""
        mesh, state = make({kind!r})
        path = {str(tmp_path / "t.h5")!r}
        full = jl.run(step, state, 300, record={{"e": energy}}, progress=False)

        def stop(k, rows):
            if k >= 150:
                raise KeyboardInterrupt
        try:
            jl.run(step, state, 300, record={{"e": energy}}, checkpoint=jl.every(100), chunk=50, progress=False,
                   sinks=[jl.HDF5Writer(path), jl.CallbackSink(stop, rows=True)])
        except KeyboardInterrupt:
            pass
        try:
            jl.resume(path, step, 300, record={{"e": energy}}, progress=False)
            refused = ""
        except jl.JaxlogError as e:
            refused = str(e)
        run = jl.resume(path, step, 300, like=state, record={{"e": energy}}, progress=False)
        print(json.dumps({{
            "refused": refused,
            "resumed_from": run.resumed_from,
            "spec": [spec(a.sharding) for a in run.state],
            "devices": len(run.state[0].sharding.device_set),
            "e": bool(np.array_equal(jl.load(path)["e"], full.trajectory["e"])),
            "state": all(bool(np.array_equal(np.asarray(a), np.asarray(b))) for a, b in zip(run.state, full.state)),
        }}))
    """))
    assert "the run's state was sharded over a mesh ('d': 4); pass like=" in out["refused"]
    assert out["resumed_from"] == 100 and out["devices"] == 4 and out["spec"] == [["d"], ["d"]]
    assert out["e"] and out["state"], out
