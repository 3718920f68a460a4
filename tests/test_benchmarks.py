"""The benchmark scripts reach into the driver (a loop of its own chunk program, the programs two
runs compiled): their helpers run here on small kernels, so a change inside the package that
breaks them fails the suite instead of the next benchmark run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import pytest_jaxlog as jl

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"jaxlog_benchmark_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)  # argparse runs only under __main__
    return module


def test_the_chunk_program_loop_dispatches_the_runs_own_program():
    """benchmarks/run.py's dispatch references: jl.run's chunk program, one step at a time, a few
    or all steps in one dispatch, reaches the state a run of as many steps reaches, bit for bit
    (one program, any chunk)."""
    bench = _script("run")
    step, state, energy, positions = bench.oscillators(16)
    record, _ = bench.standard(energy, positions)
    run = jl.run(step, state, 5, record=record, progress=False)
    for per_dispatch in (1, 2, 5):
        got = bench._chunk_program_loop(step, state, record, 5, per_dispatch=per_dispatch, initial=True)()
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(run.state)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(run.state.x), np.asarray(state.x))  # it stepped


def test_the_log_benchmark_compares_the_programs_two_runs_compiled():
    """benchmarks/log.py: a step that logs its largest force and one returning it as aux compile
    to the same chunk program (docs/performance.md's "identical chunk executable")."""
    bench = _script("log")
    state, step_log, step_aux, _, _ = bench.lj_steps(n_side=2)
    assert bench.same_chunk_program(state, step_log, step_aux) is True


def test_the_false_alarm_campaign_runs_its_sessions_and_tables():
    """benchmarks/false_alarms.py on a tiny sample (its campaign is hundreds of sessions): one A/A and
    one 1.25x session in a worker process, both timers each, and its table and targets from them."""
    bench = _script("false_alarms")
    args = type("Args", (), {"base": 4, "steps": 2})()
    phase = bench.Phase("quiet", {"A/A": 1, "1.25x": 1})
    specs = bench._specs(phase, args)
    assert [(s["case"], s["k"], s["timers"]) for s in specs] == [("A/A", 4, ["wall", "cpu"]), ("1.25x", 5, ["cpu", "wall"])]
    found = bench._run_sessions(specs, {"repeats": 6, "number": 1, "than": 1.05}, batch=2)
    assert [r["case"] for r in found] == ["A/A", "1.25x"]
    for r in found:
        for timer in ("wall", "cpu"):
            got = r["results"][timer]
            assert got["verdict"] in ("slower", "not slower", "cannot tell") and got["repeats"] == 6
            assert got["lo"] <= got["ratio"] <= got["hi"] and got["detectable"] == pytest.approx(1.05 * got["ratio"] / got["lo"])
    table = bench._table(found, [phase])
    assert table[0].startswith("| load | timer | case | sessions | slower |") and len(table) == 2 + 4
    assert table[2].startswith("| quiet | wall | A/A | 1 | ")
    targets = bench._targets(found, judge=False)
    assert targets[0].startswith("wall: false alarms (A/A 'slower'): ") and "not judged (--quick)" in targets[0]
