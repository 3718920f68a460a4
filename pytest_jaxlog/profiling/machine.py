"""The machine a benchmark was timed on, as saved baselines name it: timings are comparable only
between sessions on the same CPU model, backend, device kind and jax version, so a saved run's
directory is named after them and a comparison never reaches into another machine's runs."""

from __future__ import annotations

import hashlib
import platform
import re
from dataclasses import asdict, dataclass

__all__ = ["Machine", "this_machine", "cpu_model"]


@dataclass(frozen=True)
class Machine:
    """What makes two sessions' timings comparable (nothing else: not the host name, so CI runners
    of one kind share their baselines)."""

    cpu: str
    backend: str
    device_kind: str
    jax: str

    @property
    def key(self) -> str:
        """The directory name: readable where it can be, with a hash of every field (the CPU model
        included) so that two machines never share a directory."""
        digest = hashlib.sha256("\n".join(asdict(self).values()).encode()).hexdigest()[:10]
        kind = re.sub(r"[^A-Za-z0-9.]+", "_", self.device_kind).strip("_")[:40] or "device"
        return f"{self.backend}-{kind}-jax{self.jax}-{digest}"

    def describe(self) -> str:
        return f"{self.cpu}; {self.backend} {self.device_kind}; jax {self.jax}"

    def to_json(self) -> dict:
        return {**asdict(self), "key": self.key}

    @classmethod
    def from_json(cls, doc: object) -> "Machine | None":
        if not isinstance(doc, dict):
            return None
        fields = [doc.get(k) for k in ("cpu", "backend", "device_kind", "jax")]
        return cls(*fields) if all(isinstance(f, str) for f in fields) else None  # type: ignore[arg-type]


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip().lower() in ("model name", "hardware", "cpu model") and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def this_machine() -> Machine:
    """This process's machine: its CPU and jax's default backend and first device."""
    import jax

    device = jax.devices()[0]
    return Machine(cpu_model(), jax.default_backend(), str(getattr(device, "device_kind", device.platform)),
                   jax.__version__)
