"""The package's folders are its layers, and imports only point down: read from the source.

record (1) → logs (2) → check, store, profiling (3, never each other) → drive, compare (4) → cli,
harness (5) → plugin (6) → the package itself (``import pytest_jaxlog``, ``from pytest_jaxlog
import run``: 7, the top, whatever a lower layer would want of it). ``errors``, ``paths`` and
``version`` (0) are below everything. Inside ``drive`` the phases rank too: prepare → device →
checkpoints → host → the verbs at the folder's top (``run``, ``resume``, ``benchmark``...); an
import under ``if TYPE_CHECKING:`` (annotations, never run) is not an arrow there. No folder holds
more than 12 modules, the package at most 90. The pytest side must not import jax, numpy, h5py or
perfetto at load: users set ``XLA_FLAGS``/``JAX_*`` in conftest, after plugins load. Only the
pytest side imports pytest; only ``__init__`` modules import package modules by name
(``importlib.import_module``), which the reading of import statements would not see; the lower
layers load without starting jax. Each check is shown to fail on a module planted in a copy."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_jaxlog"

RANK = {"errors": 0, "paths": 0, "version": 0, "record": 1, "logs": 2, "check": 3, "store": 3, "profiling": 3, "drive": 4,
        "compare": 4, "cli": 5, "harness": 5, "plugin": 6, "__init__": 7, "__main__": 8}
DRIVE_PHASES = {"prepare": 0, "device": 1, "checkpoints": 2, "host": 3}  # the folder's own modules: 4
MOST_MODULES_IN_A_FOLDER = 12
MOST_MODULES = 90
MOST_ATTRIBUTES = 20  # a class holding more state than this is several objects: name them
HEAVY = ("jax", "jaxlib", "numpy", "h5py", "perfetto", "ml_dtypes")

# what only some parts of the package may do (names of layers, folders or top-level modules)
PYTEST_ALLOWED = ("harness", "plugin")  # the pytest side; the core never imports pytest
NO_JAX_AT_LOAD = ("errors", "paths", "version", "record", "check", "store", "profiling", "compare")  # importable without starting jax
IMPORT_FUNCTIONS = ("import_module", "__import__")  # importlib.import_module(...), __import__(...)


def _modules(root: Path = PACKAGE) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if p.name != "__init__.py" or p.parent != root)


def _layer(path: Path, root: Path = PACKAGE) -> str:
    rel = path.relative_to(root)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _module_name(path: Path, root: Path = PACKAGE) -> str:
    """The dotted name ``path`` is imported by (a package's ``__init__``: the package's)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(["pytest_jaxlog", *parts[: -1 if parts[-1] == "__init__" else None]])


def _package_of(path: Path, root: Path = PACKAGE) -> list[str]:
    return list(path.relative_to(root).parent.parts)


def _imports(path: Path, top_level_only: bool = False, root: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, absolute module inside the package or outside it) for every import in the file,
    statements and string imports (``importlib.import_module("pytest_jaxlog.x")``) alike."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # imports under `if TYPE_CHECKING:` never run
        nodes = [n for n in nodes if not (isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))]
    here = _package_of(path, root)
    out = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                out.append((node.lineno, node.module or ""))
                continue
            if node.level - 1 > len(here):
                raise AssertionError(f"{path}: relative import above the package")
            base = here[: len(here) - (node.level - 1)]
            target = base + (node.module.split(".") if node.module else [])
            if not node.module:  # from . import x, y: each name may be a module
                out += [(node.lineno, "pytest_jaxlog." + ".".join(target + [a.name])) for a in node.names]
            else:
                out.append((node.lineno, "pytest_jaxlog." + ".".join(target)))
        else:
            module = _string_import(node, here)
            if module is not None:
                out.append((node.lineno, module))
    return out


