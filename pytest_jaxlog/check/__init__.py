"""Layer 3, check: invariants consume frames and report the first bad step and system.
Imports only ``record`` and ``errors``.

``invariants`` (the public invariants, bounds, reductions over a window, and their JSON specs) is
what users write; ``checker`` is the contract they implement, the one per-run ``Checker`` and the
reading of a leaf's frames they share; ``violation`` the failure they raise (and the values in it
as strict JSON); their arguments are checked by ``record.values``. ``statistics`` holds the statistical
checks (ESS, ensembles, orders of convergence), ``plots`` the pictures of what a check saw."""
