"""A multi-process index of many blocks reads in time linear in its blocks, and what it may
declare is bounded. Counted, not timed: the tiling check touches the list of blocks a fixed
number of times (the pairwise check it replaces sliced it once per block)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.store.hdf5 import parts

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from index_blocks import make  # noqa: E402  (the benchmark's own index builder)


class CountingList(list):
    touched = 0

    def __iter__(self):
        CountingList.touched += 1
        return super().__iter__()

    def __getitem__(self, i):
        CountingList.touched += 1
        return super().__getitem__(i)


def _grid(rows, cols, size=3):
    return [((r * size, (r + 1) * size), (c * size, (c + 1) * size)) for r in range(rows) for c in range(cols)]


def test_the_tiling_check_touches_the_blocks_a_fixed_number_of_times():
    for rows, cols in ((10, 10), (100, 100), (250, 200)):
        CountingList.touched = 0
        parts._check_tiling(Path("i.h5"), "x", (3 * rows, 3 * cols), CountingList(_grid(rows, cols)))
        assert CountingList.touched <= 6, (rows * cols, CountingList.touched)


@pytest.mark.parametrize("change, match", [
    (lambda b: b[:-1], "do not add up"),
    (lambda b: [((0, 3), (0, 6)), *b[1:-1]], "overlap"),  # the volumes add up, one block covers two
    (lambda b: [*b, ((0, 0), (0, 3))], None),  # an empty block covers nothing: fine
    (lambda b: [((-3, 0), (0, 3)), *b[1:]], "does not fit"),
])
def test_overlaps_gaps_and_strays_are_refused(change, match):
    blocks = change(_grid(10, 10))
    if match is None:
        parts._check_tiling(Path("i.h5"), "x", (30, 30), blocks)
        return
    with pytest.raises(jl.JaxlogError, match=match):
        parts._check_tiling(Path("i.h5"), "x", (30, 30), blocks)


def test_an_index_declaring_too_many_blocks_or_cells_is_refused(monkeypatch):
    monkeypatch.setattr(parts, "MAX_BLOCKS", 50)
    with pytest.raises(jl.JaxlogError, match="100 blocks, more than the 50"):
        parts._check_tiling(Path("i.h5"), "x", (30, 30), _grid(10, 10))
    monkeypatch.setattr(parts, "MAX_BLOCKS", 1 << 16)
    monkeypatch.setattr(parts, "MAX_GRID_CELLS", 99)
    with pytest.raises(jl.JaxlogError, match="100 cells"):
        parts._check_tiling(Path("i.h5"), "x", (30, 30), _grid(10, 10))


def test_an_index_of_hundreds_of_blocks_reads_back_every_value(tmp_path):
    n = 300
    make(str(tmp_path / "t.h5"), n)
    traj = jl.load(tmp_path / "t.h5")
    np.testing.assert_array_equal(traj["x"], np.arange(2 * n, dtype=np.float32).reshape(2, n))
    np.testing.assert_array_equal(traj.steps("x"), [0, 1])
