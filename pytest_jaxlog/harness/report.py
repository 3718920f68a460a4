"""The pytest side of the session's HTML report: ``--jaxlog-report[=PATH]`` (``JAXLOG_REPORT``,
ini ``jaxlog_report``), the failure messages it shows, writing it at the session's end, and the
failing tests' plots as pytest-html extras.

The report is written by the process that writes the manifest (the xdist controller, from the
merged manifest), after it. A report that cannot be written is a warning, never a failed session.
"""

from __future__ import annotations

import base64
import os
import time
import warnings
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any, Callable, Generator, Iterable
from urllib.parse import quote

import pytest

from ..errors import JaxlogError, JaxlogRuntimeWarning
from .options import Option, add_option, lookup, parse_flag, what
from .session import STATE_KEY, JaxlogSession, TestState

REPORT = Option("report", "auto", "the session's HTML report: on (DIR/report.html), a file (=PATH, relative as for "
                "dir), no, or auto: on under keep=failed|all", metavar="PATH", const="on")
MAX_MESSAGES = 500  # failure messages kept for the report (the report shows at most MAX_MESSAGE_CHARS of each)


def add_report_option(parser: pytest.Parser) -> None:
    add_option(parser, REPORT)


def report_path(session: JaxlogSession) -> Path | None:
    """Where the session's report goes, or None (off)."""
    pass

    src = lookup(session.config, REPORT)
    text = str(src.value).strip()
    if text.lower() in ("", "auto"):
        return session.base / NAME if session.settings.keep in ("failed", "all") else None
    if text.lower() == "none":
        return None
    try:
        on = parse_flag(text, what("report", src))
    except JaxlogError:
        on = None  # a path
    if on is not None:
        return session.base / NAME if on else None
    where = session.invocation_dir if src.origin in ("cli", "env") else session.rootdir
    path = (where / os.path.expanduser(text)).resolve()
    why = None
    if path.is_dir():
        why = "is a directory; the report is a file"
    elif path.suffix.lower() not in (".html", ".htm"):
        why = "is not an .html file"
    elif path.exists() and not is_report(path):
        why = "exists and is not a jaxlog report (it is never overwritten)"
    if why is not None:
        raise pytest.UsageError(f"{what('report', src)}: {path} {why}: give it as {REPORT.flag_name}=PATH "
                                f"(a bare {REPORT.flag_name} takes the next argument)")
    return path


class ReportPlugin:
    """Registered per config: gathers failure messages, attaches plots to pytest-html, writes the report."""

    def __init__(self, session: JaxlogSession):
        self.session = session
        self.path = report_path(session) if session.worker is None else None
        self.messages: dict[str, str] = {}
        self.written: Path | None = None
        self.error = ""

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed and len(self.messages) < MAX_MESSAGES and report.nodeid not in self.messages:
            crash = getattr(report.longrepr, "reprcrash", None)
            self.messages[report.nodeid] = str(getattr(crash, "message", None) or report.longreprtext)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Generator[None, Any, Any]:
        report = yield
        if report.failed and call.when in ("setup", "call"):
            add_html_extras(item, report)
        return report

    @pytest.hookimpl(trylast=True)  # after the plugin's own hook has written the manifest
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        from ..store import manifest
        pass

        if self.session.worker is not None or session.config.option.collectonly:
            return
        if self.path is None:
            remove_stale(self.session.base / NAME)
            return

        found = self.session.base / manifest.NAME
        if not (self.session.entries or self.session.previous_manifest) or not found.is_file():
            return  # no manifest written by this session: no jaxlog test ran
        try:
            doc = manifest.read(found)
            self.written = write(self.path, render(doc, self.session.base, self.path.parent, self.messages))
        except Exception as e:  # the session's outcome stands: said in the terminal summary
            self.error = f"could not write {self.session.display(self.path)}: {e!r}"

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.written is not None:
            terminalreporter.write_line(f"jaxlog report: {self.session.display(self.written)}")
        elif self.error:
            terminalreporter.write_line(f"jaxlog report: {self.error}")


