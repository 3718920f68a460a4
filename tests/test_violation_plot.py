"""A plot of every failing invariant: the violating record, the conserved value with its band or
the bound, and the first bad step marked; left by the plugin beside the run's files (manifest
artifact ``plot``), named in the failure; without matplotlib, the failure says how to get it."""

from __future__ import annotations

import json

import h5py  # noqa: F401  (imported before pytester's in-process runs snapshot sys.modules)
import jax.numpy as jnp
import matplotlib.figure  # noqa: F401
import numpy as np
from matplotlib.backends import backend_agg  # noqa: F401

import pytest_jaxlog as jl
import pytest_jaxlog.harness.fixture  # noqa: F401
import pytest_jaxlog.store.hdf5.trajectory  # noqa: F401
from pytest_jaxlog.check.plots import HOW_TO_PLOT, draw_violation, plot_violation

pytest_plugins = ["pytester"]


def drift(s):
    return s * 1.0002 + 0.001 * jnp.sin(jnp.arange(3.0) + s)


def _lines(fig):
    (ax,) = fig.axes
    return {line.get_label(): (np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float))
            for line in ax.get_lines()}


def test_conserved_in_a_batched_run_draws_the_system_the_reference_and_the_bad_step():
    r = jl.run(drift, jnp.ones((2, 3)), 200, batched=True, record={"energy": lambda s: jnp.sum(s, axis=-1)},
               invariants=[jl.conserved("energy", rtol=2e-2)], on_violation="record", progress=False)
    v = r.violation
    assert v is not None and v.system is not None
    fig = draw_violation(r.trajectory, v)
    lines = _lines(fig)
    steps, values = lines[f"energy (system {v.system})"]
    np.testing.assert_array_equal(steps, r.trajectory.steps("energy"))
    np.testing.assert_array_equal(values, r.trajectory["energy"][:, v.system].astype(np.float64))
    assert set(lines[f"first bad step {v.step}"][0]) == {v.step}
    assert set(lines[f"expected {float(v.expected):.6g}"][1]) == {float(v.expected)}
    marker = [d for label, d in lines.items() if label.startswith("_")]  # the red dot: unlabelled
    assert any(list(x) == [v.step] and np.isclose(y[0], float(v.value)) for x, y in marker)
    (band,) = fig.axes[0].patches
    lo, hi = band.get_extents().transformed(fig.axes[0].transData.inverted()).get_points()[:, 1]
    np.testing.assert_allclose([lo, hi], [float(v.expected) - v.tolerance, float(v.expected) + v.tolerance])


def test_bounded_element_draws_that_element_and_the_bound(tmp_path):
    r = jl.run(drift, jnp.ones(3), 200, record={"x": lambda s: s}, invariants=[jl.bounded("x", lo=0.5, hi=1.1)],
               on_violation="record", progress=False)
    v = r.violation
    lines = _lines(draw_violation(r.trajectory, v))
    element = f"x[{', '.join(map(str, v.index))}]"
    np.testing.assert_array_equal(lines[element][1], r.trajectory["x"][(slice(None), *v.index)].astype(np.float64))
    bounds = sorted(float(y[0]) for label, (x, y) in lines.items() if label.startswith("bound"))
    assert bounds == [0.5, 1.1]
    out = plot_violation(r.trajectory, v, tmp_path / "v.svg")
    assert out.read_text().lstrip().startswith("<?xml") and "<svg" in out.read_text()


FAILING = """
import jax.numpy as jnp
import pytest_jaxlog as jl

def drift(s):
    return s * 1.0002 + 0.001 * jnp.sin(jnp.arange(3.0) + s)

def test_drift(jaxlog):
    jaxlog.run(drift, jnp.ones(3), 500, record={"energy": lambda s: jnp.sum(s)},
               invariants=[jl.conserved("energy", rtol=1e-2)])
"""


def test_the_plugin_leaves_a_plot_named_in_the_failure_and_the_manifest(pytester):
    pytester.makepyfile(test_plotted=FAILING)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    png = pytester.path / ".jaxlog" / "test_plotted.test_drift" / "trajectory-violation.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    result.stdout.fnmatch_lines(["E * plot: .jaxlog/test_plotted.test_drift/trajectory-violation.png"])
    manifest = json.loads((pytester.path / ".jaxlog" / "manifest.json").read_text())
    text = json.dumps(manifest)
    assert '"plot": "test_plotted.test_drift/trajectory-violation.png"' in text


def test_without_matplotlib_the_failure_says_how_to_get_the_plot(pytester):
    pytester.makeconftest("import sys\nsys.modules['matplotlib'] = None  # as if it were not installed\n")
    pytester.makepyfile(test_plotted=FAILING + """
import pytest
from pytest_jaxlog.check.plots import draw_violation

def test_drawing_says_what_to_install():
    with pytest.raises(jl.JaxlogError, match=r"no plot of the violation: pip install 'pytest-jaxlog\\[plot\\]'"):
        draw_violation(None, None)
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, passed=1)
    assert any(f"note: no plot of the violation: {HOW_TO_PLOT}" in line for line in result.outlines)
    assert not (pytester.path / ".jaxlog" / "test_plotted.test_drift" / "trajectory-violation.png").exists()
