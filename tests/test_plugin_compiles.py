"""``assert_compiles`` means what a test author thinks: with a kernel built once at module level,
every test's ``assert_compiles(1)`` passes whichever test ran first, alone, in any order and
under xdist, because it judges the programs the run needed (compiled now, reused from this
process or loaded from the persistent cache), while ``compiles`` stays the honest count of what
this run compiled."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

import pytest_jaxlog as jl

pytest_plugins = ["pytester"]

SUITE = """
import jax.numpy as jnp
import pytest
import pytest_jaxlog as jl

def step(x):  # built once, at module level: the first test compiles it, the others reuse it
    return 0.5 * x + 1.0

REC = {"x": lambda x: x}

@pytest.mark.parametrize("n", [10, 11, 12])
def test_kernel(jaxlog, n):
    run = jaxlog.run(step, jnp.ones(4), n, record=REC)
    run.timings.assert_compiles(1)
    run.timings.assert_compiles(1, at_most=True)
    again = jaxlog.run(step, run.state, n, record=REC, name="again")
    again.timings.assert_compiles(0)  # the second run of a test reuses the first one's program
"""


def _runs(pytester) -> dict[str, list[dict]]:
    doc = json.loads((pytester.path / ".jaxlog" / "manifest.json").read_text())
    return {t["nodeid"]: t["runs"] for t in doc["tests"]}


@pytest.mark.parametrize("args", [(), ("test_k.py::test_kernel[12]", "test_k.py::test_kernel[10]",
                                         "test_k.py::test_kernel[11]"), ("-n", "2")],
                         ids=["in-order", "reversed", "xdist"])
def test_assert_compiles_passes_whichever_test_ran_first(pytester, args):
    if "-n" in args:
        pytest.importorskip("xdist")
    pytester.makepyfile(test_k=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--jaxlog-keep=all", *args)
    result.assert_outcomes(passed=3)
    runs = _runs(pytester)
    # the honest count: the kernel compiled once per process, by whichever test came first there
    workers = 2 if "-n" in args else 1
    assert 1 <= sum(r[0]["compiles"] for r in runs.values()) <= workers
    assert all(r[1]["compiles"] == 0 for r in runs.values())
    if not args:
        assert [r[0]["compiles"] for _, r in sorted(runs.items())] == [1, 0, 0]


def _step(x):
    return x * 0.5 + 1.0


def test_a_reused_program_counts_as_needed_and_a_recompiling_kernel_still_fails():
    def fresh(s):  # nothing compiled for it yet in this process
        return _step(s)

    x = jnp.ones(5, jnp.float32)
    rec = {"x": lambda s: s}
    cold = jl.run(fresh, x, 6, record=rec, progress=False)
    warm = jl.run(fresh, x, 6, record=rec, progress=False)
    assert (cold.timings.compiles, cold.timings.programs, cold.timings.reused) == (1, 1, 0)
    assert (warm.timings.compiles, warm.timings.programs, warm.timings.reused) == (0, 1, 1)
    for t in (cold.timings, warm.timings):
        t.assert_compiles(1)
        t.assert_compiles(1, at_most=True)
        t.assert_compiles(3, at_most=True)
    warm.timings.assert_compiles(0)
    with pytest.raises(jl.TimingAssertionError) as info:
        cold.timings.assert_compiles(0)
    assert str(info.value).startswith(
        "[jaxlog] expected 0 compilations, saw 1 (the run needed 1 program: 1 compiled fresh, 0 loaded from the "
        "persistent compilation cache, 0 reused from this process): chunk_impl(")
    with pytest.raises(jl.TimingAssertionError) as info:
        warm.timings.assert_compiles(2)
    assert str(info.value) == ("[jaxlog] expected 2 programs, saw 1 (the run needed 1 program: 0 compiled fresh, "
                               "0 loaded from the persistent compilation cache, 1 reused from this process)")
    # a kernel that needed two programs fails assert_compiles(1) whether they were compiled or reused
    two = jl.Timings(wall_s=1.0, steps=10, compiles=0, programs=2)
    with pytest.raises(jl.TimingAssertionError, match=r"expected 1 program, saw 2 .*2 reused from this process"):
        two.assert_compiles(1)
    with pytest.raises(jl.TimingAssertionError, match=r"expected at most 1 program, saw 2"):
        two.assert_compiles(1, at_most=True)
    assert jl.Timings.from_json(two.to_json()).programs == 2
    assert jl.Timings.from_json({"wall_s": 1.0, "steps": 1}).programs is None


def test_a_run_that_fails_after_compiling_still_counts_its_program():
    bad = {"x": jnp.ones(3), "n": jnp.int32(0)}

    def fresh(s):
        return {"x": s["x"] * 2.0, "n": s["n"] + 1}

    with pytest.raises(jl.InvariantViolation) as info:
        jl.run(fresh, bad, 8, record={"x": lambda s: s["x"]}, invariants=[jl.bounded("x", hi=10.0)], chunk=2,
               progress=False)
    t = info.value.jaxlog_run.timings
    assert (t.compiles, t.programs) == (1, 1)
    t.assert_compiles(1)
    assert jax.numpy.all(info.value.jaxlog_run.state["x"] <= 16.0)
