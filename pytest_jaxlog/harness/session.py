"""Errors a run raises before its first step: the test *errored*, it did not fail.

Why: a bad ``when=``, an invariant on a record that is not recorded or a bad argument is a
mistake in how the test uses jaxlog, found before any step ran; reporting it as a failed test
whose run "stopped by interrupted" sends the reader looking for a fault in the kernel. Such an
error (a ``JaxlogError`` that is no assertion, whose run did no step) gets pytest's error outcome
(``E``, counted in "errors") and the manifest entry ``error`` with its message. Imports the
standard library and the package's errors only.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from ..errors import JaxlogError
from ..paths import shown, use_project
from .artifacts import Discard
from .baselines import Baselines
from .devices import child_spec
from .options import (
    GOLDEN_DIR_INI,
    OPTIONS,
    Settings,
    golden_review,
    lookup,
    marker_settings,
    parse_flag,
    resolve_settings,
    usage_error,
    what,
)

FLAG = "jaxlog_error"  # set on the call report; it travels to the xdist controller with the report


def before_start(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a jaxlog usage error raised before a run's first step: raised where no run
    was made yet (its arguments), or by a run that did no step (``exc.jaxlog_run``)."""
    if not isinstance(exc, JaxlogError) or isinstance(exc, AssertionError):
        return False
    if getattr(exc, "jaxlog_before_start", False):
        return True
    run = getattr(exc, "jaxlog_run", None)
    timings = getattr(run, "timings", None)
    return run is not None and getattr(run, "status", None) == "failed" and getattr(timings, "steps", None) == 0


def mark(report: Any, excinfo: Any) -> None:
    """Flag the call report of a test whose exception is such an error."""
    if report.when == "call" and report.failed and excinfo is not None and before_start(excinfo.value):
        setattr(report, FLAG, True)


def teststatus(report: Any) -> tuple[str, str, str] | None:
    """pytest's error category for a flagged call report (else None: pytest decides). The word is
    plain text: pytest 8.0 prints a (word, markup) pair raw in its short summary."""
    if report.when == "call" and getattr(report, FLAG, False):
        return "error", "E", "ERROR"
    return None


def flagged(report: Any) -> bool:
    return report is not None and bool(getattr(report, FLAG, False))

# ---------------------------------------------------------------------------------------------
# The per-process session: where artifacts go, which tests keep them, what the manifest and the
# terminal summary say, and how xdist workers' results reach the controller's manifest.
#
# Knows tests only through ``TestState`` (what the fixtures noted: files, violations, runs, goldens),
# so the fixture objects stay replaceable. Imports pytest and the standard library only.

JAXLOG_FIXTURES = ("jaxlog", "jaxlog_factory")
# files of a profile window besides its Perfetto trace (``jax_trace``): listed in the manifest, not
# in messages or the report section, where one path to the trace is what a person opens
PROFILE_DETAILS = ("jax_trace_json", "xplane", "profile_dir")
DEFAULT_COMPILE_CACHE = "jaxlog-compile-cache"  # under pytest's cache directory (.pytest_cache/d/)


def safe_name(nodeid: str) -> str:
    """The artifact directory name of a test: the same name its golden file gets (``golden_name``), e.g.
    ``examples/test_lj.py::test_nve[64]`` -> ``examples.test_lj.test_nve-64``; replaced characters or
    long ids add a hash of the node id, so names stay unique (parametrize ids, xdist)."""
    from ..paths import golden_name

    return golden_name(nodeid, suffix="")


def uses_jaxlog(item: pytest.Item) -> bool:
    """Whether a test asks for jaxlog (a fixture or the marker), used or not before it failed."""
    names = getattr(item, "fixturenames", ())
    return any(n in names for n in JAXLOG_FIXTURES) or item.get_closest_marker("jaxlog") is not None


# ---------------------------------------------------------------------------------------------
# what the fixtures note about one test


@dataclass
class RunNote:
    """One run's timings as the manifest and the report section show them."""

    name: str
    steps: int
    wall_s: float
    steps_per_s: float | None  # None for a run too short to time (Timings.timed)
    compiles: int
    status: str | None = None
    stop_reason: str | None = None  # jl.run: until | steps | violation | interrupted; error (status failed)
    from_cache: int = 0  # of the compiles, loaded from JAX's persistent compilation cache
    reused: int = 0  # programs the run ran that this process had compiled before (an equal kernel's)
    meta: dict = field(default_factory=dict)  # jl.run(meta=...): the run's JSON metadata
    resumed_from: int | None = None  # jl.resume: the checkpoint's step the run continued from

    def line(self) -> str:
        rate = "" if self.steps_per_s is None else f", {self.steps_per_s:.4g} steps/s"
        why = f", stopped by {self.stop_reason}" if self.stop_reason not in (None, "steps") else ""
        status = f" ({self.status}{why})" if self.status else ""
        plural = "" if self.compiles == 1 else "s"
        cached = f", {self.from_cache} from the compile cache" if self.from_cache else ""
        reused = f", {self.reused} reused" if self.reused else ""
        if self.resumed_from is not None:
            reused += f", resumed from step {self.resumed_from}"
        steps = f"{self.steps} step{'' if self.steps == 1 else 's'}"
        return (f"{self.name}: {steps} in {self.wall_s:.3g} s{rate}, {self.compiles} compile{plural}"
                f"{cached}{reused}{status}")


