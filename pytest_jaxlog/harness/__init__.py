"""Layer 4, the pytest side; ``plugin.py`` only registers hooks that call into here.

- ``options``: ``--jaxlog-*`` options, their ``JAXLOG_*`` variables and ini keys, the marker, ``Settings``
- ``session``: the per-process session: artifact directories, outcomes, manifest, terminal summary, xdist merge
- ``fixture``: the ``jaxlog`` fixture's object (runs, recorders, windows into one test's directory)
- ``goldens``: ``check_golden`` from the test's side: regenerate, create missing, explain a missing golden
- ``factory``: ``jaxlog_factory`` for hypothesis ``@given`` tests (one directory per example)
- ``devices``: ``@pytest.mark.jaxlog(devices=N)``: a test under N host CPU devices (a child pytest if need be)
- ``processes``: ``@pytest.mark.jaxlog(processes=N)``: a test as N ``jax.distributed`` processes (child pytests)
- ``fate``: those processes' shared fate: one fails or times out, all stop (SIGTERM, then SIGKILL)
- ``group_reports``: the test's reports and manifest entry from its processes' reports
- ``disabled``: the ``jaxlog_disabled`` plugin, active only under ``-p no:jaxlog``
- ``compile_cache``: ``--jaxlog-compile-cache``: JAX's persistent compilation cache for the session
- ``discard``: artifact directories of tests that keep none, removed in the background

Imports no jax, numpy, h5py or perfetto at load.
"""
