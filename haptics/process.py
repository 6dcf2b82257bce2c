"""How each of the server's processes (supervisor, physics, recorder, device driver) stops: on a signal, on its
parent's death, or on a shared stop flag set by the parent; and how it tells where it is stuck.

It lives in haptics, the lowest package the server and the driver process both import (tests/test_layout.py).
"""
from __future__ import annotations

import ctypes
import faulthandler
import signal
import sys
import time
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15          # prctl: this thread's name, 15 bytes and a NUL (the process's, for its main thread)
DUMP_SIGNAL = signal.SIGUSR1   # `kill -USR1 <pid>`: every thread's Python stack on stderr; the process runs on


def die_with_parent() -> None:
    """Ask Linux to SIGTERM us when the supervisor dies (a no-op where prctl does not exist)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def name_process(name: str) -> None:
    """Give this process ``name`` (its first 15 bytes) as Linux shows it (``/proc/PID/comm``, top, ps -o comm):
    which of the server's processes is which (a no-op where prctl does not exist)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def dump_stacks_on_signal() -> None:
    """Print every thread's Python stack to stderr on DUMP_SIGNAL (faulthandler: safe in a signal, no lock
    taken), so that a process that does not stop can be asked where it is."""
    try:
        faulthandler.register(DUMP_SIGNAL, file=sys.stderr, all_threads=True, chain=False)
    except (AttributeError, ValueError, OSError, RuntimeError):  # no such signal, or no usable stderr
        pass


def shared_flag(ctx: Any) -> Any:
    """A stop flag shared with child processes (``ctx``: a multiprocessing context; pass it at the child's
    start): one byte of shared memory, written and read without a lock. A multiprocessing Event takes a lock
    that every process shares, and a process killed while holding it (the supervisor kills a physics process
    that does not stop; the kernel's OOM killer kills anything) would leave every other one stuck on it."""
    return ctx.RawValue("b", 0)


class StopRequest:
    """A stop asked for by a signal (``signals``) or through ``flag`` (a shared_flag, or None), read with
    ``is_set()`` / ``wait()``.

    The signal handler only sets a plain attribute: it runs in the main thread between two bytecodes, and
    whatever it calls must not wait on anything that thread may hold (this code once set a multiprocessing
    Event there, whose lock the interrupted thread could be holding inside ``is_set()``). The flag is set
    afterwards, by ``is_set()``, so that the processes reading it (the physics loop reads the supervisor's) stop
    too.
    """

    def __init__(self, flag: Any = None, signals: tuple[int, ...] = (signal.SIGTERM,)):
        self.flag = flag
        self.signalled = False
        self._previous = {s: signal.signal(s, self._on_signal) for s in signals}

    def _on_signal(self, signum, frame) -> None:
        self.signalled = True

    def set(self) -> None:
        """Ask for the stop here and in every process reading the flag."""
        self.signalled = True
        if self.flag is not None:
            self.flag.value = 1

    def is_set(self) -> bool:
        if self.signalled:
            if self.flag is not None and not self.flag.value:
                self.flag.value = 1
            return True
        return self.flag is not None and bool(self.flag.value)

    def wait(self, timeout: float) -> bool:
        """Sleep ``timeout`` s unless the stop is already asked for; True once it is."""
        if not self.is_set():
            time.sleep(timeout)
        return self.is_set()

    def restore(self) -> None:
        """Put back the signal handlers that were there before."""
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def child_main(module: str, function: str, *args: Any) -> None:
    """A spawned child's entry point that arms :func:`die_with_parent` before anything else is imported: the
    real entry point ``module.function(*args)`` imports numba and the solver (seconds), and a supervisor killed
    meanwhile must not leave an orphan behind. This module imports the standard library only."""
    die_with_parent()
    import importlib
    import multiprocessing

    name_process(multiprocessing.current_process().name)

    getattr(importlib.import_module(module), function)(*args)
