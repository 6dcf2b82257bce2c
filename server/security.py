"""Binding policy and ZeroMQ CURVE, with pyzmq's own pieces (zmq.auth).

Every socket binds 127.0.0.1 by default. A socket bound anywhere else needs CURVE (the server's secret key
and a directory of the allowed clients' public keys) or an explicit --insecure, which is allowed but loud.
Every socket gets ZMQ_MAXMSGSIZE: a peer that sends a bigger message is disconnected and the message dropped.
Key pairs are made by `suturesim keys` (zmq.auth.create_certificates).
"""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import shutil
import stat
import sys
import tempfile
import threading
import weakref
from dataclasses import dataclass, field
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


def needs_curve(security: SecurityConfig, endpoint: str) -> bool:
    """True if a socket bound on ``endpoint`` under ``security`` uses CURVE: keys are configured, and the endpoint
    is not loopback or ``curve_on_loopback`` is set (the rule SocketSecurity applies in the physics process)."""
    return security.has_curve_keys and (security.curve_on_loopback or not is_loopback_endpoint(endpoint))


# -- key files ---------------------------------------------------------------------------------------------
# A secret key anyone else can read is no secret, and a directory of allowed keys anyone else can write lets them
# allow themselves: refused, as ssh refuses a private key with group or other permissions. POSIX only.
def secret_key_problem(path: str | os.PathLike) -> str | None:
    """Why the secret key file ``path`` must not be used (any permission for group or others), or None."""
    if os.name != "posix":
        return None
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        return (f"{path} is open to group or others (mode {mode:04o}): a secret key must be readable by its "
                f"owner only; run: chmod 600 {path}")
    return None


def public_keys_problem(directory: str | os.PathLike) -> str | None:
    """Why the directory of allowed clients' public keys ``directory`` must not be used (it, or a .key file in it,
    writable by group or others: they could add their own key), or None."""
    if os.name != "posix":
        return None
    d = Path(directory)
    mode = stat.S_IMODE(os.stat(d).st_mode)
    if mode & 0o022:
        return (f"{d} is writable by group or others (mode {mode:04o}): they could allow their own keys; "
                f"run: chmod go-w {d}")
    for p in sorted(d.iterdir()):
        if p.name.endswith(".key"):   # the files zmq.auth.load_certificates reads
            mode = stat.S_IMODE(os.stat(p).st_mode)
            if mode & 0o022:
                return (f"{p} is writable by group or others (mode {mode:04o}): they could replace it with "
                        f"their own key; run: chmod go-w {p}")
    return None


def check_server_keys(security: SecurityConfig) -> None:
    """Raise SecurityError if the server's secret key or its allowed clients' keys have unsafe permissions."""
    if security.server_secret_key is not None and (why := secret_key_problem(security.server_secret_key)):
        raise SecurityError(f"security.server_secret_key: {why}")
    if security.client_keys_dir is not None and (why := public_keys_problem(security.client_keys_dir)):
        raise SecurityError(f"security.client_keys_dir: {why}")


