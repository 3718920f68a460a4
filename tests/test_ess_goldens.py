"""ESS-rate goldens through pytester: a missing one fails like a missing cost golden and is written
on request with the rate the draws give (computed again in the test from its own trajectory); the
same sampler passes, another seed passes, a proposal far too small fails naming the rates and the
flag; a golden too noisy to decide says "cannot tell"; a hostile stored file is refused naming the
field."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

import pytest_jaxlog as jl
from plugin_helpers import no_jaxlog_env  # noqa: F401  (no_jaxlog_env: an autouse fixture)
from pytest_jaxlog.harness import goldens as ess_goldens

pytest_plugins = ["pytester"]

# imported before the inner runs: pytester drops modules first imported during a run
import h5py  # noqa: E402,F401
import jax  # noqa: E402,F401
import jax.numpy  # noqa: E402,F401
import numpy.fft  # noqa: E402,F401  (the ESS's autocovariances: a C extension loads once per process)
import pytest_jaxlog.drive.run, pytest_jaxlog.check.statistics  # noqa: E401,E402,F401
import pytest_jaxlog.store.hdf5.writer, pytest_jaxlog.profiling.timeline  # noqa: E401,E402,F401

RUN = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")
GOLDEN = "fixtures/golden/test_s.test_sampler.ess.json"
SAMPLER = """
import json
import jax
import jax.numpy as jnp
import pytest_jaxlog as jl

CHAINS, STEPS = 8, 1500

def chain_step(key, x):  # random-walk Metropolis on a standard normal: one log-density per step
    k1, k2 = jax.random.split(key)
    y = x + {scale} * jax.random.normal(k1)
    return jnp.where(jnp.log(jax.random.uniform(k2)) < 0.5 * (x * x - y * y), y, x)

def test_sampler(jaxlog):
    run = jaxlog.run(jax.vmap(chain_step), jnp.linspace(-1.0, 1.0, CHAINS), STEPS, key=jax.random.key({seed}),
                     batched=True, record={{"x": lambda x: x}})
    draws = jaxlog.load()["x"]  # (steps + 1, chains), from the file
    plain = jl.ess(draws, chain_axis=1)
    with open("rate.json", "w") as f:
        json.dump({{"value": float(plain.pooled) / (CHAINS * STEPS), "se": float(plain.pooled_se) / (CHAINS * STEPS)}}, f)
    status = jaxlog.check_ess(run, "x", per=CHAINS * STEPS, unit="logp"{extra})
    with open("status.txt", "w") as f:
        f.write(status)
