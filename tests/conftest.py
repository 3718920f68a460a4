"""The repository's own tests run on the CPU (``JAX_PLATFORMS=cpu`` unless set): they compare runs
with references computed in numpy and across chunk sizes bit for bit, and drive the CPU's
behaviour on purpose (fault injection, memory limits, subprocess timings), which another backend
would change. The examples (``examples/``) run on whatever backend JAX picks."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The suite starts hundreds of Python processes (xdist's workers, pytest sessions in subprocesses,
# children it kills, launched ranks). Where PYTHONDONTWRITEBYTECODE is set, each compiled the
# package from source and pytest rewrote its asserts again; they share Python's bytecode cache.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


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


_import_the_package()