@dataclass(frozen=True)
class ClientCurve:
    """A client's CURVE keys for one server: the server's public key and the client's own pair, each as Z85 text
    (40 bytes, as zmq.auth.load_certificate and zmq.curve_keypair give them). ``apply(sock)`` before
    ``sock.connect``."""
    server_public: bytes
    public: bytes
    secret: bytes = field(repr=False)

    def apply(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE client of the server (before connect)."""
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret

    @property
    def user_id(self) -> str:
        """The User-Id a ZAP handler gives this client (the Z85 text of its public key, as zmq.auth does)."""
        return self.public.decode("ascii")

    @classmethod
    def from_files(cls, server_public_key_path: str | os.PathLike,
                   client_secret_key_path: str | os.PathLike) -> "ClientCurve":
        """Load the server's public key (its .key file) and the client's pair (its .key_secret file, which must
        be readable by its owner only). Raises SecurityError naming the file and the reason."""
        server_public = _load_key(server_public_key_path, "--server-key")[0]
        public, secret = _load_key(client_secret_key_path, "--key")
        if not secret:
            raise SecurityError(f"--key {client_secret_key_path}: holds no secret key (give the client's "
                                ".key_secret file made by `suturesim keys`, not its public .key)")
        if why := secret_key_problem(client_secret_key_path):
            raise SecurityError(f"--key: {why}")
        return cls(server_public=server_public, public=public, secret=secret)

    @classmethod
    def generate(cls, server_public: bytes) -> "ClientCurve":
        """A fresh pair in memory (zmq.curve_keypair), for a client the server starts itself (its recorder)."""
        public, secret = zmq.curve_keypair()
        return cls(server_public=server_public, public=public, secret=secret)


def client_curve_option(server_key: str | None, key: str | None) -> "ClientCurve | None":
    """The client keys a command line gave (``--server-key SERVER.key --key CLIENT.key_secret``), or None if it
    gave neither; SecurityError if it gave one alone, or a key that cannot be used."""
    if (server_key is None) != (key is None):
        raise SecurityError("CURVE needs both --server-key (the server's public .key) and --key (this client's "
                            ".key_secret)")
    return None if key is None else ClientCurve.from_files(server_key, key)


def _load_key(path: str | os.PathLike, what: str) -> tuple[bytes, bytes | None]:
    """(public, secret or None) from a zmq.auth key file; SecurityError naming ``what`` and the file."""
    if not Path(path).is_file():
        raise SecurityError(f"{what} {path}: no such key file")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise SecurityError(f"{what} {path}: cannot read a key: {exc}") from None
    if not public:
        raise SecurityError(f"{what} {path}: holds no public key")
    return public, secret


# -- the ZAP handler, out of the physics process ------------------------------------------------------------
ZAP_INPROC = "inproc://zeromq.zap.01"   # where libzmq asks each context's CURVE servers' handshakes (RFC 27)


class ZapService:
    """The ZAP handler (zmq.auth's Authenticator: CURVE keys from ``client_keys_dir``, plus ``extra_keys``, Z85)
    serving on an ipc:// endpoint in a private directory (mode 0700: only this user can connect), in a thread of
    the supervisor, at ordinary priority. The physics process forwards its ZAP requests there (ZapForwarder), so
    a flood of handshakes is answered here, in Python, and never competes with the 1 kHz loop for its GIL.

    Replies carry the User-Id zmq.auth gives (the Z85 text of the client's public key). A malformed request
    gets a 400 reply, never none (the socket is a REP)."""

    def __init__(self, client_keys_dir: str, extra_keys: Iterable[bytes] = ()):
        self.dir = tempfile.mkdtemp(prefix="suturesim-zap-")   # mode 0700
        # removed at interpreter exit too, if close() is never reached
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.dir, True)
        self.endpoint = f"ipc://{self.dir}/zap"
        self.ctx = zmq.Context()
        self.auth = zmq.auth.Authenticator(self.ctx)
        self.auth.configure_curve(domain="*", location=client_keys_dir)
        allowed = self.auth.certs.setdefault("*", {})
        for key in extra_keys:
            allowed[key] = True   # keyed by Z85 text, as zmq.auth.load_certificates keys them
        self.sock = self.ctx.socket(zmq.REP)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.endpoint)
        self.auth.zap_socket = self.sock
        self.requests = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="suturesim-zap", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()   # Authenticator.handle_zap_message is a coroutine
        try:
            while not self._stop.is_set():
                if not self.sock.poll(100):
                    continue
                msg = self.sock.recv_multipart()
                self.requests += 1
                try:
                    if len(msg) < 2:
                        raise ValueError("not a ZAP request")
                    loop.run_until_complete(self.auth.handle_zap_message(msg))
                except Exception:  # noqa: BLE001 - a bad request must not stop the handler
                    try:
                        self.sock.send_multipart([b"1.0", msg[1] if len(msg) > 1 else b"", b"400",
                                                  b"Bad request", b"", b""])
                    except zmq.ZMQError:   # it had been answered already
                        pass
        finally:
            loop.close()

    def close(self) -> None:
        """Stop serving (the physics process's handshakes then wait: no client is admitted) and clean up."""
        self._stop.set()
        self._thread.join(2.0)
        self.sock.close(0)
        self.ctx.term()
        self._cleanup()


def start_server_zap(security: SecurityConfig, endpoints: Iterable[str]
                     ) -> tuple[ZapService | None, ClientCurve | None]:
    """The supervisor's ZAP service, if any of the server's ``endpoints`` (the PUB one first) uses CURVE, and
    the in-memory key pair its own recorder connects to the PUB endpoint with (None if that needs no CURVE)."""
    endpoints = list(endpoints)
    if not any(needs_curve(security, ep) for ep in endpoints):
        return None, None
    check_server_keys(security)
    server_public, _ = zmq.auth.load_certificate(security.server_secret_key)
    recorder = ClientCurve.generate(server_public) if needs_curve(security, endpoints[0]) else None
    zap = ZapService(security.client_keys_dir, [recorder.public] if recorder else [])
    return zap, recorder


class ZapForwarder:
    """Forwards one context's ZAP requests to a ZapService: a ROUTER bound on ZAP_INPROC, a DEALER connected
    to ``endpoint``, and zmq.proxy_steerable between them in a thread. pyzmq runs the proxy ``with nogil``
    (zmq/backend/cython/_zmq.py), so the thread never takes the GIL from the loop while it forwards.
    Until the service answers, a handshake waits (at most ZMQ_HANDSHAKE_IVL) and is then dropped: fail closed."""

    def __init__(self, ctx: zmq.Context, endpoint: str):
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(ZAP_INPROC)
        self.dealer = ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.connect(endpoint)
        name = f"inproc://suturesim-zap-control-{id(self):x}"
        self._control_in = ctx.socket(zmq.PAIR)
        self._control_in.bind(name)
        self._control = ctx.socket(zmq.PAIR)
        self._control.setsockopt(zmq.LINGER, 0)
        self._control.connect(name)
        self._thread = threading.Thread(target=self._run, name="suturesim-zap-forward", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            zmq.proxy_steerable(self.router, self.dealer, None, self._control_in)
        except zmq.ContextTerminated:
            pass
        finally:
            for sock in (self.router, self.dealer, self._control_in):
                sock.close(0)

    def stop(self) -> None:
        """End the proxy (its sockets are closed by its thread)."""
        if self._thread.is_alive():
            self._control.send(b"TERMINATE")
            self._thread.join(2.0)
        self._control.close(0)


class SocketSecurity:
    """The security of the sockets one process binds, for one zmq.Context.

    ``apply(sock, endpoint)`` before ``sock.bind(endpoint)``. ``require_curve`` puts CURVE on every endpoint,
    loopback included (tests; or a shared machine whose local users are not trusted). The ZAP handler that checks
    the clients' keys is the supervisor's ZapService, reached through a ZapForwarder, when
    ``security.zap_endpoint`` is set (the daemon's physics process); else a ThreadAuthenticator in this process."""

    def __init__(self, ctx: zmq.Context, security: SecurityConfig, endpoints: Iterable[str],
                 require_curve: bool = False):
        self.ctx = ctx
        self.security = security
        self.require_curve = require_curve
        self.warnings = check_bind_policy(list(endpoints), security)
        self.auth: ThreadAuthenticator | None = None
        self.forwarder: ZapForwarder | None = None
        self._public: bytes | None = None
        self._secret: bytes | None = None
        if security.has_curve_keys:
            check_server_keys(security)
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
        if self.auth is not None or self.forwarder is not None:
            return
        if self.security.zap_endpoint is not None:
            self.forwarder = ZapForwarder(self.ctx, self.security.zap_endpoint)
            return
        auth = ThreadAuthenticator(self.ctx)
        auth.start()
        auth.configure_curve(domain="*", location=self.security.client_keys_dir)
        self.auth = auth

    def close(self) -> None:
        if self.auth is not None:
            self.auth.stop()
            self.auth = None
        if self.forwarder is not None:
            self.forwarder.stop()
            self.forwarder = None

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
  sock.connect("tcp://SERVER:5555")
`suturesim record` and `suturesim view` take the same keys: --server-key /path/to/server.key --key {secret}""")
    return 0
