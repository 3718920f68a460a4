"""The store's modules depend on each other in one direction (no import circle), and none reaches
into another's private names: shared format constants and helpers live in ``store/hdf5/layout.py``."""

from __future__ import annotations

import ast
from pathlib import Path

STORE = Path(__file__).resolve().parents[1] / "pytest_jaxlog" / "store"


def _name(path: Path) -> str:
    """A store module's dotted name inside the store (``sinks``, ``hdf5.parts``; a package's ``__init__``
    is the package's name)."""
    parts = list(path.relative_to(STORE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "__init__"


def _store_imports() -> dict[str, list[tuple[str, list[str]]]]:
    """Per store module: (store module imported, names taken from it), at any depth of the file."""
    modules = {_name(p) for p in STORE.rglob("*.py")}
    out: dict[str, list[tuple[str, list[str]]]] = {}
    for path in sorted(STORE.rglob("*.py")):
        here = list(path.relative_to(STORE).parent.parts)
        edges = []
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level == 0 or node.level - 1 > len(here):
                continue  # outside the store
            base = here[: len(here) - (node.level - 1)]
            target = ".".join(base + (node.module.split(".") if node.module else []))
            if node.module:
                if target in modules:
                    edges.append((target, [a.name for a in node.names]))
            else:
                edges += [(f"{target}.{a.name}".lstrip("."), []) for a in node.names
                          if f"{target}.{a.name}".lstrip(".") in modules]
        out[_name(path)] = edges
    return out


def test_no_import_circle_among_store_modules():
    graph = {m: {t for t, _ in edges if t != m} for m, edges in _store_imports().items()}
    state: dict[str, int] = {}

    def visit(m: str, trail: list[str]) -> None:
        if state.get(m) == 2:
            return
        assert state.get(m) != 1, f"import circle: {' -> '.join(trail + [m])}"
        state[m] = 1
        for t in sorted(graph.get(m, ())):
            visit(t, trail + [m])
        state[m] = 2

    for m in graph:
        visit(m, [])
    assert "hdf5.trajectory" not in graph["hdf5.parts"] and "hdf5.parts" in graph["hdf5.trajectory"]
    # the writer offers its parts sink (Sink.for_processes); the parts never import the writer back
    assert "hdf5.parts" in graph["hdf5.writer"] and "hdf5.writer" not in graph["hdf5.parts"]


def test_no_store_module_imports_another_ones_private_names():
    bad = [f"{m} takes {n} from {t}" for m, edges in _store_imports().items() for t, names in edges
           for n in names if n.startswith("_") and t != m]
    assert not bad, bad
