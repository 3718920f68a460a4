"""Options from the environment: every ``--jaxlog-*`` option reads ``JAXLOG_*``, with command line >
environment > ini > default, checked by what the session does (directories kept, runs profiled, violations
warned, goldens written), not only by the parsed values."""

from __future__ import annotations

import json
from pathlib import Path

import h5py  # noqa: F401  (imported before pytester's inline runs snapshot sys.modules)
import jax.numpy  # noqa: F401
import pytest

import pytest_jaxlog as jl

for _name in jl.__all__:  # every jaxlog module loaded now, so classes stay the same objects across inline runs
    getattr(jl, _name)

from plugin_helpers import KERNEL as BASE, no_jaxlog_env  # noqa: E402,F401  (no_jaxlog_env: an autouse fixture)

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]




FILES = """
def test_pass(jaxlog):
    (jaxlog.dir / "data.txt").write_text("pass")

def test_fail(jaxlog):
    (jaxlog.dir / "data.txt").write_text("fail")
    assert False
"""


def _kept(base: Path) -> list[str]:
    doc = json.loads((base / "manifest.json").read_text())
    return sorted(t["nodeid"].split("::")[1] for t in doc["tests"] if t["kept"])


def test_keep_and_dir_from_the_environment_with_precedence(pytester, monkeypatch):
    pytester.makepyfile(test_f=FILES)
    pytester.makeini("[pytest]\njaxlog_keep = none\njaxlog_dir = ini-dir\n")

    # ini alone: keep=none into ini-dir
    pytester.runpytest().assert_outcomes(passed=1, failed=1)
    assert _kept(pytester.path / "ini-dir") == []

    # the environment beats the ini file: JAXLOG_KEEP=all keeps the passing test's files too
    monkeypatch.setenv("JAXLOG_KEEP", "all")
    monkeypatch.setenv("JAXLOG_DIR", "env-dir")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    base = pytester.path / "env-dir"
    assert _kept(base) == ["test_fail", "test_pass"]
    assert (base / "test_f.test_pass" / "data.txt").read_text() == "pass"
    result.stdout.fnmatch_lines(["jaxlog: dir=env-dir keep=all *", "artifacts kept for 2 of 2 jaxlog tests in env-dir*"])

    # the command line beats the environment
    result = pytester.runpytest("--jaxlog-keep=failed", "--jaxlog-dir=cli-dir")
    result.assert_outcomes(passed=1, failed=1)
    assert _kept(pytester.path / "cli-dir") == ["test_fail"]
    assert not (pytester.path / "cli-dir" / "test_f.test_pass").exists()

    # an empty variable (what CI expands an undefined one to) counts as unset: the ini applies
    monkeypatch.setenv("JAXLOG_KEEP", "")
    pytester.runpytest().assert_outcomes(passed=1, failed=1)
    assert _kept(base) == []


