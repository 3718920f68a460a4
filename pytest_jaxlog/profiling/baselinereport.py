"""``jaxlog benchmarks DIR``: the saved benchmark runs of a storage directory, per machine; two of
them compared test by test (``--compare A B``, only runs of one machine); and a plot of steps/s
(and of flops per step, where the tests checked a cost) across the saved runs, one column per
machine, since timings of two machines are never on one axis."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..errors import JaxlogError
from .baseline import Row, compare, moved_table, steps_per_s
from .baselinefile import DEFAULT_NAME, SavedRun, all_runs, read


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t)) if t else "?"


def listing(root: Path) -> list[str]:
    """One block per machine: its description, then each saved run (number_name, date, tests, benchmarks)."""
    runs = all_runs(root)
    if not runs:
        return [f"[jaxlog] no saved benchmark runs in {root} (save some with pytest --jaxlog-benchmark-save=NAME)"]
    lines: list[str] = []
    for key in sorted({r.path.parent.name for r in runs}):
        mine = [r for r in runs if r.path.parent.name == key]
        machine = mine[-1].machine
        lines.append(f"{key}: {machine.describe() if machine else 'unknown machine'}")
        width = max(len(r.label) for r in mine)
        lines += [f"  {r.label.ljust(width)}  {_when(r.saved)}  {len(r.tests)} tests, {r.count} benchmarks"
                  for r in mine]
    return lines


def pick(root: Path, which: str) -> SavedRun:
    """A saved run named by its file, its ``NNNN_name``/``NNNN``/name (the newest of that name) or
    ``<machine key>/<that>``; one that several machines have must be told apart."""
    path = Path(which)
    if path.is_file():
        return read(path)
    key, _, label = which.rpartition("/")
    hits = [r for r in all_runs(root) if (not key or r.path.parent.name == key)
            and (r.label == label or r.name == label or (label.isdigit() and r.number == int(label)))]
    if not hits:
        raise JaxlogError(f"[jaxlog] no saved benchmark run {which!r} in {root}")
    machines = sorted({r.path.parent.name for r in hits})
    if len(machines) > 1:
        raise JaxlogError(f"[jaxlog] saved run {which!r} exists for several machines ({', '.join(machines)}): "
                          f"name it as MACHINE/{label}")
    return max(hits, key=lambda r: r.number)


def comparison(root: Path, a: str, b: str, markdown: bool = False) -> list[str]:
    """Run ``b`` against run ``a``, benchmark by benchmark: the time ratio b/a and its interval."""
    old, new = pick(root, a), pick(root, b)
    if old.machine != new.machine:
        raise JaxlogError(f"[jaxlog] {old.label} and {new.label} were saved on different machines "
                          f"({old.path.parent.name}, {new.path.parent.name}): timings are never compared across "
                          "machines")
    found, only = [], []
    for nodeid, test in sorted(new.tests.items()):
        for bench in test.get("benchmarks", ()):
            label = nodeid if bench.get("name") == DEFAULT_NAME else f"{nodeid} [{bench.get('name')}]"
            saved = old.benchmark(nodeid, bench.get("name"))
            if saved is None:
                only.append(f"  only in {new.label}: {label} ({steps_per_s(bench):,.1f} steps/s)")
                continue
            found.append(Row(label, compare(bench, saved, old.label, None).to_json()))
    gone = [f"  only in {old.label}: {n}" for n in sorted(set(old.tests) - set(new.tests))]
    head = f"{new.label} against {old.label} ({new.path.parent.name}): time per step of {new.label} over {old.label}"
    return [head, *(f"  {line}" for line in moved_table(found, markdown, everything=True, columns=(old.label, new.label))), *only, *gone]


def plot(root: Path, out: Path) -> str:
    """Steps/s per benchmark across the saved runs (and flops per step of the checked costs) into ``out``."""
    runs = all_runs(root)
    if not runs:
        raise JaxlogError(f"[jaxlog] no saved benchmark runs in {root} to plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({r.path.parent.name for r in runs})
    flops = any(_flops(r) for r in runs)
    fig, axes = plt.subplots(2 if flops else 1, len(keys), figsize=(7 * len(keys), 6 if flops else 3.5),
                             squeeze=False)
    for col, key in enumerate(keys):
        mine = [r for r in runs if r.path.parent.name == key]
        _lines(axes[0, col], mine, _rates, "steps/s")
        axes[0, col].set_title(key, fontsize="small")
        if flops:
            _lines(axes[1, col], mine, _flops, "flops per step")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return f"wrote {out} ({len(runs)} saved runs, {len(keys)} machine{'s' if len(keys) != 1 else ''})"


def _rates(run: SavedRun) -> dict[str, float]:
    out = {}
    for nodeid, test in run.tests.items():
        for b in test.get("benchmarks", ()):
            try:
                out[nodeid if b.get("name") == DEFAULT_NAME else f"{nodeid} [{b.get('name')}]"] = steps_per_s(b)
            except (KeyError, TypeError, ValueError, JaxlogError):
                continue
    return out


def _flops(run: SavedRun) -> dict[str, float]:
    return {nodeid if c.get("name") is None else f"{nodeid} [{c['name']}]": float(c["metrics"]["flops"])
            for nodeid, test in run.tests.items() for c in test.get("costs", ())
            if isinstance(c, dict) and isinstance((c.get("metrics") or {}).get("flops"), (int, float))}


def _lines(ax: Any, runs: list[SavedRun], values: Any, ylabel: str) -> None:
    per_run = [values(r) for r in runs]
    for label in sorted({k for v in per_run for k in v}):
        xs = [i for i, v in enumerate(per_run) if label in v]
        ax.plot(xs, [per_run[i][label] for i in xs], marker="o", lw=1, label=label)
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels([r.label for r in runs], rotation=30, ha="right", fontsize="x-small")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small")
