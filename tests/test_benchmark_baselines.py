"""Benchmark baselines across sessions (``--jaxlog-benchmark-save/-compare/-compare-fail``): real
pytest sessions save a kernel's timings and a later one compares with them. A kernel doing its
step's work three times fails the comparison at 50% with the figures; the same kernel passes;
under ``-n 2`` one file holds every worker's tests; a run saved for another machine is never
compared with. The interval's statistics are checked against plain enumeration."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import pytest

from plugin_helpers import no_jaxlog_env  # noqa: F401  (no_jaxlog_env: an autouse fixture)
from pytest_jaxlog.cli import main
from pytest_jaxlog.errors import JaxlogError
from pytest_jaxlog.profiling.baseline import BenchmarkRegression, compare
from pytest_jaxlog.profiling.baselinefile import read
from pytest_jaxlog.profiling.machine import Machine, this_machine
from pytest_jaxlog.profiling.ratio import mann_whitney_counts, ratio_interval

pytest_plugins = ["pytester"]

# imported before the inner runs: pytester drops modules first imported during a run
import h5py  # noqa: E402,F401
import pytest_jaxlog.drive.benchmark  # noqa: E402,F401
import pytest_jaxlog.profiling.baseline  # noqa: E402,F401
import pytest_jaxlog.profiling.timeline  # noqa: E402,F401
import pytest_jaxlog.store.hdf5  # noqa: E402,F401

# a 96x96 matrix product per step: milliseconds of device work per run, well above jl.run's own; timed
# against the plain step as a reference beside it, so the machine's load in either session cancels
KERNEL = """
import jax.numpy as jnp

W = jnp.eye(96) * 0.5 + 0.001
WORK = {work}

def plain(x):
    return jnp.tanh(W @ x)

def step(x):
    for _ in range(WORK):  # the slowed kernel does the step's work WORK times
        x = jnp.tanh(W @ x)
    return x

X = jnp.ones((96, 96))

def test_fast(jaxlog):
    jaxlog.benchmark(step, X, 100, reference=(plain, X), repeats=6, number=5)

def test_two(jaxlog):
    jaxlog.benchmark(step, X, 100, reference=(plain, X), repeats=6, number=5)
    jaxlog.benchmark(step, X, 50, reference=(plain, X), repeats=6, number=5, name="short")
"""

NEW_TEST = """

def test_new(jaxlog):
    jaxlog.benchmark(step, X, 100, repeats=4, number=2)
