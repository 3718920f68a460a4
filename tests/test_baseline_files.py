"""Saved benchmark runs on disk and ``jaxlog benchmarks DIR``: numbering, one directory per machine,
finding a run by name, number or ``last`` (and refusing another machine's), the listing, the
comparison of two runs test by test, and the plot. Timings here are written, not measured, so
every figure is known exactly."""

from __future__ import annotations

import json
import math
import os

import pytest

from pytest_jaxlog.cli import main
from pytest_jaxlog.errors import JaxlogError
from pytest_jaxlog.compare.baseline import all_runs, find, read, save, saved_tests
from pytest_jaxlog.compare.baseline import Machine

HERE = Machine("Test CPU 1", "cpu", "cpu", "0.10.2")
THERE = Machine("Test CPU 2", "cpu", "cpu", "0.10.2")


def _tests(scale: float, flops: float = 1000.0) -> dict:
    """Two tests, each repeat's runs ``scale`` times a fixed pattern (seconds per 10 steps)."""
    pattern = [[1.0, 1.2], [1.1, 1.0], [0.9, 1.3], [1.05, 1.0], [1.0, 1.1]]
    bench = {"name": "benchmark", "steps": 10, "samples": [[t * scale for t in rep] for rep in pattern],
             "machine": HERE.to_json()}
    return {"t.py::test_a": {"benchmarks": [bench], "costs": [{"name": None, "metrics": {"flops": flops}}]},
            "t.py::test_b": {"benchmarks": [dict(bench, name="short")], "costs": []}}


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "store"
    save(root, HERE, "base", _tests(1.0))
    save(root, HERE, "slow", _tests(2.0, flops=2000.0))
    save(root, THERE, "base", _tests(1.0))
    return root


def test_runs_are_numbered_per_machine_and_found_by_name_number_or_last(store):
    assert sorted(p.relative_to(store).as_posix() for p in store.rglob("*.json")) == sorted([
        f"{HERE.key}/0001_base.json", f"{HERE.key}/0002_slow.json", f"{THERE.key}/0001_base.json"])
    assert find(store, HERE, "base").label == "0001_base"
    assert find(store, HERE, "2").label == find(store, HERE, "last").label == "0002_slow"
    assert find(store, THERE, "last").machine == THERE
    run = read(store / HERE.key / "0002_slow.json")
    assert run.count == 2 and run.benchmark("t.py::test_b", "short")["samples"][0] == [2.0, 2.4]
    assert run.benchmark("t.py::test_b", "benchmark") is None
    with pytest.raises(JaxlogError, match=r"saved run 'slow' exists in .* only for other machines: "
                       rf"{HERE.key} \(Test CPU 1; cpu cpu; jax 0.10.2\); this machine \({THERE.key}: .*"
                       r"--jaxlog-benchmark-save=NAME"):
        find(store, THERE, "slow")
    with pytest.raises(JaxlogError, match=r"no saved run 'nope' for this machine .* \(saved here: 0001_base, "
                       r"0002_slow\); save one with --jaxlog-benchmark-save=NAME"):
        find(store, HERE, "nope")


def test_two_sessions_saving_at_once_take_different_numbers_and_damaged_files_are_skipped(store):
    directory = store / HERE.key
    (directory / "0003_broken.json").write_text("{not json")
    (directory / "0009_other.json").write_text(json.dumps({"format": "something else", "tests": {}}))
    path = save(store, HERE, "next", _tests(1.0))
    assert path.name == "0010_next.json"  # after the highest number taken, readable or not
    assert [r.label for r in all_runs(directory)] == ["0001_base", "0002_slow", "0010_next"]
    with pytest.raises(JaxlogError, match="cannot read saved benchmarks"):
        read(directory / "0003_broken.json")
    assert not list(directory.glob(".saving-*"))


