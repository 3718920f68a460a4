"""The golden workflow through pytester: missing golden -> hint; --jaxlog-regen -> writes (every golden,
unconditionally); a changed kernel -> fails naming the divergent step; jaxlog_golden_dir."""

from __future__ import annotations

import pytest_jaxlog as jl

pytest_plugins = ["pytester"]

# Import what the inline pytester runs use before they start: pytester drops modules first imported
# during a run, and jaxlib/h5py cannot be imported a second time in one process.
import h5py  # noqa: E402,F401
import jax.numpy  # noqa: E402,F401
from pytest_jaxlog import _hdf5, _perfetto, _run, _trajectory  # noqa: E402,F401

KERNEL = """
import jax.numpy as jnp

KICK = {kick}  # the work of step KICK perturbs the state: step KICK+1 onwards differs

def step(s):
    k, x = s
    return k + 1, x * 0.9 + jnp.where(k == KICK, 1e-3, 0.0) + 0.01

def test_decay(jaxlog):
    run = jaxlog.run(step, (jnp.int32(0), jnp.linspace(0.0, 1.0, 4)), 50,
                     record={{"x": lambda s: s[1], "mean": lambda s: s[1].mean()}})
    assert jaxlog.check_golden(run, rtol=1e-6) in ("ok", "regenerated")

def test_other(jaxlog):
    run = jaxlog.run(step, (jnp.int32(100), jnp.ones(2)), 10, record={{"x": lambda s: s[1]}})
    jaxlog.check_golden(run, name="ones")
"""


def test_golden_workflow(pytester):
    pytester.makepyfile(test_k=KERNEL.format(kick=-1))
    golden_dir = pytester.path / "fixtures" / "golden"

    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    result.stdout.re_match_lines([r".*\[jaxlog\] golden trajectory fixtures/golden/\S+\.h5 does not exist; "
                                  r"run pytest with --jaxlog-regen to create fixtures/golden/\S+\.h5"])
    assert not golden_dir.exists()

    result = pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-regen")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*JaxlogRuntimeWarning: [[]jaxlog] regenerated golden fixtures/golden/test_k.test_decay.h5*",
                                 "*regenerated 2 golden trajectories (--jaxlog-regen)*",
                                 "*fixtures/golden/test_k.test_decay.h5",
                                 "*fixtures/golden/test_k.test_other-ones.h5"])
    goldens = sorted(golden_dir.glob("*.h5"))
    assert len(goldens) == 2 and any(p.stem.endswith("-ones") for p in goldens)
    (decay,) = [p for p in goldens if "decay" in p.name]
    golden = jl.load(decay)
    assert golden.status == "complete" and set(golden.records) == {"mean", "x"} and golden.steps("x")[-1] == 50
    assert golden.provenance["backend"] == "cpu"

    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)

    # a changed kernel: the divergent step is named, with the command that regenerates the golden
    pytester.makepyfile(test_k=KERNEL.format(kick=30))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "[jaxlog] trajectories differ: record 'x' first differs at step 31, index (0,): obtained" in out
    assert "record 'mean' first differs at step 31: obtained" in out
    rel = decay.relative_to(pytester.path)
    assert f"run pytest with --jaxlog-regen to regenerate {rel}" in out

    # regeneration rewrites every golden the session touches, failing or not
    before = {p: p.stat().st_mtime_ns for p in goldens}
    result = pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-regen")
    result.assert_outcomes(passed=2)
    assert all(p.stat().st_mtime_ns != before[p] for p in goldens)


def test_golden_dir_ini(pytester):
    pytester.makeini("[pytest]\njaxlog_golden_dir = data/goldens\n")
    pytester.makepyfile(test_k=KERNEL.format(kick=-1), test_twice=KERNEL.format(kick=-1) + """
import pytest_jaxlog as jl

def test_violated_golden(jaxlog):
    run = jaxlog.run(step, (jnp.int32(0), jnp.ones(2)), 5, record={"x": lambda s: s[1]}, on_violation="record",
                     invariants=[jl.bounded("x", hi=0.95)])
    jaxlog.check_golden(run)  # regenerated from a run that broke an invariant: the warning says so

def test_two_runs_one_golden(jaxlog):
    a = jaxlog.run(step, (jnp.int32(0), jnp.ones(2)), 5, record={"x": lambda s: s[1]})
    b = jaxlog.run(step, (jnp.int32(0), jnp.zeros(2)), 5, record={"x": lambda s: s[1]})
    jaxlog.check_golden(a)
    jaxlog.check_golden(b)  # the same file: an error, not a golden that the first check then fails against
""")
    result = pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-regen", "-k", "test_k and other or two_runs or violated")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*regenerated golden data/goldens/test_twice.test_violated_golden.h5 (--jaxlog-regen); "
                                 "note: the run's status is 'violated' (bounded(x*) violated at step 0)*"])
    assert len(list((pytester.path / "data" / "goldens").glob("*-ones.h5"))) == 1
    # the summary lists the files sorted (run order differs, e.g. under xdist): the file defines 'violated' first
    result.stdout.fnmatch_lines(["regenerated 3 golden trajectories (--jaxlog-regen):", "  data/goldens/test_k.test_other-ones.h5",
                                 "  data/goldens/test_twice.test_two_runs_one_golden.h5",
                                 "  data/goldens/test_twice.test_violated_golden.h5"])
    result.stdout.fnmatch_lines(["*JaxlogError: *check_golden(name=None): this test already checked golden "
                                 "data/goldens/test_twice.test_two_runs_one_golden.h5; give each checked run its own name=*"])
