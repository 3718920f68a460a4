"""The session's HTML report through real pytest runs: where it is written and when (keep, the
option, xdist's controller), what it holds (failures first with the embedded plot that decodes,
the message, links that resolve; every test's runs, steps/s, compiles; sparklines drawn from the
trajectory files within their caps), that hostile test ids and record names stay text, the plots
as pytest-html extras, and a real headless Chromium that loads the page without a console
message and shows the failing test's plot.

``UPDATE_REPORT_SCREENSHOT=1`` copies the browser test's screenshot to docs/report.png.
"""

from __future__ import annotations

import base64
import html.parser
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest

from plugin_helpers import no_jaxlog_env  # noqa: F401  (an autouse fixture)
from pytest_jaxlog.harness.report import MAX_POINTS, downsample, sparkline_svg

pytest_plugins = ["pytester"]

# imported before the inner runs: pytester drops modules first imported during a run
import h5py  # noqa: E402,F401
import matplotlib.figure  # noqa: E402,F401
from matplotlib.backends import backend_agg  # noqa: E402,F401
import pytest_jaxlog.drive.run  # noqa: E402,F401
import pytest_jaxlog.harness.report  # noqa: E402,F401
import pytest_jaxlog.store.hdf5.writer  # noqa: E402,F401
import pytest_jaxlog.store.hdf5.trajectory  # noqa: E402,F401
import pytest_jaxlog.profiling.timeline  # noqa: E402,F401

RUN = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")
ROOT = Path(__file__).resolve().parents[1]
HOSTILE_ID = "<img src=x onerror=alert(1)>"
HOSTILE_RECORD = "<i onmouseover=alert(2)>"

SUITE = f"""
import jax.numpy as jnp
import pytest
import pytest_jaxlog as jl

def drift(s):
    return s * 1.0002 + 0.001 * jnp.sin(jnp.arange(3.0) + s)

def test_energy_drift(jaxlog):
    jaxlog.run(drift, jnp.ones(3), 500, record={{"energy": lambda s: jnp.sum(s)}},
               invariants=[jl.conserved("energy", rtol=1e-2)])

@pytest.mark.parametrize("name", [{HOSTILE_ID!r}])
def test_long_run(jaxlog, name):
    jaxlog.run(drift, jnp.ones(3), 1000, record={{"energy": lambda s: jnp.sum(s), {HOSTILE_RECORD!r}: lambda s: s[0]}})
"""
FAILING_ID = "test_suite.py::test_energy_drift"


