"""``@pytest.mark.jaxlog(processes=N, devices=M)``: a test run as N ``jax.distributed`` processes
on this machine (real child pytests, gloo collectives on the loopback interface), with shared
fate. Each case is a real pytest session in a subprocess; they are grouped for xdist (the
processes want every core) and kept few: one group of processes costs seconds of startup."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import jax  # noqa: F401  (here, not in a test: pytester drops modules a test imported, and jaxlib cannot load twice)
import numpy as np
import pytest

import pytest_jaxlog as jl
from plugin_helpers import no_jaxlog_env  # noqa: F401  (autouse)

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.xdist_group("jaxlog-processes")

KERNEL = """
import time
import numpy as np
import pytest

def step(s):
    x, v = s
    v = v - 0.1 * x
    return x + 0.1 * v, v

def energy(s):
    import jax.numpy as jnp
    x, v = s
    return 0.5 * jnp.sum(x * x + v * v)

def initial():
    x = np.linspace(-1.0, 1.0, 64, dtype=np.float32)
    return x, np.zeros_like(x)

def sharded_run(jaxlog, n, devices):
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    assert (jax.process_count(), jax.local_device_count(), jax.device_count()) == (n, devices, n * devices)
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("d",)), P("d"))
    state = tuple(jax.make_array_from_callback(a.shape, sharding, lambda i, a=a: a[i]) for a in initial())
    began = time.time()
    run = jaxlog.run(step, state, 20, chunk=8, record={"x": lambda s: s[0], "e": energy})
    held = sorted(int(s.index[0].start) for s in run.state[0].addressable_shards)
    print(json.dumps({"process": jax.process_index(), "held": held, "began": began, "ended": time.time()}))
"""

SCALED = KERNEL + """
import json

@pytest.mark.jaxlog(processes=2, devices=2, keep="all")
def test_two(jaxlog):
    sharded_run(jaxlog, 2, 2)

@pytest.mark.jaxlog(processes=4, keep="all")
def test_four(jaxlog):
    sharded_run(jaxlog, 4, 1)
"""

FATES = """
import os
import time
import pytest

@pytest.mark.jaxlog(processes=2)
def test_one_fails(jaxlog):
    import jax
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("both started")
    (jaxlog.dir / f"note.p{jax.process_index()}").write_text("written before the failure")
    multihost_utils.sync_global_devices("both wrote")
    if jax.process_index() == 1:
        assert 1 + 1 == 3, "process one disagrees"
    print("process 0 waits for process 1", flush=True)
    multihost_utils.sync_global_devices("never reached by process 1")

@pytest.mark.jaxlog(processes=2, timeout=40)
def test_one_hangs():
    import jax
    if jax.process_index() == 1:
        print("process 1 hangs", flush=True)
        time.sleep(3600)

@pytest.mark.jaxlog(processes=0)
def test_no_processes(): pass

@pytest.mark.jaxlog(timeout=5)
def test_timeout_alone(): pass
"""


@pytest.fixture(autouse=True)
def _one_cpu_device(monkeypatch):
    """The outer session's device flags kept out of the inner sessions (JAXLOG_*: no_jaxlog_env)."""
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")


def _manifest(pytester) -> dict:
    """The inner session's manifest entries by test name."""
    tests = json.loads((pytester.path / ".jaxlog" / "manifest.json").read_text())["tests"]
    return {t["nodeid"].split("::")[-1]: t for t in tests}


