"""Plugin-side state: resolved options, per-test artifact directories, the manifest, the fixtures' objects.

Imports pytest and the standard library only at load; jax, h5py and perfetto are imported inside the
methods that run kernels, so that users can still set ``XLA_FLAGS``/``JAX_*`` in their conftest.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from ._errors import JaxlogError, JaxlogRuntimeWarning

KEEP_CHOICES = ("failed", "all", "none")
VIOLATION_CHOICES = ("raise", "warn")
MARKER_VIOLATION_CHOICES = ("raise", "warn", "record")
PROGRESS_CHOICES = ("auto", "on", "off")
MARKER_KEYS = ("profile", "keep", "on_violation", "chunk", "progress")
MANIFEST_VERSION = 1

# (option dest, ini name, default, help) for the options that also have an ini key.
OPTIONS = {
    "dir": ("jaxlog_dir", ".jaxlog", "directory for trajectories, traces and manifest.json"),
    "keep": ("jaxlog_keep", "failed", "which tests keep their artifact directory: failed|all|none"),
    "profile": ("jaxlog_profile", "none", "profile work steps START:STOP (inclusive) of every jaxlog run (skipped or clipped, with a note, for runs that end sooner), or none"),
    "on_violation": ("jaxlog_on_violation", "raise", "invariant violation: raise (test fails) or warn"),
    "progress": ("jaxlog_progress", "auto", "progress bar of jaxlog runs: auto|on|off"),
    "chunk": ("jaxlog_chunk", "auto", "steps per device chunk of jaxlog runs: N or auto"),
}


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("jaxlog", "jaxlog: record, check and profile JAX kernels")
    for dest, (ini, default, text) in OPTIONS.items():
        kwargs: dict[str, Any] = {}
        if dest == "keep":
            kwargs["choices"] = KEEP_CHOICES
        elif dest == "on_violation":
            kwargs["choices"] = VIOLATION_CHOICES
        elif dest == "progress":
            kwargs["choices"] = PROGRESS_CHOICES
        metavar = {"dir": "DIR", "profile": "START:STOP", "chunk": "N"}.get(dest)
        if metavar:
            kwargs["metavar"] = metavar
        env = "env: JAXLOG_DIR; " if dest == "dir" else ""
        group.addoption(
            f"--jaxlog-{dest.replace('_', '-')}",
            dest=f"jaxlog_{dest}",
            default=None,
            help=f"{text} (default: {default}; {env}ini: {ini})",
            **kwargs,
        )
        parser.addini(ini, f"jaxlog: {text} (default: {default})", default=default)
    group.addoption(
        "--jaxlog-regen",
        action="store_true",
        default=False,
        dest="jaxlog_regen",
        help="write or overwrite every golden trajectory the session checks (default: off)",
    )
    parser.addini(
        "jaxlog_golden_dir",
        "jaxlog: directory of golden trajectories, relative to rootdir (default: fixtures/golden)",
        default="fixtures/golden",
    )


# ---------------------------------------------------------------------------------------------
# parsing and validation of option values


def parse_profile(value: Any, what: str) -> tuple[int, int] | None:
    """``"a:b"``, ``(a, b)`` or ``None``/``"none"`` -> ``(a, b)`` or None; JaxlogError naming ``what``."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "off")):
        return None
    pair: Any = value
    if isinstance(value, str):
        pair = value.split(":")
    try:
        a, b = pair
        if isinstance(a, bool) or isinstance(b, bool):
            raise TypeError
        a, b = int(a), int(b)
        if isinstance(value, (tuple, list)) and (a != value[0] or b != value[1]):
            raise TypeError
    except (TypeError, ValueError):
        raise JaxlogError(f"{what}: expected START:STOP work steps (e.g. 10:20) or (start, stop), got {value!r}") from None
    if a < 0 or b < a:
        raise JaxlogError(f"{what}: need 0 <= START <= STOP, got {a}:{b}")
    return a, b


def parse_chunk(value: Any, what: str) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto", "none")):
        return None
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        n = int(value)
    except (TypeError, ValueError):
        raise JaxlogError(f"{what}: expected a positive number of steps or auto, got {value!r}") from None
    if n <= 0:
        raise JaxlogError(f"{what}: expected a positive number of steps or auto, got {value!r}")
    return n


