"""The golden review flow end to end: under CI (or --jaxlog-golden-review) a mismatch writes the
obtained golden beside the old one as a pending file and never rewrites it (--jaxlog-regen
included); the manifest, the HTML report and `jaxlog summary --markdown` list it; `jaxlog golden
reject` drops it and `jaxlog golden accept` applies it, after which the run passes."""

from __future__ import annotations

import json

import numpy as np

import pytest_jaxlog as jl
from plugin_helpers import no_jaxlog_env  # noqa: F401  (no_jaxlog_env: an autouse fixture)
from pytest_jaxlog.cli import main

pytest_plugins = ["pytester"]

# imported before the inner runs: pytester drops modules first imported during a run
import h5py  # noqa: E402,F401
import jax.numpy  # noqa: E402,F401
import pytest_jaxlog.drive.run, pytest_jaxlog.profiling.timeline, pytest_jaxlog.store.hdf5.writer  # noqa: E401,E402,F401
import pytest_jaxlog.compare.golden_files  # noqa: E401,E402,F401

KERNEL = """
import jax.numpy as jnp

def test_decay(jaxlog):
    run = jaxlog.run(lambda x: x * {rate}, jnp.ones(3), 20, record={{"x": lambda x: x}})
    assert jaxlog.check_golden(run, rtol=1e-6) in ("ok", "regenerated")
"""
RUN = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")
ID = "test_k.test_decay.h5"
GOLDEN = "fixtures/golden/" + ID
PENDING = GOLDEN + ".pending"


def _cli(capsys, *argv) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_under_ci_a_mismatch_is_pending_then_rejected_or_accepted(pytester, monkeypatch, capsys):
    pytester.makepyfile(test_k=KERNEL.format(rate=0.9))
    pytester.runpytest(*RUN, "--jaxlog-regen").assert_outcomes(passed=1)
    golden = pytester.path / GOLDEN
    before = golden.read_bytes()

    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(test_k=KERNEL.format(rate=0.91))
    for extra in ((), ("--jaxlog-regen",)):  # under review not even --jaxlog-regen rewrites
        result = pytester.runpytest(*RUN, *extra)
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines([f"E   *golden left as it is (review: CI is set); the obtained one is pending as "
                                     f"{PENDING}",
                                     f"E   *to apply it: python -m pytest_jaxlog golden accept {ID} (reject: drop it; "
                                     "--all: every pending golden)",
                                     "*pending 1 golden trajectories*", f"  {ID}"])
        assert golden.read_bytes() == before
    assert jl.load(pytester.path / PENDING)["x"][1][0] == np.float32(0.91) and jl.load(golden)["x"][1][0] == np.float32(0.9)
    note = json.loads((pytester.path / (PENDING + ".json")).read_text())
    assert note["id"] == ID and note["test"] == "test_k.py::test_decay"
    assert note["summary"].splitlines()[1].startswith("[jaxlog] trajectories differ: record 'x' first differs at step 1")

    doc = json.loads((pytester.path / ".jaxlog/manifest.json").read_text())
    (entry,) = doc["tests"]
    assert entry["goldens"] == [{"path": "../" + GOLDEN, "status": "pending", "pending": "../" + PENDING, "id": ID}]
    assert doc["settings"]["golden_review"] is True
    assert f"jaxlog golden accept {ID}" in (pytester.path / ".jaxlog/report.html").read_text()
    code, out = _cli(capsys, "summary", "--markdown", ".jaxlog")
    assert code == 0 and f"- pending golden `{ID}`: `{PENDING}`; apply it with " \
        f"`python -m pytest_jaxlog golden accept {ID}`" in out
    code, out = _cli(capsys, "golden", "list")
    assert code == 0 and out.startswith(f"{ID}  (test_k.py::test_decay)") and "1 pending golden in" in out

    code, out = _cli(capsys, "golden", "accept", "nothing-like-it")
    assert code == 2 and f"[jaxlog] no pending golden 'nothing-like-it' (pending: {ID})" in out
    code, out = _cli(capsys, "golden", "reject", "--all")
    assert code == 0 and f"[jaxlog] rejected {ID}" in out
    assert not (pytester.path / PENDING).exists() and golden.read_bytes() == before

    pytester.runpytest(*RUN).assert_outcomes(failed=1)  # pending again
    pending = (pytester.path / PENDING).read_bytes()
    code, out = _cli(capsys, "golden", "accept", ID.removesuffix(".h5"))
    assert code == 0 and f"[jaxlog] accepted {ID}: {GOLDEN}" in out
    assert golden.read_bytes() == pending and not list(golden.parent.glob("*.pending*"))
    pytester.runpytest(*RUN).assert_outcomes(passed=1)


def test_review_by_option_and_turned_off_under_ci(pytester, monkeypatch):
    pytester.makepyfile(test_k=KERNEL.format(rate=0.9))
    pytester.runpytest(*RUN, "--jaxlog-regen").assert_outcomes(passed=1)
    golden = pytester.path / GOLDEN
    before = golden.read_bytes()
    pytester.makepyfile(test_k=KERNEL.format(rate=0.91))
    result = pytester.runpytest(*RUN, "--jaxlog-golden-review", "--jaxlog-regen")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E   *golden left as it is (review: --jaxlog-golden-review is on)*"])
    assert golden.read_bytes() == before and (pytester.path / PENDING).exists()

    monkeypatch.setenv("CI", "1")
    monkeypatch.setenv("JAXLOG_GOLDEN_REVIEW", "0")
    pytester.runpytest(*RUN, "--jaxlog-regen").assert_outcomes(passed=1)
    assert golden.read_bytes() != before
