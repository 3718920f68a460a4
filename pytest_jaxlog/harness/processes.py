"""Shared fate of the child processes of one multi-process test.

The processes of a ``jax.distributed`` program wait for each other in every collective, so one
that fails leaves the others blocked: without help a failing process turns into a hang. The
parent watches every process's reports as they come (each child rewrites its report file after
each phase) and, once one fails, lets it finish its own teardown (its files closed, its
manifest entry made) for at most ``GRACE_S``, then stops the others: SIGTERM first (a child
pytest turns it into an interrupt: its runs stop with their files ``stopped``), SIGKILL after
``GRACE_S`` for one blocked in a collective, where no Python signal handler runs. A group that
runs past its timeout is stopped the same way.

A failing process waits for the parent's word (its ``release`` file) before it exits: its exit
closes its connections, and a process still in a collective with it would fail on that ("Connection
closed by peer") before the parent's SIGTERM reached it, reporting an error of its own that is only
the first one's echo.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Literal

import pytest

from ..errors import JaxlogError
from .devices import _child_nodeid, child_command, child_env, child_spec, forward_options
from .options import marker_settings
from .session import STATE_KEY, TestState, _outcome, safe_name

GRACE_S = 5.0  # a failing process's own teardown; then SIGTERM's lead time before SIGKILL
POLL_S = 0.1


@dataclass
class Member:
    """One process of the group: its child pytest, where it reports, what it printed."""

    index: int
    proc: subprocess.Popen
    report: Path
    output: Path
    release: Path  # made by the parent: the process may exit (see the module's docstring)
    reports: list[dict] = field(default_factory=list)  # serialised TestReports, as the child wrote them
    stopped: str | None = None  # SIGTERM or SIGKILL when the parent ended it

    def read(self) -> None:
        try:
            data = json.loads(self.report.read_text())
        except (OSError, ValueError):  # not written yet (each write is atomic: never half a file)
            return
        self.reports = list(data.get("reports", ()))

    def failed(self) -> bool:
        """A failed phase, or an exit with an error before reporting one (a crash, a usage error)."""
        code = self.proc.poll()
        return any(r.get("outcome") == "failed" for r in self.reports) or (code is not None and code != 0)

    def finished(self) -> bool:
        return self.proc.poll() is not None or any(r.get("when") == "teardown" for r in self.reports)

    def tail(self, chars: int = 6000) -> str:
        try:
            text = self.output.read_text(errors="replace")
        except OSError:
            return ""
        return text[-chars:]


@dataclass(frozen=True)
class Ending:
    """How the group ended: the process that failed first (None if none did), and whether the
    group ran past its timeout."""

    first_failed: int | None
    timed_out: bool


def watch(members: list[Member], timeout_s: float) -> Ending:
    """Wait for every process; stop them all when one fails or the timeout passes."""
    deadline = time.monotonic() + timeout_s
    first: int | None = None
    grace_until = 0.0
    while True:
        for m in members:
            m.read()
        if first is None:
            first = next((m.index for m in members if m.failed()), None)
            grace_until = time.monotonic() + GRACE_S
        alive = [m for m in members if m.proc.poll() is None]
        if not alive:
            break
        if first is not None and (members[first].finished() or time.monotonic() > grace_until):
            stop([m for m in alive if m.index != first])
            _release(members)
            _let_finish(members[first], max(grace_until, time.monotonic()) + GRACE_S)
            break
        if time.monotonic() > deadline:
            stop(alive)
            for m in members:
                m.read()
            return Ending(first, True)
        time.sleep(POLL_S)
    for m in members:
        m.read()
    return Ending(first, False)


def _release(members: list[Member]) -> None:
    """Tell the processes still running that they may exit (the others are stopped)."""
    for m in members:
        try:
            m.release.touch()
        except OSError:  # its directory gone: the process gives up waiting on its own
            pass


def _let_finish(m: Member, until: float) -> None:
    """The failing process past its teardown is still writing its reports and its manifest entry:
    a signal now would land inside pytest's report hooks (a traceback in its output, an entry
    lost), so it is left to exit on its own until ``until``, and stopped only after that."""
    while m.proc.poll() is None and time.monotonic() < until:
        time.sleep(POLL_S)
    if m.proc.poll() is None:
        stop([m])


def _signal(m: Member, sig: int) -> None:
    """``sig`` to the child's process group (it started one: the test may have started processes too)."""
    try:
        os.killpg(m.proc.pid, sig)
    except (AttributeError, ProcessLookupError, PermissionError):
        try:
            m.proc.send_signal(sig)
        except ProcessLookupError:
            pass


