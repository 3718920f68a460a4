"""The golden workflow through pytester: missing golden -> hint; --jaxlog-regen -> writes (every golden,
unconditionally); a changed kernel -> fails naming the divergent step; jaxlog_golden_dir."""

from __future__ import annotations

import pytest_jaxlog as jl
from plugin_helpers import no_jaxlog_env  # noqa: F401  (no_jaxlog_env: an autouse fixture)

pytest_plugins = ["pytester"]

# Import what the inline pytester runs use before they start: pytester drops modules first imported
# during a run, and jaxlib/h5py cannot be imported a second time in one process.
import h5py  # noqa: E402,F401
import jax.numpy  # noqa: E402,F401
import pytest_jaxlog.drive.run, pytest_jaxlog.profiling.timeline, pytest_jaxlog.store.hdf5.writer  # noqa: E401,E402,F401

KERNEL = """
import jax.numpy as jnp

KICK = {kick}  # the work of step KICK perturbs the state: step KICK+1 onwards differs

def step(s):
    k, x = s
    return k + 1, x * 0.9 + jnp.where(k == KICK, 1e-3, 0.0) + 0.01

def test_decay(jaxlog):
    run = jaxlog.run(step, (jnp.int32(0), jnp.linspace(0.0, 1.0, 4)), 50,
                     record={{"x": lambda s: s[1], "mean": lambda s: s[1].mean()}})
    assert jaxlog.check_golden(run, rtol=1e-6) in ("ok", "regenerated", "created")

def test_other(jaxlog):
    run = jaxlog.run(step, (jnp.int32(100), jnp.ones(2)), 10, record={{"x": lambda s: s[1]}})
    jaxlog.check_golden(run, name="ones")
"""

def test_golden_workflow(pytester):
    pytester.makepyfile(test_k=KERNEL.format(kick=-1))
    golden_dir = pytester.path / "fixtures" / "golden"

    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*[[]jaxlog] golden trajectory fixtures/golden/test_k.test_decay.h5 does not exist",
                                 "*to create it, run pytest with --jaxlog-create-goldens (missing goldens only) or --jaxlog-regen"])
    assert not golden_dir.exists()

    result = pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-regen")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*JaxlogRuntimeWarning: [[]jaxlog] regenerated golden fixtures/golden/test_k.test_decay.h5*",
                                 "*regenerated 2 golden trajectories (--jaxlog-regen)*",
                                 "*fixtures/golden/test_k.test_decay.h5",
                                 "*fixtures/golden/test_k.test_other--ones.h5"])
    goldens = sorted(golden_dir.glob("*.h5"))
    assert len(goldens) == 2 and any(p.stem.endswith("--ones") for p in goldens)
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
    assert len(list((pytester.path / "data" / "goldens").glob("*--ones.h5"))) == 1
    # the summary lists the files sorted (run order differs, e.g. under xdist): the file defines 'violated' first
    result.stdout.fnmatch_lines(["regenerated 3 golden trajectories (--jaxlog-regen):", "  data/goldens/test_k.test_other--ones.h5",
                                 "  data/goldens/test_twice.test_two_runs_one_golden.h5",
                                 "  data/goldens/test_twice.test_violated_golden.h5"])
    result.stdout.fnmatch_lines(["*JaxlogError: *check_golden(name=None): this test already checked golden "
                                 "data/goldens/test_twice.test_two_runs_one_golden.h5; give each checked run its own name=*"])

def test_create_missing_goldens(pytester):
    """Opt-in: a missing golden is written and the test passes with a warning naming the file; an existing
    golden is still compared (a changed kernel fails); on from the option or the ini key."""
    pytester.makepyfile(test_k=KERNEL.format(kick=-1))
    golden_dir = pytester.path / "fixtures" / "golden"
    result = pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-create-goldens")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*JaxlogRuntimeWarning: [[]jaxlog] created missing golden "
                                 "fixtures/golden/test_k.test_decay.h5 (--jaxlog-create-goldens)*"])
    result.stdout.fnmatch_lines(["created 2 golden trajectories (--jaxlog-create-goldens):",
                                 "  fixtures/golden/test_k.test_decay.h5", "  fixtures/golden/test_k.test_other--ones.h5"])
    assert sorted(p.name for p in golden_dir.iterdir()) == ["test_k.test_decay.h5", "test_k.test_other--ones.h5"]
    assert jl.load(golden_dir / "test_k.test_decay.h5").steps("x")[-1] == 50

    # the ini key turns it on too; existing goldens are compared, not overwritten
    pytester.makeini("[pytest]\njaxlog_create_goldens = true\n")
    pytester.makepyfile(test_k=KERNEL.format(kick=30))
    before = (golden_dir / "test_k.test_decay.h5").stat().st_mtime_ns
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*trajectories differ: record * first differs at step 31*"])
    assert "created" not in result.stdout.str().split("short test summary")[0].split("- jaxlog -")[-1]
    assert (golden_dir / "test_k.test_decay.h5").stat().st_mtime_ns == before

