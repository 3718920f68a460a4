"""``jl.MLflowSink``: an MLflow run in a local file store, read back through MLflow's own client
(``MlflowClient().get_metric_history``) and compared with the trajectory the same run recorded,
value for value."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl


from pendulums import BATCHED, STATE, energy, step  # the kernel the sink tests share



@pytest.fixture
def store(tmp_path, monkeypatch):
    """A local file store's URI (MLflow 3 opens one only with MLFLOW_ALLOW_FILE_STORE set)."""
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return f"file:{tmp_path / 'mlruns'}"


def _history(client, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def _as_history(steps: np.ndarray, values: np.ndarray) -> dict[int, float]:
    return {int(k): float(v) for k, v in zip(steps, values)}


def test_a_run_is_an_mlflow_run_with_every_scalar_record_as_a_metric(store):
    from mlflow.tracking import MlflowClient

    sink = jl.MLflowSink(store, experiment="tests", run_name="plain", tags={"suite": "jaxlog"})
    run = jl.run(step, STATE, 12, record={"energy": energy, "x": lambda s: s["x"],
                                          "ke": jl.Record(lambda s: jnp.sum(s["v"] ** 2), every=5)},
                 sinks=[jl.MemorySink(), sink], chunk=4, progress=False,
                 meta={"kernel": "pendulum", "solver": {"dt": 0.01}})
    traj = run.trajectory
    client = MlflowClient(tracking_uri=store)
    got = client.get_run(sink.run_id)
    assert set(got.data.metrics) == {"energy", "ke"}  # x is not a scalar: not a metric
    for name in ("energy", "ke"):
        assert _history(client, sink.run_id, name) == _as_history(traj.steps(name), traj[name]), name
    assert sorted(_history(client, sink.run_id, "ke")) == [0, 5, 10]
    assert len(set(_history(client, sink.run_id, "energy").values())) > 1
    assert got.info.status == "FINISHED" and got.info.run_name == "plain"
    assert got.data.tags["jaxlog.status"] == "complete" and got.data.tags["jaxlog.steps_done"] == "12"
    assert got.data.tags["suite"] == "jaxlog"
    assert got.data.params["meta.kernel"] == "pendulum" and got.data.params["meta.solver.dt"] == "0.01"
    assert got.data.params["jaxlog.steps"] == "12"
    assert client.get_experiment(got.info.experiment_id).name == "tests"
    assert run.artifacts["mlflow"].name == sink.run_id and run.artifacts["mlflow"].is_dir()


def test_a_batched_run_has_a_metric_per_system_and_a_violation_fails_the_mlflow_run(store):
    from mlflow.tracking import MlflowClient

    sink = jl.MLflowSink(store)
    run = jl.run(step, BATCHED, 9, record={"energy": energy}, batched=True,
                 invariants=[jl.bounded("energy", hi=-3.5)], on_violation="record",
                 sinks=[jl.MemorySink(), sink], chunk=4, progress=False)
    traj = run.trajectory
    client = MlflowClient(tracking_uri=store)
    got = client.get_run(sink.run_id)
    assert set(got.data.metrics) == {f"energy/system_{i}" for i in range(3)}
    for i in range(3):
        assert _history(client, sink.run_id, f"energy/system_{i}") == _as_history(traj.steps("energy"),
                                                                                   traj["energy"][:, i])
    assert got.info.status == "FAILED" and got.data.tags["jaxlog.status"] == "violated"
    assert run.violation.invariant in got.data.tags["jaxlog.violation"]


def test_names_mlflow_cannot_take_are_refused_before_the_run(store):
    with pytest.raises(jl.JaxlogError, match=r"MLflowSink.*record 'e\(1\)'.*cannot be an MLflow metric name"):
        jl.run(step, STATE, 3, record={"e(1)": energy}, sinks=[jl.MLflowSink(store)], progress=False)


def test_a_file_store_mlflow_keeps_closed_is_refused_saying_how_to_open_it(store, monkeypatch):
    envs = pytest.importorskip("mlflow.environment_variables")
    if not hasattr(envs, "MLFLOW_ALLOW_FILE_STORE"):
        pytest.skip("this MLflow opens file stores without MLFLOW_ALLOW_FILE_STORE")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    with pytest.raises(jl.JaxlogError, match="set MLFLOW_ALLOW_FILE_STORE=true"):
        jl.run(step, STATE, 3, record={"energy": energy}, sinks=[jl.MLflowSink(store)], progress=False)