"""


def _files(store: Path) -> list[Path]:
    return sorted(store.glob("*/*.json"))


def _manifest(pytester) -> dict:
    doc = json.loads((pytester.path / ".jaxlog" / "manifest.json").read_text())
    return {t["nodeid"]: t for t in doc["tests"]}


def _session(pytester, *args):
    return pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-benchmark-storage=store", *args)


def test_a_slowed_kernel_fails_the_comparison_and_the_same_kernel_passes(pytester, capsys):
    pytester.makepyfile(test_k=KERNEL.format(work=1))
    _session(pytester, "--jaxlog-benchmark-save=base").assert_outcomes(passed=2)
    [saved] = _files(pytester.path / "store")
    assert saved.name == "0001_base.json" and saved.parent.name == this_machine().key
    base = read(saved)
    assert sorted(base.tests) == ["test_k.py::test_fast", "test_k.py::test_two"]
    assert [b["name"] for b in base.tests["test_k.py::test_two"]["benchmarks"]] == ["benchmark", "short"]
    assert all(len(b["samples"]) == len(b["reference_samples"]) == 6 and all(len(r) == 5 for r in b["samples"])
               for t in base.tests.values() for b in t["benchmarks"])

    pytester.makepyfile(test_k=KERNEL.format(work=4))
    slow = _session(pytester, "--jaxlog-benchmark-compare=base", "--jaxlog-benchmark-compare-fail=50")
    slow.assert_outcomes(failed=2)
    slow.stdout.re_match_lines([
        r"E +pytest_jaxlog\.profiling\.baseline\.BenchmarkRegression: \[jaxlog\] benchmark 'benchmark' of "
        r"test_k\.py::test_fast is slower than saved run 0001_base: [\d,.]+ steps/s now vs [\d,.]+ steps/s saved; "
        r"time relative to its reference x[\d.]+ the saved \(9\d\.\d% interval \[[\d.]+, [\d.]+\]; Hodges-Lehmann ratio .*, 6 repeats "
        r"now, 6 saved\), which lies wholly above the 1\.500 allowed \(--jaxlog-benchmark-compare-fail=50\)\. If the "
        r"slow-down is intended, save a new baseline: --jaxlog-benchmark-save=NAME$",
    ])
    entries = _manifest(pytester)
    for nodeid in ("test_k.py::test_fast", "test_k.py::test_two"):
        [first] = entries[nodeid]["benchmarks"]  # test_two stopped at its first benchmark
        c = first["compare"]
        assert c["failed"] and c["verdict"] == "slower" and c["interval"][0] > 1.5 and c["baseline"] == "0001_base"
        # the same figures computed plainly from the two sessions' samples
        saved_b = base.benchmark(nodeid, "benchmark")
        now_rel = [min(a) / min(b) for a, b in zip(first["samples"], first["reference_samples"])]
        saved_rel = [min(a) / min(b) for a, b in zip(saved_b["samples"], saved_b["reference_samples"])]
        plain = sorted(math.log(a) - math.log(b) for a in now_rel for b in saved_rel)
        k = _moses_rank(6, 6)
        assert c["ratio"] == pytest.approx(math.exp((plain[17] + plain[18]) / 2))  # the median of 36 differences
        assert c["interval"] == pytest.approx([math.exp(plain[k - 1]), math.exp(plain[36 - k])])
    slow.stdout.fnmatch_lines(["*benchmarks compared with saved run 0001_base, failing beyond 50% slower: 2 slower, "
                               "0 faster, 0 unchanged*", "*test*saved steps/s*now steps/s*time ratio*interval*verdict",
                               "*test_k.py::test_*slower FAILED"])
    capsys.readouterr()
    assert main(["summary", "--markdown", str(pytester.path / ".jaxlog")]) == 0
    summary = capsys.readouterr().out
    assert ("benchmarks compared with saved run 0001_base: 2 slower, 0 faster, 0 unchanged (interval holds 1); "
            "0 not in the saved run (not compared)") in summary
    assert "| test | saved steps/s | now steps/s | time ratio | interval | verdict |" in summary
    ratio = entries["test_k.py::test_fast"]["benchmarks"][0]["compare"]["ratio"]
    assert re.search(rf"\| `test_k.py::test_fast` \| [\d,.]+ \| [\d,.]+ \| x{ratio:.3f} \| \[[\d.]+, [\d.]+\] \| "
                     r"slower FAILED \|", summary), summary

    pytester.makepyfile(test_k=KERNEL.format(work=1) + NEW_TEST)
    same = _session(pytester, "--jaxlog-benchmark-compare=last", "--jaxlog-benchmark-compare-fail=50")
    same.assert_outcomes(passed=3)
    entries = _manifest(pytester)
    assert entries["test_k.py::test_new"]["benchmarks"][0]["compare"] == {"baseline": "0001_base", "missing": True}
    assert "benchmark 'benchmark': not in saved run 0001_base: not compared" in entries["test_k.py::test_new"]["notes"]
    assert all(b["compare"]["interval"][0] <= 1.5 for n in ("test_k.py::test_fast", "test_k.py::test_two")
               for b in entries[n]["benchmarks"])
    same.stdout.fnmatch_lines(["*; 1 not in the saved run (not compared)"])
    assert len(_files(pytester.path / "store")) == 1  # comparing saves nothing


def test_under_xdist_the_controller_writes_one_file_with_every_workers_tests(pytester):
    pytester.makepyfile(test_k=KERNEL.format(work=1) + NEW_TEST)
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", "--jaxlog-benchmark-storage=store",
                                           "--jaxlog-benchmark-save=xd")
    result.assert_outcomes(passed=3)
    [saved] = _files(pytester.path / "store")
    assert saved.name == "0001_xd.json"
    run = read(saved)
    assert sorted(run.tests) == ["test_k.py::test_fast", "test_k.py::test_new", "test_k.py::test_two"]
    assert run.count == 4 and all("reference_samples" in b for b in run.tests["test_k.py::test_fast"]["benchmarks"])
    assert "reference_samples" not in run.tests["test_k.py::test_new"]["benchmarks"][0]
    workers = {e["worker"] for e in _manifest(pytester).values()}
    assert workers == {"gw0", "gw1"}, workers  # both workers ran tests, one file holds them
    assert not list((pytester.path / "store").glob("*/.saving-*"))


def test_a_run_saved_for_another_machine_is_never_compared_with(pytester):
    pytester.makepyfile(test_k=KERNEL.format(work=1))
    _session(pytester, "--jaxlog-benchmark-save=base", "-k", "fast").assert_outcomes(passed=1, deselected=1)
    [saved] = _files(pytester.path / "store")
    doc = json.loads(saved.read_text())
    other = Machine("Some Other CPU", doc["machine"]["backend"], doc["machine"]["device_kind"], doc["machine"]["jax"])
    doc["machine"] = other.to_json()
    (pytester.path / "store" / other.key).mkdir()
    (pytester.path / "store" / other.key / saved.name).write_text(json.dumps(doc))
    saved.unlink()
    result = _session(pytester, "--jaxlog-benchmark-compare=base", "--jaxlog-benchmark-compare-fail=10", "-k", "fast")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        f"E * [[]jaxlog[]] benchmark compare: saved run 'base' exists in * only for other machines: {other.key} "
        f"(Some Other CPU; *); this machine ({this_machine().key}: *) has none, and timings are never compared across "
        "machines. Save a baseline on this machine first: --jaxlog-benchmark-save=NAME"])


def test_the_machine_key_changes_with_each_field():
    m = Machine("Xeon", "cpu", "cpu", "0.10.2")
    keys = {m.key, Machine("EPYC", "cpu", "cpu", "0.10.2").key, Machine("Xeon", "gpu", "cpu", "0.10.2").key,
            Machine("Xeon", "cpu", "H100", "0.10.2").key, Machine("Xeon", "cpu", "cpu", "0.12.0").key}
    assert len(keys) == 5 and m.key == Machine("Xeon", "cpu", "cpu", "0.10.2").key
    assert m.key.startswith("cpu-cpu-jax0.10.2-") and Machine.from_json(m.to_json()) == m
    here = this_machine()
    import jax

    assert (here.backend, here.jax) == (jax.default_backend(), jax.__version__)


def test_outputs_where_people_look(pytester):
    """The manifest entry, JUnit properties and report section carry a test's benchmark and checked cost."""
    pytester.makepyfile(test_c=KERNEL.format(work=1) + """

def test_cost_and_speed(jaxlog):
    run = jaxlog.run(step, X, 10)
    jaxlog.check_cost(run)
    jaxlog.benchmark(step, X, 50, repeats=4, number=2, name="speed")
    assert False, "show the section"
""")
    result = pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-create-goldens", "--junitxml=j.xml", "-k", "cost",
                                "-W", "ignore::pytest_jaxlog.JaxlogRuntimeWarning")
    result.assert_outcomes(failed=1)
    [entry] = _manifest(pytester).values()
    [cost] = entry["costs"]
    [bench] = entry["benchmarks"]
    assert cost["metrics"]["flops"] > 0 and bench["name"] == "speed" and len(bench["samples"]) == 4
    xml = (pytester.path / "j.xml").read_text()
    props = dict(re.findall(r'<property name="([^"]+)" value="([^"]*)" />', xml))
    assert float(props["jaxlog.flops"]) == pytest.approx(cost["metrics"]["flops"], rel=1e-5)
    assert float(props["jaxlog.steps_per_s[speed]"]) == pytest.approx(bench["steps_per_s"], rel=1e-5)
    assert props["jaxlog.repeats[speed]"] == "4"
    result.stdout.fnmatch_lines([f"cost per step (*): flops={cost['metrics']['flops']:.6g}, *",
                                 "note: benchmark: * steps/s (median of 8 runs of 50 steps)"])