class Tags(html.parser.HTMLParser):
    """Every tag and attribute of a page, to check what markup it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _tags(text: str) -> list[tuple[str, dict]]:
    parser = Tags()
    parser.feed(text)
    return parser.tags


def _embedded_pngs(text: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)]


def _run_suite(pytester, *args):
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest(*RUN, *args)
    result.assert_outcomes(failed=1, passed=1)
    return result


def test_report_under_keep_all_has_the_failure_first_every_test_and_sparklines(pytester):
    result = _run_suite(pytester, "--jaxlog-keep=all")
    page = pytester.path / ".jaxlog" / "report.html"
    result.stdout.fnmatch_lines(["jaxlog report: .jaxlog/report.html"])
    text = page.read_text()
    assert text.index("Failures (1)") < text.index(FAILING_ID) < text.index("Jaxlog tests of this session (2)")
    assert "invariant conserved(energy, rtol=0.01) violated at step" in text  # the failure's message
    (png,) = _embedded_pngs(text)
    plot = pytester.path / ".jaxlog" / "test_suite.test_energy_drift" / "trajectory-violation.png"
    assert png == plot.read_bytes()  # the plot itself, decodable
    from PIL import Image

    assert Image.open(io.BytesIO(png)).size == (800, 450)
    tags = _tags(text)
    links = [a["href"] for tag, a in tags if tag == "a"]
    assert links and all((page.parent / unquote(href)).is_file() for href in links)
    assert "test_suite.test_energy_drift/trajectory.h5" in links
    # each test's row: its runs, steps/s, compiles, from the manifest
    manifest = json.loads((page.parent / "manifest.json").read_text())
    for t in manifest["tests"]:
        for r in t["runs"]:
            assert f"{r['name']}: {r['steps']} step" in text
            rate = r["steps_per_s"]  # null for a run too short to time: said, not a number
            assert (f"{rate:.4g}" if rate is not None else "too short to time") in text
    # the passing test's scalar records as sparklines: the energy of 1001 frames, drawn from its file
    svgs = [a for tag, a in tags if tag == "polyline"]
    assert len(svgs) == 3  # the failing run's energy, the long run's energy and its hostile record
    longest = max(svgs, key=lambda a: len(a["points"].split()))
    assert len(longest["points"].split()) == MAX_POINTS
    assert "1001 frames" in text and "caps: 40 embedded plots" in text


def test_hostile_test_ids_and_record_names_stay_text(pytester):
    _run_suite(pytester, "--jaxlog-keep=all")
    text = (pytester.path / ".jaxlog" / "report.html").read_text()
    assert HOSTILE_ID not in text and HOSTILE_RECORD not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text and "&lt;i onmouseover=alert(2)&gt;" in text
    tags = _tags(text)
    assert not [t for t, _ in tags if t in ("script", "iframe", "object", "embed", "link", "base", "form")]
    assert not [(t, k) for t, attrs in tags for k in attrs if k.startswith("on")]
    assert {t for t, _ in tags if t == "img"} == {"img"}
    assert all(a["src"].startswith("data:image/png;base64,") for t, a in tags if t == "img")
    (csp,) = [a for t, a in tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp["content"] == "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def test_keep_failed_is_the_default_and_the_option_turns_it_off_or_moves_it(pytester):
    _run_suite(pytester)
    page = pytester.path / ".jaxlog" / "report.html"
    text = page.read_text()
    assert FAILING_ID in text and "test_long_run" in text  # a passing test is listed, its files are gone
    assert len(_tags(text)) and text.count("<polyline") == 1  # only the kept (failing) run has a trajectory
    _run_suite(pytester, "--jaxlog-report=no")
    assert not page.exists()  # an earlier session's page is not left to show other failures
    page.write_text("<p>a page of the user's</p>")
    _run_suite(pytester, "--jaxlog-report=no")
    assert page.read_text() == "<p>a page of the user's</p>"  # only a page of ours is removed
    page.unlink()
    _run_suite(pytester, "--jaxlog-keep=none")
    assert not page.exists()
    result = _run_suite(pytester, "--jaxlog-keep=none", "--jaxlog-report=out/r.html")
    result.stdout.fnmatch_lines(["jaxlog report: out/r.html"])
    text = (pytester.path / "out" / "r.html").read_text()
    assert FAILING_ID in text and not _embedded_pngs(text)  # nothing kept: no plot to show


def test_a_bare_option_before_a_test_path_is_a_usage_error_that_overwrites_nothing(pytester):
    test_file = pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest(*RUN, "--jaxlog-report", str(pytester.path))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*is a directory; the report is a file: give it as --jaxlog-report=PATH*"])
    result = pytester.runpytest(*RUN, "--jaxlog-report", str(test_file))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_suite.py is not an .html file: give it as --jaxlog-report=PATH*"])
    assert "def test_energy_drift" in test_file.read_text() and "<html" not in test_file.read_text()
    other = pytester.path / "notes.html"
    other.write_text("<p>mine</p>")
    result = pytester.runpytest(*RUN, f"--jaxlog-report={other}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*notes.html exists and is not a jaxlog report (it is never overwritten)*"])
    assert other.read_text() == "<p>mine</p>"


def test_under_xdist_the_controller_writes_one_report_of_every_worker(pytester):
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(*RUN, "-n", "2", "--jaxlog-keep=all")
    result.assert_outcomes(failed=1, passed=1)
    text = (pytester.path / ".jaxlog" / "report.html").read_text()
    workers = {t["worker"] for t in json.loads((pytester.path / ".jaxlog" / "manifest.json").read_text())["tests"]}
    assert workers <= {"gw0", "gw1"} and workers
    assert FAILING_ID in text and "test_long_run" in text and len(_embedded_pngs(text)) == 1
    assert "invariant conserved(energy, rtol=0.01) violated" in text
    assert not list(pytester.path.glob(".jaxlog/**/report.html"))[1:]  # one page, the controller's


def test_pytest_html_gets_the_plot_as_an_extra(pytester):
    pytest.importorskip("pytest_html", reason="pytest-html (the test extra) is not installed")
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(*RUN, "--html=h.html", "--self-contained-html")
    result.assert_outcomes(failed=1, passed=1)
    plot = pytester.path / ".jaxlog" / "test_suite.test_energy_drift" / "trajectory-violation.png"
    page = (pytester.path / "h.html").read_text()
    assert base64.b64encode(plot.read_bytes()).decode() in page


def test_downsampling_keeps_each_buckets_extremes_in_step_order():
    rng = np.random.default_rng(0)
    values = rng.normal(size=10_001)
    values[4321] = 50.0  # a spike plain striding would step over
    values[77] = np.nan
    steps = np.arange(10_001) * 3
    s = downsample(steps, values)
    finite = np.flatnonzero(np.isfinite(values))
    want_steps, want_values = [], []
    for bucket in np.array_split(np.arange(len(finite)), MAX_POINTS // 2):  # done plainly
        idx = finite[bucket]
        lo, hi = idx[np.argmin(values[idx])], idx[np.argmax(values[idx])]
        for i in sorted({int(lo), int(hi)}):
            want_steps.append(steps[i])
            want_values.append(values[i])
    np.testing.assert_array_equal(s.steps, want_steps)
    np.testing.assert_array_equal(s.values, want_values)
    assert len(s.values) <= MAX_POINTS and 50.0 in s.values and s.nonfinite == 1 and s.frames == 10_001
    svg = sparkline_svg(s, "e<1>")
    assert "e&lt;1&gt;: 200 of 10001 frames drawn" in svg and "1 not finite" in svg


# -- a real browser -------------------------------------------------------------------------------


def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _screenshot(browser: str, page: Path, out: Path, size: str = "1200,1500") -> list[str]:
    """Load ``page`` headless, screenshot it to ``out``; return the console messages it logged."""
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--force-device-scale-factor=1", f"--window-size={size}", f"--screenshot={out}",
                           "--enable-logging=stderr", "--v=0", page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert out.is_file(), proc.stderr[-2000:]
    return [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]


def _colour_count(image, rgb, tol=2) -> int:
    pixels = np.asarray(image.convert("RGB"), np.int16)
    return int((np.abs(pixels - np.asarray(rgb, np.int16)).max(axis=-1) <= tol).sum())


def _band_colour(png: bytes):
    """The plot's most common colour that is not white: the tolerance band it fills."""
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).reshape(-1, 3)
    colours, counts = np.unique(pixels, axis=0, return_counts=True)
    order = [i for i in np.argsort(-counts) if tuple(colours[i]) != (255, 255, 255)]
    return tuple(int(c) for c in colours[order[0]]), int(counts[order[0]])


