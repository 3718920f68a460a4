"""Ragged batches (``jl.run(..., segments=ids)``): three spring clusters of 3, 5 and 8 atoms packed
along one axis relax by gradient descent, each until its own largest force is below a
tolerance. Checked two ways, per graph: stop steps, final positions, every recorded frame.

- Against a Python loop that relaxes each cluster alone, the same step jitted for that cluster:
  stop steps and recorded steps equal, values to float32 rounding. XLA compiles the 3-atom
  program and the 16-atom one differently (vectorised or not), which changes the last bits of
  the centroid and the spring forces (a few float32 ulps; measured up to ~2e-7), so exact
  equality is not what the arithmetic allows.
- Exactly, bit for bit, against a Python loop of the same packed step jitted on its own, with
  each graph stopped by hand where its own predicate first holds (its rows kept from then on):
  the same arithmetic, so any difference is the driver's (a frozen graph that moved, a row of
  another graph, a frame too many or too few)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.compare.golden import check_golden

SIZES = (3, 5, 8)
G = len(SIZES)
IDS = np.repeat(np.arange(G), SIZES)
STARTS = np.concatenate([[0], np.cumsum(SIZES)[:-1]])
TOL = 1e-3
LR = 0.05
MAX_STEPS = 400
X0 = np.random.default_rng(3).normal(size=(sum(SIZES), 2)).astype(np.float32)


def forces(x, ids, n_graphs):
    """Springs of rest length 1 from each atom to its cluster's centroid."""
    count = jax.ops.segment_sum(jnp.ones(x.shape[0], x.dtype), ids, num_segments=n_graphs)
    centre = jax.ops.segment_sum(x, ids, num_segments=n_graphs) / count[:, None]
    d = x - centre[ids]
    r = jnp.sqrt(jnp.sum(d * d, axis=1, keepdims=True))
    return -2.0 * (r - 1.0) * d / r


def fmax(x, ids, n_graphs):
    return jax.ops.segment_max(jnp.max(jnp.abs(forces(x, ids, n_graphs)), axis=1), ids, num_segments=n_graphs)


def make_step(ids, n_graphs):
    def step(s):
        f = forces(s["x"], ids, n_graphs)
        return {"x": s["x"] + LR * f, "fmax": jax.ops.segment_max(jnp.max(jnp.abs(f), axis=1), ids,
                                                                   num_segments=n_graphs)}
    return step


STEP = make_step(IDS, G)


def until(s):
    return fmax(s["x"], IDS, G) < TOL


def near(s):  # per graph: kept where the cluster is nearly relaxed
    return fmax(s["x"], IDS, G) < 20 * TOL


RECORD = {"x": lambda s: s["x"], "f": lambda s: s["fmax"],
          "late": jl.Record(lambda s: s["x"], when=near), "x5": jl.Record(lambda s: s["x"], every=5)}


def state():
    return {"x": jnp.asarray(X0), "fmax": jnp.zeros(G, jnp.float32)}


def alone(g):
    """Cluster ``g`` relaxed alone in a Python loop: its stop step and, per record, (steps, values)."""
    n = SIZES[g]
    ids = np.zeros(n, np.int32)
    step = jax.jit(make_step(ids, 1))
    done = jax.jit(lambda x: fmax(x, ids, 1)[0] < TOL)
    nearly = jax.jit(lambda x: fmax(x, ids, 1)[0] < 20 * TOL)
    s = {"x": jnp.asarray(X0[STARTS[g]:STARTS[g] + n]), "fmax": jnp.zeros(1, jnp.float32)}
    out = {"x": [], "f": [], "late": [], "x5": []}
    k = 0
    while True:
        x = np.asarray(s["x"])
        out["x"].append((k, x))
        out["f"].append((k, np.asarray(s["fmax"])[0]))
        if bool(nearly(s["x"])):
            out["late"].append((k, x))
        if k % 5 == 0:
            out["x5"].append((k, x))
        if bool(done(s["x"])) or k == MAX_STEPS:
            return k, out
        s = step(s)
        k += 1


