"""Where a trajectory came from: versions, backend and machine, stored with every file.

jax is imported inside ``provenance()`` (not at module import) so the plugin stays jax-free.
"""

from __future__ import annotations

import datetime
import platform
import socket
import sys
from importlib import metadata


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


_STATIC: dict | None = None


def provenance() -> dict:
    """JSON-able description of the software and hardware this process runs on.

    Versions and devices do not change within a process: they are looked up once (package
    metadata lookups cost milliseconds per run); the time is fresh on every call."""
    global _STATIC
    if _STATIC is None:
        _STATIC = _describe()
    return {**_STATIC, "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _describe() -> dict:
    from .. import __version__

    out: dict = {
        "pytest_jaxlog": __version__,
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "h5py": _version("h5py"),
        "ml_dtypes": _version("ml_dtypes"),
        "jax": _version("jax"),
        "jaxlib": _version("jaxlib"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "hostname": socket.gethostname(),
        "argv0": sys.argv[0] if sys.argv else None,
    }
    try:
        import jax

        out["jax"] = jax.__version__
        devices = jax.devices()
        out["backend"] = jax.default_backend()
        out["device_kind"] = devices[0].device_kind if devices else None
        out["device_count"] = len(devices)
        out["x64"] = bool(jax.config.jax_enable_x64)
    except Exception as exc:  # no jax or no backend: provenance must never break a run
        out.update(backend=None, device_kind=None, device_count=0, x64=None, jax_error=repr(exc))
    return out
