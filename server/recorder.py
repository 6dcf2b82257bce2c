"""A recorder process: subscribes to every topic of a running server and writes each message, unchanged, to an
MCAP file (server/recording.py). Its receive queue is unbounded so that it loses nothing while the disk is slow;
it reports `seq` gaps of the `force` topic (one message per device per tick) when it stops."""
from __future__ import annotations

import time
from typing import Iterator

import msgpack
import zmq

from .recording import McapRecorder


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


def record(endpoint: str, path: str, stop, ready=None, metadata: dict | None = None,
           topics: list[bytes] | None = None, counts=None) -> dict:
    """Record ``endpoint`` (a PUB address) to ``path`` until ``stop`` (anything with ``is_set()``) is set:
    every topic, or only ``topics``. ``counts``: an optional shared array updated with [messages written, force
    seq gaps] (lock-free: a killed recorder cannot leave a reader waiting).
    Returns {"messages", "gaps"}: the messages written and the force `seq` numbers found missing."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)          # unbounded: lossless while we keep up on average
    sub.setsockopt(zmq.LINGER, 0)
    for topic in topics or [b""]:
        sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.connect(endpoint)
    last_seq: dict[str, int] = {}
    gaps = 0
    count = 0
    rec = McapRecorder(path, metadata=metadata)
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
            rec.write(topic, payload, now, publish_ns)
            count += 1
            if counts is not None:
                counts[0] = count
                counts[1] = gaps
    finally:
        rec.close()
        sub.close(0)
        ctx.term()
    return {"messages": count, "gaps": gaps}


def recorder_main(endpoint: str, path: str, stop, ready, metadata: dict | None = None,
                  topics: list[bytes] | None = None, counts=None) -> None:
    """Entry point of the recorder process (multiprocessing, spawn). ``stop``: a shared stop flag
    (haptics/process.py); ``counts``: see record()."""
    import signal

    from ..haptics.process import StopRequest, die_with_parent, dump_stacks_on_signal

    die_with_parent()   # a killed server (or `suturesim record`) stops its recorder too, file closed
    dump_stacks_on_signal()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop = StopRequest(stop)

    result = record(endpoint, path, stop, ready, metadata, topics, counts)
    note = f"{result['gaps']} force messages missing" if result["gaps"] else "no force message missing"
    print(f"suturesim record: {result['messages']} messages to {path}; {note}", flush=True)
