"""The host side of a run. What enters: the checked options (``prepare.config``) and the planned run.
What leaves: a ``Run`` (``result``). ``loop`` dispatches chunks and hands their frames to the
``pipeline`` (invariants, sinks, timeline); ``recorder`` and ``loggers`` serve loops written by
hand; ``checkpointer`` writes checkpoints and post-mortems; ``signals`` turns SIGTERM into a
clean stop."""
