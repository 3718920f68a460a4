"""States sharded over 4 host CPU devices, and runs over two processes with ``jax.distributed``.

Each case runs in a fresh interpreter: the device count is fixed when jax starts, and this
process's jax has started with one device. The programs print one JSON line the tests assert on.
Each case runs on a mesh of explicit axes (``jax.make_mesh``'s default since jax 0.10) and on
one of automatic axes (``KIND`` in the program).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pytest_jaxlog as jl

ROOT = Path(__file__).resolve().parents[1]
KINDS = ["explicit", "auto"]  # the mesh's axis types
AXIS_TYPES = {"explicit": "AxisType.Explicit", "auto": "AxisType.Auto"}

PRELUDE = textwrap.dedent("""
    import json, os, re, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax import lax
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
    import pytest_jaxlog as jl
    from kernels.lj import make_lj
    from kernels.oscillators import make_oscillators

    COLLECTIVES = ("all-gather", "all-to-all", "collective-permute", "all-reduce", "reduce-scatter")

    def collectives(hlo):
        return {op: len(re.findall(r"= [^=]*? %s(-start)?\\(" % op, hlo)) for op in COLLECTIVES}

    def spec(sharding):
        return [None if a is None else str(a) for a in sharding.spec]

    mesh = Mesh(np.array(jax.devices()), ("d",),
                axis_types=(AxisType.Explicit if KIND == "explicit" else AxisType.Auto,))
    sharded = NamedSharding(mesh, P("d"))

    def kernel(name):
        if name == "lj":
            step, state, energies = make_lj(n_side=4)
            total = lambda s: energies(s)["total"]
            if KIND == "explicit":
                # all pairs (positions[:, None] - positions[None]) has both atom axes on "d", which JAX
                # refuses on explicit axes: the positions are gathered first, by hand, as an automatic
                # mesh's compiler gathers them itself, and the new state is put back on "d"
                whole = lambda s: jax.tree_util.tree_map(lambda a: jax.sharding.reshard(a, NamedSharding(mesh, P())), s)
                back = lambda s: jax.tree_util.tree_map(lambda a: jax.sharding.reshard(a, sharded), s)
                lj_step, lj_total = step, total
                step, total = (lambda s: back(lj_step(whole(s)))), (lambda s: lj_total(whole(s)))
            return step, state, total, lambda s: s.positions
        step, state, energy = make_oscillators(n=1024)
        return step, state, energy, lambda s: s.x
