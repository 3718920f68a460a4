"""One test's reports from the reports of its N processes.

The test passes when every process passed; otherwise each failing phase's report holds every
failing process's traceback under its label (``process 1 of 2``), says which processes were
stopped and how, and carries what each process printed. The manifest entry is process 0's with
the others' files, violations and notes added and a ``processes`` list (each one's outcome, how
it ended, its runs); whether the test's directory is kept is decided here, once, from the
combined outcome (the processes keep everything: one passing process must not remove the
evidence of another's failure).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from .fate import Ending, Member
from .session import _outcome

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
