"""Reading files built to attack or confuse the reader: nothing outside the file is read, and
every malformed file is one ``JaxlogError`` naming the file and the problem (also from the CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from storage_helpers import frames_for, simple_schema

import pytest_jaxlog as jl
from pytest_jaxlog.store.hdf5.writer import HDF5Writer

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
SECRET = b"root:x:0:0:secret-bytes-outside-the-file\n" * 4


@pytest.fixture
def good(tmp_path) -> Path:
    path = tmp_path / "good.h5"
    schema = simple_schema(shape=(4,), dtype=np.uint8)
    w = HDF5Writer(path)
    w.open(schema, {})
    w.write(frames_for(schema, 0, 9))
    w.attach("postmortem", 9, {"state/x": np.arange(4, dtype=np.uint8)})
    w.close("complete", steps_done=9)
    return path


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "secret.txt"  # stands for /etc/passwd: bytes no trajectory may return
    path.write_bytes(SECRET)
    return path


def hostile(good: Path, name: str, edit) -> Path:
    path = good.with_name(name)
    path.write_bytes(good.read_bytes())
    with h5py.File(path, "r+") as f:
        edit(f)
    return path


def cli(*args):
    return subprocess.run([sys.executable, "-m", "pytest_jaxlog", *map(str, args)], capture_output=True, text=True,
                          env=ENV, timeout=120)


def assert_refused(path: Path, match: str, read=lambda t: t["state/x"]):
    """Refused by ``jl.load`` or by the read, with a message naming the file and ``match``."""
    with pytest.raises(jl.JaxlogError) as info:
        read(jl.load(path))
    msg = str(info.value)
    assert str(path) in msg and match in msg, msg
    assert SECRET[:20].decode() not in msg
    return msg


def _external_value(f, target):
    del f["observables/state/x/value"]
    f.create_dataset("observables/state/x/value", shape=(10, 4), dtype=np.uint8, external=[(str(target), 0, 40)])


def test_external_link_is_not_followed(good, secret, tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["value"] = np.frombuffer(SECRET[:40], np.uint8).reshape(10, 4)

    def link(f):
        del f["observables/state/x/value"]
        f["observables/state/x/value"] = h5py.ExternalLink(str(other), "/value")

    path = hostile(good, "elink.h5", link)
    with h5py.File(path, "r") as f:  # what h5py does: reads the other file
        assert f["observables/state/x/value"][()].tobytes() == SECRET[:40]
    assert_refused(path, "/observables/state/x/value is an external link to '/value' in file")
    whole = hostile(good, "elink-group.h5", lambda f: (f.__delitem__("observables"),
                                                       f.__setitem__("observables", h5py.ExternalLink(str(other), "/"))))
    assert_refused(whole, "/observables is an external link")


def test_external_raw_storage_is_not_read(good, secret):
    path = hostile(good, "external.h5", lambda f: _external_value(f, secret))
    with h5py.File(path, "r") as f:  # what h5py does: hands back the other file's bytes
        assert f["observables/state/x/value"][()].tobytes() == SECRET[:40]
    msg = assert_refused(path, "/observables/state/x/value keeps its data in external file")
    assert str(secret) in msg
    etc = hostile(good, "passwd.h5", lambda f: _external_value(f, "/etc/passwd"))
    assert_refused(etc, "external file '/etc/passwd'")


def test_virtual_dataset_is_not_assembled(good, tmp_path):
    other = tmp_path / "vsrc.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.frombuffer(SECRET[:40], np.uint8).reshape(10, 4)

    def vds(f):
        del f["observables/state/x/value"]
        layout = h5py.VirtualLayout(shape=(10, 4), dtype=np.uint8)
        layout[...] = h5py.VirtualSource(str(other), "x", shape=(10, 4))
        f.create_virtual_dataset("observables/state/x/value", layout)

    path = hostile(good, "vds.h5", vds)
    with h5py.File(path, "r") as f:
        assert f["observables/state/x/value"][()].tobytes() == SECRET[:40]
    assert_refused(path, "/observables/state/x/value is a virtual dataset")


def test_soft_links_and_attachments_outside_the_file_are_refused(good, secret, tmp_path):
    soft = hostile(good, "soft.h5", lambda f: (f.__delitem__("observables/state/x/value"),
                                               f.__setitem__("observables/state/x/value", h5py.SoftLink("/ext"))))
    assert_refused(soft, "/observables/state/x/value is a soft link to '/ext'")

    def attach(f):
        del f["jaxlog/attachments/postmortem/9/state/x"]
        f.create_dataset("jaxlog/attachments/postmortem/9/state/x", shape=(4,), dtype=np.uint8,
                         external=[(str(secret), 0, 4)])

    path = hostile(good, "attach.h5", attach)
    traj = jl.load(path)  # the records are fine; the attachment is refused when read
    np.testing.assert_array_equal(traj.steps("state/x"), np.arange(10))
    assert_refused(path, "/jaxlog/attachments/postmortem/9/state/x keeps its data in external file",
                   read=lambda t: t.postmortem)


def test_a_file_replaced_after_load_is_checked_again_when_read(good, secret):
    traj = jl.load(good)
    bad = hostile(good, "bad.h5", lambda f: _external_value(f, secret))
    os.replace(bad, good)  # another run (or someone) swaps the file between load and read
    with pytest.raises(jl.JaxlogError, match="keeps its data in external file"):
        traj["state/x"]


def test_cli_refuses_hostile_files_with_exit_2(good, secret):
    path = hostile(good, "external.h5", lambda f: _external_value(f, secret))
    for args in (("info", path), ("diff", path, good), ("diff", good, path)):
        r = cli(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert r.stderr.startswith("[jaxlog] ") and "external file" in r.stderr
        assert SECRET[:20].decode() not in r.stdout + r.stderr


# -- malformed files: one clear error each, never KeyError/TypeError/RecursionError/OverflowError --------

def _set(attr, value, keep_crc=False):
    def edit(f):
        f["jaxlog"].attrs[attr] = value
        if not keep_crc and "json_crc32" in f["jaxlog"].attrs:
            del f["jaxlog"].attrs["json_crc32"]  # a deliberate edit, not damage
    return edit


def _schema(change):
    def edit(f):
        schema = json.loads(f["jaxlog"].attrs["schema"])
        change(schema)
        f["jaxlog"].attrs["schema"] = json.dumps(schema)
        del f["jaxlog"].attrs["json_crc32"]
    return edit


@pytest.mark.parametrize("edit, match", [
    (_set("schema", "[" * 100_000 + "]" * 100_000), "attribute 'schema' is not JSON"),  # was RecursionError
    (_set("steps_done", "1e999"), "attribute 'steps_done' is inf, not a step number"),  # was OverflowError
    (_set("status", "5"), "attribute 'status' is 5; expected one of running"),
    (_set("violation", "[1, 2]"), "attribute 'violation' must be an object or null"),
    (_set("format_version", "\"1\""), "attribute 'format_version' is '1', not a version number"),
    (_set("schema", np.arange(3)), "attribute 'schema' of /jaxlog is not a string"),
    (_set("meta", b"\xff\xfe"), "/jaxlog attribute 'meta' is not JSON"),
    (_set("status", "\"stopped\"", keep_crc=True), None),  # status is not under the checksum: loads
    (_set("schema", json.dumps({"leaves": []}), keep_crc=True), "do not match their checksum"),
    (_schema(lambda s: s["leaves"][0].pop("dtype")), "leaf 0 ('energy'): dtype None is not a dtype name"),  # KeyError
    (_schema(lambda s: s["leaves"][1].update(shape=[4, -1])), "shape [4, -1] is not a list of sizes"),
    (_schema(lambda s: s["leaves"][1].update(shape=7)), "shape 7 is not a list of sizes"),  # TypeError
    (_schema(lambda s: s["leaves"][1].update(dtype="object")), "cannot be recorded"),
    (_schema(lambda s: s["leaves"][1].update(dtype="__class__")), "unknown dtype '__class__'"),
    (_schema(lambda s: s["leaves"][1].update(path="../x")), "record path '../x' is not a/b/c names"),
    (_schema(lambda s: s["leaves"][1].update(schedule={"kind": ["every"]})), "unknown schedule kind"),
    (_schema(lambda s: s["leaves"][1].update(schedule={"kind": "every", "n": 0})), "every(n) needs an integer n >= 1"),
    (_schema(lambda s: s.update(dt="fast")), "'dt' must be a finite number or null"),
    (_schema(lambda s: s["leaves"][1].update(shape=[5])), "/observables/state/x/value has shape (10, 4); the schema "
                                                          "says frames of shape (5,)"),
    (_schema(lambda s: s["leaves"][1].update(dtype="float32")), "/observables/state/x/value has dtype uint8"),
    (lambda f: _replace(f, "observables/energy/step", np.zeros((10, 2), np.int64)),
     "/observables/energy/step has shape (10, 2)"),
    (lambda f: _replace(f, "observables/state/x/value", np.zeros(10, dtype=[("a", "u1"), ("b", "u1")])),
     "/observables/state/x/value has shape (10,)"),
    (lambda f: _replace(f, "observables/energy/value", np.array([b"abc"] * 10)), "has dtype |S3"),
    (lambda f: f["observables/state/x/value"].attrs.__setitem__("jaxlog_dtype", "bfloat16"),
     "/observables/state/x/value is marked as bfloat16"),
])
def test_malformed_files_are_one_jaxlog_error(good, edit, match):
    path = hostile(good, "bad.h5", edit)
    if match is None:
        assert jl.load(path).status == "stopped"
        return
    msg = assert_refused(path, match, read=lambda t: [t[p] for p in t.records])
    assert msg.startswith("[jaxlog] ") and "\n" not in msg


def _replace(f, name, data):
    del f[name]
    f[name] = data


def _chunk(path: Path, name: str):
    with h5py.File(path, "r") as f:
        found = []
        f[name].id.chunk_iter(found.append)
        return found[0]


def test_a_flipped_bit_in_data_is_an_error_not_a_wrong_value(good):
    info = _chunk(good, "observables/state/x/value")
    for flip_at in (0, info.size // 2, info.size - 5):  # into the data, never into the checksum itself
        path = good.with_name(f"flip{flip_at}.h5")
        data = bytearray(good.read_bytes())
        data[info.byte_offset + flip_at] ^= 0x10
        path.write_bytes(bytes(data))
        traj = jl.load(path)  # the metadata is intact
        np.testing.assert_array_equal(traj.steps("state/x"), np.arange(10))
        with pytest.raises(jl.JaxlogError, match=r"reading record 'state/x' \(value\) failed: the file is damaged"):
            traj["state/x"]
        r = cli("diff", path, good)
        assert r.returncode == 2 and "the file is damaged" in r.stderr and "Traceback" not in r.stderr


def test_a_damaged_chunk_index_is_an_error(good):
    """Version 1 B-trees (this file format's chunk index) have no checksum: a damaged key must not
    make the chunk skip its checksum filter, nor point outside the file."""
    info = _chunk(good, "observables/state/x/value")
    data = good.read_bytes()
    # a B-tree key: chunk size (4 bytes), filter mask (4 bytes), chunk offsets; then the chunk address
    key = info.size.to_bytes(4, "little") + (0).to_bytes(4, "little")
    for field, patch, match in (("mask", (1).to_bytes(4, "little"), "is marked as skipping filters"),
                                ("address", (1 << 40).to_bytes(8, "little"), "lies outside the file")):
        path = good.with_name(f"btree-{field}.h5")
        at = data.find(key)
        while at >= 0:  # the occurrence that is the B-tree key of this chunk
            b = bytearray(data)
            if field == "mask":  # the filters skipped, and a flipped bit in the data
                b[at + 4:at + 8] = patch
                b[info.byte_offset + 3] ^= 0x10
            else:
                addr = data.find(info.byte_offset.to_bytes(8, "little"), at)
                b[addr:addr + 8] = patch
            path.write_bytes(bytes(b))
            with h5py.File(path, "r") as f:
                changed = f["observables/state/x/value"].id.get_chunk_info(0)
            if (changed.filter_mask, changed.byte_offset) != (info.filter_mask, info.byte_offset):
                break
            at = data.find(key, at + 1)
        assert at >= 0
        with h5py.File(path, "r") as f:  # plain h5py: a wrong value, or a raw OSError
            try:
                raw = f["observables/state/x/value"][()].tobytes()
            except OSError:
                raw = None
        assert raw != jl.load(good)["state/x"].tobytes()
        assert_refused(path, match)
