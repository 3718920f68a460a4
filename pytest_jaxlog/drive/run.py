"""``jl.run``: the fast driver. Chunks of steps run on the device in one compiled loop (see
``drive.device.program``); records come out as device buffers and reach the host while the next chunk
runs. No host callbacks in the step.

Chunk ``i+1`` is dispatched before chunk ``i``'s outputs are pulled (JAX dispatch is async), so
host work (frames, invariants, sinks) overlaps device work. With ``until=``, the stop flag
travels from chunk to chunk on the device: the chunk dispatched ahead runs no step once it is set.

The run itself is ``drive.host.loop.RunLoop``; what it works out before any step runs is
``drive.device.plan``; ``drive.prepare.config`` declares the options (``RunConfig``; ``run``'s
signature repeats them for the reader's IDE and makes one ``RunConfig`` of them) and checks them.
Two entries besides ``jl.run`` take the options as keywords: :func:`run_outcome` (the run's
result or error as a value, with the partial run) and :func:`resume_run` (``jl.resume``'s,
continuing from a checkpoint).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ..errors import hide_frame_from_checks
from ..profiling.timings import CompileTracker
from .checkpoints.checkpoint import ResumePoint
from .device import program
from .device.plan import auto_chunk
from .prepare.config import DEFAULT_BUDGET, OPTIONS, RunConfig, configure
from .host.loop import RunLoop
from .host.result import STOP_REASONS, Outcome, Run
from .host.signals import sigterm_noted

__all__ = ["run", "Run", "auto_chunk", "run_outcome", "resume_run", "Outcome", "STOP_REASONS"]


def run(step: Callable, state: Any, steps: int, *, record: Any = None, invariants: Any = (), sinks: Any = (),
        key: Any = None, dt: float | None = None, chunk: int | None = None, profile: Any = None, has_aux: bool = False,
        aux: Any = None, batched: bool | int = False, until: Callable | None = None, on_violation: str = "raise",
        postmortem: int = 3, progress: Any = None, chunk_budget_bytes: int = DEFAULT_BUDGET, timeline: Any = None,
        donate: bool = True, start_step: int = 0, logs: Any = None, log_capacity: int | None = None,
        checkpoint: Any = None, meta: dict | None = None, segments: Any = None) -> Run:
    """Run up to ``steps`` applications of ``step`` on ``state`` on the device, recording as scheduled.

    ``step(state)``, or ``step(key_k, state)`` with ``key_k = fold_in(key, k)`` for the work of step
    ``k`` (batched runs: one key per system, ``fold_in(key_k, system)``, stacked, so a chain step
    is ``jax.vmap(chain_step)(keys, state)``). ``has_aux=True``: ``step`` returns ``(state, aux)``
    and aux leaves are recorded as ``"aux/<path>"`` from step ``start_step+1``: all of them every
    step, or those ``aux=`` names, on their schedules (``aux={"acceptance": jl.every(1),
    "energy": jl.every(10)}``; a list or a name: every step). ``batched=True``: the leading axis
    of the state's leaves is a system index (leaves without it, such as scalars, are shared by
    all systems; ``batched=<n>`` says how many systems there are when leaves disagree).
    ``segments=ids``: a ragged batch, graphs of different sizes packed along one axis; ``ids``
    (int, shape [rows], sorted, every graph 0..G-1 present) gives each row's graph. Leaves leading
    with the rows are per row, leaves leading with G per graph, others shared; the run is batched
    with one system per graph (``until=``/``when=`` return bool[G], a finished graph's rows are
    frozen, ``traj.system(g)`` holds graph g's rows, invariants name the graph and the row's index
    within it). The step still gets the whole packed state (``jax.ops.segment_sum(..., ids,
    num_segments=G)``). A different packing compiles its own program.

    ``until=pred``: ``pred(state)`` is checked on the device after every step (and on the initial
    state); the run stops at the first step where it holds, recording nothing past it; ``steps``
    is then a maximum. Batched: one bool per system; a finished system is frozen (its state no
    longer changes) and the run ends when all are done. ``run.stop_reason`` says why it stopped.

    Values the step logs with ``jl.log`` (anywhere inside it: a force function, a nested scan,
    a while loop) are recorded as ``"log/<name>"``, every step from ``start_step+1`` like aux, or on
    the schedules ``logs=`` gives (``logs={"positions": jl.every(10)}``, subsampled on the device);
    ``log_capacity``: the capacity of logs inside ``lax.while_loop`` that give none. A step without
    ``jl.log`` calls runs as it is; views that log are recorded with their logs.

    ``checkpoint=jl.every(n)``: at those steps the file sinks also keep what the run needs to go on
    (state, key, invariants' running state, ``until`` flags): ``jl.resume`` continues from the
    newest bit-for-bit. A Ctrl-C or SIGTERM then writes one more at the last chunk boundary.

    ``meta={...}``: the run's metadata as JSON (strings, numbers, bools, None, lists, dicts: a
    configuration, a convergence message), kept in the file, read back as ``traj.meta`` and
    ``run.meta``, listed in the pytest manifest; a resumed run keeps the file's.

    Steps are numbered from ``start_step`` (a resumed run continues the numbering and the key
    folding; its initial state is not recorded again). ``chunk=None``: see :func:`auto_chunk`.
    ``profile``: ProfileWindow(s) whose work steps run one dispatch each inside the trace.
    ``donate``: the carried state is donated to the device between chunks when nothing needs a
    chunk-start state again (no invariants, no checkpoints) and it takes 1 MiB or more (below
    that it saves nothing worth the copy that keeps the caller's arrays: the caller's arrays are
    never donated).

    Invariant violations: the post-mortem states of the last ``postmortem`` steps up to the run's
    first violating step are attached to the sinks (replayed from a kept chunk-start state), and
    the sinks are closed ``violated`` with that violation (artifact paths included).
    ``on_violation="raise"`` stops there: sinks get the frames up to the violating step, ``run.state``
    is the state at that step, and the violation is raised. ``"warn"`` (a JaxlogRuntimeWarning per
    invariant, at its first violation) and ``"record"`` go on to the end: every frame is written,
    ``run.violation`` is the first violation and ``steps_done`` the full count.
    ``run.timings.compiles`` counts the step function's compilations that happened during this run
    (distinct state signatures: 1 on a cold cache, 0 when all was compiled before).
    KeyboardInterrupt and other exceptions close the sinks (``stopped``/``failed``) and are
    re-raised with the partial :class:`Run` as ``exc.jaxlog_run``: its state is the state at the
    last step whose frames were written (``donate=False`` or invariants given), or, when the state
    was donated, the newest state computed (``steps_done`` then says which step it is; the sinks'
    ``steps_done`` is the last written step).
    """
    __tracebackhide__ = hide_frame_from_checks
    given = RunConfig(step=step, steps=steps, record=record, invariants=invariants, sinks=sinks, key=key, dt=dt,
                      chunk=chunk, profile=profile, has_aux=has_aux, aux=aux, batched=batched, until=until,
                      on_violation=on_violation, postmortem=postmortem, progress=progress,
                      chunk_budget_bytes=chunk_budget_bytes, timeline=timeline, donate=donate, start_step=start_step,
                      logs=logs, log_capacity=log_capacity, checkpoint=checkpoint, meta=meta, segments=segments)
    return _execute(RunLoop(configure(given, state), *_clock()), state)


def _options(step: Callable, steps: int, kwargs: dict) -> RunConfig:
    """``jl.run``'s options given as keywords; one ``jl.run`` does not take is refused by ``jl.run``
    itself, before its body runs, so the error is word for word Python's (3.13's adds a
    suggestion)."""
    if not OPTIONS.issuperset(kwargs):
        run(step, None, steps, **kwargs)  # raises: its parameters are step, state, steps and OPTIONS
    return RunConfig(step=step, steps=steps, **kwargs)


def _clock() -> tuple[CompileTracker, float]:
    """The run's compile tracker (entered by ``_execute``) and its start time."""
    return CompileTracker(program.chunk_impl, read_args=False), time.perf_counter()


