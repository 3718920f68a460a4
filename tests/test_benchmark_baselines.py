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
from pytest_jaxlog.compare.baseline import BenchmarkRegression, compare
from pytest_jaxlog.compare.baseline import read, save
from pytest_jaxlog.compare.baseline import Machine, this_machine
from pytest_jaxlog.profiling.speed import mann_whitney_counts, ratio_interval

pytest_plugins = ["pytester"]

# imported before the inner runs: pytester drops modules first imported during a run
import h5py  # noqa: E402,F401
import pytest_jaxlog.drive.benchmark  # noqa: E402,F401
import pytest_jaxlog.compare.baseline  # noqa: E402,F401
import pytest_jaxlog.profiling.timeline  # noqa: E402,F401
import pytest_jaxlog.store.hdf5.writer  # noqa: E402,F401

# a 96x96 matrix product per step: milliseconds of device work per run, well above jl.run's own; timed
# against a reference beside it that shares no code with the kernel (its own product and elementwise
# work), so the machine's load in either session cancels and the kernel's own slow-down does not
KERNEL = """
import jax.numpy as jnp

W = jnp.eye(96) * 0.5 + 0.001
WORK = {work}

def plain(x):
    return jnp.exp(-x * x) @ W

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
        r"E +pytest_jaxlog\.compare\.baseline\.BenchmarkRegression: \[jaxlog\] benchmark 'benchmark' of "
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
                               "0 not slower (0 of them faster), 0 cannot tell at x1.500; 0 not in the saved run*",
                               "*test*saved steps/s*now steps/s*time ratio*interval*verdict*could detect",
                               "*test_k.py::test_*slower FAILED*x*"])
    capsys.readouterr()
    assert main(["summary", "--markdown", str(pytester.path / ".jaxlog")]) == 0
    summary = capsys.readouterr().out
    assert ("benchmarks compared with saved run 0001_base: 2 slower, 0 not slower (0 of them faster), 0 cannot tell "
            "at x1.500; 0 not in the saved run (not compared)") in summary
    assert "| test | saved steps/s | now steps/s | time ratio | interval | verdict | could detect |" in summary
    compared = entries["test_k.py::test_fast"]["benchmarks"][0]["compare"]
    assert compared["detectable"] == pytest.approx(1.5 * compared["ratio"] / compared["interval"][0])
    assert re.search(rf"\| `test_k.py::test_fast` \| [\d,.]+ \| [\d,.]+ \| x{compared['ratio']:.3f} \| "
                     rf"\[[\d.]+, [\d.]+\] \| slower FAILED \| x{compared['detectable']:.3f} \|", summary), summary

    pytester.makepyfile(test_k=KERNEL.format(work=1) + NEW_TEST)
    same = _session(pytester, "--jaxlog-benchmark-compare=last", "--jaxlog-benchmark-compare-fail=50")
    same.assert_outcomes(passed=3)
    entries = _manifest(pytester)
    assert entries["test_k.py::test_new"]["benchmarks"][0]["compare"] == {"baseline": "0001_base", "missing": True}
    assert "benchmark 'benchmark': not in saved run 0001_base: not compared" in entries["test_k.py::test_new"]["notes"]
    assert all(b["compare"]["interval"][0] <= 1.5 and b["compare"]["verdict"] != "slower"
               and b["compare"]["basis"] == "time relative to its reference"
               for n in ("test_k.py::test_fast", "test_k.py::test_two") for b in entries[n]["benchmarks"])
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


def test_a_comparison_has_three_verdicts_and_fails_only_when_slower_or_asked():
    """Four repeats against four: the Moses interval is then the range of the 16 ratios (k = 1, by
    enumeration), so each verdict follows from the plain ratios between the two sessions' repeats."""
    assert _moses_rank(4, 4) == 1
    saved = {"steps": 10, "samples": [[1.0, 1.1], [1.0], [1.2], [0.9]]}
    noisy = {"steps": 10, "samples": [[1.05], [0.95], [1.1], [1.0]]}
    found = compare(noisy, saved, "0001_x", 10)
    plain = sorted(a[0] / min(b) for a in noisy["samples"] for b in saved["samples"])
    assert (found.interval.lo, found.interval.hi) == pytest.approx((plain[0], plain[-1]))  # [0.79, 1.22]: holds 1.1
    assert found.verdict == "cannot tell" and not found.failed and found.limit == pytest.approx(1.1)
    assert found.detectable == pytest.approx(1.1 * found.ratio / plain[0])
    assert compare(noisy, saved, "0001_x", 10, fail_inconclusive=True).failed  # --jaxlog-benchmark-inconclusive=fail
    assert not compare(noisy, saved, "0001_x", None, fail_inconclusive=True).failed  # compared, never failed
    steady = {"steps": 10, "samples": [[1.0], [1.01], [0.99], [1.0]]}
    same = compare({"steps": 10, "samples": [[1.0], [1.02], [0.98], [1.01]]}, steady, "0001_x", 10)
    assert same.verdict == "not slower" and same.interval.hi <= 1.1 and not same.failed and not same.faster
    double = compare({"steps": 20, "samples": [[4.0], [4.2], [3.9], [4.1]]}, saved, "0001_x", 10)  # 2x per step
    assert double.failed and double.verdict == "slower" and double.interval.lo > 1.1
    assert double.ratio == pytest.approx(2.0, rel=0.1)
    faster = compare({"steps": 10, "samples": [[0.4], [0.45], [0.42], [0.41]]}, saved, "0001_x", None)
    assert faster.verdict == "not slower" and faster.faster and not faster.failed and faster.than == 1.10
    assert faster.to_json()["verdict"] == "not slower" and faster.to_json()["faster"] is True
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
    # a reference running the kernel's own program is slowed by the kernel's regression as much: the ratio
    # to it would not move, so the times per step are compared and the basis says why
    shared = dict(loaded, reference_shares="the reference runs the same program as the kernel's step")
    own = compare(shared, saved, "0001_x", 10)
    assert own.basis == ("time per step (not relative to its reference, which would cancel the kernel's own "
                         "regressions: the reference runs the same program as the kernel's step)")
    assert own.ratio == pytest.approx(2.0) and own.failed


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