def _printed(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"process"')]


def _reference() -> tuple:
    """The same run in this process, on one device; and the same steps as a plain numpy loop."""
    namespace: dict = {}
    exec(KERNEL, namespace)
    ref = jl.run(namespace["step"], namespace["initial"](), 20, record={"x": lambda s: s[0], "e": namespace["energy"]})
    x, v = (a.astype(np.float64) for a in namespace["initial"]())
    xs, es = [x], [0.5 * np.sum(x * x + v * v)]
    for _ in range(20):
        v = v - 0.1 * x
        x = x + 0.1 * v
        xs.append(x)
        es.append(0.5 * np.sum(x * x + v * v))
    return ref.trajectory, {"x": np.stack(xs), "e": np.array(es)}


def test_two_and_four_processes_write_one_trajectory_equal_to_one_process(pytester):
    """Two tests under ``-n 2``: on two workers, yet never at once (the cores are held), each
    test's processes writing parts of one trajectory, read back whole and equal to a run here."""
    pytester.makepyfile(test_scaled=SCALED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "-rA")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert "Captured stdout call (process 3 of 4)" in out and "Captured stdout call (process 1 of 2)" in out
    printed = _printed(out)
    # every process of each test held its own quarter of the particles
    assert sorted(p["held"] for p in printed) == sorted([[0, 16], [32, 48]] + [[0], [16], [32], [48]])
    tests = _manifest(pytester)
    ref, plain = _reference()
    spans = []
    for name, n in (("test_two", 2), ("test_four", 4)):
        entry = tests[name]
        assert entry["outcome"] == "passed" and entry["worker"] == f"processes={n}" and entry["kept"]
        assert [p["outcome"] for p in entry["processes"]] == ["passed"] * n
        assert [p["exit_code"] for p in entry["processes"]] == [0] * n
        d = pytester.path / ".jaxlog" / entry["dir"]
        files = sorted(p.name for p in d.iterdir())
        assert files == sorted(["trajectory.h5"] + [f"trajectory.h5.p{i}" for i in range(n)]
                               + [f"trajectory.p{i}.pftrace" for i in range(n)]), files
        assert set(entry["artifacts"].values()) == {f"{entry['dir']}/{f}" for f in files}
        traj = jl.load(pytester.path / ".jaxlog" / entry["artifacts"]["trajectory"])
        assert traj.status == "complete" and traj.steps_done == 20
        got, want = traj["x"], ref["x"]
        assert got.dtype == want.dtype and got.shape == (21, 64) and got.tobytes() == want.tobytes()
        np.testing.assert_allclose(traj["e"], ref["e"], rtol=1e-6)  # a sum: the collectives' own order
        np.testing.assert_allclose(got, plain["x"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(traj["e"], plain["e"], rtol=1e-5)
    two, four = ([p for p in printed if len(p["held"]) == k] for k in (2, 1))
    spans = sorted((min(p["began"] for p in g), max(p["ended"] for p in g)) for g in (two, four))
    assert spans[0][1] <= spans[1][0], spans  # one group of processes at a time, on two workers


def test_a_failing_process_exits_only_once_the_parent_releases_it(pytester):
    """Its exit closes its connections, and a process still in a collective with it would fail on
    that before the parent stopped it, reporting the first one's failure as its own ("Connection
    closed by peer"): the failing child waits for the parent's release, made once the others are
    stopped. A child process of a group of one, spoken to as the parent speaks to it."""
    import subprocess
    import sys
    import time

    from pytest_jaxlog.harness.devices import child_env
    from pytest_jaxlog.harness.processes import free_port

    pytester.makepyfile(test_f="import pytest\n\n@pytest.mark.jaxlog(processes=1)\ndef test_f(jaxlog):\n"
                                "    assert 1 + 1 == 3\n")
    report, release = pytester.path / "reports.p0.json", pytester.path / "release.p0"
    spec = {"nodeid": "test_f.py::test_f", "devices": 1, "report": str(report),
            "jaxlog_dir": str(pytester.path / ".jaxlog"), "workerid": "process 0 of 1",
            "processes": {"count": 1, "index": 0, "coordinator": f"127.0.0.1:{free_port()}"},
            "release": str(release)}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "test_f.py::test_f", "-p", "no:cacheprovider", "-q"],
                            cwd=pytester.path, env=child_env(1, spec), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        while not (report.exists() and '"teardown"' in report.read_text()) and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(1.0)  # past its session: it ran on to its exit at once before
        assert proc.poll() is None, proc.communicate()[0].decode()
        release.touch()
        out = proc.communicate(timeout=60)[0].decode()
    finally:
        proc.kill()
    assert proc.returncode == 1, out
    assert "assert (1 + 1) == 3" in out


def test_a_failing_process_fails_the_test_and_stops_the_others_and_a_hung_one_times_out(pytester):
    pytester.makepyfile(test_fates=FATES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2, errors=2)
    out = result.stdout.str()
    failing = out[out.index("_ test_one_fails _"):out.index("_ test_one_hangs _")]
    assert "[jaxlog] process 1 of 2 failed; the others were stopped" in failing
    assert "process 1 of 2: failed in call" in failing
    assert re.search(r"process 0 of 2: stopped by SIG(TERM|KILL)\n", failing), failing
    labelled = failing[failing.index("process 1 of 2: call ="):]
    assert "process one disagrees" in labelled and "assert 1 + 1 == 3" in labelled
    assert "process 0 waits for process 1" in failing  # process 0's output, though it never reported
    assert "process 0 of 2: call =" not in failing  # no traceback of its own: it was stopped
    # the failing process's error once, one line for the stopped one, no pytest noise from either
    assert failing.count("AssertionError: process one disagrees") == 1, failing
    assert len(re.findall(r"^  process 0 of 2: stopped by SIG(TERM|KILL)$", failing, re.M)) == 1, failing
    assert len(re.findall(r"^  process 1 of 2: failed in call$", failing, re.M)) == 1, failing  # exited on its own
    assert "INTERNALERROR" not in out and "Traceback" not in failing, failing
    assert "PytestUnraisableExceptionWarning" not in out

    hung = out[out.index("_ test_one_hangs _"):]
    assert "[jaxlog] timeout: the 2 processes of this test ran past timeout=40 s and were stopped" in hung
    assert re.search(r"process 1 of 2: stopped by SIG(TERM|KILL) at the timeout", hung), hung
    assert "process 1 hangs" in hung
    result.stdout.fnmatch_lines([
        "*test_no_processes: @pytest.mark.jaxlog(processes=...): expected a positive number of jax.distributed "
        "processes, got 0*",
        "*test_timeout_alone: @pytest.mark.jaxlog(timeout=...): a timeout is for tests run in several processes; "
        "add processes=N*",
    ])
    tests = _manifest(pytester)
    fails, hangs = tests["test_one_fails"], tests["test_one_hangs"]
    assert fails["outcome"] == "failed" and fails["kept"] and fails["worker"] == "processes=2"
    assert fails["processes"][1]["outcome"] == "failed" and fails["processes"][0]["stopped"] in ("SIGTERM", "SIGKILL")
    kept = pytester.path / ".jaxlog" / fails["dir"]
    assert sorted(p.name for p in kept.iterdir()) == ["note.p0", "note.p1"]  # neither process removed it
    assert hangs["outcome"] == "failed" and hangs["processes"][1]["stopped"] in ("SIGTERM", "SIGKILL")
    assert any("timeout" in n for n in hangs["notes"])


REPORTING = """
import pytest

@pytest.mark.jaxlog(processes=2)
def test_one_fails_while_the_other_reports(jaxlog):
    import jax
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("both started")
    if jax.process_index() == 1:
        raise ValueError("process one gives up")
"""

REPORTING_CONFTEST = """
import time

def pytest_runtest_logreport(report):
    # process 0 passed; it is inside pytest's report hooks when the parent stops it
    import jax
    from pytest_jaxlog.drive.host.signals import NOTED
    if report.when == "teardown" and jax.process_count() == 2 and jax.process_index() == 0:  # (not the parent)
        print("process 0 reports its teardown", flush=True)
        while not NOTED.signum:
            time.sleep(0.05)
        print(f"process 0 went on with its reports after signal {NOTED.signum}", flush=True)
"""


def test_a_process_stopped_inside_its_report_hooks_ends_without_a_traceback(pytester):
    """SIGTERM reaches the passing process while pytest runs its report hooks: noted there, not
    raised (an exception inside a hook is an INTERNALERROR), so it finishes its reports and
    exits; the test's output has the failing process's error once and one line for the other."""
    import shutil

    pytester.makepyfile(test_reporting=REPORTING)
    pytester.makeconftest(REPORTING_CONFTEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert out.count("ValueError: process one gives up") == 1, out
    assert "[jaxlog] process 1 of 2 failed; the others were stopped" in out
    # (the session's summary repeats the test's notes, each after the test's id)
    assert len(re.findall(r"^  process 0 of 2: stopped by SIGTERM$", out, re.M)) == 1, out
    assert len(re.findall(r"^  process 1 of 2: failed in call$", out, re.M)) == 1, out
    assert "INTERNALERROR" not in out and "Traceback" not in out, out
    work = re.search(r"--basetemp=(\S+)/tmp\b", out)
    assert work is not None, out
    try:  # the processes' own outputs, kept beside the failed test's tmp_paths
        stopped = (Path(work.group(1)) / "output.p0.txt").read_text()
        failing = (Path(work.group(1)) / "output.p1.txt").read_text()
    finally:
        shutil.rmtree(work.group(1), ignore_errors=True)
    assert "process 0 went on with its reports after signal 15" in stopped, stopped
    for text in (stopped, failing):
        assert "INTERNALERROR" not in text and "Traceback" not in text and "Terminated" not in text, text
    tests = _manifest(pytester)
    entry = tests["test_one_fails_while_the_other_reports"]
    assert [p["stopped"] for p in entry["processes"]] == ["SIGTERM", None]
    assert [p["outcome"] for p in entry["processes"]] == ["passed", "failed"]


LAUNCHED = KERNEL + """
import json

@pytest.mark.jaxlog(processes=2, devices=2)
def test_two(jaxlog):
    import os
    assert "JAXLOG_DEVICES_CHILD" not in os.environ  # in the launched session itself, no child pytest
    sharded_run(jaxlog, 2, 2)
"""

LAUNCHER_CONFTEST = """
import os
import jax

# what a conftest does under srun or a JobSet; here the variables are set by hand, as a launcher would
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(num_processes=int(os.environ["NPROCS"]), process_id=int(os.environ["PROCID"]))
"""


def test_processes_started_by_a_launcher_run_the_test_in_their_own_sessions(pytester):
    """As under ``srun``: every process runs the same pytest command, jax.distributed started by a
    conftest from the launcher's variables; the marker then launches nothing and the test runs in
    each session, writing its part of the one trajectory."""
    import subprocess
    import sys

    from pytest_jaxlog.harness.processes import free_port

    pytester.makepyfile(test_launched=LAUNCHED)
    pytester.makeconftest(LAUNCHER_CONFTEST)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", NPROCS="2",
               JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{free_port()}")
    procs = [subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s"],
                              cwd=pytester.path, env=dict(env, PROCID=str(i)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=300)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    assert all("1 passed" in o for o in outs)
    assert sorted(p["process"] for o in outs for p in _printed(o)) == [0, 1]
    d = pytester.path / ".jaxlog" / "test_launched.test_two"
    assert sorted(p.name for p in d.iterdir()) == ["trajectory.h5", "trajectory.h5.p0", "trajectory.h5.p1",
                                                  "trajectory.p0.pftrace", "trajectory.p1.pftrace"]
    traj, (ref, _) = jl.load(d / "trajectory.h5"), _reference()
    assert traj.status == "complete" and traj["x"].tobytes() == ref["x"].tobytes()