def test_example_suite_conftest_yields_to_jaxlog_keep(pytester, monkeypatch):
    """examples/conftest.py keeps everything by default, but JAXLOG_KEEP (as docs/plugin-and-ci.md tells CI to set) wins."""
    pytester.makeconftest((ROOT / "examples" / "conftest.py").read_text())
    pytester.makepyfile(test_f=FILES)
    pytester.runpytest().assert_outcomes(passed=1, failed=1)
    assert _kept(pytester.path / ".jaxlog") == ["test_fail", "test_pass"]
    monkeypatch.setenv("JAXLOG_KEEP", "failed")
    pytester.runpytest().assert_outcomes(passed=1, failed=1)
    assert _kept(pytester.path / ".jaxlog") == ["test_fail"]


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("JAXLOG_KEEP", "sometimes", "*jaxlog keep (JAXLOG_KEEP=sometimes): expected one of failed|all|none*"),
        ("JAXLOG_PROFILE", "9:2", "*jaxlog profile (JAXLOG_PROFILE=9:2): need 0 <= START <= STOP, got 9:2*"),
        ("JAXLOG_CHUNK", "-3", "*jaxlog chunk (JAXLOG_CHUNK=-3): expected a positive number of steps or auto*"),
        ("JAXLOG_ON_VIOLATION", "ignore", "*jaxlog on_violation (JAXLOG_ON_VIOLATION=ignore): expected one of raise|warn*"),
        ("JAXLOG_PROGRESS", "loud", "*jaxlog progress (JAXLOG_PROGRESS=loud): expected one of auto|on|off*"),
        ("JAXLOG_REGEN", "maybe", "*jaxlog regen (JAXLOG_REGEN=maybe): expected 1/0, true/false, yes/no or on/off*"),
        ("JAXLOG_CREATE_GOLDENS", "2", "*jaxlog create_goldens (JAXLOG_CREATE_GOLDENS=2): expected 1/0*"),
        ("JAXLOG_DIR", "tox.ini", "*jaxlog dir (--jaxlog-dir / JAXLOG_DIR / jaxlog_dir): *tox.ini is a file*"),
    ],
)
def test_bad_environment_values_name_the_variable(pytester, monkeypatch, name, value, message):
    pytester.makeini("[pytest]\n")
    pytester.makepyfile("def test_a(jaxlog): pass")  # a session that uses jaxlog (test_plugin_quiet: one that does not)
    monkeypatch.setenv(name, value)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    # the command line wins over a bad variable
    good = {"JAXLOG_KEEP": "all", "JAXLOG_PROFILE": "1:2", "JAXLOG_CHUNK": "4", "JAXLOG_ON_VIOLATION": "warn",
            "JAXLOG_PROGRESS": "off", "JAXLOG_DIR": "out"}
    flag = "--" + name.lower().replace("_", "-")
    pytester.runpytest(f"{flag}={good[name]}" if name in good else flag).assert_outcomes(passed=1)


KERNEL = BASE + """
def test_profiled_and_chunked(jaxlog):
    run = jaxlog.run(rotate, STATE, 12, record={"energy": energy})
    assert len(run.timings.window) == 3 and sorted(jl.load_trace(jaxlog.artifacts["jax_trace"]).steps()) == [2, 3, 4]
    assert run.chunk == 4 and jaxlog.settings.progress is False

def test_violation(jaxlog):
    run = jaxlog.run(explode, STATE, 10, record={"energy": energy}, invariants=[jl.conserved("energy", rtol=0.1)])
    assert run.violation is not None and run.violation.step == 1

def test_golden(jaxlog):
    run = jaxlog.run(rotate, STATE, 5, record={"energy": energy})
    assert jaxlog.check_golden(run) == __import__("os").environ["EXPECT_GOLDEN"]
"""


def test_run_options_and_golden_flags_from_the_environment(pytester, monkeypatch):
    pytester.makepyfile(test_k=KERNEL)
    monkeypatch.setenv("JAXLOG_PROFILE", "2:4")
    monkeypatch.setenv("JAXLOG_CHUNK", "4")
    monkeypatch.setenv("JAXLOG_PROGRESS", "off")
    monkeypatch.setenv("JAXLOG_ON_VIOLATION", "warn")
    monkeypatch.setenv("JAXLOG_CREATE_GOLDENS", "1")
    monkeypatch.setenv("EXPECT_GOLDEN", "created")
    golden = pytester.path / "fixtures/golden/test_k.test_golden.h5"
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)  # the violation only warns (JAXLOG_ON_VIOLATION=warn)
    result.stdout.fnmatch_lines(["*JaxlogRuntimeWarning: [[]jaxlog] invariant conserved(energy*",
                                 "*created missing golden fixtures/golden/test_k.test_golden.h5 (--jaxlog-create-goldens)*"])
    assert golden.exists()

    # JAXLOG_REGEN rewrites it; the command line's --jaxlog-on-violation=raise beats JAXLOG_ON_VIOLATION=warn
    monkeypatch.delenv("JAXLOG_CREATE_GOLDENS")
    monkeypatch.setenv("JAXLOG_REGEN", "yes")
    monkeypatch.setenv("EXPECT_GOLDEN", "regenerated")
    before = golden.stat().st_mtime_ns
    result = pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-on-violation=raise")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*regenerated 1 golden trajectories (--jaxlog-regen):*"])
    assert golden.stat().st_mtime_ns != before

    monkeypatch.setenv("JAXLOG_REGEN", "0")
    monkeypatch.setenv("EXPECT_GOLDEN", "ok")
    pytester.runpytest("-p", "no:cacheprovider", "-k", "golden").assert_outcomes(passed=1)
