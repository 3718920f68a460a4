"""Checkpoints and resume, one process or several. What enters: a run's file and the state at a
checkpoint step. What leaves: the checkpoint written into the file, and the state, key and
schedules a resumed run continues from bit for bit."""
