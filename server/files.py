"""The recordings directory a control client writes into (`record_start`, docs/PROTOCOL.md Sec. 4.4).

A client names a recording by a plain file name, never a path: `NAME.mcap`, NAME starting with a letter or digit
and made of letters, digits, '.', '_' and '-' (128 characters at most, the suffix included). The suffix is
required, not appended, so the name a client sends is the file's name. The directory (files.recordings_dir) is
made on first use with mode 0700 and refused if it is a symlink, not the server user's own, or writable by group
or others; a recording is created exclusively through a descriptor of the directory (no symlink followed at
either step), so an existing file, or a symlink planted under the name, is never overwritten or followed.
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

RECORDING_SUFFIX = ".mcap"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class FilesError(ValueError):
    """A recording name or the recordings directory refused; the message is the reason (for an error reply)."""


def recording_name_error(name: object) -> str | None:
    """Why ``name`` is not a recording file name (a plain NAME.mcap, docstring above), or None if it is one."""
    if not isinstance(name, str):
        return f"a recording name is a string, got {type(name).__name__}"
    if not _NAME.fullmatch(name):
        return ("a recording name is a plain file name (letters, digits, '.', '_', '-', starting with a letter or "
                "digit, at most 128 characters), not a path")
    if not name.endswith(RECORDING_SUFFIX) or name == RECORDING_SUFFIX:
        return f"a recording name ends in {RECORDING_SUFFIX}"
    return None


def recordings_dir_ready(directory: str | os.PathLike) -> Path:
    """``directory`` made if missing (its parents with the default mode, itself with mode 0700) and checked: a
    real directory (not a symlink), owned by this user, not writable by group or others. Returns it; FilesError
    with the reason if it is refused or cannot be made."""
    d = Path(directory)
    if not d.is_absolute():
        raise FilesError(f"the recordings directory {d} is not an absolute path")
    try:
        os.makedirs(d.parent, exist_ok=True)
        try:
            os.mkdir(d, 0o700)
            os.chmod(d, 0o700, follow_symlinks=False)   # exactly 0700, whatever the umask took away
        except FileExistsError:
            pass
        st = os.lstat(d)
    except OSError as exc:
        raise FilesError(f"cannot make the recordings directory {d}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise FilesError(f"the recordings directory {d} is a symbolic link; give the real directory")
    if not stat.S_ISDIR(st.st_mode):
        raise FilesError(f"the recordings directory {d} is not a directory")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise FilesError(f"the recordings directory {d} belongs to another user (uid {st.st_uid})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise FilesError(f"the recordings directory {d} is writable by group or others (mode "
                         f"{stat.S_IMODE(st.st_mode):04o}); make it 0700 (chmod go-w)")
    return d


def open_new_recording(directory: str | os.PathLike, name: str) -> tuple[int, Path]:
    """Create recording ``name`` in ``directory`` (checked by recordings_dir_ready first) and return its
    write-only descriptor (the caller closes it) and path. Created with mode 0640, exclusively, relative to a
    no-follow descriptor of the directory; FilesError if the name is bad, the file exists (a symlink under the
    name counts) or it cannot be created."""
    reason = recording_name_error(name)
    if reason:
        raise FilesError(reason)
    d = Path(directory)
    try:
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise FilesError(f"cannot open the recordings directory {d}: {exc.strerror or exc} (a symlink is not "
                         "accepted)") from None
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640, dir_fd=dfd)
    except FileExistsError:
        raise FilesError(f"{name} exists; recordings are never overwritten") from None
    except OSError as exc:
        raise FilesError(f"cannot create {name} in the recordings directory: {exc.strerror or exc}") from None
    finally:
        os.close(dfd)
    return fd, d / name


def list_recordings(directory: str | os.PathLike) -> list[dict]:
    """The recordings in ``directory``, by name: ``{"name", "bytes", "mtime"}`` (mtime: s since the epoch) of
    each regular *.mcap file; symlinks are neither followed nor listed. Empty if the directory does not exist."""
    out = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for e in entries:
        if not e.name.endswith(RECORDING_SUFFIX) or not e.is_file(follow_symlinks=False):
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue   # removed since the listing
        out.append({"name": e.name, "bytes": st.st_size, "mtime": st.st_mtime})
    return sorted(out, key=lambda r: r["name"])