@dataclass
class ViolationNote:
    """A violation that failed (or warned in) the test: its JSON, and the files of the run it came from."""

    message: str
    json: dict
    files: dict[str, Path] = field(default_factory=dict)


@dataclass
class GoldenNote:
    path: Path
    status: str  # ok | regenerated | created | pending
    pending: Path | None = None  # status pending: the obtained golden written beside ``path``
    id: str | None = None  # status pending: its ID for ``jaxlog golden accept|reject``


class Refreshable(Protocol):
    """What the session asks of a fixture object before a failing test's report: note what open
    recorders and windows wrote so far."""

    def refresh(self) -> None: ...


@dataclass
class TestState:
    """What the plugin knows about one test that used jaxlog (kept on ``item.stash``)."""

    __test__ = False  # not a pytest test class

    nodeid: str
    dir: Path
    settings: Settings
    artifacts: dict[str, Path] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    violations: list[ViolationNote] = field(default_factory=list)
    runs: list[RunNote] = field(default_factory=list)
    goldens: list[GoldenNote] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. a default profile window that did not fit a run
    examples: int = 0
    kept_example: Path | None = None
    pending_example: Path | None = None  # the last example that passed inside its `with` (the test may still fail)
    fixtures: list[Refreshable] = field(default_factory=list)  # this test's fixture objects (refreshed for reports)
    benchmarks: list[dict] = field(default_factory=list)  # jaxlog.benchmark figures (harness.baselines)
    costs: list[dict] = field(default_factory=list)  # the costs check_cost compared
    _seen: list[Any] = field(default_factory=list)  # violation objects noted (by identity)

    @property
    def compiles(self) -> int:
        return sum(r.compiles for r in self.runs)

    def add_artifacts(self, artifacts: dict[str, Path], label: str) -> None:
        """Keys: the kind for the test's first run, ``<label>:<kind>`` for the others."""
        for kind, path in artifacts.items():
            key = kind if label == "trajectory" else f"{label}:{kind}"
            self.artifacts[key] = Path(path)
            self.kinds[key] = kind

    def note_violation(self, violation: Any, files: dict[str, Path] | None = None) -> None:
        """Note a violation once (by identity and by message); ``files``: its run's artifacts, if ours."""
        if violation is None or any(v is violation for v in self._seen):
            return
        self._seen.append(violation)
        msg = str(violation)
        if any(v.message == msg for v in self.violations):
            return
        doc = violation.to_json() if hasattr(violation, "to_json") else {"message": msg}
        self.violations.append(ViolationNote(msg, doc, {k: Path(p) for k, p in (files or {}).items()}))

    def note_run(self, label: str, obj: Any) -> None:
        """Note the timings of a finished (or failed) run or recorder, if it has any."""
        t = getattr(obj, "timings", None)
        if t is None:
            return
        rate = getattr(t, "steps_per_s", None)
        status = getattr(obj, "status", None)
        reason = "error" if status == "failed" else getattr(obj, "stop_reason", None)  # raised: no interruption
        resumed = getattr(obj, "resumed_from", None)
        self.runs.append(RunNote(
            name=label,
            steps=int(getattr(t, "steps", 0) or 0),
            wall_s=float(getattr(t, "wall_s", 0.0) or 0.0),
            steps_per_s=float(rate) if isinstance(rate, (int, float)) and math.isfinite(rate) else None,
            compiles=int(getattr(t, "compiles", 0) or 0),
            status=status if isinstance(status, str) else None,
            stop_reason=reason if isinstance(reason, str) else None,
            from_cache=int(getattr(t, "from_cache", 0) or 0),
            reused=int(getattr(t, "reused", 0) or 0),
            meta=dict(meta) if isinstance(meta := getattr(obj, "meta", None), dict) else {},
            resumed_from=resumed if isinstance(resumed, int) else None,
        ))

    def drop_example(self, d: Path) -> None:
        """Remove a hypothesis example's directory and forget its files and runs."""
        shutil.rmtree(d, ignore_errors=True)  # already gone or half removed: nothing left to keep
        for k in [k for k, p in self.artifacts.items() if _under(p, d)]:
            self.artifacts.pop(k, None)
        self.runs = [r for r in self.runs if not r.name.startswith(f"{d.name}/")]


