"""The post-mortem of a violation: the full states of the last few steps up to the violating
one, replayed with the run's own program from a kept chunk-start state and attached to the sinks
(over several processes each process attaches its shards of them: ``drive.shardstate``)."""

from __future__ import annotations

from typing import Any, Callable

from .shardstate import snapshot


def replay(violation: Any, k0: int, chunk_state: Any, starts: list, one_step: Callable, n: int, sinks: Any,
           state_of: Callable[[Any], Any] = lambda carry: carry) -> Any:
    """Replay from the newest kept chunk-start carry early enough for ``n`` states (the violating
    chunk's own start ``k0``, or an earlier one in ``starts`` when the violating step is fewer than
    ``n`` steps past it); attach the last ``n`` states. ``one_step(carry, k)`` advances the
    driver's carry (the state, and what else the program threads through), ``state_of`` reads
    the state out of it. Returns the carry at the violating step."""
    need = violation.step - n + 1
    if k0 > need and starts:
        early = [ks for ks in starts if ks[0] <= need]
        k0, chunk_state = early[-1] if early else starts[0]
    target = violation.step
    st = chunk_state
    keep = set(range(max(k0, target - n + 1), target + 1)) if n > 0 else set()
    snaps = {}
    if k0 in keep:
        snaps[k0] = snapshot(state_of(st))
    for k in range(k0, target):
        st = one_step(st, k)
        if k + 1 in keep:
            snaps[k + 1] = snapshot(state_of(st))
    for k in sorted(snaps):
        tree, impls = snaps[k]
        sinks.attach("postmortem", k, tree, key_impls=impls)
    return st
