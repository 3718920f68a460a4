"""``--jaxlog-compile-cache DIR``: JAX's persistent compilation cache for the session (by default
one in pytest's cache directory, set up when the first test uses jaxlog).

Why the default directory is split by machine: XLA:CPU compiles for the CPU it runs on, and JAX's
cache key does not name the CPU's features, so an entry written on a runner with AVX-512 loaded on
one without it can crash with an illegal instruction. The default cache (``.pytest_cache``, which
CI often saves and restores across runners) therefore keeps one subdirectory per CPU model and
flags, machine, jax/jaxlib versions and platforms (``machine_key``).

Why the settings go through the environment when jax is not imported yet: the plugin must not
import jax when it loads or configures (a conftest may still set ``XLA_FLAGS``/``JAX_*``), and JAX
reads ``JAX_COMPILATION_CACHE_DIR`` and the two threshold variables when it starts. When jax is
already imported, ``jax.config.update`` sets them (and the cache JAX may have opened already is
reset, so the directory takes effect). Either way the thresholds are lifted: by default JAX
caches only programs that took a second to compile, which leaves out most of a test suite's CPU
programs. The previous values come back when the session ends (an in-process pytest run, such
as pytester's, leaves the outer process as it found it).
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

# jax config name -> the value the session sets; the environment variable is the upper-cased name
_SETTINGS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")


def use_compile_cache(directory: Path) -> Callable[[], None]:
    """Point JAX's persistent compilation cache at ``directory`` (created) and cache every
    program; returns what undoes it."""
    directory.mkdir(parents=True, exist_ok=True)
    # -1: no size threshold, and no backend default replacing it
    values: dict[str, Any] = {_SETTINGS[0]: str(directory), _SETTINGS[1]: 0.0, _SETTINGS[2]: -1}
    jax = sys.modules.get("jax")
    if jax is not None and hasattr(jax, "config"):
        previous = {name: getattr(jax.config, name) for name in _SETTINGS}
        for name, value in values.items():
            jax.config.update(name, value)
        _reset_cache()

        def undo() -> None:
            for name, value in previous.items():
                jax.config.update(name, value)
            _reset_cache()
        return undo
    saved = {name.upper(): os.environ.get(name.upper()) for name in _SETTINGS}
    for name, value in values.items():
        os.environ[name.upper()] = str(value)

    def restore() -> None:
        for var, old in saved.items():
            if old is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = old
        jax_now = sys.modules.get("jax")  # imported during the session: its config read the variables
        if jax_now is not None and hasattr(jax_now, "config"):
            defaults = {_SETTINGS[0]: None, _SETTINGS[1]: 1.0, _SETTINGS[2]: 0}
            for name in _SETTINGS:
                old = saved[name.upper()]
                jax_now.config.update(name, defaults[name] if old is None else type(values[name])(old))
            _reset_cache()
    return restore


def machine_key() -> str:
    """The name of this machine's subdirectory of the default cache: ``<machine>-<hash>``, the hash
    of the CPU's model and feature flags, the jax and jaxlib versions and the platforms JAX may use.
    Read without importing jax (the versions from the installed distributions)."""
    parts = [platform.machine(), platform.system(), _cpu_features()]
    for dist in ("jax", "jaxlib"):
        try:
            parts.append(f"{dist}={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{dist}=?")
    jax = sys.modules.get("jax")
    platforms = getattr(getattr(jax, "config", None), "jax_platforms", None) if jax is not None else None
    parts.append(f"platforms={platforms or os.environ.get('JAX_PLATFORMS', '')}")
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return f"{platform.machine() or 'cpu'}-{digest}"


def _cpu_features() -> str:
    """The CPU model and feature flags: the first processor's lines of ``/proc/cpuinfo`` on Linux
    (model name, flags; ``Features``/``CPU part`` on Arm), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return f"{platform.processor()}|{platform.platform()}"
    first = text.split("\n\n", 1)[0]
    keep = ("vendor_id", "model name", "cpu family", "model", "flags", "features", "cpu implementer",
            "cpu architecture", "cpu variant", "cpu part", "isa")
    lines = [ln for ln in first.splitlines() if ln.split(":", 1)[0].strip().lower() in keep]
    return "|".join(" ".join(ln.split()) for ln in lines) or platform.processor()


def configured_elsewhere() -> bool:
    """Whether the user set JAX's cache directory already (its variable, or ``jax.config`` in a
    conftest): the default then leaves JAX as it is."""
    if os.environ.get(_SETTINGS[0].upper()):
        return True
    jax = sys.modules.get("jax")
    return bool(jax is not None and hasattr(jax, "config") and getattr(jax.config, _SETTINGS[0], None))


def _reset_cache() -> None:
    """Close the cache JAX opened (it opens one per process, on the first compile): the next
    compile opens the directory configured now."""
    try:
        from jax.experimental.compilation_cache import compilation_cache
    except ImportError:  # no such module in this jax: the directory applies from the next process on
        return
    compilation_cache.reset_cache()
