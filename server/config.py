"""The daemon's configuration (configs/server.yaml): frozen dataclasses, validated on load.

Every key is read through solver.config.Section, so a typo is an error, every value is checked where it is
read, and every error is a ConfigError naming the file, the key path and the reason
(`server.yaml: loop.state_hz: must be <= 1/tick_s = 1000 Hz, got 2000`). The scenario is loaded once here,
so an error in it is reported (with its own file and key) before any process starts.

Command-line flags arrive as ``overrides``, a nested mapping merged over the file before validation; a value
of None means "flag not given". Relative paths in the file (scenario, key files, record) are relative to the
config file; relative paths given on the command line are relative to the working directory.
"""
from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..solver.config import ConfigError, Section, load_yaml
from ..solver.presets import CONFIG_DIR
from ..solver.scenario import SCENARIOS_DIR, load_scenario, scenario_names

DEFAULT_CONFIG = CONFIG_DIR / "server.yaml"
_CLI = "(given on the command line)"


@dataclass(frozen=True)
class Endpoints:
    """ZeroMQ endpoints the physics process binds (DESIGN.md, Processes and data flow)."""
    pub: str = "tcp://127.0.0.1:5555"       # PUB: state / force / stats / event
    control: str = "tcp://127.0.0.1:5556"   # REP: control requests
    stylus: str = "tcp://127.0.0.1:5557"    # PULL: remote stylus poses

    def all(self) -> list[str]:
        return [self.pub, self.control, self.stylus]


@dataclass(frozen=True)
class LoopConfig:
    """The fixed-rate loop of the physics process."""
    tick_s: float = 0.001       # period, s
    spin_us: float = 300.0      # sleep until this long before each deadline, then spin, µs
    realtime: bool = True       # try SCHED_FIFO (and say so when the OS refuses)
    priority: int = 50          # SCHED_FIFO priority, 1..99
    cpu: int = -1               # CPU to pin the physics process to; -1 = the last allowed CPU (none if only one)
    state_hz: float = 100.0     # rate of the `state` topic, Hz (<= 1/tick_s)
    stats_hz: float = 1.0       # rate of the `stats` topic, Hz
    sndhwm: int = 1000          # ZMQ send high-water mark, messages: a slow subscriber drops, never slows the loop


@dataclass(frozen=True)
class SecurityConfig:
    """Binding policy and CURVE keys (server/security.py). Paths are absolute once loaded."""
    insecure: bool = False                  # allow non-loopback endpoints without CURVE (loudly)
    server_secret_key: str | None = None    # zmq.auth secret key file (.key_secret) of the server
    client_keys_dir: str | None = None      # directory of the allowed clients' public .key files
    max_message_bytes: int = 65536          # ZMQ_MAXMSGSIZE on every socket, bytes
    curve_on_loopback: bool = False         # with keys: CURVE on loopback endpoints too (shared machines)

    @property
    def has_curve_keys(self) -> bool:
        return self.server_secret_key is not None and self.client_keys_dir is not None


@dataclass(frozen=True)
class FaultConfig:
    """What the supervisor does when the physics process dies."""
    policy: str = "restart"     # "restart" | "exit"
    max_restarts: int = 3       # restarts before giving up (policy "restart")


@dataclass(frozen=True)
class ServerConfig:
    file: str                                   # the config file read
    scenario: str = "default"                   # a shipped scenario name or an absolute path
    endpoints: Endpoints = field(default_factory=Endpoints)
    loop: LoopConfig = field(default_factory=LoopConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    record: str | None = None                   # MCAP path to record to from start-up, absolute once loaded
    device: str = "simulated"                   # "simulated": the scenario's scripted stylus moves the grasps;
                                                # "remote": only poses on the stylus socket (or a driver) do


def load_server_config(path: str | os.PathLike | None = None, overrides: dict | None = None) -> ServerConfig:
    """Read and validate the server config (default: the shipped configs/server.yaml), with ``overrides``
    (from CLI flags; None values are ignored) merged over it. Raises ConfigError naming file, key, reason."""
    file = Path(path) if path is not None else DEFAULT_CONFIG
    data = load_yaml(file)
    from_cli: set[str] = set()
    if overrides:
        data = _merge(data, overrides, "", from_cli)
    try:
        return _build(data, str(file), from_cli)
    except ConfigError as exc:
        if exc.key in from_cli and not exc.reason.endswith(_CLI):
            raise ConfigError(exc.file, exc.key, f"{exc.reason} {_CLI}") from None
        raise


def _merge(base: dict, over: dict, prefix: str, from_cli: set[str]) -> dict:
    """``over`` merged into a copy of ``base``; the key paths it set are added to ``from_cli``."""
    out = dict(base)
    for k, v in over.items():
        if v is None:
            continue
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v, key, from_cli)
        else:
            out[k] = v
            from_cli.add(key)
            if isinstance(v, dict):
                from_cli.update(f"{key}.{kk}" for kk in v)
    return out


