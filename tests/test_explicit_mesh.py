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


@pytest.mark.parametrize("kind", ["explicit", "auto", "set_mesh"])
def test_a_resume_continues_on_the_mesh_and_equals_the_uninterrupted_run(kind, tmp_path):
    """Stopped after its checkpoint at step 100 and resumed with like= (the initial state): the
    state comes back on the mesh, with its axis types, and the file equals the uninterrupted
    run's frames bit for bit; without like= the resume is refused, naming the mesh. The same
    with the mesh set for the whole program (``jax.set_mesh``)."""
    out = _run_program(textwrap.dedent(KERNEL) + textwrap.dedent(f"""
        mesh, state = make({kind!r})
        if {kind!r} == "set_mesh":
            jax.set_mesh(mesh)  # (the global mesh from here on)
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
            "axis_types": [str(t) for t in run.state[0].sharding.mesh.axis_types],
            "e": bool(np.array_equal(jl.load(path)["e"], full.trajectory["e"])),
            "state": all(bool(np.array_equal(np.asarray(a), np.asarray(b))) for a, b in zip(run.state, full.state)),
        }}))
    """))
    assert "the run's state was sharded over a mesh ('d': 4); pass like=" in out["refused"]
    assert out["resumed_from"] == 100 and out["devices"] == 4 and out["spec"] == [["d"], ["d"]]
    assert out["axis_types"] == (["AxisType.Auto"] if kind == "auto" else ["AxisType.Explicit"])
    assert out["e"] and out["state"], out


def test_a_shard_map_kernel_logs_per_shard_and_reduced_values():
    """A halo-exchange stencil written with ``jax.shard_map`` (``ppermute`` to the neighbours, a
    ``psum``): ``jl.log`` inside the mapped function records one row per shard, or one value
    reduced over the shards (``shards=``), and the run's state equals a plain ``lax.scan`` of the
    same step bit for bit."""
    out = _run_program(textwrap.dedent("""
        mesh = jax.make_mesh((4,), ("d",))
        put = lambda a: jax.device_put(a, NamedSharding(mesh, P("d")))

        def local(x, v):
            left = lax.ppermute(x[-1:], "d", [(i, (i + 1) % 4) for i in range(4)])
            right = lax.ppermute(x[:1], "d", [(i, (i - 1) % 4) for i in range(4)])
            lap = jnp.concatenate([left, x[:-1]]) + jnp.concatenate([x[1:], right]) - 2 * x
            v = v + 0.1 * lap
            jl.log("shard_max", jnp.max(jnp.abs(v)))
            jl.log("momentum", lax.psum(jnp.sum(v), "d"))
            jl.log("global_max", jnp.max(jnp.abs(v)), shards="max")  # reduced over the shards
            jl.log("total", jnp.sum(v), shards="sum")
            jl.log("p_once", lax.psum(jnp.sum(v), "d"), shards="first")  # each shard holds it whole
            return x + 0.1 * v, v

        mapped = jax.shard_map(local, mesh=mesh, in_specs=(P("d"), P("d")), out_specs=(P("d"), P("d")))
        step = lambda s: mapped(*s)
        state = (put(np.sin(np.linspace(0, 6, 64)).astype(np.float32)), put(np.zeros(64, np.float32)))
        run = jl.run(step, state, 40, record={"v": lambda s: s[1]}, chunk=16, progress=False)
        traj = run.trajectory
        ref = jax.jit(lambda s: lax.scan(lambda c, _: (step(c), step(c)[1]), s, None, length=40))(state)
        v = np.asarray(ref[1])  # v at steps 1..40
        print(json.dumps({
            "state": all(bool(np.array_equal(np.asarray(a), np.asarray(b))) for a, b in zip(run.state, ref[0])),
            "v": bool(np.array_equal(traj["v"][1:], v)),
            "max_shape": list(traj["log/shard_max"].shape),
            "max": bool(np.array_equal(traj["log/shard_max"], np.abs(v).reshape(40, 4, 16).max(axis=2))),
            "momentum": np.allclose(traj["log/momentum"], np.repeat(v.sum(axis=1)[:, None], 4, axis=1),
                                    rtol=1e-5, atol=1e-6),
            "steps": traj.steps("log/momentum").tolist()[:3],
            "reduced_shapes": [list(traj[k].shape) for k in ("log/global_max", "log/total", "log/p_once")],
            "global_max": bool(np.array_equal(traj["log/global_max"], np.abs(v).max(axis=1))),
            "total": bool(np.allclose(traj["log/total"], v.reshape(40, 4, 16).sum(axis=2).sum(axis=1),
                                      rtol=1e-5, atol=1e-6)),
            "p_once": bool(np.array_equal(traj["log/p_once"], traj["log/momentum"][:, 0])),
        }))
    """))
    assert out["state"] and out["v"], out
    assert out["max_shape"] == [40, 4] and out["max"], out  # one row per step, a column per shard
    assert out["momentum"] and out["steps"] == [1, 2, 3], out
    # shards="max" / "sum" / "first": one value a step, reduced as the log asks
    assert out["reduced_shapes"] == [[40], [40], [40]], out
    assert out["global_max"] and out["total"] and out["p_once"], out


