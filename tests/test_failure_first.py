"""Failures that say the real thing first: a golden check of a run that stopped at another step leads
with the frame counts and how each run ended, then the first divergence; a usage error found before
a run's first step is pytest's error outcome with its message, never a run "stopped by interrupted"."""

from __future__ import annotations

import json

import numpy as np
from plugin_helpers import no_jaxlog_env  # noqa: F401  (an autouse fixture)

import pytest_jaxlog as jl
from pytest_jaxlog.compare.golden import diff_trajectories

for _name in jl.__all__:  # every jaxlog module loaded now, so classes stay the same objects across inline runs
    getattr(jl, _name)

import h5py  # noqa: E402,F401  (imported before pytester's inline runs snapshot sys.modules)
import jax.numpy  # noqa: E402,F401

pytest_plugins = ["pytester"]

UNTIL = """
import jax.numpy as jnp

def step(x):
    return x * {factor}

def test_until(jaxlog):
    run = jaxlog.run(step, jnp.ones(3, jnp.float32), 50, record={{"x": lambda s: s}},
                     until=lambda s: s[0] > {stop})
    jaxlog.check_golden(run)
"""


def _stop_step(factor: float, stop: float) -> int:
    """The first step whose state passes ``stop``: the same float32 product, as a plain loop."""
    x, k = np.float32(1.0), 0
    while not x > np.float32(stop):
        x, k = np.float32(x * np.float32(factor)), k + 1
    return k


def _message(result) -> list[str]:
    """The mismatch's lines as the failure shows them (after pytest's ``E`` prefix)."""
    lines = result.stdout.lines
    i = next(i for i, ln in enumerate(lines) if "[jaxlog] trajectories differ" in ln)
    head = lines[i][lines[i].index("[jaxlog]"):]
    return [head] + [ln[1:].strip() for ln in lines[i + 1:i + 5]]


def test_a_golden_of_a_run_that_stopped_elsewhere_leads_with_the_frame_counts(pytester):
    pytester.makepyfile(test_u=UNTIL.format(factor=1.1, stop=4.0))
    _run = ("-p", "no:cacheprovider")
    pytester.runpytest(*_run, "--jaxlog-regen").assert_outcomes(passed=1)
    s_gold, s_now = _stop_step(1.1, 4.0), _stop_step(1.1, 3.0)
    assert s_now < s_gold

    # stopped sooner, same values where both have them: the frame counts and the ends are the whole story
    pytester.makepyfile(test_u=UNTIL.format(factor=1.1, stop=3.0))
    result = pytester.runpytest(*_run)
    result.assert_outcomes(failed=1)
    lines = _message(result)
    assert lines[0] == (f"[jaxlog] trajectories differ: record 'x': steps differ: obtained {s_now + 1} frames, steps "
                        f"0..{s_now}, expected {s_gold + 1} frames, steps 0..{s_gold}; {s_gold - s_now} expected "
                        f"steps missing (first {s_now + 1})")
    assert lines[1] == (f"obtained {s_now + 1} frames to step {s_now}, golden {s_gold + 1} frames to step {s_gold}; "
                        f"obtained stopped by until at step {s_now}; golden stopped by until at step {s_gold}")
    assert lines[2] == "the values agree at the steps both have (rtol=1e-07, atol=0)"

    # and a kernel that changed too: the first divergence comes right after, not among "other differences"
    pytester.makepyfile(test_u=UNTIL.format(factor=1.1000001, stop=3.0))
    lines = _message(pytester.runpytest(*_run))
    assert lines[1].startswith(f"obtained {s_now + 1} frames to step {s_now}, golden {s_gold + 1} frames")
    assert lines[2].startswith("first divergence: record 'x' first differs at step 1, index (0,): obtained 1.1")
    assert "elements differ (rtol=1e-07, atol=0)" in lines[2] and not lines[3].endswith("other difference:")


def test_the_frame_counts_lead_outside_the_plugin_too():
    step = lambda x: x * 1.5  # noqa: E731
    long = jl.run(step, np.float32(1.0), 10, record={"x": lambda s: s})
    short = jl.run(step, np.float32(1.0), 10, record={"x": lambda s: s}, until=lambda s: s > 7.0)
    assert short.steps_done == 5  # 1.5**5 = 7.59 is the first past 7
    diff = diff_trajectories(short, long)
    lines = diff.report().splitlines()
    assert lines[1] == "  obtained 6 frames to step 5, expected 11 frames to step 10; obtained stopped by until at " \
                       "step 5; expected ran to step 10"
    assert diff.lead() is diff.differences[0] and diff.differences[0].frames == (6, 11)


ERRORS = """
import jax.numpy as jnp
import pytest_jaxlog as jl

def step(x):
    return x * 1.1

def test_bad_when(jaxlog):
    jaxlog.run(step, jnp.ones(3), 5, record={"x": jl.Record(lambda s: s, when=lambda s: s)})

def test_invariant_not_recorded(jaxlog):
    jaxlog.run(step, jnp.ones(3), 5, record={"x": lambda s: s}, invariants=[jl.finite("energy")])

def test_bad_argument(jaxlog):
    jaxlog.run(step, jnp.ones(3), 5, record={"x": lambda s: s}, chunk=-3)

def test_fails_after_the_run(jaxlog):
    run = jaxlog.run(step, jnp.ones(3), 5, record={"x": lambda s: s})
    assert run.steps_done == 4
"""

MESSAGES = {
    "test_bad_when": "when= must return one bool",
    "test_invariant_not_recorded": "record 'energy' is not recorded",
    "test_bad_argument": "chunk",
}


def _check_errors(result, base) -> None:
    result.assert_outcomes(failed=1, errors=3)
    out = result.stdout.str()
    assert "stopped by interrupted" not in out
    for name in MESSAGES:
        result.stdout.fnmatch_lines([f"ERROR test_e.py::{name} - pytest_jaxlog.errors.Jaxlog*"])
    result.stdout.fnmatch_lines(["FAILED test_e.py::test_fails_after_the_run - *assert 5 == 4"])
    doc = json.loads((base / "manifest.json").read_text())
    tests = {t["nodeid"].split("::")[1]: t for t in doc["tests"]}
    for name, text in MESSAGES.items():
        assert tests[name]["outcome"] == "error" and text in tests[name]["error"], tests[name]
        assert all(r["stop_reason"] != "interrupted" for r in tests[name]["runs"])
    assert tests["test_fails_after_the_run"]["outcome"] == "failed" and "error" not in tests["test_fails_after_the_run"]


def test_usage_errors_before_the_first_step_are_errors_not_interrupted_runs(pytester):
    pytester.makepyfile(test_e=ERRORS)
    result = pytester.runpytest("-p", "no:cacheprovider")
    _check_errors(result, pytester.path / ".jaxlog")
    assert result.ret == 1
    section = result.stdout.str().split("ERROR at call of test_bad_when")[1].split("- jaxlog -")[1]
    assert "(failed, stopped by error)" in section.split("___")[0]


def test_usage_errors_are_errors_under_xdist(pytester):
    pytester.makepyfile(test_e=ERRORS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    _check_errors(result, pytester.path / ".jaxlog")
