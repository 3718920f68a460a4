"""The example suite keeps every test's artifacts (trajectories, traces, manifest) in .jaxlog/, so a
first run leaves something to open: ``python -m pytest_jaxlog info .jaxlog/<test>/trajectory.h5``.
``--jaxlog-keep=failed`` on the command line, or ``JAXLOG_KEEP`` in the environment, wins.

The kernels run on the backend JAX picks (a GPU where there is one; ``JAX_PLATFORMS=cpu`` to
choose the CPU)."""

import os


def pytest_configure(config):
    # the plugin is loaded (the option exists), no --jaxlog-keep given and no JAXLOG_KEEP set
    if getattr(config.option, "jaxlog_keep", "absent") is None and not os.environ.get("JAXLOG_KEEP", "").strip():
        config.option.jaxlog_keep = "all"
