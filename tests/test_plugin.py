"""The plugin shell through pytester: options, ini keys, marker validation, artifact directories, manifest,
report sections, JUnit properties, xdist and hypothesis. These tests write files by hand into
``jaxlog.dir``; runs of real kernels through the fixture are in test_plugin_run.py."""

from __future__ import annotations

import json
import os
import sys
import time
import xml.etree.ElementTree as ET

import pytest

import pytest_jaxlog.compare.golden  # noqa: F401  (numpy: imported before pytester's in-process runs snapshot sys.modules)
from pytest_jaxlog.harness.options import OPTIONS

from plugin_helpers import no_jaxlog_env  # noqa: F401  (no_jaxlog_env: an autouse fixture)

pytest_plugins = ["pytester"]



WRITE_FILE = """
import pytest

@pytest.fixture
def artifact(jaxlog):
    def write(name="data.txt", text="x"):
        p = jaxlog.dir / name
        p.write_text(text)
        return p
    return write
"""


def test_plugin_loads_without_heavy_imports():
    import subprocess

    modules = ["pytest_jaxlog.plugin"] + [f"pytest_jaxlog.harness.{m}" for m in
                                          ("options", "session", "fixture", "goldens", "report", "processes", "devices",
                                           "compile_cache", "baselines", "artifacts", "disabled")]
    code = (f"import sys, {', '.join(modules)}; "
            "print([m for m in ('jax', 'numpy', 'h5py', 'perfetto') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_shows_options_with_defaults_and_env_vars(pytester):
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(
        [
            "jaxlog: record, check and profile JAX kernels:",
            "*--jaxlog-dir=DIR*",
            "*default: .jaxlog*",
            "*--jaxlog-keep={failed,all,none}*",
            "*--jaxlog-profile=START:STOP*",
            "*--jaxlog-on-violation={raise,warn}*",
            "*--jaxlog-progress={auto,on,off}*",
            "*--jaxlog-chunk=N*",
            "*--jaxlog-compile-cache=DIR*",
            "*--jaxlog-regen*",
            "*--jaxlog-create-goldens*",
        ]
    )
    text = result.stdout.str()
    for ini in ("jaxlog_dir", "jaxlog_keep", "jaxlog_profile", "jaxlog_on_violation", "jaxlog_progress",
                "jaxlog_chunk", "jaxlog_compile_cache", "jaxlog_golden_dir"):
        assert f"{ini} (string)" in text
    assert "jaxlog_create_goldens (bool)" in text
    assert "default: failed" in text and "default: raise" in text and "default: auto" in text
    assert "fixtures/golden" in text
    # every option names its environment variable (options section and ini section)
    flat = " ".join(text.split())
    for opt in OPTIONS.values():
        assert opt.flag_name in flat and f"env: {opt.env}" in flat, opt.key
    assert {o.env for o in OPTIONS.values()} == {
        "JAXLOG_DIR", "JAXLOG_KEEP", "JAXLOG_PROFILE", "JAXLOG_ON_VIOLATION", "JAXLOG_PROGRESS", "JAXLOG_CHUNK",
        "JAXLOG_COMPILE_CACHE", "JAXLOG_REGEN", "JAXLOG_CREATE_GOLDENS", "JAXLOG_GOLDEN_REVIEW",
        "JAXLOG_CLEAN_STALE"}


def test_marker_registered(pytester):
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.jaxlog(profile=(start, stop), keep=*"])


def test_ini_keys_and_precedence(pytester):
    pytester.makeini(
        """
        [pytest]
        jaxlog_dir = custom-artifacts
        jaxlog_keep = all
        jaxlog_profile = 3:5
        jaxlog_on_violation = warn
        jaxlog_progress = off
        jaxlog_chunk = 16
        jaxlog_golden_dir = gold
        """
    )
    pytester.makepyfile(
        """
        import os, pathlib

        def test_settings(jaxlog, request):
            s = jaxlog.settings
            expected = os.environ["EXPECT"].split("|")
            assert [s.keep, str(s.profile), s.on_violation, str(s.progress), str(s.chunk)] == expected
            assert jaxlog.dir.parent.name == os.environ["EXPECT_DIR"]
            assert jaxlog.dir.is_dir()
            assert jaxlog._session.golden_dir == pathlib.Path(str(request.config.rootpath)) / "gold"
        """
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EXPECT", "all|(3, 5)|warn|False|16")
        mp.setenv("EXPECT_DIR", "custom-artifacts")
        pytester.runpytest().assert_outcomes(passed=1)
        # command line beats ini
        mp.setenv("EXPECT", "none|(1, 2)|raise|True|None")
        mp.setenv("EXPECT_DIR", "cli-dir")
        result = pytester.runpytest(
            "--jaxlog-keep=none", "--jaxlog-profile=1:2", "--jaxlog-on-violation=raise",
            "--jaxlog-progress=on", "--jaxlog-chunk=auto", "--jaxlog-dir=cli-dir",
        )
        result.assert_outcomes(passed=1)
        # env JAXLOG_DIR beats ini, the option beats env
        mp.setenv("EXPECT", "all|(3, 5)|warn|False|16")
        mp.setenv("EXPECT_DIR", "env-dir")
        mp.setenv("JAXLOG_DIR", "env-dir")
        pytester.runpytest().assert_outcomes(passed=1)


@pytest.mark.parametrize(
    "args, ini, message",
    [
        ((), "jaxlog_keep = sometimes", "*jaxlog keep*expected one of failed|all|none, got 'sometimes'*"),
        ((), "jaxlog_profile = 5", "*jaxlog profile*expected START:STOP*got '5'*"),
        (("--jaxlog-profile=9:2",), "", "*jaxlog profile*need 0 <= START <= STOP, got 9:2*"),
        (("--jaxlog-chunk=0",), "", "*jaxlog chunk*expected a positive number of steps*"),
        (("--jaxlog-dir=tox.ini",), "", "*jaxlog dir*tox.ini is a file, not a directory*"),
    ],
)
def test_bad_option_values_are_usage_errors(pytester, args, ini, message):
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile("def test_a(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_marker_validation(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.jaxlog(keep="sometimes")
        def test_bad_keep(jaxlog): pass

        @pytest.mark.jaxlog(profile=(5, 2))
        def test_bad_profile(jaxlog): pass

        @pytest.mark.jaxlog(profile="x")
        def test_bad_profile_type(): pass

        @pytest.mark.jaxlog(chunk=-1)
        def test_bad_chunk(jaxlog): pass

        @pytest.mark.jaxlog(on_violation="ignore")
        def test_bad_policy(jaxlog): pass

        @pytest.mark.jaxlog(frobnicate=1)
        def test_unknown(jaxlog): pass

        @pytest.mark.jaxlog((1, 2))
        def test_positional(jaxlog): pass

        @pytest.mark.jaxlog(profile=(2, 4), keep="all", on_violation="record", chunk=8, progress="off")
        def test_good(jaxlog):
            s = jaxlog.settings
            assert (s.profile, s.keep, s.on_violation, s.chunk, s.progress) == ((2, 4), "all", "record", 8, False)

        @pytest.mark.jaxlog(keep="none")
        class TestClass:
            @pytest.mark.jaxlog(chunk=4)
            def test_merged(self, jaxlog):
                assert (jaxlog.settings.keep, jaxlog.settings.chunk) == ("none", 4)
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2, errors=7)
    result.stdout.fnmatch_lines_random(
        [
            "*test_bad_keep: @pytest.mark.jaxlog(keep=...): expected one of failed|all|none, got 'sometimes'*",
            "*test_bad_profile: @pytest.mark.jaxlog(profile=...): need 0 <= START <= STOP, got 5:2*",
            "*test_bad_profile_type: @pytest.mark.jaxlog(profile=...): expected START:STOP*",
            "*test_bad_chunk: @pytest.mark.jaxlog(chunk=...): expected a positive number of steps*",
            "*test_bad_policy: @pytest.mark.jaxlog(on_violation=...): expected one of raise|warn|record*",
            "*test_unknown: @pytest.mark.jaxlog got unknown argument 'frobnicate'*",
            "*test_positional: @pytest.mark.jaxlog takes keyword arguments only*",
        ]
    )
    # each error says it once: not chained to the JaxlogError it came from ("During handling ...")
    assert "During handling of the above exception" not in result.stdout.str()


DISABLED = """
import pytest

def test_uses(jaxlog): pass

def test_uses_factory(jaxlog_factory): pass

@pytest.mark.parametrize("i", [1, 2])
def test_param(jaxlog, i): pass

def test_plain(): pass
"""


def _notice_plugin() -> list[str]:
    """``-p`` for the notice plugin unless the installed package already registers its entry point."""
    from importlib.metadata import entry_points

    installed = any(ep.name == "jaxlog_disabled" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "pytest_jaxlog.harness.disabled"]


def test_disabled_with_no_jaxlog_is_one_line(pytester):
    """``-p no:jaxlog``: the jaxlog_disabled plugin (its own entry point, so not blocked with jaxlog) skips the
    tests that need jaxlog's fixtures with one reason and says once that jaxlog is disabled."""
    pytester.makepyfile(test_d=DISABLED)
    result = pytester.runpytest("-p", "no:jaxlog", *_notice_plugin(), "-rs")
    result.assert_outcomes(passed=1, skipped=4)
    text = result.stdout.str()
    assert "fixture 'jaxlog' not found" not in text and "available fixtures" not in text
    result.stdout.fnmatch_lines(["jaxlog: the jaxlog plugin is disabled (-p no:jaxlog); skipped 4 tests that use its fixtures"])
    # -rs folds the skips by file (decorated tests by line): one reason, not a fixture error per test
    skips = [ln for ln in text.splitlines() if ln.startswith("SKIPPED")]
    assert skips and all(ln.endswith("[jaxlog] the jaxlog plugin is disabled (-p no:jaxlog): this test uses its fixtures")
                         for ln in skips)
    assert sum(int(ln.split("[")[1].split("]")[0]) for ln in skips) == 4
    assert not (pytester.path / ".jaxlog").exists()
    assert "jaxlog: dir=" not in text  # no header, no manifest: the plugin did not load

    # with the plugin active the notice plugin does nothing
    pytester.makeconftest("")
    result = pytester.runpytest(*_notice_plugin())
    result.assert_outcomes(passed=5)
    assert "plugin is disabled" not in result.stdout.str()

    # a user's own `jaxlog` fixture is not ours to skip
    pytester.makeconftest("import pytest\n\n@pytest.fixture\ndef jaxlog():\n    return 'mine'\n")
    result = pytester.runpytest("-p", "no:jaxlog", *_notice_plugin())
    result.assert_outcomes(passed=4, skipped=1)  # test_uses_factory still needs the plugin
    result.stdout.fnmatch_lines(["jaxlog: the jaxlog plugin is disabled (-p no:jaxlog); skipped 1 test that use*"])


def test_disabled_notice_through_the_entry_points_and_xdist(pytester, tmp_path):
    """The entry points pyproject.toml declares, found the way an installed package's are (a dist-info on
    sys.path), in a subprocess with xdist: the workers skip, the controller prints the one line."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    eps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    assert eps["jaxlog_disabled"] == "pytest_jaxlog.harness.disabled"
    dist = tmp_path / "site" / "jaxlog_entry_points-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: jaxlog-entry-points\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    pytester.makepyfile(test_d=DISABLED)
    env_path = os.pathsep.join([str(tmp_path / "site"), str(root), os.environ.get("PYTHONPATH", "")])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", env_path)
        result = pytester.runpytest_subprocess("-p", "no:jaxlog", "-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=1, skipped=4)
    result.stdout.fnmatch_lines(["jaxlog: the jaxlog plugin is disabled (-p no:jaxlog); skipped 4 tests that use its fixtures"])
    assert "fixture 'jaxlog' not found" not in result.stdout.str()


def _outcome_suite(pytester):
    pytester.makeconftest(WRITE_FILE)
    pytester.makepyfile(
        test_outcomes="""
        import pytest

        def test_pass(artifact):
            artifact()

        def test_fail(artifact):
            artifact()
            assert 1 == 2, "boom"

        @pytest.mark.xfail(strict=True)
        def test_xfail(artifact):
            artifact()
            assert False

        @pytest.mark.parametrize("p", ["a/b::c d", "a_b__c_d", "long"], ids=["a/b::c d", "a_b__c_d", "x" * 300])
        def test_param(artifact, p):
            artifact(text=p)

        def test_no_jaxlog():
            pass
        """
    )


def _manifest(path):
    doc = json.loads((path / "manifest.json").read_text())
    return {e["nodeid"].split("::", 1)[1]: e for e in doc["tests"]}, doc


def test_artifacts_kept_per_outcome_with_manifest_sections_and_junit(pytester):
    _outcome_suite(pytester)
    result = pytester.runpytest("--junitxml=out.xml")
    result.assert_outcomes(passed=5, failed=1, xfailed=1)
    base = pytester.path / ".jaxlog"
    tests, doc = _manifest(base)
    assert doc["settings"]["keep"] == "failed"
    assert set(tests) == {"test_pass", "test_fail", "test_xfail", "test_param[a/b::c d]", "test_param[a_b__c_d]",
                          f"test_param[{'x' * 300}]"}
    assert tests["test_pass"]["outcome"] == "passed" and not tests["test_pass"]["kept"]
    assert tests["test_fail"]["outcome"] == "failed" and tests["test_fail"]["kept"]
    assert tests["test_xfail"]["outcome"] == "xfailed" and tests["test_xfail"]["kept"]
    kept = sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith(".trash-"))  # being deleted
    assert kept == sorted([tests["test_fail"]["dir"], tests["test_xfail"]["dir"]])
    assert (base / tests["test_fail"]["dir"] / "data.txt").read_text() == "x"
    # the failing test's report has a jaxlog section naming its directory
    result.stdout.fnmatch_lines(["*- jaxlog -*", f"artifacts: .jaxlog/{tests['test_fail']['dir']}", "compiles: 0"])
    # the terminal summary lists kept artifacts
    result.stdout.fnmatch_lines(
        ["*- jaxlog -*", "artifacts kept for 2 of 6 jaxlog tests in .jaxlog (--jaxlog-keep=failed)*",
         "*FAILED*test_outcomes.py::test_fail -> .jaxlog/*"]
    )
    # JUnit properties
    root = ET.parse(pytester.path / "out.xml").getroot()
    props = {}
    for case in root.iter("testcase"):
        props[case.get("name")] = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["test_fail"]["jaxlog.compiles"] == "0"
    assert props["test_fail"]["jaxlog.dir"] == f".jaxlog/{tests['test_fail']['dir']}"
    assert "jaxlog.dir" not in props["test_pass"]
    assert "test_no_jaxlog" in props and props["test_no_jaxlog"] == {}


def test_artifact_dirs_keep_all_and_none(pytester):
    _outcome_suite(pytester)
    pytester.runpytest("--jaxlog-keep=all").assert_outcomes(passed=5, failed=1, xfailed=1)
    base = pytester.path / ".jaxlog"
    tests, _ = _manifest(base)
    dirs = [e["dir"] for e in tests.values()]
    assert all(e["kept"] for e in tests.values()) and len(set(dirs)) == 6
    assert all(len(d) <= 120 and "/" not in d and " " not in d for d in dirs)
    texts = {(base / e["dir"] / "data.txt").read_text() for k, e in tests.items() if k.startswith("test_param")}
    assert texts == {"a/b::c d", "a_b__c_d", "long"}

    pytester.runpytest("--jaxlog-keep=none").assert_outcomes(passed=5, failed=1, xfailed=1)
    tests, _ = _manifest(base)
    assert not any(e["kept"] for e in tests.values())
    # the discarded directories went to a trash folder at once, deleted after the session by an
    # ``rm`` it does not wait for
    assert sorted(p.name for p in base.iterdir() if not p.name.startswith(".trash-")) == ["manifest.json"]
    deadline = time.monotonic() + 60
    while any(p.name.startswith(".trash-") for p in base.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(p.name for p in base.iterdir()) == ["manifest.json"]


def test_xdist_many_tests_one_complete_manifest(pytester):
    pytester.makeconftest(WRITE_FILE)
    pytester.makepyfile(
        test_many="""
        import os, pytest

        @pytest.mark.parametrize("i", range(24))
        def test_write(artifact, i):
            artifact(text=f"{i} {os.environ.get('PYTEST_XDIST_WORKER')}")
            assert i % 7 != 3
        """
    )
    result = pytester.runpytest_subprocess("-n", "2", "--jaxlog-keep=all", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=21, failed=3)
    base = pytester.path / ".jaxlog"
    tests, doc = _manifest(base)
    assert len(tests) == 24
    workers = set()
    for i in range(24):
        e = tests[f"test_write[{i}]"]
        assert e["outcome"] == ("failed" if i % 7 == 3 else "passed")
        text = (base / e["dir"] / "data.txt").read_text()
        n, worker = text.split()
        assert int(n) == i and worker == e["worker"]
        workers.add(worker)
    assert workers == {"gw0", "gw1"}
    assert len({e["dir"] for e in tests.values()}) == 24
    result.stdout.fnmatch_lines(["*artifacts kept for 24 of 24 jaxlog tests*"])


def test_hypothesis_factory_keeps_the_failing_example(pytester):
    pytester.makepyfile(
        """
        from hypothesis import given, settings, strategies as st

        @settings(max_examples=40, database=None, derandomize=True)
        @given(st.integers(0, 1000))
        def test_fails_from_5(jaxlog_factory, x):
            with jaxlog_factory() as jaxlog:
                (jaxlog.dir / "x.txt").write_text(str(x))
                assert x < 5

        @settings(max_examples=40, database=None, derandomize=True)
        @given(st.integers(0, 1000))
        def test_fails_after_the_block(jaxlog_factory, x):
            with jaxlog_factory() as jaxlog:
                (jaxlog.dir / "x.txt").write_text(str(x))
            assert x < 5  # checks on the run after `with`: the example still counts as failing

        @settings(max_examples=3, database=None)
        @given(st.integers(0, 10))
        def test_function_fixture(jaxlog, x):  # hypothesis' health check fails it; the section says what to use
            pass

        @settings(max_examples=10, database=None)
        @given(st.integers(0, 10))
        def test_passes(jaxlog_factory, x):
            with jaxlog_factory() as jaxlog:
                (jaxlog.dir / "x.txt").write_text(str(x))
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=3)
    result.stdout.fnmatch_lines(["*_ test_function_fixture _*", "*FailedHealthCheck*", "*- jaxlog -*",
                                 "hint: in @given tests use the jaxlog_factory fixture, `with jaxlog_factory() as jaxlog:`*"])
    assert "function-scoped fixture 'jaxlog_factory'" not in result.stdout.str()  # the factory passes the check
    base = pytester.path / ".jaxlog"
    tests, _ = _manifest(base)
    assert not tests["test_passes"]["kept"] and tests["test_passes"]["examples"] >= 1
    for name in ("test_fails_from_5", "test_fails_after_the_block"):
        failing = tests[name]
        assert failing["kept"] and failing["examples"] > 1
        examples = list((base / failing["dir"]).iterdir())
        assert len(examples) == 1, (name, examples)  # only the final (minimal) failing example
        assert (examples[0] / "x.txt").read_text() == "5"


def test_user_conftest_xla_flags_take_effect(pytester):
    pytester.makeconftest(
        """
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
        os.environ["JAX_PLATFORMS"] = "cpu"
        """
    )
    pytester.makepyfile(
        """
        def test_devices(jaxlog):
            import jax
            assert jax.device_count() == 4
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_option_names_in_messages_come_from_the_options_table():
    """golden.py sits below the pytest side and cannot import the table; its one spelling of the
    regen flag is kept equal to the table's here."""
    from pytest_jaxlog.compare import golden
    from pytest_jaxlog.harness import goldens
    from pytest_jaxlog.harness.options import OPTIONS

    assert golden.REGEN_FLAG == goldens.REGEN_FLAG == OPTIONS["regen"].flag_name == "--jaxlog-regen"
    assert goldens.CREATE_FLAG == OPTIONS["create_goldens"].flag_name == "--jaxlog-create-goldens"
    assert golden.regen_hint("g.h5").startswith(f"run pytest with {OPTIONS['regen'].flag_name} to regenerate")
