"""Cost goldens through pytester: a missing one fails like a missing trajectory golden and
``--jaxlog-create-goldens`` writes it; a kernel that does more (or less) work fails with
``jl.CostRegression`` naming the figures; one file keeps one entry per platform."""

from __future__ import annotations

import json

import jax

from plugin_helpers import no_jaxlog_env  # noqa: F401  (no_jaxlog_env: an autouse fixture)

pytest_plugins = ["pytester"]

# imported before the inner runs: pytester drops modules first imported during a run
import h5py  # noqa: E402,F401
import jax.numpy  # noqa: E402,F401
import pytest_jaxlog.drive.run  # noqa: E402,F401
import pytest_jaxlog.drive.host.result  # noqa: E402,F401
import pytest_jaxlog.compare.cost  # noqa: E402,F401
import pytest_jaxlog.harness.goldens  # noqa: E402,F401
import pytest_jaxlog.store.hdf5.writer  # noqa: E402,F401
import pytest_jaxlog.profiling.timeline  # noqa: E402,F401
from cost_kernel import CHEAPER, GOLDEN, KERNEL, PLAIN, TWICE  # noqa: E402

RUN = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")


def _key():
    from pytest_jaxlog.profiling.cost import cost

    return cost(lambda x: x, jax.numpy.zeros(1)).platform_key()


def test_missing_cost_golden_then_created_then_ok(pytester):
    pytester.makepyfile(test_k=KERNEL.format(work=PLAIN))
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*[[]jaxlog] cost golden {GOLDEN} does not exist*",
                                 "*to create it, run pytest with --jaxlog-create-goldens (missing goldens only) or "
                                 "--jaxlog-regen"])
    assert not (pytester.path / GOLDEN).exists()

    result = pytester.runpytest(*RUN, "--jaxlog-create-goldens")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*created cost golden {GOLDEN} entry '{_key()}' (--jaxlog-create-goldens)*"])
    doc = json.loads((pytester.path / GOLDEN).read_text())
    assert doc["format"] == "jaxlog-cost/1" and doc["test"] == "test_k.py::test_cost"
    entry = doc["entries"][_key()]
    assert entry["backend"] == jax.default_backend() and entry["jax_version"] == jax.__version__
    assert entry["metrics"]["transcendentals"] == 64 and entry["metrics"]["views/mean/flops"] > 0

    pytester.runpytest(*RUN).assert_outcomes(passed=1)


def test_more_work_fails_naming_the_metrics_and_less_work_asks_to_regenerate(pytester):
    pytester.makepyfile(test_k=KERNEL.format(work=PLAIN))
    pytester.runpytest(*RUN, "--jaxlog-create-goldens").assert_outcomes(passed=1)
    stored = json.loads((pytester.path / GOLDEN).read_text())["entries"][_key()]["metrics"]

    pytester.makepyfile(test_k=KERNEL.format(work=TWICE))
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        f"*CostRegression: [[]jaxlog] compiled cost moved from cost golden {GOLDEN} [[]{_key()}] (rtol=0):",
        "*transcendentals: stored 64, obtained 128 (x2, more)",
        "*if the change is intended, run pytest with --jaxlog-regen"])
    assert f"flops: stored {stored['flops']:,.0f}, obtained" in result.stdout.str()
    assert "views/mean" not in result.stdout.str()  # the view did not change

    pytester.makepyfile(test_k=KERNEL.format(work=CHEAPER))
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*transcendentals: stored 64, obtained 0 (x0, less)",
                                 "*every figure went down: if the kernel was made cheaper on purpose, store the new "
                                 "figures so a regression back is caught: run pytest with --jaxlog-regen"])


def test_one_entry_per_platform(pytester):
    pytester.makepyfile(test_k=KERNEL.format(work=PLAIN))
    path = pytester.path / GOLDEN
    path.parent.mkdir(parents=True)
    other = {"backend": "gpu", "device_kind": "NVIDIA H100", "jax_version": "0.0.1", "x64": False,
             "metrics": {"flops": 1.0}}
    path.write_text(json.dumps({"format": "jaxlog-cost/1", "test": "t", "entries": {"gpu/H100/jax-0.0.1": other}}))
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(failed=1)
    assert f"cost golden {GOLDEN} has no entry for '{_key()}' (it has ['gpu/H100/jax-0.0.1'])" in result.stdout.str()

    pytester.runpytest(*RUN, "--jaxlog-regen").assert_outcomes(passed=1)
    entries = json.loads(path.read_text())["entries"]
    assert set(entries) == {"gpu/H100/jax-0.0.1", _key()} and entries["gpu/H100/jax-0.0.1"] == other
    pytester.runpytest(*RUN).assert_outcomes(passed=1)
    # a tolerance lets a small move through; a metric selection ignores the others
    pytester.makepyfile(test_k=KERNEL.format(work=TWICE).replace("check_cost(run)",
                                                                 "check_cost(run, metrics=['argument_bytes'])"))
    pytester.runpytest(*RUN).assert_outcomes(passed=1)
