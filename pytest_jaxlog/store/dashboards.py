"""Sinks that feed a dashboard: TensorBoard (its event-file format written without TensorBoard),
Weights & Biases and MLflow, and what they share."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import socket
import struct
import time
from pathlib import Path
from typing import IO, Any, Callable, Literal, Sequence
from urllib.parse import unquote, urlparse

import numpy as np

from ..errors import JaxlogError, WriterError
from ..record.frames import Frames, Schema
from .dtypes import check_frames
from .handover import QUEUE_BYTES, STALL_S, Background
from .protocol import Sink, owned, real_paths, rows_by_step, scalar_paths

__all__ = ['missing_extra', 'metric_keys', 'dashboard_paths', 'StepMetrics', 'step_metrics', 'metric_frames', 'Ending', 'DashboardSink']

def missing_extra(who: str, module: str, extra: str, exc: ImportError) -> JaxlogError:
    """The error for a sink whose optional library is not installed, naming the extra."""
    return JaxlogError(f"{who} needs the {module!r} package, which is not installed ({exc}); install the extra: "
                       f"pip install 'pytest-jaxlog[{extra}]'")


def dashboard_paths(schema: Schema, records: tuple[str, ...] | None, who: str, kind: str) -> tuple[str, ...]:
    """The records a dashboard sink shows: ``records=None``, every real scalar record (per system
    when batched); named records must be such."""
    return real_paths(schema, scalar_paths(schema, records, who, kind=kind), who)


def metric_keys(schema: Schema, paths: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Per record path, its metric keys: the path itself, or ``<path>/system_<i>`` per system."""
    n = schema.n_systems if schema.batched else None
    return {p: (p,) if n is None else tuple(f"{p}/system_{i}" for i in range(n)) for p in paths}


@dataclasses.dataclass(frozen=True)
class StepMetrics:
    """The metrics of one recorded step: ``values`` by metric key, Python numbers (bools as 0/1,
    which the dashboards plot)."""

    step: int
    values: dict[str, int | float]


def _number(value: Any) -> int | float:
    return int(value) if isinstance(value, bool) else value


def step_metrics(frames: Frames, keys: dict[str, tuple[str, ...]], n_systems: int | None) -> list[StepMetrics]:
    """The batch as one :class:`StepMetrics` per recorded step, in step order, holding the records
    scheduled at that step."""
    out = []
    for step, rows in rows_by_step(frames, tuple(keys), n_systems):
        values = {keys[p][system]: _number(v) for system, row in enumerate(rows) for p, v in row.items()}
        out.append(StepMetrics(step, values))
    return out


def metric_frames(frames: Frames, paths: tuple[str, ...]) -> Frames:
    """The frames of ``paths`` alone, owned (not views of a device's buffers), to hand to a writer
    thread."""
    out = Frames()
    for p in paths:
        steps = frames.steps.get(p)
        if steps is not None and len(steps):
            out.add(p, steps, owned(frames.values[p]))
    return out


@dataclasses.dataclass(frozen=True)
class Ending:
    """How the run ended, as a sink's ``close`` is told."""

    status: str
    steps_done: int | None
    violation: dict | None
    summary: dict | None


