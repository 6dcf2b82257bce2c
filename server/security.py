"""Binding policy and ZeroMQ CURVE, with pyzmq's own pieces (zmq.auth).

Every socket binds 127.0.0.1 by default. A socket bound anywhere else needs CURVE (the server's secret key
and a directory of the allowed clients' public keys) or an explicit --insecure, which is allowed but loud.
Every socket gets ZMQ_MAXMSGSIZE: a peer that sends a bigger message is disconnected and the message dropped.
Key pairs are made by `suturesim keys` (zmq.auth.create_certificates).
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path
from typing import Iterable

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from .config import SecurityConfig


class SecurityError(RuntimeError):
    """A socket would be exposed against the binding policy, or CURVE cannot be set up."""


def is_loopback_endpoint(endpoint: str) -> bool:
    """True for endpoints only this machine can reach: tcp:// on 127.0.0.0/8, localhost or [::1], and every
    ipc:// and inproc://. Everything else (0.0.0.0, *, other addresses, host and interface names) is not."""
    transport, _, rest = endpoint.strip().partition("://")
    if transport in ("ipc", "inproc"):
        return True
    if transport != "tcp":
        return False
    host = rest.rpartition(":")[0] if ":" in rest else rest
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.lower() == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr.is_loopback or (mapped is not None and mapped.is_loopback)


def check_bind_policy(endpoints: Iterable[str], security: SecurityConfig) -> list[str]:
    """Raise SecurityError if a non-loopback endpoint has neither CURVE keys nor ``insecure``; return the
    warning lines to print (one per endpoint exposed without authentication, with ``insecure``)."""
    exposed = [ep for ep in endpoints if not is_loopback_endpoint(ep)]
    if not exposed or security.has_curve_keys:
        return []
    if security.insecure:
        return [f"WARNING: binding {ep} WITHOUT authentication or encryption (--insecure): anyone who can "
                "reach it can read the stream and control the server" for ep in exposed]
    raise SecurityError(
        f"refusing to bind {', '.join(exposed)}: not a loopback address, and no authentication is configured. "
        "Either set CURVE keys (security.server_secret_key: the server's .key_secret file, and "
        "security.client_keys_dir: a directory of the allowed clients' public .key files; make pairs with "
        "`suturesim keys`), or accept unauthenticated, unencrypted access with --insecure "
        "(security.insecure: true). To stay local, bind tcp://127.0.0.1.")


