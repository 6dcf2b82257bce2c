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

import functools
import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..haptics.safety import SafetyConfig
from ..haptics.transform import DeviceTransform
from ..solver.config import ConfigError, Section, load_yaml
from ..solver.presets import CONFIG_DIR
from ..solver.scenario import MAX_MOTION_SCALE, SCENARIOS_DIR, TOOLS, Scenario, load_scenario, scenario_names

DEFAULT_CONFIG = CONFIG_DIR / "server.yaml"
_CLI = "(given on the command line)"


@dataclass(frozen=True)
class Endpoints:
    """ZeroMQ endpoints the physics process binds (docs/ARCHITECTURE.md Sec. 2)."""
    pub: str = "tcp://127.0.0.1:5555"       # PUB: state / force / stats / event
    control: str = "tcp://127.0.0.1:5556"   # REP: control requests
    stylus: str = "tcp://127.0.0.1:5557"    # PULL: remote stylus poses
    score: str | None = "tcp://127.0.0.1:5558"   # PUB of the scorer process: the attempt's score (None: none)

    def all(self) -> list[str]:
        return [self.pub, self.control, self.stylus] + ([self.score] if self.score else [])


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
    zap_endpoint: str | None = None         # the supervisor's ZAP service (ipc://), set by serve, never read
                                            # from a file: the physics process forwards its ZAP requests there

    @property
    def has_curve_keys(self) -> bool:
        return self.server_secret_key is not None and self.client_keys_dir is not None


@dataclass(frozen=True)
class FaultConfig:
    """What the supervisor does when the physics process dies."""
    policy: str = "restart"     # "restart" | "exit"
    max_restarts: int = 3       # restarts before giving up (policy "restart")
    stall_s: float = 2.0        # s without a tick (after warm-up) before the supervisor takes the loop for hung


def _data_dir(leaf: str) -> str:
    """``$XDG_DATA_HOME/suturesim/<leaf>``; ~/.local/share when XDG_DATA_HOME is unset or not absolute (the
    XDG base directory rule)."""
    base = Path(os.environ.get("XDG_DATA_HOME") or "~/.local/share").expanduser()
    if not base.is_absolute():
        base = Path("~/.local/share").expanduser()
    return str(base / "suturesim" / leaf)


@dataclass(frozen=True)
class FilesConfig:
    """Where control requests may touch files (docs/PROTOCOL.md Sec. 4.3). Absolute once loaded; neither
    directory is created here."""
    # record_start writes its recordings here (created mode 0700 at the first recording, server/files.py)
    recordings_dir: str = field(default_factory=lambda: _data_dir("recordings"))
    # a `load` by file name reads it here, and a network scenario's preset / shape.file only here or under the
    # shipped configs/ (solver/sources.py)
    scenarios_dir: str = field(default_factory=lambda: _data_dir("scenarios"))


DEVICE_BACKENDS = ("simulated", "openhaptics", "remote", "replay")
GRASP_MODES = ("hold", "toggle")
DEVICE_FRAMES = ("scene", "device")
# OpenHaptics reports millimetres with y up and z toward the user; the scene is SI with z up. Turned by +90 deg
# about x (device y -> scene z, device z -> scene -y), scaled to metres, with the device's origin over the
# middle of the default scene's thread.
OPENHAPTICS_TRANSFORM = DeviceTransform(rotation_deg=(90.0, 0.0, 0.0), scale=0.001, offset=(0.3, 0.0, 0.05))