# three verdicts in the plugin ------------------------------------------------------------------

TINY = """
import jax.numpy as jnp

def test_tiny(jaxlog):
    jaxlog.benchmark(lambda x: x * 0.5, jnp.ones(8), 5, repeats=8, number=1)
"""


def _wide_saved_run(pytester, timer: str = "wall") -> None:
    """A saved run written, not measured: half its repeats took a nanosecond per step, half a second,
    so the ratio of any session's timings to it is somewhere in 10^-5..10^4: a comparison with it can
    never tell, however many repeats."""
    bench = {"name": "benchmark", "steps": 5, "samples": [[5e-9]] * 4 + [[5.0]] * 4,
             "machine": this_machine().to_json(), "timer": timer}
    save(pytester.path / "store", this_machine(), "wide", {"test_w.py::test_tiny": {"benchmarks": [bench], "costs": []}})


def test_a_comparison_that_cannot_tell_repeats_shows_it_and_fails_only_when_asked(pytester, monkeypatch):
    pytester.makepyfile(test_w=TINY)
    _wide_saved_run(pytester)
    args = ("--jaxlog-benchmark-compare=wide", "--jaxlog-benchmark-compare-fail=10")
    shown = _session(pytester, *args, "--junitxml=j.xml")
    shown.assert_outcomes(passed=1)
    [entry] = _manifest(pytester).values()
    [bench] = entry["benchmarks"]
    # 8 repeats at a time, 4 looks (each at 98.75%), none could tell: 32 repeats
    assert (bench["repeats"], bench["looks"], bench["stop_reason"]) == (32, 4, "max_repeats")
    c = bench["compare"]
    assert c["verdict"] == "cannot tell" and not c["failed"] and c["interval"][0] < 1.1 < c["interval"][1]
    assert c["coverage"] >= 0.9875 and c["detectable"] == pytest.approx(1.1 * c["ratio"] / c["interval"][0])
    shown.stdout.fnmatch_lines(["*benchmarks compared with saved run 0001_wide, failing beyond 10% slower: 0 slower, "
                                "0 not slower (0 of them faster), 1 cannot tell at x1.100; 0 not in the saved run*",
                                "*test_w.py::test_tiny * cannot tell *"])
    props = dict(re.findall(r'<property name="([^"]+)" value="([^"]*)" />', (pytester.path / "j.xml").read_text()))
    assert props["jaxlog.baseline_verdict"] == "cannot tell" and props["jaxlog.repeats"] == "32"
    assert float(props["jaxlog.baseline_detectable"]) == pytest.approx(c["detectable"], rel=1e-5)

    message = (r"E +pytest_jaxlog\.compare\.baseline\.BenchmarkRegression: \[jaxlog\] cannot tell whether benchmark "
               r"'benchmark' of test_w\.py::test_tiny is slower than saved run 0001_wide at this noise: .* which holds "
               r"the 1\.100 allowed \(--jaxlog-benchmark-compare-fail=10\); the comparison could only have detected "
               r"x[\d.e+]+ or more\. .*: --jaxlog-benchmark-inconclusive=pass$")
    failing = _session(pytester, *args, "--jaxlog-benchmark-inconclusive=fail")
    failing.assert_outcomes(failed=1)
    failing.stdout.re_match_lines([message])
    assert _manifest(pytester)["test_w.py::test_tiny"]["benchmarks"][0]["compare"]["failed"] is True
    monkeypatch.setenv("JAXLOG_BENCHMARK_INCONCLUSIVE", "fail")
    _session(pytester, *args).stdout.re_match_lines([message])
    monkeypatch.delenv("JAXLOG_BENCHMARK_INCONCLUSIVE")
    pytester.makeini("[pytest]\njaxlog_benchmark_inconclusive = fail\n")
    _session(pytester, *args).assert_outcomes(failed=1)
    _session(pytester, *args, "--jaxlog-benchmark-inconclusive=pass").assert_outcomes(passed=1)  # cli over ini
    monkeypatch.setenv("JAXLOG_BENCHMARK_INCONCLUSIVE", "maybe")
    _session(pytester, *args).stderr.fnmatch_lines(["*jaxlog benchmark_inconclusive (JAXLOG_BENCHMARK_INCONCLUSIVE="
                                                    "maybe): expected one of pass|fail, got 'maybe'"])