""")


def _env(devices: int) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "examples"), env.get("PYTHONPATH", "")])
    return env


def _strip(spec: list) -> list:
    """A partition spec without its trailing unsharded axes (``P()`` == ``P(None, None)``)."""
    spec = list(spec)
    while spec and spec[-1] is None:
        spec.pop()
    return spec


def _run_program(body: str, devices: int = 4, timeout: float = 120, kind: str = "auto") -> dict:
    """``body`` run after ``PRELUDE``, its ``mesh`` of explicit axes or of automatic ones (``kind``)."""
    code = f"KIND = {kind!r}\n" + PRELUDE + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code], env=_env(devices), capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["osc", "lj"])
def test_run_adds_no_collectives_and_keeps_shardings(name, kind):
    out = _run_program(f"""
        assert jax.device_count() == 4
        step, state, energy, view = kernel({name!r})
        state = jax.device_put(state, sharded)
        record = {{"energy": energy, "x": jl.Record(view, every=10), "v": lambda s: s[1]}}
        run = jl.run(step, state, 100, chunk=50, record=record)
        compiled = run.compiled_chunk()

        @jax.jit
        def bare(s):  # the same step and the same records (the initial state's too) in a plain scan
            def inner(c, _):
                c = step(c)
                return c, (energy(c), c[1])
            def outer(c, _):
                c, (e, v) = lax.scan(inner, c, None, length=10)
                return c, (e, v, view(c))
            return (energy(s), s[1], view(s)), lax.scan(outer, s, None, length=5)

        outs = compiled.output_shardings
        print(json.dumps({{
            "run": collectives(compiled.as_text()),
            "bare": collectives(bare.lower(state).compile().as_text()),
            "state_in": [spec(x.sharding) for x in jax.tree_util.tree_leaves(state)],
            "state_out": [spec(x.sharding) for x in jax.tree_util.tree_leaves(run.state)],
            "buffers": {{"energy": spec(outs["bufs"]["dense"]["energy"]), "v": spec(outs["bufs"]["dense"]["v"]),
                         "x": spec(outs["bufs"]["compact"][0][0]["x"])}},
            "views": {{"energy": spec(jax.jit(energy).lower(state).compile().output_shardings),
                       "x": spec(jax.jit(view).lower(state).compile().output_shardings),
                       "v": spec(jax.jit(lambda s: s[1]).lower(state).compile().output_shardings)}},
            "frames": [len(run.trajectory["energy"]), list(run.trajectory["x"].shape)],
            "axis_types": [str(t) for t in run.state[0].sharding.mesh.axis_types],
        }}))
    """, kind=kind)
    for op in ("all-gather", "all-to-all", "collective-permute"):
        assert out["run"][op] <= out["bare"][op], (op, out)
    if name == "lj":
        assert out["bare"]["all-gather"] >= 1  # all pairs: the positions are gathered, by both
    # (on explicit axes a spec names every axis of its value: ["d", None] is ["d"])
    assert [_strip(s) for s in out["state_out"]] == [_strip(s) for s in out["state_in"]]
    assert all(_strip(s) == ["d"] for s in out["state_in"])
    for path in ("energy", "x", "v"):  # a buffer is its view's sharding with an unsharded step axis
        buf, view = _strip(out["buffers"][path]), _strip(out["views"][path])
        assert buf == ([None, *view] if view else []), (path, out)
    assert out["buffers"]["x"][:2] == [None, "d"] and out["buffers"]["v"][:2] == [None, "d"]
    assert out["frames"][0] == 101 and out["frames"][1][0] == 11
    assert out["axis_types"] == [AXIS_TYPES[kind]]


@pytest.mark.parametrize("kind", KINDS)
def test_sharded_run_moves_nothing_between_devices_and_matches_one_device(kind):
    out = _run_program("""
        step, state, energy, view = kernel("osc")
        record = {"energy": energy, "x": jl.Record(view, every=10)}
        plain = jl.run(step, state, 120, chunk=50, record=record)
        x_sharded = jax.device_put(state, sharded)
        try:  # the guard is live: a flag made on device 0 and passed along with the sharded state is refused
            with jax.transfer_guard_device_to_device("disallow_explicit"):
                jax.jit(lambda a, b: a * b)(x_sharded.x, jnp.zeros((), bool))
            refused = False
        except Exception as e:
            refused = "Disallowed device-to-device transfer" in str(e)
        with jax.transfer_guard_device_to_device("disallow_explicit"):
            run = jl.run(step, x_sharded, 120, chunk=50, record=record,
                         invariants=[jl.finite("x"), jl.conserved("energy", rtol=1e-3)])
            keyed = jl.run(lambda k, s: step(s), x_sharded, 120, chunk=50, key=jax.random.key(1),
                           until=lambda s: jnp.max(s.x) > 1e9, record=record)  # (x[0] of a dim sharded
        # over explicit axes is refused by jax 0.10: not a block of the mesh)
        print(json.dumps({
            "refused": refused,
            "x_equal": bool(np.array_equal(run.trajectory["x"], plain.trajectory["x"])),
            "keyed_x_equal": bool(np.array_equal(keyed.trajectory["x"], plain.trajectory["x"])),
            "state_equal": bool(np.array_equal(np.asarray(run.state.x), np.asarray(plain.state.x))),
            "energy_close": bool(np.allclose(run.trajectory["energy"], plain.trajectory["energy"], rtol=1e-6)),
            "stop": [run.stop_reason, keyed.stop_reason, keyed.steps_done],
            "sharding": spec(run.state.x.sharding),
            "axis_types": [str(t) for t in run.state.x.sharding.mesh.axis_types],
        }))
    """, kind=kind)
    assert out["refused"], out
    assert out["axis_types"] == [AXIS_TYPES[kind]]
    assert out["x_equal"] and out["keyed_x_equal"] and out["state_equal"] and out["energy_close"], out
    assert out["stop"] == ["steps", "steps", 120] and out["sharding"] == ["d"]


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_invariants_on_sharded_records_name_the_global_element_and_system(kind):
    # (explicit: the oscillators' spring constants are hoisted into the chunk program, and the step
    # is evaluated from its trace there; traced without the state's sharding, its masked output
    # came out unsharded and its first row did not fit the record's buffer)
    # the NaN and the inf are put in with a mask (jnp.where), not .at[i].set: a scatter into a dim
    # sharded over explicit axes is refused at trace time (JAX asks for its out_sharding)
    out = _run_program("""
        step, state, energy, view = kernel("osc")

        def counted(s):
            x, v, k = s
            new = step(type(state)(x, v))
            bad = (k + 1) == 37
            return (jnp.where((jnp.arange(1024) == 700) & bad, jnp.nan, new.x), new.v, k + 1)

        s0 = jax.device_put((state.x, state.v), sharded) + (jnp.int32(0),)
        try:
            jl.run(counted, s0, 60, chunk=16, record={"x": lambda s: s[0]}, invariants=[jl.finite("x")])
            element = None
        except jl.InvariantViolation as e:
            element = {"step": e.step, "index": list(e.index), "system": e.system, "msg": str(e)}

        bstep, bstate, benergy = make_oscillators(n=64, systems=8)
        def bcounted(s):
            x, v, k = s
            new = bstep(type(bstate)(x, v))
            at = (jnp.arange(8)[:, None] == 6) & (jnp.arange(64)[None, :] == 5)
            x = jnp.where(at & ((k + 1) == 21), jnp.inf, new.x)
            return (x, new.v, k + 1)
        b0 = jax.device_put((bstate.x, bstate.v), sharded) + (jnp.int32(0),)
        try:
            jl.run(bcounted, b0, 40, chunk=16, batched=8, record={"x": lambda s: s[0]},
                   invariants=[jl.finite("x")])
            system = None
        except jl.InvariantViolation as e:
            system = {"step": e.step, "index": None if e.index is None else list(e.index), "system": e.system,
                      "msg": str(e)}
        print(json.dumps({"element": element, "system": system,
                          "on_device_2": [list(s.index[0].indices(1024)) for s in s0[0].addressable_shards
                                          if s.device == jax.devices()[2]][0]}))
    """, kind=kind)
    assert out["on_device_2"][:2] == [512, 768]
    e = out["element"]
    assert e is not None and e["step"] == 37 and e["index"] == [700] and e["system"] is None, out
    assert "700" in e["msg"] and "37" in e["msg"]
    s = out["system"]
    assert s is not None and s["step"] == 21 and s["system"] == 6 and s["index"] == [5], out
    assert "system 6" in s["msg"]


# --------------------------------------------------------------------------------------------
# two processes, jax.distributed on the CPU

# a process of two: its sharded oscillators and records (argv: process, port, path; KIND: the mesh's
# axis types, "explicit" or "auto", set before it by multi_prelude)
_MULTI_PRELUDE = textwrap.dedent("""
    import json, os, sys
    import jax
    process, port, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process)
    import jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
    import pytest_jaxlog as jl
    from kernels.oscillators import make_oscillators

    step, state, energy = make_oscillators(n=64)
    mesh = Mesh(np.array(jax.devices()), ("d",),  # 2 devices here, 2 in the other process
                axis_types=(AxisType.Explicit if KIND == "explicit" else AxisType.Auto,))
    sharded = NamedSharding(mesh, P("d"))
    state = jax.tree_util.tree_map(
        lambda a: jax.make_array_from_callback(a.shape, sharded, lambda i: np.asarray(a)[i]), state)
    RECORD = {"energy": energy, "peak": lambda s: jnp.max(jnp.abs(s.x)), "x": lambda s: s.x,
              "v": jl.Record(lambda s: s.v, every=5)}
