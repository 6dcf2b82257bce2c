"""The daemon's configuration (server/config.py, configs/server.yaml): defaults, every error class, overrides."""

import dataclasses
import textwrap
from pathlib import Path

import pytest

from suturesim.server.config import (DEFAULT_CONFIG, Endpoints, FaultConfig, LoopConfig, SecurityConfig,
                                     ServerConfig, load_server_config)
from suturesim.server.security import make_keys
from suturesim.solver.config import ConfigError


def _write(tmp_path: Path, text: str, name: str = "server.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _error(tmp_path: Path, text: str, key: str, *reason: str, overrides: dict | None = None,
           file: str = "server.yaml") -> ConfigError:
    """Load ``text`` expecting a ConfigError naming ``file``, ``key`` and every fragment of ``reason``."""
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_server_config(str(path), overrides)
    msg = str(info.value)
    assert file in msg, msg
    assert f": {key}: " in msg, msg
    assert info.value.key == key
    for r in reason:
        assert r in msg, msg
    return info.value


def _keys(tmp_path: Path) -> tuple[str, Path]:
    """A server secret key file and a client_keys_dir holding one client's public key."""
    _, secret = make_keys(tmp_path / "server", "server")
    make_keys(tmp_path / "clients", "alice")
    return secret, tmp_path / "clients"


# -- defaults --------------------------------------------------------------------------------------------
def test_shipped_config_loads_with_the_documented_defaults():
    cfg = load_server_config()
    assert Path(cfg.file) == DEFAULT_CONFIG
    assert cfg == ServerConfig(file=cfg.file)
    assert cfg.scenario == "default"
    assert cfg.endpoints == Endpoints()
    assert cfg.endpoints.all() == ["tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556", "tcp://127.0.0.1:5557",
                                   "tcp://127.0.0.1:5558"]
    assert cfg.loop == LoopConfig(tick_s=0.001, spin_us=300.0, realtime=True, priority=50, cpu=-1,
                                  state_hz=100.0, stats_hz=1.0, sndhwm=1000)
    assert cfg.security == SecurityConfig(insecure=False, server_secret_key=None, client_keys_dir=None,
                                          max_message_bytes=65536)
    assert cfg.fault == FaultConfig(policy="restart", max_restarts=3)
    assert cfg.record is None


def test_empty_file_gives_the_same_defaults(tmp_path):
    cfg = load_server_config(str(_write(tmp_path, "")))
    assert dataclasses.replace(cfg, file="x") == dataclasses.replace(load_server_config(), file="x")


def test_config_is_frozen():
    cfg = load_server_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.loop.tick_s = 0.002


def test_values_are_read(tmp_path):
    secret, clients = _keys(tmp_path)
    cfg = load_server_config(str(_write(tmp_path, f"""\
        scenario: bench-suture
        endpoints: {{pub: "tcp://0.0.0.0:6000", control: "ipc:///tmp/suturesim-control", stylus: "tcp://[::1]:6002"}}
        loop: {{tick_s: 0.001, spin_us: 100, realtime: false, priority: 80, cpu: -1, state_hz: 500, stats_hz: 2,
                sndhwm: 10}}
        security: {{server_secret_key: {secret}, client_keys_dir: {clients}, max_message_bytes: 4096}}
        fault: {{policy: exit, max_restarts: 0}}
        record: out.mcap
        """)))
    assert cfg.scenario == "bench-suture"
    assert cfg.endpoints == Endpoints("tcp://0.0.0.0:6000", "ipc:///tmp/suturesim-control", "tcp://[::1]:6002")
    assert cfg.loop == LoopConfig(0.001, 100.0, False, 80, -1, 500.0, 2.0, 10)   # the scene's tick (1 ms)
    assert cfg.security == SecurityConfig(False, secret, str(clients), 4096)
    assert cfg.fault == FaultConfig("exit", 0)
    assert cfg.record == str(tmp_path / "out.mcap")


def test_relative_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    (tmp_path / "keys").mkdir()
    make_keys(tmp_path / "keys", "server")
    make_keys(tmp_path / "keys" / "clients", "alice")
    scen = (Path(__file__).resolve().parent.parent / "configs" / "scenarios" / "bench-suture.yaml").read_text()
    (tmp_path / "scen").mkdir()
    (tmp_path / "scen" / "mine.yaml").write_text(scen)
    _write(tmp_path, """\
        scenario: scen/mine.yaml
        security: {server_secret_key: keys/server.key_secret, client_keys_dir: keys/clients}
        record: rec.mcap
        """)
    monkeypatch.chdir("/")
    cfg = load_server_config(str(tmp_path / "server.yaml"))
    assert cfg.scenario == str(tmp_path / "scen" / "mine.yaml")
    assert cfg.security.server_secret_key == str(tmp_path / "keys" / "server.key_secret")
    assert cfg.security.client_keys_dir == str(tmp_path / "keys" / "clients")
    assert cfg.record == str(tmp_path / "rec.mcap")


