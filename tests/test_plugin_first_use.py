"""The plugin does nothing until a test uses jaxlog: a session whose tests never ask for the
fixture or the marker keeps its SIGTERM handler, JAX's settings and pytest's cache directory as
they were; the first test that does ask sets up SIGTERM handling and the default compile cache
(in pytest's cache directory, one subdirectory per machine), and the end of the session undoes both."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_jaxlog.harness.compile_cache import machine_key

PROBE = textwrap.dedent("""
    import json, os, signal, sys

    def probe(name):
        jax = sys.modules.get("jax")
        doc = {"test": name, "sigterm_default": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
               "env": os.environ.get("JAX_COMPILATION_CACHE_DIR"),
               "config": None if jax is None else jax.config.jax_compilation_cache_dir}
        with open(os.environ["PROBE_OUT"], "a") as f:
            f.write(json.dumps(doc) + "\\n")
""")
PLAIN = "from probe import probe\n\ndef test_plain():\n    probe('plain')\n"
USES = "from probe import probe\n\ndef test_uses(jaxlog):\n    probe('uses')\n"
MARKED = ("import pytest\nfrom probe import probe\n\n@pytest.mark.jaxlog(keep='all')\n"
          "def test_marked():\n    probe('marked')\n")


def _session(tmp_path: Path, files: dict[str, str], *args: str, jax_first: bool = False,
             extra_env: dict[str, str] | None = None) -> list[dict]:
    """Run pytest in a fresh process over ``files``; returns what each test saw, then what the
    process had after the session (``test == 'after'``)."""
    (tmp_path / "probe.py").write_text(PROBE)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    out = tmp_path / "probe.jsonl"
    out.unlink(missing_ok=True)
    code = ("import os, sys, pytest\n"
            + ("import jax\n" if jax_first else "")
            + f"sys.path.insert(0, {str(tmp_path)!r})\n"
            + f"code = pytest.main(['-q', '-p', 'pytester', *{list(args)!r}, *{sorted(files)!r}])\n"
            + "from probe import probe\nprobe('after')\nsys.exit(int(code))\n")
    env = {k: v for k, v in __import__("os").environ.items()
           if not k.startswith(("JAXLOG_", "JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))}
    env.update(extra_env or {}, PROBE_OUT=str(out))
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.parametrize("jax_first", [False, True], ids=["jax-not-imported", "jax-imported"])
def test_a_session_without_jaxlog_tests_changes_nothing(tmp_path, jax_first):
    seen = _session(tmp_path, {"test_plain.py": PLAIN}, jax_first=jax_first)
    untouched = {"sigterm_default": True, "env": None, "config": None}
    assert [{k: s[k] for k in untouched} for s in seen] == [untouched, untouched]
    assert not (tmp_path / ".pytest_cache" / "d" / "jaxlog-compile-cache").exists()
    assert not (tmp_path / ".jaxlog").exists()


@pytest.mark.parametrize("jax_first", [False, True], ids=["jax-not-imported", "jax-imported"])
def test_the_first_test_that_uses_jaxlog_sets_up_sigterm_and_the_default_cache(tmp_path, jax_first):
    files = {"test_a.py": PLAIN, "test_b.py": USES, "test_c.py": MARKED}
    plain, uses, marked, after = _session(tmp_path, files, jax_first=jax_first)
    assert (plain["test"], plain["sigterm_default"], plain["env"], plain["config"]) == ("plain", True, None, None)
    cache = tmp_path / ".pytest_cache" / "d" / "jaxlog-compile-cache" / machine_key()
    assert cache.is_dir()
    for seen in (uses, marked):  # from the first use on, for the rest of the session
        assert not seen["sigterm_default"]
        private = Path(seen["config"] if jax_first else seen["env"])  # this process's own, inside it
        assert private.parent == cache and private.name.startswith(".") and private.name.endswith(".private")
    assert not list(cache.glob(".*"))  # published and removed at the end of the session
    assert (after["sigterm_default"], after["env"], after["config"]) == (True, None, None)


def test_off_and_no_cacheprovider_mean_no_default_cache(tmp_path):
    files = {"test_b.py": USES}
    (uses, _), = [_session(tmp_path, files, "-p", "no:cacheprovider")]
    assert uses["env"] is None and not uses["sigterm_default"]
    for off in (["--jaxlog-compile-cache=off"], ["--jaxlog-compile-cache=none"]):
        uses, _ = _session(tmp_path, files, *off)
        assert uses["env"] is None
    uses, _ = _session(tmp_path, files, extra_env={"JAXLOG_COMPILE_CACHE": "off"})
    assert uses["env"] is None
    assert not (tmp_path / ".pytest_cache" / "d" / "jaxlog-compile-cache").exists()


def test_a_cache_the_user_configured_is_left_alone(tmp_path):
    conftest = "import jax\njax.config.update('jax_compilation_cache_dir', 'mine')\n"
    uses, after = _session(tmp_path, {"conftest.py": conftest, "test_b.py": USES})
    assert uses["config"] == "mine" and after["config"] == "mine"
    assert not (tmp_path / ".pytest_cache" / "d" / "jaxlog-compile-cache").exists()
