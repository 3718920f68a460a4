"""jl.run's options are declared once, by ``RunConfig`` (``drive.prepare.config``); ``jl.run``'s
signature repeats them for the reader's IDE. These tests hold the two equal, and hold the entries
that take the options as keywords (``run_outcome``: the fixture's, ``jl.resume``'s) to refusing
what ``jl.run`` itself refuses."""

from __future__ import annotations

import dataclasses
import inspect

import jax.numpy as jnp
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.drive.prepare.config import OPTIONS, RunConfig
from pytest_jaxlog.drive.run import run_outcome


def _options_declared() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(RunConfig) if f.name in OPTIONS]


def test_the_signature_of_run_shows_the_options_run_config_declares_in_its_order_with_its_defaults():
    shown = [p for p in inspect.signature(jl.run).parameters.values() if p.kind is p.KEYWORD_ONLY]
    declared = _options_declared()
    assert [p.name for p in shown] == [f.name for f in declared]
    assert [p.default for p in shown] == [f.default for f in declared]
    assert [p.name for p in inspect.signature(jl.run).parameters.values()][:3] == ["step", "state", "steps"]


@pytest.mark.parametrize("name", ["recrd", "lanes", "resume", "until_values", "budget"])
def test_a_keyword_run_does_not_take_is_refused_as_run_refuses_it(name):
    with pytest.raises(TypeError) as direct:
        jl.run(lambda s: s + 1, jnp.zeros(2), 3, progress=False, **{name: None})
    outcome = run_outcome(lambda s: s + 1, jnp.zeros(2), 3, progress=False, **{name: None})
    assert outcome.run is None
    assert isinstance(outcome.error, TypeError)
    assert str(outcome.error).startswith(f"run() got an unexpected keyword argument {name!r}")  # 3.13: a suggestion
    assert str(direct.value) == str(outcome.error)


def test_the_options_given_as_keywords_run_as_the_same_options_given_to_run():
    state = jnp.arange(3.0)
    kwargs = {"record": {"x": lambda s: s}, "chunk": 2, "progress": False, "meta": {"a": 1}}
    direct = jl.run(lambda s: s * 2, state, 5, **kwargs)
    outcome = run_outcome(lambda s: s * 2, state, 5, **kwargs)
    assert outcome.error is None
    assert outcome.run.steps_done == direct.steps_done == 5
    assert outcome.run.meta == direct.meta == {"a": 1}
    assert outcome.run.chunk == direct.chunk == 2
    assert (outcome.run.trajectory["x"] == direct.trajectory["x"]).all()