def test_missing_golden_names_the_file_found_under_another_rootdir(pytester, monkeypatch):
    """Goldens made with rootdir = the project, checked with rootdir = tests/ (no ini file, pytest started in
    tests/): the test ids, so the golden names, differ; the message names the file it found and why."""
    tests = pytester.mkpydir("tests")
    (tests / "test_k.py").write_text(KERNEL.format(kick=-1))
    pytester.runpytest("-p", "no:cacheprovider", "tests/test_k.py", "-k", "decay", "--jaxlog-regen").assert_outcomes(passed=1)
    made = pytester.path / "fixtures/golden/tests.test_k.test_decay.h5"
    assert made.exists()

    with monkeypatch.context() as mp:
        mp.chdir(tests)
        result = pytester.runpytest("-p", "no:cacheprovider", "test_k.py", "-k", "decay")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*[[]jaxlog] golden trajectory fixtures/golden/test_k.test_decay.h5 does not exist",
        f"*  found {made} for the same test under another name: its test id starts with 'tests/', this session's "
        f"(test_k.py::test_decay) does not: pytest's rootdir is {tests} here, it was made with rootdir {pytester.path}",
        "*pytest names goldens after test ids relative to its rootdir: *",
        "*to create it, run pytest with --jaxlog-create-goldens (missing goldens only) or --jaxlog-regen",
    ])

    # the other way round: goldens made with rootdir = tests/, checked with rootdir = the project
    (pytester.path / "fixtures").rename(pytester.path / "old-fixtures")
    with monkeypatch.context() as mp:
        mp.chdir(tests)
        pytester.runpytest("-p", "no:cacheprovider", "test_k.py", "-k", "decay", "--jaxlog-regen").assert_outcomes(passed=1)
    assert (tests / "fixtures/golden/test_k.test_decay.h5").exists()
    result = pytester.runpytest("-p", "no:cacheprovider", "tests/test_k.py", "-k", "decay")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*golden trajectory fixtures/golden/tests.test_k.test_decay.h5 does not exist",
        "*  found tests/fixtures/golden/test_k.test_decay.h5 for the same test under another name: this session's "
        f"test id (tests/test_k.py::test_decay) starts with 'tests/', the file's does not: pytest's rootdir is "
        f"{pytester.path} here, it was made with rootdir {tests}",
    ])

NAMES = """
import jax.numpy as jnp
import pytest

def step(x):
    return x * 0.5 + 1.0

@pytest.mark.parametrize("p", ["a", "a-b"])
def test_f(jaxlog, p):
    run = jaxlog.run(step, jnp.full(3, float(len(p))), 4, record={"x": lambda x: x})
    if p == "a":
        jaxlog.check_golden(run, name="b")  # test_f[a] + "b": must not be test_f[a-b]'s file
    else:
        jaxlog.check_golden(run)

def test_long(jaxlog):
    run = jaxlog.run(step, jnp.zeros(2), 3, record={"x": lambda x: x}, name="r" * 300)
    assert jaxlog.load("r" * 300)["x"].shape == (4, 2)
    assert all(len(p.name) < 255 for p in jaxlog.dir.rglob("*"))
    jaxlog.check_golden(run, name="n" * 300)
    other = jaxlog.run(step, jnp.ones(2), 3, record={"x": lambda x: x}, name="r" * 299 + "s")
    jaxlog.check_golden(other, name="n" * 299 + "m")  # differs only past the shortened part
"""

def test_golden_names_unique_per_test_and_name_and_short(pytester):
    pytester.makepyfile(test_n=NAMES)
    result = pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-regen", "--jaxlog-keep=all")
    result.assert_outcomes(passed=3)
    files = sorted(p.name for p in (pytester.path / "fixtures/golden").iterdir())
    assert len(files) == 4, files  # one each: nothing written twice
    assert "test_n.test_f-a--b.h5" in files and "test_n.test_f-a-b.h5" in files
    long = [f for f in files if f.startswith("test_n.test_long--")]
    assert len(long) == 2 and all(len(f) <= 123 for f in long)
    assert all(f[:-3].rsplit("-", 1)[1].isalnum() and len(f[:-3].rsplit("-", 1)[1]) == 8 for f in long)  # hash suffix
    # each test compares with its own file: a shared file would fail one of them
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=3)
    # and the names are stable: the same files again, nothing new
    pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-regen").assert_outcomes(passed=3)
    assert sorted(p.name for p in (pytester.path / "fixtures/golden").iterdir()) == files
