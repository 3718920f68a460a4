#!/usr/bin/env python3
"""Summarise .jaxlog manifests for a CI log or job summary (stdlib only; never fails the job).

    python ci/jaxlog_summary.py .jaxlog [--markdown] >> "$GITHUB_STEP_SUMMARY"

Reads every ``manifest.json`` under the given directories (the plugin writes one per pytest
session) and lists the tests that failed or kept artifacts: outcome, violations, the trajectory
and trace files (paths inside the uploaded artifact), regenerated goldens, and how to open them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PERFETTO_UI = "https://ui.perfetto.dev"


def load_manifests(roots: list[str]) -> list[tuple[Path, dict]]:
    out = []
    for root in roots:
        r = Path(root)
        files = [r] if r.is_file() else sorted(r.rglob("manifest.json")) if r.is_dir() else []
        for f in files:
            try:
                out.append((f, json.loads(f.read_text())))
            except (OSError, ValueError) as exc:
                print(f"[jaxlog] skipping unreadable manifest {f}: {exc}", file=sys.stderr)
    return out


def summarize(manifests: list[tuple[Path, dict]], markdown: bool) -> str:
    lines: list[str] = []
    h = "### " if markdown else ""
    code = (lambda s: f"`{s}`") if markdown else (lambda s: s)
    item = "- " if markdown else "  "
    sub = "  - " if markdown else "      "
    if not manifests:
        return "[jaxlog] no manifest.json found (no jaxlog test ran, or nothing was kept)\n"
    traces = 0
    for path, doc in manifests:
        base = path.parent
        tests = doc.get("tests", [])
        bad = [t for t in tests if t.get("outcome") not in ("passed", "skipped", "xfailed")]
        kept = [t for t in tests if t.get("kept")]
        lines.append(f"{h}jaxlog: {base}")
        lines.append(f"{len(tests)} jaxlog tests, {len(bad)} not passed, artifacts kept for {len(kept)} "
                     f"(keep={doc.get('settings', {}).get('keep')}); exit status {doc.get('exitstatus')}")
        if markdown:
            lines.append("")
        shown = sorted({t["nodeid"]: t for t in bad + kept}.values(),
                       key=lambda t: (t.get("outcome") == "passed", t["nodeid"]))
        for t in shown:
            lines.append(f"{item}{str(t.get('outcome', '?')).upper()} {code(t['nodeid'])}")
            for v in t.get("violations") or []:
                msg = v.get("message") if isinstance(v, dict) else str(v)
                if msg:
                    lines.append(f"{sub}violation: {msg.splitlines()[0]}")
            for kind, rel in sorted((t.get("artifacts") or {}).items()):
                if "trace" in kind or str(rel).endswith((".pftrace", ".json.gz")):
                    traces += 1
                lines.append(f"{sub}{kind}: {code(base / rel)}")
            for g in t.get("goldens") or []:
                if g.get("status") == "regenerated":
                    lines.append(f"{sub}regenerated golden: {code(g.get('path'))}")
        if markdown:
            lines.append("")
    lines.append(f"Inspect a trajectory: {code('python -m pytest_jaxlog info FILE.h5')} "
                 f"(also diff, plot; {code('python -m pytest_jaxlog trace TRACE')} for timings).")
    if traces:
        lines.append(f"Open a trace: download this job's artifact and drop the .pftrace / perfetto_trace.json.gz "
                     f"file on {PERFETTO_UI} (Open trace file); it is processed in your browser.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Summarise .jaxlog manifest.json files for CI logs.")
    p.add_argument("roots", nargs="*", default=[".jaxlog"], help="directories (or manifest files); default .jaxlog")
    p.add_argument("--markdown", action="store_true", help="Markdown for $GITHUB_STEP_SUMMARY")
    args = p.parse_args(argv)
    sys.stdout.write(summarize(load_manifests(args.roots), args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
