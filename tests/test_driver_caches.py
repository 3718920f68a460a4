"""The driver's caches under threads: runs in several threads at once, on the same and on
different kernels, with caches so small that entries are evicted all the time, give what the
same runs give one after the other, and raise nothing."""

from __future__ import annotations

import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl
import pytest_jaxlog.drive.host.recorder  # noqa: F401 - its caches registered too
import pytest_jaxlog.drive.run  # noqa: F401
from pytest_jaxlog.drive.prepare import identity as memo
from pytest_jaxlog.drive.prepare.identity import Cache, caches, clear_caches


def _kernels():
    """Three kernels with their records: two of one shape (their resolved plans differ only by
    the step), one with aux, sparse records and until=."""

    def decay(s):
        return {"x": s["x"] * 0.9, "t": s["t"] + 1.0}

    def drift(s):
        return {"x": s["x"] + 0.5, "t": s["t"] + 1.0}

    def walk(key, s):
        x = s["x"] + jax.random.normal(key, s["x"].shape)
        return {"x": x, "t": s["t"] + 1.0}, {"norm": jnp.linalg.norm(x)}

    state = {"x": jnp.arange(4.0), "t": jnp.zeros(())}
    rec = {"x": lambda s: s["x"], "t": jl.Record(lambda s: s["t"], every=3)}
    return [
        dict(step=decay, state=state, steps=12, record=rec),
        dict(step=drift, state=state, steps=9, record={"sum": lambda s: jnp.sum(s["x"])}),
        dict(step=walk, state=state, steps=15, record=rec, key=jax.random.key(3), has_aux=True,
             until=lambda s: s["t"] >= 11.0),
    ]


def _result(kernel: dict) -> dict:
    kw = dict(kernel)
    r = jl.run(kw.pop("step"), kw.pop("state"), kw.pop("steps"), progress=False, **kw)
    traj = r.trajectory
    out = {"steps_done": r.steps_done, "stop_reason": r.stop_reason,
           "state": {k: np.asarray(v) for k, v in r.state.items()}}
    for name in traj.records:
        out[name] = (np.asarray(traj.steps(name)), np.asarray(traj[name]))
    return out


def _assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k, v in want.items():
        if isinstance(v, dict):
            for leaf in v:
                np.testing.assert_array_equal(got[k][leaf], v[leaf])
        elif isinstance(v, tuple):
            np.testing.assert_array_equal(got[k][0], v[0])
            np.testing.assert_array_equal(got[k][1], v[1])
        else:
            assert got[k] == v, k


@pytest.fixture
def tiny_caches():
    """Every cache of the driver bounded to 2 entries (evicting on almost every run)."""
    bounded = [c for c in caches() if isinstance(c, Cache)]
    assert len(bounded) >= 8, bounded  # lanes, resolved, signatures, layouts, readers, plans, ...
    keep = [c.keep for c in bounded]
    for c in bounded:
        c.keep = 2
    clear_caches()
    try:
        yield bounded
    finally:
        for c, k in zip(bounded, keep):
            c.keep = k


def test_four_threads_running_jl_run_get_the_serial_results_with_tiny_caches(tiny_caches):
    kernels = _kernels()
    serial = [_result(k) for k in kernels]
    errors: list = []
    results: list = []
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def worker(t: int) -> None:
        barrier.wait()
        try:
            for i in range(60):
                # thread 0 and 1 run the same kernel at the same time; 2 and 3 the others, in turn
                which = (i + (t // 2)) % len(kernels) if t < 2 else (i + t) % len(kernels)
                got = _result(kernels[which])
                with lock:
                    results.append((which, got))
        except BaseException as e:  # noqa: BLE001 - reported below with the thread
            with lock:
                errors.append((t, repr(e)))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: races are likelier
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors
    assert len(results) == 240
    for which, got in results:
        _assert_same(got, serial[which])
    assert sorted({w for w, _ in results}) == [0, 1, 2]
    assert all(len(c) <= 2 for c in tiny_caches)


def test_cache_evicts_oldest_first_and_clear_caches_empties_every_cache():
    c = Cache("test", keep=3)
    try:
        for k in "abcd":
            c.put(k, k.upper())
        assert len(c) == 3 and c.get("a") is None and [c.get(k) for k in "bcd"] == ["B", "C", "D"]
        c.put("b", "B2")  # replacing a key evicts nothing
        assert len(c) == 3 and c.get("b") == "B2" and c.get("c") == "C"
        assert c.memo("e", lambda: "E") == "E" and c.get("b") is None  # b was the oldest
        assert c.memo("e", lambda: pytest.fail("made again")) == "E"
        with pytest.raises(TypeError):
            c.get(["unhashable"])
        _result(_kernels()[0])
        assert any(len(x) for x in caches() if isinstance(x, Cache) and x is not c)
        clear_caches()
        assert len(c) == 0
        assert all(len(x) == 0 for x in caches() if isinstance(x, Cache))
    finally:
        memo._ALL.remove(c)


def test_a_run_after_clear_caches_equals_the_run_before():
    kernel = _kernels()[2]
    before = _result(kernel)
    clear_caches()
    _assert_same(_result(kernel), before)
