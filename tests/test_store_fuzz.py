"""Hostile and broken trajectory files: a clean ``JaxlogError`` or a correct load, nothing else.

A seeded generator makes a few hundred files from real trajectories: truncations, random bytes,
tampered /jaxlog attributes and schema JSON, links (soft, external, cycles), external storage
and virtual datasets, wrong shapes and dtypes. Each is loaded and read completely in a child
process (a crash or a hang fails the test instead of the suite); then the CLI runs over a sample.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import ml_dtypes
import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.record.frames import Frames, LeafSpec, Schema
from pytest_jaxlog.record.schedule import every, window

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
GUARD_S = 300  # a hang guard for the whole child, not a performance threshold
SEED = 20240611


def write_base(path: Path, *, compression=None) -> dict:
    """A real trajectory with every kind of content the reader handles; returns its values."""
    schema = Schema((LeafSpec("energy", "energy", (), np.dtype(np.float64), every(1)),
                     LeafSpec("state/x", "state", (4, 3), np.dtype(np.float32), every(2)),
                     LeafSpec("state/v", "state", (4, 3), np.dtype(np.float32), every(2)),
                     LeafSpec("bf", "bf", (2,), np.dtype(ml_dtypes.bfloat16), window(3, 20, 3)),
                     LeafSpec("key", "key", (2,), np.dtype(np.uint32), every(5), "threefry2x32")), dt=0.5)
    rng = np.random.default_rng(0)
    fr = Frames()
    expected = {}
    for leaf in schema.leaves:
        steps = leaf.schedule.steps_between(0, 20)
        if leaf.dtype == np.uint32:
            values = rng.integers(0, 2**32, size=(len(steps), *leaf.shape), dtype=np.uint32)
        else:
            values = rng.standard_normal((len(steps), *leaf.shape)).astype(leaf.dtype)
        fr.add(leaf.path, steps, values)
        expected[leaf.path] = (steps, values)
    w = jl.HDF5Writer(path, compression=compression)
    w.open(schema, {"run": {"steps": 20}, "provenance": {"jax": "0"}})
    w.write(fr)
    w.attach("postmortem", 20, {"state/x": expected["state/x"][1][-1], "note": np.arange(3)})
    w.close("violated", steps_done=20, violation={"invariant": "finite", "step": 20, "message": "[jaxlog] x"})
    return expected


# -- mutations: each takes (rng, src bytes path, dst path, scratch dir) and writes dst ----------------

def m_truncate(rng, src, dst, tmp):
    data = src.read_bytes()
    dst.write_bytes(data[: int(rng.integers(0, len(data)))])


def m_random_bytes(rng, src, dst, tmp):
    data = bytearray(src.read_bytes())
    for _ in range(int(rng.integers(1, 6))):
        at = int(rng.integers(0, len(data)))
        n = int(rng.integers(1, 16))
        data[at:at + n] = rng.integers(0, 256, size=len(data[at:at + n]), dtype=np.uint8).tobytes()
    dst.write_bytes(bytes(data))


def m_bit_flip(rng, src, dst, tmp):
    data = bytearray(src.read_bytes())
    at = int(rng.integers(0, len(data)))
    data[at] ^= 1 << int(rng.integers(0, 8))
    dst.write_bytes(bytes(data))


def m_junk(rng, src, dst, tmp):
    n = int(rng.integers(0, 4096))
    head = b"\x89HDF\r\n\x1a\n" if rng.integers(0, 2) else b""
    dst.write_bytes(head + rng.integers(0, 256, size=n, dtype=np.uint8).tobytes())


def _deep(n):
    return "[" * n + "]" * n


BAD_JSON = ["", "{", "null", "5", "-1", "1e999", "NaN", '"x"', "[]", "{}", "true", _deep(100_000),
            "9" * 5000, '{"a": ' * 2000 + "1" + "}" * 2000, "\"\\ud800\"", json.dumps([1] * 1000)]


def m_attr(rng, src, dst, tmp):
    """One /jaxlog attribute replaced by bad JSON, a non-string, or removed."""
    dst.write_bytes(src.read_bytes())
    keys = ["format_version", "schema", "status", "steps_done", "violation", "provenance", "meta", "writer_error"]
    key = keys[int(rng.integers(0, len(keys)))]
    with h5py.File(dst, "r+") as f:
        attrs = f["jaxlog"].attrs
        choice = int(rng.integers(0, 7))
        if choice == 0:
            del attrs[key]
        elif choice == 1:
            attrs[key] = np.arange(int(rng.integers(1, 4)))
        elif choice == 2:
            attrs[key] = np.float64(rng.standard_normal())
        elif choice == 3:
            attrs[key] = np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")])
        elif choice == 4:
            attrs[key] = b"\xff\xfe not utf-8"
        else:
            attrs[key] = BAD_JSON[int(rng.integers(0, len(BAD_JSON)))]
        if "json_crc32" in attrs and rng.integers(0, 2):  # half keep a consistent checksum
            del attrs["json_crc32"]


def _mutate_json(rng, value, depth=0):
    """A random edit somewhere inside a JSON value."""
    if isinstance(value, dict) and value and depth < 6:
        key = list(value)[int(rng.integers(0, len(value)))]
        value = dict(value)
        if rng.integers(0, 5) == 0:
            del value[key]
        else:
            value[key] = _mutate_json(rng, value[key], depth + 1)
        return value
    if isinstance(value, list) and value and depth < 6 and rng.integers(0, 4):
        value = list(value)
        i = int(rng.integers(0, len(value)))
        value[i] = _mutate_json(rng, value[i], depth + 1)
        return value
    options = [None, -1, 0, 2**70, 1.5, float("inf"), "x", "", "..", "/etc/passwd", "a//b", [], {}, True,
               [1, -2], [2**41], list(range(40)), "object", "U3", "float64,int8", "__class__", "bfloat16",
               {"kind": "every", "n": 0}, {"kind": "at", "steps": []}, {"kind": "window", "start": 5, "stop": 1},
               {"kind": "nope"}, {"kind": "at", "steps": "abc"}]
    return options[int(rng.integers(0, len(options)))]


def m_schema(rng, src, dst, tmp):
    dst.write_bytes(src.read_bytes())
    with h5py.File(dst, "r+") as f:
        attrs = f["jaxlog"].attrs
        schema = json.loads(attrs["schema"])
        attrs["schema"] = json.dumps(_mutate_json(rng, schema), allow_nan=True)
        if "json_crc32" in attrs:
            del attrs["json_crc32"]  # a consistent tampering, not a damaged file


def m_link(rng, src, dst, tmp):
    """An object the reader touches replaced by a soft/external link, or a link cycle."""
    dst.write_bytes(src.read_bytes())
    sibling = tmp / "sibling.h5"
    if not sibling.exists():
        with h5py.File(sibling, "w") as s:
            s["data"] = np.full((11, 4, 3), 7.0, np.float32)
            s.create_group("g")["value"] = np.full((11, 4, 3), 7.0, np.float32)
    targets = ["/observables/state/x/value", "/observables/state/x", "/observables", "/jaxlog",
               "/observables/energy/step", "/jaxlog/attachments", "/jaxlog/attachments/postmortem/20",
               "/jaxlog/attachments/postmortem/20/state/x", "/observables/bf/time"]
    target = targets[int(rng.integers(0, len(targets)))]
    kind = int(rng.integers(0, 5))
    with h5py.File(dst, "r+") as f:
        if kind == 3:  # a hard-link cycle under attachments: inside the file, so it may load
            f["jaxlog/attachments/postmortem/20/loop"] = f["jaxlog/attachments/postmortem"]
            return "cycle"
        if kind == 4:  # a soft link that points at itself
            del f[target]
            f[target] = h5py.SoftLink(target)
            return None
        del f[target]
        if kind == 0:
            f[target] = h5py.ExternalLink(str(sibling), "/data" if target.endswith("value") else "/g")
        elif kind == 1:
            f[target] = h5py.ExternalLink("/etc/passwd", "/")
        else:
            f[target] = h5py.SoftLink("/observables/state/v/value" if target.endswith("value") else "/observables")


def m_storage(rng, src, dst, tmp):
    """A dataset whose data is outside the file: external raw storage or a virtual dataset."""
    dst.write_bytes(src.read_bytes())
    sibling = tmp / "raw.bin"
    if not sibling.exists():
        sibling.write_bytes(np.full(11 * 12, 7.0, np.float32).tobytes())
        with h5py.File(tmp / "vsrc.h5", "w") as s:
            s["x"] = np.full((11, 4, 3), 7.0, np.float32)
    target = ["/observables/state/x/value", "/observables/energy/value", "/jaxlog/attachments/postmortem/20/note"][
        int(rng.integers(0, 3))]
    with h5py.File(dst, "r+") as f:
        old = f[target]
        shape, dtype = old.shape, old.dtype
        del f[target]
        kind = int(rng.integers(0, 3))
        if kind == 0:
            f.create_dataset(target, shape=shape, dtype=dtype, external=[("/etc/passwd", 0, h5py.h5f.UNLIMITED)])
        elif kind == 1:
            nbytes = int(np.prod(shape)) * dtype.itemsize
            f.create_dataset(target, shape=shape, dtype=dtype, external=[(str(sibling), 0, nbytes)])
        else:
            layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
            src_shape = (11, 4, 3)
            vs = h5py.VirtualSource(str(tmp / "vsrc.h5"), "x", shape=src_shape, dtype=np.float32)
            if shape == src_shape:
                layout[...] = vs
            f.create_virtual_dataset(target, layout, fillvalue=0)


def m_shape_dtype(rng, src, dst, tmp):
    """A dataset replaced by one of another shape, rank, dtype or dataspace."""
    dst.write_bytes(src.read_bytes())
    targets = ["/observables/state/x/value", "/observables/energy/value", "/observables/energy/step",
               "/observables/bf/value", "/observables/bf/time", "/jaxlog/attachments/postmortem/20/state/x"]
    target = targets[int(rng.integers(0, len(targets)))]
    with h5py.File(dst, "r+") as f:
        old = f[target]
        attrs = dict(old.attrs)
        n = old.shape[0] if old.shape else 1
        del f[target]
        kind = int(rng.integers(0, 9))
        if kind == 0:
            f[target] = np.zeros((n, 5), np.float32)
        elif kind == 1:
            f[target] = np.zeros(n, np.float32)
        elif kind == 2:
            f[target] = np.zeros((n, 4, 3), np.int16)
        elif kind == 3:
            f[target] = np.array([b"abc"] * n)
        elif kind == 4:
            f[target] = np.zeros(n, dtype=[("a", "i4"), ("b", "f8")])
        elif kind == 5:
            f.create_dataset(target, data=h5py.Empty("f8"))
        elif kind == 6:
            f[target] = np.float64(1.0)
        elif kind == 7:
            f.create_group(target)
        else:
            f.create_dataset(target, data=np.zeros((n, 4, 3), np.float64), dtype=">f8")
        if isinstance(f[target], h5py.Dataset) and rng.integers(0, 2):
            for k, v in attrs.items():
                f[target].attrs[k] = v
        if rng.integers(0, 3) == 0 and isinstance(f[target], h5py.Dataset):
            f[target].attrs["jaxlog_dtype"] = ["bfloat16", "float64", "nope", "__class__"][int(rng.integers(0, 4))]


def m_attachments(rng, src, dst, tmp):
    dst.write_bytes(src.read_bytes())
    with h5py.File(dst, "r+") as f:
        pm = f["jaxlog/attachments/postmortem"]
        kind = int(rng.integers(0, 4))
        if kind == 0:
            pm["not-a-step"] = pm["20"]
        elif kind == 1:
            g = pm["20"]
            for _ in range(100):
                g = g.create_group("d")
            g["x"] = np.zeros(1)
        elif kind == 2:
            pm["20/state"].attrs["jaxlog_key_impl"] = np.arange(3)
            pm["20/note"].attrs["jaxlog_key_impl"] = np.arange(3)
        else:
            pm["20/note"].attrs["jaxlog_dtype"] = "float8_e4m3fn"


MUTATIONS = [m_truncate, m_random_bytes, m_bit_flip, m_junk, m_attr, m_schema, m_link, m_storage,
             m_shape_dtype, m_attachments]
PER_MUTATION = 30


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """``PER_MUTATION`` files per mutation, from a plain and a compressed base file."""
    d = tmp_path_factory.mktemp("fuzz")
    bases = []
    for name, comp in (("base.h5", None), ("gz.h5", "gzip")):
        write_base(d / name, compression=comp)
        bases.append(d / name)
    rng = np.random.default_rng(SEED)
    cases = []
    for mutate in MUTATIONS:
        for i in range(PER_MUTATION):
            src = bases[i % 2]
            dst = d / f"{mutate.__name__}-{i:03d}.h5"
            tag = mutate(rng, src, dst, d)
            if tag:
                dst = dst.rename(dst.with_name(f"{dst.stem}-{tag}.h5"))
            cases.append(dst)
    return d, bases, cases


CHILD = textwrap.dedent(
    """
    import json, sys, traceback
    import numpy as np
    import pytest_jaxlog as jl

    ref = jl.load(sys.argv[1])  # the intact base file (checked by the parent to load)
    expected = {name: (ref.steps(name), ref[name]) for name in ref.records}
    results = {}
    for path in sys.argv[1:]:
        try:
            t = jl.load(path)
            seen = {"status": t.status, "steps_done": t.steps_done}
            for name in t.records:
                steps, values = t.steps(name), t[name]
                t[name, 1:3]
                if t.dt is not None:
                    t.time(name)
                if name in expected:  # data is checksummed: what loads is what was written
                    s, v = expected[name]
                    assert np.array_equal(steps, s), name
                    assert values.dtype == v.dtype and values.tobytes() == v.tobytes(), name
            t.postmortem
            t.attachment_key_impls("postmortem")
            repr(t), t.violation, t.provenance, t.writer_error
            results[path] = "ok"
        except jl.JaxlogError as exc:
            msg = str(exc)
            results[path] = "error" if msg.startswith("[jaxlog] ") and path in msg else "unnamed: " + msg
        except BaseException:
            results[path] = "raised: " + traceback.format_exc()
    print(json.dumps(results))
    """
)


def test_fuzzed_files_load_correctly_or_raise_one_jaxlog_error(corpus, tmp_path):
    d, bases, cases = corpus
    expected = write_base(tmp_path / "ref.h5")  # the same seed: the values the bases hold
    ref = jl.load(bases[0])
    for name, (steps, values) in expected.items():
        np.testing.assert_array_equal(ref.steps(name), steps)
        assert ref[name].tobytes() == values.tobytes()
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    r = subprocess.run([sys.executable, str(script), *map(str, bases + cases)],
                       capture_output=True, text=True, env=ENV, timeout=GUARD_S)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(r.stdout)
    bad = {Path(p).name: res for p, res in results.items() if res not in ("ok", "error")}
    assert not bad, "\n".join(f"{k}: {v}" for k, v in list(bad.items())[:10])
    assert all(results[str(b)] == "ok" for b in bases)
    outcome = {m.__name__: [results[str(p)] for p in cases if p.name.startswith(m.__name__ + "-")] for m in MUTATIONS}
    print({k: (v.count("ok"), v.count("error")) for k, v in outcome.items()})
    # the hostile kinds never load: nothing outside the file is read, and they are errors
    for p in cases:
        if p.name.startswith(("m_link-", "m_storage-", "m_junk-")) and not p.stem.endswith("-cycle"):
            assert results[str(p)] == "error", p.name
    # every truncation shorter than the file is an error (never a silent partial read)
    assert outcome["m_truncate"].count("ok") == 0


def test_cli_never_prints_a_traceback_for_a_bad_file(corpus, tmp_path):
    """info and diff over a sample, in one interpreter: exit 2 and one [jaxlog] line for a bad
    file, 0 (or 1 for diff) for a file that loads."""
    d, bases, cases = corpus
    sample = cases[::5]
    code = textwrap.dedent(
        """
        import contextlib, io, json, sys, traceback
        import pytest_jaxlog as jl
        from pytest_jaxlog.cli import main
        base, out = sys.argv[1], {}
        for path in sys.argv[2:]:
            loads = readable = False
            try:
                t = jl.load(path)
                loads = True
                [(t[name], t.steps(name)) for name in t.records], t.postmortem
                readable = True  # every part the commands may read
            except jl.JaxlogError:
                pass
            for args in (["info", path], ["diff", path, base], ["diff", base, path]):
                err = io.StringIO()
                try:
                    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                        rc = main(args)
                except BaseException:
                    rc, err = "raised", io.StringIO(traceback.format_exc())
                out[" ".join(args)] = [loads, readable, rc, err.getvalue()]
        print(json.dumps(out))
        """
    )
    r = subprocess.run([sys.executable, "-c", code, str(bases[0]), *map(str, sample)], capture_output=True,
                       text=True, env=ENV, timeout=GUARD_S)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert len(out) == 3 * len(sample)
    broken = 0
    for args, (loads, readable, rc, err) in out.items():
        assert "Traceback" not in err, (args, err)
        assert rc in (0, 1, 2), (args, rc, err)
        if rc == 2:  # a bad file: one line, and never exit 1 ("they differ") for it
            broken += 1
            assert err.startswith("[jaxlog] ") and len(err.strip().splitlines()) == 1, (args, err)
        if not loads:
            assert rc == 2, (args, rc, err)
        if readable:
            assert rc in (0, 1), (args, rc, err)
    assert broken >= len(out) // 2  # most of the sample is broken files