def test_option_errors_name_the_option(pytester, monkeypatch):
    pytester.makepyfile(test_k="def test_x():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-benchmark-compare-fail=10")
    result.stderr.fnmatch_lines(["*jaxlog benchmark_compare_fail (--jaxlog-benchmark-compare-fail): fails benchmarks "
                                 "slower than a saved run; name the run with --jaxlog-benchmark-compare=NAME (or last)"])
    result = pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-benchmark-save=base")
    result.stderr.fnmatch_lines(["*keep runs in pytest's cache directory, which is off here (-p no:cacheprovider): "
                                 "give --jaxlog-benchmark-storage=DIR"])
    result = pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-benchmark-storage=s", "--jaxlog-benchmark-save=a/b")
    result.stderr.fnmatch_lines(["*jaxlog benchmark_save (--jaxlog-benchmark-save): 'a/b': use letters, digits*"])
    monkeypatch.setenv("JAXLOG_BENCHMARK_COMPARE", "last")
    monkeypatch.setenv("JAXLOG_BENCHMARK_COMPARE_FAIL", "ten")
    result = pytester.runpytest("--jaxlog-benchmark-storage=s")
    result.stderr.fnmatch_lines(["*jaxlog benchmark_compare_fail (JAXLOG_BENCHMARK_COMPARE_FAIL=ten): expected a "
                                 "percentage >= 0*"])