def _string_import(node: ast.AST, here: list[str]) -> str | None:
    """The module a call like ``importlib.import_module("pytest_jaxlog.check")``, ``import_module(
    ".store", __package__)`` or ``__import__("pytest_jaxlog.x")`` names (an f-string: its fixed
    start), else None."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in IMPORT_FUNCTIONS:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.JoinedStr):
        arg = arg.values[0] if arg.values else ast.Constant("")
    if not isinstance(arg, ast.Constant) or not isinstance(arg.value, str):
        return "pytest_jaxlog.<computed>"  # a name made at run time: cannot be checked, so not allowed
    text = arg.value
    if text.startswith("."):
        dots = len(text) - len(text.lstrip("."))
        base = here[: len(here) - (dots - 1)] if dots - 1 <= len(here) else []
        return ".".join(["pytest_jaxlog", *base, *[p for p in text[dots:].split(".") if p]])
    return text


def _target_layer(module: str) -> str | None:
    """The layer ``module`` is in; the package itself is the top layer (``__init__``); None
    outside the package."""
    parts = module.split(".")
    if parts[0] != "pytest_jaxlog":
        return None
    return "__init__" if len(parts) == 1 else parts[1]


# ---------------------------------------------------------------------------------------------
# the checks, each over one module of a package tree (the real one, or a copy with a planted module)


def bad_imports(path: Path, root: Path = PACKAGE) -> list[str]:
    """Imports of a layer of the same rank or above (or of an unknown layer)."""
    here = _layer(path, root)
    bad = []
    for line, module in _imports(path, root=root):
        there = _target_layer(module)
        if there is None or there == here:
            continue
        if there not in RANK:
            bad.append(f"line {line}: {module} (unknown layer)")
        elif RANK[there] >= RANK[here]:
            bad.append(f"line {line}: {module} (layer {there}, rank {RANK[there]} >= {here}'s {RANK[here]})")
    return bad


def _type_checking_lines(path: Path) -> set[int]:
    tree = ast.parse(path.read_text(), filename=str(path))
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def bad_phase_imports(path: Path, root: Path = PACKAGE) -> list[str]:
    """Inside ``drive``: a phase importing a phase of its own rank or above, or the folder's top
    (its verbs); imports under ``if TYPE_CHECKING:`` are not arrows."""
    rel = path.relative_to(root)
    if rel.parts[0] != "drive" or len(rel.parts) < 3:
        return []  # not in drive, or one of its verbs (which may use every phase)
    phase = rel.parts[1]
    here = DRIVE_PHASES.get(phase, len(DRIVE_PHASES))
    annotations_only = _type_checking_lines(path)
    bad = []
    for line, module in _imports(path, root=root):
        parts = module.split(".")
        if line in annotations_only or parts[:2] != ["pytest_jaxlog", "drive"]:
            continue
        there_name = parts[2] if len(parts) > 2 else "(the folder)"
        if there_name == phase:
            continue
        there = DRIVE_PHASES.get(there_name, len(DRIVE_PHASES))
        if there >= here:
            bad.append(f"line {line}: {module} (drive's {there_name}, rank {there} >= {phase}'s {here})")
    return bad


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports: every import, at load, in a function or under
    ``if TYPE_CHECKING:`` (a name taken from a module counts as that module)."""
    names = {_module_name(path, root): path for path in root.rglob("*.py")}
    graph = {}
    for name, path in names.items():
        targets = {m if m in names else m.rpartition(".")[0] for _, m in _imports(path, root=root)}
        graph[name] = {t for t in targets if t in names and t != name}
    return graph


def circles(root: Path = PACKAGE) -> list[tuple[str, ...]]:
    """The groups of modules that reach each other through imports (an annotation-only import
    included: it is not run, but the modules still cannot be read, or moved, one before the other)."""
    graph = import_graph(root)
    reach = {}
    for start in graph:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for target in graph[todo.pop()] - seen:
                seen.add(target)
                todo.append(target)
        reach[start] = seen
    return sorted({tuple(sorted(n for n in reach[m] if m in reach[n])) for m in graph if m in reach[m]})


def pytest_imports(path: Path, root: Path = PACKAGE) -> list[str]:
    """``pytest`` imported (anywhere in the file) outside the pytest side."""
    if _layer(path, root) in PYTEST_ALLOWED:
        return []
    return [f"line {line}: {m}" for line, m in _imports(path, root=root) if m.split(".")[0] in ("pytest", "_pytest")]


def string_imports(path: Path, root: Path = PACKAGE) -> list[str]:
    """Package modules imported by name at run time (hidden from the import checks' reading of
    statements, so allowed only in ``__init__`` modules, whose lazy names are the public API)."""
    if path.name == "__init__.py":
        return []
    tree = ast.parse(path.read_text(), filename=str(path))
    found = [(n, _string_import(n, _package_of(path, root))) for n in ast.walk(tree)]
    return [f"line {n.lineno}: {m}" for n, m in found if m is not None and m.split(".")[0] == "pytest_jaxlog"]


def starts_heavy(path: Path, root: Path = PACKAGE) -> list[str]:
    """For the pytest side (and the modules it loads with it): jax, numpy, h5py or perfetto at load,
    directly or through a package layer that needs them."""
    heavy = [f"line {line}: {m}" for line, m in _imports(path, True, root) if m.split(".")[0] in HEAVY]
    heavy += [f"line {line}: {m} (a layer that needs jax at load)" for line, m in _imports(path, True, root)
              if _target_layer(m) not in (None, "errors", "paths", "version", "harness")]
    return heavy


