"""pytest plugin ``jaxlog``: options, marker, the ``jaxlog``/``jaxlog_factory`` fixtures, artifacts, reports.

Thin on purpose: the work is in ``harness/``. Loading this module imports no jax, h5py or
perfetto, so a user's conftest can still set ``XLA_FLAGS``/``JAX_*`` before jax starts.

Quiet until used (as hypothesis's plugin is): a session that does not use jaxlog gets the options
and the marker, and nothing else: no setting resolved (a bad ``JAXLOG_*`` variable set for other
test commands fails nothing), no sub-plugin, header, summary section, manifest, report or compile
cache. A pytest process *uses jaxlog* when

- a ``--jaxlog-*`` option is given on the command line or a ``jaxlog_*`` key is set in the ini
  file (``options.given_explicitly``; not the environment): from configure on, as before;
- it is one of jaxlog's own children (``devices=N``/``processes=N``) or one process of a launch
  (srun, ``JAX_COORDINATOR_ADDRESS``...): from configure on, since ``jax.distributed`` must start
  before the test modules are imported;
- a collected and selected test asks for the ``jaxlog`` or ``jaxlog_factory`` fixture or carries
  the ``jaxlog`` marker (``pytest_collection_modifyitems``, after ``-k``/``-m`` deselected theirs);
  the header line then comes after the collection line;
- a test asks for a jaxlog fixture by ``request.getfixturevalue``: at that moment.

Under pytest-xdist the controller collects nothing: it uses jaxlog from configure on the options'
terms, else from the first report of a worker's test that uses it (``jaxlog_uses``, or the manifest
entry its teardown report carries); each worker decides from its own collection (or is told so when
the controller used jaxlog from configure on). A worker whose settings are bad errors its jaxlog
tests with the message, and the controller, resolving the same settings at their first report,
stops the session with it: one usage error either way. Under ``-p no:jaxlog`` this module is not
loaded at all (``harness.disabled`` skips the tests that need its fixtures).
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from .errors import JaxlogError
from .harness import session as run_errors
from .harness.baselines import OPTIONS as BENCHMARK_OPTIONS
from .harness.baselines import add_options as add_benchmark_options
from .harness.devices import ChildReports, DevicesPlugin, child_spec
from .harness.fixture import JaxlogFactory, JaxlogFixture
from .harness.options import OPTIONS, add_options, given_explicitly, marker_settings, usage_error
from .harness.processes import DistributedChild, ProcessesPlugin, join_launched, launched_by, start_distributed
from .harness.report import REPORT, JunitAttachments, ReportPlugin, add_report_option
from .harness.session import REPORTS_KEY, SESSION_KEY, JaxlogSession, artifact_dir, uses_jaxlog

SUB_PLUGINS = ("jaxlog-collector", "jaxlog-devices", "jaxlog-child-reports", "jaxlog-processes",
               "jaxlog-distributed-child", "jaxlog-junit", "jaxlog-report")
ERROR_KEY = pytest.StashKey[str]()  # an xdist worker whose settings are bad: its jaxlog tests error with this
HEADER_KEY = pytest.StashKey[bool]()  # headers shown (False: without jaxlog's, made later), absent: not shown
ITEM_KEY = pytest.StashKey["pytest.Item | None"]()  # the running test, whether or not a session exists
STARTED_KEY = pytest.StashKey[bool]()  # pytest_sessionstart has run: a session made later starts itself
WATCH = "jaxlog-controller-watch"
USES_FLAG = "jaxlog_uses"  # on an xdist worker's reports of a test that uses jaxlog: the controller's cue


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
    if _used_from_the_start(config):
        use(config)
    elif getattr(config, "workerinput", None) is None and getattr(config.option, "dist", "no") != "no":
        config.pluginmanager.register(_ControllerWatch(config), WATCH)


def _used_from_the_start(config: pytest.Config) -> bool:
    """Whether this process uses jaxlog before any test is collected (see the module's docstring)."""
    worker = getattr(config, "workerinput", None)
    if worker is not None and worker.get("jaxlog_used"):
        return True
    if given_explicitly(config, [*OPTIONS.values(), *BENCHMARK_OPTIONS.values(), REPORT]) is not None:
        return True
    try:
        return child_spec() is not None or launched_by() is not None
    except JaxlogError as e:
        raise usage_error(e) from None


def use(config: pytest.Config, late: bool = False) -> JaxlogSession:
    """This process's session, made on first use with its sub-plugins: every setting is resolved
    here, a bad one a ``[jaxlog]`` usage error. ``late``: made on an xdist controller while its
    workers run tests (``JaxlogSession.start``)."""
    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        return session
    try:
        session = JaxlogSession(config)
        report = ReportPlugin(session)  # resolves --jaxlog-report: before anything is registered
    except pytest.UsageError as e:
        raise usage_error(e) from None
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(_Collector(session), "jaxlog-collector")
    config.pluginmanager.register(DevicesPlugin(session), "jaxlog-devices")
    config.pluginmanager.register(ProcessesPlugin(session), "jaxlog-processes")
    config.pluginmanager.register(JunitAttachments(session), "jaxlog-junit")
    config.pluginmanager.register(report, "jaxlog-report")
    child = child_spec()
    if child is not None:
        config.pluginmanager.register(ChildReports(config, child), "jaxlog-child-reports")
        if child.get("processes"):  # one of several processes: jax.distributed before the test module's import
            start_distributed(child)
            config.pluginmanager.register(DistributedChild(session, child), "jaxlog-distributed-child")
    elif join_launched():  # srun, a JobSet, ...: one of several sessions, jax.distributed started
        config.pluginmanager.register(DistributedChild(session, {}), "jaxlog-distributed-child")
    session.current_item = config.stash.get(ITEM_KEY, None)
    if config.stash.get(STARTED_KEY, False):
        session.start(late=late)
    return session


def _for_test(config: pytest.Config) -> JaxlogSession:
    """The session for a test that uses jaxlog; a bad setting fails the test with its one line."""
    error = config.stash.get(ERROR_KEY, None)
    if error is None:
        try:
            return use(config)
        except pytest.UsageError as e:
            error = str(e)
    pytest.fail(error, pytrace=False)


@pytest.hookimpl(trylast=True)  # after -k/-m deselected theirs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.stash.get(SESSION_KEY, None) is not None or not any(uses_jaxlog(item) for item in items):
        return
    try:
        use(config)
    except pytest.UsageError as e:
        if getattr(config, "workerinput", None) is None:
            raise  # the session's one usage error
        config.stash[ERROR_KEY] = str(e)  # an xdist worker: a usage error there is an INTERNALERROR

@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: every worker writes under the controller's (absolute) artifact directory,
    and uses jaxlog from the start when the controller does."""
    config = node.config
    session = config.stash.get(SESSION_KEY, None)
    node.workerinput["jaxlog_dir"] = str(session.base if session is not None else artifact_dir(config))
    if session is not None:
        node.workerinput["jaxlog_used"] = True


def _header(config: pytest.Config) -> str | None:
    s = config.stash.get(SESSION_KEY, None)
    if s is None or s.worker is not None:
        return None
    flags = "".join(f" {f}" for f, on in (("regen", s.regen), ("create_goldens", s.create_goldens)) if on)
    if s.compile_cache is not None:
        flags += f" compile_cache={s.display(s.compile_cache)}"
    return f"jaxlog: dir={s.display(s.base)} keep={s.settings.keep} golden_dir={s.display(s.golden_dir)}{flags}"


def pytest_report_header(config: pytest.Config) -> str | None:
    header = _header(config)
    config.stash[HEADER_KEY] = header is not None
    return header


def pytest_report_collectionfinish(config: pytest.Config) -> str | None:
    """The header of a session that found its first jaxlog test in the collection (where pytest
    showed the headers: not under -q or --no-header)."""
    if config.stash.get(HEADER_KEY, True):
        return None
    config.stash[HEADER_KEY] = True
    return _header(config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[Any]:
    config = item.config
    config.stash[ITEM_KEY] = item  # for a session made inside the test (request.getfixturevalue)
    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.current_item = item
    try:
        return (yield)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: pytest makes no report; the manifest still lists the test
        session = config.stash.get(SESSION_KEY, None)
        if session is not None:
            session.interrupted_item(item)
        raise
    finally:
        config.stash[ITEM_KEY] = None
        session = config.stash.get(SESSION_KEY, None)
        if session is not None:
            session.current_item = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    session = item.config.stash.get(SESSION_KEY, None)
    if session is None:
        report = yield
        if getattr(item.config, "workerinput", None) is not None and uses_jaxlog(item):
            setattr(report, USES_FLAG, True)  # a worker whose settings are bad: the controller says so
        return report
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
    if getattr(item.config, "workerinput", None) is not None and uses_jaxlog(item):
        setattr(report, USES_FLAG, True)
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


class _ControllerWatch:
    """On an xdist controller that does not use jaxlog (yet): it collects nothing, so the first
    report of a worker's test that uses jaxlog is where it starts to (and where a bad setting stops
    the session). Holds the config and does nothing else; gone once the session is made."""

    def __init__(self, config: pytest.Config):
        self.config = config

    @pytest.hookimpl(tryfirst=True)  # before pytest's junitxml: the plugins made now see this report first
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not (getattr(report, USES_FLAG, False) or isinstance(getattr(report, "jaxlog", None), dict)):
            return
        config = self.config
        config.pluginmanager.unregister(self)
        use(config, late=True)
        for name in SUB_PLUGINS:  # registered during this hook's call: pluggy calls them from the next one
            hook = getattr(config.pluginmanager.get_plugin(name), "pytest_runtest_logreport", None)
            if hook is not None:
                hook(report=report)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if not uses_jaxlog(item):
        return
    session = _for_test(item.config)
    session.activate()  # the first such test sets up SIGTERM handling and the compile cache
    if item.get_closest_marker("jaxlog") is not None:
        try:
            marker_settings(item, session.settings)
        except JaxlogError as e:
            error = str(e)
        else:
            return
        pytest.fail(error, pytrace=False)  # outside the except: no "During handling ..." repeat of the message


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[STARTED_KEY] = True
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
    for name in (*SUB_PLUGINS, WATCH):
        registered = config.pluginmanager.get_plugin(name)
        if registered is not None:
            config.pluginmanager.unregister(registered)


@pytest.fixture
def jaxlog(request: pytest.FixtureRequest) -> Iterator[JaxlogFixture]:
    """Runs kernels with ``jaxlog.run(step, state, steps, ...)`` / ``jaxlog.recorder(...)`` into this test's
    artifact directory (``jaxlog.dir``): HDF5 trajectory, timeline, profile window per marker/options."""
    session = _for_test(request.config)
    fx = JaxlogFixture(session, session.state_for(request.node))
    yield fx
    fx.close()


@pytest.fixture(scope="session")
def jaxlog_factory(request: pytest.FixtureRequest) -> JaxlogFactory:
    """For ``@given`` tests: ``with jaxlog_factory() as jaxlog:`` per example (no function-scoped fixture)."""
    return JaxlogFactory(_for_test(request.config))
