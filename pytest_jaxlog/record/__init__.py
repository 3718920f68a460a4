"""Layer 1, record: what is recorded and when (schedules, records) and the frame format the
drivers hand to every consumer. Imports only ``errors``."""
