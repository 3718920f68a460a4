"""Shared builders for the storage tests: schemas, frames in batches, bitwise comparison."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from pytest_jaxlog.record.frames import Frames, LeafSpec, Schema
from pytest_jaxlog.record.schedule import every

DTYPES = [
    np.dtype(np.bool_),
    np.dtype(np.int8),
    np.dtype(np.int16),
    np.dtype(np.int32),
    np.dtype(np.int64),
    np.dtype(np.uint8),
    np.dtype(np.uint16),
    np.dtype(np.uint32),
    np.dtype(np.uint64),
    np.dtype(np.float16),
    np.dtype(np.float32),
    np.dtype(np.float64),
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(np.complex64),
    np.dtype(np.complex128),
]


def random_values(rng: np.random.Generator, n: int, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """Arbitrary bit patterns (NaNs, infs, subnormals included); bools stay 0/1."""
    full = (n, *shape)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=full).astype(np.bool_)
    raw = rng.integers(0, 256, size=int(np.prod(full)) * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(full)


def batches(schema: Schema, n_steps: int, cuts: list[int], rng: np.random.Generator):
    """Frames for steps 0..n_steps split at ``cuts``, plus the expected (steps, values) per leaf."""
    bounds = sorted({c for c in cuts if 0 < c <= n_steps})
    edges = [0, *bounds, n_steps + 1]
    expected = {leaf.path: ([], []) for leaf in schema.leaves}
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        fr = Frames()
        for leaf in schema.leaves:
            steps = leaf.schedule.steps_between(lo, hi - 1)
            values = random_values(rng, len(steps), leaf.shape, leaf.dtype)
            fr.add(leaf.path, steps, values)
            expected[leaf.path][0].append(steps)
            expected[leaf.path][1].append(values)
        out.append(fr)
    exp = {p: (np.concatenate(s), np.concatenate(v)) for p, (s, v) in expected.items()}
    return out, exp


def assert_bitwise(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    a = np.ascontiguousarray(actual).view(np.uint8)
    b = np.ascontiguousarray(expected).view(np.uint8)
    assert np.array_equal(a, b)


def simple_schema(shape=(3,), dtype=np.float64, dt=None, batched=False, extra=()) -> Schema:
    leaves = [LeafSpec("energy", "energy", (shape[0],) if batched else (), np.dtype(np.float64), every(1)),
              LeafSpec("state/x", "state", shape, np.dtype(dtype), every(1)), *extra]
    return Schema(tuple(leaves), batched=batched, dt=dt)


def frames_for(schema: Schema, lo: int, hi: int, seed: int = 0) -> Frames:
    rng = np.random.default_rng(seed + lo)
    fr = Frames()
    for leaf in schema.leaves:
        steps = leaf.schedule.steps_between(lo, hi)
        if leaf.dtype.kind == "f":
            values = rng.standard_normal((len(steps), *leaf.shape)).astype(leaf.dtype)
        else:
            values = random_values(rng, len(steps), leaf.shape, leaf.dtype)
        fr.add(leaf.path, steps, values)
    return fr
