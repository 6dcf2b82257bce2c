"""`suturesim record --out F.mcap [--connect EP] [--control EP] [--topics ...] [--duration S] [--server-key F]
[--key F]`: record a running server (docs/RECORDING.md).

The recorder is a lossless subscriber in its own process (server/recorder.py): one MCAP channel per topic, each
message exactly the published payload, its log time (when received) and publish time (the message's scene
time), `seq` gaps in `force` detected and reported. The scenario and the server's settings are asked of the
server's control socket (`describe`) and stored as metadata with the versions and the machine, so the file
can be resimulated; without an answer the file is still recorded, without them. This process shows progress
once a second and ends with a summary line. SIGINT / SIGTERM / --duration stop it; the file is closed properly,
and a SIGKILL leaves a file readable up to its last flush (about a second).

A server with CURVE keys (security.server_secret_key) sends nothing to a client without an allowed key pair, and
tells it nothing: give --server-key (the server's public .key) and --key (this client's .key_secret, whose public
.key is in the server's client_keys_dir), used on both sockets. If nothing arrives within NOTHING_S seconds this
says so, with that hint; a recording that got no message at all exits 1.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import signal
import sys
import time

import msgpack
import zmq

from ..haptics.process import StopRequest, child_main, shared_flag
from ..server.protocol import TOPIC_EVENT, TOPIC_FORCE, TOPIC_STATE, TOPIC_STATS
from ..server.security import ClientCurve, SecurityError, client_curve_option

TOPICS = {t.decode(): t for t in (TOPIC_STATE, TOPIC_FORCE, TOPIC_STATS, TOPIC_EVENT)}
NOTHING_S = 5.0   # s without a single message before the recording is reported as getting nothing


def describe(control: str, timeout_s: float = 2.0, curve: ClientCurve | None = None) -> dict | None:
    """The server's `describe` reply (scenario and settings), or None if it does not answer within ``timeout_s``
    seconds. ``curve``: the client keys, for a control socket with CURVE."""
    ctx = zmq.Context()
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    try:
        if curve is not None:
            curve.apply(req)
        req.connect(control)
        req.send(msgpack.packb({"cmd": "describe"}))
        if not req.poll(int(timeout_s * 1000)):
            return None
        reply = msgpack.unpackb(req.recv(), raw=False)
        return reply if isinstance(reply, dict) and reply.get("ok") else None
    finally:
        req.close(0)
        ctx.term()


def main(argv: list[str] | None = None) -> int:
    from ..server.headless import recording_metadata

    p = argparse.ArgumentParser(prog="suturesim record", description=__doc__.split("\n\n")[0].split(": ", 1)[1],
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--out", required=True, metavar="F.mcap", help="the MCAP file to write")
    p.add_argument("--connect", default="tcp://127.0.0.1:5555", metavar="EP",
                   help="the server's PUB endpoint (default tcp://127.0.0.1:5555)")
    p.add_argument("--control", default="tcp://127.0.0.1:5556", metavar="EP",
                   help="the server's control endpoint, asked for the scenario (default tcp://127.0.0.1:5556)")
    p.add_argument("--topics", default=",".join(TOPICS), metavar="T,...",
                   help=f"topics to record (default all: {','.join(TOPICS)})")
    p.add_argument("--duration", type=float, metavar="S",
                   help="stop after S seconds of recording, counted from when the recorder has started "
                        "(default: until Ctrl-C)")
    p.add_argument("--server-key", metavar="F",
                   help="the server's public key file (.key), for a server with CURVE; needs --key")
    p.add_argument("--key", metavar="F",
                   help="this client's secret key file (.key_secret, mode 0600, made by `suturesim keys`; its "
                        "public .key must be in the server's client_keys_dir); needs --server-key")
    args = p.parse_args(argv)
    topics = [t.strip() for t in args.topics.split(",") if t.strip()]
    bad = [t for t in topics if t not in TOPICS]
    if bad or not topics:
        p.error(f"--topics: unknown {', '.join(bad) or '(none)'}; choose from {', '.join(TOPICS)}")
    if (args.server_key is None) != (args.key is None):
        p.error("CURVE needs both --server-key (the server's public .key) and --key (this client's .key_secret)")
    try:
        curve = client_curve_option(args.server_key, args.key)
    except SecurityError as exc:
        print(f"suturesim record: {exc}", file=sys.stderr)
        return 2
    hint = ("are the keys right? (--server-key: the server's public .key; --key: a .key_secret whose public .key "
            "is in the server's client_keys_dir)" if curve is not None else
            "a server with CURVE keys sends nothing to a client without them, and says nothing: give "
            "--server-key SERVER.key --key CLIENT.key_secret")

    info = describe(args.control, curve=curve)
    if info is None:
        print(f"suturesim record: no answer from {args.control} (is the server running there? {hint}): "
              "recording without the scenario (it cannot be resimulated)", file=sys.stderr)
        meta = {}
    else:
        meta = recording_metadata(info["scenario"], info.get("file", ""), info.get("source", {}))
        meta["server"] = {k: str(v) for k, v in info.get("server", {}).items()}
    meta.setdefault("recording", {})["topics"] = ",".join(topics)
    meta["recording"]["connect"] = args.connect

    ctx = mp.get_context("spawn")
    stop, ready = shared_flag(ctx), ctx.Event()
    counts = ctx.Array("q", 2, lock=False)   # messages written, force seq gaps: for the progress line
    proc = ctx.Process(target=child_main, name="suturesim-recorder",
                       args=("suturesim.server.recorder", "recorder_main", args.connect, args.out, stop, ready, meta,
                             [TOPICS[t] for t in topics], counts, False, curve))
    stopping = StopRequest(stop, (signal.SIGINT, signal.SIGTERM))   # sets ``stop``, which the recorder reads
    proc.start()
    try:
        if not ready.wait(30.0):
            print("suturesim record: the recorder did not start", file=sys.stderr)
            stopping.set()
            return 1
        t0 = time.monotonic()     # --duration counts the recording, not the recorder's start (a spawned process)
        last = -1.0
        warned = False
        while proc.is_alive() and not stopping.is_set():
            if args.duration is not None and time.monotonic() - t0 >= args.duration:
                break
            time.sleep(0.1)
            if time.monotonic() - last >= 1.0:
                last = time.monotonic()
                print(f"\rsuturesim record: {time.monotonic() - t0:6.1f} s, {counts[0]} messages, {counts[1]} "
                      "force messages missing", end="", file=sys.stderr, flush=True)
            if not warned and counts[0] == 0 and time.monotonic() - t0 >= NOTHING_S:
                warned = True
                print(f"\nsuturesim record: warning: nothing arrived from {args.connect} in {NOTHING_S:g} s: is "
                      f"the server running there? {hint}", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    finally:
        stopping.set()
        proc.join(10.0)
        if proc.is_alive():
            proc.kill()
        stopping.restore()
    if counts[0] == 0:
        print(f"suturesim record: no message arrived from {args.connect}: {args.out} holds only its metadata "
              f"({hint})", file=sys.stderr)
        return 1
    return 0 if proc.exitcode == 0 else 1
