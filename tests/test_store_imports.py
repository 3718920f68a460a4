"""The store's modules depend on each other in one direction (no import circle), and none reaches
into another's private names: shared format constants and helpers live in ``store/format.py``."""

from __future__ import annotations

import ast
from pathlib import Path

STORE = Path(__file__).resolve().parents[1] / "pytest_jaxlog" / "store"


def _store_imports() -> dict[str, list[tuple[str, list[str]]]]:
    """Per store module: (store module imported, names taken from it), at any depth of the file."""
    out: dict[str, list[tuple[str, list[str]]]] = {}
    for path in sorted(STORE.glob("*.py")):
        edges = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                edges.append((node.module.split(".")[0], [a.name for a in node.names]))
            elif isinstance(node, ast.ImportFrom) and node.level == 1:
                edges += [(a.name, []) for a in node.names]
        out[path.stem] = edges
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
    assert "trajectory" not in graph["parts"] and "parts" in graph["trajectory"]


def test_no_store_module_imports_another_ones_private_names():
    bad = [f"{m} takes {n} from {t}" for m, edges in _store_imports().items() for t, names in edges
           for n in names if n.startswith("_") and t != m]
    assert not bad, bad
