"""Repo-level pytest setup: the example kernels are importable as ``kernels``, JAX runs on the CPU."""

import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).parent / "examples"))
