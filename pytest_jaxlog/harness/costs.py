"""Cost goldens from the test's side: ``jaxlog.check_cost`` compares a run's (or a function's)
``jl.Cost`` with the entry for this platform in ``<jaxlog_golden_dir>/<test id>[--name].cost.json``,
beside the trajectory goldens and named the same way; ``--jaxlog-regen`` (re)writes this
platform's entry, ``--jaxlog-create-goldens`` writes it when missing."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Iterable

from ..errors import CostRegression, JaxlogAssertionError, JaxlogError, JaxlogRuntimeWarning
from .goldens import _NAME, CREATE_FLAG, REGEN_FLAG, rewrite
from .session import GoldenNote, JaxlogSession, TestState

SUFFIX = ".cost.json"


def cost_path(session: JaxlogSession, nodeid: str, name: str | None) -> Path:
    from ..names import golden_name

    return session.golden_dir / golden_name(nodeid, SUFFIX, name=name)


def check_cost(session: JaxlogSession, state: TestState, checked: set[Path], run: Any, rtol: float,
               metrics: Iterable[str] | None, name: str | None) -> str:
    """The fixture's ``check_cost``; returns ok|regenerated|created."""
    from ..profiling import costfile

    __tracebackhide__ = True
    if name is not None and (not _NAME.fullmatch(str(name)) or str(name).startswith(".")):
        raise JaxlogError(f"check_cost(name={name!r}): use letters, digits, '_', '-', '.' (it names a file)")
    cost = _cost_of(run)
    path = cost_path(session, state.nodeid, name)
    if path in checked:
        raise JaxlogError(f"check_cost(name={name!r}): this test already checked cost golden {session.display(path)}; "
                          "give each checked cost its own name=")
    checked.add(path)
    key = cost.platform_key()
    state.costs.append({"name": name, "platform": key, "metrics": cost.metrics()})
    entries = costfile.read(path)
    shown = session.display(path)
    write = rewrite(session, key in entries)
    if write is not None:
        status = write.status
        costfile.write(path, cost, state.nodeid)
        warnings.warn(JaxlogRuntimeWarning(f"[jaxlog] {status} cost golden {shown} entry {key!r} ({write.flag})"),
                      stacklevel=3)
    elif key not in entries:
        what = f"has no entry for {key!r} (it has {sorted(entries)})" if entries else "does not exist"
        raise JaxlogAssertionError(f"[jaxlog] cost golden {shown} {what}: XLA's figures depend on the backend and "
                                   f"jax version\nto create it, run pytest with {CREATE_FLAG} (missing goldens "
                                   f"only) or {REGEN_FLAG}")
    else:
        moved = costfile.compare(entries[key].get("metrics", {}), cost.metrics(), rtol, metrics,
                                 where=f"cost golden {shown} entry {key!r}")
        if moved:
            from . import failure_plots

            exc = CostRegression(_message(shown, key, moved, rtol), tuple(moved))
            failure_plots.cost_regression(session, state, entries[key].get("metrics", {}), cost.metrics(), rtol,
                                          metrics, moved, f"{state.nodeid}: cost against {shown} [{key}]", name, exc)
            raise exc
        status = "ok"
    state.goldens.append(GoldenNote(path, status))
    return status


def _cost_of(run: Any) -> Any:
    from ..profiling.cost import Cost

    cost = run if isinstance(run, Cost) else getattr(run, "cost", None)
    if not isinstance(cost, Cost):
        raise JaxlogError(f"check_cost: expected a jl.run result or a jl.Cost, got {type(run).__name__}"
                          + (" (a run that dispatched no step has no cost)" if hasattr(run, "steps_done") else ""))
    return cost


def _message(shown: str, key: str, moved: list, rtol: float) -> str:
    lines = [f"[jaxlog] compiled cost moved from cost golden {shown} [{key}] (rtol={rtol:g}):"]
    lines += [f"  {m.describe()}" for m in moved]
    if all(m.improved for m in moved):
        lines.append("every figure went down: if the kernel was made cheaper on purpose, store the new figures "
                     f"so a regression back is caught: run pytest with {REGEN_FLAG}")
    else:
        lines.append(f"if the change is intended, run pytest with {REGEN_FLAG}")
    return "\n".join(lines)
