"""The chunk program steps in blocks: loops of a trip count XLA knows (a GPU runs them without a
host round trip per step), with the slots past a dispatch's end or a stop masked.

What these tests hold, on the CPU and on any card: the compiled program of a GPU's block (32)
runs the kernel's step only inside loops with XLA's ``known_trip_count`` (and the plain loop
does not, so the check can fail); states equal a Python loop of the jitted step bit for bit,
and records are bit-identical for every chunk size and run length at one block (the Python
loop's to rounding: a reduction fused into the program), ``until=`` stops included; the masked
slots ``run.timings.masked_steps`` reports equal a count made from the dispatches; a profile
window changes no bit of the run."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.drive.device import program

GPU_BLOCK = program.BLOCK["gpu"]


def step(s):
    return {"x": jnp.cos(s["x"]) * 0.9 + 0.01 * s["v"], "v": s["v"] * 0.99 - 0.1 * s["x"]}


def step_aux(s):
    new = step(s)
    return new, {"p": new["x"].max()}


STATE = {"x": jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32), "v": jnp.zeros(6, jnp.float32)}


def energy(s):
    return (s["x"] ** 2).sum() + (s["v"] ** 2).sum()


def plain(n, state=STATE):
    """The states 0..n of a Python loop of the jitted step."""
    f = jax.jit(step)
    out = [state]
    for _ in range(n):
        out.append(f(out[-1]))
    return out


PLANS = {  # record= of each body the program has: every-step rows, nested segments, the step's own values
    "rows": {"e": energy},
    "nested": {"e": energy, "x": jl.Record(lambda s: s["x"], every=10)},
    "sparse views": {"x": jl.Record(lambda s: s["x"], every=7), "m": jl.Record(lambda s: s["v"].sum(), every=5)},
    "aux": {"e": energy},  # and the aux leaf p every 3 steps (see _run)
}


def _run(name, steps, **kw):
    rec = dict(PLANS[name])
    if name == "aux":
        return jl.run(step_aux, STATE, steps, record=rec, has_aux=True, aux={"p": jl.every(3)}, progress=False, **kw)
    return jl.run(step, STATE, steps, record=rec, progress=False, **kw)


# -- the compiled program ----------------------------------------------------------------------------
def computations(hlo: str) -> dict[str, list[str]]:
    """``{computation name: its instruction lines}`` of XLA's HLO text."""
    out: dict[str, list[str]] = {}
    name = None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%([\w.\-]+) .*\{$", line)
        if head:
            name = head.group(1)
            out[name] = []
        elif line.startswith("}"):
            name = None
        elif name is not None:
            out[name].append(line)
    return out


def loops_running(hlo: str, marker: str) -> list[tuple[str, bool]]:
    """Each while loop whose body runs ``marker`` itself (through fusions, calls and conds, not
    through an inner loop), with whether XLA knows its trip count."""
    comps = computations(hlo)

    def runs(name, seen):
        if name in seen or name not in comps:
            return False
        seen.add(name)
        for line in comps[name]:
            if marker in line:
                return True
            if " while(" in line:  # an inner loop: it answers for itself
                continue
            if any(runs(c, seen) for c in re.findall(r"%([\w.\-]+)", line.split("=", 1)[-1]) if c in comps):
                return True
        return False

    found = []
    for lines in comps.values():
        for line in lines:
            m = re.search(r" while\(.*body=%([\w.\-]+)", line)
            if m and runs(m.group(1), set()):
                found.append((line.split("=", 1)[0].strip(), "known_trip_count" in line))
    return found


@pytest.mark.parametrize("name", sorted(PLANS))
def test_every_loop_that_runs_the_step_has_a_trip_count_xla_knows(name, monkeypatch):
    monkeypatch.setenv("JAXLOG_BLOCK", str(GPU_BLOCK))
    run = _run(name, 50)
    loops = loops_running(run.compiled.as_text(), "cosine(")
    assert loops, "the step's cosine is in no loop"
    assert all(known for _, known in loops), loops


def test_the_plain_loop_fails_that_check(monkeypatch):
    """One step an iteration (``JAXLOG_BLOCK=1``): the loop that runs the step has a runtime trip
    count, which the check above names."""
    monkeypatch.setenv("JAXLOG_BLOCK", "1")
    loops = loops_running(_run("rows", 50).compiled.as_text(), "cosine(")
    assert loops and not all(known for _, known in loops)


def test_until_and_batched_runs_step_in_known_loops_too(monkeypatch):
    monkeypatch.setenv("JAXLOG_BLOCK", str(GPU_BLOCK))
    run = jl.run(step, STATE, 50, record={"e": energy}, until=lambda s: s["v"][0] > 10.0, progress=False)
    assert all(k for _, k in loops_running(run.compiled.as_text(), "cosine("))
    batched = {"x": jnp.stack([STATE["x"], STATE["x"] * 0.5]), "v": jnp.stack([STATE["v"], STATE["v"]])}
    run = jl.run(jax.vmap(step), batched, 50, record={"e": jax.vmap(energy)}, batched=True,
                 until=lambda s: s["v"][:, 0] > 10.0, progress=False)
    loops = loops_running(run.compiled.as_text(), "cosine(")
    assert loops and all(k for _, k in loops)


# -- the same numbers ----------------------------------------------------------------------------------
@pytest.mark.parametrize("block", [1, 8, GPU_BLOCK])
def test_records_and_states_are_the_same_bits_for_any_chunk_and_length(block, monkeypatch):
    """At one block, records and states are the same bit for bit for every chunk size and run
    length, and equal a Python loop of the jitted step: bit for bit with the plain loop (one step
    an iteration, the CPU's), to rounding with blocks (XLA compiles the step inside a loop of a
    known trip count apart from the step jitted alone: a multiply-add may be contracted)."""
    monkeypatch.setenv("JAXLOG_BLOCK", str(block))
    n = 103
    ref = plain(n)
    same = np.testing.assert_array_equal if block == 1 else \
        (lambda a, b, err_msg="": np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=err_msg))
    first = {name: _run(name, n) for name in ("nested", "sparse views", "aux")}
    for chunk, steps in ((1, n), (7, n), (20, n), (None, 61), (None, n)):
        for name in ("nested", "sparse views", "aux"):
            run, base = _run(name, steps, chunk=chunk), first[name]
            traj, base_traj = run.trajectory, base.trajectory
            if steps == n:
                np.testing.assert_array_equal(np.asarray(run.state["x"]), np.asarray(base.state["x"]), err_msg=name)
            same(np.asarray(run.state["x"]), np.asarray(ref[steps]["x"]), err_msg=name)
            for rec in traj.records:
                kept = base_traj.steps(rec) <= steps
                assert traj.steps(rec).tolist() == base_traj.steps(rec)[kept].tolist()
                np.testing.assert_array_equal(traj[rec], base_traj[rec][kept], err_msg=f"{name} {rec} {chunk}")
            if "e" in traj.records:
                assert traj.steps("e").tolist() == list(range(steps + 1))
                np.testing.assert_allclose(traj["e"], np.array([energy(s) for s in ref[:steps + 1]]), rtol=1e-6)
            if name == "nested":
                assert traj.steps("x").tolist() == list(range(0, steps + 1, 10))
                same(traj["x"], np.stack([np.asarray(ref[k]["x"]) for k in range(0, steps + 1, 10)]))
            if name == "sparse views":
                assert traj.steps("m").tolist() == list(range(0, steps + 1, 5))
                np.testing.assert_allclose(traj["m"], np.array([ref[k]["v"].sum() for k in range(0, steps + 1, 5)]),
                                           rtol=1e-6, atol=1e-7)
            if name == "aux":
                assert traj.steps("aux/p").tolist() == list(range(3, steps + 1, 3))
                same(traj["aux/p"], np.array([ref[k]["x"].max() for k in range(3, steps + 1, 3)]))


