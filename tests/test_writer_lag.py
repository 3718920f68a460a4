"""The file never trails the run by more than its stated time: a writer that falls behind slows
the run (backpressure) instead of queueing seconds of steps a progress bar already showed; the
bar shows the last step on disk; a resume of a file that died before its first checkpoint says so."""

from __future__ import annotations

import io
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.errors import JaxlogError, WriterError
from pytest_jaxlog.record.frames import Frames, LeafSpec, Schema
from pytest_jaxlog.record.schedule import every

N = 1 << 19  # 2 MiB a frame (over HDF5's chunk cache: compressed as it is written): gzip writes it far slower than a loop makes it
SCHEMA = Schema((LeafSpec("x", "x", (N,), np.dtype("float32"), every(1)),))


def _frame(step: int) -> np.ndarray:
    return np.random.default_rng(step).standard_normal(N, dtype=np.float32)


def test_a_slow_writer_slows_its_caller_instead_of_trailing_it(tmp_path):
    """Batches handed over faster than the writer writes them (its queue of 1 GiB bounds nothing):
    the caller waits, and no batch stays off the disk longer than the bound when the caller goes on."""
    path = tmp_path / "slow.h5"
    writer = jl.HDF5Writer(path, compression="gzip", compression_opts=1, flush_every_s=0.05,
                           queue_bytes=1 << 30, durable=False)
    writer.open(SCHEMA, {})
    behind = []
    for step in range(16):
        fr = Frames()
        fr.add("x", np.array([step]), _frame(step)[None])
        writer.write(fr)
        behind.append(step - (writer.committed_step if writer.committed_step is not None else -1))
    writer.close("complete", steps_done=15)
    stats = writer.stats
    # the writer fell behind (a compressed frame takes far longer than making one), and the caller waited
    assert stats["lag_waits"] > 0 and stats["lag_waited_s"] > 0, stats
    # when the caller went on, no frame handed over was older than the bound without being on disk
    assert 0 < stats["max_lag_s"] <= stats["lag_bound_s"], stats
    assert stats["lag_bound_s"] == pytest.approx(0.05 + 2 * stats["longest_commit_s"])
    # the caller saw the disk move on while it handed frames over (not only at the close)
    assert min(behind) >= 0 and sorted(set(behind)) != list(range(1, 17)), behind
    assert writer.committed_step == 15
    traj = jl.load(path)  # nothing lost or reordered
    assert list(traj.steps("x")) == list(range(16))
    for step in (0, 7, 15):
        np.testing.assert_array_equal(traj["x"][step], _frame(step))


def test_a_run_with_a_slow_writer_records_what_a_plain_loop_computes(tmp_path):
    path = tmp_path / "run.h5"
    writer = jl.HDF5Writer(path, compression="gzip", compression_opts=9, flush_every_s=0.0, queue_bytes=1 << 30)
    x0 = jnp.asarray(_frame(0)[: 1 << 16])
    run = jl.run(_noise_step, x0, 12, record={"x": lambda s: s}, chunk=2, sinks=writer)
    assert run.steps_done == 12 and writer.committed_step == 12
    traj = jl.load(path)
    x, step = np.asarray(x0), jax.jit(_noise_step)
    for k in range(13):
        np.testing.assert_array_equal(traj["x"][k], x)
        x = np.asarray(step(x))


def _noise_step(x):
    return x + jnp.float32(1e-3) * jnp.sin(x * 7.1)


def test_the_progress_bar_shows_the_last_step_on_disk(tmp_path):
    out = io.StringIO()
    bar = jl.ProgressLogger(50, postfix=["e"], enabled=True, file=out, mininterval=0.0)
    jl.run(lambda x: x * 0.99, jnp.ones(4), 50, record={"e": jnp.sum}, chunk=10, progress=bar,
           sinks=jl.HDF5Writer(tmp_path / "bar.h5", flush_every_s=0.0))
    text = out.getvalue()
    shown = [int(s) for s in re.findall(r"saved=(\d+)", text)]
    assert shown, text
    assert shown == sorted(shown) and set(shown) <= {0, 10, 20, 30, 40, 50}, shown
    assert shown[-1] >= 40  # the bar's last refresh came after commits reached the run's end (or a chunk before)


def test_a_run_without_a_file_sink_shows_no_saved_step():
    out = io.StringIO()
    bar = jl.ProgressLogger(20, postfix=["e"], enabled=True, file=out, mininterval=0.0)
    jl.run(lambda x: x * 0.99, jnp.ones(4), 20, record={"e": jnp.sum}, chunk=5, progress=bar)
    assert "e=" in out.getvalue() and "saved=" not in out.getvalue()


class _Stop(Exception):
    pass


def _stop_at(step: int):
    def callback(frames):
        if frames.last_step is not None and frames.last_step >= step:
            raise _Stop(f"stopped at {frames.last_step}")
    return jl.CallbackSink(callback)


def test_resuming_a_file_that_died_before_its_first_checkpoint_says_so(tmp_path):
    path = tmp_path / "early.h5"
    with pytest.raises(WriterError, match="stopped at"):
        jl.run(lambda x: x * 0.5, jnp.ones(3), 3000, record={"x": lambda s: s}, chunk=10,
               checkpoint=jl.every(1000), sinks=[jl.HDF5Writer(path, flush_every_s=0.0), _stop_at(20)])
    traj = jl.load(path)
    assert traj.attachment_steps("checkpoint") == [] and 20 <= traj.steps_done <= 1000
    with pytest.raises(JaxlogError) as info:
        jl.resume(path, lambda x: x * 0.5, 3000)
    msg = str(info.value)
    assert (f"ended 'failed' at its last commit, step {traj.steps_done}, before its first checkpoint was "
            f"committed") in msg, msg
    assert "checkpoint=jl.every(1000)" in msg and "run with checkpoint=" not in msg


def test_resuming_a_run_that_kept_no_checkpoints_names_the_option(tmp_path):
    path = tmp_path / "none.h5"
    with pytest.raises(WriterError, match="stopped at"):
        jl.run(lambda x: x * 0.5, jnp.ones(3), 100, record={"x": lambda s: s}, chunk=10,
               sinks=[jl.HDF5Writer(path, flush_every_s=0.0), _stop_at(20)])
    with pytest.raises(JaxlogError, match=r"its run kept none \(run with checkpoint=jl.every\(n\)\)"):
        jl.resume(path, lambda x: x * 0.5, 100)
