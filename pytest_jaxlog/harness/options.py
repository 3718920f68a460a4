"""The plugin's settings: command-line options, their environment variables and ini keys, the
``@pytest.mark.jaxlog`` marker, and the resolved ``Settings`` a test's runs use.

Every ``--jaxlog-*`` option reads ``JAXLOG_*`` from the environment, so CI can set it once for any
test command; precedence is command line > environment > ini > default. Errors name where the bad
value came from (``JAXLOG_KEEP=sometimes``), because that is where the user has to fix it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

import pytest

from ..errors import JaxlogError

KEEP_CHOICES = ("failed", "all", "none")
VIOLATION_CHOICES = ("raise", "warn")
MARKER_VIOLATION_CHOICES = ("raise", "warn", "record")
PROGRESS_CHOICES = ("auto", "on", "off")
MARKER_KEYS = ("profile", "keep", "on_violation", "chunk", "progress", "devices", "processes", "timeout")
GOLDEN_DIR_INI = "jaxlog_golden_dir"
GOLDEN_DIR_DEFAULT = "fixtures/golden"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Option:
    """One ``--jaxlog-<key>`` option with its ``JAXLOG_<KEY>`` variable and (``ini``) ``jaxlog_<key>`` key."""

    key: str
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    flag: bool = False  # on/off: `--jaxlog-<key>` with no value; the variable takes 1/0, true/false, yes/no, on/off
    ini: bool = True
    const: str | None = None  # the value of `--jaxlog-<key>` given without one (`--jaxlog-<key>[=VALUE]`)

    @property
    def flag_name(self) -> str:
        return "--jaxlog-" + self.key.replace("_", "-")

    @property
    def dest(self) -> str:
        return f"jaxlog_{self.key}"

    @property
    def ini_name(self) -> str:
        return f"jaxlog_{self.key}"

    @property
    def env(self) -> str:
        return f"JAXLOG_{self.key.upper()}"

    def sources(self) -> str:
        """Where the value can be set, for error messages: ``--jaxlog-keep / JAXLOG_KEEP / jaxlog_keep``."""
        return " / ".join([self.flag_name, self.env] + ([self.ini_name] if self.ini else []))


OPTIONS: dict[str, Option] = {
    o.key: o
    for o in (
        Option("dir", ".jaxlog", "directory for trajectories, traces and manifest.json (relative to the invocation "
               "directory from the command line or environment, to rootdir from the ini file)", metavar="DIR"),
        Option("keep", "failed", "which tests keep their artifact directory: failed|all|none", choices=KEEP_CHOICES),
        Option("profile", "none", "profile work steps START:STOP (inclusive) of every jaxlog run (skipped or clipped, "
               "with a note, for runs that end sooner), or none", metavar="START:STOP"),
        Option("on_violation", "raise", "invariant violation: raise (test fails) or warn", choices=VIOLATION_CHOICES),
        Option("progress", "auto", "progress bar of jaxlog runs: auto|on|off", choices=PROGRESS_CHOICES),
        Option("chunk", "auto", "steps per device chunk of jaxlog runs: N or auto", metavar="N"),
        Option("compile_cache", "auto", "directory of JAX's persistent compilation cache for the session (every "
               "program cached, so a second run compiles nothing; relative to the invocation directory from the "
               "command line or environment, to rootdir from the ini file); auto: a subdirectory per machine of "
               "pytest's cache directory (none under -p no:cacheprovider or where JAX's cache is configured "
               "already); off", metavar="DIR"),
        Option("regen", False, "write or overwrite every golden trajectory the session checks", flag=True, ini=False),
        Option("create_goldens", False, "write goldens that do not exist yet (the test passes with a warning naming "
               "the file); existing goldens are still compared", flag=True),
        Option("golden_review", False, "review goldens instead of rewriting them: a golden that differs is left as "
               "it is and the obtained one written beside it as a pending file (jaxlog golden accept|reject); on "
               "by default where the CI variable is set (JAXLOG_GOLDEN_REVIEW=0 turns it off)", flag=True),
        Option("clean_stale", False, "remove the artifact directories and manifest entries earlier sessions left "
               "for tests this session does not run (kept by default, listed as stale)", flag=True),
    )
}


def add_options(parser: pytest.Parser, options: Iterable[Option] | None = None) -> None:
    """The options (all of ``OPTIONS`` when None; another module's own ``Option``s otherwise)."""
    for opt in OPTIONS.values() if options is None else options:
        add_option(parser, opt)
    if options is not None:
        return
    parser.addini(GOLDEN_DIR_INI, f"jaxlog: directory of golden trajectories, relative to rootdir "
                  f"(default: {GOLDEN_DIR_DEFAULT})", default=GOLDEN_DIR_DEFAULT)


def add_option(parser: pytest.Parser, opt: Option) -> None:
    """``opt`` as a command-line option of the jaxlog group and (``opt.ini``) an ini key."""
    group = parser.getgroup("jaxlog", "jaxlog: record, check and profile JAX kernels")
    default = ("on" if opt.default else "off") if opt.flag else opt.default
    where = f"env: {opt.env}" + (f"; ini: {opt.ini_name}" if opt.ini else "")
    text = f"{opt.help} (default: {default}; {where})"
    kwargs: dict[str, Any] = {"dest": opt.dest, "default": None, "help": text}
    if opt.flag:
        kwargs["action"] = "store_true"
    else:
        if opt.choices:
            kwargs["choices"] = opt.choices
        if opt.metavar:
            kwargs["metavar"] = opt.metavar
        if opt.const is not None:
            kwargs.update(nargs="?", const=opt.const)
    group.addoption(opt.flag_name, **kwargs)
    if opt.ini:
        ini_type = "bool" if opt.flag else "string"
        parser.addini(opt.ini_name, f"jaxlog: {opt.help} (default: {default}; env: {opt.env})",
                      type=ini_type, default=opt.default)


@dataclass(frozen=True)
class Sourced:
    """An option's value and where it came from (``origin``: cli, env, ini or default; ``name``: the
    flag, variable or ini key a user would change)."""

    value: Any
    origin: str
    name: str

    @property
    def label(self) -> str:
        """For messages: ``--jaxlog-keep``, ``JAXLOG_KEEP=all``, ``ini jaxlog_keep``, ``default``."""
        if self.origin == "env":
            return f"{self.name}={self.value}"
        return f"ini {self.name}" if self.origin == "ini" else self.name


def lookup(config: pytest.Config, key: str | Option, environ: Mapping[str, str] | None = None) -> Sourced:
    """The value of option ``key`` (or of an ``Option`` added by another module): command line >
    environment > ini > default. An empty variable counts as unset (CI systems expand undefined
    variables to "")."""
    opt = key if isinstance(key, Option) else OPTIONS[key]
    environ = os.environ if environ is None else environ
    value = config.getoption(opt.dest, None)
    if value is not None and value is not False:
        return Sourced(value, "cli", opt.flag_name)
    env = environ.get(opt.env, "").strip()
    if env:
        return Sourced(env, "env", opt.env)
    if opt.ini:
        ini = config.getini(opt.ini_name)
        if ini not in (None, "") and ini != opt.default:
            return Sourced(ini, "ini", opt.ini_name)
    return Sourced(opt.default, "default", "default")


def usage_error(error: BaseException | str) -> pytest.UsageError:
    """A bad setting as pytest's usage error: one ``[jaxlog]`` line, no traceback, naming where the
    value came from (the message says so: ``jaxlog chunk (JAXLOG_CHUNK=banana): ...``)."""
    text = str(error)
    return pytest.UsageError(text if text.startswith("[jaxlog]") else f"[jaxlog] {text}")


def given_explicitly(config: pytest.Config, options: Iterable[Option]) -> str | None:
    """The first of ``options`` given on the command line or set in the ini file (the golden
    directory's ini key included), as a user would name it; None when none is. The environment
    does not count: CI sets ``JAXLOG_*`` once for every test command, jaxlog's or not."""
    for opt in options:
        value = config.getoption(opt.dest, None)
        if value is not None and value is not False:
            return opt.flag_name
        if opt.ini:
            try:
                ini = config.getini(opt.ini_name)
            except ValueError:  # a bad boolean: set, and the session's resolution names it
                return f"ini {opt.ini_name}"
            if ini not in (None, "") and ini != opt.default:
                return f"ini {opt.ini_name}"
    if str(config.getini(GOLDEN_DIR_INI)) != GOLDEN_DIR_DEFAULT:
        return f"ini {GOLDEN_DIR_INI}"
    return None


def what(key: str, source: Sourced) -> str:
    """``jaxlog keep (JAXLOG_KEEP=sometimes)``: the head of an error about option ``key``."""
    return f"jaxlog {key} ({source.label})"


# ---------------------------------------------------------------------------------------------
# parsing and validation of option values


def parse_profile(value: Any, what: str) -> tuple[int, int] | None:
    """``"a:b"``, ``(a, b)`` or ``None``/``"none"`` -> ``(a, b)`` or None; JaxlogError naming ``what``."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "off")):
        return None
    pair: Any = value
    if isinstance(value, str):
        pair = value.split(":")
    try:
        a, b = pair
        if isinstance(a, bool) or isinstance(b, bool):
            raise TypeError
        a, b = int(a), int(b)
        if isinstance(value, (tuple, list)) and (a != value[0] or b != value[1]):
            raise TypeError
    except (TypeError, ValueError):
        raise JaxlogError(f"{what}: expected START:STOP work steps (e.g. 10:20) or (start, stop), got {value!r}") from None
    if a < 0 or b < a:
        raise JaxlogError(f"{what}: need 0 <= START <= STOP, got {a}:{b}")
    return a, b


def parse_chunk(value: Any, what: str) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto", "none")):
        return None
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        n = int(value)
    except (TypeError, ValueError):
        raise JaxlogError(f"{what}: expected a positive number of steps or auto, got {value!r}") from None
    if n <= 0:
        raise JaxlogError(f"{what}: expected a positive number of steps or auto, got {value!r}")
    return n


def parse_devices(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise JaxlogError(f"{what}: expected a positive number of host CPU devices, got {value!r}")
    return value


def parse_processes(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise JaxlogError(f"{what}: expected a positive number of jax.distributed processes, got {value!r}")
    return value


def parse_timeout(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise JaxlogError(f"{what}: expected a positive number of seconds, got {value!r}")
    return float(value)


def parse_choice(value: Any, choices: tuple[str, ...], what: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise JaxlogError(f"{what}: expected one of {'|'.join(choices)}, got {value!r}")
    return value


def parse_progress(value: Any, what: str) -> bool | None:
    if value is True or value is False:
        return value
    if value is None:
        return None
    v = parse_choice(value, PROGRESS_CHOICES, what)
    return {"auto": None, "on": True, "off": False}[v]


def parse_flag(value: Any, what: str) -> bool:
    if value is True or value is False:
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise JaxlogError(f"{what}: expected 1/0, true/false, yes/no or on/off, got {value!r}")


def golden_review(config: pytest.Config, environ: Mapping[str, str] | None = None) -> bool:
    """Whether goldens are reviewed rather than rewritten: ``--jaxlog-golden-review`` (or its
    variable or ini key) when given, else whether the ``CI`` variable is set (to anything but an
    off value: CI services set ``CI=true``), since a CI job must never rewrite a golden."""
    environ = os.environ if environ is None else environ
    source = lookup(config, "golden_review", environ)
    if source.origin != "default":
        return parse_flag(source.value, what("golden_review", source))
    ci = environ.get("CI", "").strip().lower()
    return bool(ci) and ci not in _FALSE


# ---------------------------------------------------------------------------------------------
# what a test's runs use


@dataclass(frozen=True)
class Settings:
    """What a run in a test uses, after marker > option > env > ini > default."""

    keep: str = "failed"
    profile: tuple[int, int] | None = None
    on_violation: str = "raise"
    progress: bool | None = None
    chunk: int | None = None
    profile_source: str = "--jaxlog-profile"  # named in notes about the window (marker or option)
    devices: int | None = None  # host CPU devices the test runs under (marker only; see harness.devices)
    processes: int | None = None  # jax.distributed processes the test runs in (marker only; harness.processes)
    timeout: float | None = None  # seconds those processes may run before they are stopped (marker only)

    def with_marker(self, kwargs: dict[str, Any], nodeid: str) -> "Settings":
        def what(key: str) -> str:
            return f"{nodeid}: @pytest.mark.jaxlog({key}=...)"

        bad = sorted(set(kwargs) - set(MARKER_KEYS))
        if bad:
            raise JaxlogError(
                f"{nodeid}: @pytest.mark.jaxlog got unknown argument {bad[0]!r} (allowed: {', '.join(MARKER_KEYS)})"
            )
        s = self
        if "keep" in kwargs:
            s = replace(s, keep=parse_choice(kwargs["keep"], KEEP_CHOICES, what("keep")))
        if "profile" in kwargs:
            s = replace(s, profile=parse_profile(kwargs["profile"], what("profile")),
                        profile_source="@pytest.mark.jaxlog(profile=...)")
        if "on_violation" in kwargs:
            s = replace(
                s, on_violation=parse_choice(kwargs["on_violation"], MARKER_VIOLATION_CHOICES, what("on_violation"))
            )
        if "progress" in kwargs:
            s = replace(s, progress=parse_progress(kwargs["progress"], what("progress")))
        if "chunk" in kwargs:
            s = replace(s, chunk=parse_chunk(kwargs["chunk"], what("chunk")))
        if "devices" in kwargs:
            s = replace(s, devices=parse_devices(kwargs["devices"], what("devices")))
        if "processes" in kwargs:
            s = replace(s, processes=parse_processes(kwargs["processes"], what("processes")))
        if "timeout" in kwargs:
            if s.processes is None:
                raise JaxlogError(f"{what('timeout')}: a timeout is for tests run in several processes; "
                                  "add processes=N")
            s = replace(s, timeout=parse_timeout(kwargs["timeout"], what("timeout")))
        return s


def resolve_settings(config: pytest.Config, environ: Mapping[str, str] | None = None) -> Settings:
    """The session's Settings from options, environment and ini; a bad value -> JaxlogError naming its source."""
    src = {k: lookup(config, k, environ) for k in ("keep", "profile", "on_violation", "progress", "chunk")}
    return Settings(
        keep=parse_choice(src["keep"].value, KEEP_CHOICES, what("keep", src["keep"])),
        profile=parse_profile(src["profile"].value, what("profile", src["profile"])),
        on_violation=parse_choice(src["on_violation"].value, VIOLATION_CHOICES, what("on_violation", src["on_violation"])),
        progress=parse_progress(src["progress"].value, what("progress", src["progress"])),
        chunk=parse_chunk(src["chunk"].value, what("chunk", src["chunk"])),
        profile_source=src["profile"].label if src["profile"].origin != "env" else src["profile"].name,
    )


def marker_settings(item: pytest.Item, base: Settings) -> Settings:
    """Merge every ``jaxlog`` marker of the item, closest first; bad arguments -> JaxlogError naming the test."""
    merged: dict[str, Any] = {}
    for mark in item.iter_markers("jaxlog"):
        if mark.args:
            raise JaxlogError(
                f"{item.nodeid}: @pytest.mark.jaxlog takes keyword arguments only "
                f"({', '.join(MARKER_KEYS)}), got positional {mark.args!r}"
            )
        for k, v in mark.kwargs.items():
            merged.setdefault(k, v)
    return base.with_marker(merged, item.nodeid)