def _execute(driver: RunLoop, state: Any) -> Run:
    __tracebackhide__ = hide_frame_from_checks
    cfg = driver.cfg
    # SIGTERM is noted and acted on at a chunk boundary (over several processes, once they agreed
    # on the step: drive.prepare.sharding)
    with sigterm_noted() as noted, driver.tracker:
        driver.noted = noted
        try:
            return driver.go(state)
        finally:
            if cfg.timeline is not None:
                driver.tracker.add_to_timeline(cfg.timeline)


def run_outcome(step: Callable, state: Any, steps: int, **kwargs: Any) -> Outcome:
    """``jl.run(step, state, steps, **kwargs)``'s end as a value: ``Outcome(run, None)``, or
    ``Outcome(partial run or None, error)`` where it raised (the violation with
    ``on_violation="raise"``, a Ctrl-C, a failure). For callers that gather a run's files and
    timings whether or not it failed (the pytest fixture), then raise the error themselves."""
    __tracebackhide__ = hide_frame_from_checks  # the error's traceback passes through here
    driver = None
    try:
        driver = RunLoop(configure(_options(step, steps, kwargs), state), *_clock())
        return Outcome(_execute(driver, state), None)
    except BaseException as e:
        return Outcome(None if driver is None else driver.result, e)


def resume_run(step: Callable, state: Any, steps: int, point: ResumePoint, **kwargs: Any) -> Run:
    """``jl.run`` continuing the run recorded up to checkpoint ``point`` (``jl.resume``'s entry):
    ``kwargs`` are ``jl.run``'s."""
    __tracebackhide__ = hide_frame_from_checks
    return _execute(RunLoop(configure(_options(step, steps, kwargs), state, point), *_clock()), state)