def test_the_default_storage_is_in_pytests_cache(pytester):
    pytester.makepyfile(test_k=KERNEL.format(work=1))
    pytester.runpytest("--jaxlog-benchmark-save=base", "-k", "fast").assert_outcomes(passed=1, deselected=1)
    [saved] = (pytester.path / ".pytest_cache" / "d" / "jaxlog-benchmarks").glob("*/*.json")
    assert saved.name == "0001_base.json"


# statistics ---------------------------------------------------------------------------------


def _u_counts_by_enumeration(n: int, m: int) -> list[int]:
    counts = [0] * (n * m + 1)
    for first in itertools.combinations(range(n + m), n):
        chosen = set(first)
        u = sum(sum(1 for j in range(i) if j not in chosen) for i in chosen)  # pairs with the second sample first
        counts[u] += 1
    return counts


def _moses_rank(n: int, m: int, confidence: float = 0.95) -> int:
    """The largest k whose interval [d_(k), d_(nm-k+1)] still covers with ``confidence``, by enumeration."""
    counts, total = _u_counts_by_enumeration(n, m), math.comb(n + m, n)
    k = 1  # [d_(k), d_(nm-k+1)] misses the ratio when U <= k-1 or U >= nm-k+1
    while 1 - 2 * sum(counts[:k + 1]) / total >= confidence:
        k += 1
    return k


@pytest.mark.parametrize("n,m", [(1, 1), (2, 3), (4, 4), (5, 3), (6, 5)])
def test_mann_whitney_counts_match_enumeration(n, m):
    assert mann_whitney_counts(n, m) == _u_counts_by_enumeration(n, m)


