"""The process that builds scenes for `load` and `set` off the tick (server/control.py), and the one thread in
the physics process that talks to it.

A process and a pipe of its own, with no lock shared between the two sides. A ``multiprocessing.Pool`` worker
that is idle holds its task queue's read lock while it waits; killed then (the kernel's OOM killer), it leaves
that lock taken for good, and ``Pool.terminate()`` waits for it forever: the loop replacing a dead worker
would hang there (tests/test_liveness.py). Here the builder is killed and its pipe closed; nothing waits on it.

One request at a time (the control handler takes no new request while one is out). The thread sends the request
and receives the answer, so that neither a large request nor the unpickling of a built scene runs in the loop's
thread; the loop only polls :meth:`SceneBuilder.done`.
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import threading
from typing import Any, Callable


def _ordinary_process(loop_cpu: int) -> None:
    """The builder starts before the loop takes SCHED_FIFO and its CPU, so it inherits neither; keep it off the
    loop's CPU (``loop_cpu``, -1: the last CPU, where set_realtime pins the loop by default) when there is more
    than one."""
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except (OSError, AttributeError):
        pass
    try:
        cpus = set(os.sched_getaffinity(0))
        if len(cpus) > 1:
            cpus.discard(loop_cpu if loop_cpu >= 0 else max(cpus))
            os.sched_setaffinity(0, cpus)
    except (OSError, AttributeError, ValueError):
        pass


def builder_main(conn: Any, loop_cpu: int) -> None:
    """The builder process (through haptics/process.py child_main, so that it dies with the physics process):
    answer each ``(func, args)`` with ``("ok", func(*args))`` or ``("error", exception)`` until the pipe
    closes."""
    _ordinary_process(loop_cpu)
    while True:
        try:
            func, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            answer: tuple = ("ok", func(*args))
        except Exception as exc:  # noqa: BLE001 - every failure goes back as the request's answer
            answer = ("error", exc)
        try:
            conn.send(answer)
        except (EOFError, OSError):
            return
        except Exception as exc:  # noqa: BLE001 - an answer that does not pickle
            conn.send(("error", RuntimeError(f"the built scene could not be sent back: "
                                             f"{exc.__class__.__name__}: {exc}")))


class SceneBuilder:
    """One builder process and its thread. ``submit`` one request, poll ``done``, then take ``result`` (which
    raises the builder's exception) or read ``died`` (why it can never answer). A builder that died or is stuck
    is ``kill``ed and replaced by a new one."""

    def __init__(self, loop_cpu: int):
        ctx = multiprocessing.get_context("spawn")
        from ..haptics.process import child_main
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=child_main, name="suturesim-build", daemon=True,
                                   args=("suturesim.server.builder", "builder_main", child, loop_cpu))
        self.process.start()   # at once: the first `load` does not wait for its imports
        child.close()          # the builder's death then ends our receive (EOFError)
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._answer: tuple | None = None
        self._died: str | None = None
        self._thread = threading.Thread(target=self._talk, name="scene-builder", daemon=True)
        self._thread.start()

    def _talk(self) -> None:
        try:
            while True:
                request = self._requests.get()
                if request is None:
                    return
                try:
                    self._conn.send(request)
                    answer = self._conn.recv()
                except (EOFError, OSError):
                    self.process.join()
                    self._died = f"the scene builder process died (exit code {self.process.exitcode})"
                    return
                except Exception as exc:  # noqa: BLE001 - a request or answer that does not pickle
                    answer = ("error", RuntimeError(f"{exc.__class__.__name__}: {exc}"))
                self._answer = answer
        finally:   # this thread alone uses the pipe, so it alone closes it; the builder then exits, and is reaped
            self._conn.close()
            self.process.join()

    def submit(self, func: Callable, args: tuple) -> None:
        """Start building ``func(*args)`` (returns at once)."""
        self._answer = None
        self._requests.put((func, args))

    def done(self) -> bool:
        return self._answer is not None

    def result(self) -> Any:
        """The built scene, or the builder's exception raised here."""
        kind, value = self._answer
        if kind == "error":
            raise value
        return value

    def died(self) -> str | None:
        """Why the builder can never answer (it died while a request was out), or None."""
        return self._died

    def kill(self) -> None:
        """Stop the builder at once, not waited for (it may be importing, or stuck in a build): killed here,
        reaped by its thread."""
        self._requests.put(None)
        self.process.kill()