STATE_KEY = pytest.StashKey[TestState]()
REPORTS_KEY = pytest.StashKey[dict]()
SESSION_KEY = pytest.StashKey["JaxlogSession"]()


# ---------------------------------------------------------------------------------------------
# the session


@dataclass(frozen=True)
class Places:
    """Where the session reads and writes: paths a user types are relative to ``invocation`` (from
    the command line or environment) or to ``root`` (from the ini file)."""

    invocation: Path
    root: Path
    base: Path  # the artifact directory (the manifest's)
    golden: Path  # the golden trajectories'


@dataclass(frozen=True)
class GoldenMode:
    """What a golden that differs or is missing does: rewritten, created, or left as it is for review."""

    regen: bool
    create: bool
    review: bool


@dataclass
class CompileCache:
    """JAX's persistent compilation cache for the session: the directory given (or found on first
    use, ``default``), and how to give JAX's settings back (``undo``, None while not in use)."""

    path: Path | None
    default: bool  # not given: this machine's subdirectory of pytest's cache, found on first use
    undo: Any = None


@dataclass
class History:
    """What earlier sessions left in the artifact directory: the previous manifest (``earlier``),
    kept and listed as stale, or removed under ``--jaxlog-clean-stale``."""

    clean: bool  # --jaxlog-clean-stale
    earlier: Any = None  # artifacts.Earlier: the previous manifest, whose other tests' evidence is kept
    previous_manifest: bool = False
    clean_later: bool = False  # started late (an xdist controller): remove at the end, not under running tests
    removed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    carried: list[dict] = field(default_factory=list)  # entries from earlier sessions (stale), summarised apart
    counts: dict[str, int] = field(default_factory=lambda: {"tests": 0, "dirs": 0})  # what the manifest carried


@dataclass
class Held:
    """What the session changed in the process and gives back: SIGTERM's handler (from the first
    test that uses jaxlog, ``active``) and the core's messages' project directory."""

    project: Any = None  # undoes paths.use_project
    sigterm: Any = None  # the entered drive.host.signals.sigterm_as_interrupt
    active: bool = False


def artifact_dir(config: pytest.Config, worker: dict | None = None) -> Path:
    """The artifact directory, unchecked: an xdist controller hands it to its workers before it
    knows whether any test uses jaxlog (it cannot fail, and decides nothing)."""
    if worker is not None and "jaxlog_dir" in worker:
        return Path(worker["jaxlog_dir"])
    src = lookup(config, "dir")
    where = Path(config.invocation_params.dir) if src.origin in ("cli", "env") else Path(config.rootpath)
    return (where.resolve() / os.path.expanduser(str(src.value))).resolve()