def stop(members: list[Member]) -> None:
    """SIGTERM to every member still running, SIGKILL to those alive ``GRACE_S`` later."""
    for m in members:
        if m.proc.poll() is None:
            _signal(m, signal.SIGTERM)
            m.stopped = "SIGTERM"
    deadline = time.monotonic() + GRACE_S
    for m in members:
        try:
            m.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(m, getattr(signal, "SIGKILL", signal.SIGTERM))
            m.stopped = "SIGKILL"
            m.proc.wait()


@contextmanager
def cores_held(base: Path) -> Iterator[None]:
    """One multi-process test at a time for all sessions writing to ``base`` (the workers of one
    xdist session share it): their N processes each want the machine's cores, and two groups
    side by side only slow each other into their timeouts. No lock where ``fcntl`` is missing."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    digest = hashlib.sha1(str(base).encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"jaxlog-processes-{digest}.lock"
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)

# ---------------------------------------------------------------------------------------------
# One test's reports from the reports of its N processes.
#
# The test passes when every process passed; otherwise each failing phase's report holds every
# failing process's traceback under its label (``process 1 of 2``), says which processes were
# stopped and how, and carries what each process printed. The manifest entry is process 0's with
# the others' files, violations and notes added and a ``processes`` list (each one's outcome, how
# it ended, its runs); whether the test's directory is kept is decided here, once, from the
# combined outcome (the processes keep everything: one passing process must not remove the
# evidence of another's failure).

Phase = Literal["setup", "call", "teardown"]
PHASES: tuple[Phase, ...] = ("setup", "call", "teardown")


@dataclass(frozen=True)
class Group:
    """What the reports are made from: the members, how they ended, the timeout, the test's
    directory and ``keep`` setting, and a note on how the test ran."""

    members: list[Member]
    ending: Ending
    timeout_s: float
    directory: Path
    keep: str
    note: str

    def label(self, i: int) -> str:
        return f"process {i} of {len(self.members)}"


def _loaded(config: pytest.Config, m: Member) -> dict[str, Any]:
    out = {}
    for d in m.reports:
        r = config.hook.pytest_report_from_serializable(config=config, data=d)
        out[r.when] = r
    return out


def _fate_lines(group: Group, per: list[dict[str, Any]]) -> list[str]:
    """How each process that did not pass ended, one line each."""
    lines = []
    if group.ending.timed_out:
        lines.append(f"[jaxlog] timeout: the {len(group.members)} processes of this test ran past "
                     f"timeout={group.timeout_s:g} s and were stopped")
    elif group.ending.first_failed is not None:
        lines.append(f"[jaxlog] {group.label(group.ending.first_failed)} failed; the others were stopped")
    # a process that reported its whole test may still die at its exit once another was stopped:
    # process 0 hosts jax.distributed's coordination service, and its client in every other
    # process aborts when it goes; that death says nothing about the test
    stopped_any = any(m.stopped for m in group.members)
    for m, reports in zip(group.members, per):
        bad = [w for w in PHASES if w in reports and reports[w].failed]
        if m.stopped:
            how = f"stopped by {m.stopped}" + (" at the timeout" if group.ending.timed_out else "")
        elif "teardown" not in reports or (m.proc.returncode not in (0, 1) and not stopped_any):
            how = f"exited with code {m.proc.returncode} before reporting the test (its output below)"
        else:
            how = None
        if bad or how:
            what = ", ".join([f"failed in {w}" for w in bad] + ([how] if how else []))
            lines.append(f"  {group.label(m.index)}: {what}")
    return lines


def _sections(group: Group, per: list[dict[str, Any]], when: Phase, failing: bool) -> list[tuple[str, str]]:
    out = []
    for m, reports in zip(group.members, per):
        r = reports.get(when)
        for name, text in (r.sections if r is not None else ()):
            out.append((f"{name} ({group.label(m.index)})", text))
        if failing and when == "call" and "call" not in reports:  # killed or crashed: what it printed
            out.append((f"output of {group.label(m.index)}", m.tail() or "(nothing)"))
    return out + [("jaxlog", group.note)]


def _failed_report(item: pytest.Item, group: Group, per: list[dict[str, Any]], when: Phase,
                   head: list[str]) -> pytest.TestReport:
    parts = ["\n".join(head)]
    for m, reports in zip(group.members, per):
        r = reports.get(when)
        if r is not None and r.failed:
            parts.append(f"{'=' * 20} {group.label(m.index)}: {when} {'=' * 20}\n{r.longreprtext}")
    return pytest.TestReport(item.nodeid, item.location, {}, "failed", "\n".join(parts), when,
                             sections=_sections(group, per, when, True))


def combine(item: pytest.Item, group: Group, session: Any) -> list[pytest.TestReport]:
    """The test's setup, call and teardown reports, the teardown one with the manifest entry."""
    per = [_loaded(item.config, m) for m in group.members]
    head = _fate_lines(group, per)
    failing = bool(head)
    reports: dict[str, pytest.TestReport] = {}
    for when in PHASES:
        got = [p.get(when) for p in per]
        if failing and (any(r is not None and r.failed for r in got) or (when == "call" and not any(
                r is not None and r.failed for p in per for r in p.values()))):
            reports[when] = _failed_report(item, group, per, when, head)
        elif got[0] is not None and not failing:
            r = got[0]
            r.nodeid = item.nodeid
            r.sections = _sections(group, per, when, False)
            reports[when] = r
        else:  # a phase that failed nowhere while the test failed (or process 0 never reached it)
            reports[when] = pytest.TestReport(item.nodeid, item.location, {}, "passed", None, when,
                                              sections=[("jaxlog", group.note)])
        if when == "setup" and reports[when].failed or when == "call" and reports["setup"].skipped:
            break  # pytest makes no call report after a failed or skipped setup
    teardown = reports.get("teardown")
    if teardown is None:
        teardown = reports["teardown"] = pytest.TestReport(item.nodeid, item.location, {}, "passed", None, "teardown")
    teardown.jaxlog = merged_entry(item, group, per, reports, session)  # type: ignore[attr-defined]  # read by the plugin's report hook
    first_teardown = per[0].get("teardown")
    if first_teardown is not None and teardown is not first_teardown:
        teardown.user_properties = list(first_teardown.user_properties)
    return [reports[w] for w in PHASES if w in reports]


