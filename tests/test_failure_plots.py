"""Plots of failed golden and cost checks: drawn from the real comparison (obtained over golden,
the first difference marked, the differing system in batched runs; stored against obtained cost
per metric), left in the test's directory as its ``plot`` artifact, named in the failure, in
the manifest, in JUnit XML (``[[ATTACHMENT|path]]`` in ``<system-out>``) and linked by
``jaxlog summary --markdown``; ``jaxlog plot --record --mark-step`` draws a record the same way;
without matplotlib the failure says how to get the plot."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import jax.numpy as jnp
import numpy as np

import pytest_jaxlog as jl
from plugin_helpers import no_jaxlog_env  # noqa: F401  (an autouse fixture)
from pytest_jaxlog.compare.cost import CostBar, draw_cost
from pytest_jaxlog.compare.golden import draw_golden_diff
from pytest_jaxlog.compare.golden import diff_trajectories

pytest_plugins = ["pytester"]

# imported before the inner runs: pytester drops modules first imported during a run
import h5py  # noqa: E402,F401
import matplotlib.figure  # noqa: E402,F401
from matplotlib.backends import backend_agg  # noqa: E402,F401
import pytest_jaxlog.drive.run  # noqa: E402,F401
import pytest_jaxlog.drive.host.result  # noqa: E402,F401
import pytest_jaxlog.harness.goldens  # noqa: E402,F401
import pytest_jaxlog.harness.report  # noqa: E402,F401
import pytest_jaxlog.harness.goldens  # noqa: E402,F401
import pytest_jaxlog.compare.cost  # noqa: E402,F401
import pytest_jaxlog.profiling.timeline  # noqa: E402,F401
import pytest_jaxlog.store.hdf5.writer  # noqa: E402,F401

RUN = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")
PNG = b"\x89PNG\r\n\x1a\n"


def _lines(ax):
    return {ln.get_label(): (np.asarray(ln.get_xdata(), float), np.asarray(ln.get_ydata(), float))
            for ln in ax.get_lines()}


def _decay(rate):
    def step(s):
        return s * rate
    return step


def test_golden_figure_draws_the_differing_system_over_the_golden_and_marks_the_first_difference():
    golden = jl.run(_decay(0.99), jnp.ones((3, 2)), 50, batched=True, record={"x": lambda s: s}, progress=False)
    bent = jnp.array([1.0, 0.99, 1.0])[:, None]  # only system 1 decays faster
    obtained = jl.run(lambda s: s * 0.99 * bent, jnp.ones((3, 2)), 50, batched=True, record={"x": lambda s: s},
                      progress=False)
    diff = diff_trajectories(obtained, golden, rtol=1e-6)
    first = diff.first
    assert first.step == 1 and first.index[0] == 1
    fig = draw_golden_diff(obtained.trajectory, golden.trajectory, diff, batched=True)
    left, right = fig.axes
    lines = _lines(left)
    want_obtained = np.asarray(obtained.trajectory["x"])[(slice(None), *first.index)].astype(np.float64)
    want_golden = np.asarray(golden.trajectory["x"])[(slice(None), *first.index)].astype(np.float64)
    np.testing.assert_array_equal(lines["obtained"][1], want_obtained)
    np.testing.assert_array_equal(lines["golden"][1], want_golden)
    assert set(lines["first difference, step 1"][0]) == {1.0}
    assert left.get_ylabel() == f"x[{first.index[1]}] (system 1)"
    err = _lines(right)["|obtained - golden|"][1]
    np.testing.assert_allclose(err, np.abs(want_obtained - want_golden))
    np.testing.assert_allclose(_lines(right)["tolerance"][1], 1e-6 * np.abs(want_golden))


def test_golden_figure_is_none_when_nothing_has_values_to_draw():
    a = jl.run(_decay(0.9), jnp.ones(2), 5, record={"x": lambda s: s}, progress=False)
    b = jl.run(_decay(0.9), jnp.ones(2), 5, record={"y": lambda s: s}, progress=False)
    assert draw_golden_diff(a.trajectory, b.trajectory, diff_trajectories(a, b)) is None


def test_cost_figure_bars_are_obtained_over_stored_and_the_moved_ones_red():
    bars = [CostBar("flops", 100.0, 100.0, False), CostBar("transcendentals", 64.0, 128.0, True),
            CostBar("views/e/flops", None, 5.0, True)]
    fig = draw_cost(bars, 0.0, "t")
    (ax,) = fig.axes
    widths = {t.get_text(): None for t in ax.get_yticklabels()}
    patches = [p for p in ax.patches]
    assert sorted(round(p.get_width(), 9) for p in patches) == [1.0, 2.0]  # the missing side draws no bar
    red = [p for p in patches if p.get_facecolor()[:3] == matplotlib.colors.to_rgb("tab:red")]
    assert [round(p.get_width(), 9) for p in red] == [2.0]
    assert list(widths)[:2] == ["transcendentals", "views/e/flops"]  # moved first (top down)
    assert any("64 \u2192 128" in t.get_text() for t in ax.texts)


import matplotlib.colors  # noqa: E402

GOLDEN_TEST = """
import jax.numpy as jnp

