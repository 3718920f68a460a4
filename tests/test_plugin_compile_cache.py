"""``--jaxlog-compile-cache DIR``: JAX's persistent compilation cache for the session. Two pytest
processes with the option: the first compiles and fills the directory, the second loads every
program of its runs from it, and both the manifest and the terminal summary say so. The option
reads ``JAXLOG_COMPILE_CACHE`` and the ini key like the others, and loading the plugin with it
still imports no jax."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_jaxlog.harness.compile_cache import machine_key

pytest_plugins = ["pytester"]

SUITE = """
import jax.numpy as jnp
import pytest_jaxlog as jl

def step(x):
    return 0.5 * x + 1.0

def test_short(jaxlog):
    jaxlog.run(step, jnp.ones(8), 20, record={"x": lambda x: x, "s": jl.Record(jnp.sum, every=5)})

def test_other_kernel(jaxlog):
    jaxlog.run(lambda x: x * 0.9, jnp.ones(3), 7, record={"m": jnp.max}, name="decay")
"""


@pytest.fixture(autouse=True)
def _no_jaxlog_env(monkeypatch):
    for name in [k for k in os.environ if k.startswith(("JAXLOG_", "JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))]:
        monkeypatch.delenv(name)


def _runs(base: Path) -> list[dict]:
    doc = json.loads((base / "manifest.json").read_text())
    return [r for t in doc["tests"] for r in t["runs"]]


def test_a_second_session_loads_every_program_from_the_cache(pytester):
    pytester.makepyfile(test_k=SUITE)
    cache = pytester.path / "jaxcache"
    first = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--jaxlog-keep=all", f"--jaxlog-compile-cache={cache}")
    first.assert_outcomes(passed=2)
    runs = _runs(pytester.path / ".jaxlog")
    assert [r["compiles"] for r in runs] == [1, 1] and [r["from_cache"] for r in runs] == [0, 0]
    assert any(p.name.startswith("jit_chunk_impl") for p in cache.iterdir())  # the programs are on disk
    doc = json.loads((pytester.path / ".jaxlog" / "manifest.json").read_text())
    assert doc["settings"]["compile_cache"] == "../jaxcache"
    first.stdout.fnmatch_lines(["*compile_cache=jaxcache*", "compile cache jaxcache: 0 of the 2 programs the runs "
                                "needed came from it"])

    second = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--jaxlog-keep=all",
                                           f"--jaxlog-compile-cache={cache}")
    second.assert_outcomes(passed=2)
    runs = _runs(pytester.path / ".jaxlog")
    assert [r["compiles"] for r in runs] == [1, 1] and [r["from_cache"] for r in runs] == [1, 1]
    second.stdout.fnmatch_lines(["compile cache jaxcache: 2 of the 2 programs the runs needed came from it"])

    # without the option nothing comes from the cache, and the summary says nothing about it
    third = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--jaxlog-keep=all")
    third.assert_outcomes(passed=2)
    assert [r["from_cache"] for r in _runs(pytester.path / ".jaxlog")] == [0, 0]
    assert "compile cache" not in third.stdout.str()


def test_the_environment_and_the_ini_key_set_it_too(pytester, monkeypatch):
    pytester.makepyfile(test_k=SUITE)
    pytester.makeini("[pytest]\njaxlog_compile_cache = from_ini\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)
    assert any((pytester.path / "from_ini").iterdir())  # relative to rootdir
    monkeypatch.setenv("JAXLOG_COMPILE_CACHE", str(pytester.path / "from_env"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--jaxlog-keep=all")
    result.assert_outcomes(passed=2)
    assert any((pytester.path / "from_env").iterdir())  # the environment wins over the ini key
    result.stdout.fnmatch_lines(["compile cache *from_env: 0 of the 2 programs the runs needed came from it"])


def test_a_file_in_the_way_is_a_usage_error(pytester):
    pytester.makepyfile(test_k=SUITE)
    (pytester.path / "taken").write_text("")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--jaxlog-compile-cache=taken")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*jaxlog compile_cache (--jaxlog-compile-cache): *taken is a file, not a directory*"])


def test_configuring_the_cache_imports_no_jax(tmp_path):
    (tmp_path / "test_uses.py").write_text(
        "import os, sys\n"
        "def test_uses(jaxlog):\n"
        "    print('DURING', 'jax' in sys.modules, os.environ.get('JAX_COMPILATION_CACHE_DIR'))\n")
    code = ("import sys, pytest\n"
            f"pytest.main(['--co', '-q', '-p', 'no:cacheprovider', '--jaxlog-compile-cache={tmp_path / 'c'}', "
            f"'{tmp_path}'])\n"
            "print('COLLECTED', (__import__('pathlib').Path(sys.argv[1]) / 'c').exists())\n"
            f"pytest.main(['-q', '-s', '-p', 'no:cacheprovider', '--jaxlog-compile-cache={tmp_path / 'c'}', "
            f"'{tmp_path}'])\n"
            "import os\n"
            "print([m for m in ('jax',) if m in sys.modules], os.environ.get('JAX_COMPILATION_CACHE_DIR'))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True,
                         cwd=tmp_path).stdout
    assert "COLLECTED False" in out  # nothing is set up until a test uses jaxlog
    # the test that used jaxlog ran with the variable JAX reads at import set, jax not imported
    assert f"DURING False {tmp_path / 'c'}/." in out  # this process's own directory inside it
    # no jax imported; the variable was set for the session and put back after it
    assert out.strip().splitlines()[-1] == "[] None"
    assert (tmp_path / "c").is_dir()


XDIST_SUITE = """
import jax.numpy as jnp
import pytest

