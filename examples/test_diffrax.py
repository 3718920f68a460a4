"""An ODE solved with diffrax, checked two ways: the values a solve saved at ``SaveAt(ts=...)``
stored and checked with ``jaxlog.from_arrays``, and an adaptive solver's steps driven by
``jaxlog.run`` (each step one attempt of the solver; rejected attempts left out with ``when=``),
both against the oscillator's exact solution and its conserved energy; and each fixed-step solver's
order of convergence (``jl.convergence_order``) against the order diffrax declares for it."""

from typing import ClassVar

import numpy as np
import pytest

import pytest_jaxlog as jl

diffrax = pytest.importorskip("diffrax")  # in the test extra; the suite runs without it
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

T = 10.0
Y0 = jnp.array([1.0, 0.0])  # x, v of a unit harmonic oscillator: x = cos t, energy 1/2
TERM = diffrax.ODETerm(lambda t, y, args: jnp.stack([y[1], -y[0]]))


def energy(y):
    return 0.5 * jnp.sum(y * y, axis=-1)


def test_saved_solution_checked_and_stored(jaxlog):
    ts = jnp.linspace(0.0, T, 101)
    sol = diffrax.diffeqsolve(TERM, diffrax.Tsit5(), 0.0, T, 0.05, Y0, saveat=diffrax.SaveAt(ts=ts),
                              stepsize_controller=diffrax.PIDController(rtol=1e-7, atol=1e-7))
    run = jaxlog.from_arrays({"y": sol.ys, "energy": energy(sol.ys)}, time=sol.ts,
                             invariants=[jl.finite("y"), jl.conserved("energy", rtol=1e-4)])
    traj = jaxlog.load()
    assert run.status == "complete" and traj.steps_done == 100
    np.testing.assert_allclose(traj.time("y"), np.asarray(ts), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(traj["y"][:, 0], np.cos(np.asarray(ts)), atol=1e-4)


def adaptive(rtol=1e-6):
    """One attempt of an adaptive Tsit5 per ``jl.run`` step: the state carries the time, the next
    step size and the controller's and solver's states; an attempt the controller rejects leaves
    the solution where it was (``accepted`` says which)."""
    solver, ctrl = diffrax.Tsit5(), diffrax.PIDController(rtol=rtol, atol=rtol)
    order = solver.order(TERM)
    dt0, cstate = ctrl.init(TERM, 0.0, T, Y0, 3.0, None, TERM.vf, order)  # too large: rejected at first
    state = {"t": jnp.float32(0.0), "dt": jnp.float32(dt0), "y": Y0, "ctrl": cstate,
             "solver": solver.init(TERM, 0.0, dt0, Y0, None), "accepted": jnp.bool_(True)}

    def step(s):
        t1 = jnp.minimum(s["t"] + s["dt"], T)
        y1, err, _, sstate, _ = solver.step(TERM, s["t"], t1, s["y"], None, s["solver"], made_jump=False)
        keep, t0n, t1n, _, cstate, _ = ctrl.adapt_step_size(s["t"], t1, s["y"], y1, None, err, order, s["ctrl"])
        pick = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(keep, a, b), new, old)  # noqa: E731
        return {"t": jnp.asarray(t0n, jnp.float32), "dt": jnp.asarray(t1n - t0n, jnp.float32),
                "y": pick(y1, s["y"]), "ctrl": cstate, "solver": pick(sstate, s["solver"]),
                "accepted": jnp.asarray(keep)}
    return step, state


def test_adaptive_solver_steps_as_a_run(jaxlog):
    step, state = adaptive()
    run = jaxlog.run(step, state, 5000, until=lambda s: s["t"] >= T,
                     record={"t": jl.Record(lambda s: s["t"], when=lambda s: s["accepted"]),
                             "y": jl.Record(lambda s: s["y"], when=lambda s: s["accepted"]),
                             "energy": jl.Record(lambda s: energy(s["y"]), when=lambda s: s["accepted"])},
                     invariants=[jl.finite("y"), jl.conserved("energy", rtol=1e-4), jl.monotonic("t", strict=True)])
    assert run.stop_reason == "until" and run.steps_done < 5000
    t, y = run.trajectory["t"], run.trajectory["y"]
    assert t[-1] == pytest.approx(T) and len(t) > 20
    assert len(t) < run.steps_done + 1  # the first, too large, attempts were rejected and left out
    np.testing.assert_allclose(y[:, 0], np.cos(t), atol=1e-4)


def final_errors(solver, step_sizes):
    """The error at ``T`` of fixed-step solves, against the exact solution (cos t, -sin t); one
    compiled solve for every step size (the step size is an argument)."""
    solve = jax.jit(lambda dt: diffrax.diffeqsolve(TERM, solver, 0.0, T, dt, Y0, max_steps=4096,
                                                   stepsize_controller=diffrax.ConstantStepSize()).ys[-1])
    exact = np.array([np.cos(T), -np.sin(T)])
    return [float(np.max(np.abs(np.asarray(solve(h)) - exact))) for h in step_sizes]


@pytest.mark.parametrize("solver, step_sizes", [(diffrax.Euler(), (0.04, 0.02, 0.01, 0.005)),
                                                (diffrax.Heun(), (0.2, 0.1, 0.05, 0.025)),
                                                (diffrax.Bosh3(), (0.4, 0.2, 0.1, 0.05))],
                         ids=["euler", "heun", "bosh3"])
def test_each_solver_converges_at_its_declared_order(solver, step_sizes):
    """Step sizes where the error is the method's, far above float32 round-off (errors 1e-1 to 1e-5)."""
    errors = final_errors(solver, step_sizes)
    found = jl.convergence_order(step_sizes, errors)
    found.assert_order(solver.order(TERM), within=0.25)  # the whole 95% interval within 1/4 of the order
    # the same read plainly: each halving of the step divides the error by about 2**order
    np.testing.assert_allclose(np.log2(np.array(errors[:-1]) / np.array(errors[1:])), solver.order(TERM), atol=0.25)


class Lopsided(diffrax.AbstractERK):
    """Heun's method with its weights 0.6/0.4 instead of 1/2 each: still consistent, so it still
    converges and looks right at any one step size, but only to first order."""

    tableau: ClassVar[diffrax.ButcherTableau] = diffrax.ButcherTableau(
        c=np.array([1.0]), b_sol=np.array([0.6, 0.4]), b_error=np.array([0.1, -0.1]), a_lower=(np.array([1.0]),))
    interpolation_cls: ClassVar = diffrax.ThirdOrderHermitePolynomialInterpolation.from_k

    def order(self, terms):
        return 2


def test_a_wrong_weight_is_caught_as_a_lower_order():
    step_sizes = (0.2, 0.1, 0.05, 0.025)
    found = jl.convergence_order(step_sizes, final_errors(Lopsided(), step_sizes))
    assert found.hi < 1.25  # first order, the interval says so
    with pytest.raises(jl.JaxlogError, match=r"order of convergence 1\.0\d+, 95% interval .* lower than 2 ± 0\.25"):
        found.assert_order(2)
