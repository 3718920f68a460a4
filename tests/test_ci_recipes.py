"""The CI recipes in ci/: valid YAML, the README's commands, artifacts on failure and success,
and (through pytester) that the flags they pass produce JUnit jaxlog properties and a manifest."""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
GITHUB = ROOT / "ci" / "github-actions.yml"
GITLAB = ROOT / "ci" / "gitlab-ci.yml"
pytest_plugins = ["pytester"]

# Import what the inline pytester runs use before they start: pytester drops modules first imported
# during a run, and jaxlib/h5py cannot be imported a second time in one process.
import h5py  # noqa: E402,F401
import jax.numpy  # noqa: E402,F401
from pytest_jaxlog import _hdf5, _perfetto, _run, _trajectory  # noqa: E402,F401


def readme_commands() -> list[tuple[str, str]]:
    """(install, pytest invocation) for each README line ``python3 -m venv ... && .venv/bin/pytest ...``."""
    out = []
    for line in (ROOT / "README.md").read_text().splitlines():
        line = line.strip()
        if line.startswith("python3 -m venv") and "&& .venv/bin/pytest" in line:
            install, _, test = line.partition(" && .venv/bin/pytest")
            out.append((install, ".venv/bin/pytest" + test))
    assert out, "README.md gives no 'python3 -m venv ... && .venv/bin/pytest ...' command"
    return out


def github() -> dict:
    doc = yaml.safe_load(GITHUB.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    return doc


def github_runs() -> list[str]:
    return [s["run"] for s in github()["jobs"]["test"]["steps"] if "run" in s]


def gitlab_commands() -> list[str]:
    doc = yaml.safe_load(GITLAB.read_text())
    cmds = []
    for job in doc.values():
        if isinstance(job, dict):
            cmds += [c for k in ("before_script", "script") for c in job.get(k, [])]
    return cmds


@pytest.mark.parametrize("commands", [github_runs, gitlab_commands], ids=["github", "gitlab"])
def test_recipes_use_the_readme_commands_with_junit_and_jaxlog_dir(commands):
    cmds = commands()
    for install, test in readme_commands():
        assert install in cmds, f"install command {install!r} missing"
        runs = [c for c in cmds if c.startswith(test + " ")]
        assert len(runs) == 1, f"no step runs {test!r}"
        (run,) = runs
        assert re.search(r"--junitxml=reports/\w+\.xml", run) and "--jaxlog-dir=.jaxlog/" in run
        assert '--jaxlog-keep="$JAXLOG_KEEP"' in run
    dirs = [re.search(r"--jaxlog-dir=(\S+)", c).group(1) for c in cmds if "--jaxlog-dir" in c]
    assert len(set(dirs)) == len(dirs), "each pytest session needs its own --jaxlog-dir (one manifest each)"


def test_github_workflow_uploads_on_failure_and_success_with_unique_names():
    doc = github()
    assert {"push", "pull_request", "workflow_dispatch"} <= set(doc["on"])
    job = doc["jobs"]["test"]
    matrix = job["strategy"]["matrix"]
    assert matrix["python-version"] and matrix["os"] and job["strategy"]["fail-fast"] is False
    assert "failed" in job["env"]["JAXLOG_KEEP"]
    steps = job["steps"]
    (upload,) = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert upload["uses"] == "actions/upload-artifact@v4"
    assert upload["if"] == "${{ !cancelled() }}"
    name = upload["with"]["name"]
    assert "${{ matrix.python-version }}" in name and "${{ matrix.os }}" in name
    paths = upload["with"]["path"].split()
    assert ".jaxlog/" in paths and "reports/" in paths
    # the test suite step runs even after the example suite failed
    (suite,) = [s for s in steps if s.get("run", "").startswith(".venv/bin/pytest -n 2")]
    assert "!cancelled()" in suite["if"]


def test_gitlab_job_keeps_artifacts_always_with_junit_reports():
    doc = yaml.safe_load(GITLAB.read_text())
    template = doc[".jaxlog-job"]
    art = template["artifacts"]
    assert art["when"] == "always"
    assert art["reports"]["junit"] == "reports/*.xml"
    assert ".jaxlog/" in art["paths"] and "reports/" in art["paths"]
    assert "$CI_JOB_NAME_SLUG" in art["name"]  # unique per job and matrix entry
    jobs = [k for k, v in doc.items() if isinstance(v, dict) and v.get("extends") == ".jaxlog-job"]
    assert sorted(jobs) == ["jaxlog-examples", "jaxlog-tests"]
    assert doc["variables"]["JAXLOG_KEEP"] == "failed"


def test_ci_flags_give_junit_properties_manifest_and_summary(pytester):
    """What the recipes upload, produced with their flags: a failing and a passing jaxlog test."""
    pytester.makepyfile(
        test_k="""
        import jax.numpy as jnp

        def decay(x):
            return x * 0.5

        def test_ok(jaxlog):
            jaxlog.run(decay, jnp.ones(3), 5, record={"x": lambda x: x})

        def test_bad(jaxlog):
            run = jaxlog.run(decay, jnp.ones(3), 5, record={"x": lambda x: x})
            assert float(run.state[0]) == 1.0
        """
    )
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--junitxml=reports/tests.xml", "--jaxlog-dir=.jaxlog/tests", "--jaxlog-keep=failed"
    )
    result.assert_outcomes(passed=1, failed=1)
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "reports/tests.xml").getroot().iter("testcase")}
    props = {n: {p.get("name"): p.get("value") for p in c.iter("property")} for n, c in cases.items()}
    assert props["test_bad"]["jaxlog.trajectory"].startswith(".jaxlog/tests/")
    assert props["test_bad"]["jaxlog.trajectory"].endswith("trajectory.h5")
    assert "jaxlog.trace" in props["test_bad"] and "jaxlog.compiles" in props["test_ok"]
    manifest = pytester.path / ".jaxlog/tests/manifest.json"
    assert manifest.exists()
    (traj,) = (pytester.path / ".jaxlog/tests").rglob("trajectory.h5")  # only the failing test kept its files

    r = subprocess.run([sys.executable, str(ROOT / "ci/jaxlog_summary.py"), ".jaxlog", "--markdown"],
                       capture_output=True, text=True, cwd=pytester.path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "2 jaxlog tests, 1 not passed, artifacts kept for 1 (keep=failed)" in r.stdout
    assert "- FAILED `test_k.py::test_bad`" in r.stdout and "test_ok" not in r.stdout
    assert f"`.jaxlog/tests/{traj.relative_to(pytester.path / '.jaxlog/tests')}`" in r.stdout
    assert "https://ui.perfetto.dev" in r.stdout
    # and with nothing to summarise it says so, without failing the CI step
    r = subprocess.run([sys.executable, str(ROOT / "ci/jaxlog_summary.py"), "nowhere"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "no manifest.json found" in r.stdout
