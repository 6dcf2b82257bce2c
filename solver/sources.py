"""Where a scenario's referenced files may come from: its thread preset (`thread.preset`) and its points file
(`shape.file`), resolved against the scenario's directory and, for a scenario built from network input,
confined by a FilePolicy.

Trusted input (the operator's command line and config files, the shipped scenarios) has no policy: a reference
is any path, relative ones against the referring scenario's directory, and errors say what the OS said. A
scenario that arrived over the network (a control `load` or `set`, server/control.py) gets a policy: a file is
read only if its real path (symlinks followed) lies under one of the policy's roots or is one of its files, it is
opened without following a final symlink and must be a regular file of at most MAX_READ_BYTES, and no error
quotes the file's content or the OS's error text. A reference outside the policy gets the same refusal whether
or not it exists, so a client learns nothing about the filesystem beyond the roots.
"""
from __future__ import annotations

import io
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

from .config import ConfigError, Section, load_yaml

# configs/ sits beside solver/ both in the source tree and installed (as suturesim.configs)
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"

MAX_READ_BYTES = 64 << 20   # bytes: an untrusted read's cap (a 100 000-segment points file is ~6 MB)

# the refusals of a reference outside a policy: the same text whether or not the path exists
PRESET_REFUSED = "not a shipped preset name or a file under the scenarios directory"
FILE_REFUSED = "not a file under the scenarios directory"
SCENARIO_REFUSED = "not a shipped scenario name or a file under the scenarios directory"
POINTS_UNREADABLE = "cannot read the points: not rows of x y z numbers"
PRESET_UNREADABLE = "cannot read the preset: not a YAML mapping of preset keys"


def _real(path: str | os.PathLike) -> Path:
    """``path`` made absolute with every symlink followed (whether or not it exists)."""
    return Path(os.path.realpath(path))


@dataclass(frozen=True)
class FilePolicy:
    """Where a scenario built from network input may read files: under one of ``roots`` (directories) or one
    of ``files`` exactly. Both hold real paths (made so here); the shipped configs directory is always a root.
    Picklable: a scene is built in the server's worker process."""
    roots: tuple[Path, ...] = ()
    files: frozenset[Path] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        roots = [_real(r) for r in (CONFIG_DIR, *self.roots)]
        object.__setattr__(self, "roots", tuple(dict.fromkeys(roots)))
        object.__setattr__(self, "files", frozenset(_real(f) for f in self.files))

    def allows(self, path: str | os.PathLike) -> bool:
        """Whether ``path`` (resolved here) may be read: one of the files, or under a root."""
        real = _real(path)
        return real in self.files or any(real.is_relative_to(root) for root in self.roots)


class ScenarioFiles:
    """The files one scenario build reads: references resolved against ``base_dir`` (None: the working
    directory), confined by ``policy`` (None: trusted), and the real path of each file read kept in ``read``."""

    def __init__(self, base_dir: str | os.PathLike | None = None, policy: FilePolicy | None = None):
        self.base_dir = Path(base_dir) if base_dir is not None else Path(".")
        self.policy = policy
        self.read: list[str] = []

    def locate(self, sec: Section, key: str, ref: str, refusal: str) -> Path:
        """The path ``ref`` names (relative: against base_dir); under a policy its real path, refused with
        ``refusal`` (as ``sec``'s error at ``key``) unless the policy allows it."""
        p = Path(ref)
        if not p.is_absolute():
            p = self.base_dir / p
        if self.policy is None:
            return p
        if "\0" in ref or not self.policy.allows(p):
            raise sec.error(key, refusal)
        return _real(p)

    def _note(self, path: Path) -> None:
        real = str(_real(path))
        if real not in self.read:
            self.read.append(real)

    def preset(self, sec: Section, key: str, path: Path, missing: str) -> dict:
        """A preset file's mapping (``path`` from locate); ``missing`` is the reason for a file that is not."""
        if self.policy is None:
            if not path.is_file():
                raise sec.error(key, missing)
            data = load_yaml(path)
        else:
            data = confined_mapping(path, self.policy, missing, PRESET_UNREADABLE, lambda r: sec.error(key, r))
        self._note(path)
        return data

    def points(self, sec: Section, key: str, path: Path, missing: str) -> np.ndarray:
        """A points file's rows (x y z in m, '#' starting a comment) as a 2-D float array (the caller checks
        its shape); ``path`` from locate, ``missing`` the reason for a file that is not there."""
        if self.policy is None:
            try:
                arr = np.loadtxt(path, dtype=np.float64, comments="#", ndmin=2)
            except (OSError, ValueError) as e:
                raise sec.error(key, f"cannot read the points from {path}: {e}") from None
        else:
            text = confined_text(path, self.policy, missing, POINTS_UNREADABLE, lambda r: sec.error(key, r))
            try:
                arr = np.loadtxt(io.StringIO(text), dtype=np.float64, comments="#", ndmin=2)
            except ValueError:
                raise sec.error(key, POINTS_UNREADABLE) from None
        self._note(path)
        return arr