from pytest_jaxlog.harness.compile_cache import machine_key
import pytest_jaxlog as jl

def step(x):  # one kernel for every test: both workers compile it at about the same time when cold
    return 0.5 * x + 1.0

@pytest.mark.parametrize("n", range(6))
def test_shared(jaxlog, n):
    jaxlog.run(step, jnp.ones(8), 20 + n, record={"x": lambda x: x, "s": jl.Record(jnp.sum, every=5)})

@pytest.mark.parametrize("size", [2, 3, 4, 5])
def test_own_shapes(jaxlog, size):
    jaxlog.run(step, jnp.ones(size), 9, record={"m": jnp.max})
"""


def test_sessions_under_xdist_share_the_default_cache_without_warnings(pytester):
    """Two workers writing one cache directory: JAX writes an entry in place (no temporary file), and
    the entries its readers find are complete or absent. Every session: no cache warning; after the
    first, every program comes from the cache."""
    pytest.importorskip("xdist")
    pytester.makepyfile(test_k=XDIST_SUITE)
    for session in range(2):
        result = pytester.runpytest_subprocess("-n", "2", "--jaxlog-keep=all", "-W", "error::UserWarning")
        result.assert_outcomes(passed=10)
        text = result.stdout.str() + result.stderr.str()
        for sign in ("persistent compilation cache", "UserWarning", "warnings summary", "Error reading", "Error writing"):
            assert sign not in text, text[-3000:]
        runs = _runs(pytester.path / ".jaxlog")
        # each run's program: compiled (or loaded) by it, or reused from an equal kernel's run on its worker
        assert len(runs) == 10 and all(r["compiles"] + r["reused"] >= 1 for r in runs)
        if session > 0:  # warm: every program the runs needed was loaded, none compiled
            assert [r["from_cache"] for r in runs] == [r["compiles"] for r in runs], runs
    caches = list((pytester.path / ".pytest_cache" / "d" / "jaxlog-compile-cache").iterdir())
    assert [c.name for c in caches] == [machine_key()]
    assert any(p.name.startswith("jit_chunk_impl") for p in caches[0].iterdir())


def test_each_process_writes_privately_and_publishes_whole_entries(tmp_path):
    from pytest_jaxlog.harness.compile_cache import PrivateCache

    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "jit_old-cache").write_bytes(b"old entry")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import socket

    leftover = shared / f".{socket.gethostname()}-{dead.pid}.private"  # a process killed before publishing
    leftover.mkdir()
    (leftover / "jit_half-cache").write_bytes(b"trunc")
    cache = PrivateCache(shared)
    private = cache.open()
    assert private.parent == shared and not leftover.exists()
    assert (private / "jit_old-cache").read_bytes() == b"old entry"  # seeded from the shared entries
    assert (private / "jit_old-cache").stat().st_ino == (shared / "jit_old-cache").stat().st_ino  # a link
    (private / "jit_new-cache").write_bytes(b"new entry")  # what JAX writes during the session
    assert not (shared / "jit_new-cache").exists()  # no other process sees it half written
    assert cache.publish() == 1
    assert sorted(p.name for p in shared.iterdir()) == ["jit_new-cache", "jit_old-cache"]
    assert (shared / "jit_new-cache").read_bytes() == b"new entry"