class DashboardSink(Sink):
    """Base of the sinks that hand scalar records to a dashboard library: the library's calls run
    on a writer thread (a dashboard's client may block on its disk or its service process; the
    run's thread only hands the batch over), and its failures surface on the caller's thread.

    A subclass says how to start its run (``_start``, on the caller's thread, at ``open``), log
    steps' metrics (``_log``, on the writer thread) and end the run (``_finish``, at ``close``)."""

    kind = "a dashboard"  # in messages: what takes the records

    def __init__(self, records: list[str] | tuple[str, ...] | None, *, queue_bytes: int, stall_timeout_s: float):
        self.records = None if records is None else tuple(records)
        self.queue_bytes, self.stall_timeout_s = int(queue_bytes), float(stall_timeout_s)
        self.keys: dict[str, tuple[str, ...]] = {}
        self._schema: Schema | None = None
        self._n_systems: int | None = None
        self._last_steps: dict[str, int] = {}
        self._bg: Background | None = None

    def _start(self, schema: Schema, meta: dict[str, Any]) -> None:
        raise NotImplementedError

    def _log(self, metrics: list[StepMetrics]) -> None:
        raise NotImplementedError

    def _finish(self, ending: Ending) -> None:
        raise NotImplementedError

    def open(self, schema: Schema, meta: dict[str, Any]) -> None:
        if self._schema is not None:
            raise JaxlogError(f"{self!r}: a sink is opened once; make a new one per run")
        self.keys = metric_keys(schema, dashboard_paths(schema, self.records, repr(self), self.kind))
        self._schema = schema
        self._n_systems = schema.n_systems if schema.batched else None
        self._library("starting", self._start, schema, meta)
        self._bg = Background(repr(self), self._write_metrics, _nothing, queue_bytes=self.queue_bytes,
                              stall_s=self.stall_timeout_s)

    def write(self, frames: Frames) -> None:
        if self._bg is None:
            raise WriterError(f"{self!r} is {'closed' if self._schema is not None else 'not open'}, cannot write")
        check_frames(self._schema, frames, self._last_steps)
        mine = metric_frames(frames, tuple(self.keys))
        if mine:
            self._bg.put(mine, sum(v.nbytes + mine.steps[p].nbytes for p, v in mine.values.items()))

    def _write_metrics(self, frames: Frames) -> None:  # the writer thread
        self._log(step_metrics(frames, self.keys, self._n_systems))

    def close(self, status: str = "complete", *, steps_done: int | None = None, violation: dict | None = None,
              summary: dict | None = None) -> None:
        """Log what was handed over, then end the dashboard's run with the run's status (``failed``
        when logging failed, whose error is raised)."""
        bg, self._bg = self._bg, None
        if bg is None:
            return
        ending = Ending(status, steps_done, violation, summary)
        try:
            bg.close()
        except BaseException as exc:
            try:
                self._library("ending", self._finish, dataclasses.replace(ending, status="failed"))
            except Exception as also:
                exc.add_note(f"[jaxlog] {also}")
            raise
        self._library("ending", self._finish, ending)

    def _library(self, what: str, fn: Callable[..., None], *args: Any) -> None:
        """``fn(*args)``, the library's own errors turned into a ``WriterError`` naming the sink."""
        try:
            fn(*args)
        except JaxlogError:
            raise
        except Exception as exc:
            raise WriterError(f"{self!r}: {what} the {self.kind} run failed: {type(exc).__name__}: {exc}") from exc


def _nothing() -> None:
    return None

# ---------------------------------------------------------------------------------------------
# ``MLflowSink``: scalar records as an MLflow run's metrics, in any tracking store (a local
# ``file:`` store needs no server).
#
# Why through ``MlflowClient`` and not ``mlflow.start_run``: the client writes to the run it
# created, so the sink neither takes nor ends the process's active run (a test's own MLflow run
# goes on beside it). MLflow keeps metric values as float64: float32 and float64 records are kept
# exactly, integers beyond 2**53 are not.

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

# ---------------------------------------------------------------------------------------------
# TensorBoard's event-file format, written without TensorBoard: TFRecord framing around
# protobuf-encoded ``Event`` messages holding scalar ``Summary`` values.
#
# Why not the ``tensorboard`` package: it brings grpcio, protobuf, werkzeug and more to write a
# few dozen bytes per step, and its writer is made for TensorFlow or PyTorch tensors. The subset
# written here is small and fixed (``file_version``, then ``wall_time``, ``step`` and
# ``summary.value[].{tag, simple_value}``); the tests read it back with TensorBoard's own reader.
#
# Why numpy: every event of one record has the same layout, so a batch of them is one byte
# matrix, and the CRC32C of all its rows is computed column by column (one numpy operation per
# byte of an event, not one Python operation per byte of the file).

FILE_VERSION = b"brain.Event:2"
_MASK_DELTA = 0xA282EAD8


def _crc32c_table() -> np.ndarray:
    poly = 0x82F63B78  # CRC-32C (Castagnoli), reflected
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(poly), table >> 1).astype(np.uint32)
    return table


_TABLE = _crc32c_table()


def crc32c_rows(rows: np.ndarray) -> np.ndarray:
    """CRC-32C of each row of a ``uint8`` matrix."""
    crc = np.full(rows.shape[0], 0xFFFFFFFF, np.uint32)
    for j in range(rows.shape[1]):
        crc = _TABLE[(crc ^ rows[:, j]) & 0xFF] ^ (crc >> np.uint32(8))
    return crc ^ np.uint32(0xFFFFFFFF)