def test_chromium_loads_the_report_without_console_messages_and_shows_the_plot(pytester, tmp_path):
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium or Chrome found (Debian: apt-get install chromium; .ci/run installs it)")
    _run_suite(pytester, "--jaxlog-keep=all")
    page = pytester.path / ".jaxlog" / "report.html"
    shot = tmp_path / "report.png"
    assert _screenshot(browser, page, shot) == []
    from PIL import Image

    image = Image.open(shot)
    assert image.size == (1200, 1500)
    assert len(np.unique(np.asarray(image.convert("L")))) > 20  # not a blank page
    (png,) = _embedded_pngs(page.read_text())
    band, in_plot = _band_colour(png)
    assert _colour_count(image, band) >= 0.9 * in_plot  # the plot is on screen, at its own size

    # the checks can fail: the same page without the plot shows no band, a page that logs is caught
    bare = page.with_name("bare.html")
    bare.write_text(re.sub(r'<img class="plot"[^>]*>', "", page.read_text()))
    assert _screenshot(browser, bare, tmp_path / "bare.png") == []
    assert _colour_count(Image.open(tmp_path / "bare.png"), band) < 0.01 * in_plot
    noisy = page.with_name("noisy.html")
    noisy.write_text('<!DOCTYPE html><html><body><img src="elsewhere.png"></body></html>'.replace(
        "<body>", '<head><meta http-equiv="Content-Security-Policy" content="img-src data:"></head><body>'))
    assert _screenshot(browser, noisy, tmp_path / "noisy.png", "300,200")
    if os.environ.get("UPDATE_REPORT_SCREENSHOT") == "1":
        small = image.crop((0, 0, 1200, 1350)).convert("P", palette=Image.Palette.ADAPTIVE, colors=128)
        small.save(ROOT / "docs" / "report.png", optimize=True)
