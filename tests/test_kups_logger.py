"""A logger written for a hand-written loop (kUPS's shape: ``__enter__``, ``__exit__``,
``log(state, step)``) given to ``jl.run`` in ``sinks=``: entered, fed each recorded step's values in
step order, exited with how the run ended; one with only ``log`` is refused with the adapter, which
works as written."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import pytest_jaxlog as jl


from pendulums import BATCHED, STATE, energy, step  # the kernel the sink tests share



class ListLogger:
    """A logger as kUPS writes them: what it is given, in the order it is given."""

    def __init__(self):
        self.calls: list = []

    def __enter__(self):
        self.calls.append(("enter",))
        return self

    def __exit__(self, exc_type, exc, tb):
        self.calls.append(("exit", exc_type, exc))
        return False

    def log(self, state, step):
        self.calls.append(("log", step, state))


def _logged(logger: ListLogger) -> list:
    return [c for c in logger.calls if c[0] == "log"]


def _check_views(logged: list, traj, names: tuple[str, ...]) -> None:
    """Each logged step holds exactly the records recorded at it, with the trajectory's values."""
    steps = sorted({int(k) for name in names for k in traj.steps(name)})
    assert [c[1] for c in logged] == steps
    for _, k, views in logged:
        at = {name for name in names if k in traj.steps(name)}
        assert set(views) == at
        for name in at:
            want = traj[name][list(traj.steps(name)).index(k)]
            assert views[name].dtype == want.dtype and np.array_equal(views[name], want), (name, k)


def test_a_logger_gets_each_recorded_step_between_enter_and_exit():
    logger = ListLogger()
    run = jl.run(step, STATE, 12, record={"energy": jl.Record(energy, every=2),
                                          "x": jl.Record(lambda s: s["x"], every=3)},
                 sinks=[jl.MemorySink(), logger], chunk=5, progress=False)
    assert logger.calls[0] == ("enter",) and logger.calls[-1] == ("exit", None, None)
    logged = _logged(logger)
    assert len(logged) == len(logger.calls) - 2
    _check_views(logged, run.trajectory, ("energy", "x"))
    assert [c[1] for c in logged] == [0, 2, 3, 4, 6, 8, 9, 10, 12]


def test_a_batched_run_hands_each_record_with_its_system_axis():
    logger = ListLogger()
    run = jl.run(step, BATCHED, 7, record={"energy": energy, "x": jl.Record(lambda s: s["x"], every=3)},
                 batched=True, sinks=[jl.MemorySink(), logger], chunk=4, progress=False)
    logged = _logged(logger)
    _check_views(logged, run.trajectory, ("energy", "x"))
    assert logged[0][2]["energy"].shape == (3,) and logged[0][2]["x"].shape == (3, 4)


def test_a_run_that_stops_exits_the_logger_with_why():
    logger = ListLogger()

    def interrupt(k, rows):
        if k >= 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        jl.run(step, STATE, 20, record={"energy": energy}, chunk=4, progress=False,
               sinks=[logger, jl.CallbackSink(interrupt, rows=True)])
    kind, exc_type, exc = logger.calls[-1]
    assert kind == "exit" and exc_type is jl.JaxlogError and "the run ended stopped" in str(exc)
    assert [c[1] for c in _logged(logger)][:6] == [0, 1, 2, 3, 4, 5]


class LogOnly:
    def __init__(self):
        self.seen: list = []

    def log(self, state, step):
        self.seen.append((step, state))


def test_a_logger_without_enter_and_exit_is_refused_with_an_adapter_that_works():
    logger = LogOnly()
    with pytest.raises(jl.JaxlogError, match=r"not __enter__\(\), __exit__\(\)") as refused:
        jl.run(step, STATE, 3, record={"energy": energy}, sinks=[logger], progress=False)
    adapter = str(refused.value).split("\n", 1)[1]
    assert len(adapter.splitlines()) == 3
    adapter = textwrap.dedent(adapter).replace(
        "jl.run(..., sinks=[", "run = jl.run(step, STATE, 6, record={'energy': energy}, progress=False, "
                               "sinks=[jl.MemorySink(), ")
    space = {"jl": jl, "logger": logger, "step": step, "STATE": STATE, "energy": energy}
    exec(adapter, space)
    energies = space["run"].trajectory["energy"]
    assert [k for k, _ in logger.seen] == list(range(7))
    assert [rows for _, rows in logger.seen] == [[{"step": k, "energy": float(energies[k])}] for k in range(7)]


def test_a_recorder_is_refused_in_sinks():
    with pytest.raises(jl.JaxlogError, match=r"sinks=: a jl.Recorder records the states of a loop"):
        jl.run(step, STATE, 3, record={"energy": energy}, sinks=[jl.Recorder({"energy": energy})], progress=False)
