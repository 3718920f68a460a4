"""Goldens with entries per platform, through pytester: a golden made on one platform (x64 off, or
a jax version range that excludes the running jax) checked on another is compared with its
reference entry at the tolerance the reference stores, the failure leads with where each was
made, and --jaxlog-regen adds this platform's entry without touching the reference; files keep
only the records and steps a check compares, compressed."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest

import pytest_jaxlog as jl
from plugin_helpers import no_jaxlog_env  # noqa: F401  (no_jaxlog_env: an autouse fixture)
from pytest_jaxlog.compare.golden import check_golden
from pytest_jaxlog.store.hdf5.layout import provenance

pytest_plugins = ["pytester"]

# imported before the inner runs: pytester drops modules first imported during a run
import jax  # noqa: E402
import jax.numpy  # noqa: E402,F401
import pytest_jaxlog.drive.run, pytest_jaxlog.profiling.timeline, pytest_jaxlog.store.hdf5.writer  # noqa: E401,E402,F401
import pytest_jaxlog.compare.golden_files  # noqa: E402,F401

KERNEL = """
import jax.numpy as jnp

def step(x):
    return x * 0.9 + {kick}

def test_decay(jaxlog):
    run = jaxlog.run(step, jnp.linspace(0.0, 1.0, 4), 20, record={{"x": lambda x: x}})
    assert jaxlog.check_golden(run, rtol=1e-6) in ("ok", "regenerated")
