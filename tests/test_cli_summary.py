"""``python -m pytest_jaxlog summary``: what a CI log or job summary shows from the plugin's manifests, and that
it never fails the job by itself (nothing found, unreadable manifests)."""

from __future__ import annotations

import json
import subprocess
import sys

from pytest_jaxlog.__main__ import main

MANIFEST = {
    "version": 2,
    "paths": "relative to the directory of this file",
    "exitstatus": 1,
    "settings": {"keep": "failed"},
    "tests": [
        {"nodeid": "t.py::test_ok", "outcome": "passed", "kept": False, "artifacts": {}, "runs": [], "goldens": [
            {"path": "../../fixtures/golden/t.test_ok.h5", "status": "created"}]},
        {"nodeid": "t.py::test_bad", "outcome": "failed", "kept": True, "dir": "t.test_bad",
         "artifacts": {"trajectory": "t.test_bad/trajectory.h5", "timeline": "t.test_bad/trajectory.pftrace"},
         "violations": [{"message": "[jaxlog] invariant finite(x) violated at step 3: value nan\n  more"}],
         "runs": [{"name": "trajectory", "steps": 100, "wall_s": 0.5, "steps_per_s": 2000.0, "compiles": 1}],
         "goldens": []},
        {"nodeid": "t.py::test_setup", "outcome": "error", "kept": False, "error": "RuntimeError: setup broke",
         "artifacts": {}, "runs": [], "goldens": []},
    ],
    "stale": [{"nodeid": "t.py::test_gone", "dir": "t.test_gone", "outcome": "failed"}],
}


def test_summary_text_and_markdown(tmp_path, capsys, monkeypatch):
    base = tmp_path / ".jaxlog" / "tests"
    base.mkdir(parents=True)
    (base / "manifest.json").write_text(json.dumps(MANIFEST))
    monkeypatch.chdir(tmp_path)
    assert main(["summary", ".jaxlog"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["jaxlog: .jaxlog/tests",
                       "3 jaxlog tests, 2 not passed, artifacts kept for 1 (keep=failed); exit status 1"]
    assert out[2:10] == [
        "  FAILED t.py::test_bad",
        "      violation: [jaxlog] invariant finite(x) violated at step 3: value nan",
        "      run trajectory: 100 steps in 0.5 s, 2000 steps/s, 1 compile",
        "      timeline: .jaxlog/tests/t.test_bad/trajectory.pftrace",
        "      trajectory: .jaxlog/tests/t.test_bad/trajectory.h5",
        "  ERROR t.py::test_setup",
        "      error: RuntimeError: setup broke",
        "  created golden: fixtures/golden/t.test_ok.h5",  # manifest paths, seen from the working directory
    ]
    assert out[10] == "  1 artifact directories from an earlier session (stale), e.g. .jaxlog/tests/t.test_gone"
    assert "ui.perfetto.dev" in out[-1]

    assert main(["summary", str(base / "manifest.json"), "--markdown"]) == 0
    md = capsys.readouterr().out
    assert f"### jaxlog: {base}" in md and "- FAILED `t.py::test_bad`" in md
    assert f"  - trajectory: `{base / 't.test_bad/trajectory.h5'}`" in md


def test_summary_never_fails_the_job_but_a_malformed_manifest_does(tmp_path, capsys):
    assert main(["summary", str(tmp_path / "nowhere")]) == 0
    assert "no manifest.json found" in capsys.readouterr().out
    (tmp_path / "manifest.json").write_text("{not json")  # what it says cannot be trusted: exit 2, one line
    assert main(["summary", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("[jaxlog] skipping malformed manifest") and len(captured.err.splitlines()) == 1
    assert captured.out == ""


def test_summary_is_a_subcommand_of_the_package_cli():
    r = subprocess.run([sys.executable, "-m", "pytest_jaxlog", "summary", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "--markdown" in r.stdout and "never fails a CI job" in " ".join(r.stdout.split())
