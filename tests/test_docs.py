"""Every ```python block of the guides in docs/ runs, so none can go stale.

A page is a tutorial: its blocks run in order in one namespace, in a temporary directory, on the
CPU. A block that cannot run on its own says so in an HTML comment on the line before it:
``<!-- docs: test-file -->`` (a test meant for a test file: written to one and run by pytest in a
subprocess, which must pass) or ``<!-- docs: skip (reason) -->`` (not run; the reason is required,
and skips stay few). Also here: the README's example is the first guide's, the API page names every
public name, the site's navigation lists every page, and the benchmark table lives in the docs.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import pytest_jaxlog

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MARK = re.compile(r"<!-- docs: (test-file|skip) ?(?:\((.+)\))? ?-->")
MAX_SKIPS = 3  # each needs a reason; more than this and the guides stop being checked


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    code: str
    mode: str  # "run", "test-file" or "skip"
    reason: str | None


def blocks(path: Path) -> list[Block]:
    """The ```python blocks of a page, each with the marker on the line before its fence."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            mark = MARK.fullmatch(lines[i - 1].strip()) if i else None
            found.append(Block(path.name, i + 1, "\n".join(lines[i + 1:end]) + "\n",
                               mark.group(1) if mark else "run", mark.group(2) if mark else None))
            i = end
        i += 1
    return found


PAGES = sorted(p for p in DOCS.glob("*.md") if blocks(p))
ALL = [b for p in PAGES for b in blocks(p)]


def _run_test_files(files: list[Path], cwd: Path) -> None:
    """pytest in a subprocess over the page's test files, from a fresh directory (its own rootdir,
    goldens created there), with examples/ importable as the example suite has it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXLOG_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "examples"), env.get("PYTHONPATH", "")])
    env["JAX_PLATFORMS"] = "cpu"
    (cwd / "pytest.ini").write_text("[pytest]\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
                           "--jaxlog-create-goldens", *[f.name for f in files]],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"{len(files)} passed" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_runs(page: Path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    test_files = []
    for block in blocks(page):
        where = f"docs/{block.page}:{block.line}"
        if block.mode == "run":
            try:
                exec(compile(block.code, where, "exec"), namespace)  # noqa: S102 - the page's own code
            except Exception as e:
                raise AssertionError(f"the block at {where} failed: {type(e).__name__}: {e}") from e
        elif block.mode == "test-file":
            path = tmp_path / f"test_{page.stem.replace('-', '_')}_{block.line}.py"
            path.write_text(block.code)
            test_files.append(path)
    if test_files:
        _run_test_files(test_files, tmp_path)


def test_skips_are_few_and_say_why():
    skipped = [b for b in ALL if b.mode == "skip"]
    assert all(b.reason and b.reason.strip() for b in skipped), [f"{b.page}:{b.line}" for b in skipped]
    assert len(skipped) <= MAX_SKIPS, [f"{b.page}:{b.line} ({b.reason})" for b in skipped]
    # a marker that does not parse would leave its block run (or not) by accident
    for page in DOCS.glob("*.md"):
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if "<!-- docs:" in line:
                assert MARK.fullmatch(line.strip()), f"{page.name}:{n}: unknown marker {line.strip()!r}"
    assert [b for b in ALL if b.mode == "run"] and [b for b in ALL if b.mode == "test-file"]


def test_the_readme_example_is_the_first_guides():
    readme = ROOT / "README.md"
    (example,) = [b.code for b in blocks(readme)]
    first = blocks(DOCS / "first-test.md")
    assert any(b.code == example and b.mode == "test-file" for b in first)


def test_the_readme_links_resolve():
    """The README is read on GitHub and in the sdist: its relative links point at files that exist."""
    links = re.findall(r"\]\(([^)#]+)\)", (ROOT / "README.md").read_text())
    relative = [link for link in links if "://" not in link]
    assert len(relative) >= 10
    assert [link for link in relative if not (ROOT / link).exists()] == []


def test_the_api_page_names_every_public_name():
    text = (DOCS / "reference.md").read_text()
    named = set(re.findall(r"^::: pytest_jaxlog\.[\w.]+\.(\w+)$", text, flags=re.M))
    assert set(pytest_jaxlog.__all__) - named == set()
    assert named - set(pytest_jaxlog.__all__) == set()


def _nav_pages(nav) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for v in nav.values() for p in _nav_pages(v)]
    return [p for item in nav for p in _nav_pages(item)]


def test_the_site_lists_every_page():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    assert sorted(nav) == sorted(p.name for p in DOCS.glob("*.md"))
    assert len(nav) == len(set(nav))


def test_the_benchmark_table_lives_in_the_performance_page():
    begin, end = "<!-- benchmarks:begin -->", "<!-- benchmarks:end -->"
    page = (DOCS / "performance.md").read_text()
    assert page.count(begin) == 1 and page.count(end) == 1 and page.index(begin) < page.index(end)
    assert "| measurement | workload |" in page.split(begin, 1)[1].split(end, 1)[0]
    assert begin not in (ROOT / "README.md").read_text()
    assert 'PAGE = ROOT / "docs" / "performance.md"' in (ROOT / "benchmarks" / "run.py").read_text()


def test_the_benchmark_script_rewrites_the_performance_page(tmp_path):
    """benchmarks/run.py --docs (and --readme, its old name) replaces the table between the markers and
    nothing else."""
    spec = importlib.util.spec_from_file_location("jaxlog_benchmark_run_docs", ROOT / "benchmarks" / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)  # argparse runs only under __main__
    assert module.parser().parse_args(["--docs"]).docs and module.parser().parse_args(["--readme"]).docs
    assert not module.parser().parse_args([]).docs
    page = (DOCS / "performance.md").read_text()
    copy = tmp_path / "performance.md"
    copy.write_text(page)
    module.PAGE = copy
    module.write_page("| a | new | table |")
    before, after = page.split(module.BEGIN)[0], page.split(module.END)[1]
    assert copy.read_text() == f"{before}{module.BEGIN}\n| a | new | table |\n{module.END}{after}"


def _between(text: str, name: str) -> str:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    assert text.count(begin) == 1 and text.count(end) == 1, name
    return text.split(begin, 1)[1].split(end, 1)[0]


def _keyword_only(fn) -> set[str]:
    import inspect

    return {p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}


def test_the_fixture_page_lists_every_keyword_of_jaxlog_run_and_resume():
    """The table of the fixture's own keywords is its signatures' (``timeline=`` the fixture takes
    out of the keywords it passes on), and the keywords said to pass unchanged are the rest of
    ``jl.run``'s and ``jl.resume``'s: a keyword added to either side without its line fails here."""
    from pytest_jaxlog.harness.fixture import JaxlogFixture

    page = (DOCS / "plugin-and-ci.md").read_text()
    rows = re.findall(r"^\| `(\w+)=` \| ([a-z, ]+) \| .+ \|$", _between(page, "fixture-keywords"), flags=re.M)
    table = {side: {kw for kw, where in rows if side in where.split(", ")} for side in ("run", "resume")}
    own = {"run": _keyword_only(JaxlogFixture.run) | {"timeline"},
           "resume": _keyword_only(JaxlogFixture.resume) | {"timeline"}}
    assert table == own
    assert "name" in table["run"] and "name" in table["resume"]
    listed = {name: set(re.findall(r"`(\w+)=`", _between(page, f"fixture-{name}-passes"))) for name in ("run", "resume")}
    assert listed["run"] == _keyword_only(pytest_jaxlog.run) - own["run"]
    assert listed["resume"] == _keyword_only(pytest_jaxlog.resume) - own["resume"]
    assert _keyword_only(pytest_jaxlog.run) <= listed["run"] | own["run"]  # every keyword of jl.run is on the page


def test_the_readme_lists_every_example():
    """The README's list of examples is the example suite's files, each linked, none missing or extra."""
    readme = (ROOT / "README.md").read_text()
    listed = re.findall(r"^- \[`(test_\w+\.py)`\]\(examples/(test_\w+\.py)\): \S", _between(readme, "examples"),
                        flags=re.M)
    assert all(a == b for a, b in listed), listed
    assert sorted(a for a, _ in listed) == sorted(p.name for p in (ROOT / "examples").glob("test_*.py"))
    assert len(listed) == len({a for a, _ in listed})
