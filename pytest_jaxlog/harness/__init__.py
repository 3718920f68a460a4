"""Layer 5, the pytest side; ``plugin.py`` only registers hooks that call into here.

- ``options``: ``--jaxlog-*`` options, their ``JAXLOG_*`` variables and ini keys, the marker, ``Settings``
- ``session``: the per-process session: artifact directories, outcomes, manifest, terminal summary, xdist
  merge, and the errors that make a test *error* rather than fail
- ``fixture``: the ``jaxlog`` fixture's object, and ``jaxlog_factory``'s for hypothesis ``@given`` tests
- ``goldens``: trajectory, cost and ESS goldens from the test's side, through one decision (``decide``):
  compare, create a missing one, regenerate, leave a pending one for review, and the hint naming the flag
- ``baselines``: benchmark baselines across sessions, from the test's side
- ``devices``: ``@pytest.mark.jaxlog(devices=N)``: a test under N host CPU devices (a child pytest if need be)
- ``processes``: ``@pytest.mark.jaxlog(processes=N)``: a test as N ``jax.distributed`` processes, their
  shared fate, and the test's reports from theirs
- ``report``: the HTML report, the failing tests' plots and their JUnit attachments
- ``artifacts``: artifact directories of tests that keep none, removed in the background, and the
  evidence of earlier sessions
- ``disabled``: the ``jaxlog_disabled`` plugin, active only under ``-p no:jaxlog``
- ``compile_cache``: ``--jaxlog-compile-cache``: JAX's persistent compilation cache for the session

Imports no jax, numpy, h5py or perfetto at load."""
