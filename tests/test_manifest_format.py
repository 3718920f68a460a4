"""The manifest has one owner (store.manifest): what the plugin writes is what ``jaxlog summary``
and the next session read, field for field; a damaged one is one JaxlogError naming the cause."""

from __future__ import annotations

import json

import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.store import manifest


def _doc(**over):
    fields = dict(started=1.0, finished=2.0, exitstatus=1, rootdir="..", golden_dir="../goldens",
                  settings={"keep": "failed"},
                  tests=[{"nodeid": "t.py::a", "dir": "t.a", "outcome": "failed"}, {"nodeid": "t.py::b", "dir": None}],
                  stale=[{"dir": "old", "nodeid": "t.py::c"}])
    fields.update(over)
    return manifest.document(**fields)


def test_written_and_read_back_field_for_field(tmp_path):
    path = manifest.write(tmp_path, _doc())
    assert path == tmp_path / "manifest.json" and not list(tmp_path.glob(".manifest-*"))
    doc = manifest.read(path)
    assert doc == json.loads(path.read_text()) == _doc()
    assert doc["version"] == manifest.VERSION and doc["paths"] == "relative to the directory of this file"
    assert [t["nodeid"] for t in manifest.tests(doc)] == ["t.py::a", "t.py::b"]
    assert manifest.settings(doc) == {"keep": "failed"}
    assert manifest.artifact_dirs(doc) == [{"nodeid": "t.py::a", "dir": "t.a", "outcome": "failed", "finished": 2.0},
                                           {"dir": "old", "nodeid": "t.py::c"}]
    assert manifest.find([tmp_path]) == [path] == manifest.find([path])


@pytest.mark.parametrize("text, cause", [("{not json", "Expecting"), ("[1, 2]", "not a JSON object")])
def test_a_damaged_manifest_is_one_error_naming_the_cause(tmp_path, text, cause):
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(jl.JaxlogError, match=cause):
        manifest.read(tmp_path / "manifest.json")


def test_fields_of_the_wrong_kind_read_as_absent():
    doc = {"tests": {"not": "a list"}, "stale": [3, {"dir": ""}], "settings": [1]}
    assert manifest.tests(doc) == [] and manifest.stale(doc) == [] and manifest.settings(doc) == {}
    assert manifest.artifact_dirs(doc) == []
