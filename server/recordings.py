"""The recordings `suturesim serve` makes: the operator's `--record F.mcap` from start-up, and those a client asks
for with `record_start` (a name inside the configured recordings directory, created new: server/files.py).

The supervisor owns them. A :class:`RecorderProcess` is one recorder process (server/recorder.py) with its file;
a :class:`RecordingDesk` is a thread of the supervisor that starts and stops them on the physics process's
requests and answers each, so the supervisor's own loop (liveness, the device driver) never waits on a recorder
and the physics loop never waits on the supervisor: it has at most one request out, and the desk's thread reads
the pipe at once.
"""
from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Callable

from .console import say

RECORDER_READY_S = 10.0  # a recorder process starts (imports, connects, creates its file) within this
RECORDER_IDLE_S = 5.0    # a stopping recorder that writes nothing for this long is killed ...
RECORDER_STOP_S = 60.0   # ... and one still writing its queue after this long too


class RecorderProcess:
    """One recorder process writing the PUB stream at ``endpoint`` to one file."""

    def __init__(self, ctx, endpoint: str, curve=None):
        """``ctx``: a multiprocessing (spawn) context; ``curve``: the client keys the recorder connects with
        when the PUB socket needs CURVE (server/security.py ClientCurve), or None."""
        self.ctx, self.endpoint, self.curve = ctx, endpoint, curve
        self.proc = None
        self.path = ""
        self.conn = None
        self.stop_flag = None
        # messages written, force seq gaps; read without a lock, which a killed recorder could leave held
        self.counts = None
        self.failure: str | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None

    def start(self, path: str, metadata: dict, exclusive: bool) -> str | None:
        """Start recording to ``path`` (created new if ``exclusive``); None once it records, else the reason it
        could not start (no process is left)."""
        from ..haptics.process import child_main, shared_flag

        self.stop_flag = shared_flag(self.ctx)
        self.counts = self.ctx.Array("q", 2, lock=False)
        self.conn, child = self.ctx.Pipe(duplex=False)
        self.proc = self.ctx.Process(target=child_main, name="suturesim-recorder",
                                     args=("suturesim.server.recorder", "recorder_main", self.endpoint, path,
                                           self.stop_flag, child, metadata, None, self.counts, exclusive, self.curve))
        self.proc.start()
        child.close()
        self.path, self.failure = path, None
        what, why = "error", f"the recorder did not start within {RECORDER_READY_S:g} s"
        if self.conn.poll(RECORDER_READY_S):
            try:
                what, why = self.conn.recv()
            except (EOFError, OSError):
                what, why = "error", f"the recorder died at start (exit code {self.proc.exitcode})"
        if what != "ready":
            self.proc.kill()
            self.proc.join(2.0)
            self.proc = None
            return why
        time.sleep(0.2)  # ZeroMQ's slow joiner: let the subscription reach the publisher
        return None

    def poll(self) -> str | None:
        """The reason the recorder stopped writing, once, if it failed or died while it should be recording."""
        if self.proc is None or self.failure is not None:
            return None
        why = None
        if self.conn.poll(0):
            try:
                what, why = self.conn.recv()
                why = why if what == "failed" else None
            except (EOFError, OSError):
                pass
        if why is None and not self.proc.is_alive():
            why = f"{self.path}: the recorder process died (exit code {self.proc.exitcode}) after " \
                  f"{self.counts[0]} messages"
        if why is not None:
            self.failure = why
        return why

    def stop(self) -> int:
        """Stop the recorder once it has written what it has queued (it loses nothing), for as long as it keeps
        writing (RECORDER_IDLE_S, at most RECORDER_STOP_S); a recorder killed past that is reported. Returns the
        messages written."""
        if self.proc is None:
            return 0
        self.stop_flag.value = 1
        t0 = last_change = time.monotonic()
        written = self.counts[0]
        while self.proc.is_alive():
            self.proc.join(0.1)
            now = time.monotonic()
            if self.counts[0] != written:
                written, last_change = self.counts[0], now
            if now - last_change > RECORDER_IDLE_S or now - t0 > RECORDER_STOP_S:
                break
        waited = time.monotonic() - t0
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(1.0)
            say(f"suturesim: the recorder did not finish within {waited:.1f} s of the stop and was killed: "
                f"{self.path} has {written} messages and no summary (readers that need one fail)", err=True)
        elif waited > 1.0:
            say(f"suturesim: the recorder took {waited:.1f} s after the stop to write what it had queued", err=True)
        self.proc = None
        self.conn.close()
        return int(self.counts[0])


