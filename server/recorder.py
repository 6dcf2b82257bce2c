"""A recorder process: subscribes to every topic of a running server and writes each message, unchanged, to an
MCAP file (server/recording.py). Its receive queue is unbounded so that it loses nothing while the disk is slow;
it reports `seq` gaps of the `force` topic (one message per device per tick) when it stops."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterator

import msgpack
import zmq

from .recording import McapRecorder

if TYPE_CHECKING:   # only the annotation: the recorder needs no more than the keys' apply()
    from .security import ClientCurve


def receive_until(sub: zmq.Socket, stop, poll_ms: int = 100) -> Iterator[tuple[bytes, bytes]]:
    """(topic, payload) of every two-frame message on ``sub`` until ``stop`` (an Event) is set, draining the
    queue between checks; messages of any other shape are skipped."""
    while not stop.is_set():
        if not sub.poll(poll_ms):
            continue
        while True:
            try:
                topic, payload = sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            except ValueError:  # not two frames: not ours
                continue
            yield topic, payload


class RecorderFailed(RuntimeError):
    """The recording could not be written on (a full disk, a file too large); the file holds what was written
    before, readable (server/recording.py)."""


def record(endpoint: str, path: str, stop, ready=None, metadata: dict | None = None,
           topics: list[bytes] | None = None, counts=None, exclusive: bool = False,
           curve: ClientCurve | None = None) -> dict:
    """Record ``endpoint`` (a PUB address) to ``path`` until ``stop`` (anything with ``is_set()``) is set:
    every topic, or only ``topics``. ``counts``: an optional shared array updated with [messages written, force
    seq gaps] (lock-free: a killed recorder cannot leave a reader waiting). ``exclusive``: create ``path``,
    never overwrite (McapRecorder). ``curve``: the client keys to subscribe with, if the PUB socket uses CURVE
    (without them such a publisher sends nothing, and says nothing). Raises OSError if the file cannot be made
    (before ``ready`` is set), and RecorderFailed if writing fails later.
    Returns {"messages", "gaps"}: the messages written and the force `seq` numbers found missing."""
    rec = McapRecorder(path, metadata=metadata, exclusive=exclusive)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)          # unbounded: lossless while we keep up on average
    sub.setsockopt(zmq.LINGER, 0)
    for topic in topics or [b""]:
        sub.setsockopt(zmq.SUBSCRIBE, topic)
    if curve is not None:
        curve.apply(sub)
    sub.connect(endpoint)
    last_seq: dict[str, int] = {}
    gaps = 0
    count = 0
    if ready is not None:
        ready.set()
    try:
        for topic, payload in receive_until(sub, stop):
            now = time.time_ns()
            publish_ns = now
            try:
                msg = msgpack.unpackb(payload, raw=False)
                publish_ns = int(float(msg["t"]) * 1e9)
                if topic == b"force":
                    dev = str(msg.get("device"))
                    seq = int(msg["seq"])
                    prev = last_seq.get(dev)
                    if prev is not None and seq > prev + 1:
                        gaps += seq - prev - 1
                    last_seq[dev] = seq
            except Exception:  # noqa: BLE001 - record it anyway, exactly as published
                pass
            try:
                rec.write(topic, payload, now, publish_ns)
            except OSError as exc:
                raise RecorderFailed(f"{path}: {exc.strerror or exc} after {count} messages") from None
            count += 1
            if counts is not None:
                counts[0] = count
                counts[1] = gaps
    finally:
        try:
            rec.close()
        except OSError:   # the summary could not be written: the file stays readable without it
            pass
        sub.close(0)
        ctx.term()
    return {"messages": count, "gaps": gaps}


class _Report:
    """The recorder's word to its parent: an Event set when recording (`suturesim record`), or the send end of
    a Pipe (the server's supervisor) that also carries why it could not start or stopped writing."""

    def __init__(self, ready):
        self.ready = ready

    def set(self) -> None:
        if hasattr(self.ready, "send"):
            self.ready.send(("ready", ""))
        else:
            self.ready.set()

    def say(self, what: str, reason: str) -> None:
        if hasattr(self.ready, "send"):
            try:
                self.ready.send((what, reason))
            except OSError:
                pass


def recorder_main(endpoint: str, path: str, stop, ready, metadata: dict | None = None,
                  topics: list[bytes] | None = None, counts=None, exclusive: bool = False,
                  curve: ClientCurve | None = None) -> None:
    """Entry point of the recorder process (multiprocessing, spawn). ``stop``: a shared stop flag
    (haptics/process.py); ``ready``: an Event, or a Connection told ("ready", ""), ("error", why it could not
    start) or ("failed", why it stopped writing); ``counts``, ``exclusive``, ``curve``: see record()."""
    import signal
    import sys

    from ..haptics.process import StopRequest, dump_stacks_on_signal

    # started through haptics/process.py child_main, which armed die-with-parent: a killed server (or `suturesim
    # record`) stops its recorder too, file closed
    dump_stacks_on_signal()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # a file past the size limit (RLIMIT_FSIZE) is a write error to report, not a signal that kills the recorder
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    stop = StopRequest(stop)
    report = _Report(ready)
    try:
        result = record(endpoint, path, stop, report, metadata, topics, counts, exclusive, curve)
    except FileExistsError:
        report.say("error", f"{path} exists; recordings are never overwritten")
        sys.exit(2)
    except OSError as exc:
        report.say("error", f"cannot create {path}: {exc.strerror or exc.__class__.__name__}")
        sys.exit(2)
    except RecorderFailed as exc:
        report.say("failed", str(exc))
        print(f"suturesim record: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    note = f"{result['gaps']} force messages missing" if result["gaps"] else "no force message missing"
    print(f"suturesim record: {result['messages']} messages to {path}; {note}", flush=True)
