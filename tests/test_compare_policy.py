"""The one policy every compared product follows (``harness.goldens.decide``): what a check does
with its stored file under each set of flags and each outcome of its comparison, and the words of
the hint that names the flag fixing a failure, over the whole table of cases; then one real pytest
session per product (trajectory, cost and ESS goldens, benchmark baselines) whose failure message
ends with the flag that fixes it."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from plugin_helpers import no_jaxlog_env  # noqa: F401  (an autouse fixture)
from pytest_jaxlog.harness import goldens
from pytest_jaxlog.harness.goldens import COST, ESS, TRAJECTORY, Flags, decide
from pytest_jaxlog.harness.options import OPTIONS

pytest_plugins = ["pytester"]

# imported before the inner runs: pytester drops modules first imported during a run
import h5py  # noqa: E402,F401
import jax  # noqa: E402,F401
import jax.numpy  # noqa: E402,F401
import numpy.fft  # noqa: E402,F401
import pytest_jaxlog.drive.run  # noqa: E402,F401
import pytest_jaxlog.drive.host.result  # noqa: E402,F401
import pytest_jaxlog.check.statistics  # noqa: E402,F401
import pytest_jaxlog.compare.baseline  # noqa: E402,F401
import pytest_jaxlog.compare.cost  # noqa: E402,F401
import pytest_jaxlog.compare.golden  # noqa: E402,F401
import pytest_jaxlog.harness.report  # noqa: E402,F401
import pytest_jaxlog.profiling.timeline  # noqa: E402,F401
import pytest_jaxlog.store.hdf5.writer  # noqa: E402,F401

RUN = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")

# The whole table, written out: flags (the session's), outcome (what the check knows of its stored
# file), then what a trajectory golden and what a cost or ESS golden does, as action/status. Cost
# and ESS goldens have no pending files: under review --jaxlog-regen still rewrites them, and a
# difference fails as it would anywhere. A regeneration that found nothing stored says
# "regenerated" for a trajectory golden and "created" for a cost or ESS golden.
TABLE = """
-                    missing  absent                absent
create               missing  create/created        create/created
regen                missing  regenerate/regenerated regenerate/created
create,regen         missing  regenerate/regenerated regenerate/created
review               missing  absent                absent
review,create        missing  create/created        create/created
review,regen         missing  regenerate/regenerated regenerate/created
review,create,regen  missing  regenerate/regenerated regenerate/created
-                    stored   compare               compare
create               stored   compare               compare
regen                stored   regenerate/regenerated regenerate/regenerated
create,regen         stored   regenerate/regenerated regenerate/regenerated
review               stored   compare               compare
review,create        stored   compare               compare
review,regen         stored   compare               regenerate/regenerated
review,create,regen  stored   compare               regenerate/regenerated
-                    same     pass/ok               pass/ok
create               same     pass/ok               pass/ok
regen                same     regenerate/regenerated regenerate/regenerated
create,regen         same     regenerate/regenerated regenerate/regenerated
review               same     pass/ok               pass/ok
review,create        same     pass/ok               pass/ok
review,regen         same     pass/ok               regenerate/regenerated
review,create,regen  same     pass/ok               regenerate/regenerated
-                    differs  fail                  fail
create               differs  fail                  fail
regen                differs  regenerate/regenerated regenerate/regenerated
create,regen         differs  regenerate/regenerated regenerate/regenerated
review               differs  pending/pending       fail
review,create        differs  pending/pending       fail
review,regen         differs  pending/pending       regenerate/regenerated
review,create,regen  differs  pending/pending       regenerate/regenerated
"""

# what each action names: the flag behind it and the failure's last line (the words users read)
NAMED = {
    "absent": ("--jaxlog-create-goldens",
               "to create it, run pytest with --jaxlog-create-goldens (missing goldens only) or --jaxlog-regen"),
    "create": ("--jaxlog-create-goldens", ""),
    "regenerate": ("--jaxlog-regen", ""),
    "compare": ("", ""),
    "pass": ("", ""),
    "fail": ("--jaxlog-regen", "run pytest with --jaxlog-regen"),
    "pending": ("--jaxlog-golden-review", "to apply it: python -m pytest_jaxlog golden accept <ID> (reject: drop "
                                          "it; --all: every pending golden)"),
}


def _rows():
    for line in TABLE.strip().splitlines():
        flags, outcome, trajectory, figures = line.split()
        on = set() if flags == "-" else set(flags.split(","))
        given = Flags(regen="regen" in on, create="create" in on, review="review" in on)
        for product, want in ((TRAJECTORY, trajectory), (COST, figures), (ESS, figures)):
            action, _, status = want.partition("/")
            yield pytest.param(product, given, outcome, action, status, id=f"{product.noun}-{flags}-{outcome}")


def test_the_table_covers_every_product_flag_and_outcome():
    seen = {(p.values[0], p.values[1], p.values[2]) for p in _rows()}
    every = {(product, Flags(regen=r, create=c, review=v), outcome)
             for product in goldens.PRODUCTS for r, c, v in itertools.product((False, True), repeat=3)
             for outcome in goldens.OUTCOMES}
    assert seen == every and len(every) == 3 * 8 * 4


@pytest.mark.parametrize(("product", "flags", "outcome", "action", "status"), list(_rows()))
def test_each_case_of_the_table(product, flags, outcome, action, status):
    decision = decide(product, flags, outcome)
    flag, hint = NAMED[action]
    assert (decision.action, decision.status, decision.flag, decision.hint) == (action, status, flag, hint)
    assert decision.writes == (action in ("create", "regenerate"))


def test_the_hints_name_the_options_tables_flags_and_a_pending_files_id():
    assert decide(COST, Flags(), "differs").hint.endswith(OPTIONS["regen"].flag_name)
    assert decide(ESS, Flags(), "missing").hint.endswith(OPTIONS["regen"].flag_name)
    assert OPTIONS["create_goldens"].flag_name in decide(TRAJECTORY, Flags(), "missing").hint
    pending = decide(TRAJECTORY, Flags(review=True), "differs")
    assert pending.accept_hint("t.test_x.h5") == ("to apply it: python -m pytest_jaxlog golden accept t.test_x.h5 "
                                                  "(reject: drop it; --all: every pending golden)")
    with pytest.raises(goldens.JaxlogError, match=r"decide\(outcome='changed'\)"):
        decide(COST, Flags(), "changed")


# -- one real session per product: its failure message ends with the flag that fixes it ---------

KEEP_MESSAGE = """
import pathlib
import pytest

