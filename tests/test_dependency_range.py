"""The version ranges in pyproject.toml are the ones the dependency matrix runs.

.ci/matrix runs the whole suite with .ci/oldest.txt and with .ci/newest.txt as pip constraints:
each floor must be the oldest tested version (so a range never claims an untested release), each
newest tested version must lie inside its range, and every range must have a ceiling.
"""

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def _pins(name: str) -> dict[str, Version]:
    pins = {}
    for line in (ROOT / ".ci" / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f".ci/{name}: {line!r} is not an exact pin"
            pins[canonicalize_name(req.name)] = Version(spec.version)
    return pins


def _declared() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]]
    return {canonicalize_name(r.name): r for r in reqs}


def test_matrix_pins_exactly_the_declared_dependencies():
    declared = set(_declared())
    assert set(_pins("oldest.txt")) == declared
    assert set(_pins("newest.txt")) == declared


def test_floors_are_the_oldest_tested_and_ceilings_admit_the_newest_tested():
    oldest, newest = _pins("oldest.txt"), _pins("newest.txt")
    for name, req in _declared().items():
        ops = {s.operator: Version(s.version) for s in req.specifier}
        assert set(ops) == {">=", "<"}, f"{req}: want a floor (>=) and a ceiling (<)"
        assert ops[">="] == oldest[name], f"{req}: floor is not the oldest tested {oldest[name]}"
        assert newest[name] in req.specifier, f"{req}: excludes the newest tested {newest[name]}"
        assert oldest[name] <= newest[name]  # a tool tested at one version only (actionlint) has both equal


def test_the_docs_name_the_tested_versions():
    text = (ROOT / "docs" / "versions.md").read_text()
    section = text.split("# Supported versions", 1)[1].split("\n# ", 1)[0]
    for name in ("jax", "numpy", "h5py", "perfetto"):
        for pins in (_pins("oldest.txt"), _pins("newest.txt")):
            assert f"{name} {pins[name]}" in section, f"docs/versions.md lacks {name} {pins[name]}"
