"""Links planted at the names a writer makes beside its path never lead it to write elsewhere.

A symbolic or hard link at the lock file's name (``.<name>.jaxlog-lock``), or at the temporary
names of the manifest, must leave the file it points to byte for byte as it was.
"""

from __future__ import annotations

import os

import jax.numpy as jnp
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.store import manifest
from pytest_jaxlog.store.hdf5.guards import lock_path

PRECIOUS = b"precious bytes that no run may overwrite\n" * 10


def _run(path):
    return jl.run(lambda s: s + 1.0, jnp.float32(0), 5, record={"x": lambda s: s}, sinks=[jl.HDF5Writer(path)])


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "dangling"])
def test_a_link_planted_at_the_lock_file_is_not_written_through(tmp_path, kind):
    target = tmp_path / "precious.txt"
    target.write_bytes(PRECIOUS)
    path = tmp_path / "t.h5"
    lock = lock_path(path)
    if kind == "symlink":
        lock.symlink_to(target)
    elif kind == "hardlink":
        os.link(target, lock)
    else:
        lock.symlink_to(tmp_path / "made-through-the-link")
    _run(path)
    assert target.read_bytes() == PRECIOUS
    assert not (tmp_path / "made-through-the-link").exists()
    assert not os.path.lexists(lock)  # released: the name is free again, the link gone with it
    traj = jl.load(path)
    assert traj.status == "complete" and list(traj.steps("x")) == [0, 1, 2, 3, 4, 5]


def test_a_fifo_at_the_lock_file_is_refused_without_blocking(tmp_path):
    path = tmp_path / "t.h5"
    os.mkfifo(lock_path(path))
    with pytest.raises(jl.WriterError, match="jaxlog-lock is not a regular file"):
        _run(path)
    assert not path.exists()


def test_links_at_the_manifest_temporary_names_are_not_written_through(tmp_path, monkeypatch):
    target = tmp_path / "precious.txt"
    target.write_bytes(PRECIOUS)
    tokens = iter(["0000aaaa", "0000bbbb"])
    monkeypatch.setattr(manifest.secrets, "token_hex", lambda n: next(tokens))
    planted = tmp_path / f".manifest-{os.getpid()}-0000aaaa.json"
    planted.symlink_to(target)
    manifest.write(tmp_path, {"tests": []})  # the name is taken: the next one is used
    assert target.read_bytes() == PRECIOUS and planted.is_symlink()
    assert manifest.read(tmp_path / manifest.NAME) == {"tests": []}