@dataclass(frozen=True)
class DeviceConfig:
    """One stylus, by the device name the scenario's grasps use (stylus0, stylus1, ...)."""
    name: str
    backend: str | None = None            # None: the server's `device`
    hd_name: str = "Default Device"       # OpenHaptics' device name (Touch_Setup)
    transform: DeviceTransform = OPENHAPTICS_TRANSFORM   # device -> scene (openhaptics only; others send m)
    grasp_button: int = 1                 # button bitmask: closes the tool's jaw on what is in reach (server/jaws.py)
    grasp_radius: float = 0.01            # m: the jaw's reach: what it takes must be this close to the tool's tip
    grasp_mode: str = "hold"              # hold: the jaw stays closed while the button is held; toggle: a press
                                          # closes an open jaw and opens a closed one
    clutch_button: int = 2                # button bitmask: held, the tool stays still while the stylus moves
    motion_scale: float | None = None     # tool motion per stylus motion, about the device's origin (None: the
                                          # scenario's, else 1)
    workspace_offset: tuple[float, float, float] | None = None   # m: where the workspace is moved in the scene
                                          # (None: the scenario's, else none)
    tool: str | None = None               # needle_driver | forceps | hand (forceps also hold tissue; a hand has
                                          # no body the thread meets); None: the scenario's, else needle_driver
    frame: str = "scene"                  # remote only: samples in the scene frame (m), or in the device's own
                                          # frame and units, mapped by `transform` as an OpenHaptics pose is
    stiffness: float = 1000.0             # N/m: the virtual coupling of a button grasp
    damping: float = 0.5                  # N s/m
    max_force: float = 3.0                # N
    max_speed: float = 1.0                # m/s: a grasp follows its stylus at most this fast (no teleports)
    client_key: str | None = None         # remote only: the z85 public key of the one CURVE client whose
                                          # stylus samples it takes (its ZAP User-Id); None: any allowed client


@functools.lru_cache(maxsize=64)
def _default_device(name: str) -> DeviceConfig:
    """The settings of a device the config does not list. Frozen, so one is shared by every lookup of its name;
    building it took 5 µs, and the tick looks a device up twice for each of its stylus samples. Bounded: a
    client naming ever new devices cannot grow it."""
    return DeviceConfig(name=name)


@dataclass(frozen=True)
class ServerConfig:
    file: str                                   # the config file read
    scenario: str = "default"                   # a shipped scenario name or an absolute path
    endpoints: Endpoints = field(default_factory=Endpoints)
    loop: LoopConfig = field(default_factory=LoopConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    record: str | None = None                   # MCAP path to record to from start-up, absolute once loaded
    device: str = "simulated"                   # the backend of every device not configured otherwise:
                                                # simulated | openhaptics | remote | replay
    devices: tuple[DeviceConfig, ...] = ()      # per-device settings (a device not listed gets the defaults)
    device_fallback: str | None = None          # "simulated": a device missing at start falls back to it
    replay: str | None = None                   # MCAP recording whose stylus poses the replay backend plays
    files: FilesConfig = field(default_factory=FilesConfig)   # what control requests may read and write
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    device_limits: tuple[tuple[str, float], ...] = ()   # (device, nominal max continuous force N), from drivers
    link_devices: tuple[str, ...] = ()          # the device of each shared-memory link slot (set by serve)
    device_stiffness: tuple[tuple[str, float], ...] = ()   # (device, nominal max stiffness N/m), from drivers
    trainee: str = ""                           # who is at the styluses, named in every recording's metadata

    def device_config(self, name: str) -> DeviceConfig:
        """The settings of device ``name`` (the defaults if it is not listed)."""
        for d in self.devices:
            if d.name == name:
                return d
        return _default_device(name)

    def workspace_of(self, name: str, scenario: Scenario) -> tuple[tuple[float, float, float], float]:
        """Device ``name``'s workspace in ``scenario``: (offset m, motion scale); this config's own values win
        over the scenario's. A scene places the workspace of a device whose poses come in its own frame (an
        OpenHaptics device, a remote one with ``frame: device``); a remote stylus sending scene positions is
        already where it says (only this config's own values map it)."""
        dc = self.device_config(name)
        in_scene = self.backend_of(name) in ("remote", "simulated", "replay") and dc.frame == "scene"
        ws = None if in_scene else scenario.workspaces.get(name)
        offset = dc.workspace_offset if dc.workspace_offset is not None else (
            ws.offset if ws is not None else (0.0, 0.0, 0.0))
        scale = dc.motion_scale if dc.motion_scale is not None else (ws.scale if ws is not None else 1.0)
        return offset, scale

    def tool_of(self, name: str, scenario: Scenario) -> str:
        """The tool device ``name`` drives in ``scenario``: this config's, else the scenario's, else a needle
        driver."""
        dc = self.device_config(name)
        ws = scenario.workspaces.get(name)
        return dc.tool or (ws.tool if ws is not None else None) or "needle_driver"

    def backend_of(self, name: str) -> str:
        """The backend driving device ``name``."""
        return self.device_config(name).backend or self.device


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
    for key, default in (("pub", Endpoints.pub), ("control", Endpoints.control), ("stylus", Endpoints.stylus),
                         ("score", Endpoints.score)):
        if key == "score" and sec.has(key) and (sec.data[key] in (None, False) or
                                                 str(sec.data[key]).strip().lower() == "off"):
            values[key] = None            # no live score: null, false (YAML's `off`) or "off" (--score off)
            sec.read.add(key)
            continue
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

    from .security import public_keys_problem, secret_key_problem   # here: security.py imports this module

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
        if why := secret_key_problem(secret):
            raise sec.error("server_secret_key", why)
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
        if why := public_keys_problem(clients):
            raise sec.error("client_keys_dir", why)
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
                      max_restarts=sec.get("max_restarts", int, FaultConfig.max_restarts, minval=0, maxval=1000),
                      stall_s=sec.get("stall_s", float, FaultConfig.stall_s, minval=0.1, maxval=60.0))
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


