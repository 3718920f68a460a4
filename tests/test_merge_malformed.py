"""``jaxlog merge`` and ``jaxlog summary`` on what they must not trust: a test that failed in one
shard and passed in another (listed and counted once, as failed), a shard with no exit status
(the merge's is unknown, never 0), and malformed manifests (each one ``[jaxlog]`` line, exit 2,
nothing written)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugin_helpers import no_jaxlog_env  # noqa: F401  (autouse)
from pytest_jaxlog.cli import main

REPO = Path(__file__).resolve().parents[1]
pytest_plugins = ["pytester"]

FLAKY = """
import os
import numpy as np

def test_flaky(jaxlog):
    run = jaxlog.run(lambda s: s + 1.0, np.zeros(2, np.float32), 3, record={"x": lambda s: s})
    assert os.environ.get("FLAKY_FAIL") != "1", "this shard's run fails"

def test_steady(jaxlog):
    assert jaxlog.dir.is_dir()
"""

GOOD = {"version": 2, "exitstatus": 0, "tests": [{"nodeid": "t.py::test_ok", "outcome": "passed"}]}
ENTRY = {"nodeid": "t.py::test_x", "outcome": "failed"}

# name: (how the file is made, a word the one line must hold)
MALFORMED = {
    "not-json": (b"{not json", "Expecting"),
    "truncated": (json.dumps(dict(GOOD, tests=[ENTRY] * 3)).encode()[:50], "Unterminated"),
    "binary": (bytes(range(256)) * 4, "decode"),
    "array": (b"[1, 2]", "not a JSON object"),
    "no-version": (json.dumps({"tests": [], "exitstatus": 0}).encode(), "'version'"),
    "no-tests": (json.dumps({"version": 2, "exitstatus": 0}).encode(), "'tests'"),
    "tests-not-list": (json.dumps({"version": 2, "tests": 7}).encode(), "'tests' is int"),
    "version-text": (json.dumps(dict(GOOD, version="2")).encode(), "'version' is str"),
    "exitstatus-text": (json.dumps(dict(GOOD, exitstatus="0")).encode(), "'exitstatus' is str"),
    "exitstatus-bool": (json.dumps(dict(GOOD, exitstatus=False)).encode(), "'exitstatus' is bool"),
    "entry-not-object": (json.dumps(dict(GOOD, tests=["t.py::test_x"])).encode(), "not an object"),
    "entry-no-nodeid": (json.dumps(dict(GOOD, tests=[{"outcome": "failed"}])).encode(), "'nodeid'"),
    "entry-no-outcome": (json.dumps(dict(GOOD, tests=[{"nodeid": "t.py::x"}])).encode(), "'outcome'"),
    "nodeid-int": (json.dumps(dict(GOOD, tests=[dict(ENTRY, nodeid=3)])).encode(), "'nodeid' is int"),
    "artifacts-list": (json.dumps(dict(GOOD, tests=[dict(ENTRY, artifacts=[1])])).encode(), "'artifacts' is list"),
    "artifact-path-int": (json.dumps(dict(GOOD, tests=[dict(ENTRY, artifacts={"trajectory": 5})])).encode(),
                          "artifact 'trajectory'"),
    "violations-int": (json.dumps(dict(GOOD, tests=[dict(ENTRY, violations=5)])).encode(), "'violations' is int"),
    "violation-message-list": (json.dumps(dict(GOOD, tests=[dict(ENTRY, violations=[{"message": [1]}])])).encode(),
                               "message is not text"),
    "goldens-strs": (json.dumps(dict(GOOD, tests=[dict(ENTRY, goldens=["x"])])).encode(), "golden 0"),
    "golden-path-int": (json.dumps(dict(GOOD, tests=[dict(ENTRY, goldens=[{"status": "created", "path": 1}])]))
                        .encode(), "golden 0's 'path'"),
    "stale-dir-int": (json.dumps(dict(GOOD, stale=[{"dir": 5}])).encode(), "stale entry 0"),
    "settings-list": (json.dumps(dict(GOOD, settings=[1])).encode(), "'settings' is list"),
}


def _make(root: Path, name: str) -> Path:
    d = root / name
    d.mkdir(parents=True)
    if name == "directory":  # manifest.json is a folder
        (d / "manifest.json").mkdir()
    else:
        (d / "manifest.json").write_bytes(MALFORMED[name][0])
    return d


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[jaxlog] ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_shard_is_one_line_and_exit_2_from_merge_and_summary(tmp_path, capsys, name):
    good = tmp_path / "good"
    good.mkdir()
    (good / "manifest.json").write_text(json.dumps(GOOD))
    bad = _make(tmp_path, name)
    assert main(["merge", str(good), str(bad), "-o", str(tmp_path / "m")]) == 2
    captured = capsys.readouterr()
    line = _one_line(captured.err)
    assert f"{bad / 'manifest.json'} is not a jaxlog manifest" in line and MALFORMED[name][1] in line, line
    assert not (tmp_path / "m").exists()  # nothing written
    assert main(["summary", str(bad)]) == 2
    captured = capsys.readouterr()
    line = _one_line(captured.err)
    assert f"malformed manifest {bad / 'manifest.json'}" in line and MALFORMED[name][1] in line, line
    assert captured.out == ""  # no "0 jaxlog tests ... exit status None" passed off as a reading


def test_through_the_real_command_line_a_directory_and_every_malformed_manifest(tmp_path):
    """The installed entry (``python -m pytest_jaxlog``) in a process of its own: ``summary`` over a
    tree of malformed manifests beside a good one prints the good one, names each bad one in
    one line, and exits 2; ``merge`` of a shard whose manifest.json is a folder exits 2."""
    good = tmp_path / "tree" / "good"
    good.mkdir(parents=True)
    (good / "manifest.json").write_text(json.dumps(GOOD))
    for name in MALFORMED:
        _make(tmp_path / "tree", name)
    folder = _make(tmp_path / "tree", "directory")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "pytest_jaxlog", "summary", str(tmp_path / "tree")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == len(MALFORMED) + 1 and all(x.startswith("[jaxlog] skipping malformed manifest") for x in lines)
    assert f"jaxlog: {good}" in r.stdout and "1 jaxlog tests, 0 not passed" in r.stdout
    r = subprocess.run([sys.executable, "-m", "pytest_jaxlog", "merge", str(good), str(folder), "-o",
                        str(tmp_path / "m")], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2 and _one_line(r.stderr) == f"[jaxlog] merge: no manifest.json in {folder} (the shard's " \
                                                        f"jaxlog directory, e.g. .jaxlog)"
    assert not (tmp_path / "m").exists()


def test_a_shard_without_an_exit_status_makes_the_merged_one_unknown(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, doc in ((a, GOOD), (b, {k: v for k, v in GOOD.items() if k != "exitstatus"})):
        d.mkdir()
        (d / "manifest.json").write_text(json.dumps(doc))
    assert main(["merge", str(a), str(b), "-o", str(tmp_path / "m")]) == 0
    merged = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert merged["exitstatus"] is None and [s["exitstatus"] for s in merged["shards"]] == [0, None]
    capsys.readouterr()
    assert main(["summary", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert "exit status unknown (not recorded)" in out and "exit status 0" not in out
    (b / "manifest.json").write_text(json.dumps(dict(GOOD, exitstatus=1)))  # a failing shard's status wins
    assert main(["merge", str(b), str(a), "-o", str(tmp_path / "m")]) == 0
    assert json.loads((tmp_path / "m" / "manifest.json").read_text())["exitstatus"] == 1


def test_a_test_failed_in_one_shard_and_passed_in_another_is_listed_and_counted_as_failed(pytester, monkeypatch,
                                                                                         capsys):
    pytester.makepyfile(test_flaky=FLAKY)
    # every test keeps its files: the passing shard's entry is one the summary would list too
    base = ["-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:xdist", "--jaxlog-keep=all", "test_flaky.py"]
    monkeypatch.setenv("FLAKY_FAIL", "1")
    pytester.runpytest(*base, "--jaxlog-dir=s1").assert_outcomes(passed=1, failed=1)
    monkeypatch.delenv("FLAKY_FAIL")
    pytester.runpytest(*base, "--jaxlog-dir=s2").assert_outcomes(passed=2)
    for order in (["s1", "s2"], ["s2", "s1"]):  # the worst outcome wins whichever shard comes first
        capsys.readouterr()
        assert main(["merge", *order, "-o", "m"]) == 0
        merged = json.loads((pytester.path / "m" / "manifest.json").read_text())
        outcomes = sorted((t["nodeid"], t["outcome"]) for t in merged["tests"])
        assert outcomes == [("test_flaky.py::test_flaky", "failed"), ("test_flaky.py::test_flaky", "passed"),
                            ("test_flaky.py::test_steady", "passed"), ("test_flaky.py::test_steady", "passed")]
        assert merged["exitstatus"] == 1
        capsys.readouterr()
        assert main(["summary", "m"]) == 0
        out = capsys.readouterr().out
        assert "2 jaxlog tests, 1 not passed" in out, out  # each test once, as its worst outcome
        assert "FAILED test_flaky.py::test_flaky" in out and "PASSED test_flaky.py::test_flaky" not in out, out
        failed = next(t for t in merged["tests"] if t["outcome"] == "failed")
        assert (pytester.path / "m" / failed["artifacts"]["trajectory"]).is_file()  # its files, from the merge
        flaky = out[out.index("FAILED test_flaky.py::test_flaky"):].split("PASSED")[0]
        assert os.path.normpath(Path("m") / failed["artifacts"]["trajectory"]) in flaky  # the failing shard's files
        assert failed["artifacts"]["trajectory"].startswith("../s1/")