@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "call" and call.excinfo is not None:  # the failure's message as the test got it
        pathlib.Path("message.txt").write_text(str(call.excinfo.value))
    return report
"""

TRAJECTORY_TEST = """
import jax.numpy as jnp

def test_decay(jaxlog):
    run = jaxlog.run(lambda x: x * {rate}, jnp.ones(4), 20, record={{"x": lambda x: x}})
    jaxlog.check_golden(run, rtol=1e-6)
"""

COST_TEST = """
import jax.numpy as jnp

def test_cost(jaxlog):
    run = jaxlog.run(lambda x: {work}, jnp.linspace(0.0, 1.0, 64), 10, record={{"mean": lambda x: x.mean()}})
    jaxlog.check_cost(run)
"""

ESS_TEST = """
import numpy as np
import pytest_jaxlog as jl

def test_rate(jaxlog):
    jaxlog.check_ess(jl.EssRate(None, "grad", np.asarray({rate}), np.asarray(0.001)))
"""

BENCHMARK_TEST = """
import jax.numpy as jnp

def test_fast(jaxlog):
    jaxlog.benchmark(lambda x: jnp.tanh(x) * 0.5, jnp.ones((32, 32)), 20, repeats=4, number=2)
"""


def _message(pytester, *args: str) -> list[str]:
    """The lines of the inner test's failure message, after a session that must fail."""
    pytester.makeconftest(KEEP_MESSAGE)
    (pytester.path / "message.txt").unlink(missing_ok=True)
    result = pytester.runpytest(*RUN, *args)
    result.assert_outcomes(failed=1)
    return (pytester.path / "message.txt").read_text().splitlines()


