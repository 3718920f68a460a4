"""``jl.cost`` / ``run.cost``: XLA's cost and memory analysis of the compiled step, the same every
time, and moving exactly with the work the kernel does (the LJ forces computed twice double the
flops); cost goldens' comparison on given figures."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest

import pytest_jaxlog as jl
from examples.kernels.lj import LJState, _pair_terms, box_length, make_lj
from pytest_jaxlog.compare import cost as costfile
from pytest_jaxlog.profiling.cost import METRICS, count_kernels

N_SIDE, DT = 4, 0.005


def _twice_forces_step():
    """The LJ step computing the forces a second time, at positions shifted by a constant (the
    same forces, which XLA cannot tell: both are computed), and using the mean of both."""
    box = box_length(N_SIDE**3)
    rc = min(2.5, box / 2)

    def step(s):
        v_half = s.velocities + 0.5 * DT * s.forces
        x = s.positions + DT * v_half
        x = x - box * jnp.floor(x / box)
        _, f1 = _pair_terms(x, box, rc)
        _, f2 = _pair_terms(x + 1e-3, box, rc)
        f = 0.5 * (f1 + f2)
        return LJState(x, v_half + 0.5 * DT * f, f)

    forces = lambda x: _pair_terms(x, box, rc)[1]  # noqa: E731
    return step, forces


def test_cost_reports_every_metric_and_the_platform():
    step, state, _ = make_lj(N_SIDE, dt=DT)
    c = jl.cost(step, state)
    assert all(isinstance(getattr(c, m), (int, float)) for m in METRICS), c
    assert c.flops > 0 and c.bytes_accessed > 0 and c.kernels >= 1
    state_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(state))
    assert c.argument_bytes == state_bytes and c.output_bytes >= state_bytes
    assert c.backend == jax.default_backend() and c.jax_version == jax.__version__
    assert c.device_kind == jax.devices()[0].device_kind and c.x64 is bool(jax.config.jax_enable_x64)
    assert c.platform_key() == f"{c.backend}/{c.device_kind}/jax-{jax.__version__}" + ("/x64" if c.x64 else "")


def test_cost_is_deterministic_and_the_same_jitted_or_not():
    step, state, _ = make_lj(N_SIDE, dt=DT)
    first = jl.cost(step, state)
    again = [jl.cost(make_lj(N_SIDE, dt=DT)[0], state) for _ in range(2)]  # new closures: compiled anew
    assert all(c == first for c in again)
    assert jl.cost(jax.jit(step), state) == first
    assert len({first, *again}) == 1  # hashable: a set of costs, a dict key
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    assert jl.cost(step, abstract) == first


def test_forces_computed_twice_double_the_flops():
    step, state, _ = make_lj(N_SIDE, dt=DT)
    twice, forces = _twice_forces_step()
    one, two = jl.cost(step, state), jl.cost(twice, state)
    force_flops = jl.cost(forces, state.positions).flops
    assert 1.98 < two.flops / one.flops < 2.02, (one.flops, two.flops)
    # the extra work is one more force evaluation, and a few elementwise operations on (N, 3)
    assert 0 <= two.flops - one.flops - force_flops <= 8 * 3 * N_SIDE**3
    assert two.kernels > one.kernels and two.bytes_accessed > one.bytes_accessed


def test_run_cost_is_the_step_alone_and_each_view_apart():
    step, state, energies = make_lj(N_SIDE, dt=DT)
    total = lambda s: energies(s)["total"]  # noqa: E731
    positions = lambda s: s.positions  # noqa: E731
    run = jl.run(step, state, 20, record={"energy": total, "x": jl.Record(positions, every=10)},
                 invariants=[jl.finite("energy")])
    assert "cost" not in vars(run)  # lazily: jl.run compiled nothing for it
    c = run.cost
    plain = jl.cost(step, state)
    assert {m: getattr(c, m) for m in METRICS} == {m: getattr(plain, m) for m in METRICS}
    assert set(c.views) == {"energy", "x"}
    assert c.views["energy"].flops == jl.cost(lambda s: {"energy": total(s)}, state).flops > 0
    assert c.views["x"].flops == 0 and c.views["x"].output_bytes == state.positions.nbytes
    assert run.cost is c  # computed once
    assert c.metrics()["views/energy/flops"] == c.views["energy"].flops


def test_run_cost_of_a_keyed_step_with_aux_and_logs():
    def step(key, x):
        jl.log("noise", jax.random.normal(key, x.shape))
        return x * 0.5 + 1.0, {"mean": jnp.mean(x)}

    x = jnp.ones(16)
    run = jl.run(step, x, 4, key=jax.random.key(0), has_aux=True)
    assert "log/noise" in run.trajectory.records
    plain = jl.cost(lambda k, x: step(jax.random.fold_in(k, 3), x), jax.random.key(0), x)
    assert run.cost.flops == plain.flops and run.cost.transcendentals == plain.transcendentals
    assert run.cost.views == {}  # aux and logs come from the step: their cost is the step's


def test_cost_of_a_function_that_does_not_compile_names_it():
    def broken(x):
        return x @ jnp.ones((5, 5))

    with pytest.raises(jl.JaxlogError, match=r"jl.cost: .*broken could not be compiled"):
        jl.cost(broken, jnp.ones(3))


HLO = """HloModule jit_f, is_scheduled=true

