"""The ``jaxlog_factory`` fixture's object, for hypothesis ``@given`` tests: a function-scoped
fixture would be shared by every example (hypothesis rejects it), so each example opens its own
``jaxlog`` with ``with jaxlog_factory() as jaxlog:`` and gets its own directory."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import JaxlogError
from .fixture import JaxlogFixture
from .session import JaxlogSession, TestState


class JaxlogFactory:
    """``with jaxlog_factory() as jaxlog:`` per hypothesis example. Each example gets
    ``<test dir>/example-<n>``; a passing example's directory is removed (unless keep=all), a failing
    one is kept, replacing the previous failing one (hypothesis replays the minimal failing example last)."""

    def __init__(self, session: JaxlogSession):
        self._session = session

    @contextmanager
    def __call__(self) -> Iterator[JaxlogFixture]:
        item = self._session.current_item
        if item is None:
            raise JaxlogError("jaxlog_factory() must be used inside a running test")
        state = self._session.state_for(item)
        if state.pending_example is not None:  # a new example: the previous one passed
            state.drop_example(state.pending_example)
            state.pending_example = None
        n = state.examples
        state.examples += 1
        d = state.dir / f"example-{n}"
        fx = JaxlogFixture(self._session, state, d)
        failed = False
        try:
            yield fx
        except BaseException:
            failed = True
            raise
        finally:
            try:
                fx.close()
            except BaseException:
                failed = True
                raise
            finally:
                _settle(state, d, failed)


def _settle(state: TestState, d: Path, failed: bool) -> None:
    """After an example: keep it (failed, keep=failed|all), remember it as pending (passed inside
    `with`, the test may still fail after it), or remove it."""
    keep = state.settings.keep
    if keep == "all":
        return
    if failed and keep == "failed":
        prev = state.kept_example
        if prev is not None and prev != d:
            state.drop_example(prev)
        state.kept_example = d
        return
    if keep == "failed":  # passed inside `with`; removed when the next example starts or the test passes
        state.pending_example = d
        return
    state.drop_example(d)
