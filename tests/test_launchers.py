"""A marked multi-process test started the way a cluster starts it: one ``pytest`` per rank, the
same command in each, the launcher's variables in the environment and no conftest of ours. The
plugin starts ``jax.distributed`` from those variables (Slurm's ``SLURM_*``, as JAX's own Slurm
detection reads them; or ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``),
each rank writes its own ``--jaxlog-dir`` and manifest, and ``jaxlog merge`` joins them. Here the
ranks are local processes on the loopback interface (gloo collectives), 2 host CPU devices each.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.harness.processes import free_port

pytestmark = pytest.mark.xdist_group("jaxlog-processes")

SUITE = """
import json
import os

import numpy as np
import pytest


def step(s):
    x, v = s
    v = v - 0.1 * x
    return x + 0.1 * v, v


@pytest.mark.jaxlog(processes=2, devices=2)
def test_sharded(jaxlog):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    assert (jax.process_count(), jax.local_device_count(), jax.device_count()) == (2, 2, 4)
    assert "JAXLOG_DEVICES_CHILD" not in os.environ  # in the launched session itself
    mesh = jax.make_mesh((4,), ("d",))
    x = np.linspace(-1.0, 1.0, 64, dtype=np.float32)
    state = tuple(jax.make_array_from_callback(a.shape, NamedSharding(mesh, P("d")), lambda i, a=a: a[i])
                  for a in (x, np.zeros_like(x)))
    run = jaxlog.run(step, state, 20, chunk=8, record={"x": lambda s: s[0]})
    assert run.steps_done == 20
    print(json.dumps({"rank": jax.process_index()}), flush=True)


@pytest.mark.jaxlog(processes=2)
def test_one_rank_may_fail(jaxlog):
    import jax
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("both at the last test")  # rank 0 is past its collectives when rank 1 ends
    assert str(jax.process_index()) != os.environ.get("FAILING_RANK"), f"rank {jax.process_index()} disagrees"
"""

GRACE_S = 10.0  # the launcher's lead time from SIGTERM to SIGKILL (Slurm's KillWait)


def _env(extra: dict[str, str]) -> dict[str, str]:
    """This machine's environment without any launcher's or jaxlog's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "JAX_COORDINATOR", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAXLOG_",
                                "PYTEST_XDIST", "PYTEST_ADDOPTS"))}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2", **extra)
    return env


def _launch(project: Path, ranks: list[dict[str, str]]) -> list[tuple[int, str]]:
    """Every rank's pytest, as ``srun --kill-on-bad-exit=1`` runs them: once one rank exits with
    an error the others get SIGTERM, and SIGKILL ``GRACE_S`` later. Each rank's exit code and output."""
    procs = []
    for i, extra in enumerate(ranks):
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", f"--jaxlog-dir=rank{i}"]
        procs.append(subprocess.Popen(cmd, cwd=project, env=_env(extra), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs: dict[int, str] = {}
    deadline, killing = time.monotonic() + 240, None
    try:
        while len(outs) < len(procs):
            for i, p in enumerate(procs):
                if i not in outs and p.poll() is not None:
                    outs[i] = p.stdout.read() if p.stdout else ""
                    if p.returncode != 0 and killing is None:  # a bad exit ends the others
                        killing = time.monotonic() + GRACE_S
                        for q in procs:
                            if q.poll() is None:
                                q.send_signal(signal.SIGTERM)
            if killing is not None and time.monotonic() > killing or time.monotonic() > deadline:
                for q in procs:
                    if q.poll() is None:
                        q.kill()
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, outs[i]) for i, p in enumerate(procs)]


def _merge(project: Path) -> tuple[subprocess.CompletedProcess, dict]:
    r = subprocess.run([sys.executable, "-m", "pytest_jaxlog", "merge", "rank0", "rank1", "-o", "merged"],
                       cwd=project, env=_env({}), capture_output=True, text=True, timeout=60)
    merged = project / "merged" / "manifest.json"
    return r, json.loads(merged.read_text()) if merged.is_file() else {}


def _outcomes(doc: dict) -> dict[tuple[str, int], str]:
    return {(t["nodeid"].split("::")[-1], t["shard"]): t["outcome"] for t in doc["tests"]}


def _trajectory(project: Path) -> jl.Trajectory:
    """The sharded test's trajectory: each rank's part was written in its own directory; gathered
    beside process 0's index (what collecting the ranks' artifacts does), it loads whole."""
    index = project / "rank0" / "test_launched.test_sharded"
    shutil.copy(project / "rank1" / "test_launched.test_sharded" / "trajectory.h5.p1", index)
    return jl.load(index / "trajectory.h5")


def _plain_x() -> np.ndarray:
    x = np.linspace(-1.0, 1.0, 64, dtype=np.float32)
    v = np.zeros_like(x)
    xs = [x]
    for _ in range(20):
        v = v - np.float32(0.1) * x
        x = x + np.float32(0.1) * v
        xs.append(x)
    return np.stack(xs)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "test_launched.py").write_text(SUITE)
    return tmp_path