%region_0.1 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.5 = f32[] add(%a, %b)
}

%fused_computation (param_0.2: f32[8]) -> f32[8] {
  %param_0.2 = f32[8]{0} parameter(0)
  ROOT %sin.0 = f32[8]{0} sine(%param_0.2)
}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8]{0} get-tuple-element(%p), index=1
  %f = f32[8]{0} fusion(%x), kind=kLoop, calls=%fused_computation
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[8]{0}) tuple(%j, %f)
}

%cond (p.1: (s32[], f32[8])) -> pred[] {
  %p.1 = (s32[], f32[8]{0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%p.1), index=0
  %n = s32[] constant(10)
  ROOT %lt = pred[] compare(%i.1, %n), direction=LT
}

ENTRY %main.2 (x.1: f32[8]) -> f32[] {
  %x.1 = f32[8]{0} parameter(0)
  %zero = s32[] constant(0)
  %t0 = (s32[], f32[8]{0}) tuple(%zero, %x.1)
  %w = (s32[], f32[8]{0}) while(%t0), condition=%cond, body=%body
  %y = f32[8]{0} get-tuple-element(%w), index=1
  %c = f32[] constant(0)
  ROOT %r = f32[] reduce(%y, %c), dimensions={0}, to_apply=%region_0.1
}
"""


def test_kernels_are_the_working_instructions_outside_fusions_and_regions():
    # body: fusion + add; cond: compare; entry: reduce. The fused sine and the reduction's add are inside.
    assert count_kernels(HLO) == 4
    with pytest.raises(jl.JaxlogError, match="no HLO computation"):
        count_kernels("not HLO")


STORED = {"flops": 1000.0, "transcendentals": 0.0, "bytes_accessed": 4096.0, "temp_bytes": 64,
          "argument_bytes": 256, "output_bytes": 256, "kernels": 3, "views/e/flops": 10.0, "views/e/kernels": 1}


def test_compare_names_what_moved_either_way_with_its_ratio():
    now = {**STORED, "flops": 2000.0, "temp_bytes": 32}
    moved = costfile.compare(STORED, now, rtol=0.0)
    assert [(m.metric, m.stored, m.obtained, m.ratio) for m in moved] == \
        [("flops", 1000.0, 2000.0, 2.0), ("temp_bytes", 64, 32, 0.5)]
    assert moved[0].describe() == "flops: stored 1,000, obtained 2,000 (x2, more)"
    assert moved[1].describe() == "temp_bytes: stored 64, obtained 32 (x0.5, less)" and moved[1].improved
    assert costfile.compare(STORED, now, rtol=1.0) == []  # within 100%
    assert [m.metric for m in costfile.compare(STORED, now, rtol=0.0, metrics=["temp_bytes"])] == ["temp_bytes"]


def test_compare_selects_metrics_for_the_step_and_views_and_counts_added_views():
    now = {**STORED, "flops": 1001.0, "views/e/flops": 11.0, "views/k/flops": 5.0}
    assert [m.metric for m in costfile.compare(STORED, now, 0.0, metrics="flops")] == \
        ["flops", "views/e/flops", "views/k/flops"]
    assert [m.metric for m in costfile.compare(STORED, now, 0.0, metrics=["views/e/flops"])] == ["views/e/flops"]
    assert costfile.compare(STORED, now, 0.0, metrics="views/k/flops")[0].stored is None
    assert math.isinf(costfile.compare({"flops": 0.0}, {"flops": 1.0}, 0.0)[0].ratio)
    with pytest.raises(jl.JaxlogError, match=r"unknown metric\(s\) \['flop'\]"):
        costfile.compare(STORED, now, 0.0, metrics=["flop"])
    with pytest.raises(jl.JaxlogError, match="rtol must be"):
        costfile.compare(STORED, now, -1.0)


def test_cost_regression_is_an_assertion_and_a_jaxlog_error():
    e = jl.CostRegression("moved", moved=(1,))
    assert isinstance(e, AssertionError) and isinstance(e, jl.JaxlogError) and e.moved == (1,)
    assert str(e) == "[jaxlog] moved"


def test_check_cost_takes_a_run_or_a_cost_and_names_anything_else():
    from pytest_jaxlog.harness.goldens import _cost_of

    x = jnp.ones(4)
    c = jl.cost(lambda x: x * 2, x)
    assert _cost_of(c) is c
    run = jl.run(lambda x: x * 2, x, 2)
    assert _cost_of(run) is run.cost
    with pytest.raises(jl.JaxlogError, match="expected a jl.run result or a jl.Cost, got dict"):
        _cost_of({"flops": 1})
