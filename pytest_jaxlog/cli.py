"""``python -m pytest_jaxlog`` / ``jaxlog``: inspect, compare, summarise and plot what a run left.

Exit codes: 0 fine, 1 the trajectories differ (``diff``), 2 bad input (a missing file, an unknown
record, a missing optional dependency, a damaged or hostile file) with a one-line ``[jaxlog] ...``
message on stderr and no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np

from .compare.baseline import compared_lines
from .errors import JaxlogError
from .record.values import printable
from .store import manifest


class UsageError(Exception):
    """Bad input reported as one line on stderr, exit code 2."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pytest_jaxlog",
        description="Inspect, compare, summarise and plot pytest-jaxlog trajectories and traces.",
        epilog="Exit codes: 0 ok, 1 trajectories differ (diff), 2 bad input.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    info = sub.add_parser("info", help="records, shapes, dtypes, steps, status, violation, provenance of a trajectory",
                          description="Describe a jaxlog HDF5 trajectory: records (shape, dtype, steps), status, "
                          "violation and provenance.")
    info.add_argument("file", metavar="FILE", help="a jaxlog HDF5 trajectory (.h5)")
    info.add_argument("--json", action="store_true", help="print the description as JSON")

    diff = sub.add_parser("diff", help="compare two trajectories (exit 1 when they differ)",
                          description="Compare trajectory A (obtained) with B (expected) using the same engine as "
                          "jl.assert_trajectory_close: record sets, steps, shapes, dtypes, then values with "
                          "|a-b| <= atol + rtol*|b|. Exit code 0 if they match, 1 if they differ.")
    diff.add_argument("a", metavar="A", help="obtained trajectory (.h5)")
    diff.add_argument("b", metavar="B", help="expected trajectory (.h5), e.g. a golden file")
    diff.add_argument("--rtol", type=float, help="relative tolerance (default: the one golden B stores, else 1e-7)")
    diff.add_argument("--atol", type=float, help="absolute tolerance (default: the one golden B stores, else 0)")
    diff.add_argument("--records", nargs="+", metavar="RECORD", help="compare only these records (names or prefixes; "
                      "default: those golden B stores, else all)")
    diff.add_argument("--steps", metavar="LO:HI[:STRIDE]", help="compare only steps LO <= step < HI (either may be "
                      "empty; default: those golden B stores, else all)")
    diff.add_argument("--nan-differs", action="store_true", default=None,
                      help="treat NaN at the same position as a difference")

    trace = sub.add_parser("trace", help="timings summary of a Perfetto/JAX trace",
                           description="Summarise a trace (jaxlog .pftrace or JAX's perfetto_trace.json.gz / "
                           "trace.json.gz): steps, median and p90 step time, XLA compilations, top slices.")
    trace.add_argument("file", metavar="FILE", help="trace file")
    trace.add_argument("--top", type=_count, default=10, help="how many slice names to list (default 10; 0: none)")

    plot = sub.add_parser("plot", help="plot records against step (or time) into an image",
                          description="Plot records of a trajectory, one subplot per record, against step "
                          "(or time with --time). Needs matplotlib: pip install 'pytest-jaxlog[plot]'.")
    plot.add_argument("file", metavar="FILE", help="a jaxlog HDF5 trajectory (.h5)")
    plot.add_argument("records", nargs="*", metavar="RECORD", help="records to plot (default: every scalar record)")
    plot.add_argument("-o", "--output", help="output image (.png, .svg, .pdf; default: beside FILE, named "
                      "<FILE's stem>-plot.png)")
    plot.add_argument("--time", action="store_true", help="x axis is time (needs dt) instead of step")
    plot.add_argument("--record", action="append", default=[], metavar="RECORD",
                      help="a record to plot (repeatable; adds to the RECORD arguments)")
    plot.add_argument("--mark-step", type=_count, metavar="N",
                      help="mark step N (e.g. a failure's first bad step) with a dashed line on every record")

    export = sub.add_parser("export", help="a trajectory's records as plain arrays (.npz)",
                            description="Write each record's values, steps and times (where the run has a dt) "
                            "to a numpy .npz, keyed values/<record>, steps/<record>, times/<record>: "
                            "np.load(OUT)['values/energy'] is jl.load(FILE)['energy'].")
    export.add_argument("file", metavar="FILE", help="a jaxlog HDF5 trajectory (.h5)")
    export.add_argument("--npz", required=True, metavar="OUT", help="the .npz file to write (replaced if it exists)")
    export.add_argument("--records", nargs="+", metavar="RECORD", help="only these records (names or prefixes; "
                        "default: all)")

    summary = sub.add_parser("summary", help="the tests that failed or kept artifacts, from .jaxlog manifests (for CI)",
                             description="Summarise the manifest.json files the pytest plugin writes (one per "
                             "session, found recursively under each DIR): per test the outcome, violations, "
                             "run timings, artifact files and goldens written, for a CI log or job summary. "
                             "Exits 0 whatever the tests did, so it never fails a CI job by itself; 2 when a "
                             "manifest is malformed (each named in one line).")
    summary.add_argument("roots", nargs="*", default=[".jaxlog"], metavar="DIR",
                         help="artifact directories or manifest files (default: .jaxlog)")
    summary.add_argument("--markdown", action="store_true", help="Markdown, e.g. >> \"$GITHUB_STEP_SUMMARY\"")

    merge = sub.add_parser("merge", help="join the manifests of sharded CI jobs into one (for summary)",
                           description="Join the manifest.json of several sessions (CI jobs that each ran a share "
                           "of a suite) into OUT/manifest.json, its paths rewritten relative to OUT (the shards' "
                           "files stay where they are); each test says which shard ran it. Then: "
                           "python -m pytest_jaxlog summary OUT.")
    merge.add_argument("roots", nargs="+", metavar="DIR", help="the shards' jaxlog directories or manifest files")
    merge.add_argument("-o", "--output", required=True, metavar="OUT",
                       help="directory of the merged manifest.json (not one of the shards')")

    golden = sub.add_parser("golden", help="pending goldens (written under review, e.g. in CI): list, accept, reject",
                            description="Goldens under review (CI, or pytest --jaxlog-golden-review) are never "
                            "rewritten: a golden that differs gets the obtained one beside it as a pending file. "
                            "list: the pending goldens; accept: each becomes its golden entry; reject: each is "
                            "deleted. Exit code 2 when an ID names no pending golden.")
    golden.add_argument("action", choices=("list", "accept", "reject"), help="what to do with pending goldens")
    golden.add_argument("ids", nargs="*", metavar="ID", help="pending goldens (as list shows them: the entry's path "
                        "in the golden directory, .h5 optional; or the pending file's path)")
    golden.add_argument("--all", action="store_true", help="every pending golden")
    golden.add_argument("--dir", metavar="DIR", help="the golden directory (default: the one .jaxlog/manifest.json "
                        "names, else fixtures/golden)")

    bench = sub.add_parser("benchmarks", help="saved benchmark runs (pytest --jaxlog-benchmark-save): list, compare, plot",
                           description="List the benchmark runs saved in DIR (per machine: name, date, tests); "
                           "--compare A B: B against A test by test (time ratio and its interval; runs of one "
                           "machine only); --plot FILE: steps/s and flops per step across the saved runs "
                           "(needs matplotlib).")
    bench.add_argument("root", nargs="?", default=".pytest_cache/d/jaxlog-benchmarks", metavar="DIR",
                       help="the storage directory (default: .pytest_cache/d/jaxlog-benchmarks)")
    bench.add_argument("--compare", nargs=2, metavar=("A", "B"), help="saved runs: NNNN_name, NNNN, name or a file")
    bench.add_argument("--plot", metavar="FILE", help="write a plot of the saved runs (.png, .svg, .pdf)")
    bench.add_argument("--markdown", action="store_true", help="the --compare table as Markdown")
    return p


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return n


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    if not (sys.argv[1:] if argv is None else list(argv)):  # bare `python -m pytest_jaxlog`: the commands
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Printable(out), _Printable(err)  # text from files and manifests included
    try:
        return {"info": cmd_info, "diff": cmd_diff, "trace": cmd_trace, "plot": cmd_plot,
                "summary": cmd_summary, "merge": cmd_merge, "benchmarks": cmd_benchmarks,
                "golden": cmd_golden, "export": cmd_export}[args.command](args)
    except (UsageError, JaxlogError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if not msg.startswith("[jaxlog]"):
            msg = f"[jaxlog] {msg}"
        print(msg, file=sys.stderr)
        return 2
    except BrokenPipeError:  # `... | head`
        return 0
    finally:
        sys.stdout, sys.stderr = out, err


class _Printable:
    """A text stream that writes everything through ``printable``: the command line prints
    through it, so no string it shows, whatever its source, reaches the terminal raw."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(printable(text))

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


# --------------------------------------------------------------------------- helpers


def _existing(path: str, what: str = "file") -> Path:
    p = Path(path)
    if not p.exists():
        raise UsageError(f"[jaxlog] {what} {path} does not exist")
    if p.is_dir():
        raise UsageError(f"[jaxlog] {path} is a directory, not a {what}")
    return p


def _load(path: str):
    p = _existing(path, "trajectory")
    from .store.hdf5.trajectory import load

    try:
        return load(p)
    except JaxlogError:
        raise
    except Exception as exc:  # h5py/OS errors: not a jaxlog file, truncated, ...
        raise UsageError(f"[jaxlog] cannot read trajectory {path}: {type(exc).__name__}: {exc}") from exc


def _steps_summary(steps: np.ndarray) -> str:
    n = len(steps)
    if n == 0:
        return "0 frames"
    s = f"{n} frame{'s' if n != 1 else ''}, steps {int(steps[0])}..{int(steps[-1])}"
    if n > 2:
        d = np.diff(steps)
        if (d == d[0]).all():
            s += f" every {int(d[0])}"
    return s


def _leaf_info(traj, path: str) -> dict:
    spec = None
    schema = getattr(traj, "schema", None)
    if schema is not None:
        try:
            spec = schema[path]
        except (KeyError, TypeError):
            spec = None
    steps = np.asarray(traj.steps(path))
    if spec is not None:
        shape, dtype = tuple(spec.shape), np.dtype(spec.dtype).name
        key_impl = getattr(spec, "key_impl", None)
    else:
        vals = np.asarray(traj[path])
        shape, dtype, key_impl = vals.shape[1:], vals.dtype.name, None
    return {"path": path, "shape": list(shape), "dtype": dtype, "key_impl": key_impl,
            "frames": int(len(steps)), "first_step": int(steps[0]) if len(steps) else None,
            "last_step": int(steps[-1]) if len(steps) else None, "steps": _steps_summary(steps)}


# --------------------------------------------------------------------------- commands


def cmd_info(args) -> int:
    traj = _load(args.file)
    leaves = [_leaf_info(traj, p) for p in traj.records]
    post = traj.postmortem or {}  # read before printing: a damaged or hostile attachment is exit 2
    checkpoints = traj.attachment_steps("checkpoint")  # listed, not read: a file may hold many large states
    post_steps = sorted(post)
    post_leaves = sorted({p for tree in post.values() for p in tree})
    desc = {
        "file": str(args.file),
        "status": getattr(traj, "status", None),
        "stop_reason": traj.stop_reason,
        "steps_done": getattr(traj, "steps_done", None),
        "checkpoints": checkpoints,
        "violation": getattr(traj, "violation", None),
        "records": leaves,
        "postmortem": {"steps": post_steps, "leaves": post_leaves},
        "provenance": getattr(traj, "provenance", None) or {},
    }
    if args.json:
        print(json.dumps(desc, indent=2, default=str))
        return 0
    print(f"{args.file}")
    note = "  (not closed: the run was killed or is still going; frames flushed so far are here)" \
        if desc["status"] == "running" else ""
    why = f"   stopped by: {desc['stop_reason']}" if desc["stop_reason"] not in (None, "steps") else ""
    print(f"  status: {desc['status']}   steps done: {desc['steps_done']}{why}{note}")
    v = desc["violation"]
    if v:
        msg = v.get("message") if isinstance(v, dict) else None
        if msg:
            _print_wrapped(f"  violation: {msg.splitlines()[0]}", "    ")
        else:
            print("  violation: " + ", ".join(f"{k}={v[k]}" for k in ("invariant", "record", "step", "system") if isinstance(v, dict) and v.get(k) is not None))
    else:
        print("  violation: none")
    print(f"  records ({len(leaves)}):")
    w = max([len(x["path"]) for x in leaves] + [6])
    for x in leaves:
        shape = "(" + ", ".join(map(str, x["shape"])) + ("," if len(x["shape"]) == 1 else "") + ")"
        dtype = x["dtype"] + (f" (key {x['key_impl']})" if x["key_impl"] else "")
        print(f"    {x['path']:<{w}}  {dtype:<9} {shape:<14} {x['steps']}")
    if checkpoints:
        resumable = "" if desc["status"] == "complete" else "  (jl.resume continues from the newest)"
        shown = ", ".join(map(str, checkpoints[-8:])) + (f" ... {len(checkpoints)} in all" if len(checkpoints) > 8 else "")
        print(f"  checkpoints: steps {shown}{resumable}")
    if post:
        for line in _listing(f"  postmortem states: steps {', '.join(map(str, post_steps))}", post_leaves, "leaves"):
            print(line)
    prov = desc["provenance"]
    if prov:
        print("  provenance:")
        for k in sorted(prov):
            val = prov[k]
            if isinstance(val, (dict, list)):
                val = json.dumps(val, default=str)
            _print_wrapped(f"    {k}: {val}", "      ")
    return 0


INFO_WIDTH = 100  # columns `jaxlog info` writes within (a name longer than that alone excepted)
_MAX_LISTED_LINES = 4  # a list wrapped onto more lines than this is summarised instead


def _print_wrapped(text: str, indent: str) -> None:
    """``text`` on lines of at most ``INFO_WIDTH`` columns, the later ones indented by ``indent``."""
    print("\n".join(textwrap.wrap(text, INFO_WIDTH, subsequent_indent=indent, break_long_words=False,
                                   break_on_hyphens=False)) or text)


def _listing(head: str, names: list[str], what: str) -> list[str]:
    """``head (a, b, c)`` on one line when it fits; else the names wrapped under ``head``, or, for a
    list longer than a few lines (a big state's leaves), its count with its first and last names:
    one line per leaf would bury the rest of the description (``--json`` has every name)."""
    one = f"{head} ({', '.join(names)})"
    if len(one) <= INFO_WIDTH:
        return [one]
    indent = " " * (len(head) - len(head.lstrip()) + 4)
    lines = textwrap.wrap(", ".join(names), INFO_WIDTH, initial_indent=indent, subsequent_indent=indent,
                          break_long_words=False, break_on_hyphens=False)
    if len(lines) <= _MAX_LISTED_LINES:
        return [f"{head}; {len(names)} {what}:", *lines]
    ends = ", ".join([*names[:3], "...", *names[-2:]])
    return textwrap.wrap(f"{head}; {len(names)} {what}: {ends} (--json lists them all)", INFO_WIDTH,
                         subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)


def _parse_steps(text: str | None):
    if text is None:
        return None
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise UsageError(f"[jaxlog] --steps takes LO:HI or LO:HI:STRIDE, got {text!r}")
    try:
        nums = [int(x) if x.strip() else None for x in parts]
    except ValueError:
        raise UsageError(f"[jaxlog] --steps takes integers LO:HI[:STRIDE], got {text!r}") from None
    return slice(*nums)


def cmd_diff(args) -> int:
    from .compare.golden import diff_trajectories, golden_options

    a, b = _load(args.a), _load(args.b)
    given = {"rtol": args.rtol, "atol": args.atol, "records": args.records, "steps": _parse_steps(args.steps),
             "equal_nan": None if args.nan_differs is None else not args.nan_differs}
    options, note = golden_options(b, {k: v for k, v in given.items() if v is not None})
    d = diff_trajectories(a, b, **options)
    print(d.report())
    for line in note:
        print(f"  note: {line}")
    return 0 if d.ok else 1


# trace ----------------------------------------------------------------------

# One slice per XLA compilation, by trace kind: JAX's TraceMe around the backend compile (any
# backend), else the PJRT client's Compile; in our .pftrace, slices on the driver's "compile" track.
_COMPILE_SLICES = ("backend_compile_and_load", "backend_compile")
_CLIENT_COMPILE = "Client::Compile"


def _durations(steps_obj) -> np.ndarray:
    if steps_obj is None:
        return np.zeros(0)
    if isinstance(steps_obj, dict):
        return np.asarray([float(steps_obj[k]) for k in sorted(steps_obj)], float)
    return np.asarray(steps_obj, float).ravel()


def _fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def _compiles(slices) -> tuple[int, float]:
    for pick in (
        lambda s: s.name in _COMPILE_SLICES,
        lambda s: s.name.endswith(_CLIENT_COMPILE),
        lambda s: getattr(s, "track", "") == "compile",
    ):
        hit = [s for s in slices if pick(s)]
        if hit:
            return len(hit), float(sum(s.dur_s for s in hit))
    return 0, 0.0


class _Rate(NamedTuple):
    steps: int
    seconds: float


def _dispatch_rate(slices) -> _Rate | None:
    """Steps per second from our timeline (a run without a profile window): the steps whose
    frames were pulled ("frames a..b" host slices), over the time from the first dispatch to the
    last pull, less the compilations on the "compile" track."""
    pulled = [(s, re.fullmatch(r"frames (\d+)\.\.(\d+)", s.name)) for s in slices]
    pulled = [(s, m) for s, m in pulled if m]
    dispatched = [s for s in slices if re.fullmatch(r"steps \d+\.\.\d+", s.name)]
    if not pulled or not dispatched:
        return None
    steps = sum(int(m.group(2)) - int(m.group(1)) + 1 for _, m in pulled)
    start, end = min(s.start_s for s in dispatched), max(s.start_s + s.dur_s for s, _ in pulled)
    compiling = sum(s.dur_s for s in slices if s.track == "compile" and start <= s.start_s <= end)
    seconds = end - start - compiling
    return _Rate(steps, seconds) if steps and seconds > 0 else None


def cmd_trace(args) -> int:
    path = Path(args.file)
    if not path.exists():
        raise UsageError(f"[jaxlog] trace {args.file} does not exist")
    if path.is_file() and path.stat().st_size == 0:  # parses as an empty protobuf: not "0 steps"
        raise UsageError(f"[jaxlog] trace {args.file} is empty (0 bytes): the run that wrote it did not finish")
    from .profiling.trace import load_trace

    try:
        trace = load_trace(path)
    except JaxlogError:
        raise
    except Exception as exc:
        raise UsageError(f"[jaxlog] cannot read trace {args.file}: {type(exc).__name__}: {exc}") from exc
    steps = trace.steps()
    durs = _durations(steps)
    span = f" (steps {min(steps)}..{max(steps)})" if isinstance(steps, dict) and steps else ""
    slices = list(trace.slices())
    print(f"{args.file}")
    if len(durs):
        print(f"  steps: {len(durs)}{span}   median {_fmt_s(float(np.median(durs)))}   "
              f"p90 {_fmt_s(float(np.percentile(durs, 90)))}   min {_fmt_s(float(durs.min()))}   "
              f"max {_fmt_s(float(durs.max()))}   total {_fmt_s(float(durs.sum()))}")
    else:
        rate = _dispatch_rate(slices)
        if rate is None:
            print("  steps: 0 (no jaxlog_step annotations in this trace)")
        else:
            print(f"  steps: {rate.steps} in {_fmt_s(rate.seconds)} ({rate.steps / rate.seconds:.4g} steps/s from the run's "
                  f"timeline, compilation left out; no profile window, so no per-step times)")
    n_compiles, compile_s = _compiles(slices)
    if n_compiles or getattr(trace, "format", "") != "pftrace" or "compile" in getattr(trace, "tracks", ()):
        print(f"  compilations: {n_compiles}" + (f" ({_fmt_s(compile_s)})" if n_compiles else ""))
    else:
        print("  compilations: not recorded in this trace (run.timings.compiles has them; a profile window's "
              "JAX trace shows XLA compiles)")
    totals: dict[str, list[float]] = {}
    for s in slices:
        if s.name.startswith("$"):  # Python-tracer frames: nested, numerous, not what a step costs
            continue
        t = totals.setdefault(s.name, [0.0, 0])
        t[0] += s.dur_s
        t[1] += 1
    if totals and args.top > 0:
        top = sorted(totals.items(), key=lambda kv: -kv[1][0])[: args.top]
        print(f"  top slices by total time ({len(slices)} slices):")
        w = min(max(len(name) for name, _ in top), 60)
        for name, (total, count) in top:
            print(f"    {name[:60]:<{w}}  {int(count):>7}x  {_fmt_s(total):>11}  (mean {_fmt_s(total / count)})")
    return 0


# plot -----------------------------------------------------------------------


def cmd_export(args) -> int:
    traj = _load(args.file)
    from .store.hdf5.trajectory import export_npz

    arrays = export_npz(traj, args.npz, args.records)
    n = len([k for k in arrays if k.startswith("values/")])
    print(f"wrote {args.npz} ({n} record{'s' if n != 1 else ''})")
    return 0


def cmd_plot(args) -> int:
    traj = _load(args.file)
    from .compare.golden import select_records

    if args.records or args.record:
        paths = select_records([*args.records, *args.record], traj)
    else:
        paths = tuple(p for p in traj.records if int(np.prod(_leaf_info(traj, p)["shape"], dtype=np.int64)) == 1)
        if not paths:
            raise UsageError(f"[jaxlog] {args.file} has no scalar records; name the records to plot")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("[jaxlog] plot needs matplotlib, which is not installed: pip install 'pytest-jaxlog[plot]'") from None
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from .check.plots import RecordsPlot, draw_records, title_of

    out = Path(args.output) if args.output else Path(args.file).with_name(f"{Path(args.file).stem}-plot.png")
    if out.is_dir():
        raise UsageError(f"[jaxlog] output {args.output} is a directory; name the image file, e.g. {out / 'plot.png'}")
    if not out.suffix:  # matplotlib would write <name>.png and we would report <name>
        out = out.with_name(out.name + ".png")
    supported = FigureCanvasAgg.get_supported_filetypes()
    if out.suffix[1:].lower() not in supported:
        raise UsageError(f"[jaxlog] cannot write {out.suffix} images; use one of: "
                         + ", ".join(f".{k}" for k in sorted(supported)))
    if out.parent and not out.parent.exists():
        raise UsageError(f"[jaxlog] output directory {out.parent} does not exist")

    fig = draw_records(RecordsPlot(traj, paths, time=args.time, mark_step=args.mark_step,
                                   title=title_of(args.file, getattr(traj, "status", None))))
    fig.savefig(out, dpi=100)
    print(f"wrote {out} ({len(paths)} record{'s' if len(paths) != 1 else ''})")
    return 0


# summary --------------------------------------------------------------------

_PERFETTO_UI = "https://ui.perfetto.dev"


@dataclass
class _Found:
    """The manifests under the roots: (path, document) of each one as the plugin writes it, and
    the paths of those that are not (each named on stderr, in one line)."""

    manifests: list[tuple[Path, dict]]
    malformed: list[Path]


def _manifests(roots: Sequence[str]) -> _Found:
    from .store.manifest import check

    found = _Found([], [])
    for f in manifest.find(roots):
        try:
            doc = manifest.read(f)
            check(doc)
        except JaxlogError as exc:
            cause = str(exc).removeprefix("[jaxlog] ").splitlines()[0][:1000] if str(exc) else "unreadable"
            print(f"[jaxlog] skipping malformed manifest {f}: {cause}", file=sys.stderr)
            found.malformed.append(f)
        else:
            found.manifests.append((f, doc))
    return found


def _summarize_one(path: Path, doc: dict, markdown: bool) -> tuple[list[str], int]:
    """One manifest's lines and its count of trace artifacts; a manifest whose fields are not
    what the plugin writes is one ``JaxlogError`` naming it (the summary skips it)."""
    try:
        return _manifest_lines(path, doc, markdown)
    except (TypeError, AttributeError, KeyError, ValueError, IndexError, RecursionError) as exc:
        raise JaxlogError(f"skipping malformed manifest {path}: {type(exc).__name__}: {exc}") from None


def _in_manifest(base: Path, rel: str) -> str:
    """A manifest path (relative to the manifest's directory) as seen from the working directory."""
    return os.path.normpath(base / rel)


def _run_line(r: dict) -> str:
    rate = r.get("steps_per_s")
    rate = f", {rate:.4g} steps/s" if isinstance(rate, (int, float)) else ""
    wall = r.get("wall_s")
    wall = f" in {wall:.3g} s" if isinstance(wall, (int, float)) else ""
    n = r.get("compiles")
    steps = r.get("steps")
    return (f"run {r.get('name')}: {steps} step{'' if steps == 1 else 's'}{wall}{rate}, "
            f"{n} compile{'' if n == 1 else 's'}")


@dataclass(frozen=True)
class _Style:
    """How a summary line is written: plain text for a CI log, or Markdown for a job summary."""

    markdown: bool

    @property
    def head(self) -> str:
        return "### " if self.markdown else ""

    @property
    def item(self) -> str:
        return "- " if self.markdown else "  "

    @property
    def sub(self) -> str:
        return "  - " if self.markdown else "      "

    def code(self, text: object) -> str:
        return f"`{text}`" if self.markdown else str(text)


def _scope(doc: dict) -> str:
    """Whose tests a manifest's counts are: its session's, or the shards' a merge joined."""
    shards = doc.get("shards")
    return f"the {len(shards)} merged sessions" if isinstance(shards, list) and len(shards) > 1 else "this session"


def _entry_lines(t: dict, base: Path, style: _Style, badge: str = "") -> list[str]:
    """A test's line (its outcome, id and ``badge``) and what a person acts on: error, violations,
    runs, files."""
    lines = [f"{style.item}{badge}{str(t.get('outcome', '?')).upper()} {style.code(t['nodeid'])}"]
    if t.get("error"):
        lines.append(f"{style.sub}error: {t['error']}")
    for v in t.get("violations") or []:
        msg = v.get("message") if isinstance(v, dict) else str(v)
        if msg:
            lines.append(f"{style.sub}violation: {msg.splitlines()[0]}")
    for r in t.get("runs") or []:
        if isinstance(r, dict):
            lines.append(f"{style.sub}{_run_line(r)}")
    for kind, rel in sorted((t.get("artifacts") or {}).items()):
        where = _in_manifest(base, rel)
        shown_path = _link(where) if style.markdown and manifest.is_plot(kind) else style.code(where)
        lines.append(f"{style.sub}{kind}: {shown_path}")
    return lines


def _is_trace(kind: str, rel: object) -> bool:
    return "trace" in kind or "timeline" in kind or str(rel).endswith((".pftrace", ".json.gz"))


def _to_show(tests: list[dict]) -> list[dict]:
    """The tests a summary details: those not passed, then those that kept artifacts, once each,
    as their worst entry (a test merged from several shards)."""
    return sorted((t for t in manifest.worst_per_test(tests) if manifest.not_passed(t) or t.get("kept")),
                  key=lambda t: (t.get("outcome") == "passed", t["nodeid"]))


def _exit_status(doc: dict) -> str:
    status = doc.get("exitstatus")
    return "unknown (not recorded)" if status is None else str(status)


def _manifest_lines(path: Path, doc: dict, markdown: bool) -> tuple[list[str], int]:
    style = _Style(markdown)
    lines: list[str] = []
    base = path.parent
    tests = manifest.current_tests(doc)  # earlier sessions' entries (stale): shown apart, never counted here
    per_test = manifest.worst_per_test(tests)  # a test in several shards counts once, as its worst outcome
    bad = [t for t in per_test if manifest.not_passed(t)]
    kept = {t["nodeid"] for t in tests if t.get("kept")}
    keep = manifest.settings(doc).get("keep")
    lines.append(f"{style.head}jaxlog: {base}")
    if tests:
        lines.append(f"{len(per_test)} jaxlog tests, {len(bad)} not passed, artifacts kept for {len(kept)} "
                     f"(keep={keep}); exit status {_exit_status(doc)}")
    else:
        lines.append(f"no jaxlog test ran in {_scope(doc)} (keep={keep}); exit status {_exit_status(doc)}")
    if markdown:
        lines.append("")
    shown = _to_show(tests)
    for t in shown:
        lines += _entry_lines(t, base, style)
    goldens = [(g.get("status"), _in_manifest(base, g.get("path", ""))) for t in tests
               for g in t.get("goldens") or [] if g.get("status") in ("regenerated", "created")]
    for status, p in sorted(goldens):
        lines.append(f"{style.item}{status} golden: {style.code(p)}")
    lines += _pending_lines(tests, base, style)
    lines += compared_lines(tests, markdown)
    carried = manifest.stale_tests(doc)
    lines += _stale_lines(carried, base, style, scope=_scope(doc))
    stale = manifest.stale(doc)
    if stale:
        lines.append(f"{style.item}{len(stale)} artifact directories from an earlier session (stale), e.g. "
                     f"{style.code(_in_manifest(base, stale[0].get('dir', '')))}")
    if markdown:
        lines.append("")
    traces = sum(1 for t in shown + _to_show(carried) for kind, rel in (t.get("artifacts") or {}).items()
                 if _is_trace(kind, rel))
    return lines, traces


def _pending_lines(tests: list[dict], base: Path, style: _Style) -> list[str]:
    """The goldens left pending under review, each with the command that applies it."""
    pending = sorted((str(g.get("id")), _in_manifest(base, g.get("pending", ""))) for t in tests
                     for g in t.get("goldens") or [] if isinstance(g, dict) and g.get("status") == "pending")
    lines = [f"{style.item}pending golden {style.code(ident)}: {style.code(p)}; apply it with "
             f"{style.code(f'python -m pytest_jaxlog golden accept {ident}')}" for ident, p in pending]
    if pending:
        lines.append(f"{style.item}or reject it ({style.code('python -m pytest_jaxlog golden reject ID')}); "
                     f"{style.code('--all')} for every pending golden")
    return lines


def _stale_lines(carried: list[dict], base: Path, style: _Style, scope: str) -> list[str]:
    """Earlier sessions' entries, apart from the counts above: per session how many and how many
    not passed, then each one not passed or with kept files, badged with its session."""
    if not carried:
        return []
    groups = manifest.by_session(carried)
    lines = [f"{style.item}stale, not counted above: {len(carried)} tests not run in {scope} keep their "
             f"earlier entries"]
    for sid, group in groups.items():
        lines.append(f"{style.sub}from session {style.code(sid)}: {len(group)} tests, "
                     f"{sum(map(manifest.not_passed, group))} not passed")
    for sid, group in groups.items():
        for t in _to_show(group):
            lines += _entry_lines(t, base, style, badge=f"STALE (session {style.code(sid)}) ")
    return lines


def _link(path: str) -> str:
    """A Markdown link to ``path`` (a plot), its text and target escaped: a job summary shows it as a link."""
    from urllib.parse import quote

    target = quote(path.replace("\\", "/"), safe="/._-~")
    text = re.sub(r"([\\`*_\[\]<>])", r"\\\1", path)
    return f"[{text}]({target})"


def summarize(manifests: list[tuple[Path, dict]], markdown: bool, malformed: list[Path] | None = None) -> str:
    """The summary of ``manifests``; one that cannot be summarised is named on stderr, skipped
    and added to ``malformed``."""
    if not manifests:
        return f"[jaxlog] no {manifest.NAME} found (no jaxlog test ran, or the directory is not the jaxlog dir)\n"
    code = (lambda s: f"`{s}`") if markdown else (lambda s: str(s))
    lines: list[str] = []
    traces = 0
    for path, doc in manifests:
        try:
            more, n = _summarize_one(path, doc, markdown)
        except JaxlogError as exc:
            msg = str(exc).splitlines()[0][:1000]
            print(msg if msg.startswith("[jaxlog]") else f"[jaxlog] {msg}", file=sys.stderr)
            if malformed is not None:
                malformed.append(path)
            continue
        lines += more
        traces += n
    lines.append(f"Inspect a trajectory: {code('python -m pytest_jaxlog info FILE.h5')} "
                 f"(also diff, plot; {code('python -m pytest_jaxlog trace TRACE')} for timings).")
    if traces:
        lines.append(f"Open a trace: download this job's artifact and drop the .pftrace / perfetto_trace.json.gz "
                     f"file on {_PERFETTO_UI} (Open trace file); it is processed in your browser.")
    return "\n".join(lines) + "\n"


def cmd_summary(args) -> int:
    """0 whatever the tests did; 2 when a manifest is malformed (what it says cannot be trusted)."""
    found = _manifests(args.roots)
    if found.malformed and not found.manifests:
        return 2  # each was named on stderr: no "no manifest found" beside it
    malformed = list(found.malformed)
    sys.stdout.write(summarize(found.manifests, args.markdown, malformed))
    return 2 if malformed else 0


def cmd_merge(args) -> int:
    from .store.manifest import merge

    path = merge(args.roots, args.output)
    doc = json.loads(path.read_text())
    print(f"[jaxlog] merged {len(doc['shards'])} manifests ({len(doc['tests'])} tests) into {path}")
    return 0


def cmd_benchmarks(args) -> int:
    from .compare import baseline as baselinereport

    root = Path(args.root)
    if not root.is_dir():
        raise UsageError(f"[jaxlog] benchmark storage directory {args.root} does not exist (pytest "
                         "--jaxlog-benchmark-save=NAME writes there; --jaxlog-benchmark-storage=DIR elsewhere)")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("[jaxlog] --plot needs matplotlib, which is not installed: "
                             "pip install 'pytest-jaxlog[plot]'") from None
        print(baselinereport.plot(root, Path(args.plot)))
    lines = (baselinereport.comparison(root, args.compare[0], args.compare[1], args.markdown) if args.compare
             else baselinereport.listing(root))
    print("\n".join(lines))
    return 0


def _golden_dir(given: str | None) -> Path:
    """``--dir``, else the golden directory the last session's manifest names, else the default."""
    if given:
        return Path(given)
    found = Path(".jaxlog") / manifest.NAME
    if found.is_file():
        try:
            rel = manifest.read(found).get("golden_dir")
        except JaxlogError:
            rel = None
        if isinstance(rel, str) and rel:
            return Path(os.path.normpath(found.parent / rel))
    return Path("fixtures/golden")


def cmd_golden(args) -> int:
    from .compare import golden_files as golden_pending

    directory = _golden_dir(args.dir)
    if not directory.is_dir():
        raise UsageError(f"[jaxlog] golden directory {directory} does not exist (--dir DIR names another)")
    found = golden_pending.find(directory)
    if args.action == "list":
        for p in found:
            print(f"{p.id}  ({p.test or 'test unknown'})")
            for line in p.summary.splitlines():
                print(f"    {line}")
        print(f"[jaxlog] {len(found)} pending golden{'' if len(found) == 1 else 's'} in {directory}")
        return 0
    chosen = golden_pending.select(found, args.ids, args.all)
    for p in chosen:
        p.accept() if args.action == "accept" else p.reject()
        verb = "accepted" if args.action == "accept" else "rejected"
        print(f"[jaxlog] {verb} {p.id}" + (f": {os.path.normpath(p.target)}" if args.action == "accept" else ""))
    if not chosen:
        print(f"[jaxlog] no pending goldens in {directory}")
    return 0