def packed():
    """The packed step in a Python loop, each graph stopped by hand at its first step where
    ``until`` holds: per graph its stop step and, per record, (steps, values)."""
    step, stop, nearly = jax.jit(STEP), jax.jit(until), jax.jit(near)
    s, done = state(), np.full(G, -1)
    out: list[dict] = [{"x": [], "f": [], "late": [], "x5": []} for _ in range(G)]
    k = 0
    while True:
        x, f, flags = np.asarray(s["x"]), np.asarray(s["fmax"]), np.asarray(nearly(s))
        for g in np.flatnonzero(done < 0):
            rows = x[STARTS[g]:STARTS[g] + SIZES[g]]
            out[g]["x"].append((k, rows))
            out[g]["f"].append((k, f[g]))
            if flags[g]:
                out[g]["late"].append((k, rows))
            if k % 5 == 0:
                out[g]["x5"].append((k, rows))
        done[(done < 0) & np.asarray(stop(s))] = k
        if (done >= 0).all() or k == MAX_STEPS:
            return [(int(done[g]), out[g]) for g in range(G)], x
        new = step(s)
        s = {"x": jnp.where((done >= 0)[IDS][:, None], s["x"], new["x"]),
             "fmax": jnp.where(done >= 0, s["fmax"], new["fmax"])}
        k += 1


@pytest.fixture(scope="module")
def reference():
    return [alone(g) for g in range(G)]


@pytest.fixture(scope="module")
def exact():
    return packed()


@pytest.mark.parametrize("chunk", [None, 7])
def test_each_graph_stops_and_records_as_it_would_alone(reference, exact, tmp_path, chunk):
    run = jl.run(STEP, state(), MAX_STEPS, segments=IDS, until=until, record=RECORD, chunk=chunk, progress=False,
                 sinks=[jl.HDF5Writer(tmp_path / "t.h5")])
    stops = [k for k, _ in reference]
    assert len(set(stops)) == G  # the clusters stop at different steps
    assert run.stop_reason == "until" and run.steps_done == max(stops)
    np.testing.assert_array_equal(run.systems_done, stops)
    assert [k for k, _ in exact[0]] == stops
    np.testing.assert_array_equal(run.state["x"], exact[1])  # the final state, bit for bit
    for g in range(G):  # each cluster's rows as its own loop left them, to rounding
        rows = slice(STARTS[g], STARTS[g] + SIZES[g])
        np.testing.assert_allclose(np.asarray(run.state["x"])[rows], reference[g][1]["x"][-1][1], rtol=1e-5, atol=1e-6)
    for traj in (run.trajectory, jl.load(tmp_path / "t.h5")):  # the file alone splits the rows by graph
        assert traj.schema.segments == SIZES
        np.testing.assert_array_equal(traj.systems_done, stops)
        assert traj["x"].shape == (max(stops) + 1, sum(SIZES), 2)
        for g in range(G):
            mine = traj.system(g)
            assert mine.steps_done == stops[g]
            for name in RECORD:
                steps = [k for k, _ in reference[g][1][name]]
                values = np.stack([v for _, v in reference[g][1][name]])
                np.testing.assert_array_equal(mine.steps(name), steps, err_msg=f"graph {g} {name}")
                np.testing.assert_allclose(mine[name], values, rtol=1e-5, atol=1e-6, err_msg=f"graph {g} {name}")
                np.testing.assert_array_equal(mine.steps(name), [k for k, _ in exact[0][g][1][name]])
                np.testing.assert_array_equal(mine[name], np.stack([v for _, v in exact[0][g][1][name]]),
                                              err_msg=f"graph {g} {name}")
            assert mine["x"].shape == (stops[g] + 1, SIZES[g], 2)
            assert mine["f"].shape == (stops[g] + 1,)


