"""``MLflowSink``: scalar records as an MLflow run's metrics, in any tracking store (a local
``file:`` store needs no server).

Why through ``MlflowClient`` and not ``mlflow.start_run``: the client writes to the run it
created, so the sink neither takes nor ends the process's active run (a test's own MLflow run
goes on beside it). MLflow keeps metric values as float64: float32 and float64 records are kept
exactly, integers beyond 2**53 are not.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from ..errors import JaxlogError
from ..record.frames import Schema
from .background import QUEUE_BYTES, STALL_S
from .dashboard import DashboardSink, Ending, StepMetrics, missing_extra

# what MLflow takes as a metric, param or tag name (mlflow.utils.validation), and how many per log_batch
NAME = re.compile(r"[\w\-. :/]+")
METRICS_PER_BATCH = 1000
PARAMS_PER_BATCH = 100
PARAM_CHARS = 6000
STATUS = {"complete": "FINISHED", "stopped": "KILLED", "violated": "FAILED", "failed": "FAILED"}


class MLflowSink(DashboardSink):
    """Sink logging scalar records as metrics of a new MLflow run (``client.log_batch``, step =
    the run's step number), in experiment ``experiment`` (made when missing) of ``tracking_uri``.

    Metric keys: a record's path (``energy/total``); in batched runs one key per system
    (``energy/system_3``), each system a line of the record's section in the run's charts.
    ``records=None`` takes every real scalar record (bools as 0/1); naming another is an error.
    ``tracking_uri``: ``"file:/path/mlruns"`` or a directory (a local file store), or any URI
    MLflow takes (``http://...``, ``sqlite:///mlflow.db``). MLflow 3 keeps its file store behind
    ``MLFLOW_ALLOW_FILE_STORE=true``; without it a ``file:`` URI is refused with what to do.

    The run's description (driver, steps, chunk, dt; ``jaxlog.<key>``) and the ``meta=`` given to
    ``jl.run`` (``meta.<key>``, nested keys joined with dots) are its params, strings as they are,
    other values as JSON; ``tags``, its tags. At the end the tags ``jaxlog.status`` and
    ``jaxlog.steps_done`` (and ``jaxlog.violation``, JSON) say how the run ended, and the MLflow run
    is terminated ``FINISHED`` (complete), ``KILLED`` (stopped) or ``FAILED``. ``run_id`` names the
    run once open. Needs the extra: ``pip install 'pytest-jaxlog[mlflow]'``.
    """

    kind = "MLflow"

    def __init__(self, tracking_uri: str | os.PathLike, records: list[str] | tuple[str, ...] | None = None, *,
                 experiment: str = "jaxlog", run_name: str | None = None, tags: dict[str, str] | None = None,
                 queue_bytes: int = QUEUE_BYTES, stall_timeout_s: float = STALL_S):
        try:
            import mlflow  # noqa: F401  (the library is an optional extra: refused here, before any run)
        except ImportError as exc:
            raise missing_extra("jl.MLflowSink", "mlflow", "mlflow", exc) from None
        super().__init__(records, queue_bytes=queue_bytes, stall_timeout_s=stall_timeout_s)
        self.tracking_uri = Path(tracking_uri).resolve().as_uri() if isinstance(tracking_uri, os.PathLike) \
            else str(tracking_uri)
        self.experiment, self.run_name = str(experiment), run_name
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self.client: Any = None
        self.run_id: str | None = None
        self._run_dir: Path | None = None

    def _start(self, schema: Schema, meta: dict[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        for keys in self.keys.values():
            for key in keys:
                _check_name(key, f"{self!r}: record {key.rsplit('/system_', 1)[0]!r}", "metric")
        params = _params(meta.get("run", {}), repr(self))
        try:
            client = MlflowClient(tracking_uri=self.tracking_uri)
        except MlflowException as exc:
            if "MLFLOW_ALLOW_FILE_STORE" not in str(exc):
                raise
            raise JaxlogError(f"{self!r}: this MLflow ({_version()}) keeps its file store behind an environment "
                              "variable: set MLFLOW_ALLOW_FILE_STORE=true (in the shell, or os.environ before the "
                              "run), or give a database tracking_uri such as 'sqlite:///mlflow.db' (the full "
                              "mlflow package)") from None
        found = client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found is not None else client.create_experiment(self.experiment)
        run = client.create_run(experiment_id, run_name=self.run_name, tags=self.tags)
        self.client, self.run_id = client, run.info.run_id
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), PARAMS_PER_BATCH):
            client.log_batch(self.run_id, params=items[i:i + PARAMS_PER_BATCH])
        self._run_dir = _local_run_dir(run.info.artifact_uri)

    def _log(self, metrics: list[StepMetrics]) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        batch = [Metric(key, float(value), stamp, m.step) for m in metrics for key, value in m.values.items()]
        for i in range(0, len(batch), METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[i:i + METRICS_PER_BATCH])

    def _finish(self, ending: Ending) -> None:
        if self.run_id is None:
            return
        from mlflow.entities import RunTag

        tags = [RunTag("jaxlog.status", ending.status), RunTag("jaxlog.steps_done", str(ending.steps_done))]
        if ending.violation is not None:
            tags.append(RunTag("jaxlog.violation", _text(ending.violation)))
        self.client.log_batch(self.run_id, tags=tags)
        self.client.set_terminated(self.run_id, status=STATUS.get(ending.status, "FAILED"))

    @property
    def artifacts(self) -> dict[str, Path]:
        return {} if self._run_dir is None else {"mlflow": self._run_dir}

    def __repr__(self) -> str:
        return f"MLflowSink({self.tracking_uri!r})"


def _check_name(name: str, who: str, what: str) -> None:
    if not NAME.fullmatch(name) or name.startswith("/") or ".." in name.split("/"):
        raise JaxlogError(f"{who}: {name!r} cannot be an MLflow {what} name (letters, digits and _ - . : / and "
                          f"spaces only, no leading slash); rename it or leave it out with records=")


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= PARAM_CHARS else text[:PARAM_CHARS - 1] + "…"


def _params(run: dict[str, Any], who: str) -> dict[str, str]:
    """The run's description as MLflow params: ``jaxlog.<key>``, and its ``meta=`` flattened to
    ``meta.<key>.<key>``."""
    out: dict[str, str] = {}

    def flat(prefix: str, tree: dict) -> None:
        for k, v in tree.items():
            name = f"{prefix}.{k}"
            if isinstance(v, dict) and v:
                flat(name, v)
            else:
                _check_name(name, f"{who}: meta=", "param")
                out[name] = _text(v)

    for k, v in run.items():
        if k == "meta" and isinstance(v, dict):
            flat("meta", v)
        else:
            out[f"jaxlog.{k}"] = _text(v)
    return out


def _local_run_dir(artifact_uri: str | None) -> Path | None:
    """A file store's folder of the run (its ``artifacts`` folder's parent); None elsewhere."""
    parsed = urlparse(artifact_uri or "")
    return Path(unquote(parsed.path)).parent if parsed.scheme == "file" else None


def _version() -> str:
    import mlflow

    return f"mlflow {mlflow.__version__}"
