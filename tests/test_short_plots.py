"""Plots of short records read at a glance: each of a few frames is a visible point (a one-frame
record is a dot, not an empty panel) and the step axis has ticks at whole steps only (a failure at
step 1 is two frames: ticks 0 and 1, never 0.2, 0.4, ...). Checked on real runs' figures (their
lines, markers and tick values) and on the PNG ``jaxlog plot`` writes."""

from __future__ import annotations

import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

import pytest_jaxlog as jl
from pytest_jaxlog.compare.golden import draw_golden_diff
from pytest_jaxlog.check.plots import MARKERS_UP_TO, draw_violation
from pytest_jaxlog.check.plots import RecordsPlot, draw_records
from pytest_jaxlog.compare.golden import diff_trajectories


def _ticks_in_view(ax) -> list[float]:
    lo, hi = sorted(ax.get_xlim())
    return [float(t) for t in ax.get_xticks() if lo - 1e-9 <= t <= hi + 1e-9]


def _assert_whole_step_ticks(ax, must: tuple[int, ...]) -> None:
    ticks = _ticks_in_view(ax)
    assert ticks and all(t == int(t) for t in ticks), ticks
    assert set(must) <= {int(t) for t in ticks}, ticks
    labels = [t.get_text().replace("\u2212", "-") for t in ax.get_xticklabels() if t.get_text()]
    assert labels and all(s.lstrip("-").isdigit() for s in labels), labels


def test_a_violation_at_step_1_draws_two_points_on_whole_step_ticks():
    with pytest.raises(jl.InvariantViolation) as caught:  # raised: the run's frames end at the violating step
        jl.run(lambda s: s * 3.0, jnp.ones(()), 20, record={"e": lambda s: s},
               invariants=[jl.conserved("e", rtol=0.1)], progress=False)
    r = caught.value.jaxlog_run
    assert r.violation.step == 1 and r.trajectory.steps("e").tolist() == [0, 1]
    fig = draw_violation(r.trajectory, r.violation)
    (ax,) = fig.axes
    fig.canvas.draw()
    (series,) = [ln for ln in ax.get_lines() if ln.get_label() == "e"]
    assert list(series.get_xdata()) == [0, 1] and series.get_marker() == "o" and series.get_markersize() > 0
    _assert_whole_step_ticks(ax, (0, 1))


def test_a_one_frame_record_is_a_visible_point_on_a_whole_step():
    r = jl.run(lambda s: s + 1.0, jnp.zeros(()), 0, record={"e": lambda s: s}, progress=False)
    assert r.trajectory.steps("e").tolist() == [0]
    fig = draw_records(RecordsPlot(r.trajectory, ["e"]))
    (ax,) = fig.axes
    fig.canvas.draw()
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [0] and line.get_marker() == "o" and line.get_markersize() >= 5
    lo, hi = ax.get_xlim()
    assert lo <= -0.5 and hi >= 0.5  # the point sits inside the panel, half a step either side
    _assert_whole_step_ticks(ax, (0,))


def test_a_long_record_is_a_plain_line_with_whole_step_ticks():
    n = MARKERS_UP_TO + 40
    r = jl.run(lambda s: s * 0.99, jnp.ones(()), n, record={"e": lambda s: s}, progress=False)
    fig = draw_records(RecordsPlot(r.trajectory, ["e"], mark_step=7))
    (ax,) = fig.axes
    fig.canvas.draw()
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() != "step 7"]
    assert len(line.get_xdata()) == n + 1 and line.get_marker() in ("None", None, "")
    _assert_whole_step_ticks(ax, ())


def test_a_golden_mismatch_of_a_short_run_marks_its_frames_on_whole_steps():
    golden = jl.run(lambda s: s * 0.5, jnp.ones(2), 2, record={"x": lambda s: s}, progress=False)
    obtained = jl.run(lambda s: s * 0.6, jnp.ones(2), 2, record={"x": lambda s: s}, progress=False)
    fig = draw_golden_diff(obtained.trajectory, golden.trajectory, diff_trajectories(obtained, golden))
    fig.canvas.draw()
    for ax in fig.axes:
        drawn = [ln for ln in ax.get_lines() if ln.get_label() in ("obtained", "golden", "|obtained - golden|")]
        assert drawn and all(ln.get_marker() == "o" for ln in drawn)
        _assert_whole_step_ticks(ax, (0, 1, 2))


def test_jaxlog_plot_of_a_one_frame_record_draws_a_marker_in_the_png(tmp_path):
    path = tmp_path / "one.h5"
    jl.run(lambda s: s + 1.0, jnp.full((), 3.0), 0, record={"energy": lambda s: s}, sinks=[jl.HDF5Writer(path)],
           progress=False)
    out = tmp_path / "one.png"
    r = subprocess.run([sys.executable, "-m", "pytest_jaxlog", "plot", str(path), "-o", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"wrote {out} (1 record)", r.stderr
    pixels = np.asarray(Image.open(out).convert("RGB")).astype(int)
    blue = np.array([31, 119, 180])  # matplotlib's first colour, the record's
    dot = np.abs(pixels - blue).sum(axis=-1) < 40
    assert dot.sum() >= 20, dot.sum()  # a dot of several pixels, not an empty panel
    ys, xs = np.nonzero(dot)
    assert xs.max() - xs.min() <= 12 and ys.max() - ys.min() <= 12  # one point, not a line across the panel
