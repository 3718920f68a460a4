"""``@pytest.mark.jaxlog(devices=N)``: a test that runs under N host CPU devices.

JAX fixes its device count when it starts (``--xla_force_host_platform_device_count`` in
``XLA_FLAGS``), once per process. A test asking for N devices runs in this process when its jax
already runs on the CPU with N devices; otherwise it runs alone in a child pytest started with
``XLA_FLAGS``/``JAX_PLATFORMS=cpu`` set for N, and the child's reports come back as this test's
(its outcome, output, and its jaxlog manifest entry: artifacts go to this session's directory).

Under pytest-xdist, tests asking for devices are best grouped on one worker
(``@pytest.mark.xdist_group("jaxlog-devices")`` with ``--dist loadgroup``): their children then
run one at a time instead of each spreading N device threads over cores the other workers use.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from ..errors import JaxlogError
from .options import OPTIONS, lookup, marker_settings

CHILD_ENV = "JAXLOG_DEVICES_CHILD"  # in the child: {"nodeid", "devices", "report", "jaxlog_dir", "workerid"}
DEVICE_FLAG = "--xla_force_host_platform_device_count"
# options of the parent's command line the child needs to collect and run the test the same way
_FORWARD = {"-p": True, "-o": True, "--override-ini": True, "-W": True, "--pythonwarnings": True,
            "--import-mode": True, "--confcutdir": True, "--noconftest": False, "--strict-markers": False}


def child_spec() -> dict | None:
    """What this process runs as a child (None in an ordinary session)."""
    raw = os.environ.get(CHILD_ENV, "").strip()
    if not raw:
        return None
    try:
        spec = json.loads(raw)
    except ValueError:
        raise JaxlogError(f"{CHILD_ENV}={raw[:200]!r} is not the JSON a parent session sets") from None
    return spec if isinstance(spec, dict) else None


def running_devices() -> tuple[str, int] | None:
    """(backend, device count) of this process's jax, or None when jax was never imported here
    (a child is then cheaper than starting jax in this process only to compare)."""
    if "jax" not in sys.modules:
        return None
    import jax

    return jax.default_backend(), jax.device_count()


def child_env(devices: int, spec: dict) -> dict[str, str]:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_FLAG)]
    env["XLA_FLAGS"] = " ".join([*flags, f"{DEVICE_FLAG}={devices}"])
    env["JAX_PLATFORMS"] = "cpu"
    env[CHILD_ENV] = json.dumps(spec)
    return env


def _forwarded(args: tuple[str, ...]) -> list[str]:
    out, i = [], 0
    while i < len(args):
        a = args[i]
        name = a.split("=", 1)[0]
        if name in _FORWARD:
            if _FORWARD[name] and "=" not in a and i + 1 < len(args):
                out += [a, args[i + 1]]
                i += 1
            else:
                out.append(a)
        elif a.startswith("-p") and len(a) > 2 and not a.startswith("--"):  # -pNAME
            out.append(a)
        i += 1
    return out


def forward_options(config: pytest.Config, env: dict[str, str]) -> None:
    """The session's jaxlog options from the command line, as a child reads them (its variables)."""
    for key, opt in OPTIONS.items():
        src = lookup(config, key)
        if src.origin == "cli" and key != "dir":
            env[opt.env] = "1" if src.value is True else str(src.value)


def child_command(item: pytest.Item, nodeid: str, basetemp: Path) -> list[str]:
    """The pytest command line that runs ``nodeid`` alone, collected as the parent collects it."""
    config = item.config
    cmd = [sys.executable, "-m", "pytest", nodeid, "-p", "no:cacheprovider", "-q",
           f"--basetemp={basetemp}", f"--rootdir={config.rootpath}"]
    if config.inipath is not None:
        cmd += ["-c", str(config.inipath)]
    if config.pluginmanager.hasplugin("xdist"):
        cmd += ["-n", "0"]  # the test alone, in the child itself (an ini's -n would start workers)
    return cmd + _forwarded(tuple(config.invocation_params.args))


def _child_nodeid(item: pytest.Item) -> str:
    """The id the child collects: without the ``@group`` suffix ``--dist loadgroup`` appends."""
    nodeid = item.nodeid
    for mark in item.iter_markers("xdist_group"):
        name = mark.args[0] if mark.args else mark.kwargs.get("name")
        if name is not None and nodeid.endswith(f"@{name}"):
            return nodeid[: -len(name) - 1]
    return nodeid


