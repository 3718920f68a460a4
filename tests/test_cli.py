"""``python -m pytest_jaxlog`` (info, diff, trace, plot) as real subprocesses: exit codes and output."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pytest_jaxlog as jl

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}


def cli(*args, cwd=None, pre: str | None = None):
    """Run the CLI in a fresh interpreter; ``pre`` runs first (e.g. to make an import unavailable)."""
    if pre is None:
        cmd = [sys.executable, "-m", "pytest_jaxlog", *map(str, args)]
    else:
        cmd = [sys.executable, "-c", f"{pre}\nimport sys\nfrom pytest_jaxlog.__main__ import main\nsys.exit(main())",
               *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=ENV, timeout=120)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Real trajectories from jl.run + HDF5Writer (one changed at step 7) and a real .pftrace."""
    from kernels.oscillators import make_oscillators

    import jax
    import jax.numpy as jnp

    d = tmp_path_factory.mktemp("cli")
    step, state, energy = make_oscillators(n=6)

    def make(kick_at):  # the work of step 6 kicks one velocity: state 7 onwards differs
        def kicked(s):
            s = step(s)
            return s._replace(v=s.v.at[2].add(1e-3))

        return lambda ks: (ks[0] + 1, jax.lax.cond(ks[0] == kick_at, kicked, step, ks[1]))

    record = {"energy": lambda ks: energy(ks[1]), "x": jl.Record(lambda ks: ks[1].x, every=5)}
    for name, kick_at in (("a", -1), ("same", -1), ("b", 6)):
        jl.run(make(kick_at), (jnp.int32(0), state), 40, record=record, dt=0.01, sinks=[jl.HDF5Writer(d / f"{name}.h5")])
    jl.run(make(6), (jnp.int32(0), state), 40, record=record, sinks=[jl.HDF5Writer(d / "violated.h5")],
           invariants=[jl.invariant("energy_below_6.5", lambda v: v < 6.5, "energy")], on_violation="record")
    (d / "junk.h5").write_text("not hdf5")
    (d / "empty.pftrace").write_bytes(b"")

    from pytest_jaxlog.profiling.timeline import Timeline

    tl = Timeline()
    t = 1_000_000
    for k, dur_us in enumerate([900, 100, 110, 120, 130, 140, 150, 160, 170, 400]):
        tl.slice("window steps", "jaxlog_step", t, t + dur_us * 1000, {"step_num": k})
        t += dur_us * 1000 + 10_000
    tl.slice("compile", "compile step", 0, 800_000)
    tl.slice("compile", "compile step", t, t + 300_000)
    tl.write(d / "run.pftrace")
    tl2 = Timeline()
    tl2.slice("dispatch", "steps 0..10", 0, 5_000_000)
    tl2.write(d / "nocompile.pftrace")
    # the shape of JAX's own Chrome-JSON trace: XLA compiles are backend_compile_and_load slices
    events = [{"ph": "X", "pid": 1, "tid": 2, "name": "jaxlog_step", "ts": 100 * k, "dur": 50 + k,
               "args": {"step_num": str(k)}} for k in range(4)]
    events += [{"ph": "X", "pid": 1, "tid": 2, "name": "backend_compile_and_load", "ts": 0, "dur": 1000},
               {"ph": "X", "pid": 1, "tid": 2, "name": "$pxla.py:1209 compile", "ts": 0, "dur": 1500}]
    with gzip.open(d / "perfetto_trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    return d


def test_help():
    top = cli("--help")
    assert top.returncode == 0 and all(c in top.stdout for c in ("info", "diff", "trace", "plot"))
    bare = cli()  # no command: the help with the commands, not only "arguments are required"
    assert bare.returncode == 2 and all(f"    {c} " in bare.stderr for c in ("info", "diff", "trace", "plot"))
    for cmd, words in {"info": "provenance", "diff": "--rtol", "trace": "p90", "plot": "matplotlib"}.items():
        r = cli(cmd, "--help")
        assert r.returncode == 0 and words in r.stdout, (cmd, r.stdout)
    # the console script (pyproject [project.scripts] jaxlog)
    script = Path(sys.executable).with_name("jaxlog")
    if script.exists():
        r = subprocess.run([str(script), "diff", "--help"], capture_output=True, text=True, env=ENV, timeout=120)
        assert r.returncode == 0 and "--atol" in r.stdout


def test_info(files):
    r = cli("info", files / "a.h5")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "status: complete   steps done: 40" in out and "violation: none" in out
    assert "energy  float32   ()             41 frames, steps 0..40 every 1" in out
    assert "x       float32   (6,)           9 frames, steps 0..40 every 5" in out
    assert "backend: cpu" in out and "x64: False" in out
    r = cli("info", files / "violated.h5")
    assert r.returncode == 0, r.stderr
    assert "status: violated   steps done: 40" in r.stdout  # on_violation="record" runs to the end
    assert "violation: [jaxlog] invariant energy_below_6.5 violated at step 0" in r.stdout
    assert "postmortem states: steps 0 (state/" in r.stdout
    r = cli("info", "--json", files / "a.h5")
    doc = json.loads(r.stdout)
    assert [x["path"] for x in doc["records"]] == ["energy", "x"] and doc["records"][1]["frames"] == 9


def test_diff(files):
    same = cli("diff", files / "a.h5", files / "same.h5")
    assert same.returncode == 0 and same.stdout.startswith("[jaxlog] trajectories match (2 records, 95 elements")
    r = cli("diff", files / "b.h5", files / "a.h5", "--rtol", "1e-6")
    assert r.returncode == 1, r.stderr
    assert r.stdout.startswith("[jaxlog] trajectories differ: record 'energy' first differs at step 7: obtained ")
    assert "record 'x' first differs at step 10, index (2,)" in r.stdout
    assert "of 41 elements differ" in r.stdout
    # restricted to records/steps where they agree
    assert cli("diff", files / "b.h5", files / "a.h5", "--steps", ":7").returncode == 0
    assert cli("diff", files / "b.h5", files / "a.h5", "--atol", "1", "--records", "energy").returncode == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (("info", "nope.h5"), "[jaxlog] trajectory nope.h5 does not exist"),
        (("info", "junk.h5"), "junk.h5 is not a pytest-jaxlog trajectory"),
        (("diff", "a.h5", "same.h5", "--records", "energy", "nope"), "[jaxlog] record 'nope' is not recorded; recorded: energy, x"),
        (("diff", "a.h5", "missing.h5"), "[jaxlog] trajectory missing.h5 does not exist"),
        (("plot", "a.h5", "vel", "-o", "out.png"), "[jaxlog] record 'vel' is not recorded"),
        (("trace", "a.h5"), "is neither Chrome JSON nor a Perfetto protobuf trace"),
        (("trace", "none.pftrace"), "[jaxlog] trace none.pftrace does not exist"),
        (("trace", "empty.pftrace"), "[jaxlog] trace empty.pftrace is empty (0 bytes)"),
    ],
)
def test_bad_input_is_one_line_exit_2(files, args, message):
    r = cli(*args, cwd=files)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("[jaxlog] ") and message in r.stderr


