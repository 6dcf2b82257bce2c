"""Validated reading of YAML configuration (after Klipper's config wrapper).

Every value is read through a Section, which checks its type and bounds where it is read and remembers it.
`finish()` then rejects any key nobody read, so a typo never silently becomes a default. Errors name the
file, the dotted key path and the reason: `scenario.yaml: thread.bending_stiffness: must be > 0, got -1`.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

import yaml

_REQUIRED = object()

#: Longest name a scene gives a grasp or a device, characters (printable): names are copied into every `force`
#: message (1 kHz per device) and every `state`, so their length is part of each tick's cost.
MAX_NAME_CHARS = 64


def is_name(value: object) -> bool:
    """A grasp's or device's name: a printable string of 1 to MAX_NAME_CHARS characters (the one rule for a
    scenario's grasps, a `grasp` request and a stylus sample)."""
    return isinstance(value, str) and 0 < len(value) <= MAX_NAME_CHARS and value.isprintable()


class ConfigError(ValueError):
    """A configuration problem, with the file, key path and reason in its message."""

    def __init__(self, file: str, key: str, reason: str):
        self.file, self.key, self.reason = file, key, reason
        where = f"{file}: {key}: " if key else f"{file}: "
        super().__init__(where + reason)

    def __reduce__(self):
        # pickled across processes (a scene built in the server's worker process) with its three parts
        return (ConfigError, (self.file, self.key, self.reason))


def load_yaml(path: str | Path) -> dict:
    """Read a YAML mapping; a missing file, a YAML syntax error or a non-mapping is a ConfigError."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(str(p), "", f"cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(str(p), "", f"not valid YAML{at}: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(str(p), "", f"must be a mapping of keys, got {type(data).__name__}")
    return data


def _number(value: Any) -> float | None:
    """A YAML number as float, or None. PyYAML (YAML 1.1) reads 3.0e9 (no sign in the exponent) as a string,
    so a string that is a number counts as one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _type_name(t: Any) -> str:
    return {float: "a number", int: "an integer", str: "a string", bool: "true or false",
            list: "a list", dict: "a mapping"}.get(t, getattr(t, "__name__", str(t)))


class Section:
    """A mapping read key by key. ``file`` names the file each key came from (``sources`` can override it
    per key, for merged preset + override sections)."""

    def __init__(self, data: dict, file: str, path: str = "", sources: dict[str, str] | None = None):
        if not isinstance(data, dict):
            raise ConfigError(file, path, f"must be a mapping, got {type(data).__name__}")
        self.data = data
        self.file = file
        self.path = path
        self.sources = sources or {}
        self.read: set[str] = set()

    # -- helpers -------------------------------------------------------------------------------------
    def key_path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def file_of(self, key: str) -> str:
        return self.sources.get(key, self.file)

    def error(self, key: str, reason: str) -> ConfigError:
        return ConfigError(self.file_of(key), self.key_path(key), reason)

    def has(self, key: str) -> bool:
        return key in self.data

    def keys(self) -> Iterable[str]:
        return self.data.keys()

    def _fetch(self, key: str, default: Any) -> tuple[bool, Any]:
        """(True, value) if ``key`` is given; (False, default) if it is absent or null; an error if it is
        absent and required. Marks the key as read."""
        self.read.add(key)
        if key not in self.data or self.data[key] is None:
            if default is _REQUIRED:
                raise self.error(key, "is required")
            return False, default
        return True, self.data[key]

    # -- typed getters -------------------------------------------------------------------------------
    def get(self, key: str, kind: type = float, default: Any = _REQUIRED, *, minval: float | None = None,
            maxval: float | None = None, above: float | None = None, below: float | None = None,
            choices: Iterable[Any] | None = None) -> Any:
        """Read ``key`` as ``kind`` (float, int, str, bool), checking bounds; ``default`` if absent."""
        present, value = self._fetch(key, default)
        if not present:
            return value
        value = self._convert(key, value, kind)
        self._check_bounds(key, value, minval, maxval, above, below)
        if choices is not None and value not in choices:
            raise self.error(key, f"must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value

    def _convert(self, key: str, value: Any, kind: type) -> Any:
        if kind is float:
            number = _number(value)
            if number is None:
                raise self.error(key, f"must be a number, got {value!r}")
            if not math.isfinite(number):
                raise self.error(key, f"must be finite, got {value!r}")
            return number
        if kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.error(key, f"must be an integer, got {value!r}")
            return value
        if kind is bool:
            if not isinstance(value, bool):
                raise self.error(key, f"must be true or false, got {value!r}")
            return value
        if kind is str:
            if not isinstance(value, str):
                raise self.error(key, f"must be a string, got {value!r}")
            return value
        raise TypeError(kind)

    def _check_bounds(self, key, value, minval, maxval, above, below) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return
        if minval is not None and value < minval:
            raise self.error(key, f"must be >= {minval}, got {value}")
        if maxval is not None and value > maxval:
            raise self.error(key, f"must be <= {maxval}, got {value}")
        if above is not None and value <= above:
            raise self.error(key, f"must be > {above}, got {value}")
        if below is not None and value >= below:
            raise self.error(key, f"must be < {below}, got {value}")

    def vector(self, key: str, length: int = 3, default: Any = _REQUIRED, *, nonzero: bool = False) -> list:
        """Read a list of ``length`` finite numbers."""
        present, value = self._fetch(key, default)
        if not present:
            return value
        if not isinstance(value, (list, tuple)) or len(value) != length:
            raise self.error(key, f"must be a list of {length} numbers, got {value!r}")
        out = []
        for v in value:
            number = _number(v)
            if number is None or not math.isfinite(number):
                raise self.error(key, f"must be a list of {length} finite numbers, got {value!r}")
            out.append(number)
        if nonzero and all(v == 0.0 for v in out):
            raise self.error(key, "must not be the zero vector")
        return out

    def raw(self, key: str, default: Any = _REQUIRED) -> Any:
        """The raw value (the caller validates it and reports errors through ``error``); null = absent."""
        return self._fetch(key, default)[1]

    def section(self, key: str, default: Any = _REQUIRED) -> "Section | None":
        """A nested mapping as a Section (None if absent and default is None)."""
        present, value = self._fetch(key, default)
        if not present:
            return Section({}, self.file_of(key), self.key_path(key)) if value == {} else value
        return Section(value, self.file_of(key), self.key_path(key))

    def sections(self, key: str) -> list["Section"]:
        """A list of mappings, each as a Section (empty if absent)."""
        self.read.add(key)
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(key, f"must be a list, got {type(value).__name__}")
        return [Section(v, self.file_of(key), f"{self.key_path(key)}[{i}]") for i, v in enumerate(value)]

    def finish(self) -> None:
        """Reject every key that nobody read."""
        for key in self.data:
            if key not in self.read:
                raise ConfigError(self.file_of(key), self.key_path(key), "unknown key")
