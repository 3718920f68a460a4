"""The example heat golden keeps an entry for the oldest supported jax (its reference entry, 0.10)
and one for the newest (0.12, beside it): each leg of the dependency matrix (.ci/matrix) compares
the example with its own jax's entry, never with the other's at a loosened tolerance."""

from pathlib import Path

import jax
import pytest

from pytest_jaxlog.compare import golden_files as golden_entries, golden_files as golden_info
from pytest_jaxlog.store.hdf5.layout import provenance

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures/golden/examples.test_heat.test_heat_golden.h5"


def test_the_example_golden_holds_the_oldest_and_newest_jax():
    entries = golden_entries.entries(GOLDEN)
    assert [e.reference for e in entries] == [True, False]
    assert [e.made["jax"].split(".")[:2] for e in entries] == [["0", "10"], ["0", "12"]]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the example goldens hold CPU entries")
def test_this_legs_jax_has_its_own_entry():
    choice = golden_entries.choose(GOLDEN, golden_info.platform(provenance()))
    assert choice.mine is not None, f"no entry of {GOLDEN.name} for jax {jax.__version__}"
    assert choice.mine.made["jax"].split(".")[:2] == jax.__version__.split(".")[:2]
