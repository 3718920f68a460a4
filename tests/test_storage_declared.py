"""What a file declares is read within bounds and checked before use: each hostile file gives
one ``JaxlogError`` (never a MemoryError, RecursionError or a traceback from JAX). Files are
really written, then tampered with h5py or written as bytes."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.profiling import trace as trace_mod

REPO = Path(__file__).resolve().parents[1]
CKPT = "jaxlog/attachments/checkpoint"


def _step(s):
    return {"x": s["x"] + 1.0, "k": jax.random.split(s["k"])[0]}


S0 = {"x": jnp.float32(0), "k": jax.random.key(0)}


def _write(path):
    jl.run(_step, S0, 4, record={"x": lambda s: s["x"]}, sinks=[jl.HDF5Writer(path)], checkpoint=jl.every(2),
           progress=False)
    return path


def _declare_billion_rows(path):
    """Replace the record's datasets by unchunked ones declaring 10**9 rows, none stored."""
    with h5py.File(path, "r+") as f:
        g = f["observables/x"]
        for name in list(g):
            dtype, attrs = g[name].dtype, dict(g[name].attrs)
            del g[name]
            ds = g.create_dataset(name, shape=(10**9,), dtype=dtype)
            for k, v in attrs.items():
                ds.attrs[k] = v


def test_a_record_declaring_a_billion_unstored_rows_is_one_error_in_load_and_the_cli(tmp_path):
    path = _write(tmp_path / "t.h5")
    _declare_billion_rows(path)
    traj = jl.load(path)
    for read in (lambda: traj.steps("x"), lambda: traj["x"]):
        with pytest.raises(jl.JaxlogError, match=r"declares 1000000000 frames .* stores 0 bytes"):
            read()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for args in (["info", str(path)], ["diff", str(path), str(path)]):
        r = subprocess.run([sys.executable, "-m", "pytest_jaxlog", *args], capture_output=True, text=True, env=env,
                           timeout=300)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.splitlines()) == 1 and "declares 1000000000 frames" in r.stderr


def test_a_bogus_key_impl_is_one_error(tmp_path):
    path = _write(tmp_path / "t.h5")
    with h5py.File(path, "r+") as f:
        f[f"{CKPT}/2/state/k"].attrs["jaxlog_key_impl"] = np.bytes_(b"no-such-impl")
    with pytest.raises(jl.JaxlogError, match=r"impl 'no-such-impl'.* cannot be read as keys"):
        jl.resume(path, _step, 4, from_step=2, record={"x": lambda s: s["x"]}, checkpoint=jl.every(2), progress=False)
    with pytest.raises(jl.JaxlogError, match=r"cannot be read as keys"):
        jl.load(path).state(2, like=S0)


@pytest.mark.parametrize("meta", [
    {"schema": [1, 2]},  # not a dict
    {"treedef": 5},
    {"step": "two"},
    "deep",  # nested past the JSON parser's recursion limit
    [1, 2, 3],
])
def test_a_malformed_checkpoint_entry_is_one_error(tmp_path, meta):
    path = _write(tmp_path / "t.h5")
    with h5py.File(path, "r+") as f:
        ds = f[f"{CKPT}/2/jaxlog_checkpoint"]
        if meta == "deep":
            text = "[" * 100_000 + "]" * 100_000
        elif isinstance(meta, dict):
            doc = json.loads(bytes(ds[()]).decode())
            doc.update(meta)
            text = json.dumps(doc)
        else:
            text = json.dumps(meta)
        del f[f"{CKPT}/2/jaxlog_checkpoint"]
        f[f"{CKPT}/2/jaxlog_checkpoint"] = np.frombuffer(text.encode(), dtype=np.uint8)
    with pytest.raises(jl.JaxlogError, match="jaxlog_checkpoint entry is not valid"):
        jl.resume(path, _step, 4, from_step=2, record={"x": lambda s: s["x"]}, checkpoint=jl.every(2), progress=False)


HOSTILE_TRACES = {
    "truncated.json.gz": gzip.compress(b'{"traceEvents": []}')[:-6],
    "badgz.json.gz": b"\x1f\x8b" + os.urandom(64),
    "deep.json": b"[" * 100_000 + b"]" * 100_000,
    "events-int.json": b'{"traceEvents": 5}',
    "event-strs.json": b'{"traceEvents": ["a", "b"]}',
    "ts-str.json": b'{"traceEvents": [{"ph": "X", "name": "a", "ts": "x", "dur": "y", "pid": 1, "tid": 1}]}',
    "list-top.json": b'[1, 2, 3]',
    "null-fields.json": b'{"traceEvents": [{"ph": null, "name": null, "ts": null, "args": 3}]}',
    "pftrace-garbage.pftrace": os.urandom(256),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_TRACES))
def test_a_hostile_trace_file_is_one_error_or_reads(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(HOSTILE_TRACES[name])
    try:
        jl.load_trace(path)
    except jl.JaxlogError as exc:
        assert str(path) in str(exc)


def test_a_trace_inflating_past_the_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_mod, "MAX_TRACE_BYTES", 1 << 16)
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (1 << 20) + b"]}"))
    with pytest.raises(jl.JaxlogError, match="inflates to over 65536 bytes"):
        jl.load_trace(path)