def masked_crc(rows: np.ndarray) -> np.ndarray:
    """TFRecord's masked CRC of each row (so a CRC stored in data does not checksum to itself)."""
    crc = crc32c_rows(rows).astype(np.uint64)
    return (((crc >> np.uint64(15)) | (crc << np.uint64(17))) + np.uint64(_MASK_DELTA)).astype(np.uint32)


def frame_rows(rows: np.ndarray) -> bytes:
    """TFRecords of equal-length payloads: length, its masked CRC, payload, its masked CRC."""
    n, length = rows.shape
    head = np.zeros((n, 8), np.uint8)
    head[:] = np.frombuffer(struct.pack("<Q", length), np.uint8)
    out = np.empty((n, 16 + length), np.uint8)
    out[:, :8] = head
    out[:, 8:12] = masked_crc(head).astype("<u4").view(np.uint8).reshape(n, 4)
    out[:, 12:12 + length] = rows
    out[:, 12 + length:] = masked_crc(rows).astype("<u4").view(np.uint8).reshape(n, 4)
    return out.tobytes()


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1  # int64 fields: negative numbers as their two's complement
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def file_header(wall_time: float) -> bytes:
    """The first record of every event file: ``Event{wall_time, file_version}``."""
    event = b"\x09" + struct.pack("<d", wall_time) + _field(3, FILE_VERSION)
    return frame_rows(np.frombuffer(event, np.uint8)[None, :])


def scalar_events(tags: Sequence[str], steps: np.ndarray, values: np.ndarray, wall_time: float) -> bytes:
    """One event per step, each holding one value per tag: ``values`` is ``[steps, tags]``, stored
    as float32 (TensorBoard's ``simple_value``, what its scalar dashboard reads)."""
    steps = np.asarray(steps, np.int64)
    values = np.asarray(values, np.float32).reshape(len(steps), len(tags))
    if not len(steps):
        return b""
    # Summary.Value{tag=1, simple_value=2}: a fixed layout whose 4 value bytes sit at known offsets
    summary, offsets = bytearray(), []
    for tag in tags:
        name = _field(1, tag.encode())
        value = name + b"\x15"
        offsets.append(len(summary) + len(_varint(1 << 3 | 2)) + len(_varint(len(value) + 4)) + len(value))
        summary += _field(1, value + b"\0\0\0\0")
    summary_field = _field(5, bytes(summary))
    wall = np.frombuffer(struct.pack("<d", wall_time), np.uint8)
    out = []
    # events whose step varint has the same length share one layout: one matrix per length
    if steps.min() < 0:
        raise ValueError(f"negative steps cannot be written as TensorBoard events (got {int(steps.min())})")
    for lo, hi in _varint_groups(steps):
        width = int(_varint_lengths(steps[lo:lo + 1])[0])
        length = 1 + 8 + 1 + width + len(summary_field)
        rows = np.zeros((hi - lo, length), np.uint8)
        rows[:, 0] = 0x09
        rows[:, 1:9] = wall
        rows[:, 9] = 0x10
        rows[:, 10:10 + width] = _varint_columns(steps[lo:hi], width)
        base = 10 + width
        rows[:, base:] = np.frombuffer(summary_field, np.uint8)
        start = base + len(summary_field) - len(summary)
        floats = values[lo:hi].astype("<f4").view(np.uint8).reshape(hi - lo, len(tags), 4)
        for i, off in enumerate(offsets):
            rows[:, start + off:start + off + 4] = floats[:, i]
        out.append(frame_rows(rows))
    return b"".join(out)


def _varint_lengths(steps: np.ndarray) -> np.ndarray:
    """Bytes of each non-negative step's varint: one, plus one per 7 bits beyond the first 7."""
    return 1 + np.sum([(steps >= (1 << (7 * k))).astype(np.int64) for k in range(1, 9)], axis=0)


def _varint_groups(steps: np.ndarray) -> list[tuple[int, int]]:
    """Runs of consecutive steps whose varints have the same length."""
    cuts = np.flatnonzero(np.diff(_varint_lengths(steps))) + 1
    edges = [0, *cuts.tolist(), len(steps)]
    return list(zip(edges[:-1], edges[1:]))