def _files(sec: Section, from_cli: set[str]) -> FilesConfig:
    """The `files:` section: two directories, absolute (relative ones against the config file, or the working
    directory for a command-line value); they need not exist yet, but must not be anything else."""
    d = FilesConfig()
    out = {}
    for key in ("recordings_dir", "scenarios_dir"):
        p = _path(sec, key, from_cli)
        p = Path(getattr(d, key)) if p is None else p
        if p.exists() and not p.is_dir():
            raise sec.error(key, f"{p} is not a directory")
        out[key] = str(p)
    sec.finish()
    return FilesConfig(**out)


def _record(top: Section, from_cli: set[str]) -> str | None:
    p = _path(top, "record", from_cli)
    if p is None:
        return None
    if not p.parent.is_dir():
        raise top.error("record", f"the directory of {p} does not exist")
    if p.is_dir():
        raise top.error("record", f"{p} is a directory; give a file name (F.mcap)")
    return str(p)


TRAINEE_MAX_CHARS = 64


def _trainee(top: Section) -> str:
    """`trainee` (--trainee): a name for the score's tables, 1 to 64 printable characters."""
    name = top.get("trainee", str, "")
    if name and (len(name) > TRAINEE_MAX_CHARS or not name.isprintable() or not name.strip()):
        raise top.error("trainee", f"must be 1 to {TRAINEE_MAX_CHARS} printable characters, got {name!r}")
    return name.strip()


def _build(data: dict, file: str, from_cli: set[str]) -> ServerConfig:
    top = Section(data, file)
    endpoints = _endpoints(top.section("endpoints", {}))
    loop = _loop(top.section("loop", {}))
    security = _security(top.section("security", {}), from_cli)
    fault = _fault(top.section("fault", {}))
    files = _files(top.section("files", {}), from_cli)
    record = _record(top, from_cli)
    scenario = _scenario(top, from_cli)
    device = top.get("device", str, "simulated", choices=DEVICE_BACKENDS)
    devices = _devices(top.section("devices", {}), device, security, from_cli)
    fallback = top.get("device_fallback", str, "none", choices=("none", "simulated"))
    replay = _path(top, "replay", from_cli)
    safety = _safety(top.section("safety", {}))
    trainee = _trainee(top)
    top.finish()
    uses_replay = device == "replay" or any(d.backend == "replay" for d in devices)
    if uses_replay and replay is None:
        raise top.error("replay", "the replay backend needs a recording: give `replay: F.mcap` (--replay F.mcap)")
    if replay is not None and not replay.is_file():
        raise top.error("replay", f"no such recording: {replay}")
    scene = load_scenario(scenario)  # last, and an error inside it propagates with the scenario's own file and key
    cfg = ServerConfig(file=file, scenario=scenario, endpoints=endpoints, loop=loop, security=security,
                       fault=fault, record=record, device=device, devices=devices,
                       device_fallback=None if fallback == "none" else fallback,
                       replay=None if replay is None else str(replay), safety=safety, files=files,
                       trainee=trainee)
    check_scene_fits_loop(scene, cfg)
    return cfg


