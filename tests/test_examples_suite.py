"""The main job: the example regression suite passes as the README runs it, and leaves its evidence
(trajectories, timelines, the profile window's trace, a complete manifest) where CI can attach it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py

ROOT = Path(__file__).resolve().parents[1]


def test_example_suite_passes_and_leaves_artifacts(tmp_path):
    out = tmp_path / "jaxlog"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXLOG_")}  # the README's command, as is
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "examples", "-p", "no:cacheprovider", "-q", "-p", "no:randomly",
         f"--jaxlog-dir={out}", f"--junitxml={tmp_path / 'junit.xml'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " failed" not in proc.stdout.splitlines()[-1], tail
    assert "1 xfailed" in proc.stdout.splitlines()[-1], tail

    manifest = json.loads((out / "manifest.json").read_text())
    tests = {t["nodeid"]: t for t in manifest["tests"]}
    assert len(tests) >= 10
    broken = tests["examples/test_lj.py::test_broken_timestep_is_caught"]
    assert broken["outcome"] == "xfailed"
    # the example suite keeps every test's files: each trajectory opens and says how its run ended
    statuses = {}
    for t in tests.values():
        for kind, path in t["artifacts"].items():
            if kind.endswith("trajectory"):
                with h5py.File(out / path, "r") as f:  # manifest paths are relative to it
                    statuses[t["nodeid"]] = json.loads(f["jaxlog"].attrs["status"])
    assert statuses["examples/test_lj.py::test_broken_timestep_is_caught"] == "violated"
    assert statuses["examples/test_lj.py::test_nve_conserves_energy"] == "complete"
    # every test that left files has its directory; one that wrote none (a benchmark) has none
    assert all((out / t["dir"]).is_dir() if t["dir"] is not None else not t["artifacts"] for t in tests.values())
    assert sum(t["dir"] is not None for t in tests.values()) >= 10
    # each run's timings are in the manifest
    (nve,) = tests["examples/test_lj.py::test_nve_conserves_energy"]["runs"]
    assert nve["steps"] == 1000 and nve["compiles"] == 1 and nve["steps_per_s"] > 0 and nve["status"] == "complete"
    # the profiled test kept JAX's trace of its window and our timeline
    prof = tests["examples/test_oscillators.py::test_profile_window"]["artifacts"]
    assert any(k.endswith("jax_trace") for k in prof) and any(k.endswith("timeline") for k in prof)
    # the optimiser stopped at convergence, and its manifest entry says so
    (adam,) = tests["examples/test_optimizer.py::test_adam_stops_at_convergence"]["runs"]
    assert adam["stop_reason"] == "until" and adam["steps"] < 20_000


def test_the_examples_run_on_the_backend_jax_picks():
    """Nothing on the examples' path pins the CPU: on a GPU machine the main job runs on the GPU.
    (The repository's own tests pin it, in tests/conftest.py.)"""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS" and not k.startswith("JAXLOG_")}
    code = ("import os, pytest\n"
            "code = pytest.main(['examples', '--co', '-q', '-p', 'no:cacheprovider'])\n"
            "print('exit', int(code), 'JAX_PLATFORMS', os.environ.get('JAX_PLATFORMS'))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip().splitlines()[-1] == "exit 0 JAX_PLATFORMS None", proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (ROOT / "tests" / "conftest.py").read_text().count('os.environ.setdefault("JAX_PLATFORMS", "cpu")') == 1
