"""Names of a test's files (its artifact directory, its goldens) from its pytest node id.

Its own module, with the standard library only, because the plugin names a directory for every
test while most suites never touch a golden: importing ``golden`` (numpy, the store) for a name
cost a session ~0.1 s.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["golden_name"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._+=-]")


def golden_name(nodeid: str, suffix: str = ".h5", *, name: str | None = None) -> str:
    """A file name for a test's golden, from its pytest node id and the check's ``name=``; stable across
    runs and machines, and different for every (test, name) pair.

    ``examples/test_lj.py::TestNVE::test_energy[64-float32]`` ->
    ``examples.test_lj.TestNVE.test_energy-64-float32.h5`` (``/`` and ``::`` -> ``.``, ``.py`` dropped,
    ``[a-b]`` -> ``-a-b``); with ``name="second"``: ``...test_energy-64-float32--second.h5``. The ``--``
    before the name appears nowhere else in a plain name, so ``test_f[a]`` with ``name="b"``
    (``test_f-a--b``) and ``test_f[a-b]`` (``test_f-a-b``) differ. When characters had to be replaced,
    the test part would contain ``--`` or end with ``-``, or the name would be long (over 120
    characters), a short hash of the node id (and name) keeps names unique and within file-name limits.
    """
    file, _, rest = nodeid.partition("::")
    if file.endswith(".py"):
        file = file[:-3]
    raw = file.replace("\\", "/").split("/")
    parts = [p for p in raw if p not in ("", ".", "..")]
    head, bracket, param = rest.partition("[")  # the parameter id may hold '::' itself: split it off first
    if bracket and not param.endswith("]"):
        head, bracket, param = rest, "", ""
    parts += [p for p in head.split("::") if p]
    # a '.' inside a part ('v1.2/test_x.py' vs 'v1/2/test_x.py') or a '..' dropped from the path would
    # make two tests' names equal: hashed like replaced characters
    ambiguous = ".." in raw or any("." in p for p in parts)
    stem = ".".join(parts)
    if bracket:
        stem = f"{stem}-{param[:-1]}"
    safe = _UNSAFE.sub("_", stem)
    # '--' separates the check's name: a test part with '--' in it, or ending in '-', is hashed
    if safe != stem or ambiguous or "--" in safe or safe.endswith("-") or len(safe) > 120:
        safe = f"{safe[:110]}-{_digest(nodeid)}"
    if name is not None:
        name = str(name)
        clean = _UNSAFE.sub("_", name)
        full = f"{safe}--{clean}"
        if clean != name or clean.startswith("-") or len(full) > 120:
            full = f"{full[:110]}-{_digest(nodeid + chr(0) + name)}"
        safe = full
    return safe + suffix


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:8]
