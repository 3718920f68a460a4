"""``jl.resume`` with fewer words: what the file holds (the key, ``dt``, the checkpoint schedule,
the built-in invariants and their running state) is taken from it when not given again, and the
run then equals, bit for bit, the one done in one go; what is given and differs is refused naming
the argument, the file's value and the given one; what the file cannot hold (a predicate, or
anything an older file lacks) is asked for by name. The fixture's ``jaxlog.resume`` makes the
resumed run the test's, listed in the manifest with the step it resumed from."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import jax
import numpy as np
import pytest

import pytest_jaxlog as jl

import resume_helpers as k

pytest_plugins = ["pytester"]

SHORT = dict(record=k.RECORD, progress=False)  # all a resume of the Langevin chain needs besides like=


def _same(path, whole) -> None:
    traj = jl.load(path)
    assert traj.status == whole.status and traj.steps_done == whole.steps_done
    assert traj.records == whole.records
    assert traj.attachment_steps("checkpoint") == whole.attachment_steps("checkpoint")  # the file's schedule
    for p in whole.records:
        np.testing.assert_array_equal(traj.steps(p), whole.steps(p))
        np.testing.assert_array_equal(traj.time(p), whole.time(p))  # the file's dt
        np.testing.assert_array_equal(traj[p], whole[p])


def _leaves_equal(a, b) -> None:
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    path = tmp_path_factory.mktemp("whole") / "t.h5"
    run = jl.run(k.STEP, k.STATE, k.TOTAL, sinks=[jl.HDF5Writer(path)], **k.run_kwargs())
    return run, jl.load(path)


@pytest.fixture
def failed(tmp_path):
    path = tmp_path / "t.h5"
    k.failed_file(path)
    return path


def test_the_step_and_the_views_are_all_a_resume_needs(failed, whole):
    """The Langevin chain (a key= run with dt, checkpoints and four built-in invariants, one an
    aggregate whose window spans the checkpoint) resumed with only the step and the views."""
    whole_run, whole_traj = whole
    run = jl.resume(failed, k.STEP, k.TOTAL, like=k.STATE, **SHORT)
    assert run.resumed_from == 30 and run.steps_done == k.TOTAL and run.violation is None
    _leaves_equal(run.state, whole_run.state)
    _same(failed, whole_traj)
    assert jl.load(failed).description["run"]["invariants"] == [inv.name for inv in k.invariants()]


def test_the_invariants_state_comes_back_with_them(tmp_path):
    """An oscillator whose state carries its own PRNG key: ``conserved`` taken from the file
    still compares with the energy of step 0, so the resumed run stops at the step and with the
    value the run done in one go stops at, past the checkpoint."""
    step, energy, s0 = k.kicked, k.energy, k.KICKED0
    plain = jl.run(step, s0, 200, record={"e": energy}, progress=False).trajectory["e"]
    e = plain.astype(np.float64)
    drift = np.abs(e - e[0]) / abs(e[0])
    rtol = float(drift[:31].max()) * (1 + 1e-9)  # nothing up to step 30 breaks it: the break comes after the checkpoint
    assert (drift > rtol).any()
    breaks = int(np.argmax(drift > rtol))
    common = dict(record={"e": energy}, chunk=5, progress=False)
    with pytest.raises(jl.InvariantViolation) as once:
        jl.run(step, s0, 200, invariants=[jl.conserved("e", rtol=rtol)], checkpoint=jl.every(10), dt=0.05,
               sinks=[jl.HDF5Writer(tmp_path / "once.h5")], **common)
    assert once.value.step == breaks > 30
    path = tmp_path / "t.h5"
    with pytest.raises(jl.JaxlogError):
        jl.run(step, s0, 200, invariants=[jl.conserved("e", rtol=rtol)], checkpoint=jl.every(10), dt=0.05,
               sinks=[jl.HDF5Writer(path), k.FailAt(30)], **common)
    assert max(jl.load(path).attachment_steps("checkpoint")) <= 30
    with pytest.raises(jl.InvariantViolation) as resumed:
        jl.resume(path, step, 200, **common)  # no like=, no key, dt, checkpoint or invariants
    assert (resumed.value.step, resumed.value.value, resumed.value.expected) == \
        (once.value.step, once.value.value, once.value.expected)
    _same(path, jl.load(tmp_path / "once.h5"))


def test_what_is_given_and_differs_is_refused_naming_both(failed):
    before = failed.read_bytes()
    cases = [
        (dict(key=jax.random.key(8)), r"a different key= than the file's run \(given "
                                      r"threefry2x32 \[0, 8\], the file's threefry2x32 \[0, 7\]\)"),
        (dict(key=None), r"no key= \(the file's run had one: threefry2x32 \[0, 7\]; leave key= out to take it\)"),
        (dict(dt=0.1), r"dt=0.1 \(the file's run had dt=0.05\)"),
        (dict(invariants=[jl.finite("obs")]),
         r"1 invariants \(the file's run checked 4\): given \[finite\(obs\)\], the file's \[finite\(obs\), bounded"),
        (dict(invariants=[jl.finite("obs"), jl.bounded("obs/temperature", lo=1.0), *k.invariants()[2:]]),
         r"invariants= differ \(given \[finite\(obs\), bounded\(obs/temperature, lo=1.0\), .*the file's "
         r"\[finite\(obs\), bounded\(obs/temperature, lo=0.0\)"),
    ]
    for given, match in cases:
        with pytest.raises(jl.JaxlogError, match=match):
            jl.resume(failed, k.STEP, k.TOTAL, like=k.STATE, **SHORT, **given)
    assert failed.read_bytes() == before and jl.load(failed).status == "failed"
    assert not [p for p in failed.parent.iterdir() if p.name.startswith(".")]


def test_given_and_equal_is_taken(failed, whole):
    """Saying it all again, as before, still works and gives the same file."""
    jl.resume(failed, k.STEP, k.TOTAL, like=k.STATE, **k.run_kwargs())
    _same(failed, whole[1])


def test_a_predicate_invariant_is_asked_for(tmp_path, whole):
    """``jl.invariant``'s predicate is code: the file names it, and the resume asks for all of them."""
    path = tmp_path / "t.h5"
    mine = jl.invariant("cool", lambda t: t < 100.0, "obs/temperature")
    kwargs = {**k.run_kwargs(), "invariants": [*k.invariants(), mine]}
    with pytest.raises(jl.JaxlogError):
        jl.run(k.STEP, k.STATE, k.TOTAL, sinks=[jl.HDF5Writer(path), k.FailAt(35)], **kwargs)
    with pytest.raises(jl.JaxlogError, match=r"checked cool, a function the file does not hold: pass invariants= "
                                             r"to jl.resume, all 5 in the same order \(finite\(obs\), .*cool\)"):
        jl.resume(path, k.STEP, k.TOTAL, like=k.STATE, **SHORT)
    run = jl.resume(path, k.STEP, k.TOTAL, like=k.STATE, invariants=kwargs["invariants"], **SHORT)
    _leaves_equal(run.state, whole[0].state)
    _same(path, whole[1])