def test_a_finished_graphs_rows_stay_frozen_and_its_aux_rows_are_marked(exact):
    """The step's aux per row and per graph: after a graph stops, its rows of aux are NaN and its
    atoms' recorded positions are those at its stop."""
    def step(s):
        f = forces(s["x"], IDS, G)
        return STEP(s), {"force": f, "norm": jax.ops.segment_max(jnp.max(jnp.abs(f), axis=1), IDS, num_segments=G)}

    run = jl.run(step, state(), MAX_STEPS, segments=jnp.asarray(IDS), until=until, has_aux=True,
                 record={"x": lambda s: s["x"]}, progress=False)
    traj, first = run.trajectory, min(k for k, _ in exact[0])
    g = int(np.argmin(run.systems_done))
    rows = slice(STARTS[g], STARTS[g] + SIZES[g])
    assert np.isnan(traj["aux/force"][first:, rows]).all() and np.isnan(traj["aux/norm"][first:, g]).all()
    assert np.isfinite(traj["aux/force"][:first]).all()
    after = traj["x"][first:, rows]
    np.testing.assert_array_equal(after, np.broadcast_to(exact[0][g][1]["x"][-1][1], after.shape))
    assert traj.system(g)["aux/force"].shape == (first, SIZES[g], 2)  # only its live rows, from step 1


def test_a_row_violation_names_the_graph_and_the_atom_within_it():
    hit = STARTS[1] + 2  # atom 2 of graph 1

    def step(s):
        x = STEP({"x": s["x"], "fmax": s["fmax"]})["x"]
        bad = (s["k"] == 6) & (jnp.arange(x.shape[0]) == hit)[:, None] & (jnp.arange(2) == 1)[None, :]
        return {"x": jnp.where(bad, jnp.nan, x), "fmax": s["fmax"], "k": s["k"] + 1}

    with pytest.raises(jl.InvariantViolation) as info:
        jl.run(step, {**state(), "k": jnp.int32(0)}, 20, segments=IDS, record={"x": lambda s: s["x"]},
               invariants=[jl.finite("x")], progress=False)
    v = info.value
    assert (v.step, v.system, v.index) == (7, 1, (2, 1))
    assert "at step 7 (system 1)" in str(v) and "x[2, 1]" in str(v)


def test_a_segmented_run_resumed_from_a_checkpoint_is_the_uninterrupted_run(reference, tmp_path):
    first = min(k for k, _ in reference)
    cut = first + 3  # a graph already finished at the checkpoint
    common = dict(segments=IDS, until=until, record=RECORD, chunk=9, progress=False, checkpoint=jl.every(cut))
    whole = jl.run(STEP, state(), MAX_STEPS, sinks=[jl.HDF5Writer(tmp_path / "whole.h5")], **common)
    jl.run(STEP, state(), cut, sinks=[jl.HDF5Writer(tmp_path / "cut.h5")], **common)
    resumed = jl.resume(tmp_path / "cut.h5", STEP, MAX_STEPS, from_step=cut, **common)
    np.testing.assert_array_equal(resumed.systems_done, whole.systems_done)
    np.testing.assert_array_equal(resumed.state["x"], whole.state["x"])
    a, b = jl.load(tmp_path / "whole.h5"), jl.load(tmp_path / "cut.h5")
    assert b.schema.segments == SIZES
    for name in a.records:
        np.testing.assert_array_equal(b.steps(name), a.steps(name), err_msg=name)
        np.testing.assert_array_equal(b[name], a[name], err_msg=name)


@pytest.mark.parametrize("ids, match", [
    (np.array([0, 0, 1, 0, 2]), r"must be sorted .* row 3 is of graph 0 after row 2 of graph 1"),
    (np.array([0, 0, 2, 2, 2]), r"graph 1 has no rows"),
    (np.array([1, 1, 2, 2, 2]), r"numbered from 0, and the first row's graph is 1"),
    (np.array([0.0, 1.0, 1.0, 2.0, 2.0]), r"must be an int array .* got dtype float64"),
    (np.zeros((5, 1), np.int32), r"shape \[rows\] .* got shape \[5, 1\]"),
])
def test_bad_segments_are_refused_naming_the_cause(ids, match):
    s = {"x": jnp.zeros((5, 2))}
    with pytest.raises(jl.JaxlogError, match=r"\[jaxlog\] segments=.*" + match):
        jl.run(lambda s: s, s, 3, segments=ids, progress=False)