@pytest.mark.parametrize("block", [1, GPU_BLOCK])
@pytest.mark.parametrize("chunk", [None, 1, 20])
def test_only_sparse_values_of_the_step_are_its_own_at_their_steps(block, chunk, monkeypatch):
    """Only aux leaves every 3 steps (the plain loop's sparse body; a block's every slot)."""
    monkeypatch.setenv("JAXLOG_BLOCK", str(block))
    ref = plain(100)
    run = jl.run(step_aux, STATE, 100, has_aux=True, aux={"p": jl.every(3)}, chunk=chunk, progress=False)
    traj = run.trajectory
    assert traj.steps("aux/p").tolist() == list(range(3, 101, 3))
    np.testing.assert_allclose(traj["aux/p"], np.array([ref[k]["x"].max() for k in range(3, 101, 3)]),
                               rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("block", [1, 8, GPU_BLOCK])
@pytest.mark.parametrize("chunk", [None, 1, 20])
def test_until_stops_at_the_exact_step_for_any_block(block, chunk, monkeypatch):
    monkeypatch.setenv("JAXLOG_BLOCK", str(block))
    ref = plain(200)
    first = next(k for k, s in enumerate(ref) if float(s["v"][0]) > 0.05)
    run = jl.run(step, STATE, 200, record={"e": energy}, until=lambda s: s["v"][0] > 0.05, chunk=chunk,
                 progress=False)
    assert run.stop_reason == "until" and run.steps_done == first
    assert run.trajectory.steps("e").tolist() == list(range(first + 1))
    np.testing.assert_allclose(np.asarray(run.state["v"]), np.asarray(ref[first]["v"]), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("block", [1, GPU_BLOCK])
def test_batched_until_freezes_each_system_at_its_step_for_any_block(block, monkeypatch):
    monkeypatch.setenv("JAXLOG_BLOCK", str(block))
    scales = [1.0, 0.5, 0.25]
    batched = {"x": jnp.stack([STATE["x"] * a for a in scales]), "v": jnp.stack([STATE["v"]] * 3)}
    run = jl.run(jax.vmap(step), batched, 300, record={"e": jax.vmap(energy)}, batched=True,
                 until=lambda s: s["v"][:, 0] > 0.02, chunk=50, progress=False)
    for i, a in enumerate(scales):
        ref = plain(300, {"x": STATE["x"] * a, "v": STATE["v"]})
        stop = next(k for k, s in enumerate(ref) if float(s["v"][0]) > 0.02)
        assert run.systems_done[i] == stop
        np.testing.assert_allclose(np.asarray(run.state["x"][i]), np.asarray(ref[stop]["x"]), rtol=1e-6, atol=1e-7)


# -- what is masked, counted -----------------------------------------------------------------------------
@pytest.mark.parametrize("steps,chunk", [(103, 20), (64, None), (5, None), (1000, 24), (33, 1)])
def test_masked_steps_are_the_slots_past_each_dispatch(steps, chunk, monkeypatch):
    """Counted on the device; here from the dispatches: each dispatch of ``n`` steps rounded up
    to whole blocks of 32."""
    monkeypatch.setenv("JAXLOG_BLOCK", str(GPU_BLOCK))
    run = _run("rows", steps, chunk=chunk)
    per = steps if chunk is None else chunk
    lengths = [min(per, steps - k) for k in range(0, steps, per)]
    assert run.timings.masked_steps == sum(-n % GPU_BLOCK for n in lengths)
    assert run.timings.masked_steps <= (GPU_BLOCK - 1) * len(lengths)


def test_a_nested_plan_masks_less_than_a_block_and_its_period_per_dispatch(monkeypatch):
    """A view every 10 steps: segments of 10, 3 a block; the slots past each dispatch's end and
    before its first scheduled state are masked, fewer than 32 + 10 per dispatch."""
    monkeypatch.setenv("JAXLOG_BLOCK", str(GPU_BLOCK))
    for steps, chunk in ((103, 20), (1000, 64), (7, None)):
        run = _run("nested", steps, chunk=chunk)
        per = steps if chunk is None else chunk
        dispatches = len(range(0, steps, per))
        assert 0 < run.timings.masked_steps < dispatches * (GPU_BLOCK + 10)


@pytest.mark.parametrize("block", [1, GPU_BLOCK])
@pytest.mark.parametrize("name", ["rows", "nested", "sparse views", "aux"])
def test_a_one_step_dispatch_computes_the_slots_the_timings_name(name, block, monkeypatch):
    """``timings.window_slots`` (what a profile window's step computes) against the device's own
    count of a one-step run's masked slots."""
    monkeypatch.setenv("JAXLOG_BLOCK", str(block))
    run = _run(name, 1)
    assert run.timings.window_slots == run.timings.masked_steps + 1
    assert run.timings.window_slots == (1 if block == 1 else {"nested": 30, "sparse views": 30}.get(name, GPU_BLOCK))


def test_the_plain_loop_masks_nothing(monkeypatch):
    monkeypatch.setenv("JAXLOG_BLOCK", "1")
    assert _run("nested", 103, chunk=20).timings.masked_steps == 0


def test_a_stop_masks_the_rest_of_its_block_only(monkeypatch):
    monkeypatch.setenv("JAXLOG_BLOCK", str(GPU_BLOCK))
    ref = plain(200)
    first = next(k for k, s in enumerate(ref) if float(s["v"][0]) > 0.05)
    run = jl.run(step, STATE, 200, record={"e": energy}, until=lambda s: s["v"][0] > 0.05, chunk=64,
                 progress=False)
    assert run.timings.masked_steps == -first % GPU_BLOCK  # the chunks dispatched after the stop run no slot


def test_bad_block_setting_is_one_error(monkeypatch):
    monkeypatch.setenv("JAXLOG_BLOCK", "zero")
    with pytest.raises(jl.JaxlogError, match="JAXLOG_BLOCK='zero'"):
        _run("rows", 10)


# -- profile windows ------------------------------------------------------------------------------------
def test_a_profile_window_changes_no_bit_and_its_masked_slots_are_counted(tmp_path, monkeypatch):
    """A window step is a one-step dispatch of the run's own program: one block, its other slots
    masked (counted), and the run's records and state are those of the run without the window."""
    monkeypatch.setenv("JAXLOG_BLOCK", str(GPU_BLOCK))
    bare = _run("rows", 120)
    run = _run("rows", 120, profile=jl.ProfileWindow(40, 49, tmp_path / "w"))
    np.testing.assert_array_equal(run.trajectory["e"], bare.trajectory["e"])
    np.testing.assert_array_equal(np.asarray(run.state["x"]), np.asarray(bare.state["x"]))
    assert run.timings.window is not None and len(run.timings.window) == 10
    assert run.timings.window_slots == GPU_BLOCK  # each window step's seconds are a block's
    assert run.timings.programs == 1 and run.timings.compiles == 0  # the program of the run without the window
    lengths = [40] + [1] * 10 + [70]  # the dispatches: up to the window, its steps, the rest
    assert run.timings.masked_steps == sum(-n % GPU_BLOCK for n in lengths)