class SocketSecurity:
    """The security of the sockets one process binds, for one zmq.Context.

    ``apply(sock, endpoint)`` before ``sock.bind(endpoint)``. ``require_curve`` puts CURVE on every endpoint,
    loopback included (tests; or a shared machine whose local users are not trusted)."""

    def __init__(self, ctx: zmq.Context, security: SecurityConfig, endpoints: Iterable[str],
                 require_curve: bool = False):
        self.ctx = ctx
        self.security = security
        self.require_curve = require_curve
        self.warnings = check_bind_policy(list(endpoints), security)
        self.auth: ThreadAuthenticator | None = None
        self._public: bytes | None = None
        self._secret: bytes | None = None
        if security.has_curve_keys:
            public, secret = zmq.auth.load_certificate(security.server_secret_key)
            if not secret:
                raise SecurityError(f"{security.server_secret_key} holds no secret key")
            self._public, self._secret = public, secret
        elif require_curve:
            raise SecurityError("CURVE is required but security.server_secret_key and "
                                "security.client_keys_dir are not both set")

    def uses_curve(self, endpoint: str) -> bool:
        return self._secret is not None and (self.require_curve or not is_loopback_endpoint(endpoint))

    def apply(self, sock: zmq.Socket, endpoint: str) -> None:
        """Set the message size cap, and the CURVE server options where the endpoint needs them."""
        sock.setsockopt(zmq.MAXMSGSIZE, self.security.max_message_bytes)
        if self.uses_curve(endpoint):
            self._start_auth()  # before curve_server: without a ZAP handler, CURVE would admit any client key
            sock.curve_secretkey = self._secret
            sock.curve_publickey = self._public
            sock.curve_server = True
        else:  # an endpoint the constructor was not told about gets the same policy
            self.warnings += [w for w in check_bind_policy([endpoint], self.security) if w not in self.warnings]

    def _start_auth(self) -> None:
        if self.auth is not None:
            return
        auth = ThreadAuthenticator(self.ctx)
        auth.start()
        auth.configure_curve(domain="*", location=self.security.client_keys_dir)
        self.auth = auth

    def close(self) -> None:
        if self.auth is not None:
            self.auth.stop()
            self.auth = None

    def __enter__(self) -> "SocketSecurity":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_keys(directory: str | os.PathLike, name: str = "suturesim") -> tuple[str, str]:
    """Make a CURVE key pair with zmq.auth.create_certificates: DIR/NAME.key (public) and DIR/NAME.key_secret
    (secret, mode 0600). Returns (public_path, secret_path); refuses (FileExistsError) to overwrite either."""
    if not name or os.sep in name or name in (".", ".."):
        raise ValueError(f"key name must be a plain file name, got {name!r}")
    d = Path(directory).expanduser()
    d.mkdir(parents=True, exist_ok=True)
    public, secret = d / f"{name}.key", d / f"{name}.key_secret"
    for p in (public, secret):
        if p.exists():
            raise FileExistsError(f"{p} exists; not overwriting a key (remove it, or choose another --name)")
    # Claim both names exclusively, the secret one already 0600, so the secret is never readable by others.
    made = []
    try:
        for p, mode in ((public, 0o644), (secret, 0o600)):
            os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
            made.append(p)
        os.chmod(secret, 0o600)
        public_path, secret_path = zmq.auth.create_certificates(d, name)
    except BaseException:
        for p in made:
            p.unlink(missing_ok=True)
        raise
    os.chmod(secret_path, 0o600)
    return str(public_path), str(secret_path)


def keys_main(argv: list[str]) -> int:
    """`suturesim keys [--dir DIR] [--name NAME]`: make a CURVE key pair and say how to use it."""
    parser = argparse.ArgumentParser(
        prog="suturesim keys",
        description="Make a ZeroMQ CURVE key pair (zmq.auth certificates) for the server or for a client.")
    parser.add_argument("--dir", default="keys", help="directory to write the pair to (default: ./keys)")
    parser.add_argument("--name", default="suturesim",
                        help="file name of the pair: NAME.key (public) and NAME.key_secret (default: suturesim)")
    args = parser.parse_args(argv)
    try:
        public, secret = make_keys(args.dir, args.name)
    except (FileExistsError, ValueError, OSError) as exc:
        print(f"suturesim keys: {exc}", file=sys.stderr)
        return 1
    public, secret = os.path.abspath(public), os.path.abspath(secret)
    print(f"""\
wrote {public}         public key: may be shared
wrote {secret}  secret key: mode 0600, keep it private

As the server's pair, in the server config (security: section):
  server_secret_key: {secret}
  client_keys_dir: /path/to/clients   # the allowed clients' public .key files
Endpoints that are not loopback then use CURVE; clients need the server's public key, {public}

As a client's pair: copy {public} (never the .key_secret) into the server's client_keys_dir and restart
the server. A pyzmq client then connects with:
  import zmq, zmq.auth
  client_public, client_secret = zmq.auth.load_certificate("{secret}")
  server_public, _ = zmq.auth.load_certificate("/path/to/server.key")
  sock = zmq.Context.instance().socket(zmq.SUB)   # or REQ (control), PUSH (stylus)
  sock.curve_secretkey = client_secret
  sock.curve_publickey = client_public
  sock.curve_serverkey = server_public
  sock.connect("tcp://SERVER:5555")""")
    return 0
