"""``jl.cost``: XLA's own account of a compiled program (its cost and memory analysis), as a
measurement that does not depend on the machine's load.

A wall-clock time on a shared CI runner varies by tens of percent from one session to the next;
the flops, transcendentals and bytes XLA counts for a compiled program are the same every time
the same program is compiled with the same jax on the same backend. So a change that makes a
kernel do more work (the forces computed twice, a gather turned into a dense product) shows up
exactly, without any statistics. The numbers change between jax versions and backends, which is
why a :class:`Cost` carries them.

``kernels`` is not reported by any backend's analysis: it is counted in the optimised HLO text
(``compiled.as_text()``), see :func:`count_kernels`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..errors import JaxlogError

__all__ = ["Cost", "cost", "cost_of_compiled", "count_kernels", "METRICS"]

# name in a Cost -> key in compiled.cost_analysis() (jax 0.10.2 .. 0.12: one dict; older: a list of one)
_ANALYSIS = {"flops": "flops", "transcendentals": "transcendentals", "bytes_accessed": "bytes accessed"}
# name in a Cost -> attribute of compiled.memory_analysis() (jaxlib's CompiledMemoryStats)
_MEMORY = {"temp_bytes": "temp_size_in_bytes", "argument_bytes": "argument_size_in_bytes",
           "output_bytes": "output_size_in_bytes"}
METRICS = (*_ANALYSIS, *_MEMORY, "kernels")

# opcodes that launch no work of their own: bookkeeping, and control flow (whose bodies are counted)
_NO_WORK = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while", "conditional", "call",
            "after-all", "partition-id", "replica-id", "opt-barrier", "domain", "add-dependency"}
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%[\w.\-]+\s*=\s*.*?\s([a-z][a-z0-9\-]*)\(")
_INLINED = re.compile(r"(?:calls|to_apply)=\{?%([\w.\-]+)")


@dataclass(frozen=True)
class Cost:
    """One compiled program's cost (per call: for a run, per step), with where it was measured.

    ``flops``, ``transcendentals``, ``bytes_accessed``: XLA's cost analysis; ``temp_bytes``,
    ``argument_bytes``, ``output_bytes``: its memory analysis; ``kernels``: counted in the
    optimised HLO (None when it could not be read). A metric the backend does not report is None.
    A loop inside the program (``fori_loop``, ``scan``) is counted once, as XLA counts it, not
    once per iteration.
    ``views``: for a run, the cost of each recorded view at one recorded step, by record name
    (kept apart from the step's own: a view recorded every 100 steps costs 1/100 of it per step).
    """

    flops: float | None
    transcendentals: float | None
    bytes_accessed: float | None
    temp_bytes: int | None
    argument_bytes: int | None
    output_bytes: int | None
    kernels: int | None
    backend: str
    device_kind: str
    jax_version: str
    x64: bool
    views: Mapping[str, "Cost"] = field(default_factory=dict, hash=False)

    def metrics(self) -> dict[str, float | int | None]:
        """Every metric by name, the views' as ``views/<record>/<metric>``: what a cost golden stores."""
        out: dict[str, float | int | None] = {m: getattr(self, m) for m in METRICS}
        for name, v in self.views.items():
            out.update({f"views/{name}/{m}": getattr(v, m) for m in METRICS})
        return out

    @property
    def platform(self) -> dict[str, Any]:
        """Where it was measured; XLA's numbers are comparable only between equal platforms."""
        return {"backend": self.backend, "device_kind": self.device_kind, "jax_version": self.jax_version,
                "x64": self.x64}

    def platform_key(self) -> str:
        """The platform as one readable key (a cost golden's entry name)."""
        return f"{self.backend}/{self.device_kind}/jax-{self.jax_version}" + ("/x64" if self.x64 else "")

    def __str__(self) -> str:
        shown = ", ".join(f"{m}={_fmt(v)}" for m, v in self.metrics().items() if not m.startswith("views/"))
        views = f"; views: {', '.join(self.views)}" if self.views else ""
        return f"Cost({shown}; {self.platform_key()}{views})"


def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def cost(fn: Callable, *args: Any, **kwargs: Any) -> Cost:
    """``jl.cost(fn, *args)``: the cost of one call of ``fn`` on ``args`` (arrays or
    ``jax.ShapeDtypeStruct``), compiled with ``jax.jit`` (or ``fn``'s own ``lower`` when it is
    jitted already, static arguments and donation included). Compiling is the price: nothing runs."""
    import jax

    lower = getattr(fn, "lower", None)
    try:
        lowered = lower(*args, **kwargs) if callable(lower) else jax.jit(fn).lower(*args, **kwargs)
        compiled = lowered.compile()
    except JaxlogError:
        raise
    except Exception as e:
        name = getattr(fn, "__qualname__", repr(fn))
        raise JaxlogError(f"jl.cost: {name} could not be compiled on the given arguments: {type(e).__name__}: {e}") \
            from None
    return cost_of_compiled(compiled)


def cost_of_compiled(compiled: Any, views: Mapping[str, Cost] | None = None) -> Cost:
    """The :class:`Cost` of a ``jax.stages.Compiled``."""
    import jax

    analysis = _analysis(compiled)
    try:
        memory = compiled.memory_analysis()
    except Exception:  # a backend without it
        memory = None
    try:
        kernels = count_kernels(compiled.as_text())
    except Exception:
        kernels = None
    devices = jax.devices()
    absent = 0.0 if analysis else None  # XLA leaves out the counts that are zero
    values: dict[str, Any] = {m: _number(analysis.get(k, absent)) for m, k in _ANALYSIS.items()}
    values.update({m: _integer(getattr(memory, a, None)) for m, a in _MEMORY.items()})
    return Cost(**values, kernels=kernels, backend=jax.default_backend(),
                device_kind=devices[0].device_kind if devices else "unknown", jax_version=jax.__version__,
                x64=bool(jax.config.read("jax_enable_x64")), views=dict(views or {}))


def _analysis(compiled: Any) -> dict:
    try:
        found = compiled.cost_analysis()
    except Exception:
        return {}
    if isinstance(found, (list, tuple)):  # older jax: one dict per program
        found = found[0] if found else {}
    return dict(found or {})


def _number(v: Any) -> float | None:
    if v is None or float(v) < 0:  # -1: not computed
        return None
    return float(v)


def _integer(v: Any) -> int | None:
    return None if v is None or int(v) < 0 else int(v)


def count_kernels(hlo: str) -> int:
    """The kernels a compiled program launches per call, counted in its optimised HLO text: the
    instructions that do work (every opcode but parameters, constants, tuples, bitcasts and control
    flow) in the computations that are not inlined into another (fusion bodies, ``calls=``, and
    reduction regions, ``to_apply=``): the entry, loop bodies and conditions, branches. A fusion
    counts once, however many operations it fuses; one inside a loop body counts once, not once
    per iteration. On GPU this is the number of kernel launches per pass over the program, less
    those a library call makes itself; on CPU, XLA's loops and library calls."""
    bodies: dict[str, list[str]] = {}
    inlined: set[str] = set()
    current: list[str] | None = None
    for line in hlo.splitlines():
        head = _COMPUTATION.match(line)
        if head:
            current = bodies.setdefault(head.group(2), [])
            continue
        if line.startswith("}"):
            current = None
            continue
        if current is None:
            continue
        op = _INSTRUCTION.match(line)
        if op:
            current.append(op.group(1))
            inlined.update(_INLINED.findall(line))
    if not bodies:
        raise JaxlogError("count_kernels: no HLO computation found in the text")
    return sum(1 for name, ops in bodies.items() if name not in inlined for op in ops if op not in _NO_WORK)