RATE = {rate}

def test_decay(jaxlog):
    run = jaxlog.run(lambda s: s * RATE, jnp.ones(3), 40, record={{"energy": lambda s: jnp.sum(s)}})
    jaxlog.check_golden(run, rtol=1e-6)
"""
DIR = ".jaxlog/test_g.test_decay"


def test_a_golden_mismatch_leaves_a_plot_in_the_message_manifest_junit_and_summary(pytester):
    pytester.makepyfile(test_g=GOLDEN_TEST.format(rate=0.99))
    pytester.runpytest(*RUN, "--jaxlog-regen").assert_outcomes(passed=1)
    pytester.makepyfile(test_g=GOLDEN_TEST.format(rate=0.98))
    result = pytester.runpytest(*RUN, "--junitxml=junit.xml")
    result.assert_outcomes(failed=1)
    plot = pytester.path / DIR / "golden-diff.png"
    assert plot.read_bytes()[:8] == PNG and plot.stat().st_size > 10_000
    result.stdout.fnmatch_lines(["E * plot: .jaxlog/test_g.test_decay/golden-diff.png"])
    message = [line for line in result.stdout.lines if line.startswith("E ")]
    assert "--jaxlog-regen" in message[-1] and "plot:" in message[-2], message[-3:]  # the message ends with its fix
    manifest = json.loads((pytester.path / ".jaxlog" / "manifest.json").read_text())
    (test,) = manifest["tests"]
    assert test["artifacts"]["plot"] == "test_g.test_decay/golden-diff.png"
    case = ET.parse(pytester.path / "junit.xml").getroot().find(".//testcase")
    assert [el.text for el in case.findall("system-out")] == [f"[[ATTACHMENT|{DIR}/golden-diff.png]]\n"]
    props = {p.get("name"): p.get("value") for p in case.find("properties")}
    assert props["jaxlog.plot"] == f"{DIR}/golden-diff.png"
    summary = subprocess.run([sys.executable, "-m", "pytest_jaxlog", "summary", ".jaxlog", "--markdown"],
                             cwd=pytester.path, capture_output=True, text=True, check=True).stdout
    assert f"  - plot: [.jaxlog/test\\_g.test\\_decay/golden-diff.png]({DIR}/golden-diff.png)" in summary


def test_junit_logging_puts_the_attachment_into_pytests_own_system_out(pytester):
    pytester.makepyfile(test_g=GOLDEN_TEST.format(rate=0.99))
    pytester.runpytest(*RUN, "--jaxlog-regen").assert_outcomes(passed=1)
    pytester.makepyfile(test_g=GOLDEN_TEST.format(rate=0.98))
    pytester.runpytest(*RUN, "--junitxml=junit.xml", "-o", "junit_logging=all").assert_outcomes(failed=1)
    case = ET.parse(pytester.path / "junit.xml").getroot().find(".//testcase")
    outs = case.findall("system-out")
    assert len(outs) == 1  # one element: pytest's, holding the line on its own
    assert f"\n[[ATTACHMENT|{DIR}/golden-diff.png]]\n" in outs[0].text


COST_TEST = """
import jax.numpy as jnp

def test_cost(jaxlog):
    run = jaxlog.run(lambda x: {work}, jnp.linspace(0.0, 1.0, 64), 10, record={{"mean": lambda x: x.mean()}})
    jaxlog.check_cost(run)