def test_the_ratio_interval_covers_as_it_says():
    now, saved = [2.0, 2.2, 1.8, 2.1, 2.4], [1.0, 1.1, 0.9, 1.05, 1.2]
    found = ratio_interval(now, saved)
    diffs = sorted(math.log(a / b) for a in now for b in saved)
    counts = _u_counts_by_enumeration(5, 5)
    # k = 3: 1 - 2 P(U <= 2) = 1 - 8/252 >= 0.95, and k = 4 falls below (1 - 14/252)
    assert _moses_rank(5, 5) == 3 and sum(counts[:3]) == 4 and sum(counts[:4]) == 7
    assert found.interval.coverage == pytest.approx(1 - 8 / 252)
    assert (found.interval.lo, found.interval.hi) == pytest.approx((math.exp(diffs[2]), math.exp(diffs[22])))
    assert found.ratio == pytest.approx(math.exp(diffs[12]))
    with pytest.raises(JaxlogError, match="needs more repeats: got 3 now and 3 saved"):
        ratio_interval([1, 2, 3], [1, 2, 3])
    with pytest.raises(JaxlogError, match="positive finite timings"):
        ratio_interval([1, 0, 3, 4], [1, 2, 3, 4])


def test_a_comparison_fails_only_when_the_interval_clears_the_limit():
    saved = {"steps": 10, "samples": [[1.0, 1.1], [1.0], [1.2], [0.9]]}
    same = compare({"steps": 10, "samples": [[1.05], [0.95], [1.1], [1.0]]}, saved, "0001_x", 10)
    assert same.verdict == "unchanged" and not same.failed and same.limit == pytest.approx(1.1)
    double = compare({"steps": 20, "samples": [[4.0], [4.2], [3.9], [4.1]]}, saved, "0001_x", 10)  # 2x per step
    assert double.failed and double.verdict == "slower" and double.interval.lo > 1.1
    assert double.ratio == pytest.approx(2.0, rel=0.1)
    faster = compare({"steps": 10, "samples": [[0.4], [0.45], [0.42], [0.41]]}, saved, "0001_x", None)
    assert faster.verdict == "faster" and not faster.failed
    assert issubclass(BenchmarkRegression, AssertionError) and issubclass(BenchmarkRegression, JaxlogError)


def test_against_a_reference_on_both_sides_the_load_cancels():
    """A session where the machine was twice as busy: the kernel and its reference both take twice as
    long, so relative to the reference nothing changed; a kernel slower than its reference is found."""
    saved = {"steps": 10, "samples": [[1.0], [1.1], [0.9], [1.05]], "reference_samples": [[1.0], [1.1], [0.9], [1.05]]}
    loaded = {"steps": 10, "samples": [[2.0], [2.2], [1.8], [2.1]], "reference_samples": [[2.0], [2.2], [1.8], [2.1]]}
    busy = compare(loaded, saved, "0001_x", 10)
    assert busy.basis == "time relative to its reference" and busy.ratio == pytest.approx(1.0) and not busy.failed
    assert compare({k: v for k, v in loaded.items() if k != "reference_samples"}, saved, "0001_x", 10).failed
    slower = dict(saved, samples=[[3.0], [3.3], [2.7], [3.15]])
    found = compare(slower, saved, "0001_x", 10)
    assert found.failed and found.ratio == pytest.approx(3.0) and found.interval.lo == pytest.approx(3.0)


def test_a_benchmark_name_is_checked_before_timing(pytester):
    pytester.makepyfile(test_n=r"""
import jax.numpy as jnp
import pytest

def test_names(jaxlog):
    with pytest.raises(Exception, match=r"jaxlog.benchmark\(name=...\): 'a/b': use letters"):
        jaxlog.benchmark(lambda x: x, jnp.ones(2), 1, repeats=1, number=1, name="a/b")
    jaxlog.benchmark(lambda x: x, jnp.ones(2), 1, repeats=1, number=1, name="one")
    with pytest.raises(Exception, match=r"name='one'.*made a benchmark of that name already"):
        jaxlog.benchmark(lambda x: x, jnp.ones(2), 1, repeats=1, number=1, name="one")
    jaxlog.benchmark(lambda x: x, jnp.ones(2), 1, repeats=1, number=1)
    jaxlog.benchmark(lambda x: x, jnp.ones(2), 1, repeats=1, number=1)
""")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    [entry] = _manifest(pytester).values()
    assert [b["name"] for b in entry["benchmarks"]] == ["one", "benchmark", "benchmark-1"]