def parse_choice(value: Any, choices: tuple[str, ...], what: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise JaxlogError(f"{what}: expected one of {'|'.join(choices)}, got {value!r}")
    return value


def parse_progress(value: Any, what: str) -> bool | None:
    if value is True or value is False:
        return value
    if value is None:
        return None
    v = parse_choice(value, PROGRESS_CHOICES, what)
    return {"auto": None, "on": True, "off": False}[v]


@dataclass(frozen=True)
class Settings:
    """What a run in a test uses, after marker > option > env > ini > default."""

    keep: str = "failed"
    profile: tuple[int, int] | None = None
    on_violation: str = "raise"
    progress: bool | None = None
    chunk: int | None = None

    def with_marker(self, kwargs: dict[str, Any], nodeid: str) -> "Settings":
        def what(key: str) -> str:
            return f"{nodeid}: @pytest.mark.jaxlog({key}=...)"

        bad = sorted(set(kwargs) - set(MARKER_KEYS))
        if bad:
            raise JaxlogError(
                f"{nodeid}: @pytest.mark.jaxlog got unknown argument {bad[0]!r} (allowed: {', '.join(MARKER_KEYS)})"
            )
        s = self
        if "keep" in kwargs:
            s = _replace(s, keep=parse_choice(kwargs["keep"], KEEP_CHOICES, what("keep")))
        if "profile" in kwargs:
            s = _replace(s, profile=parse_profile(kwargs["profile"], what("profile")))
        if "on_violation" in kwargs:
            s = _replace(
                s, on_violation=parse_choice(kwargs["on_violation"], MARKER_VIOLATION_CHOICES, what("on_violation"))
            )
        if "progress" in kwargs:
            s = _replace(s, progress=parse_progress(kwargs["progress"], what("progress")))
        if "chunk" in kwargs:
            s = _replace(s, chunk=parse_chunk(kwargs["chunk"], what("chunk")))
        return s


def _replace(s: Settings, **kw: Any) -> Settings:
    from dataclasses import replace

    return replace(s, **kw)


def marker_settings(item: pytest.Item, base: Settings) -> Settings:
    """Merge every ``jaxlog`` marker of the item, closest first; bad arguments -> JaxlogError naming the test."""
    merged: dict[str, Any] = {}
    for mark in item.iter_markers("jaxlog"):
        if mark.args:
            raise JaxlogError(
                f"{item.nodeid}: @pytest.mark.jaxlog takes keyword arguments only "
                f"({', '.join(MARKER_KEYS)}), got positional {mark.args!r}"
            )
        for k, v in mark.kwargs.items():
            merged.setdefault(k, v)
    return base.with_marker(merged, item.nodeid)


# ---------------------------------------------------------------------------------------------
# paths

def safe_name(nodeid: str) -> str:
    """The artifact directory name of a test: the same name its golden file gets (``golden_name``), e.g.
    ``examples/test_lj.py::test_nve[64]`` -> ``examples.test_lj.test_nve-64``; replaced characters or
    long ids add a hash of the node id, so names stay unique (parametrize ids, xdist)."""
    from ._golden import golden_name  # lazy: numpy; the plugin module stays light

    return golden_name(nodeid, suffix="")


def _rel(path: Path, base: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(base))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------------------------
# per-test state


@dataclass
class TestState:
    """What the plugin knows about one test that used jaxlog (kept on ``item.stash``)."""

    nodeid: str
    dir: Path
    settings: Settings
    artifacts: dict[str, Path] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    violation_json: list[dict] = field(default_factory=list)
    compiles: int = 0
    goldens: list[dict] = field(default_factory=list)
    examples: int = 0
    kept_example: Path | None = None
    pending_example: Path | None = None  # the last example that passed inside its `with` (the test may still fail)
    violation_objs: list = field(default_factory=list)
    profile_source: str = "--jaxlog-profile"  # where settings.profile came from (marker or option/ini)
    notes: list[str] = field(default_factory=list)  # e.g. a default profile window that did not fit a run
    fixtures: list = field(default_factory=list)  # JaxlogFixture objects of this test (refreshed for reports)

    def add_artifacts(self, artifacts: dict[str, Path], label: str) -> None:
        """Keys: the kind for the test's first run, ``<label>:<kind>`` for the others."""
        for kind, path in artifacts.items():
            key = kind if label == "trajectory" else f"{label}:{kind}"
            self.artifacts[key] = Path(path)
            self.kinds[key] = kind


STATE_KEY = pytest.StashKey[TestState]()
REPORTS_KEY = pytest.StashKey[dict]()
SESSION_KEY = pytest.StashKey["JaxlogSession"]()


class JaxlogSession:
    """One per pytest process, in ``config.stash``: settings, artifact directories, manifest entries."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.worker = getattr(config, "workerinput", None)
        self.invocation_dir = Path(config.invocation_params.dir).resolve()
        self.rootdir = Path(config.rootpath).resolve()
        self.base = self._resolve_base()
        if self.base.exists() and not self.base.is_dir():  # else every test errors and the manifest crashes the session
            raise pytest.UsageError(
                f"[jaxlog] jaxlog dir (--jaxlog-dir / JAXLOG_DIR / jaxlog_dir): {self.base} is a file, not a directory"
            )
        try:
            self.settings = Settings(
                keep=parse_choice(self._get("keep"), KEEP_CHOICES, "jaxlog keep (--jaxlog-keep / jaxlog_keep)"),
                profile=parse_profile(self._get("profile"), "jaxlog profile (--jaxlog-profile / jaxlog_profile)"),
                on_violation=parse_choice(
                    self._get("on_violation"), VIOLATION_CHOICES, "jaxlog on_violation (--jaxlog-on-violation / ini)"
                ),
                progress=parse_progress(self._get("progress"), "jaxlog progress (--jaxlog-progress / jaxlog_progress)"),
                chunk=parse_chunk(self._get("chunk"), "jaxlog chunk (--jaxlog-chunk / jaxlog_chunk)"),
            )
        except JaxlogError as e:
            raise pytest.UsageError(str(e)) from None
        self.regen = bool(config.getoption("jaxlog_regen", False))
        golden = Path(os.path.expanduser(str(config.getini("jaxlog_golden_dir"))))
        self.golden_dir = golden if golden.is_absolute() else self.rootdir / golden
        self.entries: dict[str, dict] = {}
        self.current_item: pytest.Item | None = None
        self.started = time.time()

    # -- options ---------------------------------------------------------------------------------
    def _get(self, dest: str) -> Any:
        value = self.config.getoption(f"jaxlog_{dest}", None)
        if value is not None:
            return value
        ini, default, _ = OPTIONS[dest]
        value = self.config.getini(ini)
        return default if value in (None, "") else value

    def _resolve_base(self) -> Path:
        if self.worker is not None and "jaxlog_dir" in self.worker:
            return Path(self.worker["jaxlog_dir"])
        opt = self.config.getoption("jaxlog_dir", None)
        if opt is not None:
            return (self.invocation_dir / os.path.expanduser(opt)).resolve()
        env = os.environ.get("JAXLOG_DIR")
        if env:
            return (self.invocation_dir / os.path.expanduser(env)).resolve()
        ini = self.config.getini("jaxlog_dir") or ".jaxlog"
        return (self.rootdir / os.path.expanduser(str(ini))).resolve()

    def display(self, path: Path | str) -> str:
        return _rel(Path(path), self.invocation_dir)

    # -- per test --------------------------------------------------------------------------------
    def state_for(self, item: pytest.Item) -> TestState:
        """The item's state, created (with a fresh artifact directory) on first use."""
        state = item.stash.get(STATE_KEY, None)
        if state is None:
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
            if any("profile" in m.kwargs for m in item.iter_markers("jaxlog")):
                state.profile_source = "@pytest.mark.jaxlog(profile=...)"
            item.stash[STATE_KEY] = state
        return state

    def finish_item(self, item: pytest.Item, teardown_excinfo: Any) -> dict | None:
        """Decide the outcome, keep or remove the artifacts, set user properties; return the manifest entry."""
        state = item.stash.get(STATE_KEY, None)
        if state is None:
            return None
        reports = item.stash.get(REPORTS_KEY, {})
        outcome = _outcome(reports, teardown_excinfo)
        keep = state.settings.keep
        failed_like = outcome in ("failed", "error", "xfailed", "xpassed")
        kept = keep == "all" or (keep == "failed" and failed_like)
        if kept and keep == "failed" and state.pending_example is not None:
            # the test failed after the last example's `with` block (an assert on the run): that example,
            # the one hypothesis replays last, is the failing one; an earlier kept example is not
            if state.kept_example is not None and state.kept_example != state.pending_example:
                _drop_example(state, state.kept_example)
            state.kept_example, state.pending_example = state.pending_example, None
        if not kept and state.dir.exists():
            shutil.rmtree(state.dir, ignore_errors=True)
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
        if kept:
            props.append(("jaxlog.dir", self.display(state.dir)))
        return {
            "nodeid": item.nodeid,
            "outcome": outcome,
            "kept": kept,
            "dir": _rel(state.dir, self.base) if kept else None,
            "artifacts": {k: _rel(p, self.base) for k, p in artifacts.items()},
            "violations": state.violation_json or [{"message": m} for m in state.violations],
            "compiles": state.compiles,
            "goldens": [dict(g, path=_rel(Path(g["path"]), self.rootdir)) for g in state.goldens],
            "notes": list(state.notes),
            "examples": state.examples,
            "worker": (self.worker or {}).get("workerid"),
        }

    def note_failure(self, item: pytest.Item, excinfo: Any) -> None:
        """Before the call report: gather what open recorders wrote and the violation that failed the test."""
        state = item.stash.get(STATE_KEY, None)
        if state is None:
            return
        for fx in list(state.fixtures):
            fx.refresh()
        exc = getattr(excinfo, "value", None)
        if isinstance(exc, AssertionError) and hasattr(exc, "invariant") and hasattr(exc, "to_json"):
            if state.fixtures:  # not from the fixture's runs/recorders (those are noted already): a jl.run
                state.fixtures[-1]._on_violation(exc, attach=False)  # of the test's own; its files are not ours

    def section(self, item: pytest.Item) -> str | None:
        state = item.stash.get(STATE_KEY, None)
        if state is None:
            return None
        lines = []
        for v in state.violations:
            lines.append(f"violation: {v}")
        lines.append(f"artifacts: {self.display(state.dir)}")
        for key, path in state.artifacts.items():
            lines.append(f"  {key}: {self.display(path)}")
        lines.append(f"compiles: {state.compiles}")
        for note in state.notes:
            lines.append(f"note: {note}")
        if "jaxlog" in getattr(item, "fixturenames", ()) and getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            lines.append("hint: in @given tests use the jaxlog_factory fixture, `with jaxlog_factory() as jaxlog:` "
                         "inside the test: one artifact directory per example, the failing one kept")
        if state.settings.keep == "none":
            lines.append("(artifacts are removed at teardown: --jaxlog-keep=none)")
        return "\n".join(lines)

    def record_entry(self, entry: dict) -> None:
        self.entries[entry["nodeid"]] = entry

    # -- end of session --------------------------------------------------------------------------
    def write_manifest(self, exitstatus: int) -> Path | None:
        if self.worker is not None or not self.entries:
            return None
        self.base.mkdir(parents=True, exist_ok=True)
        path = self.base / "manifest.json"
        doc = {
            "version": MANIFEST_VERSION,
            "started": self.started,
            "finished": time.time(),
            "exitstatus": int(exitstatus),
            "rootdir": str(self.rootdir),
            "settings": {
                "keep": self.settings.keep,
                "profile": self.settings.profile,
                "on_violation": self.settings.on_violation,
                "chunk": self.settings.chunk,
                "regen": self.regen,
            },
            "tests": sorted(self.entries.values(), key=lambda e: e["nodeid"]),
        }
        tmp = path.with_name(f".manifest-{os.getpid()}.json")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        os.replace(tmp, path)
        return path

    def summary(self, tr: Any) -> None:
        if self.worker is not None or not self.entries:
            return
        kept = [e for e in self.entries.values() if e["kept"]]
        regenerated = [g for e in self.entries.values() for g in e["goldens"] if g.get("status") == "regenerated"]
        tr.write_sep("-", "jaxlog")
        tr.write_line(
            f"artifacts kept for {len(kept)} of {len(self.entries)} jaxlog tests in {self.display(self.base)} "
            f"(--jaxlog-keep={self.settings.keep}); manifest: {self.display(self.base / 'manifest.json')}"
        )
        limit = 30
        for e in sorted(kept, key=lambda e: (e["outcome"] == "passed", e["nodeid"]))[:limit]:
            tr.write_line(f"  {e['outcome'].upper():8} {e['nodeid']} -> {self.display(self.base / e['dir'])}")
        if len(kept) > limit:
            tr.write_line(f"  ... and {len(kept) - limit} more (see manifest.json)")
        notes = [(e["nodeid"], n) for e in sorted(self.entries.values(), key=lambda e: e["nodeid"])
                 for n in e.get("notes", ())]
        if notes:
            tr.write_line(f"notes ({len(notes)}):")
            for nodeid, note in notes[:limit]:
                tr.write_line(f"  {nodeid}: {note}")
            if len(notes) > limit:
                tr.write_line(f"  ... and {len(notes) - limit} more (see manifest.json)")
        if regenerated:
            tr.write_line(f"regenerated {len(regenerated)} golden trajectories (--jaxlog-regen):")
            for g in sorted(regenerated, key=lambda g: g["path"]):
                tr.write_line(f"  {g['path']}")


def _outcome(reports: dict[str, Any], teardown_excinfo: Any) -> str:
    setup, call = reports.get("setup"), reports.get("call")
    if setup is not None and setup.failed:
        return "error"
    if setup is not None and setup.skipped:
        return "xfailed" if hasattr(setup, "wasxfail") else "skipped"
    if call is not None:
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


# ---------------------------------------------------------------------------------------------
# the objects the fixtures hand to tests

_UNSET: Any = object()


class JaxlogFixture:
    """The ``jaxlog`` fixture: ``jl.run``/``jl.Recorder`` wired to this test's artifact directory."""

    def __init__(self, session: JaxlogSession, state: TestState, directory: Path | None = None):
        self._session = session
        self._state = state
        self._dir = Path(directory) if directory is not None else state.dir
        self._stems: set[str] = set()
        self._goldens: set[Path] = set()
        self._open: list[Any] = []  # recorders and windows to close at teardown
        self._timelines: list[tuple[Any, Path]] = []
        self._artifacts: dict[str, Path] = {}
        self.runs: list[Any] = []
        state.fixtures.append(self)

    # -- paths -----------------------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        """This test's (or example's) artifact directory, created on first use."""
        self._dir.mkdir(parents=True, exist_ok=True)
        return self._dir

    @property
    def settings(self) -> Settings:
        return self._state.settings

    @property
    def artifacts(self) -> dict[str, Path]:
        """Files written so far, by kind (``trajectory``, ``timeline``, ``jax_trace``, ...; ``<name>:<kind>``
        for runs other than the first): includes recorders and windows whose ``with`` block has exited."""
        self.refresh()
        return self._artifacts

    def _stem(self, name: str | None) -> str:
        if name is not None:
            if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name) or name.startswith("."):
                raise JaxlogError(f"name={name!r}: use letters, digits, '_', '-', '.' (it names files)")
            stem = name
        else:
            stem, n = "trajectory", 1
            while stem in self._stems:
                stem = f"trajectory-{n}"
                n += 1
        if stem in self._stems:
            raise JaxlogError(f"name={name!r} already used by another run in this test")
        self._stems.add(stem)
        return stem

    def _add(self, artifacts: dict[str, Path], stem: str) -> None:
        for kind, path in artifacts.items():
            key = kind if stem == "trajectory" else f"{stem}:{kind}"
            self._artifacts[key] = Path(path)
        label = stem if self._dir == self._state.dir else f"{self._dir.name}/{stem}"
        self._state.add_artifacts(artifacts, label)

    def _window(self, profile: Any, stem: str, steps: Any = None, start_step: Any = 0) -> Any:
        """The run's ProfileWindow. An explicit ``profile=`` is used as given (jl.run rejects one past the
        run). The default from the marker/option applies to every run of the test, short ones included:
        a window outside the run's work steps is skipped, one that sticks out is clipped, with a note
        (report section, manifest, terminal summary) instead of an error."""
        from ._profile import ProfileWindow

        default = profile is _UNSET
        if default:
            profile = self.settings.profile
        if profile is None or isinstance(profile, ProfileWindow):
            return profile
        start, stop = parse_profile(profile, f"{self._state.nodeid}: profile=")  # type: ignore[misc]
        if default:
            try:
                lo = int(start_step)
                hi = lo + int(steps) - 1  # the run's work steps lo..hi
            except (TypeError, ValueError):  # bad steps/start_step: jl.run reports them
                lo = hi = None
            if lo is not None and (start < lo or stop > hi):
                what = f"profile window {start}:{stop} ({self._state.profile_source})"
                label = stem if self._dir == self._state.dir else f"{self._dir.name}/{stem}"
                steps_text = f"work steps {lo}..{hi}" if hi >= lo else "no work steps"
                if stop < lo or start > hi:
                    self._state.notes.append(f"{what} skipped for run {label!r}: it has {steps_text}")
                    return None
                start, stop = max(start, lo), min(stop, hi)
                self._state.notes.append(f"{what} clipped to {start}:{stop} for run {label!r}: it has {steps_text}")
        return ProfileWindow(start, stop, self.dir / f"{stem}-profile")

    def _timeline(self, stem: str) -> Any:
        from ._perfetto import Timeline

        tl = Timeline()
        self._timelines.append((tl, self.dir / f"{stem}.pftrace"))
        return tl

    def _write_timeline(self, tl: Any, path: Path, stem: str) -> None:
        for i, (t, p) in enumerate(self._timelines):
            if t is tl:
                del self._timelines[i]
                break
        try:
            written = tl.write(path)
        except Exception as e:  # a broken trace must not hide the test's own outcome
            warnings.warn(JaxlogRuntimeWarning(f"[jaxlog] could not write timeline {path}: {e!r}"), stacklevel=3)
            return
        self._add({"timeline": Path(written or path)}, stem)

    def _run_artifacts(self, stem: str | None) -> dict[str, Path]:
        """The files of run ``stem`` by plain kind (``trajectory``, ``timeline``, ...); all when None."""
        if stem is None:
            return dict(self._artifacts)
        if stem == "trajectory":
            return {k: p for k, p in self._artifacts.items() if ":" not in k}
        return {k.split(":", 1)[1]: p for k, p in self._artifacts.items() if k.startswith(f"{stem}:")}

    def _on_violation(self, violation: Any, stem: str | None = None, attach: bool = True) -> None:
        """Note a violation of run ``stem``: its message and JSON name that run's files (not other runs')."""
        if violation is None or any(v is violation for v in self._state.violation_objs):
            return
        self._state.violation_objs.append(violation)
        try:
            arts = self._run_artifacts(stem) if attach else {}
            if arts and hasattr(violation, "with_artifacts"):
                violation.with_artifacts({k: self._session.display(p) for k, p in arts.items()})
        except Exception:
            pass
        msg = str(violation)
        if msg not in self._state.violations:
            self._state.violations.append(msg)
            try:
                self._state.violation_json.append(violation.to_json())
            except Exception:
                self._state.violation_json.append({"message": msg})

    def _note_timings(self, obj: Any) -> None:
        timings = getattr(obj, "timings", None)
        compiles = getattr(timings, "compiles", None)
        if isinstance(compiles, int):
            self._state.compiles += compiles

    # -- drivers ---------------------------------------------------------------------------------
    def run(self, step: Any, state: Any, steps: int, *, name: str | None = None, sinks: Any = (),
            profile: Any = _UNSET, progress: Any = _UNSET, chunk: Any = _UNSET, on_violation: Any = _UNSET,
            writer_kwargs: dict | None = None, **kwargs: Any) -> Any:
        """``jl.run`` writing ``<dir>/<name or trajectory[-i]>.h5`` and a ``.pftrace`` timeline; the profile
        window, progress bar, chunk size and violation policy default to the marker/options."""
        from ._hdf5 import HDF5Writer
        from ._run import run as jl_run

        stem = self._stem(name)
        writer = HDF5Writer(self.dir / f"{stem}.h5", **(writer_kwargs or {}))
        window = self._window(profile, stem, steps, kwargs.get("start_step", 0))
        timeline = kwargs.pop("timeline", None)
        own_timeline = timeline is None
        if own_timeline:
            timeline = self._timeline(stem)
        kwargs.update(
            sinks=(writer, *tuple(sinks)),
            profile=window,
            progress=self.settings.progress if progress is _UNSET else progress,
            chunk=self.settings.chunk if chunk is _UNSET else chunk,
            on_violation=self.settings.on_violation if on_violation is _UNSET else on_violation,
            timeline=timeline,
        )
        result = None
        caught: list = []
        try:
            # jl.run's warnings (on_violation="warn") point at its caller, which is this method: caught here and
            # re-emitted below at the test's line. The user's filters still apply (-W error raises in the run).
            with warnings.catch_warnings(record=True) as caught:
                result = jl_run(step, state, steps, **kwargs)
        except BaseException as e:  # InvariantViolation (an AssertionError: a test failure) or anything else
            partial = getattr(e, "jaxlog_run", None)
            self._collect(writer, window, partial, stem)
            if own_timeline:
                self._write_timeline(timeline, self.dir / f"{stem}.pftrace", stem)
            self._note_timings(partial)
            if isinstance(e, AssertionError) and hasattr(e, "invariant"):
                self._on_violation(e, stem)
            _reemit(caught)
            raise
        _reemit(caught)
        self._collect(writer, window, result, stem)
        if own_timeline:
            self._write_timeline(timeline, self.dir / f"{stem}.pftrace", stem)
        self._note_timings(result)
        self._on_violation(getattr(result, "violation", None), stem)
        self.runs.append(result)
        return result

    def _collect(self, writer: Any, window: Any, result: Any, stem: str) -> None:
        arts: dict[str, Path] = {}
        for src in (writer, window, result):
            if src is None:
                continue
            try:
                arts.update({k: Path(v) for k, v in dict(getattr(src, "artifacts", None) or {}).items()})
            except Exception:
                pass
        arts = {k: p for k, p in arts.items() if p.exists()}
        self._add(arts, stem)

    def recorder(self, record: Any = None, *, name: str | None = None, sinks: Any = (), on_violation: Any = _UNSET,
                 writer_kwargs: dict | None = None, **kwargs: Any) -> Any:
        """A ``jl.Recorder`` (Logger protocol, for hand-written loops) writing ``<dir>/<name>.h5``.
        Use it as a context manager; artifacts are gathered when it exits or at teardown."""
        from ._hdf5 import HDF5Writer
        from ._recorder import Recorder

        stem = self._stem(name)
        writer = HDF5Writer(self.dir / f"{stem}.h5", **(writer_kwargs or {}))
        if "timeline" not in kwargs:
            kwargs["timeline"] = self._timeline(stem)
        rec = Recorder(
            record,
            sinks=(writer, *tuple(sinks)),
            on_violation=self.settings.on_violation if on_violation is _UNSET else on_violation,
            **kwargs,
        )
        self._open.append(("recorder", rec, writer, stem, kwargs["timeline"]))
        return rec

    def profile_window(self, start: int | None = None, stop: int | None = None, *, name: str = "profile") -> Any:
        """A ``jl.ProfileWindow`` into this test's directory (default window: marker/option)."""
        from ._profile import ProfileWindow

        if start is None or stop is None:
            if self.settings.profile is None:
                raise JaxlogError(f"{self._state.nodeid}: profile_window() needs start, stop (no marker/option window)")
            start, stop = self.settings.profile
        win = ProfileWindow(start, stop, self.dir / name)
        self._open.append(("window", win, None, name, None))
        return win

    def check_golden(self, run: Any, name: str | None = None, *, rtol: float = 1e-7, atol: float = 0.0,
                     records: Any = None) -> str:
        """Compare ``run`` with ``<jaxlog_golden_dir>/<test id>[-name].h5``; ``--jaxlog-regen`` (re)writes it."""
        from ._golden import check_golden, golden_name

        if name is not None and not re.fullmatch(r"[A-Za-z0-9_.\-]+", str(name)):
            raise JaxlogError(f"check_golden(name={name!r}): use letters, digits, '_', '-', '.' (it names a file)")
        path = self._session.golden_dir / golden_name(self._state.nodeid, suffix=f"-{name}.h5" if name else ".h5")
        if path in self._goldens:  # else --jaxlog-regen keeps the last run's and the first run then fails
            raise JaxlogError(
                f"check_golden(name={name!r}): this test already checked golden {self._session.display(path)}; "
                "give each checked run its own name= (e.g. name=\"second\")"
            )
        self._goldens.add(path)
        status = check_golden(run, path, regen=self._session.regen, rtol=rtol, atol=atol, records=records)
        self._state.goldens.append({"path": str(path), "status": status})
        if status == "regenerated":
            note = ""
            try:  # a reference made from a broken run deserves a second look
                traj = getattr(run, "trajectory", run)
                traj_status = getattr(traj, "status", None)
                if traj_status not in (None, "complete"):
                    v = getattr(traj, "violation", None)
                    inv = v.get("invariant") if isinstance(v, dict) else None
                    note = f"; note: the run's status is {traj_status!r}" + (
                        f" ({inv} violated at step {v.get('step')})" if inv else "")
            except Exception:
                pass
            warnings.warn(
                JaxlogRuntimeWarning(f"[jaxlog] regenerated golden {self._session.display(path)} (--jaxlog-regen){note}"),
                stacklevel=2,
            )
        return status

    def load(self, name: str | None = None) -> Any:
        """``jl.load`` of this test's trajectory ``name`` (default: the first)."""
        from ._trajectory import load

        stem = name or "trajectory"
        return load(self.dir / f"{stem}.h5")

    def refresh(self) -> None:
        """Gather the files and violations of recorders and windows so far (idempotent)."""
        for kind, obj, writer, stem, timeline in self._open:
            if kind == "recorder":
                self._collect(writer, None, obj, stem)
                finished = getattr(obj, "status", "new") not in ("new", "running")
                if finished and any(t is timeline for t, _ in self._timelines):  # our timeline: write it now
                    self._write_timeline(timeline, self.dir / f"{stem}.pftrace", stem)
                self._on_violation(getattr(obj, "violation", None), stem)
            else:
                self._collect(None, obj, None, stem)

    def close(self) -> None:
        """Gather artifacts of recorders/windows, write timelines (the test's `with` blocks closed them)."""
        try:
            self.refresh()
            windows = any(kind == "window" for kind, *_ in self._open)
            for kind, obj, _, stem, _ in self._open:
                if kind == "recorder":
                    self._note_timings(obj)
                    if self.settings.profile is not None and not windows:  # say why no trace came out
                        a, b = self.settings.profile
                        label = stem if self._dir == self._state.dir else f"{self._dir.name}/{stem}"
                        self._state.notes.append(
                            f"profile window {a}:{b} ({self._state.profile_source}) not applied to recorder {label!r}: "
                            "in hand-written loops log a jaxlog.profile_window() too (jl.CompositeLogger(recorder, window))"
                        )
        finally:
            self._open.clear()
            for tl, path in list(self._timelines):
                self._write_timeline(tl, path, path.stem)
            if self in self._state.fixtures:
                self._state.fixtures.remove(self)