def test_a_saved_run_timed_by_another_timer_is_not_compared(pytester):
    pytester.makepyfile(test_w=TINY)
    _wide_saved_run(pytester, timer="cpu")
    result = _session(pytester, "--jaxlog-benchmark-compare=wide", "--jaxlog-benchmark-compare-fail=10")
    result.assert_outcomes(passed=1)
    [entry] = _manifest(pytester).values()
    assert entry["benchmarks"][0]["compare"] == {"baseline": "0001_wide", "other_timer": "cpu"}
    assert entry["benchmarks"][0]["repeats"] == 8  # nothing to wait for: the fixed repeats
    assert ("benchmark 'benchmark': timed by cpu time in saved run 0001_wide, by wall time now: not compared"
            in entry["notes"])
    result.stdout.fnmatch_lines(["*; 1 timed by another timer then (not compared)"])


SCRIPTED = """
import itertools
import jax.numpy as jnp
import pytest_jaxlog.drive.benchmark as bench

def test_wide(jaxlog, monkeypatch):
    # the clock replaced: the kernel's runs take 2 s, the reference's 1 s and 4 s in turn (ratios 2, 0.5)
    streams = iter([itertools.cycle([2.0]), itertools.cycle([1.0, 4.0])])
    monkeypatch.setattr(bench, "_timing", lambda call, timer: (lambda s=next(streams): next(s)))
    found = jaxlog.benchmark(lambda x: x * 0.5, jnp.ones(8), 5, reference=lambda: 0, repeats=8, number=1)
    assert (found.verdict, len(found.samples)) == ("cannot tell", 32)
    found.assert_not_slower()
"""


def test_assert_not_slower_fails_on_cannot_tell_only_where_asked(pytester):
    pytester.makepyfile(test_s=SCRIPTED)
    shown = pytester.runpytest("-p", "no:cacheprovider", "--junitxml=j.xml")
    shown.assert_outcomes(passed=1)
    [entry] = _manifest(pytester).values()
    [bench] = entry["benchmarks"]
    # 32 ratios alternating 2 and 0.5: any interval beyond the two smallest or largest is [0.5, 2]
    assert (bench["verdict"], bench["interval"], bench["than"]) == ("cannot tell", [0.5, 2.0], 1.1)
    assert bench["detectable"] == pytest.approx(1.1 * 1.25 / 0.5) and bench["stop_reason"] == "max_repeats"
    shown.stdout.fnmatch_lines([
        "benchmark verdicts against their references: 0 slower, 0 not slower, 1 cannot tell at this noise",
        "  cannot tell: test_s.py::test_wide: ratio 1.250, interval [[]0.500, 2.000] holds 1.1; could detect x2.75 "
        "(32 repeats, max_repeats)"])
    props = dict(re.findall(r'<property name="([^"]+)" value="([^"]*)" />', (pytester.path / "j.xml").read_text()))
    assert (props["jaxlog.verdict"], props["jaxlog.detectable"]) == ("cannot tell", "2.75")
    page = (pytester.path / ".jaxlog" / "report.html").read_text()
    assert re.search(r'benchmark: 2\.5 vs reference <span class="badge cannot-tell" [^>]*>CANNOT TELL</span>', page)

    failing = pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-benchmark-inconclusive=fail")
    failing.assert_outcomes(failed=1)
    failing.stdout.re_match_lines([
        r"E +pytest_jaxlog\.profiling\.timings\.TimingAssertionError: \[jaxlog\] cannot tell whether the kernel is "
        r"slower than 1\.1x its reference at this noise: the ratio's 9\d\.\d% interval \[0\.500, 2\.000\] holds 1\.1; "
        r".*could only have detected x2\.750 or more; .* \"cannot tell\" fails here because of "
        r"--jaxlog-benchmark-inconclusive: --jaxlog-benchmark-inconclusive=pass$"])


def test_the_flag_messages_name_is_the_plugins_option():
    from pytest_jaxlog.harness.baselines import INCONCLUSIVE, OPTIONS
    from pytest_jaxlog.profiling.speed import INCONCLUSIVE_CHOICES, INCONCLUSIVE_FLAG

    opt = OPTIONS["benchmark_inconclusive"]
    assert (opt.flag_name, opt.env, opt.ini_name) == (INCONCLUSIVE_FLAG, "JAXLOG_BENCHMARK_INCONCLUSIVE",
                                                      "jaxlog_benchmark_inconclusive")
    assert INCONCLUSIVE == INCONCLUSIVE_CHOICES == opt.choices
