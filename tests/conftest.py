"""The repository's own tests run on the CPU (``JAX_PLATFORMS=cpu`` unless set): they compare runs
with references computed in numpy and across chunk sizes bit for bit, and drive the CPU's
behaviour on purpose (fault injection, memory limits, subprocess timings), which another backend
would change. The examples (``examples/``) run on whatever backend JAX picks."""

import inspect
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _import_the_package() -> None:
    """Every module of the package, imported once before any test. pytester's in-process runs drop
    the modules first imported during the run; a module imported again later is a second copy whose
    classes are not the first's (``isinstance(jl.Record(...), Record)`` false), so a test after one
    that happened to import a module first failed depending on the order tests ran in."""
    import importlib
    import pkgutil

    import pytest_jaxlog

    for info in pkgutil.walk_packages(pytest_jaxlog.__path__, "pytest_jaxlog."):
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional extra not installed (matplotlib, tensorboard, pytest-html)
            pass


# a pytest session that collects nothing and imports the package as above, with pytest's hook
# rewriting the asserts of the modules it rewrites (the plugin's)
_WRITE_THE_PACKAGES_BYTECODE = inspect.getsource(_import_the_package) + """
import sys
import pytest

class ImportEveryModule:
    def pytest_sessionstart(self, session):
        _import_the_package()

sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "--collect-only", sys.argv[1]],
                     plugins=[ImportEveryModule()]))
"""


def _bytecode_for_the_package_only() -> None:
    """The suite starts hundreds of Python processes (xdist's workers, pytest sessions in
    subprocesses, children it kills, launched ranks). Each would compile the package and rewrite
    its asserts from source, so one child writes that bytecode first (where a module's is missing
    or older than its source). Nothing else writes any: the tests rewrite their own test files
    within a second, often to the same size, and Python's and pytest's caches, keyed on
    whole-second mtimes and sizes, then ran the file's previous version (a golden that should
    fail passed)."""
    if "PYTEST_XDIST_WORKER" not in os.environ and not _package_bytecode_current():
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        with tempfile.TemporaryDirectory(prefix="jaxlog-bytecode-") as empty:
            subprocess.run(
                [sys.executable, "-c", _WRITE_THE_PACKAGES_BYTECODE, empty],
                env=env,
                cwd=empty,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            )
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    sys.dont_write_bytecode = True


def _package_bytecode_current() -> bool:
    """Every module of the package has bytecode (Python's, or pytest's with its asserts rewritten)
    no older than its source: a session of a few tests then starts no child."""
    import importlib.util
    from pathlib import Path

    import pytest

    spec = importlib.util.find_spec("pytest_jaxlog")
    if spec is None or not spec.submodule_search_locations:
        return False
    tags = (f".{sys.implementation.cache_tag}-pytest-{pytest.__version__}.pyc", f".{sys.implementation.cache_tag}.pyc")
    for source in Path(next(iter(spec.submodule_search_locations))).rglob("*.py"):
        mtime = source.stat().st_mtime
        cached = (source.parent / "__pycache__" / (source.stem + tag) for tag in tags)
        if not any(c.exists() and c.stat().st_mtime >= mtime for c in cached):
            return False
    return True


_bytecode_for_the_package_only()
_import_the_package()
