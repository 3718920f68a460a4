"""The Logger protocol for hand-written loops, and small loggers that compose with it.

``with logger: ... logger.log(state, step)``: the protocol kUPS uses. ``CompositeLogger`` makes
several loggers behave as one and is careful about exceptions: a logger that fails to enter or
exit never leaves the others half-open.
"""

from __future__ import annotations

import collections
import sys
import time
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from ...errors import JaxlogError
from ...record.values import check_count


@runtime_checkable
class Logger(Protocol):
    def __enter__(self) -> Any: ...

    def __exit__(self, exc_type, exc, tb) -> Any: ...

    def log(self, state: Any, step: int) -> None: ...


class NullLogger:
    """Does nothing (a default for code that takes an optional logger)."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return False

    def log(self, state: Any, step: int) -> None:
        pass


class CompositeLogger:
    """Several loggers as one: enters in order, exits in reverse, exception-safe.

    If entering logger i fails, loggers 0..i-1 are exited with that exception's info and it is
    re-raised. On exit every logger is exited even when one raises; the first error is re-raised.
    """

    def __init__(self, *loggers: Any):
        for lg in loggers:
            if not isinstance(lg, Logger):
                raise JaxlogError(f"CompositeLogger: {lg!r} does not implement the Logger protocol (__enter__, __exit__, log)")
        self.loggers = tuple(loggers)
        self._entered: list[Any] = []

    def __enter__(self):
        self._entered = []
        for lg in self.loggers:
            try:
                lg.__enter__()
            except BaseException as e:
                self._exit_entered(type(e), e, e.__traceback__)
                raise
            self._entered.append(lg)
        return self

    def _exit_entered(self, exc_type, exc, tb) -> BaseException | None:
        first: BaseException | None = None
        while self._entered:
            lg = self._entered.pop()
            try:
                lg.__exit__(exc_type, exc, tb)
            except BaseException as e:  # keep exiting the others, remember the first failure
                if first is None:
                    first = e
        return first

    def __exit__(self, exc_type, exc, tb):
        first = self._exit_entered(exc_type, exc, tb)
        if first is not None and first is not exc:
            raise first
        return False

    def log(self, state: Any, step: int) -> None:
        for lg in self.loggers:
            lg.log(state, step)


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError, OSError):  # stderr replaced by an object without isatty, or closed
        return False


class ProgressLogger:
    """A tqdm bar (steps/s beside it) that advances to the step number it is given, not by call
    count, and shows N/N when the loop it watches ends normally (whether the loop labels its
    states 0..N-1 or 0..N).

    ``postfix``: what to show beside the bar. A view ``state -> scalar or dict of scalars``
    (Recorder loops: pulled to the host at most once per refresh interval, so it does not sync
    the device every step); or record paths (``["energy/total"]``), whose latest recorded values
    are shown; by default, ``jl.run`` shows the latest values of up to three scalar records,
    taken from the frames it records (the state itself may already be donated).
    Quiet unless stderr is a terminal, or ``enabled=True``. ``jl.run`` with a file sink also
    shows ``saved``: the last step on disk, what a kill of the run now would keep (a file's
    commits trail the recorded steps by at most its ``flush_every_s`` and two commits).
    """

    SHOWN_RECORDS = 3

    def __init__(self, total: int | None, postfix: Callable[[Any], Any] | list[str] | None = None, *, enabled: bool | None = None,
                 desc: str | None = None, file: Any = None, mininterval: float = 0.1):
        self.total = total
        self.postfix = postfix
        self.enabled = _stderr_is_tty() if enabled is None else bool(enabled)
        self.desc = desc
        self.file = file
        self.mininterval = mininterval
        self.bar = None
        self._last_postfix = -float("inf")
        self._shown: dict[str, Any] = {}
        self._saved: int | None = None

    def __enter__(self):
        if self.enabled and self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, desc=self.desc, file=self.file if self.file is not None else sys.stderr,
                            mininterval=self.mininterval, unit="step", dynamic_ncols=self.file is None)
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.bar is not None:
            if exc_type is None and self.total is not None and self.bar.n < self.total:
                self.bar.update(self.total - self.bar.n)  # the loop ended: all its steps are done
            self.bar.close()
            self.bar = None
        return False

    def end_at(self, n: int) -> None:
        """The loop ended early on purpose (``until=``): ``n`` steps is the whole of it."""
        if self.bar is not None:
            self.bar.total = int(n)
            self.bar.refresh()

    def show(self, frames: Any) -> None:
        """The latest recorded values beside the bar (``jl.run`` calls it per chunk of frames); a
        record not in this batch (a sparser schedule) keeps its last value."""
        if self.bar is None or callable(self.postfix) or not len(frames):
            return
        names = list(self.postfix) if self.postfix is not None else [
            p for p in frames if frames.values[p].ndim == 1 and frames.values[p].dtype.kind in "biuf"
        ][: self.SHOWN_RECORDS]
        self._shown.update({p: frames.values[p][-1] for p in names if p in frames.values and len(frames.values[p])})
        now = time.monotonic()
        if self._shown and now - self._last_postfix >= self.mininterval:
            self._last_postfix = now
            self._set_postfix()

    def _set_postfix(self) -> None:
        if self.bar is None:
            return
        shown = {p: _scalar(v) for p, v in self._shown.items()}
        if self._saved is not None:
            shown["saved"] = self._saved
        self.bar.set_postfix(shown, refresh=False)

    def saved(self, step: int | None) -> None:
        """The last step a file sink has on disk (``jl.run`` calls it per batch of frames)."""
        if self.bar is None or step is None or step == self._saved or callable(self.postfix):
            return
        self._saved = int(step)
        self._set_postfix()

    def for_run(self, schema: Any) -> "ProgressLogger":
        """Check ``postfix`` against what ``jl.run`` records (before any step runs): record names
        become the scalar leaf paths they name; a view of the state is refused, with what to do."""
        if callable(self.postfix):
            raise JaxlogError(
                f"jl.run(progress=ProgressLogger(postfix={getattr(self.postfix, '__name__', self.postfix)!r})): jl.run "
                "cannot show a view of the state (the state stays on the device inside the compiled loop); record "
                "the value and name it: jl.run(..., record={'ke': view}, progress=['ke']) or "
                "ProgressLogger(total, postfix=['ke'])")
        if self.postfix is not None:
            from ...store.protocol import scalar_paths

            self.postfix = list(scalar_paths(schema, self.postfix, "jl.run(progress=...)", kind="the progress bar",
                                             advice="record a scalar view of it"))
        return self

    def advance(self, step: int, state: Any = None) -> None:
        """Move the bar to ``step`` (used by ``jl.run`` once per chunk)."""
        if self.bar is None:
            return
        if callable(self.postfix) and state is not None:
            now = time.monotonic()
            if now - self._last_postfix >= self.mininterval:
                self._last_postfix = now
                value = self.postfix(state)
                if isinstance(value, dict):
                    self.bar.set_postfix({k: _scalar(v) for k, v in value.items()}, refresh=False)
                else:
                    self.bar.set_postfix_str(f"{_scalar(value):.6g}", refresh=False)
        delta = int(step) - self.bar.n
        if delta > 0:
            self.bar.update(delta)

    def log(self, state: Any, step: int) -> None:
        if self.bar is None and self.enabled:
            raise JaxlogError("ProgressLogger.log() called outside `with`")
        self.advance(step, state)


def progress_for_run(progress: Any, steps: int | None, schema: Any) -> ProgressLogger | None:
    """``jl.run(progress=...)``: False (none), True (always shown), None (shown on a terminal),
    record names (their latest values beside the bar, on a terminal) or a ProgressLogger."""
    if progress is False:
        return None
    if isinstance(progress, ProgressLogger):
        return progress.for_run(schema)
    if callable(progress):
        return ProgressLogger(steps, postfix=progress).for_run(schema)  # refused, with what to do
    if isinstance(progress, str):
        progress = [progress]
    if isinstance(progress, (list, tuple)):
        return ProgressLogger(steps, postfix=list(progress), desc="jaxlog").for_run(schema)
    return ProgressLogger(steps, enabled=True if progress is True else None, desc="jaxlog")


def _scalar(v: Any) -> Any:
    arr = np.asarray(v)
    return arr.item() if arr.size == 1 else arr.tolist()


def _to_host(tree: Any) -> Any:
    import jax

    return jax.tree_util.tree_map(lambda x: np.array(x, copy=True), jax.device_get(_keys_to_data(tree)))


def _keys_to_data(tree: Any) -> Any:
    import jax

    def one(x):
        if hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return jax.random.key_data(x)
        return x

    return jax.tree_util.tree_map(one, tree)


class RingBuffer:
    """The last ``k`` (step, state) pairs, copied to host numpy (a post-mortem for hand-written loops).

    Copies are made at ``log`` time, so the loop may donate or overwrite its device buffers.
    Typed PRNG keys are stored as their key data.
    """

    def __init__(self, k: int):
        self.k = check_count(k, "RingBuffer(k)", minimum=1, expected="needs an integer k >= 1")
        self._buf: collections.deque = collections.deque(maxlen=self.k)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return False

    def log(self, state: Any, step: int) -> None:
        self._buf.append((int(step), _to_host(state)))

    def items(self) -> list[tuple[int, Any]]:
        return list(self._buf)

    @property
    def states(self) -> list[Any]:
        return [s for _, s in self._buf]

    @property
    def steps(self) -> list[int]:
        return [k for k, _ in self._buf]

    def __len__(self) -> int:
        return len(self._buf)

    def clear(self) -> None:
        self._buf.clear()