def _varint_columns(steps: np.ndarray, width: int) -> np.ndarray:
    """The varint bytes of steps that all encode in ``width`` bytes, as a ``[n, width]`` matrix."""
    n = steps.astype(np.uint64)
    cols = np.empty((len(steps), width), np.uint8)
    for j in range(width):
        byte = (n >> np.uint64(7 * j)) & np.uint64(0x7F)
        cols[:, j] = byte | (np.uint64(0x80) if j < width - 1 else np.uint64(0))
    return cols

# ---------------------------------------------------------------------------------------------
# ``WandbSink``: scalar records as a Weights & Biases run, offline by default.
#
# Why offline: a test run (CI included) must not need a network or an account; W&B's offline
# mode writes the run to a directory (``<dir>/wandb/offline-run-*``) that ``wandb sync`` uploads
# later, where the run then looks as if it had been logged online. Values reach W&B's history as
# JSON numbers, so float64 and float32 values (as Python floats) and integers are kept exactly.

MODES = ("offline", "online")


class WandbSink(DashboardSink):
    """Sink logging scalar records to a W&B run: ``run.log({key: value}, step=k)`` per recorded step.

    Keys: a record's path (``energy/total``); in batched runs one key per system
    (``energy/system_3``), so each system is a line in the record's section of the workspace.
    ``records=None`` takes every real scalar record (bools as 0/1); naming another is an error.
    W&B's step is the run's step number. The run's description (driver, steps, chunk, dt, the
    ``meta=`` given to ``jl.run``) and provenance are the W&B config's ``jaxlog`` entry, beside
    ``config``; at the end the summary holds ``jaxlog/status``, ``jaxlog/steps_done`` (and
    ``jaxlog/violation``), and the W&B run's exit code is 0 for a complete run, 1 otherwise.

    ``mode="offline"`` (the default) writes the run under ``dir/wandb/`` (``artifacts["wandb"]``
    is its directory, for ``wandb sync``); ``"online"`` logs to the W&B server as
    ``wandb.init`` would. ``init``: more keyword arguments for ``wandb.init`` (``entity``,
    ``tags``, ``group``, ``notes``, ``settings``, ...); by default W&B does not capture the
    console (pytest does) and prints nothing. Each sink starts its own W&B run, beside any run
    already active in the process (``reinit="create_new"``). Needs the extra:
    ``pip install 'pytest-jaxlog[wandb]'``.
    """

    kind = "W&B"

    def __init__(self, dir: str | os.PathLike, records: list[str] | tuple[str, ...] | None = None, *,
                 project: str = "jaxlog", name: str | None = None, mode: Literal["offline", "online"] = "offline", config: dict | None = None,
                 queue_bytes: int = QUEUE_BYTES, stall_timeout_s: float = STALL_S, **init: Any):
        try:
            import wandb  # noqa: F401  (the library is an optional extra: refused here, before any run)
        except ImportError as exc:
            raise missing_extra("jl.WandbSink", "wandb", "wandb", exc) from None
        if mode not in MODES:
            raise JaxlogError(f"WandbSink(mode={mode!r}): mode is one of {', '.join(map(repr, MODES))}")
        if config is not None and not isinstance(config, dict):
            raise JaxlogError(f"WandbSink(config=...): a dict, got {type(config).__name__}")
        super().__init__(records, queue_bytes=queue_bytes, stall_timeout_s=stall_timeout_s)
        self.dir = Path(dir)
        self.project, self.name, self.mode = project, name, mode
        self.config = dict(config or {})
        self.init = init
        self.run: Any = None

    def _start(self, schema: Schema, meta: dict[str, Any]) -> None:
        import wandb

        self.dir.mkdir(parents=True, exist_ok=True)
        init = {"settings": wandb.Settings(console="off", silent=True, disable_git=True), **self.init}
        self.run = wandb.init(dir=str(self.dir), project=self.project, name=self.name, mode=self.mode,
                              config={**self.config, "jaxlog": meta}, reinit="create_new", **init)

    def _log(self, metrics: list[StepMetrics]) -> None:
        for m in metrics:
            self.run.log(m.values, step=m.step)

    def _finish(self, ending: Ending) -> None:
        if self.run is None:
            return
        end: dict[str, Any] = {"jaxlog/status": ending.status, "jaxlog/steps_done": ending.steps_done}
        if ending.violation is not None:
            end["jaxlog/violation"] = ending.violation
        self.run.summary.update(end)
        self.run.finish(exit_code=0 if ending.status == "complete" else 1)

    @property
    def artifacts(self) -> dict[str, Path]:
        return {} if self.run is None or self.mode != "offline" else {"wandb": Path(self.run.settings.sync_dir)}

    def __repr__(self) -> str:
        return f"WandbSink({str(self.dir)!r})"

