"""Layer 4, drive: turns a step function into frames and feeds them to invariants, sinks and the
timeline. Imports the layers below it.

The folder's modules are the verbs (``run``: ``jl.run``; ``resume``: ``jl.resume``; ``arrays``:
``jl.from_arrays``; ``benchmark``; ``calibrate``); its sub-packages are a run's phases, in order,
each importing only the ones before it:

- ``prepare``: the options checked, and what a kernel, its records and its state make of a run,
  before any step runs;
- ``device``: the plan laid out for a chunk, the compiled chunk program and its buffers;
- ``checkpoints``: checkpoints in the run's file and the state a resume continues from;
- ``host``: the loop that dispatches chunks, the pipeline from frames to
  invariants, sinks and timeline, and the ``Run`` it gives back."""
