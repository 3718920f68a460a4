"""jl.run's progress bar shows the latest values of chosen scalar records; a view of the state
(kUPS's ``postfix=``), which a compiled loop cannot evaluate, is refused with what to do instead."""

from __future__ import annotations

import io

import jax.numpy as jnp
import pytest
from tqdm import tqdm

import pytest_jaxlog as jl


def count(s):
    return s + 1.0


RECORD = {"obs": lambda s: {"s": s, "half": s / 2}, "sparse": jl.Record(lambda s: s * 10, every=9),
          "v": lambda s: jnp.zeros(3) + s}


def _last_postfix(text):
    return text.replace("\r", "\n").strip().splitlines()[-1]


def test_named_records_and_their_prefixes_are_shown_with_their_latest_values():
    out = io.StringIO()
    bar = jl.ProgressLogger(40, postfix=["obs", "sparse"], enabled=True, file=out, mininterval=0)
    r = jl.run(count, jnp.zeros(()), 40, record=RECORD, chunk=4, progress=bar)
    assert bar.postfix == ["obs/half", "obs/s", "sparse"]  # the leaf paths the names stand for
    t = r.trajectory
    last = _last_postfix(out.getvalue())
    assert "40/40" in last
    for path in ("obs/s", "obs/half", "sparse"):  # sparse (every 9 steps: last at 36) keeps its last value
        assert f"{path}={tqdm.format_num(float(t[path][-1]))}" in last, (path, last)
    assert float(t["sparse"][-1]) == 360.0


def test_a_view_of_the_state_is_refused_before_any_step_runs():
    seen = []
    bar = jl.ProgressLogger(10, postfix=lambda s: {"energy": s}, enabled=True, file=io.StringIO())
    for progress in (bar, lambda s: s):
        with pytest.raises(jl.JaxlogError, match=r"cannot show a view of the state.*progress=\['ke'\]"):
            jl.run(count, jnp.zeros(()), 10, record=RECORD, sinks=[jl.CallbackSink(seen.append)], progress=progress)
    assert seen == []  # refused before the sinks got a frame


def test_progress_names_are_checked_against_the_records():
    with pytest.raises(jl.JaxlogError) as e:
        jl.run(count, jnp.zeros(()), 3, record=RECORD, progress=["energy"])
    assert str(e.value) == ("[jaxlog] jl.run(progress=...): record 'energy' is not recorded; recorded: obs/half, "
                            "obs/s, sparse, v; the progress bar takes the names of scalar records: obs/half, obs/s, "
                            "sparse")
    with pytest.raises(jl.JaxlogError, match=r"^\[jaxlog\] jl.run\(progress=...\): record 'e' .* scalar records: "
                                             r"\(none: record a scalar\)$"):
        jl.run(count, jnp.zeros(()), 3, progress="e")
    with pytest.raises(jl.JaxlogError, match=r"record 'v' has shape \(3,\); the progress bar takes scalar records only"):
        jl.run(count, jnp.zeros(()), 3, record=RECORD, progress="v")
    r = jl.run(count, jnp.zeros(()), 3, record=RECORD, progress=["obs/s"])  # quiet: stderr is not a terminal
    assert r.steps_done == 3