class JaxlogSession:
    """One per pytest process that uses jaxlog, in ``config.stash``: settings, artifact directories,
    manifest entries. Made when jaxlog is first used (``plugin.py``); every setting is resolved
    here, so a bad one is a usage error of a session that uses jaxlog only."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.worker = getattr(config, "workerinput", None)
        try:
            child = child_spec()
        except JaxlogError as e:
            raise usage_error(e) from None
        if self.worker is None and child is not None:  # a child running one test for a parent session
            self.worker = {"workerid": child.get("workerid"), "jaxlog_dir": child.get("jaxlog_dir")}
        invocation = Path(config.invocation_params.dir).resolve()
        root = Path(config.rootpath).resolve()
        try:
            base = self._resolve_base()
            self.settings = resolve_settings(config)
            regen, create = lookup(config, "regen"), lookup(config, "create_goldens")
            self.golden_mode = GoldenMode(regen=parse_flag(regen.value, what("regen", regen)),
                                          create=parse_flag(create.value, what("create_goldens", create)),
                                          review=golden_review(config))
            clean = lookup(config, "clean_stale")
            self.history = History(clean=parse_flag(clean.value, what("clean_stale", clean)))
            self.cache = self._resolve_compile_cache(invocation, root)
            self.baselines = Baselines(config, self.worker)
        except JaxlogError as e:
            raise usage_error(e) from None
        self.discard = Discard(base)
        golden = Path(os.path.expanduser(str(config.getini(GOLDEN_DIR_INI))))
        self.places = Places(invocation=invocation, root=root, base=base,
                             golden=golden if golden.is_absolute() else root / golden)
        self.entries: dict[str, dict] = {}
        self.current_item: pytest.Item | None = None
        self.started = time.time()
        self.session_id = ""
        self.held = Held(project=use_project(root))  # the core's messages (display_path) too

    # the places and modes by the names the rest of the pytest side reads
    @property
    def base(self) -> Path:
        return self.places.base

    @property
    def rootdir(self) -> Path:
        return self.places.root

    @property
    def invocation_dir(self) -> Path:
        return self.places.invocation

    @property
    def golden_dir(self) -> Path:
        return self.places.golden

    @property
    def regen(self) -> bool:
        return self.golden_mode.regen

    @property
    def create_goldens(self) -> bool:
        return self.golden_mode.create

    @property
    def golden_review(self) -> bool:
        return self.golden_mode.review

    @property
    def compile_cache(self) -> Path | None:
        return self.cache.path

    @property
    def previous_manifest(self) -> bool:
        return self.history.previous_manifest

    @property
    def active(self) -> bool:
        return self.held.active

    def activate(self) -> None:
        """On the first test that uses jaxlog (fixture or marker), not at configure: a session where
        no test asks for jaxlog keeps its SIGTERM handler and JAX's settings as they were."""
        if self.held.active:
            return
        self.held.active = True
        self.catch_sigterm()
        self.use_compile_cache()

    def catch_sigterm(self) -> None:
        """SIGTERM (CI cancellation, a job time limit) ends the session like Ctrl-C: the running
        test's run stops with its files ``stopped`` and every frame on disk, and pytest still
        writes its reports and the manifest. Only over the default action, in the main thread."""
        from ..drive.host.signals import sigterm_as_interrupt

        self.held.sigterm = sigterm_as_interrupt()
        self.held.sigterm.__enter__()

    def release_sigterm(self) -> None:
        """Give SIGTERM back its previous handler."""
        held, self.held.sigterm = self.held.sigterm, None
        if held is not None:
            held.__exit__(None, None, None)

    def _resolve_compile_cache(self, invocation: Path, root: Path) -> CompileCache:
        """The directory given (option, variable, ini key), or None: off, or the default, which
        ``use_compile_cache`` finds on first use (``CompileCache.default``)."""
        src = lookup(self.config, "compile_cache")
        text = str(src.value).strip()
        default = text.lower() in ("", "auto")
        if text.lower() in ("", "auto", "none", "off", "0", "false", "no"):
            return CompileCache(path=None, default=default)
        where = invocation if src.origin in ("cli", "env") else root
        path = (where / os.path.expanduser(text)).resolve()
        if path.exists() and not path.is_dir():
            raise JaxlogError(f"{what('compile_cache', src)}: {path} is a file, not a directory")
        return CompileCache(path=path, default=default)

    def use_compile_cache(self) -> None:
        """Point JAX's persistent compilation cache at ``--jaxlog-compile-cache`` for this session; by
        default at this machine's subdirectory of pytest's cache (none under ``-p no:cacheprovider``,
        nor where the user configured JAX's cache directory already)."""
        if self.cache.undo is not None:
            return
        from .compile_cache import PrivateCache, configured_elsewhere, machine_key, use_compile_cache

        if self.cache.path is None and self.cache.default:
            cache = getattr(self.config, "cache", None)  # absent under -p no:cacheprovider
            if cache is None or configured_elsewhere():
                return
            try:
                self.cache.path = Path(cache.mkdir(DEFAULT_COMPILE_CACHE)) / machine_key()
            except OSError:  # an unwritable pytest cache: no default cache, as cacheprovider itself copes
                return
        if self.cache.path is not None:
            private = PrivateCache(self.cache.path)
            try:
                undo = use_compile_cache(private.open())
            except OSError as e:  # on first use, inside a test: that test errors with the reason
                raise JaxlogError(f"[jaxlog] compile_cache: cannot create {self.cache.path}: {e}") from None

            def release() -> None:
                undo()
                private.publish()
            self.cache.undo = release

    def release_compile_cache(self) -> None:
        """JAX's settings back as they were, and this session's new entries into the shared cache."""
        undo, self.cache.undo = self.cache.undo, None
        if undo is not None:
            undo()

    def _resolve_base(self) -> Path:
        base = artifact_dir(self.config, self.worker)
        if base.exists() and not base.is_dir():  # else every test errors and the manifest crashes the session
            raise JaxlogError(f"jaxlog dir ({OPTIONS['dir'].sources()}): {base} is a file, not a directory")
        return base

    def display(self, path: Path | str) -> str:
        """``path`` as a user types it next, from the invocation directory: relative inside the
        project (the rootdir, ``../`` included), absolute only outside it (``paths.shown``)."""
        return shown(path, cwd=self.invocation_dir, root=self.rootdir)

    def release_project(self) -> None:
        """The core's messages (golden mismatches) stop showing paths relative to this rootdir."""
        undo, self.held.project = self.held.project, None
        if undo is not None:
            undo()

    def manifest_path(self, path: Path | str) -> str:
        """``path`` relative to the manifest's directory (relative input: to the invocation directory)."""
        p = Path(path)
        if not p.is_absolute():
            p = self.invocation_dir / p
        try:
            return Path(os.path.relpath(p, self.base)).as_posix()
        except ValueError:  # another drive (Windows): no relative form exists
            return str(p)

    # -- session start: directories of earlier sessions -------------------------------------------
    def start(self, late: bool = False) -> None:
        """Read what the previous manifest names: kept (tests run again replace only their own
        directories; the others stay, listed as stale), or removed under ``--jaxlog-clean-stale``.
        Only directories a manifest names are touched, never other files in the folder. ``late``:
        an xdist controller that first met jaxlog in a worker's report, with tests running: the
        removal waits for the end of the session and spares the directories its tests use."""
        if self.worker is not None or self.config.option.collectonly:
            return
        from ..store import manifest  # lazy: the plugin imports no package layer at load
        from .artifacts import Earlier, remove

        path = self.base / manifest.NAME
        if not path.is_file():
            return
        history = self.history
        try:
            earlier = Earlier(self.base, manifest.read(path))
        except JaxlogError as e:
            history.notes.append(f"the previous {self.display(path)} is unreadable ({e}): the directories it "
                                 "names were left as they are")
            return
        history.previous_manifest = True
        if history.clean and not late:
            history.removed = remove(earlier.named_dirs())
        else:
            history.earlier, history.clean_later = earlier, history.clean

    # -- per test --------------------------------------------------------------------------------
    def state_for(self, item: pytest.Item) -> TestState:
        """The item's state, created (with a fresh artifact directory) on first use."""
        state = item.stash.get(STATE_KEY, None)
        if state is None:
            self.activate()  # a fixture asked for by request.getfixturevalue: no setup hook saw it coming
            error = None
            try:
                settings = marker_settings(item, self.settings)
            except JaxlogError as e:
                error = str(e)
            if error is not None:  # outside the except: no "During handling ..." repeat of the message
                pytest.fail(error, pytrace=False)
            d = self.base / safe_name(item.nodeid)
            if d.exists():  # stale from an earlier session: never mix runs
                shutil.rmtree(d, ignore_errors=True)
            state = TestState(item.nodeid, d, settings)
            item.stash[STATE_KEY] = state
        return state

    def finish_item(self, item: pytest.Item, teardown_excinfo: Any) -> dict | None:
        """Decide the outcome, keep or remove the artifacts, set user properties; return the manifest entry."""
        state = item.stash.get(STATE_KEY, None)
        reports = item.stash.get(REPORTS_KEY, {})
        outcome = _outcome(reports, teardown_excinfo)
        if state is None:
            if outcome == "error" and uses_jaxlog(item):  # failed before the fixture was made: still listed
                return self._entry(item, outcome, reports, teardown_excinfo)
            return None
        keep = state.settings.keep
        failed_like = outcome in ("failed", "error", "xfailed", "xpassed")
        kept = keep == "all" or (keep == "failed" and failed_like)
        if kept and keep == "failed" and state.pending_example is not None:
            # the test failed after the last example's `with` block (an assert on the run): that example,
            # the one hypothesis replays last, is the failing one; an earlier kept example is not
            if state.kept_example is not None and state.kept_example != state.pending_example:
                state.drop_example(state.kept_example)
            state.kept_example, state.pending_example = state.pending_example, None
        if not kept and state.dir.exists():
            self.discard(state.dir)  # gone from here now, from the disk in the background
        artifacts = {k: p for k, p in state.artifacts.items() if Path(p).exists()} if kept else {}
        kept = kept and state.dir.exists()
        props = item.user_properties
        props.append(("jaxlog.compiles", str(state.compiles)))
        for key, path in artifacts.items():
            kind = state.kinds.get(key, key)
            if kind == "trajectory":
                props.append(("jaxlog.trajectory", self.display(path)))
            elif kind in ("jax_trace", "timeline"):
                props.append(("jaxlog.trace", self.display(path)))
            elif kind == "plot":
                props.append(("jaxlog.plot", self.display(path)))
        if kept:
            props.append(("jaxlog.dir", self.display(state.dir)))
        props.extend(self.baselines.properties(state))
        entry = self._entry(item, outcome, reports, teardown_excinfo)
        entry.update(
            kept=kept,
            dir=self.manifest_path(state.dir) if kept else None,
            artifacts={k: self.manifest_path(p) for k, p in artifacts.items()},
            violations=[self._violation_json(v) for v in state.violations],
            compiles=state.compiles,
            runs=[asdict(r) for r in state.runs],
            goldens=[{"path": self.manifest_path(g.path), "status": g.status,
                      **({"pending": self.manifest_path(g.pending), "id": g.id} if g.pending else {})}
                     for g in state.goldens],
            notes=list(state.notes),
            examples=state.examples,
            **self.baselines.entry_fields(state),
        )
        return entry

    def interrupted_item(self, item: pytest.Item) -> None:
        """The session was interrupted inside ``item`` (Ctrl-C, SIGTERM): its artifacts are the
        evidence of where it stopped, so they are kept and listed whatever ``--jaxlog-keep`` says."""
        state = item.stash.get(STATE_KEY, None)
        entry = self._entry(item, "interrupted", {}, None)
        if state is not None:
            artifacts = {k: p for k, p in state.artifacts.items() if Path(p).exists()}
            entry.update(kept=state.dir.exists(), dir=self.manifest_path(state.dir) if state.dir.exists() else None,
                         artifacts={k: self.manifest_path(p) for k, p in artifacts.items()},
                         violations=[self._violation_json(v) for v in state.violations], compiles=state.compiles,
                         runs=[asdict(r) for r in state.runs], notes=list(state.notes))
        self.record_entry(entry)

    def _entry(self, item: pytest.Item, outcome: str, reports: dict, teardown_excinfo: Any) -> dict:
        entry: dict[str, Any] = {
            "nodeid": item.nodeid, "outcome": outcome, "kept": False, "dir": None, "artifacts": {},
            "violations": [], "compiles": 0, "runs": [], "goldens": [], "notes": [], "examples": 0,
            "worker": (self.worker or {}).get("workerid"),
        }
        if outcome == "error":
            entry["error"] = _error_line(reports, teardown_excinfo)
        return entry

    def _violation_json(self, note: ViolationNote) -> dict:
        doc = dict(note.json)
        files = note.files or {k: Path(str(v)) for k, v in (doc.get("artifacts") or {}).items()}
        doc["artifacts"] = {k: self.manifest_path(p) for k, p in files.items()}
        return doc

    def note_failure(self, item: pytest.Item, excinfo: Any) -> None:
        """Before the call report: gather what open recorders wrote and the violation that failed the test."""
        state = item.stash.get(STATE_KEY, None)
        if state is None:
            return
        for fx in list(state.fixtures):
            fx.refresh()
        exc = getattr(excinfo, "value", None)
        if isinstance(exc, AssertionError) and hasattr(exc, "invariant") and hasattr(exc, "to_json"):
            # not from the fixture's runs (those are noted already): a jl.run of the test's own, its files not ours
            state.note_violation(exc)

    def section(self, item: pytest.Item, excinfo: Any = None) -> str | None:
        """The failing test's ``jaxlog`` report section: what the failure's own message (``excinfo``,
        shown above it under ``E``) does not say yet, so each violation and each path is read once."""
        state = item.stash.get(STATE_KEY, None)
        if state is None:
            return None
        said = str(getattr(excinfo, "value", "") or "")
        lines = []
        for v in state.violations:
            if v.message not in said:
                lines.append(f"violation: {v.message}")
                said += "\n" + v.message
        lines.append(f"artifacts: {self.display(state.dir)}")
        for key, path in state.artifacts.items():
            shown_path = self.display(path)
            if state.kinds.get(key, key) not in PROFILE_DETAILS and not _names(said, shown_path):
                lines.append(f"  {key}: {shown_path}")
        if state.runs:
            lines.append("runs:")
            lines.extend(f"  {r.line()}" for r in state.runs)
        lines.append(f"compiles: {state.compiles}")
        lines.extend(self.baselines.section_lines(state))
        for note in state.notes:
            lines.append(f"note: {note}")
        if "jaxlog" in getattr(item, "fixturenames", ()) and getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            lines.append("hint: in @given tests use the jaxlog_factory fixture, `with jaxlog_factory() as jaxlog:` "
                         "inside the test: one artifact directory per example, the failing one kept")
        if state.settings.keep == "none":
            lines.append(f"(artifacts are removed at teardown: {_flag('keep')}=none)")
        return "\n".join(lines)

    def record_entry(self, entry: dict) -> None:
        """An entry from this process's teardown report, or (xdist controller) from a worker's."""
        self.entries[entry["nodeid"]] = entry

    # -- end of session --------------------------------------------------------------------------
    def _earlier(self) -> tuple[list[dict], list[dict]]:
        """Entries carried from earlier sessions (stale) and the stale directory list; the earlier
        directories of tests run again that this session's entries no longer name are removed."""
        history = self.history
        if history.earlier is None:
            return [], []
        from .artifacts import remove

        if history.clean_later:  # --jaxlog-clean-stale, started late: what this session's tests use stays
            mine = {e.get("dir") for e in self.entries.values()} | {safe_name(nodeid) for nodeid in self.entries}
            history.removed = remove([d for d in history.earlier.named_dirs() if d.name not in mine])
            history.earlier = None
            return [], []
        remove(history.earlier.replaced(self.entries))
        carried = history.earlier.carried(self.entries)
        return carried, history.earlier.stale_dirs(carried, self.entries)

    def write_manifest(self, exitstatus: int) -> Path | None:
        """``manifest.json`` in the artifact directory; every path in it is relative to that directory."""
        if self.worker is not None or not (self.entries or self.previous_manifest):
            return None
        from ..store import manifest  # lazy: the plugin imports no package layer at load

        self.base.mkdir(parents=True, exist_ok=True)
        carried, stale = self._earlier()
        self.session_id = manifest.new_session_id(self.started)
        doc = manifest.document(
            session=self.session_id,
            started=self.started,
            finished=time.time(),
            exitstatus=exitstatus,
            rootdir=self.manifest_path(self.rootdir),
            golden_dir=self.manifest_path(self.golden_dir),
            settings={
                "keep": self.settings.keep,
                "profile": self.settings.profile,
                "on_violation": self.settings.on_violation,
                "chunk": self.settings.chunk,
                "compile_cache": None if self.compile_cache is None else self.manifest_path(self.compile_cache),
                "regen": self.regen,
                "create_goldens": self.create_goldens,
                "golden_review": self.golden_review,
                "clean_stale": self.history.clean,
            },
            tests=sorted([*self.entries.values(), *carried], key=lambda e: e["nodeid"]),
            stale=stale,
        )
        self.history.counts = {"tests": len(carried), "dirs": len(stale)}
        self.history.carried = carried
        return manifest.write(self.base, doc)

    def summary(self, tr: Any) -> None:
        from ..store import manifest  # lazy: the plugin imports no package layer at load

        history = self.history
        if self.worker is not None or not (self.entries or history.removed or history.earlier or history.notes):
            return
        tr.write_sep("-", "jaxlog")
        limit = 30
        if self.entries:
            kept = [e for e in self.entries.values() if e["kept"]]
            tr.write_line(
                f"artifacts kept for {len(kept)} of {len(self.entries)} jaxlog tests in {self.display(self.base)} "
                f"({_flag('keep')}={self.settings.keep}); manifest: {self.display(self.base / manifest.NAME)}"
            )
            for e in sorted(kept, key=lambda e: (e["outcome"] == "passed", e["nodeid"]))[:limit]:
                tr.write_line(f"  {e['outcome'].upper():8} {e['nodeid']} -> {self.display(self.base / e['dir'])}")
            if len(kept) > limit:
                tr.write_line(f"  ... and {len(kept) - limit} more (see {manifest.NAME})")
        else:  # said plainly: the earlier entries below are not this session's results
            where = f"; manifest: {self.display(self.base / manifest.NAME)}" if self.previous_manifest else ""
            tr.write_line(f"no jaxlog test ran in this session{where}")
        runs = [r for e in self.entries.values() for r in e.get("runs", ())]
        compiled = sum(int(r.get("compiles", 0)) for r in runs)
        if self.compile_cache is not None and compiled:  # no program needed compiling: nothing to say of the cache
            cached = sum(int(r.get("from_cache", 0)) for r in runs)
            tr.write_line(f"compile cache {self.display(self.compile_cache)}: {cached} of the {compiled} programs the "
                          f"runs needed came from it")
        for line in self.baselines.summary_lines(self.entries.values(), self.display):
            tr.write_line(line)
        rerun = {safe_name(nodeid) for nodeid in self.entries}  # replaced by this session's run of the test anyway
        removed = [n for n in history.removed if n not in rerun]
        if removed:
            tr.write_line(f"removed {len(removed)} artifact directories left by an earlier session for tests "
                          f"not run in this one ({_flag('clean_stale')})")
        for note in history.notes:
            tr.write_line(f"note: {note}")
        stale = history.counts
        if stale["tests"]:
            tr.write_line(f"stale: {stale['tests']} tests not run in this session keep their earlier entries in "
                          f"{manifest.NAME} ({stale['dirs']} with artifact directories); {_flag('clean_stale')} "
                          "removes them")
            self._stale_lines(tr, limit)
        notes = [(e["nodeid"], n) for e in sorted(self.entries.values(), key=lambda e: e["nodeid"])
                 for n in e.get("notes", ())]
        if notes:
            tr.write_line(f"notes ({len(notes)}):")
            for nodeid, note in notes[:limit]:
                tr.write_line(f"  {nodeid}: {note}")
            if len(notes) > limit:
                tr.write_line(f"  ... and {len(notes) - limit} more (see {manifest.NAME})")
        for status, how in (("regenerated", _flag("regen")), ("created", _flag("create_goldens"))):
            files = sorted(g["path"] for e in self.entries.values() for g in e["goldens"] if g.get("status") == status)
            if files:
                tr.write_line(f"{status} {len(files)} golden trajectories ({how}):")
                for p in files:
                    tr.write_line(f"  {self.display(os.path.normpath(self.base / p))}")
        pending = sorted(g["id"] for e in self.entries.values() for g in e["goldens"] if g.get("status") == "pending")
        if pending:
            tr.write_line(f"pending {len(pending)} golden trajectories (under review, the goldens left as they are; "
                          f"in {self.display(self.golden_dir)}):")
            for ident in pending:
                tr.write_line(f"  {ident}")
            tr.write_line("apply them with: python -m pytest_jaxlog golden accept ID... (or --all); drop them with: "
                          "python -m pytest_jaxlog golden reject ID... (or --all)")

    def _stale_lines(self, tr: Any, limit: int) -> None:
        """The carried entries by the session they came from, and each one not passed badged with
        its session: an earlier failure stays visible without being counted as this session's."""
        from ..store import manifest

        groups = manifest.by_session(self.history.carried)
        for sid, group in groups.items():
            failed = sum(map(manifest.not_passed, group))
            tr.write_line(f"  from session {sid}: {len(group)} tests, {failed} not passed")
        bad = [e for group in groups.values() for e in sorted(group, key=lambda e: e["nodeid"])
               if manifest.not_passed(e)]
        for e in bad[:limit]:
            where = f" -> {self.display(self.base / e['dir'])}" if e.get("dir") else ""
            tr.write_line(f"  STALE (session {manifest.entry_session(e)}) {str(e.get('outcome')).upper()} "
                          f"{e['nodeid']}{where}")
        if len(bad) > limit:
            tr.write_line(f"  ... and {len(bad) - limit} more (see {manifest.NAME})")