def _base_dir(file: str, key: str, from_cli: set[str]) -> Path:
    """Where a relative path under ``key`` is relative to: the working directory for a CLI value, else the
    config file's directory."""
    return Path.cwd() if key in from_cli else Path(file).resolve().parent


def _path(sec: Section, key: str, from_cli: set[str]) -> Path | None:
    value = sec.get(key, str, None)
    if value is None:
        return None
    if not value.strip():
        raise sec.error(key, "must not be empty")
    p = Path(value).expanduser()
    return p if p.is_absolute() else _base_dir(sec.file, sec.key_path(key), from_cli) / p


# -- endpoints -------------------------------------------------------------------------------------------
_HOSTNAME = re.compile(r"^(\*|[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?)$")


def endpoint_error(endpoint: str) -> str | None:
    """Why ``endpoint`` is not a bindable tcp://HOST:PORT, ipc://PATH or inproc://NAME, or None if it is."""
    transport, sep, rest = endpoint.partition("://")
    if not sep:
        return f"must be tcp://HOST:PORT, ipc://PATH or inproc://NAME, got {endpoint!r}"
    if transport in ("ipc", "inproc"):
        return None if rest else f"needs a {'path' if transport == 'ipc' else 'name'} after {transport}://"
    if transport != "tcp":
        return f"transport must be tcp, ipc or inproc, got {transport!r} in {endpoint!r}"
    host, colon, port = rest.rpartition(":")
    if not colon or not host:
        return f"must be tcp://HOST:PORT, got {endpoint!r}"
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"port must be an integer in 1..65535, got {port!r} in {endpoint!r}"
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"{host} is not an IPv6 address in {endpoint!r}"
        return None
    if ":" in host:
        return f"an IPv6 host must be in brackets (tcp://[::1]:5555), got {endpoint!r}"
    if not _HOSTNAME.match(host):
        return f"{host!r} is not a host name, address or interface in {endpoint!r}"
    return None


def _endpoints(sec: Section) -> Endpoints:
    values = {}
    for key, default in (("pub", Endpoints.pub), ("control", Endpoints.control), ("stylus", Endpoints.stylus)):
        ep = sec.get(key, str, default).strip()
        reason = endpoint_error(ep)
        if reason:
            raise sec.error(key, reason)
        for other, seen in values.items():
            if seen == ep:
                raise sec.error(key, f"is the same endpoint as endpoints.{other} ({ep})")
        values[key] = ep
    sec.finish()
    return Endpoints(**values)


# -- loop ------------------------------------------------------------------------------------------------
def _allowed_cpus() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _loop(sec: Section) -> LoopConfig:
    d = LoopConfig()
    tick_s = sec.get("tick_s", float, d.tick_s, above=0.0, maxval=0.1)
    tick_us = tick_s * 1e6
    spin_us = sec.get("spin_us", float, d.spin_us, minval=0.0)
    if spin_us > tick_us:
        raise sec.error("spin_us", f"must be <= the tick ({tick_us:g} µs), got {spin_us:g}")
    realtime = sec.get("realtime", bool, d.realtime)
    priority = sec.get("priority", int, d.priority, minval=1, maxval=99)
    cpu = sec.get("cpu", int, d.cpu, minval=-1)
    if cpu >= 0 and cpu not in (allowed := _allowed_cpus()):
        raise sec.error("cpu", f"CPU {cpu} is not one this process may use ({', '.join(map(str, allowed))}); "
                               "-1 picks the last one")
    max_hz = 1.0 / tick_s
    rates = {}
    for key, default in (("state_hz", d.state_hz), ("stats_hz", d.stats_hz)):
        hz = sec.get(key, float, default, above=0.0)
        if hz * tick_s > 1.0 + 1e-9:
            raise sec.error(key, f"must be <= 1/tick_s = {max_hz:g} Hz, got {hz:g}")
        rates[key] = hz
    sndhwm = sec.get("sndhwm", int, d.sndhwm, minval=1, maxval=10_000_000)
    sec.finish()
    return LoopConfig(tick_s=tick_s, spin_us=spin_us, realtime=realtime, priority=priority, cpu=cpu,
                      sndhwm=sndhwm, **rates)


