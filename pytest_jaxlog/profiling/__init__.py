"""Layer 3, profiling: profile windows, our Perfetto timeline, trace reading, timings, XLA's
cost of a program, and what a speed gate decides with (``speed``). Imports only ``record`` and
``errors``."""