def test_saved_tests_keep_the_timings_not_the_comparison():
    entries = [{"nodeid": "t.py::b", "benchmarks": [{"name": "benchmark", "steps": 1, "samples": [[1.0]],
                                                     "compare": {"ratio": 2.0}}], "costs": []},
               {"nodeid": "t.py::a", "benchmarks": [], "costs": [{"metrics": {"flops": 1}}]}]
    assert saved_tests(entries) == {"t.py::b": {"benchmarks": [{"name": "benchmark", "steps": 1, "samples": [[1.0]]}],
                                                "costs": []}}


def test_cli_lists_saved_runs_per_machine(store, capsys):
    assert main(["benchmarks", str(store)]) == 0
    out = capsys.readouterr().out.splitlines()
    here = out.index(f"{HERE.key}: Test CPU 1; cpu cpu; jax 0.10.2")  # machines in the order of their keys
    assert out[here + 1].startswith("  0001_base  20") and out[here + 1].endswith("UTC  2 tests, 2 benchmarks")
    assert out[here + 2].startswith("  0002_slow  20")
    there = out.index(f"{THERE.key}: Test CPU 2; cpu cpu; jax 0.10.2")
    assert out[there + 1].startswith("  0001_base") and len(out) == 5 and (here < there) == (HERE.key < THERE.key)


def test_cli_compares_two_runs_of_one_machine(store, capsys):
    assert main(["benchmarks", str(store), "--compare", f"{HERE.key}/base", "slow"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"0002_slow against 0001_base ({HERE.key}): time per step of 0002_slow over 0001_base"
    assert out[1].split() == ["test", "0001_base", "steps/s", "0002_slow", "steps/s", "time", "ratio", "interval",
                              "verdict", "could", "detect"]
    # every repeat twice as long: each difference of logs is log 2 plus a spread, the HL ratio exactly 2
    rows = [line.split() for line in out[2:]]
    assert [r[0] for r in rows] == ["t.py::test_a", "t.py::test_b"]
    assert rows[0][1:4] == ["9.8", "4.9", "x2.000"]  # 10 steps / the median 1.025 s of the 10 runs; twice as long
    assert all(r[-2] == "slower" for r in rows)
    # the interval of test_a: every now/saved ratio is 2 times a ratio of two pattern values (Moses, 5 x 5: k = 3)
    pattern = [1.0, 1.0, 0.9, 1.0, 1.0]  # each repeat's fastest run
    plain = sorted(2 * a / b for a in pattern for b in pattern)
    assert rows[0][4:6] == [f"[{plain[2]:.3f},", f"{plain[22]:.3f}]"]
    assert rows[0][-1] == f"x{1.1 * 2.0 / plain[2]:.3f}"  # detectable at the default threshold, 1.10
    assert main(["benchmarks", str(store), "--compare", f"{HERE.key}/base", f"{THERE.key}/base"]) == 2
    assert "were saved on different machines" in capsys.readouterr().err
    assert main(["benchmarks", str(store), "--compare", "base", "slow"]) == 2  # 'base' is on both machines
    assert f"exists for several machines ({', '.join(sorted([HERE.key, THERE.key]))}): name it as MACHINE/base" in capsys.readouterr().err


def test_cli_plots_steps_per_second_and_flops_across_runs(store, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "runs.png"
    assert main(["benchmarks", str(store), "--plot", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out} (3 saved runs, 2 machines)")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and os.path.getsize(out) > 10_000


def test_cli_names_a_missing_directory(tmp_path, capsys):
    assert main(["benchmarks", str(tmp_path / "none")]) == 2
    assert "benchmark storage directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["benchmarks", str(tmp_path / "empty")]) == 0
    assert "no saved benchmark runs" in capsys.readouterr().out


def test_the_machine_key_is_a_safe_directory_name():
    odd = Machine("cpu", "gpu", "NVIDIA H100 80GB HBM3 / ../x", "0.12.0")
    assert "/" not in odd.key and odd.key.startswith("gpu-NVIDIA_H100_80GB_HBM3_.._x-jax0.12.0-")
    assert math.isfinite(len(odd.key)) and len(odd.key) < 100