def check_scene_fits_loop(scenario: Scenario, cfg: ServerConfig) -> None:
    """Refuse a scene the running loop cannot run in real time: its ``solver.tick`` (s) must be the loop's
    ``loop.tick_s``. The safety pipeline (slew limit per tick, the watchdog's clock), the grasps' speed limit
    and the stylus poses all advance by the loop's tick; a scene stepping another tick per loop tick would run
    faster or slower than the hand. Raises ConfigError with the scenario's file and key ``solver.tick``."""
    tick = scenario.model.solver.tick
    if abs(tick - cfg.loop.tick_s) > 1e-9 * cfg.loop.tick_s:
        raise ConfigError(scenario.file, "solver.tick", f"must be the server loop's tick, {cfg.loop.tick_s:g} s "
                                                        f"(loop.tick_s in {cfg.file}), got {tick:g}")


# -- devices and safety ----------------------------------------------------------------------------------
def _devices(sec: Section, default_backend: str, security: SecurityConfig,
             from_cli: set[str]) -> tuple[DeviceConfig, ...]:
    out = []
    for name in sec.keys():
        d = sec.section(name)
        t = d.section("transform", {})
        try:
            transform = DeviceTransform(
                rotation_deg=tuple(t.vector("rotation_deg", 3, list(OPENHAPTICS_TRANSFORM.rotation_deg))),
                scale=t.get("scale", float, OPENHAPTICS_TRANSFORM.scale, above=0.0),
                offset=tuple(t.vector("offset", 3, list(OPENHAPTICS_TRANSFORM.offset))))
        except ValueError as exc:
            if isinstance(exc, ConfigError):
                raise
            raise d.error("transform", str(exc)) from None
        t.finish()
        cfg = DeviceConfig(
            name=str(name),
            backend=d.get("backend", str, None, choices=DEVICE_BACKENDS) if d.has("backend") else None,
            hd_name=d.get("hd_name", str, DeviceConfig.hd_name),
            transform=transform,
            grasp_button=d.get("grasp_button", int, DeviceConfig.grasp_button, minval=0, maxval=0xFFFFFFFF),
            grasp_radius=d.get("grasp_radius", float, DeviceConfig.grasp_radius, above=0.0, maxval=1.0),
            grasp_mode=d.get("grasp_mode", str, DeviceConfig.grasp_mode, choices=GRASP_MODES),
            clutch_button=d.get("clutch_button", int, DeviceConfig.clutch_button, minval=0, maxval=0xFFFFFFFF),
            motion_scale=d.get("motion_scale", float, None, above=0.0, maxval=MAX_MOTION_SCALE)
            if d.has("motion_scale") else None,
            workspace_offset=tuple(d.vector("workspace_offset", 3, [0.0, 0.0, 0.0]))
            if d.has("workspace_offset") else None,
            frame=d.get("frame", str, DeviceConfig.frame, choices=DEVICE_FRAMES),
            tool=d.get("tool", str, None, choices=TOOLS) if d.has("tool") else None,
            stiffness=d.get("stiffness", float, DeviceConfig.stiffness, above=0.0, maxval=1e6),
            damping=d.get("damping", float, DeviceConfig.damping, minval=0.0, maxval=1e3),
            max_force=d.get("max_force", float, DeviceConfig.max_force, above=0.0, maxval=100.0),
            max_speed=d.get("max_speed", float, DeviceConfig.max_speed, above=0.0, maxval=100.0),
            client_key=_client_key(d, from_cli))
        if cfg.grasp_button & cfg.clutch_button:
            raise d.error("clutch_button", f"shares a button with grasp_button ({cfg.grasp_button}): one button "
                                           "cannot both close the jaw and clutch")
        if cfg.frame == "device" and (cfg.backend or default_backend) != "remote":
            raise d.error("frame", f"only a remote device's samples are mapped by the server; this one's backend "
                                   f"is {cfg.backend or default_backend} (an OpenHaptics driver maps its own)")
        if cfg.client_key is not None:
            if (cfg.backend or default_backend) != "remote":
                raise d.error("client_key", f"only a remote device takes stylus samples from a client; this one's "
                                            f"backend is {cfg.backend or default_backend}")
            if not security.has_curve_keys:
                raise d.error("client_key", "needs CURVE (security.server_secret_key and client_keys_dir): "
                                            "without it no client has a key")
        d.finish()
        out.append(cfg)
    sec.finish()
    return tuple(out)


def _client_key(d: Section, from_cli: set[str]) -> str | None:
    """The z85 public key in the file ``client_key`` names (a `suturesim keys` .key file), or None."""
    import zmq.auth

    path = _path(d, "client_key", from_cli)
    if path is None:
        return None
    try:
        public, _ = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise d.error("client_key", f"cannot read a public key from {path}: {exc}") from None
    if not public:
        raise d.error("client_key", f"{path} holds no public key")
    return public.decode("ascii")


