"""Repo-level pytest setup: the example kernels are importable as ``kernels``.

JAX's backend is JAX's default here (the examples and the benchmarks run on a GPU where there is
one); the repository's own tests pin the CPU in ``tests/conftest.py``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "examples"))