def test_trace(files):
    r = cli("trace", files / "run.pftrace")
    assert r.returncode == 0, r.stderr
    assert "steps: 10 (steps 0..9)   median 145.0 us   p90 450.0 us" in r.stdout
    assert "compilations: 2 (1.100 ms)" in r.stdout
    assert "jaxlog_step" in r.stdout and "compile step" in r.stdout
    r = cli("trace", files / "run.pftrace", "--top", "0")  # the summary without the slice list (was a traceback)
    assert r.returncode == 0 and "compilations: 2" in r.stdout and "top slices" not in r.stdout, r.stderr
    r = cli("trace", files / "perfetto_trace.json.gz")
    assert r.returncode == 0, r.stderr
    assert "steps: 4 (steps 0..3)" in r.stdout and "compilations: 1 (1.000 ms)" in r.stdout
    assert "$pxla" not in r.stdout  # Python-tracer frames are not "top slices"
    r = cli("trace", files / "nocompile.pftrace")
    assert r.returncode == 0, r.stderr
    assert "steps: 0 (no jaxlog_step annotations in this trace)" in r.stdout
    assert "compilations: not recorded in this trace" in r.stdout and "steps 0..10" in r.stdout


def test_plot(files, tmp_path):
    out = tmp_path / "plot.png"
    r = cli("plot", files / "a.h5", "-o", out)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "wrote" in r.stdout and "(1 record)" in r.stdout
    out2 = tmp_path / "two.png"
    r = cli("plot", files / "b.h5", "energy", "x", "--time", "-o", out2)
    assert r.returncode == 0, r.stderr
    assert out2.read_bytes()[:4] == b"\x89PNG" and "(2 records)" in r.stdout
    # a name without suffix gets .png, and the message names the file written
    r = cli("plot", files / "a.h5", "-o", tmp_path / "noext")
    assert r.returncode == 0 and r.stdout.startswith(f"wrote {tmp_path / 'noext.png'} ")
    assert (tmp_path / "noext.png").read_bytes()[:4] == b"\x89PNG"
    # an image format matplotlib cannot write is a one-line error, not a traceback
    r = cli("plot", files / "a.h5", "-o", tmp_path / "plot.xyz")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("[jaxlog] cannot write .xyz images; use one of: ") and ".png" in r.stderr


def test_plot_without_matplotlib(files, tmp_path):
    # a real absence: the import system refuses matplotlib in this interpreter
    r = cli("plot", files / "a.h5", "-o", tmp_path / "p.png", pre="import sys; sys.modules['matplotlib'] = None")
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "[jaxlog] plot needs matplotlib, which is not installed: pip install 'pytest-jaxlog[plot]'"
    )
    assert not (tmp_path / "p.png").exists()


