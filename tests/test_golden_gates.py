"""Gates that would pass on garbage: a cost golden whose figures are NaN or infinite, a saved
benchmark run of NaN timings, a golden of NaN tolerance. Each is refused when read (or compared)
with one JaxlogError naming the file, the entry and the field."""

from __future__ import annotations

import json
import re

import pytest

import pytest_jaxlog as jl
from plugin_helpers import no_jaxlog_env  # noqa: F401  (no_jaxlog_env: an autouse fixture)
from pytest_jaxlog.compare import baseline as baselinefile, cost as costfile

pytest_plugins = ["pytester"]

# imported before the inner runs: pytester drops modules first imported during a run
import h5py  # noqa: E402,F401
import jax.numpy  # noqa: E402,F401
import pytest_jaxlog.drive.run, pytest_jaxlog.drive.host.result, pytest_jaxlog.harness.goldens  # noqa: E401,E402,F401
import pytest_jaxlog.store.hdf5.writer, pytest_jaxlog.profiling.timeline  # noqa: E401,E402,F401
from cost_kernel import GOLDEN, KERNEL, PLAIN, TWICE  # noqa: E402

RUN = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")


@pytest.mark.parametrize("garbage", ["NaN", "Infinity"])
def test_a_cost_golden_of_nan_or_inf_fails_a_kernel_doing_twice_the_work(pytester, garbage):
    pytester.makepyfile(test_k=KERNEL.format(work=PLAIN))
    pytester.runpytest(*RUN, "--jaxlog-regen").assert_outcomes(passed=1)
    path = pytester.path / GOLDEN
    doc = json.loads(path.read_text())
    (key,) = doc["entries"]
    doc["entries"][key]["metrics"] = {m: float(garbage.replace("Infinity", "inf")) for m in doc["entries"][key]["metrics"]}
    path.write_text(json.dumps(doc))  # json writes NaN / Infinity, which json reads back

    pytester.makepyfile(test_k=KERNEL.format(work=TWICE))
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"E   *JaxlogError: [[]jaxlog] cost golden {pytester.path / GOLDEN} entry {key!r}: "
                                 f"metric 'flops' is {'nan' if garbage == 'NaN' else 'inf'}, expected a finite number "
                                 ">= 0 or null; regenerate it with --jaxlog-regen"])


def test_a_comparison_with_a_non_finite_figure_names_it():
    with pytest.raises(jl.JaxlogError, match=re.escape("stored metric 'flops' of g.cost.json entry 'k' is nan")):
        costfile.compare({"flops": float("nan")}, {"flops": 2.0}, 0.0, where="g.cost.json entry 'k'")
    with pytest.raises(jl.JaxlogError, match="obtained metric 'temp_bytes' of the stored cost is inf"):
        costfile.compare({"temp_bytes": 1}, {"temp_bytes": float("inf")}, 0.0)
    assert [m.metric for m in costfile.compare({"flops": 1.0}, {"flops": 2.0}, 0.0)] == ["flops"]


@pytest.mark.parametrize("field, value", [("samples", [[float("nan")]]), ("samples", [[-1.0]]),
                                          ("reference_samples", [["fast"]]), ("steps", 0)])
def test_a_saved_benchmark_run_of_garbage_is_refused_naming_the_field(tmp_path, field, value):
    bench = {"name": "benchmark", "steps": 10, "samples": [[0.5, 0.4]], field: value}
    path = tmp_path / "0001_main.json"
    path.write_text(json.dumps({"format": baselinefile.FORMAT, "version": 1, "name": "main", "number": 1,
                                "saved": 0.0, "machine": None, "tests": {"t.py::test_a": {"benchmarks": [bench]}}}))
    with pytest.raises(jl.JaxlogError, match=re.escape(f"saved benchmarks {path}: test t.py::test_a benchmark "
                                                       f"'benchmark': field {field!r} is ")):
        baselinefile.read(path)


def test_a_saved_cost_of_nan_is_refused(tmp_path):
    path = tmp_path / "0001_main.json"
    path.write_text(json.dumps({"format": baselinefile.FORMAT, "tests": {"t.py::test_a": {
        "benchmarks": [], "costs": [{"name": None, "metrics": {"flops": float("nan")}}]}}}))
    with pytest.raises(jl.JaxlogError, match="test t.py::test_a cost None: field 'flops' is nan"):
        baselinefile.read(path)