def add_html_extras(item: pytest.Item, report: pytest.TestReport) -> None:
    """The test's plots as images in pytest-html's report (when it is writing one)."""
    config = item.config
    if config.pluginmanager.getplugin("html") is None or not config.getoption("htmlpath", None):
        return
    state = item.stash.get(STATE_KEY, None)
    if state is None:
        return
    try:
        from pytest_html import extras
    except ImportError:
        return
    added = list(getattr(report, "extras", []))
    for key, path in state.artifacts.items():
        if state.kinds.get(key) == "plot" and Path(path).suffix.lower() == ".png" and Path(path).is_file():
            added.append(extras.png(base64.b64encode(Path(path).read_bytes()).decode("ascii"), name=f"jaxlog {key}"))
    setattr(report, "extras", added)  # noqa: B010  (pytest-html reads it; TestReport does not declare it)

# ---------------------------------------------------------------------------------------------
# Plots of failed golden and cost checks, left in the test's artifact directory and listed as
# its ``plot`` artifact; the failure's message names the file, or says how to get matplotlib.
# Each wing draws its own picture (``compare.golden.plot_mismatch``, ``compare.cost.plot_regression``);
# this side only names the file, lists it and attaches it.
#
# A plot that cannot be drawn never hides the failure it illustrates: it is warned about and the
# check's own error is raised as it was.

def plot_key(state: TestState, label: str) -> str:
    """``plot`` for the test's first plot, ``<label>:plot`` when the test has one already."""
    return "plot" if "plot" not in state.artifacts else f"{label}:plot"


def _note_plot(session: JaxlogSession, state: TestState, label: str, path: Path | None, exc: BaseException) -> None:
    """List ``path`` as a ``plot`` artifact and name it (or how to get one) at the end of ``exc``'s message."""
    from ..check.plots import INSTALL_PLOT

    if path is None:
        line = f"  no plot: {INSTALL_PLOT} draws one" if _no_matplotlib() else None
    else:
        key = plot_key(state, label)
        state.artifacts[key] = path
        state.kinds[key] = "plot"
        line = f"  plot: {session.display(path)}"
    if line and exc.args and isinstance(exc.args[0], str):
        exc.args = (_before_the_fix(exc.args[0], line), *exc.args[1:])


FIXES = ("--jaxlog-", "python -m pytest_jaxlog ")  # what a last line that fixes a failure names: a flag, a command


def _before_the_fix(message: str, line: str) -> str:
    """``line`` added to ``message``, above its last line when that names the flag (or, for a
    pending golden, the command) that fixes the failure: a failure's message ends with its fix."""
    head, sep, last = message.rpartition("\n")
    if sep and any(fix in last for fix in FIXES):
        return f"{head}\n{line}\n{last}"
    return f"{message}\n{line}"


def _no_matplotlib() -> bool:
    from ..check.plots import have_matplotlib

    return not have_matplotlib()


def _draw(what: str, draw: Any) -> Path | None:
    """``draw()``'s path; None without matplotlib or (warned) when drawing fails."""
    if _no_matplotlib():
        return None
    try:
        return draw()
    except Exception as e:  # the check's own failure is what the test reports
        warnings.warn(JaxlogRuntimeWarning(f"[jaxlog] could not plot the {what}: {e!r}"), stacklevel=4)
        return None


def failure_plot(session: JaxlogSession, state: TestState, label: str, file: str, what: str,
                 draw: Callable[[Path], Path | None], exc: BaseException) -> None:
    """``<test dir>/<file>``, drawn by the wing that failed (``draw(path)``: its picture, None when
    it has nothing to draw), listed as the test's plot (``label``) and named in ``exc``'s message.
    The drawing is the wing's; where the file goes and how it is attached is the pytest side's."""
    _note_plot(session, state, label, _draw(what, lambda: draw(state.dir / file)), exc)