# -- overrides -------------------------------------------------------------------------------------------
def test_overrides_merge_over_the_file(tmp_path, monkeypatch):
    path = _write(tmp_path, """\
        endpoints: {pub: "tcp://127.0.0.1:7000", control: "tcp://127.0.0.1:7001"}
        loop: {state_hz: 50}
        """)
    monkeypatch.chdir(tmp_path)
    cfg = load_server_config(str(path), {"endpoints": {"pub": "tcp://0.0.0.0:7100"}, "security": {"insecure": True},
                                         "scenario": "bench-suture", "record": "cli.mcap",
                                         "fault": None, "loop": {"priority": None}})
    assert cfg.endpoints == Endpoints("tcp://0.0.0.0:7100", "tcp://127.0.0.1:7001", "tcp://127.0.0.1:5557")
    assert cfg.loop.state_hz == 50.0 and cfg.loop.priority == 50  # None = flag not given
    assert cfg.security.insecure is True
    assert cfg.scenario == "bench-suture"
    assert cfg.record == str(tmp_path / "cli.mcap")


def test_overrides_of_the_shipped_default():
    cfg = load_server_config(None, {"security": {"insecure": True}})
    assert cfg.security.insecure and Path(cfg.file) == DEFAULT_CONFIG


def test_override_error_says_it_came_from_the_command_line(tmp_path):
    err = _error(tmp_path, "", "endpoints.pub", "port", "command line",
                 overrides={"endpoints": {"pub": "tcp://127.0.0.1:0"}})
    assert err.file.endswith("server.yaml")
    _error(tmp_path, "", "loop.bogus", "unknown key", "command line", overrides={"loop": {"bogus": 1}})


# -- errors ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, key, reason", [
    ("bogus: 1", "bogus", "unknown key"),
    ("loop: {tick: 0.001}", "loop.tick", "unknown key"),
    ("endpoints: {pubb: 'tcp://127.0.0.1:5555'}", "endpoints.pubb", "unknown key"),
    ("security: {secret_key: x}", "security.secret_key", "unknown key"),
    ("fault: {restarts: 2}", "fault.restarts", "unknown key"),
])
def test_unknown_keys(tmp_path, text, key, reason):
    _error(tmp_path, text, key, reason)


@pytest.mark.parametrize("endpoint, reason", [
    ("127.0.0.1:5555", "tcp://HOST:PORT"),
    ("udp://127.0.0.1:5555", "transport must be tcp, ipc or inproc"),
    ("tcp://127.0.0.1", "tcp://HOST:PORT"),
    ("tcp://:5555", "tcp://HOST:PORT"),
    ("tcp://exa mple:5555", "not a host name"),
    ("tcp://::1:5555", "IPv6 host must be in brackets"),
    ("tcp://[zz::1]:5555", "not an IPv6 address"),
    ("ipc://", "needs a path"),
    ("inproc://", "needs a name"),
])
def test_bad_endpoint(tmp_path, endpoint, reason):
    _error(tmp_path, f"endpoints: {{control: '{endpoint}'}}", "endpoints.control", reason)


@pytest.mark.parametrize("port", ["0", "65536", "70000", "abc", "*", "-1"])
def test_bad_port(tmp_path, port):
    _error(tmp_path, f"endpoints: {{pub: 'tcp://127.0.0.1:{port}'}}", "endpoints.pub",
           "port must be an integer in 1..65535")


def test_endpoint_not_a_string_and_duplicate(tmp_path):
    _error(tmp_path, "endpoints: {stylus: 5557}", "endpoints.stylus", "must be a string")
    _error(tmp_path, "endpoints: {stylus: 'tcp://127.0.0.1:5555'}", "endpoints.stylus",
           "same endpoint as endpoints.pub")


