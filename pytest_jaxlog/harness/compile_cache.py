"""``--jaxlog-compile-cache DIR``: JAX's persistent compilation cache for the session (by default
one in pytest's cache directory, set up when the first test uses jaxlog).

Why the default directory is split by machine: XLA:CPU compiles for the CPU it runs on, and JAX's
cache key does not name the CPU's features, so an entry written on a runner with AVX-512 loaded on
one without it can crash with an illegal instruction. The default cache (``.pytest_cache``, which
CI often saves and restores across runners) therefore keeps one subdirectory per CPU model and
flags, machine, jax/jaxlib versions and platforms (``machine_key``).

Why each process writes into a private directory (``PrivateCache``): JAX writes an entry in
place, with no temporary file and no lock (jax 0.10.2 ``LRUCache.put``: ``write_bytes``), so a
process reading the entry while another writes it (two xdist workers compiling one kernel, two
sessions on one machine), or a process killed mid-write, sees a truncated entry. JAX then warns
("Error reading persistent compilation cache entry ...: incomplete or truncated stream") and
compiles again: harmless in itself, but an error under ``-W error`` or ``filterwarnings = error``,
and a killed writer's truncated entry stays for good. So JAX gets a directory of its own per
process, seeded with hard links to the shared entries (complete by construction), and at the
end of the session the new entries are published into the shared directory by link and rename,
which a reader sees whole or not at all.

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
import shutil
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

# jax config name -> (the value the session sets, JAX's default); the environment variable is the
# upper-cased name. Thresholds lifted: by default JAX caches only programs that took a second to
# compile (-1: no size threshold, and no backend default replacing it). XLA's own GPU caches off:
# JAX places them inside the cache directory and its cache key names them, so with them on no
# process would ever find another's entries in its private directory (see PrivateCache).
_SETTINGS: dict[str, tuple[Any, Any]] = {
    "jax_compilation_cache_dir": (None, None),  # the directory, given per call
    "jax_persistent_cache_min_compile_time_secs": (0.0, 1.0),
    "jax_persistent_cache_min_entry_size_bytes": (-1, 0),
    "jax_persistent_cache_enable_xla_caches": ("none", "xla_gpu_per_fusion_autotune_cache_dir"),
}
_DIR = "jax_compilation_cache_dir"


def use_compile_cache(directory: Path) -> Callable[[], None]:
    """Point JAX's persistent compilation cache at ``directory`` (created) and cache every
    program; returns what undoes it."""
    directory.mkdir(parents=True, exist_ok=True)
    values = {name: (str(directory) if name == _DIR else value) for name, (value, _) in _SETTINGS.items()}
    jax = sys.modules.get("jax")
    if jax is not None and hasattr(jax, "config"):
        previous = {name: getattr(jax.config, name) for name in values if hasattr(jax.config, name)}
        for name in previous:
            jax.config.update(name, values[name])
        _reset_cache()

        def undo() -> None:
            for name, value in previous.items():
                jax.config.update(name, value)
            _reset_cache()
        return undo
    saved = {name.upper(): os.environ.get(name.upper()) for name in values}
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
            for name, (_, default) in _SETTINGS.items():
                old = saved[name.upper()]
                if hasattr(jax_now.config, name):
                    jax_now.config.update(name, default if old is None else type(values[name])(old))
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
    if os.environ.get(_DIR.upper()):
        return True
    jax = sys.modules.get("jax")
    return bool(jax is not None and hasattr(jax, "config") and getattr(jax.config, _DIR, None))


def _reset_cache() -> None:
    """Close the cache JAX opened (it opens one per process, on the first compile): the next
    compile opens the directory configured now."""
    try:
        from jax.experimental.compilation_cache import compilation_cache
    except ImportError:  # no such module in this jax: the directory applies from the next process on
        return
    compilation_cache.reset_cache()


class PrivateCache:
    """This process's directory for JAX's cache, inside the shared one: ``.<host>-<pid>.private``
    (the leading dot keeps it out of the entries). ``open`` seeds it, ``publish`` moves what JAX
    wrote there into the shared directory and removes it."""

    def __init__(self, shared: Path):
        self.shared = shared
        self.host = socket.gethostname()
        self.path = shared / f".{self.host}-{os.getpid()}.private"

    def open(self) -> Path:
        self.shared.mkdir(parents=True, exist_ok=True)
        self._remove_dead()
        self.path.mkdir(exist_ok=True)
        for entry in self._entries(self.shared):
            _link_or_copy(entry, self.path / entry.name)
        return self.path

    def publish(self) -> int:
        """Move the entries JAX wrote into the shared directory, each whole or not at all; returns
        how many were new there."""
        new = 0
        try:
            for entry in self._entries(self.path):
                target = self.shared / entry.name
                if target.exists():
                    continue
                part = self.shared / f".{entry.name}.{self.host}-{os.getpid()}.part"
                try:
                    _link_or_copy(entry, part)
                    os.replace(part, target)  # atomic: a reader sees the whole entry or none
                except OSError:  # a full disk: the entry is compiled again next time, nothing breaks
                    part.unlink(missing_ok=True)
                    continue
                new += 1
        finally:
            shutil.rmtree(self.path, ignore_errors=True)
        return new

    @staticmethod
    def _entries(directory: Path) -> list[Path]:
        try:
            return [p for p in directory.iterdir() if not p.name.startswith(".") and p.is_file()]
        except OSError:
            return []

    def _remove_dead(self) -> None:
        """Private directories of processes of this host that are gone (killed before publishing:
        their entries may be truncated, so they are dropped, not published)."""
        for d in self.shared.glob(f".{self.host}-*.private"):
            pid = d.name[len(self.host) + 2:-len(".private")]
            if pid.isdigit() and int(pid) != os.getpid() and not alive(int(pid)):
                shutil.rmtree(d, ignore_errors=True)


def alive(pid: int) -> bool:
    """Whether process ``pid`` of this host still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _link_or_copy(src: Path, dst: Path) -> None:
    """A hard link (entries never change once written), else a copy (a filesystem without links)."""
    try:
        os.link(src, dst)
    except FileExistsError:
        pass
    except OSError:
        shutil.copyfile(src, dst)
