"""Layer 1, record: what is recorded and when (schedules, records, a run's metadata), the frame
format the drivers hand to every consumer, and values as users give them (``values``). Imports
only ``errors``."""
