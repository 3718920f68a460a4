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
    code = ("import sys, pytest\n"
            f"pytest.main(['--co', '-q', '-p', 'no:cacheprovider', '--jaxlog-compile-cache={tmp_path / 'c'}', "
            f"'{tmp_path}'])\n"
            "import os\n"
            "print([m for m in ('jax', 'numpy', 'h5py') if m in sys.modules], os.environ.get('JAX_COMPILATION_CACHE_DIR'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    # no jax imported; the variable JAX reads at import was set for the session and put back after it
    assert out.strip().splitlines()[-1] == "[] None"
    assert (tmp_path / "c").is_dir()