def confined_text(path: Path, policy: FilePolicy, missing: str, unreadable: str,
                  fail: Callable[[str], ConfigError]) -> str:
    """The UTF-8 text of ``path`` (a real path the policy allows), read through a descriptor that is checked
    again once open: its real path still allowed (no directory on the way was swapped for a symlink since the
    path was checked), a regular file (not a FIFO or device that blocks or never ends), within MAX_READ_BYTES.
    A problem is ``fail(reason)``: ``missing`` for no such file, ``unreadable`` for text that is not UTF-8,
    else a reason that quotes neither the file nor the OS."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise fail(missing) from None
    except OSError:
        raise fail("cannot be opened") from None
    try:
        try:
            opened = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            opened = str(path)   # no /proc: the check before opening stands alone
        if not policy.allows(opened):
            raise fail(FILE_REFUSED)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise fail("not a regular file")
        chunks, size = [], 0
        while size <= MAX_READ_BYTES:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_READ_BYTES:
            raise fail(f"larger than {MAX_READ_BYTES >> 20} MiB")
    except OSError:
        raise fail("cannot be read") from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise fail(unreadable) from None


def confined_mapping(path: Path, policy: FilePolicy, missing: str, unreadable: str,
                     fail: Callable[[str], ConfigError]) -> dict:
    """The YAML mapping in ``path``, read as confined_text; any YAML problem or a non-mapping is
    ``fail(unreadable)`` (the parser's message would quote the file)."""
    text = confined_text(path, policy, missing, unreadable, fail)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        raise fail(unreadable) from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise fail(unreadable)
    return data


def confined_scenario_path(ref: str, scenarios_dir: str | os.PathLike, label: str = "<load request>") -> Path:
    """The real path of scenario file ``ref`` named by a network client: a .yaml/.yml file name relative to
    ``scenarios_dir`` that stays inside it once resolved (symlinks followed). Refusals are ConfigErrors at
    ``label``, key `scenario`; one outside the directory reads the same whether or not the path exists."""
    def refuse(reason: str) -> ConfigError:
        return ConfigError(label, "scenario", reason)

    p = Path(ref)
    if "\0" in ref or not ref.strip():
        raise refuse(SCENARIO_REFUSED)
    if p.is_absolute():
        raise refuse("an absolute path is not accepted: give a shipped scenario name or a file name relative to "
                     "the scenarios directory (files.scenarios_dir)")
    if ".." in p.parts:
        raise refuse("'..' is not accepted: give a file name relative to the scenarios directory")
    if p.suffix not in (".yaml", ".yml"):
        raise refuse(SCENARIO_REFUSED + " (a file name ends in .yaml or .yml)")
    root = _real(scenarios_dir)
    real = _real(root / p)
    if not real.is_relative_to(root):
        raise refuse(SCENARIO_REFUSED)
    if not real.is_file():
        raise refuse(f"no such file in the scenarios directory: {ref}")
    return real
