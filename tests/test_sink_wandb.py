"""``jl.WandbSink``: a W&B run written offline, read back with W&B's own reader of a run's
transaction log (``wandb leet inspect --json``, wandb-core's), and compared with the trajectory
the same run recorded, value for value. Without the extra, the package still imports and the sink
says which extra to install."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl


from pendulums import BATCHED, STATE, energy, step  # the kernel the sink tests share


def moving(state):
    return jnp.sum(state["v"] ** 2, axis=-1) > 1e-6



def _wandb():
    return pytest.importorskip("wandb", reason="the wandb extra is not installed")


def _records(run_dir: Path) -> list[dict]:
    """The run's transaction log as W&B's own reader prints it, one JSON record per line."""
    found = list(run_dir.glob("run-*.wandb"))
    assert len(found) == 1, found
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(found[0])],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def _history(records: list[dict]) -> dict[str, dict[int, float]]:
    """Per W&B key (W&B's own ``_``-keys left out), its value at each step."""
    out: dict[str, dict[int, float]] = {}
    for r in records:
        if r["type"] == "history":
            item = r["history"]["item"]
            for key, value in item.items():
                if not key.startswith("_"):
                    out.setdefault(key, {})[int(item["_step"])] = float(value)
    return out


def _summary(records: list[dict]) -> dict:
    out: dict = {}
    for r in records:
        if r["type"] == "summary":
            out.update(r["summary"].get("update", {}))
    return out


def _exit_code(records: list[dict]) -> int:
    return next(r["exit"].get("exit_code", 0) for r in records if r["type"] == "exit")


def _as_history(steps: np.ndarray, values: np.ndarray) -> dict[int, float]:
    return {int(k): float(v) for k, v in zip(steps, values)}


def test_an_offline_run_holds_every_scalar_record_at_its_steps(tmp_path):
    _wandb()
    sink = jl.WandbSink(tmp_path / "wb", project="tests", name="plain")
    run = jl.run(step, STATE, 12, record={"energy": energy, "moving": moving, "x": lambda s: s["x"],
                                          "ke": jl.Record(lambda s: jnp.sum(s["v"] ** 2), every=5)},
                 sinks=[jl.MemorySink(), sink], chunk=4, progress=False, meta={"kernel": "pendulum"})
    traj = run.trajectory
    run_dir = run.artifacts["wandb"]
    assert run_dir.parent == tmp_path / "wb" / "wandb" and run_dir.name.startswith("offline-run-")
    records = _records(run_dir)
    history = _history(records)
    assert set(history) == {"energy", "moving", "ke"}  # x is not a scalar: not a metric
    for name in ("energy", "moving", "ke"):
        assert history[name] == _as_history(traj.steps(name), traj[name]), name
    assert sorted(history["ke"]) == [0, 5, 10]
    assert traj["energy"].dtype == np.float32 and len(set(history["energy"].values())) > 1
    summary = _summary(records)
    assert summary["jaxlog/status"] == "complete" and summary["jaxlog/steps_done"] == 12
    assert _exit_code(records) == 0
    run_record = next(r["run"] for r in records if r["type"] == "run")
    assert run_record["project"] == "tests"
    config = run_record["config"]["update"]["jaxlog"]
    assert config["run"]["meta"] == {"kernel": "pendulum"} and config["run"]["steps"] == 12


def test_a_batched_run_has_a_key_per_system_and_a_violation_fails_the_wandb_run(tmp_path):
    _wandb()
    run = jl.run(step, BATCHED, 9, record={"energy": energy, "x": lambda s: s["x"]}, batched=True,
                 invariants=[jl.bounded("energy", hi=-3.5)], on_violation="record",
                 sinks=[jl.MemorySink(), jl.WandbSink(tmp_path, project="tests")], chunk=4, progress=False)
    traj = run.trajectory
    records = _records(run.artifacts["wandb"])
    history = _history(records)
    assert set(history) == {f"energy/system_{i}" for i in range(3)}
    for i in range(3):
        assert history[f"energy/system_{i}"] == _as_history(traj.steps("energy"), traj["energy"][:, i])
    summary = _summary(records)
    assert summary["jaxlog/status"] == "violated" and summary["jaxlog/violation"]["invariant"] == run.violation.invariant
    assert _exit_code(records) == 1


def test_records_it_cannot_chart_are_refused_before_the_run(tmp_path):
    _wandb()
    with pytest.raises(jl.JaxlogError, match=r"WandbSink.*'x'.*shape \(4,\)"):
        jl.run(step, STATE, 3, record={"x": lambda s: s["x"]},
               sinks=[jl.WandbSink(tmp_path, records=["x"])], progress=False)
    with pytest.raises(jl.JaxlogError, match="mode is one of 'offline', 'online'"):
        jl.WandbSink(tmp_path, mode="dryrun")


def test_without_the_extra_the_sink_names_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` finds where it is not installed
    with pytest.raises(jl.JaxlogError, match=r"^\[jaxlog\] jl.WandbSink needs the 'wandb' package.*"
                                             r"pip install 'pytest-jaxlog\[wandb\]'"):
        jl.WandbSink(tmp_path)
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(jl.JaxlogError, match=r"jl.MLflowSink needs the 'mlflow' package.*"
                                             r"pip install 'pytest-jaxlog\[mlflow\]'"):
        jl.MLflowSink(tmp_path)


def test_the_package_and_its_sinks_import_without_the_dashboards_libraries():
    code = ("import sys, pytest_jaxlog as jl; jl.WandbSink, jl.MLflowSink, jl.TensorBoardWriter; "
            "print(sorted(m for m in ('wandb', 'mlflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