def test_a_recorder_takes_states_on_a_mesh_of_explicit_axes():
    """``jl.Recorder`` in a hand-written loop over a sharded state: its buffers live on the state's
    mesh (a row is written only into a buffer of its mesh), the sharded record comes back whole."""
    out = _run_program(textwrap.dedent(KERNEL) + textwrap.dedent("""
        mesh, state = make("explicit")
        jstep = jax.jit(step)
        xs, es, s = [], [], state
        with jl.Recorder(record={"e": energy, "x": jl.Record(lambda s: s[0], every=5)},
                         sinks=[jl.MemorySink()]) as rec:
            for k in range(21):
                rec.log(s, k)
                xs.append(np.asarray(s[0]))
                es.append(float(jax.jit(energy)(s)))
                s = jstep(s)
        traj = rec.trajectory
        print(json.dumps({
            "x": bool(np.array_equal(traj["x"], np.stack(xs[::5]))),
            "steps": traj.steps("x").tolist(),
            "e": bool(np.allclose(traj["e"], es, rtol=1e-6)),
        }))
    """))
    assert out["x"] and out["e"] and out["steps"] == [0, 5, 10, 15, 20], out


def test_a_one_device_mesh_of_explicit_axes_runs_too():
    """``jax.make_mesh((1,), ...)``: one device, but the values' types carry the mesh, so the
    buffers must be made on it (they were plain device arrays, and the first row failed)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import pytest_jaxlog as jl

    mesh = jax.make_mesh((1,), ("d",))
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("d")))  # noqa: E731
    state = (put(np.linspace(0.1, 1.0, 16, dtype=np.float32)), put(np.zeros(16, np.float32)))

    def step(s):
        return s[0] + 0.01 * s[1], s[1] - 0.01 * jnp.sin(s[0])

    run = jl.run(step, state, 30, record={"x": lambda s: s[0], "e": lambda s: jnp.sum(s[1] ** 2)}, progress=False)
    ref = jax.jit(lambda s: lax.scan(lambda c, _: (step(c), step(c)[0]), s, None, length=30))(state)
    np.testing.assert_array_equal(run.trajectory["x"][1:], np.asarray(ref[1]))
    np.testing.assert_array_equal(np.asarray(run.state[0]), np.asarray(ref[0][0]))
    assert run.state[0].sharding.mesh.axis_types == mesh.axis_types


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_a_violation_on_a_mesh_names_the_global_element_and_keeps_the_states_before_it(kind, tmp_path):
    """A NaN put at particle 45 (device 2's block) at step 37: the violation names the global
    element, the post-mortem states are the plain scan's states at steps 35-37 bit for bit, and
    the run's cost is read from the compiled program as on one device."""
    out = _run_program(textwrap.dedent(KERNEL) + textwrap.dedent(f"""
        mesh, state = make({kind!r})
        path = {str(tmp_path / "t.h5")!r}

        def poisoned(s):
            x, v, k = s
            x, v = step((x, v))
            return jnp.where((jnp.arange(64) == 45) & (k + 1 == 37), jnp.nan, x), v, k + 1

        s0 = state + (jnp.int32(0),)
        run = jl.run(poisoned, s0, 60, chunk=16, record={{"x": lambda s: s[0]}}, invariants=[jl.finite("x")],
                     on_violation="record", postmortem=3, sinks=[jl.HDF5Writer(path)], progress=False)
        e = run.violation
        states = jax.jit(lambda s: lax.scan(lambda c, _: (poisoned(c), poisoned(c)), s, None, length=37))(s0)[1]
        traj = jl.load(path)
        kept = {{k: bool(np.array_equal(np.asarray(traj.state(k, like=s0)[0]), np.asarray(states[0][k - 1]), equal_nan=True))
                 for k in traj.postmortem}}
        print(json.dumps({{
            "step": e.step, "index": list(e.index), "system": e.system, "msg": str(e),
            "postmortem": sorted(traj.postmortem), "kept": kept, "status": traj.status,
            "flops": run.cost.flops, "one_device": jl.cost(poisoned, jax.device_get(s0)).flops,
        }}))
    """))
    assert out["step"] == 37 and out["index"] == [45] and out["system"] is None, out
    assert "45" in out["msg"] and "37" in out["msg"]
    assert out["postmortem"] == [35, 36, 37] and all(out["kept"].values()), out
    assert out["status"] == "violated"
    assert out["flops"] > 0 and out["one_device"] > 0, out


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_a_golden_of_a_sharded_run_matches_the_scan_and_catches_a_change(kind, tmp_path):
    """A golden written from a run on the mesh holds the scan's values; the same run matches it,
    and a kernel 1% off fails it, naming the record."""
    out = _run_program(textwrap.dedent(KERNEL) + textwrap.dedent(f"""
        from pytest_jaxlog.compare.golden import check_golden
        from pytest_jaxlog.errors import JaxlogError
        mesh, state = make({kind!r})
        golden = {str(tmp_path / "g.h5")!r}
        record = {{"e": energy, "x": jl.Record(lambda s: s[0], every=50)}}
        run = jl.run(step, state, 200, record=record, chunk=100, progress=False)
        made = check_golden(run, golden, regen=True, rtol=1e-6)
        _, e, x = scan(state)
        g = jl.load(golden)
        again = check_golden(jl.run(step, state, 200, record=record, chunk=70, progress=False), golden, regen=False)
        off = lambda s: (step(s)[0] * 1.01, step(s)[1])
        try:
            check_golden(jl.run(off, state, 200, record=record, chunk=100, progress=False), golden, regen=False)
            caught = ""
        except AssertionError as exc:
            caught = str(exc)
        print(json.dumps({{"made": made, "again": again, "caught": caught[:400],
                          "e": bool(np.array_equal(g["e"], np.asarray(e))),
                          "x": bool(np.array_equal(g["x"], np.asarray(x)))}}))
    """))
    assert out["made"] == "regenerated" and out["again"] == "ok", out
    assert out["e"] and out["x"], out
    assert "'e'" in out["caught"] or "'x'" in out["caught"], out
