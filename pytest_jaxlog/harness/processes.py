"""``@pytest.mark.jaxlog(processes=N, devices=M)``: a test run as N ``jax.distributed`` processes.

What a multi-process kernel needs a launcher for (Slurm, Kubernetes, ``mpirun``), a user can
test on a laptop: the test runs in N child pytests on this machine (as ``devices=`` runs one),
process *i* of N with ``jax.distributed`` started before the test module is imported (a
coordinator on a free loopback port, CPU collectives through gloo) and M host CPU devices of its
own. Each process's ``jaxlog`` fixture writes its part of the test's trajectory in the test's one
directory (``jl.load`` reads the whole); timelines and profiles are per process.

Shared fate (``harness.fate``): a failure in any process fails the test and stops the others;
so does ``timeout=`` seconds (default ``DEFAULT_TIMEOUT_S``), SIGTERM first, SIGKILL after
``fate.GRACE_S``. The report (``harness.group_reports``) labels each process's traceback and
output. Under pytest-xdist the workers of a session take turns: one group runs at a time
(``fate.cores_held``); grouping such tests with ``@pytest.mark.xdist_group`` and
``--dist loadgroup`` also keeps the other workers' tests off the cores they wait for.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import pytest

from ..errors import JaxlogError
from .devices import _child_nodeid, child_command, child_env, child_spec, forward_options
from .fate import Member, cores_held, watch
from .group_reports import Group, combine
from .options import marker_settings
from .session import STATE_KEY, TestState, safe_name

DEFAULT_TIMEOUT_S = 600.0
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A port free on the loopback interface now (the coordinator binds it moments later)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class ProcessesPlugin:
    """In the session: runs a test marked ``processes=N`` as N child pytests with shared fate."""

    def __init__(self, session: Any):
        self.session = session

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any) -> bool | None:
        if item.get_closest_marker("jaxlog") is None or child_spec() is not None:
            return None
        try:
            settings = marker_settings(item, self.session.settings)
        except JaxlogError:
            return None  # the bad marker argument fails the test in setup, with its message
        if settings.processes is None:
            return None
        if settings.processes > 1 and launched_processes() == settings.processes:
            share_directory(item, self.session)  # a launcher (srun, a JobSet) started them: the test runs here
            return None
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        with cores_held(self.session.base):
            reports = self._run_group(item, settings.processes, settings.devices or 1,
                                      settings.timeout or DEFAULT_TIMEOUT_S, settings.keep)
        for report in reports:
            item.ihook.pytest_runtest_logreport(report=report)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def _run_group(self, item: pytest.Item, n: int, devices: int, timeout_s: float, keep: str) -> list:
        nodeid = _child_nodeid(item)
        directory = self.session.base / safe_name(nodeid)
        if directory.exists():  # stale from an earlier session; the processes share it and never remove it
            shutil.rmtree(directory, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix="jaxlog-processes-"))
        coordinator = f"{LOOPBACK}:{free_port()}"
        members = []
        try:
            for i in range(n):
                members.append(self._start(item, nodeid, work, i, n, devices, coordinator))
            ending = watch(members, timeout_s)
        except BaseException:  # Ctrl-C or SIGTERM here: the processes stop too
            from .fate import stop

            stop([m for m in members if m.proc.poll() is None])
            raise
        note = (f"ran in {n} jax.distributed processes (coordinator {coordinator}), {devices} host CPU "
                f"device{'s' if devices != 1 else ''} each: {' '.join(child_command(item, nodeid, work / 'tmp')[1:])}")
        group = Group(members, ending, timeout_s, directory, keep, note)
        reports = combine(item, group, self.session)
        if all(not r.failed for r in reports):
            shutil.rmtree(work, ignore_errors=True)  # a failed test's outputs and tmp_paths stay for a look
        return reports

    def _start(self, item: pytest.Item, nodeid: str, work: Path, i: int, n: int, devices: int,
               coordinator: str) -> Member:
        spec = {"nodeid": nodeid, "devices": devices, "report": str(work / f"reports.p{i}.json"),
                "jaxlog_dir": str(self.session.base), "workerid": f"process {i} of {n}",
                "processes": {"count": n, "index": i, "coordinator": coordinator}}
        env = child_env(devices, spec)
        forward_options(item.config, env)
        cmd = child_command(item, nodeid, work / f"tmp.p{i}") + ["--capture=tee-sys", "--no-summary"]
        output = work / f"output.p{i}.txt"
        with open(output, "w") as out:
            proc = subprocess.Popen(cmd, cwd=str(item.config.rootpath), env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=os.name == "posix")
        return Member(i, proc, Path(str(spec["report"])), output)


# ---------------------------------------------------------------------------------------------
# in each process


def launched_processes() -> int | None:
    """The process count of this session's ``jax.distributed`` when a launcher started it (a conftest
    called ``jax.distributed.initialize()`` under ``srun`` or a JobSet), or None when jax was never
    imported here."""
    if "jax" not in sys.modules:
        return None
    import jax

    return jax.process_count()


def share_directory(item: pytest.Item, session: Any) -> None:
    """The test's directory is shared by its processes: no process removes it (``keep=all``) or
    clears it as stale on first use, where another process may have written already."""
    if item.stash.get(STATE_KEY, None) is not None:
        return
    try:
        settings = marker_settings(item, session.settings)
    except JaxlogError:
        return  # the plugin's own setup hook fails the test with the message
    directory = session.base / safe_name(item.nodeid)
    item.stash[STATE_KEY] = TestState(item.nodeid, directory, replace(settings, keep="all"))


def start_distributed(spec: dict) -> None:
    """``jax.distributed`` for process ``index`` of ``count``, before the test module is imported
    (JAX must not have started a backend yet). Only the loopback interface is bound."""
    procs = spec["processes"]
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(coordinator_address=procs["coordinator"], num_processes=int(procs["count"]),
                                   process_id=int(procs["index"]), coordinator_bind_address=procs["coordinator"])
    except Exception as e:  # e.g. a conftest that ran a JAX computation: the backend started already
        raise pytest.UsageError(
            f"[jaxlog] {spec.get('nodeid')}: process {procs['index']} of {procs['count']} could not start "
            f"jax.distributed ({type(e).__name__}: {e}); a conftest must not run JAX computations at import "
            "(jax.distributed starts before the test module is imported)") from None


SLURM_VARIABLES = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
JAX_VARIABLES = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


@dataclass(frozen=True)
class Launch:
    """How a launcher started this session as one of several processes: the variables it set
    (``source``), the process count and this process's index, and the coordinator's address
    (None: ``jax.distributed.initialize()`` derives it, as under Slurm)."""

    source: str
    count: int
    index: int
    coordinator: str | None


def _launch_number(name: str) -> int:
    text = os.environ[name].strip()
    try:
        return int(text)
    except ValueError:
        raise pytest.UsageError(f"[jaxlog] {name}={text!r}: expected a whole number (set by the launcher that "
                                "started this session)") from None


def launched_by() -> Launch | None:
    """The launch this session's environment describes, when it is one process of several:
    ``srun`` (the ``SLURM_*`` variables ``jax.distributed.initialize()`` reads, more than one
    task), or ``JAX_COORDINATOR_ADDRESS`` with ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``
    (a JobSet, ``mpirun``, a script). None in the plugin's own children and xdist workers (they
    inherit the variables, not the role) and with ``JAXLOG_DISTRIBUTED=off``."""
    env = os.environ
    if env.get("JAXLOG_DISTRIBUTED", "").strip().lower() in ("0", "off", "no", "false"):
        return None
    if child_spec() is not None or env.get("PYTEST_XDIST_WORKER"):
        return None
    if all(env.get(k) for k in JAX_VARIABLES):
        launch = Launch("JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID", _launch_number("JAX_NUM_PROCESSES"),
                        _launch_number("JAX_PROCESS_ID"), env["JAX_COORDINATOR_ADDRESS"].strip())
    elif all(env.get(k) for k in SLURM_VARIABLES):
        # a job step's own task count: a batch script of an allocation of N tasks (the batch step,
        # one task) is not one of N processes, and would wait for the others forever
        if env.get("SLURM_STEP_NUM_TASKS") and _launch_number("SLURM_STEP_NUM_TASKS") < 2:
            return None
        launch = Launch("SLURM_*", _launch_number("SLURM_NTASKS"), _launch_number("SLURM_PROCID"), None)
    else:
        return None
    if launch.count < 2:
        return None
    if not 0 <= launch.index < launch.count:
        raise pytest.UsageError(f"[jaxlog] launched by {launch.source}: process {launch.index} of {launch.count} "
                                "does not exist (the index must be below the count)")
    return launch


def join_launched() -> Launch | bool:
    """``jax.distributed`` for a session a launcher started: from the launch's variables, before
    any test module is imported, unless a conftest started it already (then True). False when
    this session is a single process."""
    if "jax" in sys.modules:
        import jax

        if jax.distributed.is_initialized():
            return True
    launch = launched_by()
    if launch is None:
        return False
    import jax

    try:
        if launch.coordinator is None:
            jax.distributed.initialize()
        else:
            jax.distributed.initialize(coordinator_address=launch.coordinator, num_processes=launch.count,
                                       process_id=launch.index)
    except Exception as e:
        raise pytest.UsageError(
            f"[jaxlog] launched by {launch.source} as process {launch.index} of {launch.count}: could not start "
            f"jax.distributed ({type(e).__name__}: {e}); a conftest must not run JAX computations at import, "
            "and JAXLOG_DISTRIBUTED=off leaves starting it to the conftest") from None
    return launch


class DistributedChild:
    """In process *i* of a multi-process test (or of a session a launcher started: ``spec`` empty):
    the test's directory is shared, so no process
    removes it (created by the parent, kept or removed there from the combined outcome), and
    ``jax.distributed`` is shut down with the session (a barrier every process reaches).

    The parent stops the other processes with SIGTERM once one fails, at whatever point each has
    reached. Inside the test's setup, call and teardown the signal is an interrupt, as Ctrl-C
    (pytest reports it as one); anywhere else (pytest making or writing its reports, the
    terminal summary, the manifest) an exception would be raised inside pytest's hooks, an
    ``INTERNALERROR`` or a hook traceback in the process's output, so it is only noted there
    (``drive.signals``: the session counts as recording) and acted on at the next phase, or by
    the exit. A process that failed or was stopped exits at once after its session (its reports
    and manifest written): the others are not at the shutdown barrier, and JAX's distributed
    client would wait for them there at interpreter exit until its shutdown timeout."""

    def __init__(self, session: Any, spec: dict):
        from ..drive.signals import NOTED

        self.session = session
        self.spec = spec
        self.failed = False  # then the shutdown barrier is skipped: the other processes are being stopped
        self.exitstatus = 0
        self.noted = NOTED
        NOTED.recording += 1  # outside the test's phases a SIGTERM is noted, not raised

    @contextmanager
    def _interruptible(self) -> Iterator[None]:
        self.noted.recording -= 1
        try:
            self.noted.act()  # a SIGTERM noted between phases: the interrupt now, where pytest expects one
            yield
        finally:
            self.noted.recording += 1

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        if item.nodeid == self.spec.get("nodeid"):
            share_directory(item, self.session)
        with self._interruptible():
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        with self._interruptible():
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: Any) -> Iterator[None]:
        with self._interruptible():
            return (yield)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.failed = self.failed or report.failed

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.failed = self.failed or exitstatus != 0  # interrupted (SIGTERM), a usage error, ...
        self.exitstatus = int(exitstatus)

    @pytest.hookimpl(wrapper=True)
    def pytest_unconfigure(self, config: pytest.Config) -> Iterator[None]:
        signalled = bool(self.noted.signum)  # before the session's handler is released (which drops the note)
        yield
        self.noted.recording -= 1
        if not self.failed and not signalled:  # a barrier every process reaches when all passed
            import jax

            jax.distributed.shutdown()
            return
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(self.exitstatus or 1)