"""


def sampler(pytester, scale=2.4, seed=0, extra=""):
    pytester.makepyfile(test_s=SAMPLER.format(scale=scale, seed=seed, extra=extra))


def test_missing_then_created_then_ok_then_another_seed_ok(pytester):
    sampler(pytester)
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*[[]jaxlog] ESS golden {GOLDEN} does not exist*",
                                 "*to create it, run pytest with --jaxlog-create-goldens (missing goldens only) or "
                                 "--jaxlog-regen"])
    assert not (pytester.path / GOLDEN).exists()

    result = pytester.runpytest(*RUN, "--jaxlog-create-goldens")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*created ESS golden {GOLDEN} (* per logp) (--jaxlog-create-goldens)*"])
    doc = json.loads((pytester.path / GOLDEN).read_text())
    plain = json.loads((pytester.path / "rate.json").read_text())
    assert doc["format"] == "jaxlog-ess/1" and doc["test"] == "test_s.py::test_sampler"
    assert doc["record"] == "x" and doc["unit"] == "logp" and doc["shape"] == []
    assert doc["value"] == [pytest.approx(plain["value"], rel=1e-12)]
    assert doc["se"] == [pytest.approx(plain["se"], rel=1e-12)]
    assert 0.05 < doc["value"][0] < 0.5 and 0 < doc["se"][0] < 0.2 * doc["value"][0]
    assert (pytester.path / "status.txt").read_text() == "created"

    pytester.runpytest(*RUN).assert_outcomes(passed=1)
    assert (pytester.path / "status.txt").read_text() == "ok"
    sampler(pytester, seed=1)  # another draw of the same sampler's rate: within the errors
    pytester.runpytest(*RUN).assert_outcomes(passed=1)
    assert json.loads((pytester.path / "rate.json").read_text())["value"] != plain["value"]

    result = pytester.runpytest(*RUN, "--jaxlog-regen")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*regenerated ESS golden {GOLDEN} (*) (--jaxlog-regen)*"])
    assert json.loads((pytester.path / GOLDEN).read_text())["value"] == \
        [pytest.approx(json.loads((pytester.path / "rate.json").read_text())["value"], rel=1e-12)]


def test_a_proposal_far_too_small_fails_naming_the_rates_and_the_flag(pytester):
    sampler(pytester)
    pytester.runpytest(*RUN, "--jaxlog-create-goldens").assert_outcomes(passed=1)
    golden = json.loads((pytester.path / GOLDEN).read_text())

    sampler(pytester, scale=0.1)
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(failed=1)
    plain = json.loads((pytester.path / "rate.json").read_text())
    assert plain["value"] < golden["value"][0] / 5
    result.stdout.fnmatch_lines([
        f"*[[]jaxlog] ESS rate of record 'x' fell below ESS golden {GOLDEN}:",
        f"*rate: {plain['value']:.4g} ± * per logp, below the golden {golden['value'][0]:.4g} ± * by more than 3 "
        "standard errors (floor *)",
        "*if the sampler was made slower on purpose, run pytest with --jaxlog-regen"])
    assert json.loads((pytester.path / GOLDEN).read_text()) == golden  # a failure writes nothing


def test_a_golden_too_noisy_to_decide_says_cannot_tell_and_one_of_nan_is_refused(pytester):
    sampler(pytester)
    pytester.runpytest(*RUN, "--jaxlog-create-goldens").assert_outcomes(passed=1)
    path = pytester.path / GOLDEN
    doc = json.loads(path.read_text())
    doc["se"] = [doc["value"][0]]  # 3 standard errors reach below 0: no drop could show
    path.write_text(json.dumps(doc))

    result = pytester.runpytest(*RUN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*[[]jaxlog] ESS rate of record 'x' against ESS golden {GOLDEN}: cannot tell:",
                                 "*cannot tell (* per logp, golden *): 3 combined standard errors reach below 0, so no "
                                 "drop could have been caught; measure with more or longer chains",
                                 "*measure with more or longer chains (and the golden the same way: run pytest with "
                                 "--jaxlog-regen)"])
    sampler(pytester, extra=', inconclusive="pass"')
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(passed=1)
    assert (pytester.path / "status.txt").read_text() == "cannot tell"
    result.stdout.fnmatch_lines(["*cannot tell; passed (inconclusive='pass')*"])

    doc["value"] = [float("nan")]  # a hostile file fails the test, naming the field
    path.write_text(json.dumps(doc))
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"E   *JaxlogError: [[]jaxlog] ESS golden {GOLDEN}: field 'value' is nan, expected "
                                 "a finite number > 0; regenerate it with --jaxlog-regen"])


@pytest.mark.parametrize("field, value, said", [
    ("value", [float("nan")], "field 'value' is nan, expected a finite number > 0"),
    ("value", [float("inf")], "field 'value' is inf, expected a finite number > 0"),
    ("value", [-0.1], "field 'value' is -0.1, expected a finite number > 0"),
    ("se", [-1.0], "field 'se' is -1.0, expected a finite number >= 0"),
    ("se", ["0.1"], "field 'se' is '0.1', expected a finite number >= 0"),
    ("se", [0.1, 0.1], "field 'se' is [0.1, 0.1], expected a list of 1 number(s)"),
    ("unit", None, "field 'unit' is None, expected a string"),
    ("shape", [0], "field 'shape' is [0], expected a list of sizes > 0"),
    ("format", "jaxlog-cost/1", "not a jaxlog-ess/1 file"),
])
def test_a_hostile_stored_rate_is_refused_naming_the_field(tmp_path, field, value, said):
    path = tmp_path / "g.ess.json"
    doc = {"format": "jaxlog-ess/1", "test": "t", "record": "x", "unit": "grad", "shape": [], "value": [0.2],
           "se": [0.01], field: value}
    path.write_text(json.dumps(doc))  # json writes NaN / Infinity, which json reads back
    with pytest.raises(jl.JaxlogError, match=re.escape(f"[jaxlog] ESS golden {path}: {said}") + ".*--jaxlog-regen"):
        ess_goldens.read(path)


def test_a_stored_element_of_nan_is_named(tmp_path):
    path = tmp_path / "g.ess.json"
    path.write_text(json.dumps({"format": "jaxlog-ess/1", "record": "x", "unit": "grad", "shape": [2, 2],
                                "value": [0.1, 0.2, 0.3, float("nan")], "se": [0.01] * 4}))
    with pytest.raises(jl.JaxlogError, match=re.escape("field 'value' element [1, 1] is nan")):
        ess_goldens.read(path)
    path.write_text("{not json")
    with pytest.raises(jl.JaxlogError, match="not readable JSON"):
        ess_goldens.read(path)


def test_the_judgement_against_the_same_arithmetic_done_plainly():
    rate = jl.EssRate("x", "grad", np.asarray(0.30), np.asarray(0.02))
    for golden, golden_se in [(0.40, 0.01), (0.36, 0.01), (0.30, 0.05), (0.10, 0.2), (0.5, 0.0)]:
        floor = golden - 3 * math.sqrt(0.02**2 + golden_se**2)
        want = "below" if 0.30 < floor else ("not below" if floor > 0 else "cannot tell")
        got = rate.judge(golden, golden_se)
        assert got.verdict == want and got.floor == pytest.approx(floor)
        assert got.detectable == pytest.approx(1 - floor / golden)
    assert rate.judge(float("nan")).verdict == "cannot tell"
    with pytest.raises(jl.JaxlogError, match="sigmas must be a finite number > 0"):
        rate.judge(0.3, sigmas=0)
    with pytest.raises(jl.JaxlogError, match="cannot tell"):
        rate.assert_not_below(0.10, 0.2)
    # a count summed with numpy is a cost
    assert float(jl.ess(np.random.default_rng(0).normal(size=64)).per(np.int64(64)).value) > 0
