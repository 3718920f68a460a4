"""What a run records, as lanes of the chunk program: the views of ``record=``, the aux leaves
``aux=`` chooses, and (once the step is traced) the values the step logs with ``jl.log``."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import JaxlogError
from ..record.records import AUX, LOG, check_name, normalize_records
from ..record.schedule import Schedule, as_schedule
from .memo import Cache
from .predicates import takes_values
from .program import Lane
from .resolve import AUX_SCHEDULE, LOG_SCHEDULE

__all__ = ["lanes_of", "log_lanes"]

_LANES = Cache("lanes")  # (record's items, has_aux, aux) -> lanes: what the last runs asked for


def lanes_of(record: Any, has_aux: bool, aux: Any) -> tuple[Lane, ...]:
    """Views as lanes, then the aux leaves (all every step by default; ``aux=`` chooses which
    and on which schedule). Kept per ``record=`` contents (its views and records compared as
    the compiled program's cache compares them): a test suite's runs ask for the same ones
    again and again."""
    try:
        key = (None if record is None else tuple(record.items()), has_aux, aux)
        found = _LANES.get(key)
    except (TypeError, AttributeError):  # unhashable parts (an aux= dict), not a dict: made each time
        key, found = None, None
    if found is None:
        found = _make_lanes(record, has_aux, aux)
        if key is not None:
            _LANES.put(key, found)
    return found


def _make_lanes(record: Any, has_aux: bool, aux: Any) -> tuple[Lane, ...]:
    lanes = [Lane(s.name, s.schedule, view=s.view, when=s.when, when_values=takes_values(s.when, f"record {s.name!r}: when="))
             for s in normalize_records(record, reserved=(AUX, LOG))]
    if aux is not None and not has_aux:
        raise JaxlogError("aux= chooses aux leaves to record, but has_aux=False: the step returns only the state")
    if has_aux:
        if aux is None:
            lanes.append(Lane(AUX, AUX_SCHEDULE, aux_paths=(AUX,)))
        else:
            if isinstance(aux, str):
                aux = {aux: None}
            elif not isinstance(aux, Mapping):
                aux = {name: None for name in aux}
            by_schedule: dict[Schedule, list[str]] = {}
            for name, when in aux.items():
                if not isinstance(name, str) or not name or name.startswith("/") or name.endswith("/"):
                    raise JaxlogError(f"aux=: {name!r} is not an aux leaf name (e.g. 'acceptance_rate' or 'info/energy')")
                for part in name.split("/"):
                    check_name(part, "aux= name part")
                schedule = AUX_SCHEDULE if when is None else as_schedule(when, f"aux={{{name!r}: ...}}")
                by_schedule.setdefault(schedule, []).append(f"{AUX}/{name}")
            lanes += [Lane(AUX, s, aux_paths=tuple(paths)) for s, paths in by_schedule.items()]
    return tuple(lanes)


def log_lanes(lanes: tuple[Lane, ...], logs: tuple[tuple[str, Schedule], ...], logged: list[str]) -> tuple[Lane, ...]:
    """The run's lanes once the step's logs are known: its views and aux selections, then lanes
    for the names the step logs, grouped by schedule (``logs=``; the rest every step). Views
    that call ``jl.log`` are found (and wrapped) as they are resolved."""
    named = dict(logs)
    unknown = sorted(set(named) - set(logged))
    if unknown:
        raise JaxlogError(f"logs= names {unknown}, but the step never logs them with jl.log "
                          f"(it logs: {', '.join(logged) or 'nothing'})")
    by_schedule: dict[Schedule, list[str]] = {}
    for name in logged:
        by_schedule.setdefault(named.get(name, LOG_SCHEDULE), []).append(f"{LOG}/{name}")
    return (*lanes, *(Lane(LOG, sched, log_paths=tuple(paths)) for sched, paths in by_schedule.items()))