# ---------------------------------------------------------------------------------------------
# Small inline SVG plots of a scalar record for the session's HTML report: no matplotlib, no
# script, a bounded size whatever the run's length.
#
# A record of 60,000 steps keeps at most ``MAX_POINTS`` points: the steps are cut into buckets and
# each bucket keeps its lowest and highest value (in step order), so a spike or a sudden drift in
# a long run stays visible where plain striding would step over it. Non-finite values are left out
# of the line and counted in the caption.

MAX_POINTS = 200  # points per sparkline at most
WIDTH, HEIGHT, PAD = 180, 36, 2


@dataclass(frozen=True)
class Series:
    """A record's points as drawn: steps and values (finite only), and what was left out."""

    steps: Any  # numpy int64 array
    values: Any  # numpy float64 array
    nonfinite: int
    frames: int


def downsample(steps: Any, values: Any, max_points: int = MAX_POINTS) -> Series:
    """At most ``max_points`` (step, value) pairs: each of ``max_points // 2`` buckets of steps keeps
    its minimum and maximum, in step order; non-finite values are dropped and counted."""
    import numpy as np

    steps = np.asarray(steps, np.int64).reshape(-1)
    values = np.asarray(values, np.float64).reshape(-1)
    finite = np.isfinite(values)
    s, v = steps[finite], values[finite]
    if len(v) > max_points:
        keep = np.union1d(_first_extreme(v, max_points // 2, np.minimum), _first_extreme(v, max_points // 2, np.maximum))
        s, v = s[keep], v[keep]
    return Series(s, v, int((~finite).sum()), len(values))


def _first_extreme(v: Any, buckets: int, ufunc: Any) -> Any:
    """The index of the first minimum (``np.minimum``) or maximum of each of ``buckets`` consecutive
    stretches of ``v``, cut as ``np.array_split`` cuts (vectorised: a long record in one pass)."""
    import numpy as np

    n, k = len(v), max(1, buckets)
    sizes = np.full(k, n // k)
    sizes[: n % k] += 1
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    extreme = ufunc.reduceat(v, starts)
    hits = np.flatnonzero(v == np.repeat(extreme, sizes))
    bucket = np.searchsorted(starts, hits, side="right") - 1
    _, first = np.unique(bucket, return_index=True)
    return hits[first]


def sparkline_svg(series: Series, title: str) -> str:
    """An inline ``<svg>`` of ``series`` (an escaped ``title`` as its tooltip), or a short note when
    nothing finite was recorded."""
    if len(series.values) == 0:
        return f'<span class="muted">{escape(title)}: no finite values</span>'
    x0, x1 = float(series.steps[0]), float(series.steps[-1])
    y0, y1 = float(series.values.min()), float(series.values.max())
    sx = (WIDTH - 2 * PAD) / (x1 - x0) if x1 > x0 else 0.0
    sy = (HEIGHT - 2 * PAD) / (y1 - y0) if y1 > y0 else 0.0
    pts = " ".join(f"{PAD + (float(x) - x0) * sx:.1f},{HEIGHT - PAD - (float(y) - y0) * sy:.1f}"
                   for x, y in zip(series.steps, series.values))
    if len(series.values) == 1:  # one frame: a level line across
        pts = f"{PAD},{HEIGHT / 2:.1f} {WIDTH - PAD},{HEIGHT / 2:.1f}"
    caption = f"{title}: {len(series.values)} of {series.frames} frames drawn, steps {int(x0)}..{int(x1)}, " \
              f"{y0:.6g}..{y1:.6g}" + (f", {series.nonfinite} not finite" if series.nonfinite else "")
    return (f'<svg class="spark" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img">'
            f'<title>{escape(caption)}</title><polyline fill="none" stroke="#1f77b4" stroke-width="1.2" '
            f'points="{pts}"/></svg>')

# ---------------------------------------------------------------------------------------------
# The session's HTML report (``.jaxlog/report.html``): one self-contained file a person opens
# from a CI artifact, offline: every jaxlog test of the session with its outcome, runs, steps/s,
# compiles and goldens; the failures first, each with its plots, message and files; small plots of
# each kept test's scalar records. The header counts this session's tests only; the entries earlier
# sessions left (marked stale in the manifest) are listed apart, each with its session, so a session
# that ran no jaxlog test never reads as one whose tests all passed.
#
# Built from the manifest (the merged one under xdist), the failure messages pytest reported and
# the kept trajectory files; plots are embedded as ``data:`` images, sparklines as inline SVG, the
# style inline, and there is no script at all. Every string that comes from a test, a record or a
# file is escaped, and a Content-Security-Policy allows nothing but inline styles and ``data:``
# images, so a hostile test id or record name can neither inject markup nor make the page load
# anything. The page stays small for a big session: ``MAX_EMBEDDED_PLOTS`` plots of at most
# ``MAX_PLOT_BYTES`` each are embedded (the rest are linked), sparklines are drawn for at most
# ``MAX_SPARK_TESTS`` tests, ``MAX_SPARKS_PER_TEST`` records each, ``sparkline.MAX_POINTS`` points each,
# and trajectories are read for them for ``MAX_SPARK_SECONDS`` at most.

NAME = "report.html"
TITLE = "<title>jaxlog report</title>"  # how a page of ours is told from another file of that name
MAX_EMBEDDED_PLOTS = 40
MAX_PLOT_BYTES = 2_000_000
MAX_SPARK_TESTS = 50
MAX_SPARKS_PER_TEST = 8
MAX_SPARK_SECONDS = 10.0  # reading trajectories for sparklines stops after this long (a session's end stays quick)
MAX_MESSAGE_CHARS = 6000
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fff}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}h3{font-size:1em;margin:.2em 0}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #ddd;padding:4px 6px;
text-align:left;vertical-align:top}th{background:#f4f4f4}
.failure{border:1px solid #e0b4b4;background:#fff8f8;padding:.6em 1em;margin:.8em 0;border-radius:4px}
.badge{display:inline-block;padding:0 .5em;border-radius:3px;font-size:.85em;color:#fff;background:#888}
.failed,.error,.xpassed,.interrupted{background:#c62828}.passed{background:#2e7d32}
.badge.stale{background:#6d4c41}table.stale{opacity:.85}
.badge.slower{background:#c62828}.badge.not-slower{background:#2e7d32}.badge.cannot-tell{background:#ef6c00}
pre{white-space:pre-wrap;background:#f6f6f6;padding:.5em;overflow-x:auto;font-size:12px}
img.plot{max-width:100%;border:1px solid #ccc;margin:.3em 0;display:block}
.spark{vertical-align:middle;background:#fafafa;border:1px solid #eee}.muted{color:#777}
.sparks div{display:inline-block;margin:0 1em .4em 0;font-size:12px}code{font-size:12px}
"""


def render(doc: dict, base: Path, out_dir: Path, messages: dict[str, str] | None = None) -> str:
    """The page for manifest ``doc`` (its paths relative to ``base``), linking files relative to
    ``out_dir`` (where the page is written); ``messages``: each failed test's failure text."""
    from ..store import manifest  # lazy, as every package layer on the pytest side

    messages = messages or {}
    tests = sorted(manifest.current_tests(doc), key=lambda t: (not manifest.not_passed(t), str(t.get("nodeid"))))
    stale = _stale_rows(doc)
    budget = Budget()
    failures = [t for t in tests if manifest.not_passed(t)]
    parts = [f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
             f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
             f"{TITLE}<style>{STYLE}</style></head><body>",
             "<h1>jaxlog report</h1>", _headline(doc, tests=tests, failures=failures, stale=stale)]
    if failures:
        parts.append(f"<h2>Failures ({len(failures)})</h2>")
        parts += [_failure(t, base, out_dir, messages.get(str(t.get("nodeid")), ""), budget) for t in failures]
    if tests:
        parts.append(f"<h2>Jaxlog tests of this session ({len(tests)})</h2>")
        parts.append(_table(tests, base, out_dir, budget))
    if stale:
        parts.append(_stale_section(stale, base, out_dir))
    parts.append(f'<p class="muted">{escape(budget.note())}</p></body></html>')
    return "\n".join(parts)


class Budget:
    """What the page has embedded so far, against the caps that keep it small."""

    def __init__(self) -> None:
        self.plots = 0
        self.plots_linked = 0
        self.spark_tests = 0
        self.spark_tests_skipped = 0
        self.spark_deadline = time.monotonic() + MAX_SPARK_SECONDS

    def spark_room(self) -> bool:
        """Whether one more test gets sparklines (else it is counted as left out)."""
        if self.spark_tests >= MAX_SPARK_TESTS or time.monotonic() > self.spark_deadline:
            self.spark_tests_skipped += 1
            return False
        self.spark_tests += 1
        return True

    def note(self) -> str:
        out = (f"caps: {MAX_EMBEDDED_PLOTS} embedded plots of at most {MAX_PLOT_BYTES // 1000} kB, sparklines for "
               f"{MAX_SPARK_TESTS} tests, {MAX_SPARKS_PER_TEST} records each, at most "
               f"{MAX_POINTS} points each, {MAX_SPARK_SECONDS:g} s of reading")
        if self.plots_linked:
            out += f"; {self.plots_linked} plots linked, not embedded"
        if self.spark_tests_skipped:
            out += f"; sparklines left out for {self.spark_tests_skipped} tests"
        return out


def _headline(doc: dict, *, tests: list[dict], failures: list[dict], stale: list[dict]) -> str:
    """Counts and time of this session's tests only: carried entries are an earlier session's
    evidence, and counted here they would read as this session's results."""
    from ..store import manifest

    finished = doc.get("finished")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(finished)) if isinstance(finished, (int, float)) else "?"
    keep = manifest.settings(doc).get("keep")
    ran = (f"{len(tests)} jaxlog tests in this session, <b>{len(failures)} not passed</b>" if tests
           else "<b>no jaxlog test ran in this session</b>")
    out = (f'<p class="headline">{ran}; exit status {escape(str(doc.get("exitstatus")))}; finished {escape(when)}; '
           f"keep={escape(str(keep))}</p>")
    if stale:
        out += (f'<p class="muted">{len(stale)} stale entries of earlier sessions are listed apart below '
                "(Stale evidence) and not counted here.</p>")
    return out


def _badge(outcome: Any) -> str:
    text = escape(str(outcome))
    return f'<span class="badge {text}">{text.upper()}</span>'


def _failure(t: dict, base: Path, out_dir: Path, message: str, budget: Budget) -> str:
    from ..store import manifest

    out = [f'<section class="failure"><h3>{_badge(t.get("outcome"))} <code>{escape(str(t.get("nodeid")))}</code>'
           f"</h3>"]
    text = message or "\n".join(_messages(t))
    if text:
        if len(text) > MAX_MESSAGE_CHARS:
            text = text[:MAX_MESSAGE_CHARS] + f"\n... ({len(text) - MAX_MESSAGE_CHARS} more characters)"
        out.append(f"<pre>{escape(text)}</pre>")
    out += [_plot(key, base / rel, out_dir, budget) for key, rel in _artifacts(t) if manifest.is_plot(key)]
    out.append(_files(t, base, out_dir))
    out.append(_sparks(t, base, budget))
    out.append("</section>")
    return "\n".join(out)


def _messages(t: dict) -> list[str]:
    """What the manifest says went wrong: the error line, each violation's message."""
    out = [str(t["error"])] if t.get("error") else []
    for v in t.get("violations") or []:
        msg = v.get("message") if isinstance(v, dict) else v
        if msg:
            out.append(str(msg))
    return out


def _artifacts(t: dict) -> list[tuple[str, str]]:
    arts = t.get("artifacts")
    return sorted((str(k), str(v)) for k, v in arts.items()) if isinstance(arts, dict) else []


def _href(path: Path, out_dir: Path) -> str:
    """A relative link from the page to ``path``, percent-encoded (no scheme can appear)."""
    try:
        rel = os.path.relpath(path, out_dir)
    except ValueError:  # another drive
        rel = str(path)
    return escape(quote(Path(rel).as_posix(), safe="/._-~"))


def _plot(key: str, path: Path, out_dir: Path, budget: Budget) -> str:
    caption = f'<div class="muted">{escape(key)}: <a href="{_href(path, out_dir)}">{escape(path.name)}</a></div>'
    mime = {".png": "image/png", ".svg": "image/svg+xml"}.get(path.suffix.lower())
    try:
        size = path.stat().st_size
    except OSError:
        return caption + '<div class="muted">(the file is gone)</div>'
    if mime is None or size > MAX_PLOT_BYTES or budget.plots >= MAX_EMBEDDED_PLOTS:
        budget.plots_linked += 1
        return caption
    budget.plots += 1
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'{caption}<img class="plot" alt="{escape(key)}" src="data:{mime};base64,{data}">'


def _files(t: dict, base: Path, out_dir: Path) -> str:
    items = [f'<li>{escape(k)}: <a href="{_href(base / rel, out_dir)}">{escape(rel)}</a></li>' for k, rel in _artifacts(t)]
    return f"<ul>{''.join(items)}</ul>" if items else ""


def _table(tests: list[dict], base: Path, out_dir: Path, budget: Budget) -> str:
    from ..store import manifest

    head = ("<table><tr><th>test</th><th>outcome</th><th>runs</th><th>steps/s</th><th>compiles</th>"
            "<th>goldens</th><th>files</th><th>records</th></tr>")
    rows = []
    for t in tests:
        runs = [r for r in t.get("runs") or [] if isinstance(r, dict)]
        rates = [_rate(r) for r in runs]
        run_text = "<br>".join(f"{escape(str(r.get('name')))}: {escape(str(r.get('steps')))} "
                               f"step{'' if r.get('steps') == 1 else 's'}" for r in runs)
        goldens = "<br>".join(f"{escape(Path(str(g.get('path'))).name)}: {escape(str(g.get('status')))}"
                              + (f" (<code>jaxlog golden accept {escape(str(g['id']))}</code>)" if g.get("id") else "")
                              for g in t.get("goldens") or [] if isinstance(g, dict))
        sparks = _sparks(t, base, budget) if not manifest.not_passed(t) else '<span class="muted">(above)</span>'
        rates += _benchmark_lines(t)
        rows.append(f"<tr><td><code>{escape(str(t.get('nodeid')))}</code></td><td>{_badge(t.get('outcome'))}</td>"
                    f"<td>{run_text}</td><td>{'<br>'.join(rates)}</td><td>{escape(str(t.get('compiles', 0)))}</td>"
                    f"<td>{goldens}</td><td>{_files(t, base, out_dir)}</td><td>{sparks}</td></tr>")
    return head + "".join(rows) + "</table>"


def _rate(run: dict) -> str:
    """A run's steps/s, one line per run beside the runs column; none for a run too short to time."""
    rate = run.get("steps_per_s")
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        return f"{rate:.4g}"
    return '<span class="muted">too short to time</span>'


def _benchmark_lines(t: dict) -> list[str]:
    """A test's benchmarks: steps/s, and each verdict as a badge (against the reference; against
    the saved run where compared), "cannot tell" as visible as "slower"."""
    out = []
    for b in t.get("benchmarks") or []:
        if not isinstance(b, dict) or not isinstance(b.get("steps_per_s"), (int, float)):
            continue
        text = f"{escape(str(b.get('name')))}: {b['steps_per_s']:.4g}"
        for label, found in (("vs reference", b), ("vs saved", b.get("compare"))):
            if isinstance(found, dict) and found.get("verdict") in _VERDICT_CLASSES:
                detect = found.get("detectable")
                power = f", could detect x{detect:.3f}" if isinstance(detect, (int, float)) else ""
                text += (f' {label} <span class="badge {_VERDICT_CLASSES[found["verdict"]]}" title="interval '
                         f'{escape(str(found.get("interval")))} at x{escape(str(found.get("than")))}{power}">'
                         f'{escape(str(found["verdict"]).upper())}</span>')
        out.append(text)
    return out


_VERDICT_CLASSES = {"slower": "slower", "not slower": "not-slower", "cannot tell": "cannot-tell"}


def _stale_rows(doc: dict) -> list[dict]:
    """What earlier sessions left: the carried test entries, and the stale directories no such entry
    names (a manifest merged from shards, or written by an older version), newest session first."""
    from ..store import manifest

    entries = manifest.stale_tests(doc)
    named = {e.get("dir") for e in entries}
    entries += [dict(s, stale=True) for s in manifest.stale(doc) if s.get("dir") not in named]
    return [e for group in manifest.by_session(entries).values()
            for e in sorted(group, key=lambda e: (not manifest.not_passed(e), str(e.get("nodeid"))))]


def _stale_section(stale: list[dict], base: Path, out_dir: Path) -> str:
    """The earlier sessions' entries, apart from this session's tests, each badged with its session:
    their evidence stays reachable without being taken for this session's results."""
    from ..store import manifest

    groups = manifest.by_session(stale)
    sessions = ", ".join(f"{escape(sid)} ({len(g)})" for sid, g in groups.items())
    head = (f'<h2>Stale evidence ({len(stale)})</h2><p class="muted">Entries that earlier sessions left for tests '
            f"this session did not run (not run again, renamed or deleted), not counted above; from "
            f"session{'s' if len(groups) > 1 else ''} {sessions}. <code>--jaxlog-clean-stale</code> removes them.</p>"
            '<table class="stale"><tr><th>test</th><th>outcome</th><th>session</th><th>message</th>'
            "<th>files</th></tr>")
    rows = []
    for e in stale:
        message = next(iter(_messages(e)), "").strip().splitlines()
        files = _files(e, base, out_dir)
        if not files and isinstance(e.get("dir"), str) and e["dir"]:
            files = f'<ul><li>dir: <a href="{_href(base / e["dir"], out_dir)}">{escape(e["dir"])}</a></li></ul>'
        rows.append(f"<tr><td><code>{escape(str(e.get('nodeid')))}</code></td><td>{_badge(e.get('outcome'))}</td>"
                    f'<td><span class="badge stale">session {escape(manifest.entry_session(e))}</span></td>'
                    f"<td>{escape(message[0][:500]) if message else ''}</td><td>{files}</td></tr>")
    return head + "".join(rows) + "</table>"


def _sparks(t: dict, base: Path, budget: Budget) -> str:
    """Sparklines of the scalar records of the test's kept trajectories, within the caps."""
    trajectories = [base / rel for key, rel in _artifacts(t) if key.rsplit(":", 1)[-1] == "trajectory"]
    if not trajectories:
        return ""
    if not budget.spark_room():
        return ""
    out: list[str] = []
    for path in trajectories:
        for name, svg in _record_sparks(path, MAX_SPARKS_PER_TEST - len(out)):
            out.append(f"<div>{escape(name)}<br>{svg}</div>")
    return f'<div class="sparks">{"".join(out)}</div>' if out else ""


def _record_sparks(path: Path, room: int) -> Iterable[tuple[str, str]]:
    """(label, svg) for up to ``room`` scalar records of the trajectory at ``path``."""
    if room <= 0:
        return []
    import numpy as np

    from ..store.hdf5.trajectory import load

    try:
        traj = load(path)
        out = []
        for name in traj.records:
            spec = traj.schema[name]
            if np.dtype(spec.dtype).kind not in "biuf" or int(np.prod(spec.shape, dtype=np.int64)) != 1:
                continue  # scalar records only, and no array read to find out
            values = np.asarray(traj[name])
            label = f"{path.stem}/{name}" if path.stem != "trajectory" else name
            out.append((label, sparkline_svg(downsample(traj.steps(name), values), label)))
            if len(out) >= room:
                break
        return out
    except Exception as e:  # a damaged file: said in the page, never a failed report
        return [(path.name, f'<span class="muted">unreadable: {escape(type(e).__name__)}</span>')]


def is_report(path: Path) -> bool:
    """Whether the file at ``path`` is a page of ours (else it is never overwritten or removed)."""
    try:
        with open(path, "rb") as f:
            return TITLE.encode() in f.read(2000)
    except OSError:
        return False


def remove_stale(path: Path) -> bool:
    """Remove an earlier session's report at ``path`` (a page of ours only): a session without a
    report leaves none that shows another session's failures."""
    if not is_report(path):
        return False
    path.unlink(missing_ok=True)
    return True


def write(path: Path, text: str) -> Path:
    """The page at ``path``, written beside it and renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path

# ---------------------------------------------------------------------------------------------
# A failing test's plots as JUnit XML attachments: ``[[ATTACHMENT|path]]`` lines in the test
# case's ``<system-out>``, the convention Jenkins' junit-attachments plugin, GitLab's test report
# and Azure DevOps read (each on its own line, nothing around it).
#
# pytest's ``--junitxml`` offers plugins ``<properties>`` only (``record_property``, the
# ``user_properties`` the plugin fills with ``jaxlog.plot`` too); no CI reads attachments there.
# Its ``<system-out>`` holds captured output only under ``junit_logging=system-out|out-err|all``.
# So: under those settings the lines join pytest's own captured output (a ``Captured stdout
# teardown`` section of the teardown report, which pytest writes into ``<system-out>``); otherwise
# a ``<system-out>`` element of our own goes into the test case through pytest's JUnit reporter
# (``_pytest.junitxml``: not public, so a pytest without it gets the properties only). Either way
# the element is added before pytest closes the test case at its teardown report, on the xdist
# controller too (the manifest entry travels with the report).

SECTION = "Captured stdout teardown"  # a section pytest's junitxml writes into <system-out>


def attachment_lines(session: JaxlogSession, entry: dict) -> list[str]:
    """``[[ATTACHMENT|path]]`` per plot of the manifest entry; paths as the session displays them
    (relative to the directory pytest was started in, where CI jobs collect their artifacts)."""
    from ..store.manifest import is_plot

    out = []
    for key, rel in sorted((entry.get("artifacts") or {}).items()):
        if is_plot(key):
            out.append(f"[[ATTACHMENT|{session.display(os.path.normpath(session.base / rel))}]]")
    return out


class JunitAttachments:
    """Registered per config: adds each teardown report's plots to the JUnit XML test case."""

    def __init__(self, session: JaxlogSession):
        self.session = session

    @pytest.hookimpl(tryfirst=True)  # before junitxml's own hook closes the test case
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = getattr(report, "jaxlog", None)
        if report.when != "teardown" or not isinstance(entry, dict):
            return
        xml = _junit_xml(self.session.config)
        if xml is None:
            return
        lines = attachment_lines(self.session, entry)
        if not lines:
            return
        text = "\n".join(lines) + "\n"
        if getattr(xml, "logging", "no") in ("system-out", "out-err", "all"):
            report.sections.append((SECTION, text))
            return
        import xml.etree.ElementTree as ET

        node = ET.Element("system-out")
        node.text = text
        xml.node_reporter(report).append(node)


def _junit_xml(config: pytest.Config) -> Any:
    """pytest's JUnit XML writer of this session, or None (no --junitxml, or a pytest without it)."""
    try:
        from _pytest.junitxml import xml_key
    except ImportError:
        return None
    return config.stash.get(xml_key, None)