def merged_entry(item: pytest.Item, group: Group, per: list[dict[str, Any]], reports: dict[str, Any],
                 session: Any) -> dict:
    """Process 0's manifest entry (or a new one), with the others' files, the combined outcome, and
    the test's directory kept or removed as ``keep`` says for that outcome."""
    outcome = _outcome(reports, None)
    if reports["teardown"].failed:
        outcome = "error"
    entries = [getattr(p.get("teardown"), "jaxlog", None) for p in per]
    entry = dict(entries[0]) if isinstance(entries[0], dict) else session._entry(item, outcome, reports, None)
    entry.update(nodeid=item.nodeid, outcome=outcome, worker=f"processes={len(group.members)}")
    artifacts = dict(entry.get("artifacts") or {})
    violations = list(entry.get("violations") or [])
    notes = list(entry.get("notes") or [])
    for i, e in enumerate(entries[1:], start=1):
        if not isinstance(e, dict):
            continue
        for key, path in (e.get("artifacts") or {}).items():
            if path not in artifacts.values():
                artifacts[f"p{i}:{key}"] = path
        violations += [v for v in e.get("violations") or () if v not in violations]
        notes += [f"{group.label(i)}: {n}" for n in e.get("notes") or ()]
    entry.update(artifacts=artifacts, violations=violations, notes=notes + _fate_lines(group, per))
    entry["processes"] = [
        {"index": m.index, "outcome": e.get("outcome") if isinstance(e, dict) else None,
         "exit_code": m.proc.returncode, "stopped": m.stopped,
         "runs": e.get("runs", []) if isinstance(e, dict) else []}
        for m, e in zip(group.members, entries)
    ]
    failed_like = outcome in ("failed", "error", "xfailed", "xpassed")
    kept = group.keep == "all" or (group.keep == "failed" and failed_like)
    if not kept:
        shutil.rmtree(group.directory, ignore_errors=True)
    kept = kept and group.directory.exists()
    entry.update(kept=kept, dir=session.manifest_path(group.directory) if kept else None)
    if not kept:
        entry["artifacts"] = {}
    return entry

