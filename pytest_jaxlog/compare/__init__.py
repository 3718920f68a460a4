"""Layer 4, compare: the products a test compares with what it kept from an earlier run, one
wing each: trajectory goldens (``golden``, their files ``golden_files``), cost goldens (``cost``)
and benchmark baselines (``baseline``). Each wing owns its file format, its comparison, its
failure message and its plot. What enters: trajectories, ``jl.Cost`` figures, timings. What
leaves: a verdict, a message naming the flag that fixes it, a picture. Imports the layers
below it (record, check, store, profiling), never drive or the pytest side."""