def test_ranks_started_as_srun_starts_them(project):
    """``SLURM_JOB_ID``, ``SLURM_STEP_NODELIST`` (the coordinator is its first node), ``SLURM_NTASKS``,
    ``SLURM_PROCID``, ``SLURM_LOCALID``: JAX's Slurm detection; ``JAX_COORDINATOR_PORT`` instead of
    the port Slurm's job id would give (a fixed range, perhaps taken on this machine)."""
    port = str(free_port())
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2",
             "SLURM_STEP_NODELIST": "127.0.0.1", "SLURM_NODELIST": "127.0.0.1", "SLURM_STEP_NUM_NODES": "1",
             "SLURM_STEP_NUM_TASKS": "2",
             "SLURM_NNODES": "1", "JAX_COORDINATOR_PORT": port, "JAX_COORDINATOR_BIND_ADDRESS": f"127.0.0.1:{port}"}
    ends = _launch(project, [dict(slurm, SLURM_PROCID=str(i), SLURM_LOCALID=str(i), SLURM_NODEID="0")
                             for i in range(2)])
    assert [code for code, _ in ends] == [0, 0], "\n".join(out[-4000:] for _, out in ends)
    assert all("2 passed" in out for _, out in ends)
    assert sorted(json.loads(line)["rank"] for _, out in ends for line in out.splitlines()
                  if line.startswith('{"rank"')) == [0, 1]
    r, doc = _merge(project)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _outcomes(doc) == {(name, shard): "passed" for name in ("test_sharded", "test_one_rank_may_fail")
                              for shard in (0, 1)}
    assert doc["exitstatus"] == 0
    traj = _trajectory(project)
    assert traj.status == "complete" and traj.steps_done == 20
    np.testing.assert_allclose(traj["x"], _plain_x(), rtol=1e-6, atol=1e-6)


def test_ranks_started_from_the_jax_variables_one_of_them_failing(project):
    """``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID`` (an indexed Job, a
    script): rank 1 fails one test. It exits at once with pytest's code 1, its reports and
    manifest written; rank 0 passes its tests, then waits at JAX's shutdown barrier for rank 1,
    as it would under a launcher, which ends it (SIGTERM, then SIGKILL). The merge keeps both
    ranks' outcomes and takes rank 1's exit status."""
    address = f"127.0.0.1:{free_port()}"
    ends = _launch(project, [{"JAX_COORDINATOR_ADDRESS": address, "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(i),
                              "FAILING_RANK": "1"} for i in range(2)])
    (code0, out0), (code1, out1) = ends
    assert code1 == 1, out1[-4000:]
    assert "1 failed, 1 passed" in out1 and "AssertionError: rank 1 disagrees" in out1
    assert "2 passed" in out0, out0[-4000:]
    assert "INTERNALERROR" not in out0 + out1 and "Traceback" not in out0 + out1, out0 + out1
    # 0: it left the barrier before the SIGTERM; -SIGTERM/-SIGKILL: ended at the barrier; 1: the SIGTERM
    # landed while it wrote its reports, was noted there, and it exited past the barrier as a stopped
    # process does (harness.processes.DistributedChild); its tests passed either way (above)
    assert code0 in (0, 1, -signal.SIGTERM, -signal.SIGKILL), (code0, out0[-4000:])
    r, doc = _merge(project)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _outcomes(doc) == {("test_sharded", 0): "passed", ("test_sharded", 1): "passed",
                              ("test_one_rank_may_fail", 0): "passed", ("test_one_rank_may_fail", 1): "failed"}
    assert doc["exitstatus"] == 1
    summary = subprocess.run([sys.executable, "-m", "pytest_jaxlog", "summary", "merged"], cwd=project, env=_env({}),
                             capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0 and "test_one_rank_may_fail" in summary.stdout, summary.stdout + summary.stderr
    traj = _trajectory(project)
    assert traj.status == "complete"
    np.testing.assert_allclose(traj["x"], _plain_x(), rtol=1e-6, atol=1e-6)


def test_a_batch_script_of_an_allocation_is_not_a_launch(monkeypatch):
    """Inside ``sbatch --ntasks=4`` (the batch step: one task) the allocation's variables are set,
    but no other process will come: the plugin starts nothing (else it would wait for them)."""
    from pytest_jaxlog.harness.processes import launched_by

    for k in list(os.environ):
        if k.startswith(("SLURM_", "JAX_COORDINATOR", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAXLOG_", "PYTEST_XDIST")):
            monkeypatch.delenv(k)
    batch = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "n1", "SLURM_NTASKS": "4", "SLURM_PROCID": "0",
             "SLURM_LOCALID": "0", "SLURM_STEP_NUM_TASKS": "1"}
    for k, v in batch.items():
        monkeypatch.setenv(k, v)
    assert launched_by() is None
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")  # srun -n 4: a step of four tasks
    launch = launched_by()
    assert launch is not None and (launch.count, launch.index, launch.coordinator) == (4, 0, None)
    monkeypatch.setenv("JAXLOG_DISTRIBUTED", "off")
    assert launched_by() is None
