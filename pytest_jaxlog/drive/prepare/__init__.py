"""Planning a run, before any step runs. What enters: the kernel, its state, ``record=`` and the
run's options, as given. What leaves: the options declared and checked (``config``), the schema
of what is recorded, the predicates' sources, the sharding of the state and the processes'
agreement, and the identity of the compiled program (one per distinct program, the driver's
caches keyed by it). Nothing here runs the kernel's steps."""