class JaxlogFactory:
    """The ``jaxlog_factory`` fixture (session scope): ``with jaxlog_factory() as jaxlog:`` per hypothesis
    example. Each example gets ``<test dir>/example-<n>``; a passing example's directory is removed
    (unless keep=all), a failing one is kept, replacing the previous failing one (hypothesis replays the
    minimal failing example last)."""

    def __init__(self, session: JaxlogSession):
        self._session = session

    @contextmanager
    def __call__(self) -> Iterator[JaxlogFixture]:
        item = self._session.current_item
        if item is None:
            raise JaxlogError("jaxlog_factory() must be used inside a running test")
        state = self._session.state_for(item)
        if state.pending_example is not None:  # a new example: the previous one passed
            _drop_example(state, state.pending_example)
            state.pending_example = None
        n = state.examples
        state.examples += 1
        fx = JaxlogFixture(self._session, state, state.dir / f"example-{n}")
        failed = False
        try:
            yield fx
        except BaseException:
            failed = True
            raise
        finally:
            try:
                fx.close()
            except BaseException:
                failed = True
                raise
            finally:
                self._settle(state, fx, failed)

    def _settle(self, state: TestState, fx: JaxlogFixture, failed: bool) -> None:
        d = fx._dir
        keep = state.settings.keep
        if keep == "all":
            return
        if failed and keep == "failed":
            prev = state.kept_example
            if prev is not None and prev != d:
                _drop_example(state, prev)
            state.kept_example = d
            return
        if keep == "failed":  # passed inside `with`; removed when the next example starts or the test passes
            state.pending_example = d
            return
        _drop_example(state, d)


def _reemit(caught: list) -> None:
    """Warnings caught around a ``jl.run`` call in ``JaxlogFixture.run``: jaxlog's own at the line of the test
    that called ``jaxlog.run`` (stack: _reemit, run, caller), others where they were first raised."""
    for w in caught:
        if issubclass(w.category, JaxlogRuntimeWarning):
            warnings.warn(w.message, stacklevel=3)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


def _drop_example(state: TestState, d: Path) -> None:
    shutil.rmtree(d, ignore_errors=True)
    for k in [k for k, p in state.artifacts.items() if _under(p, d)]:
        state.artifacts.pop(k, None)


def _under(path: Path, d: Path) -> bool:
    try:
        Path(path).relative_to(d)
        return True
    except ValueError:
        return False
