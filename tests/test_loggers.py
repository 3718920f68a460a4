"""Loggers: the protocol, CompositeLogger exception safety, ProgressLogger, RingBuffer."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl


class Tracking:
    def __init__(self, name, events, fail_enter=False, fail_exit=None):
        self.name, self.events, self.fail_enter, self.fail_exit = name, events, fail_enter, fail_exit

    def __enter__(self):
        if self.fail_enter:
            self.events.append(("enter-failed", self.name))
            raise RuntimeError(f"enter {self.name}")
        self.events.append(("enter", self.name))
        return self

    def __exit__(self, exc_type, exc, tb):
        self.events.append(("exit", self.name, exc_type))
        if self.fail_exit is not None:
            raise self.fail_exit
        return False

    def log(self, state, step):
        self.events.append(("log", self.name, step))


def test_protocol():
    for lg in (jl.NullLogger(), jl.RingBuffer(2), jl.ProgressLogger(3, enabled=False), jl.Recorder(),
               jl.CompositeLogger()):
        assert isinstance(lg, jl.Logger)
    assert not isinstance(object(), jl.Logger)
    with pytest.raises(jl.JaxlogError, match="Logger protocol"):
        jl.CompositeLogger(object())


def test_composite_orders():
    ev = []
    with jl.CompositeLogger(Tracking("a", ev), Tracking("b", ev)) as c:
        c.log(None, 5)
    assert ev == [("enter", "a"), ("enter", "b"), ("log", "a", 5), ("log", "b", 5),
                  ("exit", "b", None), ("exit", "a", None)]


def test_composite_enter_failure_exits_the_entered_ones():
    ev = []
    c = jl.CompositeLogger(Tracking("a", ev), Tracking("b", ev), Tracking("c", ev, fail_enter=True), Tracking("d", ev))
    with pytest.raises(RuntimeError, match="enter c"):
        with c:
            pass
    assert ev == [("enter", "a"), ("enter", "b"), ("enter-failed", "c"), ("exit", "b", RuntimeError),
                  ("exit", "a", RuntimeError)]


def test_composite_exit_failure_still_exits_the_rest_and_raises_the_first():
    ev = []
    c = jl.CompositeLogger(Tracking("a", ev, fail_exit=ValueError("a")), Tracking("b", ev, fail_exit=OSError("b")),
                           Tracking("c", ev))
    with pytest.raises(OSError, match="b"):
        with c:
            pass
    assert [e[:2] for e in ev if e[0] == "exit"] == [("exit", "c"), ("exit", "b"), ("exit", "a")]


def test_composite_body_exception_passes_through():
    ev = []
    with pytest.raises(KeyError):
        with jl.CompositeLogger(Tracking("a", ev), Tracking("b", ev)):
            raise KeyError("body")
    assert ev[-2:] == [("exit", "b", KeyError), ("exit", "a", KeyError)]


def test_progress_advances_to_the_step_number():
    out = io.StringIO()
    state = {"e": jnp.asarray(1.5)}
    with jl.ProgressLogger(100, postfix=lambda s: {"energy": s["e"]}, enabled=True, file=out, mininterval=0) as p:
        p.log(state, 10)
        assert p.bar.n == 10
        p.log(state, 10)
        p.log(state, 60)  # a sparse label jumps, it does not count calls
        assert p.bar.n == 60
    text = out.getvalue()
    assert "60/100" in text and "energy=1.5" in text


def test_progress_quiet_without_a_tty():
    p = jl.ProgressLogger(10)  # pytest captures stderr: not a terminal
    with p:
        p.log(None, 5)
    assert p.bar is None and not p.enabled


def test_ring_buffer_keeps_last_k_host_copies():
    ring = jl.RingBuffer(3)
    with ring:
        for k in range(5):
            ring.log({"x": jnp.full(2, float(k)), "key": jax.random.key(k)}, k * 10)
    assert ring.steps == [20, 30, 40]
    assert [step for step, _ in ring.items()] == [20, 30, 40]
    last = ring.states[-1]
    assert isinstance(last["x"], np.ndarray) and last["x"].tolist() == [4.0, 4.0]
    np.testing.assert_array_equal(last["key"], np.asarray(jax.random.key_data(jax.random.key(4))))
    with pytest.raises(jl.JaxlogError):
        jl.RingBuffer(0)


def test_ring_buffer_survives_donation():
    f = jax.jit(lambda x: x + 1, donate_argnums=0)
    ring = jl.RingBuffer(2)
    x = jnp.zeros(3)
    for k in range(3):
        ring.log(x, k)
        x = f(x)
    assert [s.tolist() for s in ring.states] == [[1.0] * 3, [2.0] * 3]


@pytest.mark.parametrize("labels", [range(10), range(11), range(0, 10, 3)])
def test_a_loop_that_ends_shows_n_of_n_whatever_its_labels(labels):
    out = io.StringIO()
    with jl.ProgressLogger(10, enabled=True, file=out, mininterval=0) as p:
        for k in labels:
            p.log(None, k)
    assert "10/10" in out.getvalue()
    out = io.StringIO()
    with pytest.raises(RuntimeError):
        with jl.ProgressLogger(10, enabled=True, file=out, mininterval=0) as p:
            p.log(None, 4)
            raise RuntimeError("broke")
    assert "10/10" not in out.getvalue() and "4/10" in out.getvalue()


def test_run_progress_shows_the_latest_recorded_scalars_and_ends_at_n_of_n():
    out = io.StringIO()
    bar = jl.ProgressLogger(40, enabled=True, file=out, mininterval=0)
    jl.run(lambda s: s + 1.0, jnp.zeros(()), 40, record={"s": lambda s: s, "v": lambda s: jnp.zeros(3)}, chunk=7,
           progress=bar)
    text = out.getvalue()
    assert "40/40" in text and "s=40" in text and "v=" not in text  # v is not a scalar
    out = io.StringIO()
    bar = jl.ProgressLogger(40, postfix=["s"], enabled=True, file=out, mininterval=0)
    run = jl.run(lambda s: s + 1.0, jnp.zeros(()), 40, record={"s": lambda s: s}, chunk=7, progress=bar,
                 until=lambda s: s >= 12)
    assert run.steps_done == 12 and "12/12" in out.getvalue() and "s=12" in out.getvalue()