""")


def multi_prelude(kind: str) -> str:
    """A two-process program's opening on a mesh of ``kind`` axes ("explicit" or "auto")."""
    return f"KIND = {kind!r}\n" + _MULTI_PRELUDE


MULTI = textwrap.dedent("""
    run = jl.run(step, state, 30, chunk=8, record=RECORD, sinks=[jl.HDF5Writer(path)], dt=0.01,
                 invariants=[jl.finite("energy", "peak")])
    errors = {}
    for what, kw in (("invariant", {"invariants": [jl.finite("x")], "sinks": [jl.HDF5Writer(path + ".other")]}),
                     ("memory", {})):
        try:
            jl.run(step, state, 5, chunk=4, record={"x": lambda s: s.x}, **kw)
        except jl.JaxlogError as e:
            errors[what] = str(e)
    held = sorted(int(s.index[0].start) for s in run.state.x.addressable_shards)
    print(json.dumps({"process": jax.process_index(), "count": jax.process_count(), "steps": run.steps_done,
                      "held": held, "errors": errors, "sharding": [str(a) for a in run.state.x.sharding.spec],
                      "axis_types": [str(t) for t in run.state.x.sharding.mesh.axis_types]}))
    jax.distributed.shutdown()
""")

REFERENCE = """
    step, state, energy = make_oscillators(n=64)
    state = jax.device_put(state, sharded)
    RECORD = {"energy": energy, "peak": lambda s: jnp.max(jnp.abs(s.x)), "x": lambda s: s.x,
              "v": jl.Record(lambda s: s.v, every=5)}
    jl.run(step, state, 30, chunk=8, record=RECORD, sinks=[jl.HDF5Writer(sys.argv[1])], dt=0.01)
    print(json.dumps({"ok": True}))
"""