def _safety(sec: Section) -> SafetyConfig:
    d = SafetyConfig()
    cfg = SafetyConfig(
        scale=sec.get("scale", float, d.scale, minval=0.0, maxval=100.0),
        max_force_n=sec.get("max_force_n", float, d.max_force_n, above=0.0, maxval=100.0),
        max_slew_n_per_s=sec.get("max_slew_n_per_s", float, d.max_slew_n_per_s, above=0.0, maxval=1e6),
        lowpass_hz=sec.get("lowpass_hz", float, d.lowpass_hz, minval=0.0, maxval=1e5),
        watchdog_s=sec.get("watchdog_s", float, d.watchdog_s, above=0.0, maxval=1.0),
        ramp_down_s=sec.get("ramp_down_s", float, d.ramp_down_s, minval=0.0, maxval=1.0))
    sec.finish()
    return cfg


# -- recording metadata ------------------------------------------------------------------------------------
def server_metadata(cfg: ServerConfig) -> dict[str, str]:
    """The server's configuration as an MCAP metadata string map: the file and its content, the PUB endpoint,
    the trainee's name (empty if not given), and (as YAML) what a resimulation needs: the loop rates, the safety settings and every device's backend
    and settings, after the command line's overrides."""
    import yaml

    def device(d: DeviceConfig) -> dict:
        out = {k: getattr(d, k) for k in ("name", "backend", "hd_name", "grasp_button", "grasp_radius",
                                         "grasp_mode", "clutch_button", "motion_scale", "frame", "tool",
                                         "stiffness", "damping", "max_force", "max_speed")}
        out["workspace_offset"] = None if d.workspace_offset is None else list(d.workspace_offset)
        t = d.transform
        out["transform"] = {"rotation_deg": list(t.rotation_deg), "scale": t.scale, "offset": list(t.offset)}
        return out

    data = {"tick_s": cfg.loop.tick_s, "state_hz": cfg.loop.state_hz, "stats_hz": cfg.loop.stats_hz,
            "device": cfg.device, "devices": [device(d) for d in cfg.devices],
            "device_limits": {k: v for k, v in cfg.device_limits}, "link_devices": list(cfg.link_devices),
            "device_stiffness": {k: v for k, v in cfg.device_stiffness},
            "safety": {k: getattr(cfg.safety, k) for k in ("scale", "max_force_n", "max_slew_n_per_s",
                                                          "lowpass_hz", "watchdog_s", "ramp_down_s")}}
    out = {"config": cfg.file, "pub": cfg.endpoints.pub, "yaml": yaml.safe_dump(data, sort_keys=False),
           "trainee": cfg.trainee}
    try:   # the config file as written, too (it holds paths to key files, never keys)
        out["config_file"] = Path(cfg.file).read_text()
    except OSError:
        pass
    return out


def server_config_from_metadata(server: dict[str, str] | None) -> ServerConfig:
    """The ServerConfig a recording was made with, as far as the physics needs it (server_metadata); the
    defaults for a recording without it (a headless `suturesim run`)."""
    import yaml

    if not server or "yaml" not in server:
        return ServerConfig(file="<recording>")
    data = yaml.safe_load(server["yaml"])
    devices = tuple(DeviceConfig(**{**d, "workspace_offset": None if d.get("workspace_offset") is None else
                                    tuple(d["workspace_offset"]), "transform": DeviceTransform(
        rotation_deg=tuple(d["transform"]["rotation_deg"]), scale=d["transform"]["scale"],
        offset=tuple(d["transform"]["offset"]))}) for d in data.get("devices", []))
    return ServerConfig(file=server.get("config", "<recording>"),
                        loop=LoopConfig(tick_s=data["tick_s"], state_hz=data["state_hz"], stats_hz=data["stats_hz"],
                                        realtime=False),
                        device=data["device"], devices=devices, safety=SafetyConfig(**data["safety"]),
                        device_limits=tuple(data.get("device_limits", {}).items()),
                        device_stiffness=tuple(data.get("device_stiffness", {}).items()),
                        link_devices=tuple(data.get("link_devices", [])))