# -- security --------------------------------------------------------------------------------------------
def _security(sec: Section, from_cli: set[str]) -> SecurityConfig:
    import zmq.auth  # server/ owns the network; imported here so solver-only users never pay for it

    insecure = sec.get("insecure", bool, False)
    secret = _path(sec, "server_secret_key", from_cli)
    clients = _path(sec, "client_keys_dir", from_cli)
    max_bytes = sec.get("max_message_bytes", int, SecurityConfig.max_message_bytes, minval=1024,
                        maxval=1 << 30)
    curve_local = sec.get("curve_on_loopback", bool, False)
    sec.finish()
    if secret is not None:
        if not secret.is_file():
            raise sec.error("server_secret_key", f"no such key file: {secret}")
        try:
            _, secret_key = zmq.auth.load_certificate(secret)
        except (OSError, ValueError) as exc:
            raise sec.error("server_secret_key", f"cannot read a key from {secret}: {exc}") from None
        if not secret_key:
            raise sec.error("server_secret_key", f"{secret} holds no secret key (give the .key_secret file "
                                                 "made by `suturesim keys`, not the public .key)")
    if clients is not None:
        if not clients.is_dir():
            raise sec.error("client_keys_dir", f"no such directory: {clients}")
        try:
            allowed = zmq.auth.load_certificates(clients)
        except (OSError, ValueError) as exc:
            raise sec.error("client_keys_dir", f"cannot read the public keys in {clients}: {exc}") from None
        if not allowed:
            raise sec.error("client_keys_dir", f"{clients} holds no public .key files, so no client could "
                                               "connect (make one with `suturesim keys --name CLIENT`)")
    if (secret is None) != (clients is None):
        given, missing = ("server_secret_key", "client_keys_dir") if clients is None else \
            ("client_keys_dir", "server_secret_key")
        raise sec.error(missing, f"CURVE needs both server_secret_key and client_keys_dir; only {given} is given")
    if curve_local and secret is None:
        raise sec.error("curve_on_loopback", "needs server_secret_key and client_keys_dir")
    return SecurityConfig(insecure=insecure, server_secret_key=None if secret is None else str(secret),
                          client_keys_dir=None if clients is None else str(clients), max_message_bytes=max_bytes,
                          curve_on_loopback=curve_local)


# -- fault -----------------------------------------------------------------------------------------------
def _fault(sec: Section) -> FaultConfig:
    cfg = FaultConfig(policy=sec.get("policy", str, FaultConfig.policy, choices=("restart", "exit")),
                      max_restarts=sec.get("max_restarts", int, FaultConfig.max_restarts, minval=0, maxval=1000))
    sec.finish()
    return cfg


# -- scenario and record ---------------------------------------------------------------------------------
def _scenario(top: Section, from_cli: set[str]) -> str:
    """The scenario as a shipped name or an absolute path (checked to exist; loaded by the caller)."""
    value = top.get("scenario", str, ServerConfig.scenario).strip()
    if not value:
        raise top.error("scenario", "must not be empty")
    if value.endswith((".yaml", ".yml")) or "/" in value or os.sep in value:
        p = Path(value).expanduser()
        if not p.is_absolute():
            p = _base_dir(top.file, "scenario", from_cli) / p
        if not p.is_file():
            raise top.error("scenario", f"no such scenario file: {p}")
        name = str(p)
    else:
        if not (SCENARIOS_DIR / f"{value}.yaml").is_file():
            raise top.error("scenario", f"no shipped scenario {value!r} (shipped: {', '.join(scenario_names())}; "
                                        "or give a path to a .yaml file)")
        name = value
    return name


def _record(top: Section, from_cli: set[str]) -> str | None:
    p = _path(top, "record", from_cli)
    if p is None:
        return None
    if not p.parent.is_dir():
        raise top.error("record", f"the directory of {p} does not exist")
    if p.is_dir():
        raise top.error("record", f"{p} is a directory; give a file name (F.mcap)")
    return str(p)


def _build(data: dict, file: str, from_cli: set[str]) -> ServerConfig:
    top = Section(data, file)
    endpoints = _endpoints(top.section("endpoints", {}))
    loop = _loop(top.section("loop", {}))
    security = _security(top.section("security", {}), from_cli)
    fault = _fault(top.section("fault", {}))
    record = _record(top, from_cli)
    scenario = _scenario(top, from_cli)
    device = top.get("device", str, "simulated", choices=("simulated", "remote"))
    top.finish()
    load_scenario(scenario)  # last, and an error inside it propagates with the scenario's own file and key
    return ServerConfig(file=file, scenario=scenario, endpoints=endpoints, loop=loop, security=security,
                        fault=fault, record=record, device=device)