def _result(out: str) -> dict:
    """A child's JSON result (``{"process": ...}``, its last): gloo's C++ side writes to the same
    stdout (``[Gloo] Rank 0 is connected ...``), at times on the same line, before or after it."""
    at = out.rfind('{"process"')
    assert at >= 0, f"no JSON result in the child's output:\n{out[-3000:]}"
    return json.JSONDecoder().raw_decode(out, at)[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_processes(path: Path, kind: str) -> list[dict]:
    port = _free_port()
    code = multi_prelude(kind) + MULTI
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i), str(port), str(path)], env=_env(2),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, out[-3000:] + err[-5000:]
        outs.append(_result(out))
    return outs


@pytest.fixture(scope="module", params=KINDS)
def two_process_run(request, tmp_path_factory):
    """The two-process run and its one-process reference, once per kind of mesh axes."""
    kind = request.param
    d = tmp_path_factory.mktemp(f"multi-{kind}")
    outs = _two_processes(d / "traj.h5", kind)
    r = subprocess.run([sys.executable, "-c", f"KIND = {kind!r}\n" + PRELUDE + textwrap.dedent(REFERENCE),
                        str(d / "ref.h5")], env=_env(4), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-5000:]
    return d, outs, kind


def test_two_processes_write_their_shards_and_load_as_one_run(two_process_run):
    d, outs, kind = two_process_run
    assert all(o["axis_types"] == [AXIS_TYPES[kind]] for o in outs), outs
    assert [o["process"] for o in outs] == [0, 1] and all(o["count"] == 2 and o["steps"] == 30 for o in outs)
    assert outs[0]["held"] == [0, 16] and outs[1]["held"] == [32, 48]  # each process holds half the particles
    assert all(o["sharding"] == ["d"] for o in outs)
    # (the refused run with an invariant on x created no file)
    assert sorted(p.name for p in d.iterdir()) == ["ref.h5", "traj.h5", "traj.h5.p0", "traj.h5.p1"]
    p0, p1 = jl.load(d / "traj.h5.p0"), jl.load(d / "traj.h5.p1")
    # each process wrote the blocks it holds; the replicated records only process 0
    assert set(p0.records) == {"energy", "peak", "x@0", "x@1", "v@0", "v@1"}
    assert set(p1.records) == {"x@2", "x@3", "v@2", "v@3"}
    assert p0["x@1"].shape == (31, 16) and p1["v@3"].shape == (7, 16)

    traj, ref = jl.load(d / "traj.h5"), jl.load(d / "ref.h5")
    assert traj.records == ref.records and traj.status == "complete" and traj.steps_done == 30
    assert traj.stop_reason == "steps"
    for name in ("x", "v", "peak"):  # bit for bit
        np.testing.assert_array_equal(traj.steps(name), ref.steps(name))
        got, want = traj[name], ref[name]
        assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes(), name
    # a sum over all particles goes through the collectives' own reduction order (in-process vs gloo)
    np.testing.assert_allclose(traj["energy"], ref["energy"], rtol=1e-6)
    np.testing.assert_array_equal(traj.steps("energy"), np.arange(31))
    # selections read only their frames and index like the whole array
    np.testing.assert_array_equal(traj["x", 3:9, 10:40], ref["x"][3:9, 10:40])
    np.testing.assert_array_equal(traj["x", [7, 2, 7]], ref["x"][[7, 2, 7]])
    np.testing.assert_array_equal(traj["x", -1, 33], ref["x"][-1, 33])
    for key in (slice(None, None, -3), np.arange(31) % 4 == 0, (Ellipsis, 5), (None, 2), ([3, 1], [0, 40]),
                np.int64(-2)):
        got = traj[("x", *key)] if isinstance(key, tuple) else traj["x", key]
        np.testing.assert_array_equal(got, ref["x"][key], err_msg=repr(key))
        assert got.shape == ref["x"][key].shape, key
    for bad in (31, -32, [0, 40]):
        with pytest.raises(IndexError):
            traj["x", bad]
    np.testing.assert_array_equal(traj.between("v", 10, 20), ref.between("v", 10, 20))
    np.testing.assert_array_equal(traj.time("v"), ref.time("v"))
    saved = traj.save(d / "merged.h5")  # one ordinary file again
    np.testing.assert_array_equal(jl.load(saved)["x"], ref["x"])