"""
RUN = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")
REFERENCE = "fixtures/golden/test_k.test_decay.h5"
HERE = provenance()
MINOR = int(HERE["jax"].split(".")[1])


def _entry(x64: bool) -> str:
    bits = "x64" if x64 else "x32"
    return (f"fixtures/golden/test_k.test_decay.platforms/cpu-cpu-{bits}-jax{HERE['jax']}-0.{MINOR + 1}.h5")


def _set_golden(path, **fields):
    with h5py.File(path, "r+") as f:
        info = json.loads(f["jaxlog"].attrs["golden"])
        info.update(fields)
        f["jaxlog"].attrs["golden"] = np.bytes_(json.dumps(info).encode())


def _this_platform(x64: bool) -> str:
    return f"backend 'cpu', device kind 'cpu', jax {HERE['jax']}, x64 {'on' if x64 else 'off'}"


def test_an_entry_for_another_jax_range_falls_back_and_regen_adds_this_platforms(pytester):
    pytester.makepyfile(test_k=KERNEL.format(kick="0.01"))
    pytester.runpytest(*RUN, "--jaxlog-regen").assert_outcomes(passed=1)
    reference = pytester.path / REFERENCE
    _set_golden(reference, jax_range={"from": "0.1", "below": "0.2"})  # made for jax 0.1.x: not this jax
    before = reference.read_bytes()

    pytester.makepyfile(test_k=KERNEL.format(kick="0.0100001"))
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        f"E   *[[]jaxlog] golden {REFERENCE} has no entry for this platform: compared with its reference entry, made "
        f"on {_this_platform(False)}, at the tolerance it stores (rtol=1e-06, atol=0); this platform: "
        f"{_this_platform(False)}",
        "E   *[[]jaxlog] trajectories differ: record 'x' first differs at step 1*",
        f"E   *run pytest with --jaxlog-regen to add this platform's entry {_entry(False)} (the reference entry "
        f"{REFERENCE} is kept)"])

    result = pytester.runpytest(*RUN, "--jaxlog-regen")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*regenerated golden {_entry(False)} (--jaxlog-regen)*"])
    assert reference.read_bytes() == before  # another platform's entry: never replaced
    entry = jl.load(pytester.path / _entry(False))
    assert entry.golden["jax_range"] == {"from": HERE["jax"], "below": f"0.{MINOR + 1}"}
    pytester.runpytest(*RUN).assert_outcomes(passed=1)  # compared with this platform's entry now

    pytester.makepyfile(test_k=KERNEL.format(kick="0.0100002"))  # changed again: regen rewrites this entry only
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"E   *[[]jaxlog] golden {_entry(False)} (this platform's entry) made on this "
                                 f"platform ({_this_platform(False)})",
                                 f"E   *run pytest with --jaxlog-regen to regenerate {_entry(False)} (this platform's "
                                 "entry; other platforms' entries are kept)"])
    pytester.runpytest(*RUN, "--jaxlog-regen").assert_outcomes(passed=1)
    assert reference.read_bytes() == before
    assert sorted(p.name for p in (pytester.path / "fixtures/golden").rglob("*.h5")) == \
        sorted([reference.name, os.path.basename(_entry(False))])
    pytester.runpytest(*RUN).assert_outcomes(passed=1)


def test_a_golden_made_with_x64_off_checked_with_x64_on(pytester, monkeypatch):
    pytester.makepyfile(test_k=KERNEL.format(kick="0.01"))
    pytester.runpytest(*RUN, "--jaxlog-regen").assert_outcomes(passed=1)  # this process: x64 off
    reference = pytester.path / REFERENCE
    before = reference.read_bytes()

    def x64_run(*extra):  # a fresh process: x64 is read when jax starts
        with monkeypatch.context() as m:
            m.setenv("JAX_ENABLE_X64", "1")
            return pytester.runpytest_subprocess(*RUN, *extra, timeout=300)

    result = x64_run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        f"E   *[[]jaxlog] golden {REFERENCE} has no entry for this platform: compared with its reference entry, made "
        f"on {_this_platform(False)}, at the tolerance it stores (rtol=1e-06, atol=0); this platform: "
        f"{_this_platform(True)}",
        f"E   *run pytest with --jaxlog-regen to add this platform's entry {_entry(True)} (the reference entry "
        f"{REFERENCE} is kept)"])

    x64_run("--jaxlog-regen").assert_outcomes(passed=1)
    assert reference.read_bytes() == before
    assert jl.load(pytester.path / _entry(True))["x"].dtype == np.float64
    assert jl.load(reference)["x"].dtype == np.float32
    x64_run().assert_outcomes(passed=1)  # x64 on: its own entry
    pytester.runpytest(*RUN).assert_outcomes(passed=1)  # x64 off: the reference


def test_the_reference_entry_is_compared_at_the_tolerance_it_stores(tmp_path):
    golden = tmp_path / "g.h5"
    base = jl.run(lambda x: x * 0.9, jax.numpy.ones(3), 10, record={"x": lambda x: x})
    near = jl.run(lambda x: x * 0.90001, jax.numpy.ones(3), 10, record={"x": lambda x: x})
    check_golden(base, golden, regen=True, rtol=1e-3)
    with pytest.raises(AssertionError, match="this platform's entry"):  # its own platform: the given rtol
        check_golden(near, golden, regen=False, rtol=1e-7)
    _set_golden(golden, jax_range={"from": "0.1", "below": "0.2"})
    assert check_golden(near, golden, regen=False, rtol=1e-7) == "ok"  # fallback: the stored rtol=1e-3


def test_a_golden_keeps_only_the_records_and_steps_it_is_compared_on(tmp_path):
    golden = tmp_path / "g.h5"
    run = jl.run(lambda x: x * 0.9, jax.numpy.ones(3), 100, record={"x": lambda x: x, "m": lambda x: x.mean()})
    check_golden(run, golden, regen=True, records="x", steps=jl.every(10))
    kept = jl.load(golden)
    assert kept.records == ("x",) and list(kept.steps("x")) == list(range(0, 101, 10))
    np.testing.assert_array_equal(kept["x"], np.asarray(run.trajectory["x"])[::10])
    with h5py.File(golden, "r") as f:
        assert f["observables/x/value"].compression == "gzip"
    assert check_golden(run, golden, regen=False, records="x", steps=jl.every(10)) == "ok"
