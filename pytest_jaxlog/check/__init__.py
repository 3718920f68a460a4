"""Layer 2, check: invariants consume frames and report the first bad step and system.
Imports only ``record`` and ``errors``.

``invariants`` (the public invariants) and ``aggregate`` (reductions over a window) are what users
write; ``checker`` is the contract they implement and the one per-run ``Checker``; ``violation``
the failure they raise; ``leaves``, ``bounds``, ``codec`` and ``args`` what they share.
"""
