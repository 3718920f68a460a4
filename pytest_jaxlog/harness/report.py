"""The session's HTML report (``.jaxlog/report.html``): one self-contained file a person opens
from a CI artifact, offline: every jaxlog test of the session with its outcome, runs, steps/s,
compiles and goldens; the failures first, each with its plots, message and files; small plots of
each kept test's scalar records. The header counts this session's tests only; the entries earlier
sessions left (marked stale in the manifest) are listed apart, each with its session, so a session
that ran no jaxlog test never reads as one whose tests all passed.

Built from the manifest (the merged one under xdist), the failure messages pytest reported and
the kept trajectory files; plots are embedded as ``data:`` images, sparklines as inline SVG, the
style inline, and there is no script at all. Every string that comes from a test, a record or a
file is escaped, and a Content-Security-Policy allows nothing but inline styles and ``data:``
images, so a hostile test id or record name can neither inject markup nor make the page load
anything. The page stays small for a big session: ``MAX_EMBEDDED_PLOTS`` plots of at most
``MAX_PLOT_BYTES`` each are embedded (the rest are linked), sparklines are drawn for at most
``MAX_SPARK_TESTS`` tests, ``MAX_SPARKS_PER_TEST`` records each, ``sparkline.MAX_POINTS`` points each,
and trajectories are read for them for ``MAX_SPARK_SECONDS`` at most.
"""

from __future__ import annotations

import base64
import os
import time
from html import escape
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import quote

from .sparkline import MAX_POINTS, downsample, sparkline_svg

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

    from ..store.trajectory import load

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
