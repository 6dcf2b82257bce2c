"""CURVE against the real daemon: with keys and security.curve_on_loopback, a client holding an allowed key pair
gets replies and data; a client with another key pair, or none, gets nothing. Loopback only."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import msgpack
import pytest
import zmq
import zmq.auth

from suturesim.server.security import make_keys

from conftest import free_ports


@pytest.fixture
def curve_daemon(tmp_path):
    server_pub, server_secret = make_keys(str(tmp_path / "server"), "server")
    clients = tmp_path / "clients"
    good_pub, good_secret = make_keys(str(tmp_path / "good"), "client")
    clients.mkdir()
    os.link(good_pub, clients / "client.key")
    bad_pub, bad_secret = make_keys(str(tmp_path / "bad"), "intruder")
    p_pub, p_ctl, p_sty, p_sco = free_ports(4)
    cfg = tmp_path / "server.yaml"
    cfg.write_text(f"security:\n  server_secret_key: {server_secret}\n  client_keys_dir: {clients}\n"
                   f"  curve_on_loopback: true\nloop:\n  realtime: false\n")
    proc = subprocess.Popen([sys.executable, "-m", "suturesim.server.cli", "serve", "--config", str(cfg),
                             "--pub", f"tcp://127.0.0.1:{p_pub}", "--control", f"tcp://127.0.0.1:{p_ctl}",
                             "--stylus", f"tcp://127.0.0.1:{p_sty}", "--score", f"tcp://127.0.0.1:{p_sco}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if "serving" in line:
                break
            assert line or proc.poll() is None, "the daemon exited before serving"
        yield {"ctl": f"tcp://127.0.0.1:{p_ctl}", "pub": f"tcp://127.0.0.1:{p_pub}",
               "server_pub": server_pub, "good": good_secret, "bad": bad_secret}
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


def _client(ctx, kind, endpoint, server_pub, secret):
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if secret is not None:
        pub, sec = zmq.auth.load_certificate(secret)
        sock.curve_publickey, sock.curve_secretkey = pub, sec
        sock.curve_serverkey = zmq.auth.load_certificate(server_pub)[0]
    sock.connect(endpoint)
    return sock


def _status(ctx, d, secret) -> dict | None:
    req = _client(ctx, zmq.REQ, d["ctl"], d["server_pub"], secret)
    req.send(msgpack.packb({"cmd": "status"}))
    reply = msgpack.unpackb(req.recv()) if req.poll(1500) else None
    req.close(0)
    return reply


def test_curve_allows_only_listed_clients(curve_daemon):
    ctx = zmq.Context()
    try:
        assert _status(ctx, curve_daemon, curve_daemon["good"])["ok"] is True
        assert _status(ctx, curve_daemon, curve_daemon["bad"]) is None      # a key not in client_keys_dir
        assert _status(ctx, curve_daemon, None) is None                       # no CURVE at all
        assert _status(ctx, curve_daemon, curve_daemon["good"])["ok"] is True  # and the server is still fine
        sub = _client(ctx, zmq.SUB, curve_daemon["pub"], curve_daemon["server_pub"], curve_daemon["good"])
        sub.setsockopt(zmq.SUBSCRIBE, b"force")
        assert sub.poll(10000), "an allowed subscriber receives the force stream"
        plain = _client(ctx, zmq.SUB, curve_daemon["pub"], curve_daemon["server_pub"], None)
        plain.setsockopt(zmq.SUBSCRIBE, b"")
        assert not plain.poll(1500), "a subscriber without keys receives nothing"
        sub.close(0)
        plain.close(0)
    finally:
        # closes the sockets an assertion left open: term() alone waits for them, and a failed run of the full
        # suite hung there (with nothing to say which assertion failed)
        ctx.destroy(linger=0)
