"""The golden-mismatch figure of a field record: the obtained and golden profile (or image) at the
first differing step, their difference there against the tolerance, and the worst error over the
field at every step; each drawn series checked against the same numbers computed plainly."""

import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.compare.golden import draw_golden_diff, field_rank
from pytest_jaxlog.compare.golden import diff_trajectories

pytest.importorskip("matplotlib")


def _lines(ax):
    return {ln.get_label(): (np.asarray(ln.get_xdata(), float), np.asarray(ln.get_ydata(), float))
            for ln in ax.get_lines()}


def heat(bump_at=None, n=64, steps=30, systems=None):
    """Explicit heat equation on a ring; ``bump_at``: a step from which a source adds heat at
    point 40 (the fault the picture should place)."""
    x = jnp.linspace(0, 1, n, endpoint=False)
    u0 = jnp.exp(-((x - 0.3) ** 2) / 0.01)
    if systems:
        u0 = jnp.stack([u0 * (1 + 0.1 * i) for i in range(systems)])

    def step(s):
        u, k = s["u"], s["k"]
        lap = jnp.roll(u, 1, axis=-1) - 2 * u + jnp.roll(u, -1, axis=-1)
        src = 0.0 if bump_at is None else jnp.where(k + 1 >= bump_at, 0.01, 0.0) * (jnp.arange(n) == 40)
        return {"u": u + 0.2 * lap + src, "k": k + 1}

    k0 = jnp.zeros(systems, jnp.int32) if systems else jnp.int32(0)
    return jl.run(step, {"u": u0, "k": k0}, steps, record={"u": lambda s: s["u"]}, batched=bool(systems),
                  progress=False)


def _worst_ratio(a, e, rtol, atol):
    err, tol = np.abs(a - e), atol + rtol * np.abs(e)
    return np.where(err == 0, 0.0, err / tol).reshape(len(a), -1).max(axis=1)


def test_a_profile_is_drawn_at_the_first_differing_step():
    golden, obtained = heat(), heat(bump_at=12)
    diff = diff_trajectories(obtained, golden, rtol=1e-5, atol=1e-7)
    d = diff.first
    assert d.step == 12 and field_rank(golden.trajectory["u"], False) == 1
    fig = draw_golden_diff(obtained.trajectory, golden.trajectory, diff)
    profile, difference, over = [ax for ax in fig.axes if ax.get_visible()]
    a = np.asarray(obtained.trajectory["u"], np.float64)
    e = np.asarray(golden.trajectory["u"], np.float64)
    lines = _lines(profile)
    np.testing.assert_array_equal(lines["obtained"][1], a[12])
    np.testing.assert_array_equal(lines["golden"][1], e[12])
    delta = _lines(difference)["obtained - golden"][1]
    np.testing.assert_array_equal(delta, a[12] - e[12])
    assert int(np.argmax(np.abs(delta))) == 40  # the picture places the fault where it was planted
    worst = _lines(over)["worst |error| / tolerance over the field"]
    np.testing.assert_array_equal(worst[0], np.arange(31))
    np.testing.assert_allclose(worst[1], _worst_ratio(a, e, 1e-5, 1e-7))
    assert np.all(worst[1][:12] == 0) and worst[1][12] > 1
    assert "u at step 12" in profile.get_title()


def test_a_batched_profile_draws_the_system_that_differs_first():
    golden = heat(systems=3)
    obtained = heat(systems=3)
    bent = np.array(obtained.trajectory["u"])
    bent[20:, 2, 10] += 1.0  # system 2 differs from step 20
    fake = jl.from_arrays({"u": bent}, steps=obtained.trajectory.steps("u"), batched=True)
    diff = diff_trajectories(fake, golden, rtol=1e-6)
    assert diff.first.step == 20 and diff.first.index[0] == 2
    fig = draw_golden_diff(fake.trajectory, golden.trajectory, diff,
                           batched=True)
    profile, difference, over = [ax for ax in fig.axes if ax.get_visible()]
    np.testing.assert_array_equal(_lines(profile)["obtained"][1], bent[20, 2].astype(np.float64))
    np.testing.assert_array_equal(_lines(profile)["golden"][1],
                                  np.asarray(golden.trajectory["u"])[20, 2].astype(np.float64))
    assert profile.get_ylabel() == "u (system 2)"


def test_an_image_is_drawn_as_images_and_their_difference():
    n = 16
    yy, xx = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")

    def step(s):
        return {"f": s["f"] * 0.9 + 0.01 * jnp.asarray(np.sin(xx + yy), jnp.float32)}

    f0 = {"f": jnp.ones((n, n), jnp.float32)}
    golden = jl.run(step, f0, 10, record={"f": lambda s: s["f"]}, progress=False)
    bent = np.array(golden.trajectory["f"])
    bent[6:, 3, 5] += 0.5
    fake = jl.from_arrays({"f": bent}, steps=golden.trajectory.steps("f"))
    diff = diff_trajectories(fake, golden, rtol=1e-6)
    assert diff.first.step == 6 and field_rank(bent, False) == 2
    fig = draw_golden_diff(fake.trajectory, golden.trajectory, diff)
    g_ax, o_ax, d_ax, over = [ax for ax in fig.axes if ax.get_visible()]
    np.testing.assert_array_equal(np.asarray(g_ax.images[0].get_array()), np.asarray(golden.trajectory["f"])[6])
    np.testing.assert_array_equal(np.asarray(o_ax.images[0].get_array()), bent[6])
    delta = np.asarray(d_ax.images[0].get_array())
    assert np.unravel_index(np.argmax(np.abs(delta)), delta.shape) == (3, 5)
    assert _lines(over)["worst |error| / tolerance over the field"][1][6] > 1


def test_positions_of_atoms_are_not_a_field():
    assert field_rank(np.zeros((5, 64, 3)), False) == 0  # (frames, atoms, xyz)
    assert field_rank(np.zeros((5, 3, 2)), True) == 0  # (frames, systems, 2)
    assert field_rank(np.zeros((5, 3, 64)), True) == 1  # (frames, systems, profile)
