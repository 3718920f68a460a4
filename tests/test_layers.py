"""The package's folders are its layers, and imports only point down: read from the source.

record (1) → check, store, profiling (2, never each other) → drive, golden (3) → cli, harness (4)
→ plugin (5). ``errors`` (0) is below everything. The pytest side must not import jax, numpy,
h5py or perfetto at load: users set ``XLA_FLAGS``/``JAX_*`` in conftest, after plugins load.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_jaxlog"

RANK = {"errors": 0, "record": 1, "logs": 2, "check": 3, "store": 3, "profiling": 3, "drive": 4, "golden": 4,
        "cli": 5, "harness": 5, "plugin": 6, "__main__": 7}
HEAVY = ("jax", "jaxlib", "numpy", "h5py", "perfetto", "ml_dtypes")


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


def _layer(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _package_of(path: Path) -> list[str]:
    return list(path.relative_to(PACKAGE).parent.parts)


def _imports(path: Path, top_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module inside the package or outside it) for every import in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # imports under `if TYPE_CHECKING:` never run
        nodes = [n for n in nodes if not (isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))]
    out = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                out.append((node.lineno, node.module or ""))
                continue
            base = _package_of(path)[: len(_package_of(path)) - (node.level - 1)]
            if node.level - 1 > len(_package_of(path)):
                raise AssertionError(f"{path}: relative import above the package")
            target = base + (node.module.split(".") if node.module else [])
            if not node.module:  # from . import x, y: each name may be a module
                out += [(node.lineno, "pytest_jaxlog." + ".".join(target + [a.name])) for a in node.names]
            else:
                out.append((node.lineno, "pytest_jaxlog." + ".".join(target)))
    return out


def _target_layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "pytest_jaxlog" or len(parts) == 1:
        return None
    return parts[1]


def test_every_module_belongs_to_a_known_layer():
    unknown = sorted({_layer(p) for p in _modules()} - set(RANK))
    assert not unknown, f"modules outside the layers: {unknown} (add them to a layer folder)"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    here = _layer(path)
    bad = []
    for line, module in _imports(path):
        there = _target_layer(module)
        if there is None or there == here or there == "__version__":
            continue
        if there not in RANK:
            bad.append(f"line {line}: {module} (unknown layer)")
        elif RANK[there] >= RANK[here]:
            bad.append(f"line {line}: {module} (layer {there}, rank {RANK[there]} >= {here}'s {RANK[here]})")
    assert not bad, f"{path.relative_to(PACKAGE)} imports from its own rank or above:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", [PACKAGE / "plugin.py", *sorted((PACKAGE / "harness").glob("*.py")),
                                  PACKAGE / "__init__.py", PACKAGE / "errors.py"],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_pytest_side_imports_no_heavy_module_at_load(path):
    heavy = [f"line {line}: {m}" for line, m in _imports(path, top_level_only=True) if m.split(".")[0] in HEAVY]
    assert not heavy, f"{path.relative_to(PACKAGE)} imports at load:\n" + "\n".join(heavy)
    pkg = [m for _, m in _imports(path, top_level_only=True) if _target_layer(m) not in (None, "errors", "harness")]
    assert not pkg, f"{path.relative_to(PACKAGE)} imports package layers that need jax at load: {pkg}"


def test_loading_the_plugin_starts_nothing_heavy():
    code = ("import sys, pytest_jaxlog, pytest_jaxlog.plugin; "
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"importing pytest_jaxlog.plugin imported: {out}"


def test_the_public_namespace_lists_only_public_names():
    import pytest_jaxlog as jl

    names = dir(jl)
    assert {"run", "Recorder", "load", "JaxlogError", "every"} <= set(names)
    assert sorted(names) == sorted([*jl.__all__, "__version__"]), "dir(pytest_jaxlog) lists non-public names"
    for name in jl.__all__:
        assert getattr(jl, name) is not None
