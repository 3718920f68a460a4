"""One check of numeric arguments (record.values) serves every entry point: the same value is
accepted or refused alike everywhere, and the message names the argument and what it got."""

from __future__ import annotations

import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.record.values import check_count, check_step, is_integer, positive


@pytest.mark.parametrize("value, ok", [(0, True), (3, True), (np.int32(4), True), (np.uint8(2), True), (True, False),
                                       (np.bool_(True), False), (2.0, False), ("2", False), (None, False)])
def test_integers_are_ints_of_python_or_numpy_and_never_bools(value, ok):
    assert is_integer(value) is ok


@pytest.mark.parametrize("make, match", [
    (lambda v: jl.every(v), r"every\(n\) needs an integer n >= 1, got {}"),
    (lambda v: jl.RingBuffer(v), r"RingBuffer\(k\) needs an integer k >= 1, got {}"),
    (lambda v: jl.HDF5Writer("x.h5", queue_bytes=v), r"HDF5Writer\(queue_bytes={}\): needs an integer number of bytes >= 1"),
    (lambda v: check_count(v, "flush_every", minimum=1), r"flush_every must be an int >= 1, got {}"),
])
@pytest.mark.parametrize("bad", [0, -3, True, 2.0, "4"])
def test_every_integer_argument_refuses_the_same_values_with_its_own_words(make, match, bad):
    with pytest.raises(jl.JaxlogError, match=match.format(repr(bad).replace("(", r"\(").replace(")", r"\)"))):
        make(bad)


def test_accepted_integers_come_back_as_python_ints():
    assert jl.every(np.int64(5)).n == 5 and type(jl.every(np.int64(5)).n) is int
    assert jl.RingBuffer(np.int16(2)).k == 2
    assert check_count(np.int64(7), "x") == 7 and type(check_count(np.int64(7), "x")) is int


def test_steps_and_positive_numbers():
    assert check_step(np.int64(3), "s") == 3
    with pytest.raises(jl.JaxlogError, match=r"s must be an integer step, got 1.0"):
        check_step(1.0, "s")
    with pytest.raises(jl.JaxlogError, match=r"s must be >= 0, got -1$"):
        check_step(np.int64(-1), "s")  # the number, not numpy's repr of it
    assert positive(np.float32(0.5), "r") == 0.5
    for bad in (0, -1.0, float("inf"), float("nan"), True, "2"):
        with pytest.raises(jl.JaxlogError, match=r"r must be a finite number > 0"):
            positive(bad, "r")


def test_a_time_that_overflows_is_one_error_naming_the_record_and_step_and_keeps_the_frames_before(tmp_path):
    """A finite but huge ``dt`` times a step is inf: refused before any sink gets that frame,
    every frame before it written (the run's file, a Recorder's), an earlier violation first."""
    import warnings

    import jax.numpy as jnp

    def step(s):
        return s + 1.0

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning: the check does not compute the inf
        with pytest.raises(jl.JaxlogError, match=r"record 'x', step 2: its time, step × dt = 2 × 1e\+308, overflows a "
                                                 r"float64, which a trajectory file cannot hold \(give a smaller dt\)"):
            jl.run(step, jnp.zeros(2), 6, record={"x": lambda s: s}, dt=1e308, sinks=[jl.HDF5Writer(tmp_path / "t.h5")],
                   progress=False)
    traj = jl.load(tmp_path / "t.h5")
    assert traj.status == "failed" and traj.steps("x").tolist() == [0, 1] and traj["x"][:, 0].tolist() == [0.0, 1.0]
    assert traj.time("x").tolist() == [0.0, 1e308]
    # an invariant broken before that step stops the run there, as it would without the overflow
    with pytest.raises(jl.InvariantViolation) as e:
        jl.run(step, jnp.zeros(2), 6, record={"x": lambda s: s}, dt=1e308, invariants=[jl.bounded("x", hi=0.5)],
               progress=False)
    assert e.value.step == 1
    # a Recorder: the same error from its flush, the frames before kept
    with pytest.raises(jl.JaxlogError, match=r"record 'x', step 3: its time"):
        with jl.Recorder({"x": lambda s: s}, sinks=[jl.HDF5Writer(tmp_path / "r.h5")], dt=0.6e308, flush_every=2) as rec:
            s = jnp.zeros(2)
            for k in range(6):
                rec.log(s, k)
                s = step(s)
    assert jl.load(tmp_path / "r.h5").steps("x").tolist() == [0, 1, 2]
