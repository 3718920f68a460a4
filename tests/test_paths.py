"""How paths are shown (``pytest_jaxlog.paths``): relative from the working directory wherever the
file lies inside the project, ``../`` included; absolute outside it; the core's golden messages
follow the project a pytest session registers, and stop when it ends."""

from __future__ import annotations

import os

import pytest

from pytest_jaxlog.compare.golden import display_path
from pytest_jaxlog.paths import shown, use_project


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "project"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    return root


def test_inside_the_project_paths_are_relative_from_where_the_command_ran(project):
    sub = project / "sub"
    assert shown(project / ".jaxlog" / "t" / "trajectory.h5", cwd=project, root=project) == \
        os.path.join(".jaxlog", "t", "trajectory.h5")
    assert shown(project / ".jaxlog" / "t.h5", cwd=sub, root=project) == os.path.join("..", ".jaxlog", "t.h5")
    assert shown(sub / "x.h5", cwd=sub, root=project) == "x.h5"
    assert shown("rel/x.h5", cwd=sub, root=project) == os.path.join("rel", "x.h5")  # relative input: from cwd


def test_outside_the_project_paths_are_absolute(project):
    outside = project.parent / "elsewhere" / "t.h5"
    assert shown(outside, cwd=project, root=project) == str(outside.resolve())
    # started outside the project: a file inside it is absolute too (a ../.. path would mean nothing)
    inside = project / "sub" / "t.h5"
    assert shown(inside, cwd=project.parent / "elsewhere", root=project) == str(inside.resolve())
    # a project the working directory is not in: relative only below the working directory
    assert shown(project / "t.h5", cwd=project / "sub", root=project.parent / "elsewhere") == \
        str((project / "t.h5").resolve())


def test_a_session_registers_its_project_for_the_cores_messages(project, monkeypatch):
    monkeypatch.chdir(project / "sub")
    golden = project / "fixtures" / "golden" / "t.h5"
    assert display_path(golden) == str(golden.resolve())
    undo = use_project(project)
    try:
        assert display_path(golden) == os.path.join("..", "fixtures", "golden", "t.h5")
        inner = use_project(project / "sub")  # a session inside a session (pytester): the innermost wins
        assert display_path(golden) == str(golden.resolve())
        inner()
        assert display_path(golden) == os.path.join("..", "fixtures", "golden", "t.h5")
    finally:
        undo()
    assert display_path(golden) == str(golden.resolve())