class DevicesPlugin:
    """Runs a test that asks for devices this process's jax does not have in a child pytest."""

    def __init__(self, session: Any):
        self.session = session

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any) -> bool | None:
        if item.get_closest_marker("jaxlog") is None:
            return None
        try:
            settings = marker_settings(item, self.session.settings)
        except JaxlogError:
            return None  # the bad marker argument fails the test in setup, with its message
        n = settings.devices
        if n is None or settings.processes is not None or child_spec() is not None:  # processes: harness.processes
            return None
        running = running_devices()
        if running == ("cpu", n):
            return None
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        for report in self._run_child(item, n, running):
            item.ihook.pytest_runtest_logreport(report=report)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def _run_child(self, item: pytest.Item, n: int, running: tuple[str, int] | None) -> list:
        config = item.config
        work = Path(tempfile.mkdtemp(prefix="jaxlog-devices-"))
        report_path = work / "reports.json"
        nodeid = _child_nodeid(item)
        spec = {"nodeid": nodeid, "devices": n, "report": str(report_path), "jaxlog_dir": str(self.session.base),
                "workerid": f"devices={n}"}
        env = child_env(n, spec)
        forward_options(config, env)
        cmd = child_command(item, nodeid, work / "tmp")
        proc = subprocess.Popen(cmd, cwd=str(config.rootpath), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            output, _ = proc.communicate()
        except BaseException:  # Ctrl-C or SIGTERM here: the child stops too (its runs close their files)
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        where = "this process runs no jax yet" if running is None else \
            f"this process's jax runs {running[1]} {running[0]} device{'s' if running[1] != 1 else ''}"
        note = f"ran in a child pytest with {n} host CPU devices ({where}): {' '.join(cmd[1:])}"
        reports = self._reports(item, report_path, output, proc.returncode, note)
        if all(not r.failed for r in reports):
            shutil.rmtree(work, ignore_errors=True)  # a failed test's tmp_path stays for a look
        return reports

    def _reports(self, item: pytest.Item, path: Path, output: str, code: int, note: str) -> list:
        config = item.config
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {"reports": []}
        reports = []
        for d in data.get("reports", ()):
            r = config.hook.pytest_report_from_serializable(config=config, data=d)
            r.nodeid = item.nodeid
            r.sections.append(("jaxlog", note))
            reports.append(r)
        if any(r.when == "teardown" for r in reports):
            return reports
        text = (f"[jaxlog] the child pytest running this test under its devices ended (exit code {code}) "
                f"without reporting the test; its output:\n{output[-8000:]}")
        made = [pytest.TestReport(item.nodeid, item.location, {}, outcome, text if outcome == "failed" else None,
                                  when, sections=[("jaxlog", note)])
                for when, outcome in (("setup", "passed"), ("call", "failed"), ("teardown", "passed"))
                if not any(r.when == when for r in reports)]
        return reports + made


class ChildReports:
    """In the child: the test's reports, serialised for the parent (written at session end)."""

    def __init__(self, config: pytest.Config, spec: dict):
        self._config = config
        self.spec = spec
        self.reports: list[dict] = []

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        n = self.spec.get("devices")
        if item.nodeid != self.spec.get("nodeid") or not n:
            return
        import jax

        # one of several processes (harness.processes): the devices are this process's own
        many = bool(self.spec.get("processes"))
        backend, count = jax.default_backend(), jax.local_device_count() if many else jax.device_count()
        if (backend, count) != ("cpu", n):
            pytest.fail(f"[jaxlog] {item.nodeid}: @pytest.mark.jaxlog(devices={n}) ran in a child pytest with "
                        f"XLA_FLAGS={os.environ.get('XLA_FLAGS')!r}, but its jax has {count} {backend} devices: "
                        f"a conftest that sets XLA_FLAGS or JAX_PLATFORMS unconditionally overrides the "
                        f"child's; set them with os.environ.setdefault", pytrace=False)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        config = self._config
        self.reports.append(config.hook.pytest_report_to_serializable(config=config, report=report))
        if self.spec.get("processes"):  # the parent watches every process's reports as they come
            self.pytest_sessionfinish(None)

    def pytest_sessionfinish(self, session: pytest.Session | None) -> None:
        path = self.spec.get("report")
        if path:
            tmp = Path(f"{path}.tmp")
            tmp.write_text(json.dumps({"reports": self.reports}, default=str))
            os.replace(tmp, path)