# ---------------------------------------------------------------------------------------------
# ``@pytest.mark.jaxlog(processes=N, devices=M)``: a test run as N ``jax.distributed`` processes.
#
# What a multi-process kernel needs a launcher for (Slurm, Kubernetes, ``mpirun``), a user can
# test on a laptop: the test runs in N child pytests on this machine (as ``devices=`` runs one),
# process *i* of N with ``jax.distributed`` started before the test module is imported (a
# coordinator on a free loopback port, CPU collectives through gloo) and M host CPU devices of its
# own. Each process's ``jaxlog`` fixture writes its part of the test's trajectory in the test's one
# directory (``jl.load`` reads the whole); timelines and profiles are per process.
#
# Shared fate (``harness.processes``): a failure in any process fails the test and stops the others;
# so does ``timeout=`` seconds (default ``DEFAULT_TIMEOUT_S``), SIGTERM first, SIGKILL after
# ``fate.GRACE_S``. The report (``harness.processes``) labels each process's traceback and
# output. Under pytest-xdist the workers of a session take turns: one group runs at a time
# (``fate.cores_held``); grouping such tests with ``@pytest.mark.xdist_group`` and
# ``--dist loadgroup`` also keeps the other workers' tests off the cores they wait for.

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
            pass

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
                "processes": {"count": n, "index": i, "coordinator": coordinator},
                "release": str(work / f"release.p{i}")}
        env = child_env(devices, spec)
        forward_options(item.config, env)
        cmd = child_command(item, nodeid, work / f"tmp.p{i}") + ["--capture=tee-sys", "--no-summary"]
        output = work / f"output.p{i}.txt"
        with open(output, "w") as out:
            proc = subprocess.Popen(cmd, cwd=str(item.config.rootpath), env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=os.name == "posix")
        return Member(i, proc, Path(str(spec["report"])), output, Path(str(spec["release"])))


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
    (``drive.host.signals``: the session counts as recording) and acted on at the next phase, or by
    the exit. A process that failed or was stopped exits after its session (its reports and
    manifest written) without JAX's shutdown: the others are not at the shutdown barrier, and
    JAX's distributed client would wait for them there at interpreter exit until its shutdown
    timeout. One that failed first waits for the parent's release (see the module's docstring)."""

    def __init__(self, session: Any, spec: dict):
        from ..drive.host.signals import NOTED

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
        if not signalled and self.spec.get("release"):
            try:
                _await_release(Path(self.spec["release"]), self.noted)
            except BaseException:  # noqa: BLE001  (stopped while it waits: it exits all the same)
                pass
        os._exit(self.exitstatus or 1)


RELEASE_WAIT_S = 4 * GRACE_S  # the parent stops the others within 2 * GRACE_S; past this it is gone


def _await_release(path: Path, noted: Any) -> None:
    """Until the parent made ``path`` (the others are stopped), this process is stopped itself
    (a SIGTERM, noted), or ``RELEASE_WAIT_S`` passed."""
    until = time.monotonic() + RELEASE_WAIT_S
    while not path.exists() and not noted.signum and time.monotonic() < until:
        time.sleep(POLL_S / 4)
