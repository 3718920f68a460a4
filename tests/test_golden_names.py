"""Golden and artifact names: unique per test and per ``check_golden(name=...)``, stable, and short enough for
any file system (long ones end with a hash)."""

from __future__ import annotations

import itertools

from pytest_jaxlog.compare.golden import golden_name
from pytest_jaxlog.harness.fixture import file_stem


def test_name_separator_keeps_test_and_name_apart():
    assert golden_name("t.py::test_f[a]", name="b") == "t.test_f-a--b.h5"
    assert golden_name("t.py::test_f[a-b]") == "t.test_f-a-b.h5"
    assert golden_name("t.py::test_f", name="a-b") != golden_name("t.py::test_f[a]", name="b")
    assert golden_name("t.py::test_f[a]") != golden_name("t.py::test_f", name="a")
    # a test part that could be read as "<test>--<name>" is hashed
    assert golden_name("t.py::test_f[a--b]") != golden_name("t.py::test_f[a]", name="b")
    assert golden_name("t.py::test_f[a-]", name="b") != golden_name("t.py::test_f[a]", name="-b")
    # unchanged for tests without a name (existing goldens keep their files)
    assert golden_name("examples/test_lj.py::test_lj_golden") == "examples.test_lj.test_lj_golden.h5"


def test_names_are_unique_over_many_tricky_pairs():
    ids = ["t.py::test_f", "t.py::test_f[a]", "t.py::test_f[a-b]", "t.py::test_f[a--b]", "t.py::test_f[a-]",
           "t.py::test_f[-b]", "t.py::test_f[a b]", "t.py::test_f[a_b]", "t.py::C::test_f", "t/D.py::test_f"]
    names = [None, "b", "a-b", "-b", "b-", "x" * 300, "x" * 299 + "y", "a b", "a_b"]
    pairs = list(itertools.product(ids, names))
    files = [golden_name(i, name=n) for i, n in pairs]
    assert len(set(files)) == len(pairs)
    assert all(len(f) <= 123 for f in files)  # 120 characters and ".h5"


def test_long_names_are_shortened_deterministically_with_a_hash():
    long = golden_name("t.py::test_f", name="n" * 300)
    assert long == golden_name("t.py::test_f", name="n" * 300)  # stable
    stem = long[:-3]
    assert len(stem) == 119 and stem.startswith("t.test_f--nnn") and len(stem.rsplit("-", 1)[1]) == 8
    assert golden_name("t.py::test_" + "x" * 300, name="n") != golden_name("t.py::test_" + "x" * 300, name="m")
    assert file_stem("r" * 50) == "r" * 50
    assert file_stem("r" * 300) == file_stem("r" * 300) != file_stem("r" * 299 + "s")
    assert len(file_stem("r" * 300)) == 91
