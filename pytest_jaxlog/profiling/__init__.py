"""Layer 2, profiling: profile windows, our Perfetto timeline, trace reading and timings.
Imports only ``record`` and ``errors``."""
