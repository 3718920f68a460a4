"""Layer 3, drive: turns a step function into frames and feeds them to invariants, sinks and the
timeline (``jl.run``, ``jl.Recorder``, loggers). Imports the layers below it."""