def test_segments_that_fit_no_leaf_or_conflict_with_batched_are_refused():
    s = {"x": jnp.zeros((5, 2))}
    with pytest.raises(jl.JaxlogError, match=r"segments= holds 2 graphs, but batched=3 says 3 systems"):
        jl.run(lambda s: s, s, 3, segments=np.array([0, 0, 1, 1, 1]), batched=3, progress=False)
    with pytest.raises(jl.JaxlogError, match=r"segments= gives 4 rows in 2 graphs, but no state leaf leads with 4 "
                                             r"\(rows\) or 2 \(graphs\) \(leading sizes: \[5\]\)"):
        jl.run(lambda s: s, s, 3, segments=np.array([0, 0, 1, 1]), progress=False)


def test_per_graph_until_refuses_a_leaf_laid_out_by_neither_rows_nor_graphs():
    s = {"x": jnp.asarray(X0), "edges": jnp.zeros((7, 2), jnp.int32)}
    with pytest.raises(jl.JaxlogError, match=r"until= per graph \(segments=, 3 graphs of 16 rows\): state leaf "
                                             r"\['edges'\] has leading axis 7"):
        jl.run(lambda s: s, s, 3, segments=IDS, until=lambda s: fmax(s["x"], IDS, G) < TOL, progress=False)


@pytest.mark.parametrize("bad", [[], [3, 0], [2.0, 3], "abc", [True, 2]])
def test_a_schema_with_sizes_that_are_no_graphs_is_refused(bad):
    """A file's ``segments`` are checked when its schema is read: a reader splitting rows by them
    never gets an empty graph, a fraction or a list that is not one."""
    from pytest_jaxlog.record.frames import Schema

    good = Schema.from_json({"leaves": [], "batched": True, "dt": None, "segments": [3, 5]})
    assert good.n_systems == 2 and good.segments == (3, 5)
    with pytest.raises(jl.JaxlogError, match=r"\[jaxlog\] segments .* are not rows per graph"):
        Schema.from_json({"leaves": [], "batched": True, "dt": None, "segments": bad})


def test_a_golden_of_a_segmented_run_keeps_its_graphs(tmp_path):
    """A golden trimmed to some records and steps is still split by graph, and compares equal
    to the run it was made from."""
    common = dict(segments=IDS, until=until, record=RECORD, chunk=9, progress=False)
    run = jl.run(STEP, state(), MAX_STEPS, sinks=[jl.HDF5Writer(tmp_path / "a.h5")], **common)
    golden = tmp_path / "golden.h5"
    assert check_golden(run, golden, regen=True, records=["x"]) == "regenerated"
    stored = jl.load(golden)
    assert stored.schema.segments == SIZES and stored.records == ("x",)
    for g in range(G):
        np.testing.assert_array_equal(stored.system(g)["x"], run.trajectory.system(g)["x"])
    assert check_golden(run, golden, regen=False, records=["x"]) == "ok"


def test_a_keyed_segmented_step_gets_one_key_per_graph():
    """Noise per graph: the step gets ``fold_in(fold_in(key, k), g)`` for graph g, as batched
    runs do, checked against a Python loop folding the keys itself."""
    key = jax.random.key(7)

    def noisy(keys, s):
        kicks = jax.vmap(lambda k: jax.random.normal(k, ()))(keys)  # one number per graph
        return {"x": s["x"] + 1e-3 * kicks[IDS][:, None], "fmax": s["fmax"]}

    run = jl.run(noisy, state(), 6, key=key, segments=IDS, record={"x": lambda s: s["x"]}, progress=False)
    s = state()
    for k in range(6):
        kk = jax.random.fold_in(key, k)
        keys = jnp.stack([jax.random.fold_in(kk, g) for g in range(G)])
        s = jax.jit(noisy)(keys, s)
        np.testing.assert_array_equal(run.trajectory["x"][k + 1], np.asarray(s["x"]))
    for g in range(G):
        assert run.trajectory.system(g)["x"].shape == (7, SIZES[g], 2)