class RecordingDesk:
    """The supervisor's thread for recordings asked for by clients (through the physics process).

    ``requests`` are ("record_start", name) and ("record_stop", None); each gets exactly one answer through
    ``answer``: ("record", True, full path) or ("record", False, reason). A recorder that fails while recording
    is reported through ``answer`` as ("record_failed", reason), by :meth:`check` (called from the supervisor's
    loop).
    """

    def __init__(self, recorder: RecorderProcess, directory: str, metadata: Callable[[], dict],
                 answer: Callable[[tuple], None], out=print):
        """``directory``: the recordings directory; ``metadata()``: the running scene's MCAP metadata."""
        self.recorder = recorder
        self.directory = directory
        self.metadata = metadata
        self.answer = answer
        self.out = out
        self.requests: queue.Queue = queue.Queue()
        self.lock = threading.Lock()   # the recorder is started and stopped here and checked by the supervisor
        self.thread = threading.Thread(target=self._run, name="recording-desk", daemon=True)
        self.thread.start()

    def start_operator_recording(self, path: str, metadata: dict) -> None:
        """The operator's --record: any path, overwritten (the operator's command line is trusted)."""
        with self.lock:
            why = self.recorder.start(path, metadata, exclusive=False)
        if why is not None:
            say(f"suturesim: cannot record to {path}: {why}", err=True)
        else:
            self.out(f"suturesim: recording to {path}")

    def check(self) -> None:
        with self.lock:
            why = self.recorder.poll()
        if why is not None:
            say(f"suturesim: recording failed: {why}", err=True)
            self.answer(("record_failed", why))

    def close(self) -> None:
        self.requests.put(None)
        self.thread.join(RECORDER_STOP_S + 5.0)
        with self.lock:
            self.recorder.stop()

    def _run(self) -> None:
        while True:
            item = self.requests.get()
            if item is None:
                return
            what, arg = item
            try:
                reply = self._start(arg) if what == "record_start" else self._stop()
            except Exception as exc:  # noqa: BLE001 - a request must be answered, and the server stay up
                reply = (False, f"internal error: {exc.__class__.__name__}: {exc}")
            self.answer(("record", *reply))

    def _start(self, name: str) -> tuple[bool, str]:
        from .files import recording_name_error, recordings_dir_ready

        reason = recording_name_error(name)
        if reason is not None:
            return False, reason
        try:
            directory = recordings_dir_ready(self.directory)
        except (OSError, ValueError) as exc:
            return False, f"the recordings directory {self.directory} cannot be used: {exc}"
        path = str(Path(directory) / name)
        try:
            meta = self.metadata()
        except Exception as exc:  # noqa: BLE001 - a scene that cannot be described is refused, not a crash
            return False, f"cannot describe the running scene for the recording ({exc.__class__.__name__})"
        with self.lock:
            self.recorder.stop()
            why = self.recorder.start(path, meta, exclusive=True)
        if why is not None:
            return False, why
        self.out(f"suturesim: recording to {path}")
        return True, path

    def _stop(self) -> tuple[bool, str]:
        with self.lock:
            path = self.recorder.path if self.recorder.running else ""
            count = self.recorder.stop()
        if path:
            self.out(f"suturesim: recorded {count} messages to {path}")
        return True, path