# ---------------------------------------------------------------------------------------------
# ``TensorBoardWriter``: scalar records as a TensorBoard event file, written off the run's thread.
#
# TensorBoard groups tags by their first component, so a record ``energy/total`` is its own chart
# in the ``energy`` group, and in batched runs each system is a tag of the record's group
# (``energy/system_3``). Values are stored as float32 (TensorBoard's scalar type): the file is for
# looking at; the trajectory file keeps the exact values.

_SERIAL = itertools.count()


class TensorBoardWriter(Sink):
    """Sink writing scalar records to ``logdir/events.out.tfevents.*`` (``tensorboard --logdir``).

    ``records=None`` takes every real scalar record; naming another record is an error.
    ``queue_bytes``/``stall_timeout_s``: as for ``HDF5Writer`` (memory handed to the writer
    thread; how long a caller waits on a thread that writes nothing before ``WriterError``).
    """

    def __init__(self, logdir: str | os.PathLike, records: list[str] | tuple[str, ...] | None = None, *,
                 queue_bytes: int = QUEUE_BYTES, stall_timeout_s: float = STALL_S):
        self.logdir = Path(logdir)
        self.records = None if records is None else tuple(records)
        self.queue_bytes, self.stall_timeout_s = int(queue_bytes), float(stall_timeout_s)
        self.path: Path | None = None
        self.tags: dict[str, tuple[str, ...]] = {}
        self._schema: Schema | None = None
        self._last_steps: dict[str, int] = {}
        self._fh: IO[bytes] | None = None
        self._bg: Background | None = None

    def open(self, schema: Schema, meta: dict[str, Any]) -> None:
        if self._schema is not None:
            raise JaxlogError(f"TensorBoardWriter({self.logdir}): a writer is opened once; make a new one per run")
        who = f"TensorBoardWriter({self.logdir})"
        self.tags = metric_keys(schema, dashboard_paths(schema, self.records, who, "TensorBoard"))
        self._schema = schema
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.{next(_SERIAL)}"
        try:
            self.logdir.mkdir(parents=True, exist_ok=True)
            self.path = self.logdir / name
            self._fh = open(self.path, "wb")
            self._fh.write(file_header(time.time()))
            self._fh.flush()
        except OSError as exc:
            raise WriterError(f"{who}: cannot create the event file: {exc}") from exc
        self._bg = Background(f"TensorBoardWriter({self.path})", self._write_events, self._fh.close,
                              queue_bytes=self.queue_bytes, stall_s=self.stall_timeout_s)

    def write(self, frames: Frames) -> None:
        if self._bg is None:
            raise WriterError(f"{self!r} is {'closed' if self._schema is not None else 'not open'}, cannot write")
        check_frames(self._schema, frames, self._last_steps)
        wall = time.time()
        for path, tags in self.tags.items():
            steps = frames.steps.get(path)
            if steps is None or not len(steps):
                continue
            values = frames.values[path]
            self._bg.put({"tags": tags, "steps": steps, "values": values, "wall_time": wall},
                         values.nbytes + steps.nbytes)

    def _write_events(self, batch: dict) -> None:  # the writer thread
        self._fh.write(scalar_events(batch["tags"], batch["steps"], np.asarray(batch["values"]), batch["wall_time"]))
        self._fh.flush()  # TensorBoard shows a run as it goes

    def close(self, status: str = "complete", *, steps_done: int | None = None, violation: dict | None = None,
              summary: dict | None = None) -> None:
        bg, self._bg = self._bg, None
        if bg is not None:
            bg.close()

    @property
    def artifacts(self) -> dict[str, Path]:
        return {} if self.path is None else {"tensorboard": self.path}

    def __repr__(self) -> str:
        return f"TensorBoardWriter({str(self.logdir)!r})"
