"""``--jaxlog-compile-cache DIR``: JAX's persistent compilation cache for the session.

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

import os
import sys
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


def _reset_cache() -> None:
    """Close the cache JAX opened (it opens one per process, on the first compile): the next
    compile opens the directory configured now."""
    try:
        from jax.experimental.compilation_cache import compilation_cache
    except ImportError:  # no such module in this jax: the directory applies from the next process on
        return
    compilation_cache.reset_cache()