@pytest.mark.parametrize("text, key, reason", [
    ("loop: {state_hz: 2000}", "loop.state_hz", "must be <= 1/tick_s = 1000 Hz, got 2000"),
    ("loop: {tick_s: 0.01, state_hz: 200}", "loop.state_hz", "must be <= 1/tick_s = 100 Hz"),
    ("loop: {stats_hz: 5000}", "loop.stats_hz", "1/tick_s"),
    ("loop: {state_hz: 0}", "loop.state_hz", "must be > 0"),
    ("loop: {tick_s: 0}", "loop.tick_s", "must be > 0"),
    ("loop: {tick_s: 1.0}", "loop.tick_s", "must be <= 0.1"),
    ("loop: {spin_us: 2000}", "loop.spin_us", "must be <= the tick (1000 µs)"),
    ("loop: {spin_us: -1}", "loop.spin_us", "must be >= 0"),
    ("loop: {priority: 0}", "loop.priority", "must be >= 1"),
    ("loop: {priority: 100}", "loop.priority", "must be <= 99"),
    ("loop: {priority: 5.5}", "loop.priority", "must be an integer"),
    ("loop: {cpu: -2}", "loop.cpu", "must be >= -1"),
    ("loop: {cpu: 100000}", "loop.cpu", "not one this process may use"),
    ("loop: {realtime: yes please}", "loop.realtime", "must be true or false"),
    ("loop: {sndhwm: 0}", "loop.sndhwm", "must be >= 1"),
    ("security: {max_message_bytes: 10}", "security.max_message_bytes", "must be >= 1024"),
    ("security: {insecure: 1}", "security.insecure", "must be true or false"),
    ("devices: {s0: {grasp_button: 3, clutch_button: 2}}", "devices.s0.clutch_button", "shares a button"),
    ("devices: {s0: {grasp_mode: tap}}", "devices.s0.grasp_mode", "hold"),
    ("devices: {s0: {motion_scale: 0}}", "devices.s0.motion_scale", "must be > 0"),
    ("devices: {s0: {motion_scale: 50}}", "devices.s0.motion_scale", "must be <= 20"),
    ("devices: {s0: {workspace_offset: [0, 1]}}", "devices.s0.workspace_offset", "list of 3"),
    ("devices: {s0: {frame: device}}", "devices.s0.frame", "only a remote device"),
])
def test_bad_values(tmp_path, text, key, reason):
    _error(tmp_path, text, key, reason)


def test_bad_fault_policy(tmp_path):
    _error(tmp_path, "fault: {policy: retry}", "fault.policy", "must be one of restart, exit", "'retry'")
    _error(tmp_path, "fault: {max_restarts: -1}", "fault.max_restarts", "must be >= 0")


def test_missing_key_files(tmp_path):
    secret, clients = _keys(tmp_path)
    _error(tmp_path, f"security: {{server_secret_key: nope.key_secret, client_keys_dir: {clients}}}",
           "security.server_secret_key", "no such key file", str(tmp_path / "nope.key_secret"))
    _error(tmp_path, f"security: {{server_secret_key: {secret}, client_keys_dir: nodir}}",
           "security.client_keys_dir", "no such directory", str(tmp_path / "nodir"))


def test_key_files_must_be_usable(tmp_path):
    secret, clients = _keys(tmp_path)
    public = secret[: -len("_secret")]
    _error(tmp_path, f"security: {{server_secret_key: {public}, client_keys_dir: {clients}}}",
           "security.server_secret_key", "holds no secret key")
    (tmp_path / "empty").mkdir()
    _error(tmp_path, f"security: {{server_secret_key: {secret}, client_keys_dir: {tmp_path / 'empty'}}}",
           "security.client_keys_dir", "holds no public .key files")
    _error(tmp_path, f"security: {{server_secret_key: {secret}}}", "security.client_keys_dir",
           "needs both", "only server_secret_key")
    _error(tmp_path, f"security: {{client_keys_dir: {clients}}}", "security.server_secret_key",
           "needs both", "only client_keys_dir")


def test_unknown_scenario(tmp_path):
    _error(tmp_path, "scenario: no-such-scenario", "scenario", "no shipped scenario 'no-such-scenario'",
           "bench-suture")
    _error(tmp_path, "scenario: missing.yaml", "scenario", "no such scenario file", str(tmp_path / "missing.yaml"))
    _error(tmp_path, "", "scenario", "no shipped scenario", "command line", overrides={"scenario": "nope"})


def test_error_inside_the_scenario_propagates_with_its_own_file(tmp_path):
    _write(tmp_path, "thread: {length: 1.0, segments: 10, mass: 0.01, bending_stiffness: -1}\n", "bad.yaml")
    _error(tmp_path, "scenario: bad.yaml", "thread.bending_stiffness", "must be >= 0", file="bad.yaml")


def test_record_directory_must_exist(tmp_path):
    _error(tmp_path, "record: no/such/dir/out.mcap", "record", "does not exist")
    _error(tmp_path, f"record: {tmp_path}", "record", "is a directory")


def test_not_a_mapping_and_missing_file(tmp_path):
    _error(tmp_path, "endpoints: [1, 2]", "endpoints", "must be a mapping")
    with pytest.raises(ConfigError, match="nope.yaml: cannot read"):
        load_server_config(str(tmp_path / "nope.yaml"))


def test_the_trainee_is_a_printable_name(tmp_path):
    _write(tmp_path, "trainee: Ana Lima\n")
    assert load_server_config(str(tmp_path / "server.yaml")).trainee == "Ana Lima"
    assert load_server_config(str(tmp_path / "server.yaml"), {"trainee": " Bo "}).trainee == "Bo"
    _error(tmp_path, "trainee: \"a\\x00b\"", "trainee", "printable characters")
    _error(tmp_path, f"trainee: {'x' * 65}", "trainee", "1 to 64")
    _error(tmp_path, "", "trainee", "printable characters", "command line", overrides={"trainee": "\n"})
