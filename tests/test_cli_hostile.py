"""The command line on hostile manifests and files: one line per problem, the promised exit
status, and no control character from a file or manifest reaching the terminal raw."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp

import pytest_jaxlog as jl

REPO = Path(__file__).resolve().parents[1]
ESC = "\x1b]0;pwned\x07\x1b[2J\x1b[31m"
RAW = [chr(c) for c in range(32) if chr(c) != "\n"] + ["\x7f", "\x9b", "\u202e"]

HOSTILE = {
    "tests-not-list": {"tests": 7},
    "nodeid-int": {"tests": [{"nodeid": 3, "outcome": "failed"}, {"nodeid": "a", "outcome": "failed"}]},
    "violations-int": {"tests": [{"nodeid": "t", "outcome": "failed", "violations": 5}]},
    "message-list": {"tests": [{"nodeid": "t", "outcome": "failed", "violations": [{"message": [1]}]}]},
    "artifacts-list": {"tests": [{"nodeid": "t", "outcome": "failed", "artifacts": [1, 2]}]},
    "artifact-path-int": {"tests": [{"nodeid": "t", "outcome": "failed", "artifacts": {"trajectory": 5}}]},
    "goldens-strs": {"tests": [{"nodeid": "t", "outcome": "failed", "goldens": ["x"]}]},
    "golden-path-int": {"tests": [{"nodeid": "t", "goldens": [{"status": "created", "path": 1}]}]},
    "stale-dir-int": {"stale": [{"dir": 5}]},
    "runs-bad": {"tests": [{"nodeid": "t", "outcome": "failed", "runs": [{"steps_per_s": "x", "wall_s": [1]}]}]},
    "escapes": {"version": 2, "exitstatus": 1, "settings": {"keep": ESC},
                "tests": [{"nodeid": "t" + ESC, "outcome": "failed" + ESC, "error": ESC,
                           "violations": [{"message": ESC}, ESC], "artifacts": {ESC: ESC},
                           "goldens": [{"status": "created", "path": ESC}]}]},
}


def _cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "pytest_jaxlog", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def _no_raw_controls(text: str) -> None:
    bad = sorted({hex(ord(c)) for c in text if c in RAW})
    assert not bad, f"raw control characters printed: {bad}"


def test_summary_of_hostile_manifests_exits_2_with_one_line_each_and_no_escapes(tmp_path):
    for name, doc in HOSTILE.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text(json.dumps({"version": 2, **doc}))
    (tmp_path / "not-json").mkdir()
    (tmp_path / "not-json" / "manifest.json").write_bytes(b"\x1b[31m{")
    r = _cli("summary", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2, r.stderr  # a malformed manifest is not a reading of the tests
    assert "Traceback" not in r.stderr
    _no_raw_controls(r.stdout + r.stderr)
    skipped = sorted(Path(line.split("manifest ", 1)[1].split(": ")[0]).parent.name
                     for line in r.stderr.splitlines() if line.startswith("[jaxlog] skipping malformed manifest"))
    assert len(r.stderr.splitlines()) == len(skipped)  # one line per skipped manifest, nothing else
    # every one but the escapes (well-formed: shown, neutralised) and runs with odd figures (shown as they are)
    assert skipped == sorted(set(HOSTILE) - {"escapes", "runs-bad"} | {"not-json"})
    assert "\\x1b]0;pwned\\x07" in r.stdout  # the escape sequence is shown, neutralised
    assert "FAILED" in r.stdout and "jaxlog: " in r.stdout


def test_info_of_a_file_with_escapes_in_its_name_and_a_missing_one(tmp_path):
    path = tmp_path / f"t{ESC}.h5"
    jl.run(lambda s: s + 1.0, jnp.float32(0), 3, record={"x": lambda s: s}, sinks=[jl.HDF5Writer(path)])
    r = _cli("info", path.name, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    _no_raw_controls(r.stdout + r.stderr)
    assert "\\x1b]0;pwned\\x07" in r.stdout and "status: complete" in r.stdout
    r = _cli("info", f"missing{ESC}.h5", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and r.stderr.startswith("[jaxlog]")
    _no_raw_controls(r.stdout + r.stderr)