def _flag(key: str) -> str:
    """``--jaxlog-keep``: an option's name as the options table spells it."""
    return OPTIONS[key].flag_name


def _names(text: str, path: str) -> bool:
    """Whether ``text`` names ``path`` as a whole (``a.h5`` is not named by ``a.h5.tmp``)."""
    return re.search(rf"(?<![^\s:=(]){re.escape(path)}(?![^\s;,)])", text) is not None


def _under(path: Path, d: Path) -> bool:
    try:
        Path(path).relative_to(d)
        return True
    except ValueError:
        return False


def _outcome(reports: dict[str, Any], teardown_excinfo: Any) -> str:
    setup, call = reports.get("setup"), reports.get("call")
    if setup is not None and setup.failed:
        return "error"
    if setup is not None and setup.skipped:
        return "xfailed" if hasattr(setup, "wasxfail") else "skipped"
    if call is not None:
        if flagged(call):  # a usage error before a run's first step
            return "error"
        if hasattr(call, "wasxfail"):
            if call.skipped:
                return "xfailed"
            return "xpassed" if call.passed else "failed"
        if call.failed:
            return "failed"
        if call.skipped:
            return "skipped"
    if teardown_excinfo is not None:
        return "error"
    return "passed"


def _error_line(reports: dict[str, Any], teardown_excinfo: Any) -> str:
    """The first line of what made a test error: its setup failure (or a run's usage error), else its
    teardown exception."""
    setup = reports.get("setup")
    if setup is None or not setup.failed:
        setup = reports.get("call") if flagged(reports.get("call")) else None
    if setup is not None:
        longrepr = setup.longrepr
        text = getattr(longrepr, "errorstring", None)  # a missing fixture
        if text is None:
            crash = getattr(longrepr, "reprcrash", None)
            text = getattr(crash, "message", None) or str(longrepr)
        lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
        line = lines[0] if lines else "setup failed"
        return (line[len("Failed: "):] if line.startswith("Failed: ") else line)[:500]  # pytest.fail()'s prefix
    if teardown_excinfo is not None:
        return teardown_excinfo.exconly().strip().splitlines()[0][:500]
    return "error"
