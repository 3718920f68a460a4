"""pytest plugin ``jaxlog``: options, marker, the ``jaxlog``/``jaxlog_factory`` fixtures, artifacts, reports.

Thin on purpose: the work is in ``harness/``. Loading this module imports no jax, h5py or
perfetto, so a user's conftest can still set ``XLA_FLAGS``/``JAX_*`` before jax starts.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from .errors import JaxlogError
from .harness import session as run_errors
from .harness.baselines import add_options as add_benchmark_options
from .harness.devices import ChildReports, DevicesPlugin, child_spec
from .harness.fixture import JaxlogFactory, JaxlogFixture
from .harness.options import add_options, marker_settings
from .harness.processes import DistributedChild, ProcessesPlugin, join_launched, start_distributed
from .harness.report import JunitAttachments, ReportPlugin, add_report_option
from .harness.session import REPORTS_KEY, SESSION_KEY, JaxlogSession, uses_jaxlog


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)
    add_benchmark_options(parser)
    add_report_option(parser)


@pytest.hookimpl(trylast=True)  # after conftests' pytest_configure, which may set defaults (examples/conftest.py)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "jaxlog(profile=(start, stop), keep='failed|all|none', on_violation='raise|warn|record', chunk=N, "
        "progress='auto|on|off', devices=N): per-test settings of the jaxlog fixture; devices=N runs the test "
        "under N host CPU devices (in a child pytest when this process's jax has another count); processes=N, "
        "timeout=S: the test runs in N jax.distributed processes on this machine with shared fate",
    )
    session = config.stash[SESSION_KEY] = JaxlogSession(config)
    config.pluginmanager.register(_Collector(session), "jaxlog-collector")
    config.pluginmanager.register(DevicesPlugin(session), "jaxlog-devices")
    config.pluginmanager.register(ProcessesPlugin(session), "jaxlog-processes")
    config.pluginmanager.register(JunitAttachments(session), "jaxlog-junit")
    config.pluginmanager.register(ReportPlugin(session), "jaxlog-report")
    child = child_spec()
    if child is not None:
        config.pluginmanager.register(ChildReports(config, child), "jaxlog-child-reports")
        if child.get("processes"):  # one of several processes: jax.distributed before the test module's import
            start_distributed(child)
            config.pluginmanager.register(DistributedChild(session, child), "jaxlog-distributed-child")
    elif join_launched():  # srun, a JobSet, ...: one of several sessions, jax.distributed started
        config.pluginmanager.register(DistributedChild(session, {}), "jaxlog-distributed-child")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: every worker writes under the controller's (absolute) artifact directory."""
    session = node.config.stash.get(SESSION_KEY, None)
    if session is not None:
        node.workerinput["jaxlog_dir"] = str(session.base)


def pytest_report_header(config: pytest.Config) -> str | None:
    s = config.stash.get(SESSION_KEY, None)
    if s is None or s.worker is not None:
        return None
    flags = "".join(f" {f}" for f, on in (("regen", s.regen), ("create_goldens", s.create_goldens)) if on)
    if s.compile_cache is not None:
        flags += f" compile_cache={s.display(s.compile_cache)}"
    return f"jaxlog: dir={s.display(s.base)} keep={s.settings.keep} golden_dir={s.display(s.golden_dir)}{flags}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[Any]:
    session = item.config.stash[SESSION_KEY]
    session.current_item = item
    try:
        return (yield)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: pytest makes no report; the manifest still lists the test
        session.interrupted_item(item)
        raise
    finally:
        session.current_item = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    session = item.config.stash[SESSION_KEY]
    entry = None
    if call.when in ("setup", "call") and call.excinfo is not None:  # setup: a fixture that ran a kernel failed
        session.note_failure(item, call.excinfo)
    elif call.when == "teardown":
        entry = session.finish_item(item, call.excinfo)  # before the report copies user_properties
    report = yield
    run_errors.mark(report, call.excinfo)  # a usage error before a run's first step: pytest's error outcome
    item.stash.setdefault(REPORTS_KEY, {})[call.when] = report
    if call.when in ("setup", "call") and report.failed:
        text = session.section(item, call.excinfo)
        if text:
            report.sections.append(("jaxlog", text))
    if entry is not None:
        report.jaxlog = entry  # travels to the xdist controller with the report
    return report


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> Any:
    return run_errors.teststatus(report)


class _Collector:
    """Registered per config: gathers manifest entries from reports (the xdist controller gets the workers')."""

    def __init__(self, session: JaxlogSession):
        self.session = session

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = getattr(report, "jaxlog", None)
        if isinstance(entry, dict) and report.when == "teardown":
            self.session.record_entry(entry)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if uses_jaxlog(item):  # the first such test sets up SIGTERM handling and the compile cache
        item.config.stash[SESSION_KEY].activate()
    if item.get_closest_marker("jaxlog") is not None:
        try:
            marker_settings(item, item.config.stash[SESSION_KEY].settings)
        except JaxlogError as e:
            error = str(e)
        else:
            return
        pytest.fail(error, pytrace=False)  # outside the except: no "During handling ..." repeat of the message


def pytest_sessionstart(session: pytest.Session) -> None:
    s = session.config.stash.get(SESSION_KEY, None)
    if s is not None:
        s.start()  # what earlier sessions left: kept and listed as stale, or removed (--jaxlog-clean-stale)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    s = session.config.stash.get(SESSION_KEY, None)
    if s is not None:
        # now, not at unconfigure: an xdist worker may be ended as soon as it reports its session finished
        s.release_compile_cache()
        s.discard.finish()
        s.baselines.save(s.entries.values())  # the controller's, with every worker's benchmarks
        s.write_manifest(exitstatus)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    s = config.stash.get(SESSION_KEY, None)
    if s is not None:
        s.summary(terminalreporter)


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.release_sigterm()
        session.release_compile_cache()  # a session that ended before sessionfinish
        session.release_project()
    for name in ("jaxlog-collector", "jaxlog-devices", "jaxlog-child-reports", "jaxlog-processes",
                 "jaxlog-distributed-child", "jaxlog-junit", "jaxlog-report"):
        registered = config.pluginmanager.get_plugin(name)
        if registered is not None:
            config.pluginmanager.unregister(registered)


@pytest.fixture
def jaxlog(request: pytest.FixtureRequest) -> Iterator[JaxlogFixture]:
    """Runs kernels with ``jaxlog.run(step, state, steps, ...)`` / ``jaxlog.recorder(...)`` into this test's
    artifact directory (``jaxlog.dir``): HDF5 trajectory, timeline, profile window per marker/options."""
    session = request.config.stash[SESSION_KEY]
    fx = JaxlogFixture(session, session.state_for(request.node))
    yield fx
    fx.close()


@pytest.fixture(scope="session")
def jaxlog_factory(request: pytest.FixtureRequest) -> JaxlogFactory:
    """For ``@given`` tests: ``with jaxlog_factory() as jaxlog:`` per example (no function-scoped fixture)."""
    return JaxlogFactory(request.config.stash[SESSION_KEY])
