"""The sdist and the wheel carry what users expect: the license in both, the example suite and the CI
recipes the README points to (and the tests with their helpers, and the docs) in the sdist, pytest as a requirement and the pytest11 entry point in the
wheel. Built with the installed ``build`` and setuptools (no build isolation: no network), from a copy of
the source tree so the build leaves nothing in the checkout."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
# what a checkout holds beside the source: never part of a distribution
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", ".venvs", ".jaxlog", ".hypothesis", ".pytest_cache",
                                    ".mypy_cache", ".ruff_cache", "__pycache__", "*.egg-info", "build", "dist")


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("build", reason="the [test] extra installs build")
    tmp = tmp_path_factory.mktemp("packaging")
    src, out = tmp / "src", tmp / "dist"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCE)
    # the default: the sdist, then the wheel built from the unpacked sdist (so the sdist is complete)
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "deprecat" not in (proc.stdout + proc.stderr).lower(), proc.stdout[-4000:] + proc.stderr[-4000:]
    (sdist,), (wheel,) = out.glob("*.tar.gz"), out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


def _sdist_names(sdist: Path) -> set[str]:
    with tarfile.open(sdist) as tar:
        return {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}


def _wheel_text(wheel: Path, suffix: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(suffix)]
        return zf.read(name).decode()


def test_both_carry_the_apache_license(dists):
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "LICENSE" in _sdist_names(dists["sdist"])
    assert _wheel_text(dists["wheel"], ".dist-info/licenses/LICENSE") == license_text
    meta = Parser().parsestr(_wheel_text(dists["wheel"], ".dist-info/METADATA"))
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]


def test_sdist_carries_the_examples_and_ci_recipes_the_readme_points_to(dists):
    names = _sdist_names(dists["sdist"])
    tracked = {p.relative_to(ROOT).as_posix() for d in ("ci", "examples", "fixtures", "tests", "benchmarks", "docs")
               for p in (ROOT / d).rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert {"ci/github-actions.yml", "ci/gitlab-ci.yml", "examples/test_lj.py", "examples/kernels/lj.py",
            "examples/conftest.py", "conftest.py", "tests/conftest.py", "tests/plugin_helpers.py",
            "pytest_jaxlog/py.typed", "mkdocs.yml", "docs/index.md", "docs/performance.md"} <= names
    assert tracked - names == set()
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_wheel_requires_pytest_and_registers_the_plugin(dists):
    meta = Parser().parsestr(_wheel_text(dists["wheel"], ".dist-info/METADATA"))
    runtime = {Requirement(r).name: Requirement(r) for r in meta.get_all("Requires-Dist")
               if Requirement(r).marker is None}  # extras carry a marker
    assert {"pytest", "jax", "numpy", "h5py"} <= set(runtime)
    assert runtime["pytest"].specifier.contains("8.0") and not runtime["pytest"].specifier.contains("7.4")
    entry_points = configparser.ConfigParser()
    entry_points.read_string(_wheel_text(dists["wheel"], ".dist-info/entry_points.txt"))
    assert entry_points["pytest11"]["jaxlog"] == "pytest_jaxlog.plugin"
    with zipfile.ZipFile(dists["wheel"]) as zf:
        names = set(zf.namelist())
    assert {"pytest_jaxlog/plugin.py", "pytest_jaxlog/py.typed"} <= names
    assert not [n for n in names if n.split("/")[0] in ("examples", "tests", "ci", "fixtures")]