def _as_older(path) -> None:
    """Rewrite each checkpoint's record as files written before it kept the schedule and invariants."""
    with h5py.File(path, "r+") as f:
        for step, group in f["jaxlog/attachments/checkpoint"].items():
            meta = json.loads(bytes(group["jaxlog_checkpoint"][()]).decode())
            del meta["checkpoint"], meta["invariant_specs"]
            del group["jaxlog_checkpoint"]
            group["jaxlog_checkpoint"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)


def test_an_older_file_asks_for_what_it_does_not_hold(failed, whole):
    _as_older(failed)
    with pytest.raises(jl.JaxlogError, match=r"does not say its run's checkpoint schedule .*: pass "
                                             r"checkpoint=jl.every\(n\) \(or checkpoint=None"):
        jl.resume(failed, k.STEP, k.TOTAL, like=k.STATE, **SHORT)
    with pytest.raises(jl.JaxlogError, match=r"does not say how to rebuild the invariants .*: pass invariants= "
                                             r"to jl.resume, the same 4 in the same order \(finite\(obs\), "):
        jl.resume(failed, k.STEP, k.TOTAL, like=k.STATE, checkpoint=jl.every(k.CHECKPOINT), **SHORT)
    # the key and dt were in older files already
    jl.resume(failed, k.STEP, k.TOTAL, like=k.STATE, checkpoint=jl.every(k.CHECKPOINT), invariants=k.invariants(),
              **SHORT)
    _same(failed, whole[1])


SUITE = """
import sys
import pytest
import pytest_jaxlog as jl

sys.path[:0] = [TESTS, ROOT]  # resume_helpers imports the examples' kernels
from resume_helpers import FailAt, kicked as step, energy, KICKED0 as S0


def test_chain(jaxlog):
    with pytest.raises(jl.JaxlogError):
        jaxlog.run(step, S0, 60, name="chain", record={"e": energy}, invariants=[jl.finite("e")], dt=0.05,
                   checkpoint=jl.every(10), chunk=5, sinks=[FailAt(35)])
    run = jaxlog.resume(step, 60, name="chain", record={"e": energy})
    assert run.resumed_from == 30 and run.steps_done == 60
    assert jaxlog.artifacts["chain:trajectory"] == jaxlog.dir / "chain.h5"
    once = jaxlog.run(step, S0, 60, name="once", record={"e": energy}, dt=0.05, chunk=5)
    assert (jaxlog.load("chain")["e"] == once.trajectory["e"]).all()
"""


def test_the_fixture_resumes_a_run_of_the_test(pytester):
    here = Path(__file__).parent
    pytester.makepyfile(test_suite=SUITE.replace("TESTS", repr(str(here))).replace("ROOT", repr(str(here.parent))))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--jaxlog-keep=all")
    result.assert_outcomes(passed=1)
    doc = json.loads((pytester.path / ".jaxlog/manifest.json").read_text())
    entry = {e["nodeid"]: e for e in doc["tests"]}["test_suite.py::test_chain"]
    runs = [(r["name"], r["resumed_from"], r["status"]) for r in entry["runs"]]
    assert runs[0][:2] == ("chain", None) and runs[0][2] != "complete"
    assert runs[1:] == [("chain", 30, "complete"), ("once", None, "complete")]
    assert entry["artifacts"]["chain:trajectory"] == "test_suite.test_chain/chain.h5"
    traj = jl.load(pytester.path / ".jaxlog/test_suite.test_chain/chain.h5")
    assert traj.status == "complete" and traj.steps_done == 60 and traj.attachment_steps("checkpoint")[-1] == 60
