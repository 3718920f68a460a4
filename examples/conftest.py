"""The example suite keeps every test's artifacts (trajectories, traces, manifest) in .jaxlog/, so a
first run leaves something to open: ``python -m pytest_jaxlog info .jaxlog/<test>/trajectory.h5``.
``--jaxlog-keep=failed`` on the command line restores the plugin's default."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def pytest_configure(config):
    if getattr(config.option, "jaxlog_keep", "absent") is None:  # the plugin is loaded and no --jaxlog-keep given
        config.option.jaxlog_keep = "all"