"""


def test_a_cost_regression_leaves_a_bar_chart(pytester):
    pytester.makepyfile(test_c=COST_TEST.format(work="x * 0.9 + jnp.sin(x)"))
    pytester.runpytest(*RUN, "--jaxlog-create-goldens").assert_outcomes(passed=1)
    pytester.makepyfile(test_c=COST_TEST.format(work="x * 0.9 + jnp.sin(x) + jnp.sin(x + 1.0)"))
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(failed=1)
    plot = pytester.path / ".jaxlog" / "test_c.test_cost" / "cost.png"
    assert plot.read_bytes()[:8] == PNG
    result.stdout.fnmatch_lines(["E * plot: .jaxlog/test_c.test_cost/cost.png"])
    (test,) = json.loads((pytester.path / ".jaxlog" / "manifest.json").read_text())["tests"]
    assert test["artifacts"]["plot"] == "test_c.test_cost/cost.png"


def test_without_matplotlib_a_golden_mismatch_says_how_to_get_the_plot(pytester):
    pytester.makepyfile(test_g=GOLDEN_TEST.format(rate=0.99))
    pytester.runpytest(*RUN, "--jaxlog-regen").assert_outcomes(passed=1)
    pytester.makepyfile(test_g=GOLDEN_TEST.format(rate=0.98))
    pytester.makeconftest("import sys\nsys.modules['matplotlib'] = None  # as if it were not installed\n")
    result = pytester.runpytest_subprocess(*RUN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E * no plot: pip install 'pytest-jaxlog[[]plot]' (matplotlib) draws one"])
    assert not (pytester.path / DIR / "golden-diff.png").exists()


def test_cli_plot_marks_a_step_on_the_named_record(tmp_path):
    path = tmp_path / "run.h5"
    jl.run(_decay(0.9), jnp.ones(2), 30, record={"energy": lambda s: {"total": jnp.sum(s)}, "x": lambda s: s},
           sinks=[jl.HDF5Writer(path)], progress=False)
    out = tmp_path / "p.svg"
    r = subprocess.run([sys.executable, "-m", "pytest_jaxlog", "plot", str(path), "--record", "energy/total",
                        "--mark-step", "17", "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"wrote {out} (1 record)"
    svg = out.read_text()
    assert "step 17" in svg and "energy/total" in svg and "<svg" in svg
    r = subprocess.run([sys.executable, "-m", "pytest_jaxlog", "plot", str(path), "--record", "energy/total",
                        "--mark-step", "17"], capture_output=True, text=True)  # no -o: beside the file
    assert r.returncode == 0 and r.stdout.strip() == f"wrote {tmp_path / 'run-plot.png'} (1 record)", r.stderr
    assert (tmp_path / "run-plot.png").read_bytes()[:8] == PNG


def test_an_aggregate_violation_draws_its_window_and_the_statistic_across_it():
    from pytest_jaxlog.check.plots import draw_violation

    r = jl.run(_decay(1.01), jnp.ones(()), 100, record={"t": lambda s: s}, progress=False, on_violation="record",
               invariants=[jl.aggregate("t", "mean", hi=1.2, steps=jl.window(20, 80))])
    v = r.violation
    mean = float(np.mean(np.asarray(r.trajectory["t"], np.float64)[20:81]))
    assert np.isclose(float(v.value), mean)
    (ax,) = draw_violation(r.trajectory, v).axes
    (span,) = [p for p in ax.patches if p.get_label() == "window, steps 20..80"]
    x0, x1 = span.get_extents().transformed(ax.transData.inverted()).get_points()[:, 0]
    np.testing.assert_allclose([x0, x1], [20, 80])
    (stat,) = [c for c in ax.collections if c.get_label() == f"mean over the window {float(v.value):.6g}"]
    np.testing.assert_allclose(stat.get_segments()[0], [[20, float(v.value)], [80, float(v.value)]])
    assert float(v.value) > 1.2 and "bound 1.2" in [ln.get_label() for ln in ax.get_lines()]


def test_under_xdist_the_controller_attaches_the_workers_plots_to_junit(pytester):
    pytester.makepyfile(test_g=GOLDEN_TEST.format(rate=0.99))
    pytester.runpytest(*RUN, "--jaxlog-regen").assert_outcomes(passed=1)
    pytester.makepyfile(test_g=GOLDEN_TEST.format(rate=0.98))
    result = pytester.runpytest_subprocess(*RUN, "-n", "2", "--junitxml=junit.xml")
    result.assert_outcomes(failed=1)
    case = ET.parse(pytester.path / "junit.xml").getroot().find(".//testcase")
    assert [el.text for el in case.findall("system-out")] == [f"[[ATTACHMENT|{DIR}/golden-diff.png]]\n"]
    assert (pytester.path / DIR / "golden-diff.png").read_bytes()[:8] == PNG
