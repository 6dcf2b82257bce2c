"""Binding policy, CURVE and message size caps (server/security.py).

Loopback only: the policy for other addresses is tested on endpoint strings; CURVE is tested on
tcp://127.0.0.1 by requiring it on every endpoint (SocketSecurity(require_curve=True)).
"""

import os
import stat

import pytest
import zmq
import zmq.auth

from suturesim.server.config import SecurityConfig
from suturesim.server.security import (SecurityError, SocketSecurity, check_bind_policy, is_loopback_endpoint,
                                       keys_main, make_keys)

LOCAL = "tcp://127.0.0.1:*"


# -- policy ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("endpoint, local", [
    ("tcp://127.0.0.1:5555", True), ("tcp://127.1.2.3:5555", True), ("tcp://localhost:5555", True),
    ("tcp://LOCALHOST:5555", True), ("tcp://[::1]:5555", True), ("tcp://[::ffff:127.0.0.1]:5555", True),
    ("ipc:///tmp/suturesim.sock", True), ("inproc://physics", True),
    ("tcp://0.0.0.0:5555", False), ("tcp://*:5555", False), ("tcp://192.168.1.10:5555", False),
    ("tcp://[::]:5555", False), ("tcp://eth0:5555", False), ("tcp://example.org:5555", False),
    ("tcp://128.0.0.1:5555", False), ("pgm://eth0;239.192.1.1:5555", False),
])
def test_is_loopback_endpoint(endpoint, local):
    assert is_loopback_endpoint(endpoint) is local


def test_local_endpoints_need_nothing():
    assert check_bind_policy(["tcp://127.0.0.1:5555", "ipc:///tmp/x", "inproc://y"], SecurityConfig()) == []


def test_non_local_without_keys_or_insecure_is_refused():
    with pytest.raises(SecurityError) as info:
        check_bind_policy(["tcp://127.0.0.1:5555", "tcp://0.0.0.0:5556"], SecurityConfig())
    msg = str(info.value)
    assert "tcp://0.0.0.0:5556" in msg and "tcp://127.0.0.1:5555" not in msg
    assert "server_secret_key" in msg and "client_keys_dir" in msg and "suturesim keys" in msg  # remedy 1
    assert "--insecure" in msg                                                                  # remedy 2


def test_half_the_keys_is_not_enough():
    with pytest.raises(SecurityError):
        check_bind_policy(["tcp://0.0.0.0:5555"], SecurityConfig(server_secret_key="/x.key_secret"))


def test_insecure_is_allowed_and_loud():
    warnings = check_bind_policy(["tcp://0.0.0.0:5555", "tcp://127.0.0.1:5556", "tcp://*:5557"],
                                 SecurityConfig(insecure=True))
    assert len(warnings) == 2
    assert warnings[0].startswith("WARNING: binding tcp://0.0.0.0:5555 WITHOUT authentication or encryption")
    assert "--insecure" in warnings[0] and "tcp://*:5557" in warnings[1]


def test_keys_allow_non_local_quietly():
    sec = SecurityConfig(server_secret_key="/s.key_secret", client_keys_dir="/clients")
    assert check_bind_policy(["tcp://0.0.0.0:5555"], sec) == []


def test_socket_security_enforces_the_policy():
    ctx = zmq.Context()
    try:
        with pytest.raises(SecurityError, match="tcp://0.0.0.0:5555"):
            SocketSecurity(ctx, SecurityConfig(), ["tcp://0.0.0.0:5555"])
        sec = SocketSecurity(ctx, SecurityConfig(), ["tcp://127.0.0.1:5555"])
        sock = ctx.socket(zmq.REP)
        with pytest.raises(SecurityError, match="tcp://0.0.0.0:6000"):  # an endpoint it was not told about
            sec.apply(sock, "tcp://0.0.0.0:6000")
        sock.close(0)
        with pytest.raises(SecurityError, match="CURVE is required"):
            SocketSecurity(ctx, SecurityConfig(), [LOCAL], require_curve=True)
    finally:
        ctx.destroy(linger=0)


# -- keys ------------------------------------------------------------------------------------------------
def test_make_keys(tmp_path):
    public, secret = make_keys(tmp_path / "k", "srv")
    assert public == str(tmp_path / "k" / "srv.key") and secret == str(tmp_path / "k" / "srv.key_secret")
    pub_key, no_secret = zmq.auth.load_certificate(public)
    pub_again, secret_key = zmq.auth.load_certificate(secret)
    assert no_secret is None and secret_key and pub_key == pub_again
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    before = open(secret).read()
    with pytest.raises(FileExistsError, match="not overwriting"):
        make_keys(tmp_path / "k", "srv")
    assert open(secret).read() == before
    os.remove(public)  # either file existing is enough to refuse
    with pytest.raises(FileExistsError):
        make_keys(tmp_path / "k", "srv")
    assert open(secret).read() == before


