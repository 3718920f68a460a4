"""The repository's own tests run on the CPU (``JAX_PLATFORMS=cpu`` unless set): they compare runs
with references computed in numpy and across chunk sizes bit for bit, and drive the CPU's
behaviour on purpose (fault injection, memory limits, subprocess timings), which another backend
would change. The examples (``examples/``) run on whatever backend JAX picks."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