def jax_at_load(layer: str, root: Path = PACKAGE) -> list[str]:
    """Modules of ``layer`` whose import (in a fresh interpreter, with everything they import) starts jax."""
    folder = root / layer
    paths = sorted(folder.glob("*.py")) if folder.is_dir() else [root / f"{layer}.py"]
    names = [_module_name(p, root) for p in paths]
    code = ("import importlib, json, sys\n"
            "out = []\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module(name)\n"
            "    if 'jax' in sys.modules or 'jaxlib' in sys.modules:\n"
            "        out.append(name)\n"
            "        break\n"
            "print(json.dumps(out))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root.parent), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root.parent)
    assert r.returncode == 0, r.stderr[-2000:]
    return [f"{n} imports jax when loaded" for n in json.loads(r.stdout.strip().splitlines()[-1])]


# ---------------------------------------------------------------------------------------------
# the package as it is


def test_every_module_belongs_to_a_known_layer():
    unknown = sorted({_layer(p) for p in _modules()} - set(RANK))
    assert not unknown, f"modules outside the layers: {unknown} (add them to a layer folder)"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    bad = bad_imports(path)
    assert not bad, f"{path.relative_to(PACKAGE)} imports from its own rank or above:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", sorted((PACKAGE / "drive").rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_drives_phases_import_only_earlier_phases(path):
    bad = bad_phase_imports(path)
    assert not bad, f"{path.relative_to(PACKAGE)} imports a later phase of drive:\n" + "\n".join(bad)


def test_no_modules_import_each_other_in_a_circle():
    found = circles()
    assert not found, "modules that import each other (directly or through others):\n" + "\n".join(
        " <-> ".join(group) for group in found)


def test_the_drive_phases_are_the_folders_of_drive():
    folders = sorted(p.name for p in (PACKAGE / "drive").iterdir() if (p / "__init__.py").exists())
    assert folders == sorted(DRIVE_PHASES)


def test_no_folder_holds_more_than_12_modules_and_the_package_at_most_90():
    counts = {folder: len(list(folder.glob("*.py"))) for folder in [PACKAGE, *PACKAGE.rglob("*")]
              if folder.is_dir() and folder.name != "__pycache__"}
    big = {str(f.relative_to(PACKAGE.parent)): n for f, n in counts.items() if n > MOST_MODULES_IN_A_FOLDER}
    assert not big, f"folders over {MOST_MODULES_IN_A_FOLDER} modules: {big}; cut them by concern"
    assert sum(counts.values()) <= MOST_MODULES, f"{sum(counts.values())} modules (at most {MOST_MODULES})"


def attributes_assigned(path: Path) -> dict[str, int]:
    """Per class in the file: how many distinct ``self.<name>`` it assigns, in any method."""
    out = {}
    for cls in [n for n in ast.walk(ast.parse(path.read_text(), filename=str(path))) if isinstance(n, ast.ClassDef)]:
        names = set()
        for node in ast.walk(cls):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names |= {x.attr for x in ast.walk(target) if isinstance(x, ast.Attribute)
                              and isinstance(x.value, ast.Name) and x.value.id == "self"}
        out[cls.name] = len(names)
    return out


def test_no_class_assigns_more_than_20_attributes():
    big = {f"{p.relative_to(PACKAGE)}:{name}": n for p in _modules() for name, n in attributes_assigned(p).items()
           if n > MOST_ATTRIBUTES}
    assert not big, f"classes assigning over {MOST_ATTRIBUTES} attributes: {big}; group their state in named parts"


def test_the_attribute_count_sees_a_big_class(tmp_path):
    planted = tmp_path / "big.py"
    planted.write_text("class Big:\n    def __init__(self):\n" + "".join(f"        self.a{i} = {i}\n" for i in range(15))
                       + "    def more(self):\n" + "".join(f"        self.b{i}, self.a{i} = {i}, {i}\n" for i in range(7)))
    assert attributes_assigned(planted) == {"Big": 22}


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_the_pytest_side_imports_pytest_and_only_init_imports_by_name(path):
    bad = pytest_imports(path)
    assert not bad, f"{path.relative_to(PACKAGE)} imports pytest outside {PYTEST_ALLOWED}:\n" + "\n".join(bad)
    named = string_imports(path)
    assert not named, f"{path.relative_to(PACKAGE)} imports package modules by name:\n" + "\n".join(named)


@pytest.mark.parametrize("path", [PACKAGE / "plugin.py", *sorted((PACKAGE / "harness").glob("*.py")),
                                  PACKAGE / "__init__.py", PACKAGE / "errors.py"],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_pytest_side_imports_no_heavy_module_at_load(path):
    heavy = starts_heavy(path)
    assert not heavy, f"{path.relative_to(PACKAGE)} imports at load:\n" + "\n".join(heavy)


def test_the_lower_layers_load_without_jax():
    present = [layer for layer in NO_JAX_AT_LOAD if (PACKAGE / layer).is_dir() or (PACKAGE / f"{layer}.py").exists()]
    assert present == list(NO_JAX_AT_LOAD)
    bad = [line for layer in NO_JAX_AT_LOAD for line in jax_at_load(layer)]
    assert not bad, "\n".join(bad)


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


# ---------------------------------------------------------------------------------------------
# the checks can fail: each planted module, in a copy of the package, is flagged by its check


@pytest.fixture(scope="module")
def copy_of_package(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("layers") / "pytest_jaxlog"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


PLANTED = {
    # (file in the copy, its text, the check that must flag it, what the flag says)
    "pytest in check": ("check/planted_pytest.py", "def f():\n    import pytest\n    return pytest\n",
                        pytest_imports, "pytest"),
    "string import": ("store/planted_named.py",
                      "import importlib\n\ndef f():\n    return importlib.import_module('pytest_jaxlog.drive.run')\n",
                      string_imports, "pytest_jaxlog.drive.run"),
    "relative string import": ("check/planted_relative.py",
                               "from importlib import import_module\n\ndef f():\n"
                               "    return import_module('..golden', __package__)\n",
                               string_imports, "pytest_jaxlog.golden"),
    "__import__ upward": ("record/planted_dunder.py", "def f():\n    return __import__('pytest_jaxlog.drive')\n",
                          bad_imports, "pytest_jaxlog.drive (layer drive"),
    "import upward": ("profiling/planted_up.py", "from ..store import hdf5\n", bad_imports,
                      "pytest_jaxlog.store (layer store, rank 3 >= profiling's 3)"),
    "heavy plugin side": ("harness/planted_heavy.py", "import numpy as np\n", starts_heavy, "numpy"),
    "the package from the store": ("store/planted_package.py", "from pytest_jaxlog import run\n", bad_imports,
                                   "pytest_jaxlog (layer __init__, rank 7 >= store's 3)"),
    "the package as jl": ("check/planted_jl.py", "def f():\n    import pytest_jaxlog as jl\n    return jl\n",
                          bad_imports, "pytest_jaxlog (layer __init__, rank 7 >= check's 3)"),
    "the package relatively": ("record/planted_relative_package.py", "from .. import run\n", bad_imports,
                               "pytest_jaxlog.run (unknown layer)"),
    "the version from the package": ("store/planted_version.py", "from .. import __version__\n", bad_imports,
                                     "pytest_jaxlog.__version__ (unknown layer)"),
    "a later phase of drive": ("drive/prepare/planted_up.py", "def f():\n    from ..host import loop\n    return loop\n",
                               bad_phase_imports, "pytest_jaxlog.drive.host (drive's host, rank 3 >= prepare's 0)"),
    "drive's verbs from a phase": ("drive/device/planted_verb.py", "from .. import run\n", bad_phase_imports,
                                   "pytest_jaxlog.drive.run (drive's run, rank 4 >= device's 1)"),
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_a_planted_violation_is_flagged(copy_of_package, case):
    rel, text, check, said = PLANTED[case]
    path = copy_of_package / rel
    path.write_text(text)
    try:
        flagged = check(path, copy_of_package)
    finally:
        path.unlink()
    assert any(said in line for line in flagged), flagged


def test_a_circle_through_an_annotation_only_import_is_flagged(copy_of_package):
    """The phase check lets an annotation-only import run up (it is never executed); the circle
    it closes is still flagged."""
    plan = copy_of_package / "drive" / "device" / "plan.py"
    original = plan.read_text()
    plan.write_text(original + "\nif TYPE_CHECKING:\n    from ..host.loop import RunLoop\n")
    try:
        assert bad_phase_imports(plan, copy_of_package) == []
        found = circles(copy_of_package)
    finally:
        plan.write_text(original)
    # loop imports chunks, which imports plan
    assert found == [("pytest_jaxlog.drive.device.chunks", "pytest_jaxlog.drive.device.plan",
                      "pytest_jaxlog.drive.host.loop")]
    assert circles(copy_of_package) == []


def test_jax_at_load_in_a_lower_layer_is_flagged(copy_of_package):
    planted = copy_of_package / "record" / "zz_planted.py"
    planted.write_text("import jax\n")
    try:
        flagged = jax_at_load("record", copy_of_package)
    finally:
        planted.unlink()
    assert flagged == ["pytest_jaxlog.record.zz_planted imports jax when loaded"]
    # through another module: errors.py importing a layer that starts jax
    errors = copy_of_package / "errors.py"
    original = errors.read_text()
    errors.write_text(original + "\nfrom .drive import run as _run  # noqa\n")
    try:
        assert jax_at_load("errors", copy_of_package) == ["pytest_jaxlog.errors imports jax when loaded"]
    finally:
        errors.write_text(original)