def test_keys_main(tmp_path, capsys):
    assert keys_main(["--dir", str(tmp_path), "--name", "alice"]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "alice.key").is_file() and (tmp_path / "alice.key_secret").is_file()
    for words in ("server_secret_key", "client_keys_dir", "curve_serverkey", "curve_publickey", "curve_secretkey"):
        assert words in out
    assert keys_main(["--dir", str(tmp_path), "--name", "alice"]) == 1
    assert "exists" in capsys.readouterr().err


# -- CURVE and message size on loopback ------------------------------------------------------------------
@pytest.fixture
def curve(tmp_path):
    """Server keys, one allowed client (alice) and one stranger (mallory), and a CURVE REP server."""
    _, server_secret = make_keys(tmp_path / "server", "server")
    make_keys(tmp_path / "allowed", "alice")
    make_keys(tmp_path / "others", "mallory")
    sec_cfg = SecurityConfig(server_secret_key=server_secret, client_keys_dir=str(tmp_path / "allowed"))
    ctx, client_ctx = zmq.Context(), zmq.Context()
    security = None
    try:
        security = SocketSecurity(ctx, sec_cfg, [LOCAL], require_curve=True)
        rep = ctx.socket(zmq.REP)
        rep.linger = 0
        security.apply(rep, LOCAL)
        rep.bind(LOCAL)
        yield {"rep": rep, "endpoint": rep.last_endpoint.decode(), "ctx": client_ctx, "dir": tmp_path,
               "security": security}
    finally:
        client_ctx.destroy(linger=0)  # closes whatever a failed test left open
        if security is not None:
            security.close()
        ctx.destroy(linger=0)


def _serve_one(rep: zmq.Socket, timeout_ms: int) -> bool:
    """Answer one request if it arrives within ``timeout_ms``."""
    if not rep.poll(timeout_ms):
        return False
    rep.send(b"pong:" + rep.recv())
    return True


def _client(curve, name: str | None) -> zmq.Socket:
    req = curve["ctx"].socket(zmq.REQ)
    req.linger = 0
    if name is not None:
        d = curve["dir"]
        server_public, _ = zmq.auth.load_certificate(d / "server" / "server.key")
        where = "allowed" if name == "alice" else "others"
        public, secret = zmq.auth.load_certificate(d / where / f"{name}.key_secret")
        req.curve_secretkey, req.curve_publickey, req.curve_serverkey = secret, public, server_public
    req.connect(curve["endpoint"])
    return req


def test_curve_allowed_client_gets_a_reply(curve):
    assert curve["security"].auth is not None  # the ZAP handler runs: without it CURVE admits any client key
    req = _client(curve, "alice")
    req.send(b"ping")
    assert _serve_one(curve["rep"], 5000)
    assert req.poll(5000) and req.recv() == b"pong:ping"
    req.close(0)


@pytest.mark.parametrize("who", ["mallory", None], ids=["unknown-key", "plain"])
def test_curve_refuses_other_clients(curve, who):
    req = _client(curve, who)
    req.send(b"ping")
    assert not _serve_one(curve["rep"], 1000)
    assert not req.poll(0)
    req.close(0)
    # the server is still serving its allowed client
    ok = _client(curve, "alice")
    ok.send(b"again")
    assert _serve_one(curve["rep"], 5000) and ok.poll(5000) and ok.recv() == b"pong:again"
    ok.close(0)


def test_max_message_size_drops_oversized_messages():
    ctx = zmq.Context()
    security = SocketSecurity(ctx, SecurityConfig(max_message_bytes=1024), [LOCAL])
    pull = ctx.socket(zmq.PULL)
    pull.linger = 0
    security.apply(pull, LOCAL)
    assert pull.getsockopt(zmq.MAXMSGSIZE) == 1024
    assert security.auth is None  # no CURVE on loopback, so no authenticator
    pull.bind(LOCAL)
    endpoint = pull.last_endpoint.decode()
    try:
        big = ctx.socket(zmq.PUSH)
        big.linger = 0
        big.connect(endpoint)
        big.send(b"x" * 2000)
        assert not pull.poll(500)
        big.close(0)
        small = ctx.socket(zmq.PUSH)
        small.linger = 0
        small.connect(endpoint)
        small.send(b"y" * 1000)
        assert pull.poll(5000) and pull.recv() == b"y" * 1000
        small.close(0)
    finally:
        security.close()
        ctx.destroy(linger=0)
