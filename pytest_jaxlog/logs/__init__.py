"""``jl.log``: name a value anywhere inside traced code; collect it only when someone listens.

``jl.log(name, value, **indices)`` binds ``jaxlog_log``, a primitive that returns its operands
unchanged and carries the name, the call site and an optional while-loop capacity as params.
Nothing else happens where it is called, so:

- **nobody collecting**: the primitive has no effects and no users, so JAX's dead-code
  elimination drops it (and whatever only fed it) before lowering; its lowering rule, should it
  survive, emits nothing. A jitted kernel with ``jl.log`` calls compiles to the same program as
  without them, and library code can keep its logs in production.
- **collecting** (:func:`.verbs.collect`, used by ``jl.spool``, ``jl.run`` and ``jl.Recorder``): the
  function is traced to a jaxpr inside a jit-cache-sensitive context (``jax.make_user_context``)
  in which the primitive carries the effect of ``jax.debug.callback``. Effects are what JAX keeps
  through every transformation (partial evaluation under ``grad``, ``checkpoint``, ``scan``
  linearization prune unused values otherwise), and the separate cache context means a kernel
  traced for collection and the same kernel traced without never share a jaxpr. The jaxpr is then
  evaluated again by a small interpreter that rebuilds each control-flow primitive that contains
  logs with the public ``lax`` functions, threading the logged values out as extra outputs:

  =========================  ===============================================================
  where ``jl.log`` is         what comes out (leading axes added to the value)
  =========================  ===============================================================
  top level                  the value
  ``lax.scan`` / static       ``(length, ...)``, in the order of ``xs`` (as ``scan``'s ``ys``)
  ``fori_loop``
  ``lax.while_loop`` body     ``(capacity, ...)`` holding the first ``capacity`` iterations,
                             ``count`` (iterations run) and ``overflow`` (values were dropped)
  ``lax.cond`` / ``switch``   the taken branch's value; ``valid`` marks entries whose taken
                             branch did not log
  ``vmap``                   one row per system: the mapped axis first
  ``grad`` / ``jvp`` /        the primal values, once (a ``checkpoint``'s recomputation in the
  ``checkpoint``              backward pass does not log again); derivatives are unchanged
  ``custom_jvp`` /            the values its body computes; the outputs' derivatives still come
  ``custom_vjp``              from its own rule (the logs' from its body)
  nested ``jit``             as if inlined
  =========================  ===============================================================

  Primitives without logs inside are bound again unchanged, so the collected program computes
  exactly what the original did, plus the logged values. Under ``vmap``, a ``cond`` whose
  predicate differs per system has become a select of both branches (so both branches' logs are
  collected), and a ``while_loop`` whose stopping test differs per system runs until the last one
  stops (rows past a system's own stop hold values computed from its stopped state).

Results, per name: the value itself when nothing else is known about it; otherwise a dict with
``"value"`` and the extra fields: each keyword index (``step=``...), ``"valid"`` (bool, same
leading axes as the value), ``"count"`` (int32; a tuple, outermost first, for nested while loops)
and ``"overflow"`` (bool, true when any value was dropped). A name logged at several places (or
by a function called twice) is stacked along a new leading axis, in program order.

The layer, one concept a module: :mod:`.primitive` (the primitive, its JAX rules, and ``jl.log``
itself), :mod:`.collector` (the interpreter that collects, its registry of control-flow rules,
where logs sit in a jaxpr, the results' structure), :mod:`.verbs` (tracing, ``collect``,
``jl.spool``, ``jl.tap``), and :mod:`.compat`, the only module that knows how JAX versions
differ. (The layer is ``logs``, not ``log``: the package's attribute ``pytest_jaxlog.log`` is the
function ``jl.log``, which a sub-package of that name would replace as soon as it is imported.)
"""

from .collector import LogEvent, jaxpr_has_logs
from .primitive import RESERVED_FIELDS, calls_made, log, unheard, unheard_count
from .verbs import Shapes, collect, collected_shapes, has_logs, shapes_and_logs, spool, tap

__all__ = ["log", "spool", "tap", "collect", "collected_shapes", "has_logs", "shapes_and_logs", "Shapes",
           "LogEvent", "RESERVED_FIELDS", "unheard", "unheard_count", "calls_made", "jaxpr_has_logs"]