def test_damaged_or_hostile_files_exit_2_without_a_traceback(files, tmp_path):
    """diff exits 1 only when two valid trajectories differ: a broken file is bad input (2)."""
    import h5py

    good = files / "a.h5"
    data = good.read_bytes()
    (tmp_path / "truncated.h5").write_bytes(data[: len(data) // 2])
    flipped = bytearray(data)
    with h5py.File(good, "r") as f:
        found = []
        f["observables/energy/value"].id.chunk_iter(found.append)
    flipped[found[0].byte_offset + 2] ^= 0x01  # one bit of the energies: caught by the chunk checksum
    (tmp_path / "flipped.h5").write_bytes(bytes(flipped))
    (tmp_path / "attach.h5").write_bytes((files / "violated.h5").read_bytes())
    with h5py.File(tmp_path / "attach.h5", "r+") as f:
        g = f["jaxlog/attachments/postmortem/0"]
        name = next(iter(g["state"]))
        del g["state"][name]
        g["state"].create_dataset(name, shape=(6,), dtype="u1", external=[("/etc/passwd", 0, 6)])
    cases = [
        (("info", tmp_path / "truncated.h5"), "truncated.h5: cannot open the trajectory file"),
        (("diff", tmp_path / "truncated.h5", good), "truncated.h5: cannot open the trajectory file"),
        (("diff", good, tmp_path / "flipped.h5"), "reading record 'energy' (value) failed: the file is damaged"),
        (("plot", tmp_path / "flipped.h5", "-o", tmp_path / "p.png"), "the file is damaged"),
        (("info", tmp_path / "attach.h5"), "keeps its data in external file '/etc/passwd'"),
    ]
    for args, message in cases:
        r = cli(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stderr.startswith("[jaxlog] ") and message in r.stderr, (args, r.stderr)
    assert cli("info", tmp_path / "flipped.h5").returncode == 0  # info reads steps, not the values


def test_info_keeps_a_big_post_mortem_state_within_the_width(tmp_path):
    """An 84-leaf state's post-mortem leaves are counted and named by their first and last, not
    printed as one 3,000-character line; every line stays within INFO_WIDTH; --json has them all."""
    from pytest_jaxlog.cli import INFO_WIDTH

    import jax.numpy as jnp

    state = {f"particles_group_{i:02d}_positions": jnp.full(3, 1.0 + i) for i in range(84)}
    path = tmp_path / "big.h5"
    with pytest.raises(jl.InvariantViolation):
        jl.run(lambda s: {k: v * 1.5 for k, v in s.items()}, state, 10, progress=False, sinks=[jl.HDF5Writer(path)],
               record={"e": lambda s: jnp.sum(s["particles_group_00_positions"])},
               invariants=[jl.conserved("e", rtol=0.01)])
    r = cli("info", path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= INFO_WIDTH, max(lines, key=len)
    (head,) = [i for i, line in enumerate(lines) if "postmortem states:" in line]
    text = " ".join(line.strip() for line in lines[head:head + 3])
    assert text.startswith("postmortem states: steps 0, 1; 84 leaves: state/particles_group_00_positions, "
                           "state/particles_group_01_positions, state/particles_group_02_positions, ..., "
                           "state/particles_group_82_positions, state/particles_group_83_positions "
                           "(--json lists them all)"), text
    assert sum("particles_group_" in line for line in lines) <= 3  # summarised, not one line per leaf
    assert any(line.startswith("  violation: [jaxlog] invariant conserved(e, rtol=0.01) violated at step 1")
               for line in lines)
    doc = json.loads(cli("info", "--json", path).stdout)
    assert doc["postmortem"]["steps"] == [0, 1] and len(doc["postmortem"]["leaves"]) == 84


def test_info_wraps_a_list_a_few_lines_long(tmp_path):
    """A post-mortem state of a few leaves with long names wraps under its heading, each name whole."""
    from pytest_jaxlog.cli import INFO_WIDTH

    import jax.numpy as jnp

    names = [f"a_rather_long_leaf_name_number_{i}" for i in range(5)]
    path = tmp_path / "few.h5"
    with pytest.raises(jl.InvariantViolation):
        jl.run(lambda s: {k: v * 1.5 for k, v in s.items()}, {n: jnp.ones(2) for n in names}, 10, progress=False,
               sinks=[jl.HDF5Writer(path)], record={"e": lambda s: jnp.sum(s[names[0]])},
               invariants=[jl.conserved("e", rtol=0.01)])
    r = cli("info", path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= INFO_WIDTH
    (head,) = [i for i, line in enumerate(lines) if "postmortem states:" in line]
    assert lines[head] == "  postmortem states: steps 0, 1; 5 leaves:"
    body = []
    for line in lines[head + 1:]:
        if not line.startswith("      state/"):
            break
        body.append(line.strip())
    assert 2 <= len(body) <= 4 and " ".join(body) == ", ".join(f"state/{n}" for n in names), body
