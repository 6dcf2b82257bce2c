"""Lines on the daemon's stdout and stderr, each written whole.

The daemon's processes (supervisor, physics, device driver) share its stdout and stderr, and Python runs them
unbuffered where PYTHONUNBUFFERED is set. ``print`` then writes a line's text and its newline in two calls, and
another process's line can land between them: the physics process's "... limited to it" and the supervisor's
"suturesim: serving ..." once came out as one line, and a client waiting for the second never saw it (a CI run of
tests/test_devices.py, 2026-11-28). A line and its newline in one write of under PIPE_BUF bytes (4096 on Linux)
reach a pipe whole.
"""
from __future__ import annotations

import sys


def say(line: str, err: bool = False) -> None:
    """Write ``line`` and its newline to stdout (stderr with ``err``) in one call, and flush."""
    stream = sys.stderr if err else sys.stdout
    stream.write(line + "\n")
    stream.flush()
