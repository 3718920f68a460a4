"""Plots of failed golden and cost checks, left in the test's artifact directory and listed as
its ``plot`` artifact; the failure's message names the file, or says how to get matplotlib.

A plot that cannot be drawn never hides the failure it illustrates: it is warned about and the
check's own error is raised as it was.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Iterable

from ..errors import JaxlogRuntimeWarning
from .session import JaxlogSession, TestState


def plot_key(state: TestState, label: str) -> str:
    """``plot`` for the test's first plot, ``<label>:plot`` when the test has one already."""
    return "plot" if "plot" not in state.artifacts else f"{label}:plot"


def _note_plot(session: JaxlogSession, state: TestState, label: str, path: Path | None, exc: BaseException) -> None:
    """List ``path`` as a ``plot`` artifact and name it (or how to get one) at the end of ``exc``'s message."""
    from ..check.plot import INSTALL_PLOT

    if path is None:
        line = f"  no plot: {INSTALL_PLOT} draws one" if _no_matplotlib() else None
    else:
        key = plot_key(state, label)
        state.artifacts[key] = path
        state.kinds[key] = "plot"
        line = f"  plot: {session.display(path)}"
    if line and exc.args and isinstance(exc.args[0], str):
        exc.args = (_before_the_fix(exc.args[0], line), *exc.args[1:])


def _before_the_fix(message: str, line: str) -> str:
    """``line`` added to ``message``, above its last line when that names the flag that fixes the
    failure: a failure's message ends with its fix."""
    head, sep, last = message.rpartition("\n")
    if sep and "--jaxlog-" in last:
        return f"{head}\n{line}\n{last}"
    return f"{message}\n{line}"


def _no_matplotlib() -> bool:
    from ..check.plot import have_matplotlib

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


def golden_mismatch(session: JaxlogSession, state: TestState, run: Any, golden: Path, name: str | None,
                    exc: Any) -> None:
    """``<test dir>/golden[--name]-diff.png``: obtained over golden, the first difference marked."""
    from ..check.golden_plot import plot_golden_diff
    from ..golden import as_trajectory

    diff = getattr(exc, "diff", None)
    if diff is None:  # the golden file is missing: nothing to draw
        return
    label = "golden" if name is None else f"golden--{name}"

    def draw() -> Path | None:
        obtained, expected = as_trajectory(run), as_trajectory(golden)
        batched = bool(getattr(getattr(expected, "schema", None), "batched", False))
        return plot_golden_diff(obtained, expected, diff, state.dir / f"{label}-diff.png", batched=batched)

    _note_plot(session, state, label, _draw("golden mismatch", draw), exc)


def cost_regression(session: JaxlogSession, state: TestState, stored: dict, obtained: dict, rtol: float,
                    metrics: Iterable[str] | None, moved: list, title: str, name: str | None, exc: Any) -> None:
    """``<test dir>/cost[--name].png``: obtained / stored per compared metric, the moved ones red."""
    from ..check.cost_plot import CostBar, plot_cost
    from ..profiling.costfile import _order, selected

    label = "cost" if name is None else f"cost--{name}"

    def draw() -> Path:
        names = selected(sorted(set(stored) | set(obtained), key=_order), metrics)  # every compared metric
        bad = {m.metric for m in moved}
        bars = [CostBar(n, stored.get(n), obtained.get(n), n in bad) for n in names]
        return plot_cost(bars, rtol, title, state.dir / f"{label}.png")

    _note_plot(session, state, label, _draw("cost regression", draw), exc)