def test_a_trajectory_golden_that_differs_or_is_missing_ends_with_the_flag(pytester):
    pytester.makepyfile(test_t=TRAJECTORY_TEST.format(rate="0.9"))
    missing = _message(pytester)
    assert missing[0] == "[jaxlog] golden trajectory fixtures/golden/test_t.test_decay.h5 does not exist"
    assert missing[-1] == ("to create it, run pytest with --jaxlog-create-goldens (missing goldens only) or "
                           "--jaxlog-regen")
    pytester.runpytest(*RUN, "--jaxlog-create-goldens").assert_outcomes(passed=1)
    pytester.runpytest(*RUN).assert_outcomes(passed=1)

    pytester.makepyfile(test_t=TRAJECTORY_TEST.format(rate="0.8"))
    differs = _message(pytester)
    assert differs[0].startswith("[jaxlog] golden fixtures/golden/test_t.test_decay.h5 (this platform's entry)")
    assert differs[1].startswith("[jaxlog] trajectories differ: record 'x'")
    assert differs[-2] == "  plot: .jaxlog/test_t.test_decay/golden-diff.png"  # above the fix, not after it
    assert differs[-1] == ("run pytest with --jaxlog-regen to regenerate fixtures/golden/test_t.test_decay.h5 "
                           "(this platform's entry)")

    reviewed = _message(pytester, "--jaxlog-golden-review")  # --jaxlog-regen would not rewrite it either
    assert reviewed[-3] == ("golden left as it is (review: --jaxlog-golden-review is on); the obtained one is "
                            "pending as fixtures/golden/test_t.test_decay.h5.pending")
    assert reviewed[-2] == "  plot: .jaxlog/test_t.test_decay/golden-diff.png"
    assert reviewed[-1] == ("to apply it: python -m pytest_jaxlog golden accept test_t.test_decay.h5 (reject: drop "
                            "it; --all: every pending golden)")


def test_a_cost_golden_that_moved_or_is_missing_ends_with_the_flag(pytester):
    pytester.makepyfile(test_c=COST_TEST.format(work="x * 0.9 + jnp.sin(x)"))
    missing = _message(pytester)
    assert missing[0].startswith("[jaxlog] cost golden fixtures/golden/test_c.test_cost.cost.json does not exist")
    assert missing[-1].endswith("(missing goldens only) or --jaxlog-regen")
    pytester.runpytest(*RUN, "--jaxlog-create-goldens").assert_outcomes(passed=1)

    pytester.makepyfile(test_c=COST_TEST.format(work="x * 0.9 + jnp.sin(x) + jnp.sin(x + 1.0)"))
    moved = _message(pytester)
    assert moved[0].startswith("[jaxlog] compiled cost moved from cost golden "
                               "fixtures/golden/test_c.test_cost.cost.json [")
    assert "  transcendentals: stored 64, obtained 128 (x2, more)" in moved
    assert moved[-2] == "  plot: .jaxlog/test_c.test_cost/cost.png"
    assert moved[-1] == "if the change is intended, run pytest with --jaxlog-regen"
    assert (pytester.path / ".jaxlog" / "test_c.test_cost" / "cost.png").read_bytes().startswith(b"\x89PNG")


def test_an_ess_golden_fallen_below_or_missing_ends_with_the_flag(pytester):
    pytester.makepyfile(test_e=ESS_TEST.format(rate="0.5"))
    missing = _message(pytester)
    assert missing[-1].endswith("(missing goldens only) or --jaxlog-regen")
    pytester.runpytest(*RUN, "--jaxlog-create-goldens").assert_outcomes(passed=1)
    stored = json.loads((pytester.path / "fixtures/golden/test_e.test_rate.ess.json").read_text())
    assert stored["value"] == [0.5] and stored["se"] == [0.001]

    pytester.makepyfile(test_e=ESS_TEST.format(rate="0.1"))
    below = _message(pytester)
    assert below[0] == "[jaxlog] ESS rate of the draws fell below ESS golden fixtures/golden/test_e.test_rate.ess.json:"
    assert below[-1] == "if the sampler was made slower on purpose, run pytest with --jaxlog-regen"


def test_a_benchmark_slower_than_its_baseline_ends_with_the_flag(pytester):
    pytester.makepyfile(test_b=BENCHMARK_TEST)
    pytester.runpytest(*RUN, "--jaxlog-benchmark-storage=store", "--jaxlog-benchmark-save=base").assert_outcomes(
        passed=1)
    [saved] = sorted((pytester.path / "store").glob("*/0001_base.json"))
    doc = json.loads(saved.read_text())
    for b in doc["tests"]["test_b.py::test_fast"]["benchmarks"]:  # the saved run 10,000 times faster
        b["samples"] = [[t / 1e4 for t in rep] for rep in b["samples"]]
    saved.write_text(json.dumps(doc))

    slower = _message(pytester, "--jaxlog-benchmark-storage=store", "--jaxlog-benchmark-compare=base",
                      "--jaxlog-benchmark-compare-fail=50")
    assert slower[-1].startswith("[jaxlog] benchmark 'benchmark' of test_b.py::test_fast is slower than saved run "
                                 "0001_base: ")
    assert slower[-1].endswith("If the slow-down is intended, save a new baseline: --jaxlog-benchmark-save=NAME")
    assert Path(saved).exists()  # comparing never rewrites the saved run