def test_two_processes_refuse_what_no_process_holds_whole(two_process_run):
    _, outs, _ = two_process_run
    for o in outs:
        inv, mem = o["errors"]["invariant"], o["errors"]["memory"]
        assert inv.startswith("[jaxlog] invariant finite(x): record 'x' is sharded across processes") and "reduction" in inv
        assert mem.startswith("[jaxlog] record 'x' is sharded across processes") and "MemorySink" in mem
        assert "jl.HDF5Writer(path)" in mem


def test_the_index_links_nothing_and_names_only_its_parts(two_process_run, tmp_path):
    import h5py

    d, _, _ = two_process_run
    for name in ("traj.h5", "traj.h5.p0", "traj.h5.p1"):
        with h5py.File(d / name, "r") as f:
            links = []
            f.visititems_links(lambda n, link: links.append((n, type(link).__name__)))
            assert all(kind in ("HardLink", "SoftLink") for _, kind in links), links
            virtual = []
            f.visititems(lambda n, obj: virtual.append(n) if isinstance(obj, h5py.Dataset) and obj.is_virtual else None)
            assert not virtual and not any(isinstance(obj, h5py.Dataset) and obj.external
                                           for obj in _datasets(f))
    with h5py.File(d / "traj.h5", "r") as f:
        assert "observables" not in f  # the index holds no data, only where it is
        parts = json.loads(f["jaxlog"].attrs["parts"])
    assert parts["files"] == ["traj.h5.p0", "traj.h5.p1"]
    assert [(e["file"], e["index"]) for e in parts["records"]["x"]] == [(0, [[0, 16]]), (0, [[16, 32]]),
                                                                      (1, [[32, 48]]), (1, [[48, 64]])]
    assert [e["file"] for e in parts["records"]["energy"]] == [0]

    def tampered(edit, files=("traj.h5.p0", "traj.h5.p1"), name="t.h5"):
        work = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
        work.mkdir()
        for f in files:
            (work / f).write_bytes((d / f).read_bytes())
        (work / name).write_bytes((d / "traj.h5").read_bytes())
        doc = json.loads(json.dumps(parts))
        edit(doc, work)
        with h5py.File(work / name, "r+") as f:
            f["jaxlog"].attrs["parts"] = json.dumps(doc)
        return work / name

    def expect(path, *words):
        with pytest.raises(jl.JaxlogError) as e:
            jl.load(path)
        for w in words:
            assert w in str(e.value), str(e.value)

    expect(tampered(lambda doc, w: doc["files"].__setitem__(1, "../traj.h5.p1")), "not a plain file name")
    expect(tampered(lambda doc, w: doc["files"].__setitem__(1, "/etc/passwd")), "not a plain file name")
    expect(tampered(lambda doc, w: doc["files"].__setitem__(1, "t.h5")), "names itself")
    expect(tampered(lambda doc, w: doc.__setitem__("run_id", "0" * 32)), "not process 0's part of this run")
    expect(tampered(lambda doc, w: doc["files"].reverse()), "not process 0's part")
    expect(tampered(lambda doc, w: None, files=("traj.h5.p0",)), "part file traj.h5.p1 is missing")

    def nested(doc, work):  # a part that is an index (its own parts in place): refused, not followed
        (work / "traj.h5.p1").write_bytes((d / "traj.h5").read_bytes())
    expect(tampered(nested), "not a valid multi-process trajectory index", "part file traj.h5.p1 is itself an index")

    def link(doc, work):
        (work / "traj.h5.p1").unlink()
        (work / "traj.h5.p1").symlink_to(d / "traj.h5.p1")
    expect(tampered(link), "symbolic link")

    def overlap(doc, work):
        doc["records"]["x"][1]["index"] = [[8, 24]]
    expect(tampered(overlap), "record 'x'")

    def gap(doc, work):
        del doc["records"]["x"][3]
    expect(tampered(gap), "do not add up")

    def absent(doc, work):
        doc["records"]["x"][0]["leaf"] = "x@9"
    expect(tampered(absent), "record 'x'", "has no record 'x@9'")

    def wrong_shape(doc, work):
        doc["records"]["x"][0]["leaf"] = "energy"
    expect(tampered(wrong_shape), "record 'x'", "float32[]")
    ok = tampered(lambda doc, w: None)  # the untouched copy still reads
    np.testing.assert_array_equal(jl.load(ok)["x"], jl.load(d / "traj.h5")["x"])


def _datasets(f):
    out = []
    f.visititems(lambda n, obj: out.append(obj) if hasattr(obj, "external") else None)
    return out
